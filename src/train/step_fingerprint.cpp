// Step fingerprints and their agreement over the store; see step_fingerprint.h.
#include "mmsp/train/step_fingerprint.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <sstream>

#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "mmsp/core/xxhash64.h"

namespace mmsp::train {
namespace {

template <typename T>
void add_all(XxHash64& h, const std::vector<T>& values) {
  h.add(static_cast<uint64_t>(values.size()));
  for (const T& v : values) h.add(v);
}

std::string key_of(const std::string& prefix, int64_t step, int rank) {
  return prefix + std::to_string(step) + "/" + std::to_string(rank);
}

}  // namespace

StepFingerprint step_fingerprint(const std::vector<int64_t>& samples, const plan::Batch& batch,
                                 const plan::StepPlan& plan) {
  XxHash64 ids, sizes, tokens, packing, labels, routes, collectives;
  add_all(ids, samples);
  for (const auto& s : batch.sequences) {
    sizes.add(static_cast<int64_t>(s.input_ids.size()));
    add_all(sizes, s.image_grid_thw);
    add_all(sizes, s.video_grid_thw);
    add_all(tokens, s.input_ids);
    add_all(labels, s.loss_mask);
  }
  labels.add(plan.label_count);
  add_all(packing, plan.dp_of_sequence);
  for (const auto& row : plan.rows) {
    packing.add(row.packing.length).add(row.packing.real_tokens);
    add_all(packing, row.packing.cu_seqlens);
    packing.add(row.shards.local_length());
    for (const auto& item : row.items) {
      routes.add(static_cast<int>(item.kind)).add(item.rows).add(item.patches).add(item.encoder_rank);
      for (int64_t b : item.shard_rows) routes.add(b);
    }
    // Per row, in the order the step runs them: the vision rows each context rank
    // sends to each other (all_to_all_v), the attention exchanges over the shard
    // (all_to_all over ulysses, ring passes: both sized by the local length).
    std::map<std::pair<int, int>, int64_t> sent;  // (encoder rank, receiving rank) -> rows
    const int context = plan.options.mesh.ring * plan.options.mesh.ulysses;
    for (const auto& item : row.items)
      for (const auto& piece : item.pieces) {
        const auto where = row.shards.locate(piece.packed);
        sent[{item.source_of(piece.first_row).first, where.context_rank}] += piece.length;
      }
    collectives.add(int{1}).add(context);
    for (const auto& [pair, n] : sent) collectives.add(pair.first).add(pair.second).add(n);
    collectives.add(int{2}).add(row.shards.local_length()).add(plan.options.mesh.ulysses).add(plan.options.mesh.ring);
  }
  collectives.add(int{3}).add(plan.label_count);  // the loss normaliser
  return {{"samples", ids.digest()},
          {"sequence sizes", sizes.digest()},
          {"token ids", tokens.digest()},
          {"packing", packing.digest()},
          {"labels", labels.digest()},
          {"vision routes", routes.digest()},
          {"collectives", collectives.digest()}};
}

std::string encode_fingerprint(const StepFingerprint& f) {
  std::string out;
  for (const auto& field : f) out += field.name + "=" + XxHash64::hex(field.hash) + ";";
  return out;
}

StepFingerprint decode_fingerprint(const std::string& text) {
  StepFingerprint f;
  size_t at = 0;
  while (at < text.size()) {
    const size_t eq = text.find('=', at), end = text.find(';', at);
    if (eq == std::string::npos || end == std::string::npos || eq > end || end - eq != 17) return {};
    FingerprintField field;
    field.name = text.substr(at, eq - at);
    try {
      field.hash = std::stoull(text.substr(eq + 1, 16), nullptr, 16);
    } catch (const std::exception&) { return {}; }
    f.push_back(field);
    at = end + 1;
  }
  return f;
}

void check_same_step(int64_t step, const std::vector<StepFingerprint>& per_rank) {
  if (per_rank.empty()) return;
  // The most common fingerprint is the job's; ties go to the lowest rank's.
  size_t reference = 0, best = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    size_t votes = 0;
    for (const auto& other : per_rank) votes += other == per_rank[r];
    if (votes > best) best = votes, reference = r;
  }
  const StepFingerprint& ref = per_rank[reference];
  std::string agree;
  for (size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r] == ref) agree += (agree.empty() ? "" : ", ") + std::to_string(r);
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const StepFingerprint& f = per_rank[r];
    if (f == ref) continue;
    std::string field = "fingerprint (unreadable)";
    for (size_t i = 0; i < std::min(f.size(), ref.size()); ++i)
      if (!(f[i] == ref[i])) {
        field = f[i].name == ref[i].name ? f[i].name : f[i].name + " / " + ref[i].name;
        break;
      }
    MMSP_FAIL("step ", step, ": rank ", r, " is about to run another step than rank", best > 1 ? "s " : " ", agree,
              " (first difference: ", field,
              "): the ranks read different data or options; every rank must "
              "be started with the same flags, data files and checkpoint. Stopped before the step's first collective");
  }
}

std::string fingerprint_key_prefix(c10d::Store& store, int rank) {
  const int64_t run = store.add("mmsp/fingerprint/runs/" + std::to_string(rank), 1);
  return "mmsp/fingerprint/" + std::to_string(run) + "/";
}

void agree_on_step(c10d::Store& store, const std::string& prefix, int64_t step, const StepFingerprint& mine, int rank,
                   int world_size, std::chrono::milliseconds timeout) {
  if (world_size <= 1) return;
  // A store whose host has died fails the calls below: the error says so, in one line, and
  // names the rank; c10 would log each failure first with its backtrace.
  const compat::QuietC10Log quiet;
  const std::string text = encode_fingerprint(mine);
  store.set(key_of(prefix, step, rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(key_of(prefix, step, r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    throw Error(detail::concat("step ", step, ": not every rank posted its step fingerprint within ",
                               timeout.count() / 1000.0, " s (a rank died or hung before the step): ", e.what()));
  }
  std::vector<StepFingerprint> all;
  for (int r = 0; r < world_size; ++r) {
    const auto value = r == rank ? std::vector<uint8_t>(text.begin(), text.end()) : store.get(keys[r]);
    all.push_back(decode_fingerprint(std::string(value.begin(), value.end())));
  }
  // Every rank has read step − 2's keys: it posted step − 1's only afterwards.
  store.deleteKey(key_of(prefix, step - 2, rank));  // absent for the first two steps: no harm
  check_same_step(step, all);
}

}  // namespace mmsp::train
