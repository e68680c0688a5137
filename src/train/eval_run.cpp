// The held-out set's loss; see eval_run.h.
#include "eval_run.h"

#include <ATen/ATen.h>

#include <chrono>
#include <vector>

#include "head_loss.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/train/data/jsonl_dataset.h"
#include "mmsp/train/data/step_pixels.h"
#include "run_inputs.h"

namespace mmsp::train {
std::vector<std::vector<int64_t>> one_pass_steps(const StepPacker& packer) {
  std::vector<std::vector<int64_t>> steps;
  DataPosition position;
  while (position.epoch == 0) {
    std::vector<int64_t> samples = packer.next_step(position);
    if (position.epoch > 0) samples.resize(samples.size() - static_cast<size_t>(position.offset));
    if (!samples.empty()) steps.push_back(std::move(samples));
  }
  return steps;
}

EvalSet open_eval_set(const TrainOptions& o, const model::ModelConfig& config, int64_t tokens_per_row, int rows) {
  const EvalOptions& e = o.eval;
  MMSP_CHECK(e.every >= 0, "--eval-every ", e.every, " must be ≥ 0 (0: only after the last step)");
  MMSP_CHECK(e.every == 0 || !e.data.empty(), "--eval-every ", e.every, " needs --eval-data FILE");
  EvalSet set;
  if (e.data.empty()) return set;
  MMSP_CHECK(e.data != "shapes",
             "--eval-data shapes: the held-out set is a JSON-lines file (the shapes dataset "
             "has no held-out part)");
  set.data = std::make_unique<JsonlDataset>(e.data, config, o.inputs.max_image_pixels,
                                            JsonlDataset::line_bytes_for(tokens_per_row));
  MMSP_CHECK(set.data->size() >= rows, "--eval-data ", e.data, " holds ", set.data->size(), " samples, fewer than the ",
             rows, " rows of a step");
  PackerOptions packing;
  packing.tokens_per_row = tokens_per_row;
  packing.rows = rows;
  packing.shuffle = false;
  set.packer = std::make_unique<StepPacker>(*set.data, packing);
  static_cast<const JsonlDataset&>(*set.data).check_lengths(set.packer->row_limit());
  return set;
}

bool evaluates_after(const EvalOptions& eval, int64_t step, int64_t last_step) {
  if (eval.data.empty()) return false;
  return step == last_step || (eval.every > 0 && step % eval.every == 0);
}

ForwardStep forward_samples(const Dataset& data, const std::vector<int64_t>& samples, const TrainOptions& o,
                            const RunInputs& in, const model::Vlm& vlm, const parallel::ModelParallelism& parallelism,
                            const plan::PlanOptions& plan_options, const dist::Mesh& mesh) {
  ForwardStep s{make_batch(data, samples), {}, {}};
  s.plan = plan::make_step_plan(s.batch, in.resolved.config.conventions, plan_options, mesh.rank());
  const model::PixelInputs pixels = load_pixels(data, samples, s.batch, in.resolved.config,
                                                pixels_encoded_here(s.plan, o.parallel.vision), o.inputs.dtype)
                                        .to(o.parallel.device);
  s.out = parallel::forward_step(vlm, s.batch, s.plan, pixels, parallelism);
  return s;
}

EvalMetrics evaluate(int64_t step, const TrainOptions& o, const RunInputs& in, const model::Vlm& vlm,
                     const parallel::ModelParallelism& parallelism, WeightUpdate& update,
                     const plan::PlanOptions& plan_options, const dist::Mesh& mesh) {
  const auto start = std::chrono::steady_clock::now();
  const EvalSet& set = in.eval;
  const plan::ModelConventions& conventions = in.resolved.config.conventions;
  const std::vector<std::vector<int64_t>> steps = one_pass_steps(*set.packer);
  EvalMetrics m;
  m.step = step;
  for (const std::vector<int64_t>& samples : steps) {
    const plan::Batch batch = make_batch(*set.data, samples);
    m.label_tokens += plan::make_step_plan(batch, conventions, plan_options, mesh.rank()).label_count;
    for (const auto& s : batch.sequences) m.tokens += static_cast<int64_t>(s.input_ids.size());
  }
  MMSP_CHECK(m.label_tokens > 0, "--eval-data ", o.eval.data, " has no label token (every loss_mask is 0)");
  at::NoGradGuard no_grad;
  update.begin_step();
  double local = 0;  // this rank's part of the file's mean
  for (const std::vector<int64_t>& samples : steps) {
    model::StepOutput out = forward_samples(*set.data, samples, o, in, vlm, parallelism, plan_options, mesh).out;
    out.label_count = m.label_tokens;
    local += head_loss(vlm, out, in.loss_chunk, o.inputs.tokens_per_rank).to(at::kDouble).item<double>();
  }
  at::Tensor sum = at::full({1}, local, at::kDouble);
  dist::all_reduce_(sum, *mesh.world());
  m.loss = sum.item<double>();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

}  // namespace mmsp::train
