// Decoder layers and the decoder; see decoder.h.
#include "mmsp/model/layers/decoder.h"

#include <ATen/ATen.h>

#include <string>

#include "mmsp/core/check.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/rank_inputs.h"

namespace mmsp::model {

RotaryOptions rotary_options(const TextConfig& text, const plan::ModelConventions& conventions) {
  RotaryOptions o;
  o.head_dim = text.rotary_dim();  // partial RoPE rotates the first rotary_dim channels
  o.theta = text.rope_theta;
  if (conventions.uses_mrope()) {
    o.mrope_section.assign(conventions.mrope_section.begin(), conventions.mrope_section.end());
    o.interleaved = conventions.mrope_interleaved;
  }
  return o;
}

DecoderContext decoder_context(const RankInputs& in, const TextConfig& text, const plan::ModelConventions& conventions,
                               std::shared_ptr<const attention::StepAttention> step, const at::Tensor& like,
                               int64_t linear_chunk) {
  MMSP_CHECK(step != nullptr, "the decoder needs the step's attention");
  DecoderContext ctx;
  ctx.linear = {step->groups, step->ring_shares, step->linear, step->split_slots, step->linear_whole};
  ctx.attend = attention::attention_function(std::move(step));
  ctx.linear_chunk = linear_chunk;
  ctx.rotary = rotary_table(in.positions, rotary_options(text, conventions), like.scalar_type(), like.device());
  return ctx;
}

DecoderLayer::Attention::Attention(const TextConfig& c) {
  const double s = c.initializer_range;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t q_out = c.attn_output_gate ? 2 * q : q;
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.hidden_size, q_out, c.qkv_bias, s));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.hidden_size, kv, c.qkv_bias, s));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.hidden_size, kv, c.qkv_bias, s));
  o_proj = register_module("o_proj", std::make_shared<Linear>(q, c.hidden_size, c.o_bias, s));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, c.zero_centered_norm));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, c.zero_centered_norm));
  }
}

DecoderLayer::Mlp::Mlp(const TextConfig& c) {
  const double s = c.initializer_range;
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, c.mlp_bias, s));
  up_proj = register_module("up_proj", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, c.mlp_bias, s));
  down_proj = register_module("down_proj", std::make_shared<Linear>(c.intermediate_size, c.hidden_size, c.mlp_bias, s));
}

std::vector<at::Tensor> DecoderLayer::Mlp::weights() const {
  // With LoRA adapters, each map's weight + scale · B A, made once a forward (and its
  // gradient flows to A and B): the tiles then read one matrix per map.
  return {gate_proj->effective_weight(), gate_proj->bias, up_proj->effective_weight(), up_proj->bias,
          down_proj->effective_weight(), down_proj->bias};
}

at::Tensor DecoderLayer::Mlp::apply(const at::Tensor& y, const std::vector<at::Tensor>& w) {
  auto linear = [](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  };
  const at::Tensor gated = at::silu(linear(y, w[0], w[1])) * linear(y, w[2], w[3]);
  return linear(gated, w[4], w[5]);
}

DecoderLayer::DecoderLayer(const TextConfig& c, int64_t index) : config_(c), kind_(c.layer_kind(index)) {
  const bool zc = c.zero_centered_norm;
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, zc));
  if (kind_ == LayerKind::linear_attention)
    linear_attn_ = register_module("linear_attn", std::make_shared<GatedDeltaNet>(c));
  else
    self_attn_ = register_module("self_attn", std::make_shared<Attention>(c));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, zc));
  if (c.moe.sparse(index)) {
    moe_ = register_module("mlp", std::make_shared<SparseMoeBlock>(c));
    sparse_index_ = 0;
    for (int64_t i = 0; i < index; ++i) sparse_index_ += c.moe.sparse(i) ? 1 : 0;
  } else {
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c));
  }
}

int64_t sparse_layer_count(const TextConfig& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) n += c.moe.sparse(i) ? 1 : 0;
  return n;
}

namespace {

// RoPE on the first table-width channels of each head; the rest pass (partial RoPE).
at::Tensor rotate(const at::Tensor& x, const RotaryTable& table) {
  const int64_t rd = table.cos.size(1), D = x.size(2);
  if (rd == D) return apply_rotary(x, table);
  return at::cat({apply_rotary(x.narrow(2, 0, rd), table), x.narrow(2, rd, D - rd)}, 2);
}

}  // namespace

at::Tensor DecoderLayer::attend(const at::Tensor& x, const DecoderContext& ctx) const {
  const int64_t L = x.size(0), H = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  at::Tensor q, gate;
  if (config_.attn_output_gate) {
    at::Tensor qg = self_attn_->q_proj->forward(x).view({L, H, 2 * D});  // [L, H, query D | gate D]
    q = qg.narrow(2, 0, D);
    gate = qg.narrow(2, D, D).reshape({L, H * D});
  } else {
    q = self_attn_->q_proj->forward(x).view({L, H, D});  // [L, H, D]
  }
  at::Tensor k = self_attn_->k_proj->forward(x).view({L, Hkv, D});  // [L, H_kv, D]
  if (self_attn_->q_norm) {
    q = self_attn_->q_norm->forward(q);
    k = self_attn_->k_norm->forward(k);
  }
  q = rotate(q, ctx.rotary);
  k = rotate(k, ctx.rotary);
  at::Tensor v = self_attn_->v_proj->forward(x).view({L, Hkv, D});
  at::Tensor attn = ctx.attend(q, k, v).reshape({L, H * D});
  if (gate.defined()) attn = attn * at::sigmoid(gate);
  return self_attn_->o_proj->forward(attn);
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const DecoderContext& ctx) const {
  at::Tensor x = input_layernorm_->forward(hidden);
  at::Tensor mixed =
      linear_attn_ ? linear_attn_->forward(x, ctx.linear, ctx.linear_chunk, ctx.linear_tile) : attend(x, ctx);
  at::Tensor h = hidden + mixed;
  at::Tensor y = post_attention_layernorm_->forward(h);
  if (moe_) return h + moe_->forward(y, ctx.moe, sparse_index_);
  if (ctx.mlp_tile > 0) return h + tiled_over_tokens(&Mlp::apply, y, mlp_->weights(), ctx.mlp_tile);
  return h + Mlp::apply(y, mlp_->weights());
}

DecoderLayers::DecoderLayers(const TextConfig& c) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    list.push_back(register_module(std::to_string(i), std::make_shared<DecoderLayer>(c, i)));
}

DecoderBody::DecoderBody(const TextConfig& c) {
  embed_tokens =
      register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, c.initializer_range));
  layers = register_module("layers", std::make_shared<DecoderLayers>(c));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, c.zero_centered_norm));
}

Decoder::Decoder(const TextConfig& c, bool tie_word_embeddings) : config_(c) {
  model = register_module("model", std::make_shared<DecoderBody>(c));
  if (!tie_word_embeddings)
    lm_head =
        register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size, false, c.initializer_range));
}

void Decoder::set_mlp_tile(int64_t setting) {
  MMSP_CHECK(setting == 0 || !config_.moe.any(), "--tiled-mlp is not supported for a mixture-of-experts decoder (",
             config_.moe.num_experts, " experts a sparse layer): its tokens are routed to their experts all at once");
  mlp_tile_ = setting;
}

at::Tensor Decoder::forward(const at::Tensor& inputs_embeds, const DecoderContext& ctx) const {
  return apply_head([](const at::Tensor& h, const at::Tensor& w) { return at::linear(h, w); },
                    final_hidden(inputs_embeds, ctx));
}

std::vector<HookUnit> Decoder::hook_units() const {
  std::vector<HookUnit> units;
  for (const auto& layer : model->layers->list) units.push_back(HookUnit{layer->parameters()});
  HookUnit head{{head_weight()}};
  head.vocab_rows = true;
  if (!lm_head) {
    head.forward_uses = 2;  // the lookup, then the loss
    head.lookup_rows = true;
  }
  units.push_back(head);  // head_unit()
  if (lm_head) {          // embedding_unit()
    HookUnit embedding{{model->embed_tokens->weight}};
    embedding.backward_hooks = false;  // its only gradient is the lookup's rows
    embedding.lookup_rows = true;
    embedding.prefetched = false;  // used first, not after the head
    embedding.vocab_rows = true;
    units.push_back(embedding);
  }
  return units;
}

at::Tensor Decoder::embed(const at::Tensor& token_ids) const {
  if (layer_hooks_) layer_hooks_->before_forward(embedding_unit());
  // A copy of rows: the weight is not kept. Under ZeRO-2/3 the gradient goes to the
  // hooks as rows (hooked_lookup), not into a dense [V, h] gradient.
  at::Tensor out = hooked_lookup(layer_hooks_, embedding_unit(), model->embed_tokens->weight, token_ids);
  if (layer_hooks_) layer_hooks_->after_forward(embedding_unit());
  return out;
}

at::Tensor Decoder::apply_head(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& head,
                               const at::Tensor& hidden, const RowsHead& by_rows) const {
  const at::Tensor& weight = head_weight();
  const std::shared_ptr<RowShardedWeight> rows = layer_hooks_ ? layer_hooks_->row_sharded(head_unit()) : nullptr;
  if (rows)
    MMSP_CHECK(by_rows != nullptr, "the LM head is row-sharded (--shard parameters) but its reader needs it whole");
  return run_hooked_layer(
      layer_hooks_, head_unit(), [&](const at::Tensor& h) { return rows ? by_rows(h, *rows) : head(h, weight); },
      hidden);
}

std::vector<std::vector<at::Tensor>> Decoder::layer_parameters() const {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& layer : model->layers->list) out.push_back(layer->parameters());
  return out;
}

at::Tensor Decoder::final_hidden(const at::Tensor& inputs_embeds, const DecoderContext& ctx) const {
  at::Tensor h = inputs_embeds;
  const auto& layers = model->layers->list;
  MMSP_CHECK(ctx.deepstack.size() <= layers.size(), ctx.deepstack.size(), " deepstack levels but only ", layers.size(),
             " decoder layers");
  // What a recomputed layer reads, captured by value (its backward runs after this
  // frame); the deepstack rows are added between layers, outside it.
  DecoderContext layer_ctx = ctx;
  layer_ctx.deepstack.clear();
  layer_ctx.mlp_tile = mlp_tile_tokens(mlp_tile_, h.size(0), config_.hidden_size);
  layer_ctx.linear_tile = mlp_tile_;
  for (size_t i = 0; i < layers.size(); ++i) {
    std::shared_ptr<DecoderLayer> layer = layers[i];
    if (recompute_layers_) {
      h = run_hooked_layer(
          layer_hooks_, i,
          [&](const at::Tensor& in) {
            return recompute_in_backward(
                [layer, layer_ctx](const at::Tensor& x) { return layer->forward(x, layer_ctx); }, in,
                layer->parameters(), offload_);
          },
          h);
    } else {
      h = run_hooked_layer(
          layer_hooks_, i, [&](const at::Tensor& in) { return layer->forward(in, layer_ctx); }, h);
    }
    if (i < ctx.deepstack.size()) h = h.index_add(0, ctx.visual_slots, ctx.deepstack[i].to(h.scalar_type()));
  }
  return model->norm->forward(h);
}

}  // namespace mmsp::model
