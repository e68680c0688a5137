// Identities of what a rank loads, agreed across ranks; see loaded_inputs.h.
#include "mmsp/train/loaded_inputs.h"

#include "mmsp/core/check.h"
#include "mmsp/core/xxhash64.h"
#include "mmsp/dist/store_agreement.h"
#include "mmsp/hf/checksum_manifest.h"

namespace mmsp::train {

dist::AgreedFlags loaded_inputs(const TrainOptions& o, const ResolvedModel& model, const Checkpoint* checkpoint) {
  // Not the path: per-host copies may sit at other paths.
  std::string identity = "config xxh64 " + XxHash64::hex(XxHash64::of(model.config_json));
  if (model.weights && !checkpoint) {
    if (!model.weights->checksums_xxh64.empty()) {
      identity += ", weights checksums.json " + model.weights->checksums_xxh64;
    } else {
      // A released directory: its weight files' bytes, file by file in name order.
      XxHash64 files;
      for (const std::string& file : model.weights->files) {
        const hf::FileChecksum one = hf::checksum_of_file(model.weights->path + "/" + file);
        files.update(file.data(), file.size());
        files.update(&one.size, sizeof one.size);
        files.update(&one.xxh64, sizeof one.xxh64);
      }
      identity += ", weights xxh64 " + XxHash64::hex(files.digest());
    }
  }
  dist::AgreedFlags out = {{"--model", identity}};
  if (checkpoint)
    out.emplace_back("--resume", detail::concat("step ", checkpoint->step, ", checkpoint ",
                                                checkpoint->manifest_xxh64.empty()
                                                    ? "without checksums.json"
                                                    : "checksums.json " + checkpoint->manifest_xxh64));
  else if (!o.output.resume.empty())
    out.emplace_back("--resume", "(nothing to resume: starts afresh)");
  else
    out.emplace_back("--resume", "(none)");
  return out;
}

void agree_on_loaded_inputs(c10d::Store& store, const std::string& prefix, const dist::AgreedFlags& mine, int rank,
                            int world_size, std::chrono::milliseconds timeout, const dist::JobHosts& hosts) {
  if (world_size <= 1) return;
  const std::vector<dist::AgreedFlags> all =
      dist::exchange_through_store(store, prefix + "loaded-inputs", rank, world_size, timeout, mine);
  const std::string differences =
      dist::value_disagreement(all, [&hosts](const std::vector<int>& ranks) { return hosts.name_ranks(ranks); });
  MMSP_CHECK(differences.empty(), "the ranks loaded different inputs: ", differences,
             ". Every rank must load the same model directory and checkpoint (per-host copies must be identical: "
             "copy them again, or put them where every host reads the same files); stopped before the first "
             "collective");
}

}  // namespace mmsp::train
