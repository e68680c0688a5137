// Memory preflight; see memory_estimate.h and docs/finetune.md for the formulas.
#include "mmsp/train/memory/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/model/named_params.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/optim/sharded_adamw.h"
#include "parameter_census.h"

namespace mmsp::train {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int u = 0;
  while (value >= 1024 && u < 4) value /= 1024, ++u;
  char text[32];
  if (u == 0)
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(text, sizeof text, "%.2f %s", value, units[u]);
  return text;
}

std::vector<std::pair<std::string, int64_t>> MemoryEstimate::parts() const {
  return {{"parameters", parameters},
          {"master weights", master_weights},
          {"optimizer", optimizer},
          {"gathered forward", gathered_forward},
          {"gathered loss", gathered_loss},
          {"gathered backward", gathered_backward},
          {"gathered vision", gathered_vision},
          {"activations", activations},
          {"working set", working_set},
          {"logits", logits},
          {"logits backward", logits_backward},
          {"head gradient", head_gradient},
          {"head reduction", head_reduction},
          {"gradients", gradients},
          {"inputs left", inputs_left},
          {"recomputed layer", recomputed_layer},
          {"backward gradients", backward_gradients},
          {"reduction rounds", reduction_rounds},
          {"update gradients", update_gradients},
          {"update working set", update_working_set},
          {"vision", vision},
          {"vision working set", vision_working_set},
          {"next step's pixels", next_pixels}};
}

std::vector<MemoryEstimate::Moment> MemoryEstimate::moments() const {
  const char* next = "next step's pixels";  // decoded during the step: held through all of it
  return {
      {"forward", {"gathered forward", "vision", "activations", "working set", next}},
      {"loss", {"gathered loss", "vision", "activations", "logits", next}},
      {"loss backward", {"gathered loss", "vision", "activations", "logits backward", "head gradient", next}},
      {"head reduction", {"vision", "activations", "head gradient", "head reduction", next}},
      {"backward",
       {"gathered backward", "vision", "inputs left", "recomputed layer", "working set", "backward gradients", next}},
      {"layer reduction",
       {"gathered backward", "vision", "inputs left", "backward gradients", "reduction rounds", next}},
      {"vision backward", {"gathered vision", "vision", "vision working set", "gradients", next}},
      {"update", {"update gradients", "update working set", next}}};
}

int64_t MemoryEstimate::bytes_of(const std::vector<std::string>& names) const {
  int64_t sum = 0;
  for (const auto& [name, bytes] : parts())
    if (std::find(names.begin(), names.end(), name) != names.end()) sum += bytes;
  return sum;
}

int64_t MemoryEstimate::held() const { return bytes_of({"parameters", "master weights", "optimizer"}); }

int64_t MemoryEstimate::total() const {
  int64_t most = 0;
  for (const Moment& moment : moments()) most = std::max(most, bytes_of(moment.parts));
  return held() + most;
}

int64_t MemoryEstimate::training_state() const { return held() + update_gradients; }

namespace {

// "name 1.50 GiB, name 2.00 MiB" for the parts in `names` that are not zero.
std::string list_parts(const MemoryEstimate& e, const std::vector<std::string>& names) {
  std::ostringstream out;
  for (const auto& [name, bytes] : e.parts())
    if (bytes > 0 && std::find(names.begin(), names.end(), name) != names.end())
      out << (out.tellp() > 0 ? ", " : "") << name << " " << format_bytes(bytes);
  return out.str();
}

const std::vector<std::string> kHeld = {"parameters", "master weights", "optimizer"};

// The moments that exist only with their own part (the vision tower's backward, the
// head's reduction under --shard gradients) are not said without it: the others hold
// the rest of their parts.
bool shown(const MemoryEstimate& e, const MemoryEstimate::Moment& moment) {
  // The backward's end holds every shard with or without a tower: said when it is the largest.
  if (moment.name == "vision backward") return e.vision > 0 || e.held() + e.bytes_of(moment.parts) == e.total();
  if (moment.name == "head reduction") return e.head_reduction > 0;
  if (moment.name == "layer reduction") return e.reduction_rounds > 0;
  return true;
}

}  // namespace

std::string MemoryEstimate::table() const {
  std::ostringstream out;
  out << "memory per rank (estimate, " << parameter_count << " parameters):";
  auto row = [&](const std::string& name, int64_t bytes) {
    out << "\n  " << name << std::string(16 - std::min<size_t>(name.size(), 15), ' ') << format_bytes(bytes);
  };
  row("held", held());
  out << "  (" << list_parts(*this, kHeld) << ")";
  for (const Moment& moment : moments()) {
    if (bytes_of(moment.parts) == 0 || !shown(*this, moment)) continue;
    row("+ " + moment.name, bytes_of(moment.parts));
    out << "  (" << list_parts(*this, moment.parts) << ")";
  }
  row("total", total());
  out << "  (held + the largest moment)";
  if (offloaded > 0) {
    row("host", offloaded);
    out << "  (the recomputed layers' inputs, offloaded: not on the device)";
  }
  return out.str();
}

namespace {

// The bytes each step's sizes set, in the model's dtype b and the master dtype m.
struct Widths {
  int64_t b = 0, m = 0;
  bool mixed = false;
  int64_t slots = 0;        // a rank's token slots: --tokens-per-rank, or a step's padded length when more
  int64_t lookup_rows = 0;  // slots × hidden: the embedding's looked-up rows
};

// Replicated training state (no --shard): masters (mixed only), moments, gradients, the update.
// `g`: the census of the trained parameters (all of them without --freeze or LoRA).
void add_replicated_state(MemoryEstimate& e, const ParameterCensus& g, const Widths& w) {
  const int64_t P = g.total, b = w.b, m = w.m, largest = g.largest;
  e.master_weights = w.mixed ? P * m : 0;
  e.optimizer = 2 * P * m;
  // The model's gradients through the backward (the masters' are released between
  // steps), and a tied embedding's lookup gradient. The update holds the masters' (or,
  // unmixed, the model's own), and at most: the largest parameter's bucket in the
  // all-reduce, its gradient in the model's dtype until handed over, or torch's
  // AdamW's two temporaries of it (the square root and the denominator).
  e.gradients = P * b + (g.tied ? 2 * g.head * b : 0);
  e.update_gradients = P * m;
  e.update_working_set = std::max(
      {std::min(P * m, parallel::kDefaultBucketBytes), largest * m, w.mixed ? largest * b : 0, 2 * largest * m});
}

// Reductions and gathers go in rounds of at most 2·B bytes (at most a bucket's: a round
// packed, the all-to-all's output and the summed shard, or a round gathered, its shard
// and Gloo's flat copy of it). A bucket holds the largest parameter or B's worth; stages
// 2 and 3 bucket each unit's parameters apart (sharded_weights.cpp), so a unit's rounds
// are at most its own bytes.
int64_t rounds_of(int64_t elements, int64_t largest_one, const Widths& w) {
  return 3 * std::min(std::min(elements, std::max(largest_one, parallel::kDefaultBucketBytes / w.b)) * w.m,
                      2 * parallel::kDefaultBucketBytes);
}

// Sharded training state (--shard optimizer | gradients | parameters). Returns, under
// --shard parameters, the logits of one round of the head's rows (else 0).
// `c` counts every parameter, `g` the trained ones.
int64_t add_sharded_state(MemoryEstimate& e, const model::ModelConfig& config, const ParameterCensus& c,
                          const ParameterCensus& g, const Widths& w, const MemoryEstimateInputs& in) {
  // A frozen parameter has no gradient, master or state; only the trained ones have
  // shards of those, reductions and gradients (`g`). Stage 3 shards the frozen weights of
  // the layers and blocks as well (below).
  const int64_t P = g.total, b = w.b, m = w.m, largest = g.largest, kept = g.kept();
  // The token lookup's gradient rows, and under stage 3 the rows asked of their owners,
  // come only with a trained (so sharded) embedding.
  const int64_t lookup_rows = (g.tied ? g.head : g.embedding) > 0 ? w.lookup_rows : 0;
  // sharded_adamw.h: a W-th of masters and moments (+ < W elements of padding per
  // 25 MiB bucket, ignored), and of the reduced gradients from their reduction to
  // the update, reduced in rounds (rounds_of).
  const int64_t W = std::max(in.shard_world, 1), shard = shard_elements(P, g.experts, in);
  const int64_t rounds = rounds_of(P, largest, w);
  const int64_t slices = 2 * std::min(shard, ShardedAdamW::kUpdateSlice) * m;  // the update's sqrt, denominator
  e.master_weights = shard * m;
  e.optimizer = 2 * shard * m;
  if (in.shard_level == parallel::ShardLevel::optimizer) {
    // Stage 1: the model's gradients whole through the backward (and a tied
    // embedding's lookup gradient); after it every bucket is reduced: the
    // model's gradients go as their shards come (N·max(b, m/W)), a bucket's shard
    // made before its gradients go (the largest parameter's: N_max/W).
    e.gradients = P * b + (g.tied ? 2 * g.head * b : 0);
    e.update_gradients = std::max(P * b, shard * m);
    const int64_t R = in.expert_shard_world > 0 ? in.expert_shard_world : W;  // the largest may be an expert's
    e.update_working_set = (largest + R - 1) / R * m + rounds + slices;
    return 0;
  }
  // Stages 2 and 3, at the backward's end (the vision tower's backward, last): the kept
  // gradients, one block's (each unit's are reduced at its after_backward: the head's
  // before the layers', the layers' before the blocks'), the token lookup's T rows of h
  // (no dense [V, h] gradient for the embedding), every shard and a block's rounds; the
  // decoder's layers hold fewer shards (add_backward). The update reduces the kept ones and adds every
  // rank's lookup rows (gathered, and a copy cat together). Under --shard gradients it then
  // gathers every bucket's updated shards back into the whole weights, in rounds of any
  // bucket (measured: 0.70 of the update's peak on the tiny Qwen2-VL, 4 ranks, while its
  // rounds were priced as the kept weights' alone); under --shard parameters the weights
  // are only released, and the rounds are the kept ones'.
  // The head's hook reduces its gradient after the loss's backward, its logits gone:
  // its shard and a round, beside the whole gradient (a moment of its own).
  e.gradients = (kept + g.largest_block + lookup_rows) * b + shard * m + rounds_of(g.largest_block, g.largest_block, w);
  e.head_reduction = g.head > 0 ? (g.head + W - 1) / W * m + rounds_of(g.head, g.head, w) : 0;
  e.update_gradients = shard * m + kept * b;
  const int64_t update_rounds =
      in.shard_level == parallel::ShardLevel::gradients ? rounds : rounds_of(kept, g.largest_kept, w);
  e.update_working_set = 2 * W * lookup_rows * b + update_rounds + slices;
  if (in.shard_level != parallel::ShardLevel::parameters) return 0;
  // Stage 3: whole for the step only the weights outside the units; besides them a
  // unit in use and the next one's gather in flight, which holds its buffer and,
  // under Gloo, a flat copy of it until it lands (2 units' bytes). In the forward
  // a layer or vision block and the next, or the embedding's looked-up rows (T·h,
  // and their copy on the way); in the loss a round of the head's rows (P·B of
  // them, row_sharded_table.h) and the next one in flight, and the last layer's
  // gather issued by the head's backward; in the backward a layer and the one
  // before. The head is never whole, nor is its gradient: a round's (in the
  // model's dtype, in the master dtype, and the P pieces its reduce-scatter
  // receives) and the head's own shard of it.
  // The layers' and blocks' frozen weights are sharded too (in the model's dtype) and
  // gathered with their unit: what is gathered is the whole unit, trained or not.
  const int64_t U = c.largest_layer, U2 = c.next_layer;
  const int64_t frozen_sharded = c.in_layers - g.in_layers, frozen_whole = c.frozen - frozen_sharded;
  const int64_t h_head = config.text.hidden_size, V = std::max<int64_t>(1, c.head / std::max<int64_t>(h_head, 1));
  const int64_t chunk = in.loss_chunk > 0 ? std::min(in.loss_chunk, in.tokens_per_rank) : in.tokens_per_rank;
  const int64_t B = row_sharded_block(std::max<int64_t>(chunk, 1), std::max<int64_t>(in.tokens_per_rank, 1), V,
                                      static_cast<int>(W), h_head * b, b + 12);
  const int64_t round = W * B * h_head, head_shard = (V + W - 1) / W * h_head;
  e.parameters = (kept + frozen_whole + (frozen_sharded + W - 1) / W) * b;
  e.gathered_vision = (c.largest_block + 2 * c.next_block) * b;  // the tower's backward: a block, the next in flight
  e.gathered_backward = (U + 2 * U2) * b;
  e.gathered_forward = std::max(U + 2 * U2, 2 * lookup_rows) * b;
  if (g.head == 0) {  // a frozen head (LoRA) stays whole, read as without --shard: no rounds
    e.gathered_loss = 2 * U * b;
    return 0;
  }
  e.gathered_loss = 3 * round * b + 2 * U * b;
  e.head_gradient = round * (b + 2 * m) + head_shard * m;
  e.head_reduction = 0;    // by rounds, inside the loss's backward (head gradient)
  return w.slots * W * B;  // the loss's logits are a round's; B as the trainer sizes it
}

// The largest transient of one layer, per kind: an attention layer's is the MLP's
// intermediate in the backward (3 tensors of T×I; tiled: the 4 a tile's forward keeps
// and its backward's 3, plus one weight's gradient of the tile before it is summed and
// the input's gradient, filled a tile at a time: tests/model/test_memory_layers.cpp
// measures them) or one attention block's fp32 scores, probabilities and their gradients
// (4 × H × block_q × block_k); a hybrid model's Gated DeltaNet layer's is the MLP's or
// its token mixer's backward (below).
struct LayerWork {
  int64_t attention = 0, linear = 0;
};
// A mixture-of-experts MLP per token, elements (Qwen3-VL-MoE, Qwen3.5-MoE; moe_block.cpp), with
// the picks spread evenly over the experts' ranks: kept, the router's logits (and their fp32
// probabilities, 4 bytes each: `router_bytes`), and for each of the k picks its row sent,
// received, the expert's gate|up (2I), activation and product (2I), its output, the output
// back and weighted (5h + 4I); the shared expert's 4 I_s. Its backward's transients: the
// picks' 3I and the rows exchanged back (2h) each.
struct MoeTokenElements {
  int64_t kept = 0, router_bytes = 0, backward = 0;
};
MoeTokenElements moe_token_elements(const model::TextConfig& t) {
  const model::MoeConfig& m = t.moe;
  const int64_t k = m.num_experts_per_tok, h = t.hidden_size, I = m.moe_intermediate_size;
  return {m.num_experts + k * (5 * h + 4 * I) + 4 * m.shared_expert_intermediate_size, 4 * m.num_experts,
          k * (3 * I + 2 * h)};
}

LayerWork layer_working_sets(const model::TextConfig& t, const Widths& w, const MemoryEstimateInputs& in) {
  const int64_t T = w.slots, h = t.hidden_size, I = t.intermediate_size, b = w.b;
  int64_t mlp = in.mlp_tile > 0 ? (7 * std::min(in.mlp_tile, T) * I + h * I + T * h) * b : 3 * T * I * b;
  if (t.moe.any()) mlp = std::max(mlp, T * moe_token_elements(t).backward * b);
  const int64_t block = std::min(in.attention_block, std::max<int64_t>(T, 1));
  const int64_t attention = 4 * t.num_attention_heads * block * block * 4;
  // A Gated DeltaNet layer's backward transients (hybrid configs; what it keeps is in
  // the activations).
  int64_t gated_delta = 0;
  if (t.is_hybrid()) {
    const GatedDeltaLayerBytes layer = gated_delta_layer_bytes(t, b, in.ring, std::min(in.mlp_tile, T), in.ulysses);
    gated_delta = T * layer.backward + layer.tile;
  }
  return {std::max(mlp, attention), t.is_hybrid() ? std::max(mlp, gated_delta) : 0};
}

// The decoder's activations: what each layer keeps for its backward, per checkpointing
// mode. Returns what the backward's first layer keeps (its input, or without
// checkpointing its activations): the inputs left at the backward's end.
int64_t add_activations(MemoryEstimate& e, const model::TextConfig& t, const Widths& w, const MemoryEstimateInputs& in,
                        const LayerWork& work) {
  // Kept per token and decoder layer (elements): the residual input, the two norms'
  // inputs and fp32 normalised copies (6h), q/k/v before and after rotary, the
  // attention output and its input to o_proj ((5H + 4H_kv)·d), and the MLP's gate,
  // up, activation and product (4I). A tiled MLP (--tiled-mlp) keeps none of the 4I:
  // it keeps its input alone (the second norm's output, among the 6h) and makes the
  // rest again in its backward, a tile at a time. A hybrid model's Gated DeltaNet
  // layers keep their token mixer's bytes (gated_delta_layer_bytes) instead of the
  // attention's.
  // A mixture-of-experts decoder's sparse layers keep their routed rows instead of the 4I
  // (moe_token_elements); the layers are priced as the larger MLP, all but the exact sum below.
  const int64_t T = w.slots, h = t.hidden_size, d = t.head_dim, b = w.b;
  const int64_t dense_mlp = (in.mlp_tile > 0 ? 0 : 4 * t.intermediate_size) * b;
  const int64_t sparse_mlp = t.moe.any() ? moe_token_elements(t).kept * b + moe_token_elements(t).router_bytes : 0;
  const int64_t sparse_layers = model::sparse_layer_count(t), dense_layers = t.num_hidden_layers - sparse_layers;
  const int64_t norms_and_mlp =
      6 * h * b + (sparse_layers > 0 ? std::max(sparse_mlp, dense_layers ? dense_mlp : 0) : dense_mlp);
  const int64_t attention_layer = T * (norms_and_mlp + (5 * t.num_attention_heads + 4 * t.num_key_value_heads) * d * b);
  int64_t linear_layers = 0, linear_layer = 0;
  if (t.is_hybrid()) {
    linear_layers = std::count(t.layer_types.begin(), t.layer_types.end(), model::LayerKind::linear_attention);
    linear_layer = T * (norms_and_mlp + gated_delta_layer_bytes(t, b, in.ring, in.mlp_tile, in.ulysses).kept);
  }
  // Each layer's own MLP in the sum (the larger one priced above where layers differ).
  const int64_t mlp_correction = T * (sparse_layers * (sparse_mlp - (norms_and_mlp - 6 * h * b)) +
                                      (sparse_layers ? dense_layers * (dense_mlp - (norms_and_mlp - 6 * h * b)) : 0));
  // The layer being recomputed and its transients are one layer's: the kind whose kept
  // bytes and working set sum highest (in Qwen3.5 the attention layer keeps more, the
  // Gated DeltaNet layer's backward adds more). Without recompute, any layer's working
  // set beside every layer's activations.
  const bool linear_heavier = t.is_hybrid() && linear_layer + work.linear > attention_layer + work.attention;
  const int64_t one_layer = linear_heavier ? linear_layer : attention_layer;
  e.working_set = in.checkpointing == model::ActivationCheckpointing::none ? std::max(work.attention, work.linear)
                  : linear_heavier                                         ? work.linear
                                                                           : work.attention;
  const int64_t layer_inputs = t.num_hidden_layers * T * h * b;
  if (in.checkpointing == model::ActivationCheckpointing::none) {
    e.activations =
        (t.num_hidden_layers - linear_layers) * attention_layer + linear_layers * linear_layer + mlp_correction;
    return one_layer;
  }
  e.recomputed_layer = one_layer;
  if (in.offload_activations) {
    // The inputs in host memory; on the device one recomputed layer, the input it was
    // brought back for, and the next one on its way back.
    e.activations = 2 * T * h * b + one_layer;
    e.offloaded = layer_inputs;
    return 2 * T * h * b;
  }
  e.activations = layer_inputs + one_layer;  // layer inputs + one recomputed layer
  return T * h * b;
}

// The decoder's backward (MemoryEstimate::inputs_left …). Under --shard gradients and
// parameters each layer's gradients are reduced to a shard at its after_backward hook
// (zero_hooks.cpp), so the shards grow as the inputs go: at the last layer all inputs
// and the head's shard, at the first one input and every later layer's shard. Measured
// (Qwen3.5-0.8B cut to 4 layers, 4 ranks, fp32, 1,024 tokens a rank, the hooks probed):
// the peak came in the second layer's backward, and each earlier layer's backward
// peaked 16 MiB higher, its shard (20.5) less its input (4). The token lookup's rows
// come after the first layer, so none are in it.
// `g`: the census of the trained parameters (what has gradients and shards).
void add_backward(MemoryEstimate& e, const model::TextConfig& t, const ParameterCensus& g, const Widths& w,
                  const MemoryEstimateInputs& in, int64_t first_layer_keeps) {
  const bool hooked =
      in.shard_level == parallel::ShardLevel::gradients || in.shard_level == parallel::ShardLevel::parameters;
  e.inputs_left = e.activations - e.recomputed_layer;  // at the last layer: every input
  // The hidden state's gradient from the layer above: the layer's input gradient is
  // summed into it (its own, in the working set, is the layer's branch).
  const int64_t hidden_gradient = w.slots * t.hidden_size * w.b;
  if (!hooked) {  // the gradients whole through the backward, reduced after it
    e.backward_gradients = e.gradients + hidden_gradient;
    return;
  }
  const int64_t W = std::max(in.shard_world, 1), L = std::max<int64_t>(t.num_hidden_layers, 1);
  const int64_t head_shard = (g.head + W - 1) / W * w.m;
  const int64_t layers_shard = shard_elements(g.in_decoder_layers, g.experts, in) * w.m;
  const int64_t at_last = e.inputs_left + head_shard;
  const int64_t at_first = first_layer_keeps + head_shard + layers_shard * (L - 1) / L;
  const bool first = at_first > at_last;
  if (first) e.inputs_left = first_layer_keeps;
  // (the lookup's rows come after the first layer's backward: not yet)
  e.backward_gradients =
      (g.kept() + g.largest_layer) * w.b + hidden_gradient + (first ? at_first : at_last) - e.inputs_left;
  e.reduction_rounds = rounds_of(g.largest_layer, g.largest_layer, w);
}

// The loss's forward: one block's logits in the compute dtype, their copy in the wide
// dtype (none when the compute dtype is fp32 or fp64 already: chunked_loss.cpp's .to()
// is then the same tensor), their shifted values and exp; the per-token running
// log-sum-exp. Its backward: a block's logits again, their wide copy, the softmax (the
// shift's output, exponentiated in place; cast back under 16-bit, after the logits
// are freed), the log-sum-exp and the hidden state's gradient summed over the blocks in
// the wide dtype, beside the head's gradient.
void add_loss(MemoryEstimate& e, const model::TextConfig& t, const Widths& w, const MemoryEstimateInputs& in,
              int64_t row_round_logits) {
  const int64_t T = w.slots, b = w.b;
  const int64_t n = in.loss_chunk > 0 ? std::min(in.loss_chunk, T) : T;
  const int64_t block_logits = row_round_logits > 0 ? row_round_logits : n * t.vocab_size;
  const int64_t wide = std::max<int64_t>(b, 4), copy = b < 4 ? 4 : 0;
  e.logits = block_logits * (b + copy + 2 * wide) + wide * T;
  e.logits_backward = block_logits * (b + copy + wide) + wide * T + wide * T * t.hidden_size;
}

}  // namespace

GatedDeltaLayerBytes gated_delta_layer_bytes(const model::TextConfig& t, int64_t b, int ring, int64_t tile,
                                             int ulysses) {
  const int64_t wide = std::max<int64_t>(b, 4), Hk = t.linear_num_key_heads, Hv = t.linear_num_value_heads;
  const int64_t K = t.linear_key_head_dim, V = t.linear_value_head_dim;
  const int64_t conv = (2 * Hk * K + Hv * V) * b;
  // The conv and rule's part, and the gated norm's.
  const int64_t rule_gradients = Hv * (2 * K + V) * b;
  const int64_t rule_kept = 3 * conv + Hv * (2 * K + V) * b, norm_kept = Hv * V * (2 * wide + 7 * b);
  const int64_t rule_backward = b < 4 ? rule_gradients + 2 * conv : rule_gradients;
  const int64_t norm_backward = b < 4 ? 3 * Hv * V * wide : Hv * V * b;
  GatedDeltaLayerBytes bytes;
  bytes.kept = rule_kept + norm_kept;
  bytes.backward = rule_backward + norm_backward + (ring > 1 ? 2 * Hv * K * wide : 0);
  if (tile > 0 && ring <= 1) {  // sequence tiles (gated_delta_tiles.h)
    const int64_t mixed = (2 * Hk * K + Hv * V + 2 * Hv) * b, oz = 2 * Hv * V * b;
    // One tile's work at a time: the rule's over rows of the share, each of H/U heads
    // under Ulysses, or the gated norm's over this rank's tokens.
    bytes.tile =
        std::max(tile * (rule_kept + rule_backward) / std::max(ulysses, 1), tile * (norm_kept + norm_backward));
    bytes.kept = mixed + oz + (Hv * K * V * wide + tile - 1) / tile;
    bytes.backward = mixed + t.hidden_size * b;  // o | z's gradient replaces o | z (freed)
  }
  return bytes;
}

ParameterLayout parameter_layout(const model::Vlm& skeleton) {
  ParameterLayout layout;
  const model::NamedParams params = model::named_parameters(skeleton);
  for (const auto& [name, p] : params) layout.shapes.emplace_back(name, p.sizes().vec());
  const std::vector<model::HookUnit> units = skeleton.hook_units();
  layout.unit_of = parallel::unit_index_of(params, units);
  layout.uses = parallel::shard_unit_uses(units);
  return layout;
}

MemoryEstimate estimate_memory(const model::ModelConfig& config, const ParameterLayout& layout,
                               const MemoryEstimateInputs& in) {
  const ParameterCensus census = census_of(layout, config.text.num_hidden_layers);
  const ParameterCensus trained = census_of(layout, config.text.num_hidden_layers, true);
  Widths w;
  w.b = static_cast<int64_t>(c10::elementSize(in.compute_dtype));
  w.m = static_cast<int64_t>(c10::elementSize(in.master_dtype));
  w.mixed = in.compute_dtype != in.master_dtype;
  // The slots a rank holds: --tokens-per-rank, or a step's padded local length when more
  // (zigzag pads each sequence to whole chunks of the ring).
  w.slots = std::max(in.tokens_per_rank, in.local_length);
  w.lookup_rows = w.slots * config.text.hidden_size;
  MemoryEstimate e;
  e.parameter_count = census.total;
  e.parameters = census.total * w.b;
  // The loss's backward makes the head's whole gradient, at every level (under
  // --shard parameters a round's, below). Unhooked (no --shard, or optimizer), a tied
  // embedding's lookup makes a dense gradient of the head's size, then its sum with the
  // head's: measured, both live beside the model's gradients at the end of the backward.
  // A frozen head (LoRA) has no gradient.
  e.head_gradient = trained.head * w.b;
  int64_t row_round_logits = 0;
  if (in.shard_level == parallel::ShardLevel::none)
    add_replicated_state(e, trained, w);
  else
    row_round_logits = add_sharded_state(e, config, census, trained, w, in);
  const int64_t first_layer_keeps = add_activations(e, config.text, w, in, layer_working_sets(config.text, w, in));
  add_backward(e, config.text, trained, w, in, first_layer_keeps);
  add_loss(e, config.text, w, in, row_round_logits);
  return e;
}

void check_memory_fits(const MemoryEstimate& e, int64_t limit, const std::string& source, const std::string& what) {
  if (limit <= 0 || e.total() <= limit) return;
  std::ostringstream moments;
  for (const MemoryEstimate::Moment& moment : e.moments())
    if (e.bytes_of(moment.parts) > 0 && shown(e, moment))
      moments << "; " << moment.name << " " << format_bytes(e.bytes_of(moment.parts)) << ": "
              << list_parts(e, moment.parts);
  const std::string vision_hint =
      e.vision > 0 ? "; the vision part scales with the patches one rank encodes (--vision-split auto spreads a "
                     "large image or video over the context group; --checkpoint-activations all keeps one "
                     "input per vision block; smaller images or fewer frames)"
                   : "";
  MMSP_FAIL(what, what.empty() ? "this run" : ": it", " needs about ", format_bytes(e.total()),
            " per rank (held through the step ", format_bytes(e.held()), ": ", list_parts(e, kHeld),
            ", plus the largest of its moments", moments.str(), ") but ", source, " allows ", format_bytes(limit),
            ". To shrink it: parameters, gradients and optimizer state scale with the model "
            "(--dtype bfloat16 halves the parameters; --shard optimizer splits the masters and "
            "optimizer state over the ranks, gradients the gradients too, parameters the weights too; a smaller "
            "config); activations, working "
            "set and logits scale with --tokens-per-rank (--checkpoint-activations decoder keeps one "
            "hidden vector per token and layer; --loss-chunk bounds the logits; "
            "more ranks in --ring/--ulysses "
            "carry a long sequence in smaller pieces)",
            vision_hint,
            ". --memory-limit BYTES sets the limit "
            "(0: no check).");
}

}  // namespace mmsp::train
