// `mmsp logprobs`'s pass over the file; see mmsp/train/logprobs.h.
#include "mmsp/train/logprobs.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_choice.h"
#include "eval_run.h"
#include "head_loss.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/loaded_inputs.h"
#include "mmsp/train/step_fingerprint.h"
#include "run_inputs.h"
#include "trainable.h"

namespace mmsp::train {
namespace fs = std::filesystem;

void check_logprobs_options(const LogprobsOptions& l, const TrainOptions& o) {
  MMSP_CHECK(std::isfinite(l.temperature) && l.temperature > 0, "--temperature ", l.temperature,
             " must be a finite number > 0 (the logits are divided by it)");
  MMSP_CHECK(!l.out.empty(), "--out FILE is required (the JSON-lines file of the log-probabilities)");
  std::error_code ec;
  MMSP_CHECK(!fs::is_directory(l.out, ec), "--out ", l.out,
             " is a directory; give the path of the JSON-lines file to write (it is replaced if it exists)");
  MMSP_CHECK(!fs::exists(o.inputs.data, ec) || !fs::exists(l.out, ec) || !fs::equivalent(o.inputs.data, l.out, ec),
             "--out ", l.out, " is the --data file: writing it would replace the rollouts being read");
  const fs::path parent = fs::path(l.out).has_parent_path() ? fs::path(l.out).parent_path() : fs::path(".");
  MMSP_CHECK(fs::is_directory(parent, ec), "--out ", l.out, ": its directory ", parent.string(),
             " does not exist (create it first)");
}

namespace {

// Where each sequence of the step starts in the step's flat vector of tokens (batch
// order), and the vector's length.
std::vector<int64_t> sequence_offsets(const plan::Batch& batch, int64_t& total) {
  std::vector<int64_t> offsets;
  total = 0;
  for (const auto& s : batch.sequences) {
    offsets.push_back(total);
    total += static_cast<int64_t>(s.input_ids.size());
  }
  return offsets;
}

// This rank's values ([rows, L] on any device) at their tokens' places in the step's flat
// vector (a token's value sits at its own position, the one whose next token it scores),
// zero elsewhere: [rows, total] double on the CPU.
at::Tensor place_values(const at::Tensor& values, const plan::StepPlan& plan, const std::vector<int64_t>& offsets,
                        int64_t total) {
  const plan::RankPlan& mine = plan.mine;
  const plan::RowPlan& row = plan.rows[static_cast<size_t>(mine.coords.dp)];
  MMSP_CHECK(values.size(1) == mine.local_length, "the head gave ", values.size(1), " values for ", mine.local_length,
             " slots");
  std::vector<int64_t> slots, places;
  for (int64_t l = 0; l < mine.local_length; ++l) {
    if (mine.labels[static_cast<size_t>(l)] == plan::kIgnoreIndex) continue;
    const plan::Segment& seg = row.packing.segments[static_cast<size_t>(mine.segment_ids[static_cast<size_t>(l)])];
    slots.push_back(l);
    places.push_back(offsets[static_cast<size_t>(seg.sequence)] + mine.segment_index[static_cast<size_t>(l)]);
  }
  at::Tensor out = at::zeros({values.size(0), total}, at::kDouble);
  if (slots.empty()) return out;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const at::Tensor at_slots = at::tensor(slots, longs).to(values.device());
  out.index_copy_(1, at::tensor(places, longs), values.index_select(1, at_slots).to(at::kDouble).cpu());
  return out;
}

// The temporary file rank 0 writes; renamed to --out when the pass is done, removed if
// the pass ends on an error (--out is then untouched).
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path)
      : path_(path), tmp_(path + ".tmp-" + std::to_string(::getpid())), file_(tmp_, std::ios::trunc) {
    MMSP_CHECK(file_.good(), "--out ", path, ": cannot write ", tmp_);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (done_) return;
    file_.close();
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
  std::ofstream& stream() { return file_; }
  void commit() {
    file_.close();
    MMSP_CHECK(!file_.fail(), "--out ", path_, ": writing ", tmp_, " failed");
    std::error_code ec;
    fs::rename(tmp_, path_, ec);
    MMSP_CHECK(!ec, "--out ", path_, ": cannot rename ", tmp_, " to it: ", ec.message());
    done_ = true;
  }

 private:
  std::string path_, tmp_;
  std::ofstream file_;
  bool done_ = false;
};

}  // namespace

LogprobsReport write_logprobs(const TrainOptions& o, const LogprobsOptions& l, const dist::Mesh& mesh,
                              std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  check_logprobs_options(l, o);
  MMSP_ASSERT(!o.inputs.shuffle, "mmsp logprobs reads the file in order");
  const RunInputs in = check_run(o, mesh);  // the model, the data's checks, the memory preflight
  const bool rank0 = mesh.rank() == 0;
  if (mesh.store())
    agree_on_loaded_inputs(*mesh.store(), fingerprint_key_prefix(*mesh.store(), mesh.rank()),
                           loaded_inputs(o, in.resolved, nullptr), mesh.rank(), mesh.world_size(),
                           mesh.world()->timeout(), mesh.hosts());
  const attention::AttentionKernel kernel = decoder_attention_kernel(o, in, mesh, log);
  const Trainable model = build_trainable(o, in, mesh, kernel);
  const plan::PlanOptions plan_options = plan_options_for(o, in, mesh);
  const plan::ModelConventions& conventions = in.resolved.config.conventions;
  const std::vector<std::vector<int64_t>> steps = one_pass_steps(*in.packer);
  std::optional<AtomicFile> file;
  if (rank0) file.emplace(l.out);
  LogprobsReport report;
  at::NoGradGuard no_grad;
  model.update->begin_step();  // --shard parameters: the weights a forward keeps whole
  const int64_t rows = l.entropy ? 2 : 1;
  std::vector<int64_t> labels;
  for (const std::vector<int64_t>& samples : steps) {
    const ForwardStep pass =
        forward_samples(*in.data, samples, o, in, model.model(), model.parallelism(), plan_options, mesh);
    const plan::Batch& batch = pass.batch;
    const plan::StepPlan& plan = pass.plan;
    const at::Tensor values =
        head_token_values(model.model(), pass.out, in.loss_chunk, o.inputs.tokens_per_rank, l.temperature)
            .narrow(0, 0, rows);
    int64_t total = 0;
    const std::vector<int64_t> offsets = sequence_offsets(batch, total);
    at::Tensor step = place_values(values, plan, offsets, total);
    dist::all_reduce_(step, *mesh.world());
    ++report.steps;
    report.samples += static_cast<int64_t>(samples.size());
    if (!rank0) continue;
    const at::Tensor cpu = step.contiguous();
    const double* logprob = cpu.data_ptr<double>();
    const double* entropy = l.entropy ? logprob + total : nullptr;
    for (size_t s = 0; s < samples.size(); ++s) {
      const plan::Sequence& seq = batch.sequences[s];
      const int64_t n = static_cast<int64_t>(seq.input_ids.size());
      labels.assign(static_cast<size_t>(n), plan::kIgnoreIndex);
      plan::fill_labels(seq, conventions, 0, n, labels.data());
      nlohmann::json line;
      line["index"] = samples[s];
      std::vector<double> lp, ent;
      for (int64_t k = 0; k < n; ++k) {
        if (labels[static_cast<size_t>(k)] == plan::kIgnoreIndex) continue;
        lp.push_back(logprob[offsets[s] + k]);
        if (entropy) ent.push_back(entropy[offsets[s] + k]);
      }
      report.label_tokens += static_cast<int64_t>(lp.size());
      if (const RolloutValues* v = in.data->rollout(samples[s]); v && v->preference.pair >= 0) {
        // a preference pair's side: its pair and the sum DPO reads (ref_chosen_logps, ...)
        double sum = 0;
        for (const double x : lp) sum += x;
        line["pair"] = v->preference.pair;
        line["side"] = v->preference.chosen ? "chosen" : "rejected";
        line["logps"] = sum;
      }
      line["logprobs"] = std::move(lp);
      if (entropy) line["entropy"] = std::move(ent);
      file->stream() << line.dump() << '\n';
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank0) {
    file->commit();
    log << "mmsp logprobs: " << report.samples << " samples, " << report.label_tokens << " labelled tokens in "
        << report.steps << " steps on mesh " << mesh.shape().str() << ", temperature " << l.temperature << " -> "
        << l.out << " (" << report.seconds << " s)" << std::endl;
  }
  return report;
}

}  // namespace mmsp::train
