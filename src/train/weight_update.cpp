// The replicated and the sharded weight update; see weight_update.h.
#include "mmsp/train/weight_update.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint_io.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/layers/expert_names.h"
#include "mmsp/model/lora.h"
#include "mmsp/parallel/expert_gather.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/train/checkpoint/sharded_checkpoint.h"
#include "mmsp/train/optim/grad_clip.h"
#include "mmsp/train/optim/master_weights.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;

// Every rank learns whether any failed; the error names the failing ranks. (The flag's
// all-reduce has the group's timeout: no rank waits on a dead one for ever.)
void agree_on_success(const std::string& error, const std::string& what, const dist::Mesh& mesh) {
  const int world = mesh.world_size();
  at::Tensor failed = at::zeros({world}, at::kDouble);
  failed[mesh.rank()] = error.empty() ? 0.0 : 1.0;
  dist::all_reduce_(failed, *mesh.world());
  std::string ranks;
  for (int r = 0; r < world; ++r)
    if (failed[r].item<double>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  MMSP_CHECK(ranks.empty(), what, " failed on rank ", ranks, error.empty() ? std::string() : ": " + error);
}

// ", 12 frozen tensors" for the start-up line (`after`: a note precedes it).
std::string frozen_note(const model::NamedParams& frozen, bool after) {
  if (frozen.empty()) return "";
  return std::string(after ? ", " : "") + std::to_string(frozen.size()) + " frozen tensors";
}

// The trained weights, then the frozen ones: what a checkpoint holds and a resume reads.
model::NamedParams with_frozen(model::NamedParams weights, const model::NamedParams& frozen) {
  weights.insert(weights.end(), frozen.begin(), frozen.end());
  return weights;
}

// What a model directory feeds: every weight but LoRA's adapters (drawn, never in a base model).
model::NamedParams loaded_from_model(const model::NamedParams& weights, const model::NamedParams& frozen,
                                     WeightUpdate::Loaded which) {
  model::NamedParams out;
  for (const auto& named : with_frozen(weights, frozen))
    if (model::is_lora_parameter(named.first) == (which == WeightUpdate::Loaded::adapters)) out.push_back(named);
  return out;
}

// The parameters whose gradients sum over the data group, or (expert parallelism) the
// expert ones, which sum over the ranks holding the same experts.
model::NamedParams select(const model::NamedParams& params, bool split, bool experts) {
  model::NamedParams out;
  for (const auto& named : params)
    if (!split || model::is_expert_parameter(named.first) == experts) out.push_back(named);
  return out;
}

class ReplicatedUpdate : public WeightUpdate {
 public:
  ReplicatedUpdate(model::NamedParams model_params, at::ScalarType master_dtype, const AdamWOptions& options,
                   const parallel::ModelParallelism& parallelism, model::NamedParams frozen)
      : masters_(std::move(model_params), master_dtype),
        opt_(make_adamw(masters_.params(), options)),
        split_(parallelism.experts != nullptr),
        sync_(select(masters_.params(), split_, false), parallelism.data),
        experts_(parallelism.experts),
        moe_(parallelism.moe),
        frozen_(std::move(frozen)) {
    if (split_) expert_sync_.emplace(select(masters_.params(), true, true), parallelism.expert_data);
  }

  void load_weights(const hf::HfDirectory& dir, const hf::CheckpointNaming& naming, Loaded which) override {
    hf::load_hf_weights(dir, loaded_from_model(masters_.params(), frozen_, which), naming);
    masters_.copy_to_model();
  }
  void restore(const Checkpoint& checkpoint) override {
    train::restore(checkpoint, with_frozen(masters_.params(), frozen_), *opt_);
    masters_.copy_to_model();
  }
  void set_lr(double lr) override { train::set_lr(*opt_, lr); }
  void zero_grad() override { opt_->zero_grad(); }
  double step(double clip_norm, dist::RankActivity& doing) override {
    masters_.take_grads();
    doing.set_phase("gradient sync");
    sync_.all_reduce();
    if (expert_sync_) expert_sync_->all_reduce();
    if (gradients_.mesh) write_gradients();
    doing.set_phase("optimizer");
    const double norm = split_ ? clip_grad_norm(sync_.params(), expert_sync_->params(), clip_norm,
                                                [this](double local) { return sum_over_experts(local); })
                               : clip_grad_norm(masters_.params(), clip_norm);
    opt_->step();
    masters_.copy_to_model();
    return norm;
  }
  // Rank 0 writes the whole checkpoint.
  void save(const std::string& dir, int64_t step, const nlohmann::json& state, const std::string& config_json,
            CheckpointOptions options, const dist::Mesh& mesh, std::ostream& log) override {
    std::string error;
    // Expert parallelism: every rank gathers the other experts' weights and moments (a
    // collective); rank 0 writes the whole model.
    const WholeState whole = split_ ? whole_state() : WholeState{};
    if (mesh.rank() == 0) {
      try {
        if (split_)
          save_checkpoint(dir, step, with_frozen(whole.weights, frozen_), whole.adamw, state, config_json, options);
        else
          save_checkpoint(dir, step, with_frozen(masters_.params(), frozen_), *opt_, state, config_json, options);
      } catch (const std::exception& e) { error = e.what(); }
    }
    agree_on_success(error, "saving the checkpoint of step " + std::to_string(step) + " in " + dir, mesh);
    if (mesh.rank() == 0) log << "checkpoint: step " << step << " saved in " << dir << std::endl;
  }
  void save_next_gradients(const std::string& dir, const std::string& config_json, const dist::Mesh& mesh,
                           std::ostream& log) override {
    gradients_ = {dir, config_json, &mesh, &log};
  }
  model::NamedParams weights() const override { return with_frozen(masters_.params(), frozen_); }
  model::NamedParams whole_weights() override {
    return with_frozen(parallel::gather_experts(masters_.params(), moe_, experts_), frozen_);
  }
  std::string describe() const override {
    return std::string(masters_.mixed() ? "fp32 master weights" : "") +
           (split_ ? std::string(masters_.mixed() ? "; " : "") + "experts split over " +
                         std::to_string(experts_->size()) + " ranks"
                   : "") +
           frozen_note(frozen_, masters_.mixed() || split_);
  }

 private:
  // The whole model's weights and AdamW state, every rank's experts gathered.
  struct WholeState {
    model::NamedParams weights;
    AdamWState adamw;
  };
  WholeState whole_state() const {
    const model::NamedParams& mine = masters_.params();
    const AdamWState local = capture_adamw_state(*opt_, mine);
    model::NamedParams avg, avg_sq;
    for (const auto& [name, p] : mine) {
      const auto it = local.params.find(name);
      MMSP_CHECK(it != local.params.end(), "saving with --expert: \"", name, "\" has not taken a step");
      avg.emplace_back(name, it->second.exp_avg);
      avg_sq.emplace_back(name, it->second.exp_avg_sq);
    }
    WholeState whole{parallel::gather_experts(mine, moe_, experts_), {}};
    const model::NamedParams avgs = parallel::gather_experts(avg, moe_, experts_);
    const model::NamedParams sqs = parallel::gather_experts(avg_sq, moe_, experts_);
    const int64_t steps = local.params.begin()->second.step;  // every parameter steps every step
    for (size_t i = 0; i < avgs.size(); ++i)
      whole.adamw.params[avgs[i].first] = {steps, avgs[i].second, sqs[i].second, {}};
    // The groups (decay: matrices, no decay: the rest) as make_adamw forms them.
    whole.adamw.groups = local.groups;
    for (AdamWGroupState& g : whole.adamw.groups) g.params.clear();
    for (const auto& [name, w] : whole.weights) whole.adamw.groups[w.dim() >= 2 ? 0 : 1].params.push_back(name);
    return whole;
  }

  // Σ over the expert group (each rank holds its experts' share of Σ g²).
  double sum_over_experts(double local) const {
    at::Tensor t = at::full({1}, local, at::kDouble);
    dist::all_reduce_(t, *experts_);
    return t.item<double>();
  }

  // The synced gradients as a model directory; a parameter the step did not reach
  // (no gradient) is written as zeros, as the reference's would read.
  void write_gradients() {
    const GradientRequest request = gradients_;
    gradients_ = {};
    std::string error;
    model::NamedParams grads;
    for (const auto& [name, p] : masters_.params())
      grads.emplace_back(name, p.grad().defined() ? p.grad().detach() : at::zeros_like(p));
    grads = parallel::gather_experts(grads, moe_, experts_);  // every rank: the other experts' (expert parallelism)
    if (request.mesh->rank() == 0) {
      try {
        hf::save_hf_directory(request.dir, grads, request.config_json);
      } catch (const std::exception& e) { error = e.what(); }
    }
    agree_on_success(error, "--save-gradients " + request.dir, *request.mesh);
    if (request.mesh->rank() == 0) *request.log << "gradients: saved in " << request.dir << std::endl;
  }

  struct GradientRequest {
    std::string dir, config_json;
    const dist::Mesh* mesh = nullptr;  // set: the next step writes
    std::ostream* log = nullptr;
  };
  GradientRequest gradients_;
  MasterWeights masters_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  bool split_;                                     // expert parallelism
  parallel::GradSync sync_;                        // every parameter, or (split) the non-expert ones
  std::optional<parallel::GradSync> expert_sync_;  // split: the experts', over their replicas
  dist::GroupPtr experts_;
  model::MoeConfig moe_;
  model::NamedParams frozen_;  // the model's own tensors: no master, no state, no sum
};

// Where each expert parameter of this rank starts in the whole one a checkpoint holds: a
// fused tensor's rows of this rank's experts; a per-expert tensor is whole under its name.
std::vector<int64_t> expert_whole_offsets(const model::NamedParams& experts, const model::MoeConfig& moe) {
  std::vector<int64_t> offsets;
  for (const auto& [name, p] : experts)
    offsets.push_back(model::expert_index(name) >= 0 ? 0 : moe.first_local_expert() * (p.numel() / p.size(0)));
  return offsets;
}

class ShardedUpdate : public WeightUpdate {
 public:
  ShardedUpdate(model::NamedParams model_params, const parallel::ModelParallelism& parallelism,
                const AdamWOptions& options, const dist::Mesh& mesh, model::NamedParams frozen)
      : trained_(std::move(model_params)),
        mixed_(parallelism.zero->master_dtype() != parallelism.zero->model_params().front().second.scalar_type()),
        world_(mesh.world_size()),
        data_(parallelism.data),
        experts_(parallelism.experts),
        moe_(parallelism.moe),
        frozen_(std::move(frozen)) {
    optimizers_.push_back(std::make_unique<ShardedAdamW>(parallelism.zero, options));
    if (parallelism.expert_zero)
      optimizers_.push_back(std::make_unique<ShardedAdamW>(
          parallelism.expert_zero, options, expert_whole_offsets(parallelism.expert_zero->model_params(), moe_)));
    size_t held = 0;
    for (ShardedAdamW* o : optimizers()) held += o->model_params().size();
    MMSP_CHECK(held == trained_.size(), "make_weight_update: the sharded models hold ", held, " of the ",
               trained_.size(), " trained parameters");
  }

  void load_weights(const hf::HfDirectory& dir, const hf::CheckpointNaming& naming, Loaded which) override {
    // Into the model, then its shards into the masters: exact when the file's dtype is
    // the model's (Qwen's bf16 releases into a bf16 run), else rounded to the model's.
    gather_weights();  // stage 3: memory to load into (the gathered values are overwritten)
    hf::load_hf_weights(dir, loaded_from_model(trained(), frozen_, which), naming);
    for (parallel::ShardedModel* z : zeros()) z->copy_from_model();
    release_gathered();
  }
  void gather_weights() override {
    for (parallel::ShardedModel* z : zeros()) z->gather_all();
  }
  void restore(const Checkpoint& checkpoint) override {
    // Stage 3 shards the layers' frozen weights: whole while the checkpoint's are read into
    // them, then their shards refilled (the masters come from the checkpoint itself).
    const bool frozen_sharded = !zero().sharded_frozen().empty();
    if (frozen_sharded) zero().gather_all();
    hf::CheckpointNaming naming;  // expert parallelism: this rank's rows and experts of the whole file's
    model::add_expert_shard(naming, moe_);
    train::restore(checkpoint, optimizers(), frozen_, naming);
    if (!frozen_sharded) return;
    zero().copy_frozen_from_model();
    zero().release_gathered();
  }
  void set_lr(double lr) override {
    for (ShardedAdamW* o : optimizers()) o->set_lr(lr);
  }
  void begin_step() override {
    for (parallel::ShardedModel* z : zeros()) z->gather_step_weights();
  }
  void zero_grad() override {
    for (ShardedAdamW* o : optimizers()) o->zero_grad();
  }
  double step(double clip_norm, dist::RankActivity& doing) override {
    doing.set_phase("optimizer (sharded)");
    return step_together(optimizers(), clip_norm, *data_);
  }
  // Each rank writes its shards into a staging dir; rank 0 then writes the rest and
  // moves them into the step dir, under one checksums.json.
  void save(const std::string& dir, int64_t step, const nlohmann::json& state, const std::string& config_json,
            CheckpointOptions options, const dist::Mesh& mesh, std::ostream& log) override {
    const std::string what = "saving the checkpoint of step " + std::to_string(step) + " in " + dir;
    const std::string staging = shard_staging_dir(dir, step);
    std::string error;
    if (mesh.rank() == 0) {
      try {
        fs::create_directories(dir);
        fs::remove_all(staging);
        fs::create_directory(staging);
      } catch (const std::exception& e) { error = e.what(); }
    }
    // A failed save (no space, ...) leaves no staged shards behind: the disk is freed
    // and the next save or --resume finds the directory as before.
    const auto agree = [&](const std::string& failure) {
      try {
        agree_on_success(failure, what, mesh);
      } catch (...) {
        std::error_code ignored;
        if (mesh.rank() == 0) fs::remove_all(staging, ignored);
        throw;
      }
    };
    agree(error);
    // The hf/ weights go out whole (rank 0 writes them): stage 3 gathers them, expert
    // parallelism the other ranks' experts (every rank takes part).
    gather_weights();
    const model::NamedParams whole = whole_weights();
    const int rank = mesh.rank(), world = mesh.world_size();
    hf::FileChecksum mine;
    try {
      checkpoint_io::DurableWriter writer(-1, kCheckpointCrashExitCode);
      const std::string path = staging + "/" + optimizer_shard_file(rank, world);
      const std::vector<ShardedAdamW*> all = optimizers();
      const std::vector<const ShardedAdamW*> parts(all.begin(), all.end());
      writer.write_safetensors(path, optimizer_shard_tensors(parts), optimizer_shard_metadata(parts, rank, world));
      mine = writer.checksums().at(path);
    } catch (const std::exception& e) { error = e.what(); }
    agree(error);
    // Every rank's checksum to rank 0: slot r is rank r's (the others add zeros).
    at::Tensor sums = at::zeros({2 * world}, at::kLong);
    sums[2 * rank] = static_cast<int64_t>(mine.size);
    sums[2 * rank + 1] = static_cast<int64_t>(mine.xxh64);  // the bits, as int64
    dist::all_reduce_(sums, *mesh.world());
    if (rank == 0) {
      options.optimizer_shards_staged = staging;
      for (int r = 0; r < world; ++r)
        options.optimizer_shard_checksums[optimizer_shard_file(r, world)] = {
            static_cast<uint64_t>(sums[2 * r].item<int64_t>()), static_cast<uint64_t>(sums[2 * r + 1].item<int64_t>())};
      try {
        save_checkpoint(dir, step, whole, state, config_json, options);
      } catch (const std::exception& e) { error = e.what(); }
    }
    release_gathered();
    agree(error);
    if (rank == 0) log << "checkpoint: step " << step << " saved in " << dir << std::endl;
  }
  void save_next_gradients(const std::string&, const std::string&, const dist::Mesh&, std::ostream&) override {
    MMSP_FAIL("--save-gradients needs --shard none: a sharded update holds no whole gradient");
  }
  model::NamedParams weights() const override { return with_frozen(trained(), frozen_); }
  model::NamedParams whole_weights() override {
    return with_frozen(parallel::gather_experts(trained(), moe_, experts_), frozen_);
  }
  std::string describe() const override {
    const char* what = zero().level() == parallel::ShardLevel::parameters  ? "optimizer state, gradients and weights"
                       : zero().level() == parallel::ShardLevel::gradients ? "optimizer state and gradients"
                                                                           : "optimizer state";
    const size_t sharded_frozen = zero().sharded_frozen().size();
    const std::string experts = optimizers_.size() > 1
                                    ? "; experts split over " + std::to_string(experts_->size()) +
                                          " ranks, theirs sharded over " +
                                          std::to_string(optimizers_.back()->sharded().world()->size())
                                    : "";
    return std::string(mixed_ ? "fp32 master weights; " : "") + what + " sharded over " + std::to_string(world_) +
           " ranks" + experts + frozen_note(frozen_, true) +
           (sharded_frozen > 0 ? " (" + std::to_string(sharded_frozen) + " of them sharded)" : "");
  }

 private:
  parallel::ShardedModel& zero() const { return optimizers_.front()->sharded(); }  // the dense weights'
  std::vector<ShardedAdamW*> optimizers() const {
    std::vector<ShardedAdamW*> out;
    for (const auto& o : optimizers_) out.push_back(o.get());
    return out;
  }
  std::vector<parallel::ShardedModel*> zeros() const {
    std::vector<parallel::ShardedModel*> out;
    for (const auto& o : optimizers_) out.push_back(&o->sharded());
    return out;
  }
  void release_gathered() {
    for (parallel::ShardedModel* z : zeros()) z->release_gathered();
  }
  // This rank's trained weights (its experts only), in the model's order.
  const model::NamedParams& trained() const { return trained_; }

  model::NamedParams trained_;  // what the sharded models hold between them
  // What parallelize installed: the dense weights' (over the world), then with expert
  // parallelism the experts' (over their replicas).
  std::vector<std::unique_ptr<ShardedAdamW>> optimizers_;
  bool mixed_;
  int world_;
  dist::GroupPtr data_;     // the world: one norm over both
  dist::GroupPtr experts_;  // the expert group (null without expert parallelism)
  model::MoeConfig moe_;
  model::NamedParams frozen_;  // every frozen tensor (stage 3 shards the layers' ones: zero().sharded_frozen())
};

}  // namespace

std::unique_ptr<WeightUpdate> make_weight_update(model::NamedParams model_params, at::ScalarType master_dtype,
                                                 const AdamWOptions& options, const dist::Mesh& mesh,
                                                 const parallel::ModelParallelism& parallelism,
                                                 model::NamedParams frozen) {
  MMSP_CHECK(!model_params.empty(), "make_weight_update: nothing to train (every parameter is frozen)");
  if (parallelism.zero)
    return std::make_unique<ShardedUpdate>(std::move(model_params), parallelism, options, mesh, std::move(frozen));
  MMSP_CHECK(parallelism.data, "make_weight_update: the replicated update needs the group its gradients sum over");
  return std::make_unique<ReplicatedUpdate>(std::move(model_params), master_dtype, options, parallelism,
                                            std::move(frozen));
}

}  // namespace mmsp::train
