// Linear, Embedding, LayerNorm, RMSNorm; see linear.h.
#include "mmsp/model/layers/linear.h"

#include <ATen/ATen.h>

#include <cmath>

#include "mmsp/model/layers/parameter_init.h"

namespace mmsp::model {

Linear::Linear(int64_t in, int64_t out, bool with_bias, double init_std) {
  weight = register_parameter("weight", normal_parameter({out, in}, init_std));
  if (with_bias) bias = register_parameter("bias", zeros_parameter({out}));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y = bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  if (!lora_A.defined()) return y;
  return y + at::linear(at::linear(x, lora_A), lora_B) * lora_scale;  // as peft's Linear.forward
}

at::Tensor Linear::effective_weight() const {
  if (!lora_A.defined()) return weight;
  return weight + at::matmul(lora_B, lora_A) * lora_scale;
}

void Linear::add_lora(int64_t rank, double alpha) {
  const int64_t in = weight.size(1), out = weight.size(0);
  auto a = register_module("lora_A", std::make_shared<torch::nn::Module>());
  auto b = register_module("lora_B", std::make_shared<torch::nn::Module>());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  lora_A = a->register_parameter("weight", new_parameter({rank, in}, [bound](at::IntArrayRef shape) {
                                   return at::empty(shape, at::kFloat).uniform_(-bound, bound);
                                 }));
  lora_B = b->register_parameter("weight", zeros_parameter({out, rank}));
  lora_scale = alpha / static_cast<double>(rank);
}

Embedding::Embedding(int64_t vocab, int64_t hidden, double init_std) {
  weight = register_parameter("weight", normal_parameter({vocab, hidden}, init_std));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", ones_parameter({dim}));
  bias = register_parameter("bias", zeros_parameter({dim}));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const { return at::layer_norm(x, {x.size(-1)}, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t hidden, double eps_, bool zero_centered_) : eps(eps_), zero_centered(zero_centered_) {
  weight = register_parameter("weight", zero_centered ? zeros_parameter({hidden}) : ones_parameter({hidden}));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  const at::ScalarType type = x.scalar_type();
  at::Tensor wide = type == at::kDouble ? x : x.to(at::kFloat);
  at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (zero_centered) return (normed * (weight.to(wide.scalar_type()) + 1)).to(type);
  return weight * normed.to(type);
}

}  // namespace mmsp::model
