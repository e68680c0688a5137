// Memory preflight; see memory_estimate.h and docs/finetune.md for the formulas.
#include "mmsp/train/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/train/grad_sync.h"

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
  return {{"parameters", parameters},   {"master weights", master_weights}, {"gradients", gradients},
          {"optimizer", optimizer},     {"activations", activations},       {"working set", working_set},
          {"logits", logits}};
}

std::string MemoryEstimate::table() const {
  std::ostringstream out;
  out << "memory per rank (estimate, " << parameter_count << " parameters):";
  for (const auto& [name, bytes] : parts())
    if (bytes > 0) out << "\n  " << name << std::string(16 - std::min<size_t>(name.size(), 15), ' ') << format_bytes(bytes);
  out << "\n  total           " << format_bytes(total());
  return out.str();
}

namespace {

// The index i of "<key>i." in a name ("…layers.3.mlp…" → 3 for "layers."), or −1.
// The key must start the name or follow a dot.
int index_after(const std::string& name, const std::string& key) {
  const size_t found = name.find(key);
  if (found == std::string::npos || (found > 0 && name[found - 1] != '.')) return -1;
  const size_t digits = found + key.size(), end = name.find('.', digits);
  if (end == std::string::npos || end == digits) return -1;
  for (size_t i = digits; i < end; ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoi(name.substr(digits, end - digits));
}

// The decoder layer a parameter name belongs to ("…layers.<i>.…" outside the vision
// tower), or −1.
int decoder_layer_of(const std::string& name) {
  if (name.find("visual") != std::string::npos || name.find("vision") != std::string::npos) return -1;
  return index_after(name, "layers.");
}

// The vision block a parameter name belongs to, or −1: every tower's blocks are hook
// units (model::HookedBlocks): Qwen's "…visual.blocks.<i>.…", CLIP's
// "vision_tower.vision_model.encoder.layers.<i>.…", InternViT's "vision_tower.encoder.layer.<i>.…".
int vision_block_of(const std::string& name) {
  for (const char* chain : {"visual.blocks.", "vision_model.encoder.layers.", "vision_tower.encoder.layer."})
    if (const int block = index_after(name, chain); block >= 0) return block;
  return -1;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

MemoryEstimate estimate_memory(const model::ModelConfig& config,
                               const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                               const MemoryEstimateInputs& in) {
  const int64_t b = static_cast<int64_t>(c10::elementSize(in.compute_dtype));
  const int64_t m = static_cast<int64_t>(c10::elementSize(in.master_dtype));
  const bool mixed = in.compute_dtype != in.master_dtype;
  MemoryEstimate e;
  std::vector<int64_t> layer_count, block_count;  // per decoder layer, per hooked vision block
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    e.parameter_count += n;
    const int layer = decoder_layer_of(name), block = vision_block_of(name);
    std::vector<int64_t>& count = layer >= 0 ? layer_count : block_count;
    const int unit = layer >= 0 ? layer : block;
    if (unit >= 0) {
      if (count.size() <= static_cast<size_t>(unit)) count.resize(unit + 1, 0);
      count[unit] += n;
    }
  }
  const int64_t P = e.parameter_count;
  // Units: the decoder layers and the hooked vision blocks (N_l: the largest of them).
  int64_t in_layers = 0, largest_layer = 0;
  for (const std::vector<int64_t>* counts : {&layer_count, &block_count})
    for (int64_t n : *counts) in_layers += n, largest_layer = std::max(largest_layer, n);
  // The LM head (lm_head, or the embedding it is tied to) and an untied embedding: the
  // units ZeRO-3 gathers around their uses besides the layers (Decoder::hook_units).
  int64_t head = 0, embedding = 0;
  for (const auto& [name, shape] : shapes) {
    const bool is_embedding = ends_with(name, "embed_tokens.weight"), is_head = ends_with(name, "lm_head.weight");
    if (!is_embedding && !is_head) continue;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    (is_head ? head : embedding) += n;
  }
  if (head == 0) std::swap(head, embedding);  // tied: the embedding is the head's unit
  // Kept whole for the step under ZeRO-2/3: everything outside those units.
  const int64_t kept = P - in_layers - head - embedding;
  e.parameters = P * b;
  if (in.shard_level != ShardLevel::none && in.shard_world > 1) {
    // sharded_adamw.h: a W-th of masters and moments (+ < W elements of padding per
    // 25 MiB bucket, ignored); the model's gradients until packed, plus one bucket
    // packed in the master dtype and its reduce-scatter buffer.
    const int64_t W = in.shard_world, shard = (P + W - 1) / W;
    e.master_weights = shard * m;
    const int64_t bucket = 2 * std::min(P, kDefaultBucketBytes / b) * m;
    // Stages 2 and 3: the kept gradients, and one unit's at a time (the head's in the
    // loss's backward, then one layer's), each reduced at the unit's after_backward;
    // the token lookup's gradient as T rows of h (no dense one for the embedding).
    const int64_t lookup_rows = in.tokens_per_rank * config.text.hidden_size;
    e.gradients = (in.shard_level == ShardLevel::optimizer ? P : kept + std::max(largest_layer, head) + lookup_rows) * b +
                  bucket;
    // Stage 3: one unit in use and the next one's gather in flight, or one unit and the
    // buffer it is gathered into.
    if (in.shard_level == ShardLevel::parameters)
      e.parameters = (kept + 2 * std::max({largest_layer, head, embedding})) * b;
    e.optimizer = 2 * shard * m;
  } else {
    e.master_weights = mixed ? P * m : 0;
    // Masters' gradients, plus (mixed) the model's own until take_grads converts them.
    e.gradients = P * m + (mixed ? P * b : 0);
    e.optimizer = 2 * P * m;
  }

  // Kept per token and decoder layer (elements): the residual input, the two norms'
  // inputs and fp32 normalised copies (6h), q/k/v before and after rotary, the
  // attention output and its input to o_proj ((5H + 4H_kv)·d), and the MLP's gate,
  // up, activation and product (4I).
  const model::TextConfig& t = config.text;
  const int64_t T = in.tokens_per_rank, h = t.hidden_size, d = t.head_dim;
  const int64_t per_token_layer =
      6 * h + (5 * t.num_attention_heads + 4 * t.num_key_value_heads) * d + 4 * t.intermediate_size;
  const int64_t one_layer = T * per_token_layer * b;
  e.activations = in.checkpointing == model::ActivationCheckpointing::none
                      ? t.num_hidden_layers * one_layer
                      : t.num_hidden_layers * T * h * b + one_layer;  // layer inputs + one recomputed layer
  // The largest transient of one layer: the MLP's intermediate in the backward
  // (3 tensors of T×I), one attention block's fp32 scores, probabilities and their
  // gradients (4 × H × block_q × block_k), or a Gated DeltaNet layer's (below).
  const int64_t mlp = 3 * T * t.intermediate_size * b;
  const int64_t block = std::min(in.attention_block, std::max<int64_t>(T, 1));
  const int64_t attention = 4 * t.num_attention_heads * block * block * 4;
  // A Gated DeltaNet layer's recompute and backward (hybrid configs): its rule keeps the
  // chunked q, k (repeated to the value heads) and v in its compute dtype (fp32 under
  // 16-bit) and makes their gradients in chunk slots and in token order, and its conv
  // keeps its input, pre-activation and output. T·H_v is this rank's token-head pairs
  // under any split of the context group (Ulysses trades tokens for heads).
  int64_t gated_delta = 0;
  if (t.is_hybrid()) {
    const int64_t w = std::max<int64_t>(b, 4), Hk = t.linear_num_key_heads, Hv = t.linear_num_value_heads;
    const int64_t K = t.linear_key_head_dim, V = t.linear_value_head_dim;
    gated_delta = 3 * T * Hv * (2 * K + V) * w + 3 * T * (2 * Hk * K + Hv * V) * b;
  }
  e.working_set = std::max({mlp, attention, gated_delta});
  // One chunk's logits in the compute dtype, their fp32 copy, exp and gradient; the
  // per-token log-sum-exp; the hidden state's gradient summed over vocabulary blocks in
  // the wide dtype (fp32 under bf16).
  const int64_t n = in.loss_chunk > 0 ? std::min(in.loss_chunk, T) : T;
  e.logits = n * t.vocab_size * (b + 4 + 4 + 4) + 4 * T + std::max<int64_t>(b, 4) * T * h;
  return e;
}

void check_memory_fits(const MemoryEstimate& e, int64_t limit, const std::string& source) {
  if (limit <= 0 || e.total() <= limit) return;
  std::ostringstream parts;
  for (const auto& [name, bytes] : e.parts())
    if (bytes > 0) parts << (parts.tellp() > 0 ? ", " : "") << name << " " << format_bytes(bytes);
  MMSP_CHECK(false, "this run needs about ", format_bytes(e.total()), " per rank (", parts.str(),
             ") but ", source, " allows ", format_bytes(limit),
             ". To shrink it: parameters, gradients and optimizer state scale with the model "
             "(--dtype bfloat16 halves the parameters; --shard optimizer splits the masters and "
             "optimizer state over the ranks, gradients the gradients too, parameters the decoder weights too; a smaller config); activations, working "
             "set and logits scale with --tokens-per-rank (--checkpoint-activations decoder keeps one "
             "hidden vector per token and layer; --loss-chunk bounds the logits; "
             "more ranks in --ring/--ulysses "
             "carry a long sequence in smaller pieces). --memory-limit BYTES sets the limit "
             "(0: no check).");
}

}  // namespace mmsp::train
