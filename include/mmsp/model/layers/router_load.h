// One step's routing over every sparse (mixture-of-experts) layer of the decoder: how
// many of the step's tokens each layer sent to each expert (the metrics' load per expert
// rank), and transformers' auxiliary load-balancing loss over the whole step
// (load_balancing_loss_func with the padding masked out):
//   aux = E · Σ_e (C_e / N) · (P_e / N),
// C_e the top-k picks of expert e and P_e its router probabilities, both summed over every
// real token of every sparse layer on every rank, N the real tokens times the sparse
// layers. Each rank records its layers' counts and probability sums; after the decoder the
// counts are summed over the step's ranks once (a function handed in: no group here), and
// this rank's share of coef · aux is Σ_e g_e · P_e(this rank), g_e = coef · E · C_e / N²,
// which sum to coef · aux over the ranks. The share's gradient enters each layer through
// an identity on its output whose backward hands its probability sums g (Megatron's
// MoEAuxLossAutoScaler does the same), so the loss's backward carries it, recomputed
// layers included, and the trainer only adds the share's value to the loss it reports.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace mmsp::model {

class RouterLoad : public std::enable_shared_from_this<RouterLoad> {
 public:
  // `aux_coef` 0: no auxiliary loss (the counts only). `real_tokens`: this rank's slots
  // that hold a token (padding is not routed into the statistics).
  RouterLoad(int64_t experts, int64_t sparse_layers, double aux_coef, int64_t real_tokens);

  // A sparse layer's forward: `counts` [E] int64, its picks over this rank's real tokens;
  // `prob_sum` [E] its router probabilities summed over them (with their graph; undefined
  // without the aux loss). Returns `out` with the aux loss's gradient attached. A
  // recomputed layer calls it again after finish(): then only the gradient is attached.
  at::Tensor record(int64_t sparse_layer, const at::Tensor& out, const at::Tensor& counts, const at::Tensor& prob_sum);

  // Every rank, once, after the decoder's forward (before any backward): the counts and
  // real tokens summed over the step's ranks in place by `sum`; returns this rank's share
  // of coef · aux (0 without it).
  double finish(const std::function<void(at::Tensor&)>& sum);

  bool finished() const { return finished_; }
  // After finish: [sparse layers, E], every rank's picks (float64).
  const at::Tensor& counts() const { return counts_; }
  // After finish: g [E] (the gradient of the step's coef · aux by each P_e), in prob_sum's dtype.
  const at::Tensor& coefficients() const { return coefficients_; }

 private:
  int64_t experts_, layers_;
  double coef_;
  int64_t real_tokens_;
  bool finished_ = false;
  at::Tensor counts_;                  // [layers, E] float64: this rank's, then every rank's
  std::vector<at::Tensor> prob_sums_;  // [layer] this rank's, detached
  at::Tensor coefficients_;
};

}  // namespace mmsp::model
