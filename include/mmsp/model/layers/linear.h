// The weight tables of the decoder and the vision towers, as LibTorch modules with
// Hugging Face's parameter names ("weight", "bias"): a linear map, a token embedding and
// the two norms.
#pragma once

#include <torch/nn/module.h>

namespace mmsp::model {

// y = x Wᵀ + b; weight [out, in] as HF stores it. With a LoRA adapter (add_lora, as
// peft's LoraLayer: lora_A [r, in], lora_B [out, r], scale alpha / r, no dropout) it adds
// scale · (x Aᵀ) Bᵀ; the adapter's parameters are named "lora_A.weight", "lora_B.weight".
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, double init_std);
  at::Tensor forward(const at::Tensor& x) const;
  // The map forward() applies as one matrix: weight + scale · B A with an adapter (what a
  // merge writes; the tiled MLP reads its weights this way), else the weight itself.
  at::Tensor effective_weight() const;
  // peft's initialisation: A uniform in ±1/√in (kaiming_uniform_ with a = √5), B zeros.
  void add_lora(int64_t rank, double alpha);
  bool has_lora() const { return lora_A.defined(); }
  at::Tensor weight, bias;
  at::Tensor lora_A, lora_B;  // undefined without an adapter
  double lora_scale = 0;
};

// Rows of weight [vocab, hidden] picked by token id.
class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t vocab, int64_t hidden, double init_std);
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
};

// (x - mean) / std · weight + bias over the last dim (the vision towers' norm).
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  double eps;
};

// x / rms(x) · weight, in fp32 or wider (as HF's Qwen2RMSNorm). zero_centered (Qwen3.5,
// Qwen3-Next): x / rms(x) · (1 + weight), weight stored as an offset from 1 (initially 0)
// and applied before rounding back to x's dtype, as HF's Qwen3_5RMSNorm.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t hidden, double eps, bool zero_centered = false);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
  bool zero_centered;
};

}  // namespace mmsp::model
