// The language decoder (Qwen2 / Llama style, and the hybrid Qwen3.5 / Qwen3-Next one) as
// LibTorch modules whose parameter names are Hugging Face's: model.embed_tokens,
// model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj | linear_attn.* (Gated
// DeltaNet layers), post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
// lm_head. It sees only its tokens: the attention function (local, Ulysses, ring or
// hybrid, chosen and planned outside it once per step) and the rotary positions come
// in through DecoderContext.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

#include "mmsp/attention/linear/gated_delta_rule.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/model/config/text_config.h"
#include "mmsp/model/hooks/layer_hooks.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/layers/gated_deltanet.h"
#include "mmsp/model/layers/gated_deltanet_layer.h"
#include "mmsp/model/layers/linear.h"
#include "mmsp/model/layers/moe_block.h"
#include "mmsp/model/layers/rotary.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

// What a layer needs besides its weights: this rank's rotary table and the step's
// attention, planned once (attention::StepAttention) and shared by every layer:
// full-attention layers call `attend`; Gated DeltaNet layers read `linear`, the same
// groups and shares with their ring runs (Ulysses over heads, state passing across the ring).
struct DecoderContext {
  attention::AttentionFunction attend;
  attention::GatedDeltaContext linear;
  RotaryTable rotary;
  // chunk of the Gated DeltaNet kernel (hybrid decoders), the one `linear` was planned for
  int64_t linear_chunk = attention::kGatedDeltaChunk;
  // tokens per tile of the MLP (tiled_mlp.h); 0: untiled. Decoder::final_hidden sets it
  // from the decoder's --tiled-mlp setting and this rank's tokens.
  int64_t mlp_tile = 0;
  // --tiled-mlp's setting (0 off, kAutoMlpTile, or tokens) for the Gated DeltaNet token
  // mixer, which resolves it against its own rows (gated_deltanet_layer.h).
  int64_t linear_tile = 0;
  // Qwen3-VL deepstack: after decoder layer k, deepstack[k] [V, hidden] is added at
  // the local slots visual_slots [V] (the same slots the vision rows were spliced into).
  at::Tensor visual_slots;
  std::vector<at::Tensor> deepstack;
  // Mixture-of-experts layers: how their tokens reach the experts and the step's routing
  // record (moe_block.h); unused by dense decoders.
  MoeStep moe;
};

// The rotary settings of a decoder: 1-D for LLaVA, mRoPE sections for the Qwen family.
RotaryOptions rotary_options(const TextConfig& text, const plan::ModelConventions& conventions);

struct RankInputs;

// The context of one rank's step: the step's attention (planned outside the model from
// the step's groups: parallel::plan_decoder_attention) and the rotary table of its
// positions (from the plan), in the dtype and on the device of `like`.
DecoderContext decoder_context(const RankInputs& inputs, const TextConfig& text,
                               const plan::ModelConventions& conventions,
                               std::shared_ptr<const attention::StepAttention> step, const at::Tensor& like,
                               int64_t linear_chunk = attention::kGatedDeltaChunk);

// Layer `index` of the decoder: its token mixer is full attention ("self_attn") or, where
// the config's layer_types say linear_attention, a Gated DeltaNet layer ("linear_attn").
class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const TextConfig& config, int64_t index);
  // hidden [L, hidden] -> [L, hidden]
  at::Tensor forward(const at::Tensor& hidden, const DecoderContext& context) const;
  LayerKind kind() const { return kind_; }

 private:
  struct Attention : torch::nn::Module {
    explicit Attention(const TextConfig& config);
    // q_proj: [L, hidden] -> [L, H·D], or [L, H·2D] ([query | gate] per head) with attn_output_gate
    std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
    std::shared_ptr<RMSNorm> q_norm, k_norm;  // per head, before RoPE (Qwen3-VL, Qwen3.5); else null
  };
  // x [L, hidden] (normed) -> the attention block's output [L, hidden]
  at::Tensor attend(const at::Tensor& x, const DecoderContext& context) const;
  struct Mlp : torch::nn::Module {
    explicit Mlp(const TextConfig& config);
    std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
    // {gate, up, down} × {weight, bias} (undefined biases included), what apply() reads
    std::vector<at::Tensor> weights() const;
    // down(silu(gate(y)) · up(y)) with these weights: token-wise, so it can run in tiles
    static at::Tensor apply(const at::Tensor& y, const std::vector<at::Tensor>& weights);
  };
  TextConfig config_;
  LayerKind kind_ = LayerKind::full_attention;
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Attention> self_attn_;        // full attention layers
  std::shared_ptr<GatedDeltaNet> linear_attn_;  // Gated DeltaNet layers
  std::shared_ptr<Mlp> mlp_;                    // dense layers
  std::shared_ptr<SparseMoeBlock> moe_;         // mixture-of-experts layers ("mlp" too)
  int64_t sparse_index_ = -1;                   // its place among the sparse layers
};

// The decoder's mixture-of-experts layers (MoeConfig::sparse), in order.
int64_t sparse_layer_count(const TextConfig& config);

// "model.layers": children named 0, 1, ... (module names cannot hold dots).
class DecoderLayers : public torch::nn::Module {
 public:
  explicit DecoderLayers(const TextConfig& config);
  std::vector<std::shared_ptr<DecoderLayer>> list;
};

// The body ("model.*"): embeddings, layers, final norm.
class DecoderBody : public torch::nn::Module {
 public:
  explicit DecoderBody(const TextConfig& config);
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<DecoderLayers> layers;
  std::shared_ptr<RMSNorm> norm;
};

class Decoder : public torch::nn::Module {
 public:
  // Parameters are drawn from the current ATen generator (seed it for replicas).
  Decoder(const TextConfig& config, bool tie_word_embeddings);

  // inputs_embeds [L, hidden] -> logits [L, vocab]
  at::Tensor forward(const at::Tensor& inputs_embeds, const DecoderContext& context) const;
  // inputs_embeds [L, hidden] -> the final norm's output [L, hidden]: what the LM head
  // reads (the trainer's chunked loss applies the head itself, a chunk at a time).
  at::Tensor final_hidden(const at::Tensor& inputs_embeds, const DecoderContext& context) const;
  // The LM head's weight [vocab, hidden]: lm_head.weight, or the embedding when tied.
  const at::Tensor& head_weight() const { return lm_head ? lm_head->weight : model->embed_tokens->weight; }
  // Recompute each layer in the backward instead of keeping its activations; `offload`
  // (non-null) keeps each layer's input in host memory meanwhile (activation_offload.h).
  void set_recompute_layers(bool on, std::shared_ptr<ActivationOffload> offload = nullptr) {
    recompute_layers_ = on;
    offload_ = std::move(offload);
  }
  // Every layer's MLP over tiles of tokens (tiled_mlp.h): 0 off, kAutoMlpTile, or tokens.
  // Refused for a mixture-of-experts decoder (its tokens are routed all at once).
  void set_mlp_tile(int64_t setting);
  // Called around every hooked unit's use (null: none); see layer_hooks.h.
  void set_layer_hooks(std::shared_ptr<LayerHooks> hooks) { layer_hooks_ = std::move(hooks); }
  // Each layer's parameters, in layer order.
  std::vector<std::vector<at::Tensor>> layer_parameters() const;
  // What the hooks of unit u speak of: the layers 0 … L−1 (read forward and backward),
  // the LM head's weight L (read by the loss forward and again by its backward; tied,
  // also by the embedding lookup, whose gradient arrives last), and the untied token
  // embedding L + 1 (read by its forward only: the lookup's backward needs the ids).
  std::vector<HookUnit> hook_units() const;
  // token_ids [L] -> [L, hidden], the embedding's hooks around the read.
  at::Tensor embed(const at::Tensor& token_ids) const;
  // head(hidden, head_weight()) with the head's hooks around it, forward and backward:
  // `head` is what reads the weight (logits, or the chunked loss). When the hooks keep
  // the head row-sharded (ZeRO-3, layer_hooks.h), by_rows(hidden, its rows) runs instead:
  // the chunked loss reads it by rounds; a reader without one (logits) is refused.
  using RowsHead = std::function<at::Tensor(const at::Tensor& hidden, RowShardedWeight& rows)>;
  at::Tensor apply_head(const std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& weight)>& head,
                        const at::Tensor& hidden, const RowsHead& by_rows = nullptr) const;

  const TextConfig& config() const { return config_; }
  std::shared_ptr<DecoderBody> model;
  std::shared_ptr<Linear> lm_head;  // null when tied to model.embed_tokens

 private:
  // The hook units' numbers (see hook_units).
  size_t head_unit() const { return model->layers->list.size(); }
  size_t embedding_unit() const { return head_unit() + (lm_head ? 1 : 0); }
  TextConfig config_;
  bool recompute_layers_ = false;
  std::shared_ptr<ActivationOffload> offload_;
  int64_t mlp_tile_ = 0;
  std::shared_ptr<LayerHooks> layer_hooks_;
};

}  // namespace mmsp::model
