// The training loop; see trainer.h. Order of a step: data (pure, same on every rank)
// → plan → the step's memory checked and agreed → pixels this rank encodes → forward/
// backward on the shard → the gradients summed over the data group → clip → AdamW →
// agreed metrics → checkpoint. The rooms it calls are beside it (trainer.h lists them).
#include "mmsp/train/trainer.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "accumulation.h"
#include "agreed_metrics.h"
#include "attention_choice.h"
#include "eval_run.h"
#include "expert_load.h"
#include "head_loss.h"
#include "lora_export.h"
#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/train/checkpoint/train_state.h"
#include "mmsp/train/loaded_inputs.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/optim/lr_schedule.h"
#include "mmsp/train/run_checks.h"
#include "mmsp/train/step_fingerprint.h"
#include "mmsp/train/step_watch.h"
#include "objective/dpo_loss.h"
#include "objective/policy_loss.h"
#include "pixel_prefetch.h"
#include "run_inputs.h"
#include "run_output.h"
#include "step_memory.h"
#include "trainable.h"

namespace mmsp::train {
namespace {

// Where the run continues: after the checkpoint's step and data position (on any mesh,
// with the same flags), or at the start.
struct ResumePoint {
  int64_t done = 0;  // steps completed
  DataPosition position;
};

ResumePoint resume_run(const TrainOptions& o, const RunInputs& in, WeightUpdate& update, const dist::Mesh& mesh,
                       std::ostream& log) {
  ResumePoint point;
  const bool rank0 = mesh.rank() == 0;
  if (rank0 && !in.resume_note.empty()) log << "note: " << in.resume_note << std::endl;
  if (!in.checkpoint) return point;
  const Checkpoint& ckpt = *in.checkpoint;
  if (rank0)
    for (const std::string& note : ckpt.notes) log << "note: " << note << std::endl;
  MMSP_CHECK(same_model_config(ckpt.config_json, in.resolved.config_json), "--resume ", o.output.resume,
             " holds a checkpoint of another model than --model ", o.inputs.model);
  update.restore(ckpt);
  point.done = ckpt.step;
  point.position.epoch = ckpt.state.at("data").at("epoch").get<int64_t>();
  point.position.offset = ckpt.state.at("data").at("offset").get<int64_t>();
  // The batches and numerics continue as before only with the same flags (any mesh).
  check_resume_flags(ckpt.state.at("run"), run_flags(o, mesh.shape(), in.rows), o.output.allow_changed_flags,
                     o.output.resume, rank0 ? &log : nullptr);
  restore_cpu_rng(ckpt.state.at("cpu_rng").get<std::string>(), ckpt.path);
  if (rank0) log << "resumed from " << o.output.resume << " after step " << point.done << std::endl;
  return point;
}

void print_run_header(const TrainOptions& o, const RunInputs& in, const WeightUpdate& update, const dist::Mesh& mesh,
                      std::ostream& log) {
  log << "mmsp train: " << in.resolved.source << " (" << in.resolved.config.model_type
      << (in.resolved.weights ? ", weights loaded" : ", random weights") << "), " << in.data->describe() << ", mesh "
      << mesh.shape().str() << ", vision " << model::to_string(o.parallel.vision) << ", " << dtype_name(o.inputs.dtype)
      << (update.describe().empty() ? "" : ", " + update.describe()) << ", " << update.weights().size() << " tensors"
      << std::endl;
  if (in.adapter && !in.checkpoint) {
    log << "adapters from " << in.adapter->dir << " (peft LoRA, r " << in.adapter->rank << ", alpha "
        << in.adapter->alpha << ", " << in.adapter->modules.size() << " modules)" << std::endl;
    if (in.adapter->dropout > 0)
      log << "note: the adapter was trained with lora_dropout " << in.adapter->dropout
          << "; mmsp continues it without dropout (exact against one process)" << std::endl;
  }
  log << in.memory.table() << std::endl;
}

// The checkpoint after `step`: the weights (and optimizer) with what a resume needs.
void save_step(const TrainOptions& o, const RunInputs& in, WeightUpdate& update, int64_t step,
               const DataPosition& position, const dist::Mesh& mesh, std::ostream& log) {
  nlohmann::json state;
  state["step"] = step;
  state["cpu_rng"] = capture_cpu_rng();
  state["data"] = {{"epoch", position.epoch}, {"offset", position.offset}};
  state["run"] = run_flags(o, mesh.shape(), in.rows);
  CheckpointOptions ckpt;
  ckpt.keep_last = o.output.keep;
  ckpt.save_dtype = in.save_dtype;
  ckpt.max_shard_bytes = static_cast<uint64_t>(o.output.save_shard_bytes);
  if (o.test.crash_checkpoint_step == step) ckpt.crash_after_bytes = o.test.crash_checkpoint_after_bytes;
  ckpt.crash_in_keep = o.test.crash_keep_step == step;
  add_lora_outputs(ckpt, o, in.resolved.config, in.resolved.source, update, mesh);  // --lora-rank: hf/ merged, adapter/
  update.save(o.output.out, step, state, in.resolved.config_json, ckpt, mesh, log);
}

// What every step of the loop reads, fixed for the run.
struct StepLoop {
  const TrainOptions& o;
  const RunInputs& in;
  const Trainable& model;
  const LrSchedule& schedule;
  const dist::Mesh& mesh;
  dist::RankActivity& doing;
  PhaseTimer& phases;     // this run's time split, active on this thread
  MemoryCounter& memory;  // this run's tensor bytes
  plan::PlanOptions plan_options;
  std::string fingerprint_prefix;  // this job's step-agreement keys
  int64_t last_step = 0;
  PixelPrefetch& pixels;  // this step's pixels, and the next step's ahead (--prefetch-pixels)
};

// An RL objective's per-sequence weights over the step's micro-batches (none for the
// cross-entropy, whose divisor is the step's label count).
std::vector<std::vector<double>> policy_weights(const StepBatches& batches, const RunInputs& in,
                                                const ObjectiveOptions& o) {
  if (o.kind != Objective::grpo && o.kind != Objective::ppo) return {};
  std::vector<const plan::Batch*> micro;
  for (const MicroBatch& m : batches.micro) micro.push_back(&m.batch);
  return sequence_weights(micro, in.resolved.config.conventions, o.agg, o.loss_scale);
}

// A micro-batch's loss on this rank, by the objective: the cross-entropy through the
// head, or an RL objective on the head's per-token log-probabilities (with its figures).
ObjectiveLoss step_loss(const StepLoop& run, const MicroBatch& micro, const model::StepOutput& out,
                        const std::vector<std::vector<double>>& weights, size_t k, int64_t step_pairs,
                        int64_t step_labels) {
  const ObjectiveOptions& objective = run.o.objective;
  const model::Vlm& vlm = run.model.model();
  if (objective.kind == Objective::cross_entropy)
    return {head_loss(vlm, out, run.in.loss_chunk, run.o.inputs.tokens_per_rank), {}};
  // The entropy's values and backward only when its bonus is asked for.
  const bool entropy = objective.entropy_coef != 0;
  const at::Tensor values =
      entropy ? head_label_values(vlm, out, run.in.loss_chunk, run.o.inputs.tokens_per_rank, objective.temperature)
              : head_label_logprobs(vlm, out, run.in.loss_chunk, run.o.inputs.tokens_per_rank, objective.temperature);
  const at::Tensor logprobs = entropy ? values[0] : values;
  if (objective.kind == Objective::dpo)
    return dpo_loss(logprobs, *run.in.data, micro.samples, micro.batch, micro.plan, step_pairs, objective, run.mesh);
  return policy_loss(logprobs, entropy ? values[1] : at::Tensor(),
                     rank_rollout(*run.in.data, micro.samples, micro.batch, micro.plan, weights[k],
                                  run.in.resolved.config.conventions, run.o.parallel.device),
                     objective, step_labels);
}

// One step: data (the same on every rank; --accumulate's K micro-batches, all planned
// first) → plan → the step agreed → per micro-batch: this rank's pixels → forward/backward
// on its shard (the gradients add up) → weight update → the agreed figures. The
// heartbeat, the test hooks and the accounting are the StepWatch's (step_watch.h).
// `held_bytes`: what this rank holds as the forward begins (the training state).
StepMetrics run_step(const StepLoop& run, int64_t step, DataPosition& position, int64_t& held_bytes,
                     MemoryEstimate& largest_estimate) {
  const dist::Mesh& mesh = run.mesh;
  WeightUpdate& update = *run.model.update;
  StepWatch watch(step, mesh, run.doing, run.phases, run.memory, run.o.test);

  watch.phase("plan");
  const StepBatches batches = plan_step_batches(*run.in.data, *run.in.packer, watch, run.in.resolved.config.conventions,
                                                run.plan_options, mesh.rank(), run.o.schedule.accumulate, position);
  std::optional<NextStep> next = run.pixels.plan_next(step, run.last_step, position);
  for (const MicroBatch& micro : batches.micro)
    check_step_memory(run.o, run.in, mesh.shape(), step, micro.samples, micro.plan, largest_estimate, next);
  // Every rank must be about to run the same step before the first collective.
  watch.phase("step agreement");
  if (mesh.store())
    agree_on_step(*mesh.store(), run.fingerprint_prefix, step, batches.fingerprint(), mesh.rank(), mesh.world_size(),
                  mesh.world()->timeout());

  const double lr = run.schedule.at(step - 1);
  update.set_lr(lr);
  update.zero_grad();
  held_bytes = watch.held_bytes();
  update.begin_step();
  double local_loss = 0;
  at::Tensor expert_counts;  // tokens each expert took (mixture of experts)
  const ObjectiveOptions& objective = run.o.objective;
  const std::vector<std::vector<double>> weights = policy_weights(batches, run.in, objective);
  std::map<std::string, double> objective_parts;  // an RL objective's figures, this rank's shares
  int64_t step_pairs = 0;                         // DPO: the step's pairs, every micro-batch's
  for (const MicroBatch& micro : batches.micro) step_pairs += static_cast<int64_t>(micro.samples.size()) / 2;
  for (size_t k = 0; k < batches.micro.size(); ++k) {
    const MicroBatch& micro = batches.micro[k];
    watch.phase("pixels");
    const model::PixelInputs pixels = run.pixels.take(micro.samples, micro.batch, micro.plan).to(run.o.parallel.device);
    if (next && k + 1 == batches.micro.size()) run.pixels.start(std::move(*next));
    watch.phase("forward");
    model::StepOutput out = parallel::forward_step(
        run.model.model(), micro.batch, micro.plan, pixels, run.model.parallelism(),
        1.0 / static_cast<double>(batches.micro.size()));  // the aux loss: the micro-batches' mean
    out.label_count = batches.label_count;                 // the step's: every micro-batch's labels together
    ObjectiveLoss micro_loss = step_loss(run, micro, out, weights, k, step_pairs, batches.label_count);
    for (const auto& [name, value] : micro_loss.parts) objective_parts[name] += value;
    at::Tensor& loss = micro_loss.loss;
    watch.phase("backward");
    watch.forward_done();
    loss.backward();
    watch.backward_done();
    // The auxiliary load-balancing loss (mixture of experts): its value is added here, its
    // gradient entered through the layers in the backward (model/layers/router_load.h).
    local_loss += loss.detach().to(at::kDouble).item<double>() + out.aux_loss;
    if (out.expert_counts.defined())  // every micro-batch's picks
      expert_counts = expert_counts.defined() ? expert_counts + out.expert_counts : out.expert_counts;
  }
  const double grad_norm = update.step(run.o.schedule.clip, run.doing);
  const StepAccount account = watch.finish();
  const MicroBatch& last = batches.micro.back();
  StepMetrics m =
      agreed_metrics(step, local_loss, std::move(objective_parts), lr, grad_norm, last.batch, last.plan, account, mesh);
  count_step_batches(m, batches);
  if (expert_counts.defined()) add_expert_load(m, expert_counts, mesh.shape().expert);
  return m;
}

// The trained weights, whole and detached (TrainOptions::report_parameters: tests).
std::vector<std::pair<std::string, at::Tensor>> final_parameters(WeightUpdate& update) {
  update.gather_weights();  // every rank: under --shard parameters a collective
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : update.whole_weights()) out.emplace_back(name, p.detach().clone());
  return out;
}

}  // namespace

int64_t longest_tokens_per_rank(const model::ModelConfig& config, const TrainOptions& o, int world,
                                int64_t capacity_bytes, int64_t step, int ring) {
  MMSP_CHECK(capacity_bytes > 0 && step > 0, "longest_tokens_per_rank: capacity ", capacity_bytes, " and step ", step,
             " must be positive");
  MMSP_CHECK(ring >= 0 && ring <= world && (ring == 0 || world % ring == 0), "longest_tokens_per_rank: a ring of ",
             ring, " must divide the ", world, " ranks (0: all of them)");
  const int expert = static_cast<int>(config.text.moe.expert_shards);  // set_expert_shard's, 1 without
  const plan::Mesh mesh = ring == 0 ? plan::Mesh{1, world, 1, expert} : plan::Mesh{1, ring, world / ring, expert};
  const ParameterLayout layout = layout_of(config, o.finetune);
  auto fits = [&](int64_t tokens) {
    TrainOptions t = o;
    t.inputs.tokens_per_rank = tokens;
    // --loss-chunk 0 is the default chunk; a negative one stands for "one chunk of all T"
    const int64_t chunk = o.memory.loss_chunk > 0   ? o.memory.loss_chunk
                          : o.memory.loss_chunk < 0 ? tokens
                                                    : default_loss_chunk(config.text.vocab_size);
    return estimate_for(config, layout, t, chunk, mesh).total() <= capacity_bytes;
  };
  if (!fits(step)) return 0;
  int64_t lo = step, hi = 2 * step;  // fits(lo); grow hi until it does not
  while (fits(hi)) {
    lo = hi;
    MMSP_CHECK(hi < (int64_t{1} << 40), "longest_tokens_per_rank: no limit below 2^40 tokens");
    hi *= 2;
  }
  while (hi - lo > step) {
    const int64_t mid = (lo + hi) / 2 / step * step;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

TrainReport train(const TrainOptions& o, const dist::Mesh& mesh, std::ostream& log, dist::RankActivity* activity) {
  dist::RankActivity no_heartbeat;
  dist::RankActivity& doing = activity ? *activity : no_heartbeat;
  const RunInputs in = check_run(o, mesh);
  check_rollouts(*in.data, in.resolved.config.conventions, o.objective, o.inputs.data);  // the objective's fields
  const bool rank0 = mesh.rank() == 0;
  // This run's keys in the job's store (step agreements), and the first agreement: every
  // rank is about to load the same model and checkpoint (per-host copies may differ).
  const std::string agreement_prefix = mesh.store() ? fingerprint_key_prefix(*mesh.store(), mesh.rank()) : "";
  if (mesh.store())
    agree_on_loaded_inputs(*mesh.store(), agreement_prefix,
                           loaded_inputs(o, in.resolved, in.checkpoint ? &*in.checkpoint : nullptr), mesh.rank(),
                           mesh.world_size(), mesh.world()->timeout(), mesh.hosts());

  // This run's own counters: the tensors it allocates from here on, and its time split
  // (the phases marked on this thread while it runs).
  MemoryCounter memory(o.parallel.device);  // on CUDA: the caching allocator's statistics
  PhaseTimer phases;
  const ActivePhaseTimer timing(phases);
  // auto on CUDA: measured before the first step, every rank agreeing (attention_choice.h)
  const attention::AttentionKernel decoder_kernel = decoder_attention_kernel(o, in, mesh, log);
  const Trainable trainable = build_trainable(o, in, mesh, decoder_kernel);  // takes its parallelisms off as it goes
  WeightUpdate& update = *trainable.update;
  // A warm-up longer than the run is the run (short test runs keep the default).
  const ScheduleOptions& s = o.schedule;
  const LrSchedule schedule{s.lr, s.min_lr, std::min(s.warmup, s.steps), s.steps};
  schedule.validate();
  ResumePoint resumed = resume_run(o, in, update, mesh, log);
  TrainReport report;
  report.first_step = resumed.done + 1;
  report.memory_estimate = in.memory;
  if (resumed.done >= s.steps) {
    // A requeue loop that always passes --resume meets a finished run: nothing to do is
    // a success, said once.
    if (rank0)
      log << "note: nothing to do: the run in " << o.output.resume << " is complete at step " << resumed.done
          << " of --steps " << s.steps << std::endl;
    return report;
  }

  if (rank0 && !o.output.quiet) print_run_header(o, in, update, mesh, log);

  const int64_t last_step = s.stop_after > 0 ? std::min(s.stop_after, s.steps) : s.steps;
  RunOutput output(o, in.resolved.config, in.layout, rank0, report.first_step, last_step, log);
  const plan::PlanOptions plan_options = plan_options_for(o, in, mesh);
  PixelPrefetch pixels(o, in, plan_options, mesh.rank(), prefetches_pixels(o));  // goes before the model
  const StepLoop run{o,      in,     trainable,    schedule,         mesh,      doing,
                     phases, memory, plan_options, agreement_prefix, last_step, pixels};

  if (!o.output.save_gradients.empty())
    update.save_next_gradients(o.output.save_gradients, in.resolved.config_json, mesh, log);
  for (int64_t step = resumed.done + 1; step <= last_step; ++step) {
    const StepMetrics m = run_step(run, step, resumed.position, report.held_bytes, report.memory_estimate);
    report.state_bytes = memory.current_bytes();
    report.summary.add(m);
    if (o.output.report_steps) report.steps.push_back(m);
    output.step(m);
    if (evaluates_after(o.eval, step, last_step)) {
      doing.set_phase("evaluation");
      report.evals.push_back(
          evaluate(step, o, in, trainable.model(), trainable.parallelism(), update, plan_options, mesh));
      output.eval(report.evals.back());
    }
    const int64_t every = o.output.checkpoint_every;
    if (!o.output.out.empty() && (step == last_step || (every > 0 && step % every == 0))) {
      doing.set_phase("checkpoint");
      save_step(o, in, update, step, resumed.position, mesh, log);
    }
  }
  if (rank0 && report.summary.count() > 0) log << report.summary.table();
  if (o.output.report_parameters) report.parameters = final_parameters(update);
  return report;
}

}  // namespace mmsp::train
