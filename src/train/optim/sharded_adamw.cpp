// AdamW over ZeRO's shards; see sharded_adamw.h.
#include "mmsp/train/optim/sharded_adamw.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::train {

ShardedAdamW::ShardedAdamW(std::shared_ptr<parallel::ShardedModel> sharded, const AdamWOptions& options,
                           std::vector<int64_t> whole_offsets)
    : sharded_(std::move(sharded)), options_(options), whole_offsets_(std::move(whole_offsets)) {
  MMSP_CHECK(sharded_, "ShardedAdamW: no sharded model");
  MMSP_CHECK(whole_offsets_.empty() || whole_offsets_.size() == sharded_->model_params().size(),
             "ShardedAdamW: ", whole_offsets_.size(), " whole offsets for ", sharded_->model_params().size(),
             " parameters");
  check_adamw_options(options_);
  for (size_t b = 0; b < sharded_->bucket_count(); ++b) {
    const at::Tensor& master = sharded_->master(b);
    moments_.push_back(Moments{at::zeros_like(master), at::zeros_like(master)});
  }
}

void ShardedAdamW::set_lr(double lr) {
  MMSP_CHECK(std::isfinite(lr) && lr >= 0, "set_lr: lr (", lr, ") must be a finite number ≥ 0");
  options_.lr = lr;
}

at::Tensor ShardedAdamW::piece(const parallel::ShardPiece& piece, ShardTensor which) const {
  if (which == ShardTensor::master) return sharded_->master_piece(piece);
  const Moments& m = moments_.at(piece.bucket);
  return (which == ShardTensor::exp_avg ? m.exp_avg : m.exp_avg_sq).narrow(0, piece.shard_offset, piece.length);
}

namespace {

// clip_grad_norm's scale of the gradients for `norm`.
double clip_scale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1;
}

}  // namespace

double ShardedAdamW::step(double max_norm) { return step_together({this}, max_norm, *sharded_->world()); }

double step_together(const std::vector<ShardedAdamW*>& optimizers, double max_norm, dist::Group& world) {
  at::NoGradGuard no_grad;
  std::vector<const parallel::ShardedModel*> models;
  std::vector<std::vector<at::Tensor>> grads;
  for (ShardedAdamW* o : optimizers) {
    models.push_back(&o->sharded());
    grads.push_back(o->reduce_gradients());
  }
  const double norm = parallel::grad_norm(models, grads, world);
  for (size_t i = 0; i < optimizers.size(); ++i) optimizers[i]->update(grads[i], clip_scale(norm, max_norm));
  return norm;
}

void ShardedAdamW::update(std::vector<at::Tensor>& grads, double scale) {
  at::NoGradGuard no_grad;
  MMSP_CHECK(grads.size() == moments_.size(), "ShardedAdamW::update: ", grads.size(), " gradients for ",
             moments_.size(), " buckets");
  if (scale != 1)
    for (at::Tensor& g : grads) g.mul_(scale);
  ++steps_;
  // torch::optim::AdamW's update, element for element.
  const double lr = options_.lr, beta1 = options_.beta1, beta2 = options_.beta2;
  const double correction1 = 1 - std::pow(beta1, static_cast<double>(steps_));
  const double correction2 = 1 - std::pow(beta2, static_cast<double>(steps_));
  // Decoupled decay, on the matrices only: piece by piece (no per-element mask: it was
  // one more byte per parameter of state).
  const model::NamedParams& params = sharded_->model_params();
  if (options_.weight_decay != 0)
    for (const parallel::ShardPiece& piece : sharded_->pieces())
      if (params[piece.param].second.dim() >= 2) sharded_->master_piece(piece).mul_(1 - lr * options_.weight_decay);
  for (size_t b = 0; b < moments_.size(); ++b) {
    const int64_t shard = sharded_->shard_elements(b);
    // Elementwise, so a slice at a time gives the numbers of one pass.
    for (int64_t first = 0; first < shard; first += kUpdateSlice) {
      const int64_t n = std::min(kUpdateSlice, shard - first);
      at::Tensor master = sharded_->master(b).narrow(0, first, n), exp_avg = moments_[b].exp_avg.narrow(0, first, n),
                 exp_avg_sq = moments_[b].exp_avg_sq.narrow(0, first, n);
      const at::Tensor g = grads[b].narrow(0, first, n);
      exp_avg.mul_(beta1).add_(g, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
      const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(correction2)).add_(options_.eps);
      master.addcdiv_(exp_avg, denom, -lr / correction1);
    }
    sharded_->refresh(b);
  }
  sharded_->release_frozen();
}

void ShardedAdamW::load(int64_t steps_taken, const StateReader& read) {
  MMSP_CHECK(steps_taken >= 0, "ShardedAdamW::load: steps_taken ", steps_taken, " must be ≥ 0");
  at::NoGradGuard no_grad;
  const model::NamedParams& params = sharded_->model_params();
  const std::vector<parallel::ShardPiece>& pieces = sharded_->pieces();
  // Read everything first: a refused piece leaves the state as it was.
  std::vector<std::array<at::Tensor, 3>> loaded;
  for (const parallel::ShardPiece& piece : pieces) {
    std::array<at::Tensor, 3> three;
    for (ShardTensor which : {ShardTensor::master, ShardTensor::exp_avg, ShardTensor::exp_avg_sq}) {
      at::Tensor t = read(params[piece.param].first, which, whole_offset(piece), piece.length);
      MMSP_CHECK(t.defined() && t.numel() == piece.length, "ShardedAdamW::load: \"", params[piece.param].first,
                 "\" elements [", whole_offset(piece), ", ", whole_offset(piece) + piece.length, "): got ",
                 t.defined() ? t.numel() : 0, " values");
      three[static_cast<int>(which)] = t.reshape({-1});
    }
    loaded.push_back(three);
  }
  for (size_t k = 0; k < pieces.size(); ++k)
    for (ShardTensor which : {ShardTensor::master, ShardTensor::exp_avg, ShardTensor::exp_avg_sq})
      piece(pieces[k], which).copy_(loaded[k][static_cast<int>(which)]);
  steps_ = steps_taken;
  for (size_t b = 0; b < sharded_->bucket_count(); ++b) sharded_->refresh(b);
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = sharded_->master_bytes();
  for (const Moments& m : moments_)
    bytes += (m.exp_avg.numel() + m.exp_avg_sq.numel()) * static_cast<int64_t>(m.exp_avg.element_size());
  return bytes;
}

}  // namespace mmsp::train
