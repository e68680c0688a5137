// The memory preflight and the pieces behind it: a meta skeleton counts the released
// architectures' parameters without allocating them; the estimate's state parts follow
// their formulas in every dtype mode; a run over the limit is refused naming each part;
// mixed-precision masters hand gradients over and back exactly.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "mmsp/train/optim/master_weights.h"
#include "mmsp/train/optim/sharded_adamw.h"
#include "mmsp/train/trainer.h"

namespace mmsp::train {
namespace {

using ::testing::HasSubstr;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Names, shapes and hooked units of the model `config_file` builds, from meta tensors.
ParameterLayout skeleton(const std::string& config_file, bool* all_meta = nullptr) {
  const model::ModelConfig config = model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/" + config_file);
  model::ParameterInitScope meta(model::ParameterInit::meta);
  const std::shared_ptr<model::Vlm> m = model::build_vlm(config);
  if (all_meta) {
    *all_meta = true;
    for (const auto& item : m->named_parameters()) *all_meta = *all_meta && item.value().device().is_meta();
  }
  return parameter_layout(*m);
}

int64_t count(const Shapes& shapes);
int64_t count(const ParameterLayout& layout) { return count(layout.shapes); }
int64_t count(const Shapes& shapes) {
  int64_t n = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

// The released models' parameter counts as their model cards give them (3 digits):
// a skeleton that matches them has the released architecture's shapes.
TEST(MemoryEstimate, MetaSkeletonsCountTheReleasedModelsWithoutAllocating) {
  bool meta = false;
  EXPECT_NEAR(count(skeleton("configs/hf/Qwen2-VL-7B-Instruct.json", &meta)) / 1e9, 8.29, 0.005);
  EXPECT_TRUE(meta);
  EXPECT_NEAR(count(skeleton("configs/hf/Qwen3-VL-8B-Instruct.json")) / 1e9, 8.77, 0.005);
  EXPECT_NEAR(count(skeleton("configs/hf/llava-1.5-7b-hf.json")) / 1e9, 7.06, 0.005);
  // The mode is a scope: outside it parameters are real again.
  EXPECT_EQ(model::current_parameter_init(), model::ParameterInit::random);
}

TEST(MemoryEstimate, StatePartsFollowTheirFormulas) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen2-vl.json");
  const ParameterLayout shapes = skeleton("configs/tiny-qwen2-vl.json");
  const int64_t P = count(shapes);
  int64_t largest = 0;  // the untied embedding (and head): 151,936 × 64
  for (const auto& [name, shape] : shapes.shapes) largest = std::max(largest, count({{name, shape}}));
  const int64_t B = parallel::kDefaultBucketBytes;
  MemoryEstimateInputs in;
  in.tokens_per_rank = 64;
  const MemoryEstimate fp32 = estimate_memory(config, shapes, in);
  EXPECT_EQ(fp32.parameter_count, P);
  EXPECT_EQ(fp32.parameters, 4 * P);
  EXPECT_EQ(fp32.master_weights, 0);
  EXPECT_EQ(fp32.gradients, 4 * P);
  EXPECT_EQ(fp32.optimizer, 8 * P);
  EXPECT_EQ(fp32.head_gradient, 4 * largest);
  // The loss's forward: one block of all T's logits, their shift and exp, the lse; its
  // backward: the logits, the softmax, the lse and the hidden state's gradient.
  EXPECT_EQ(fp32.logits, 64 * config.text.vocab_size * (4 + 8) + 4 * 64);
  EXPECT_EQ(fp32.logits_backward, 64 * config.text.vocab_size * (4 + 4) + 4 * 64 + 4 * 64 * config.text.hidden_size);
  // The update: the gradients, and torch's AdamW's two temporaries of the largest
  // parameter (more than a 25 MiB all-reduce bucket here).
  EXPECT_EQ(fp32.update_gradients, 4 * P);
  EXPECT_EQ(fp32.update_working_set, 8 * largest);
  ASSERT_GT(8 * largest, B);
  EXPECT_EQ(fp32.training_state(), 16 * P);
  in.compute_dtype = at::kBFloat16;
  const MemoryEstimate mixed = estimate_memory(config, shapes, in);
  EXPECT_EQ(mixed.parameters, 2 * P);
  EXPECT_EQ(mixed.master_weights, 4 * P);
  EXPECT_EQ(mixed.gradients, 2 * P);         // the model's bf16 grads; the masters' are released
  EXPECT_EQ(mixed.update_gradients, 4 * P);  // the masters' fp32 grads, handed over
  EXPECT_EQ(mixed.optimizer, 8 * P);
  EXPECT_EQ(mixed.training_state(), 18 * P);
  EXPECT_EQ(mixed.activations * 2, fp32.activations);  // bf16 activations: half
  in.tokens_per_rank = 128;
  EXPECT_EQ(estimate_memory(config, shapes, in).activations, 2 * mixed.activations);  // linear in T
  // --shard optimizer over 4 ranks: a quarter of the masters and moments; the model's
  // bf16 grads through the backward; the update holds the larger of those and the
  // reduced fp32 shards, rounds of 2·B bytes (packed, exchanged, summed) and the sliced
  // arithmetic's two temporaries.
  in.tokens_per_rank = 64;
  in.shard_level = parallel::ShardLevel::optimizer;
  in.shard_world = 4;
  const MemoryEstimate sharded = estimate_memory(config, shapes, in);
  const int64_t quarter = (P + 3) / 4;
  const int64_t rounds = 3 * std::min(4 * std::max(largest, B / 2), 2 * B),
                slices = 2 * std::min(quarter, ShardedAdamW::kUpdateSlice) * 4;
  EXPECT_EQ(sharded.master_weights, 4 * quarter);
  EXPECT_EQ(sharded.optimizer, 8 * quarter);
  EXPECT_EQ(sharded.gradients, 2 * P);
  EXPECT_EQ(sharded.update_gradients, std::max(2 * P, 4 * quarter));
  EXPECT_EQ(sharded.update_working_set, (largest + 3) / 4 * 4 + rounds + slices);  // + the largest bucket's shard
  EXPECT_EQ(sharded.activations, mixed.activations);
  // A head tied to the embedding: unhooked, the lookup's dense gradient and its sum
  // with the head's live beside the model's gradients until added (measured on
  // Qwen3.5-0.8B: 2 × 485 MiB); hooked (stages 2, 3) the lookup gives rows instead.
  {
    const std::string file = "configs/hf/Qwen3.5-0.8B.json";
    const model::ModelConfig tied = model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/" + file);
    const ParameterLayout tied_shapes = skeleton(file);
    int64_t embedding = 0;
    for (const auto& [name, shape] : tied_shapes.shapes)
      if (name.find("embed_tokens.weight") != std::string::npos) embedding = count({{name, shape}});
    ASSERT_EQ(embedding, 248320LL * 1024);
    MemoryEstimateInputs t = in;
    t.shard_level = parallel::ShardLevel::none;
    EXPECT_EQ(estimate_memory(tied, tied_shapes, t).gradients, 2 * count(tied_shapes) + 2 * 2 * embedding);
    t.shard_level = parallel::ShardLevel::optimizer;
    EXPECT_EQ(estimate_memory(tied, tied_shapes, t).gradients, 2 * count(tied_shapes) + 2 * 2 * embedding);
    EXPECT_EQ(estimate_memory(tied, tied_shapes, t).head_gradient, 2 * embedding);
  }
  // On one rank the shard is the whole.
  in.shard_world = 1;
  EXPECT_EQ(estimate_memory(config, shapes, in).update_gradients, 4 * P);
  in.shard_world = 4;
  // --shard gradients / parameters: whole for the step only what lies outside the
  // decoder layers, the vision blocks, the embedding and the head (patch embedding,
  // merger, norms); at the backward's end besides it one layer's or block's
  // gradients, the lookup's T rows of h (the embedding never has a dense gradient),
  // every shard and a unit's rounds; in the decoder's layers the shards reduced so far,
  // at the last layer or the first (add_backward); stage 3 one unit in use plus the
  // next one's gather and its flat copy under Gloo.
  int64_t in_layers = 0, layer0 = 0, in_blocks = 0, block0 = 0, embedding = 0, head = 0;
  for (const auto& [name, shape] : shapes.shapes) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    if (name == "model.language_model.embed_tokens.weight" || name == "model.embed_tokens.weight") embedding += k;
    if (name == "lm_head.weight") head += k;
    if (name.rfind("visual.blocks.", 0) == 0) {
      in_blocks += k;
      if (name.rfind("visual.blocks.0.", 0) == 0) block0 += k;
    }
    if (name.rfind("visual.", 0) == 0 || name.find(".layers.") == std::string::npos) continue;
    in_layers += k;
    if (name.find(".layers.0.") != std::string::npos) layer0 += k;
  }
  ASSERT_EQ(in_blocks, block0 * qwen_vision_of(config)->depth) << "the tiny tower's blocks are alike";
  ASSERT_GT(in_layers, 0);
  ASSERT_GT(embedding, 0);
  ASSERT_EQ(head, embedding) << "tiny-qwen2-vl's head is untied, of the embedding's shape";
  ASSERT_EQ(head, largest);
  ASSERT_EQ(in_layers, layer0 * config.text.num_hidden_layers) << "the tiny decoder's layers are alike";
  const int64_t kept = P - in_layers - in_blocks - embedding - head;
  const int64_t unit = std::max(layer0, block0);  // the largest layer or block
  const int64_t rows = 64 * config.text.hidden_size;
  in.shard_level = parallel::ShardLevel::gradients;
  const MemoryEstimate stage2 = estimate_memory(config, shapes, in);
  // Each unit's buckets hold its parameters alone (sharded_weights.cpp): the backward's
  // rounds are at most the largest unit's, the update's at most the kept weights'.
  int64_t largest_kept = 0;
  for (const auto& [name, shape] : shapes.shapes)
    if (name.rfind("visual.blocks.", 0) != 0 && name.find(".layers.") == std::string::npos &&
        name.find("embed_tokens") == std::string::npos && name != "lm_head.weight")
      largest_kept = std::max(largest_kept, count({{name, shape}}));
  auto rounds_of = [&](int64_t elements, int64_t largest_one) {
    return 3 * std::min(4 * std::min(elements, std::max(largest_one, B / 2)), 2 * B);
  };
  EXPECT_EQ(stage2.gradients,
            2 * (kept + block0 + rows) + 4 * quarter + rounds_of(block0, block0));  // the end: a block's
  {
    // The decoder's backward: each layer frees its activations (no recompute here) and
    // adds its shard; priced where the two sum highest. 64 tokens a rank keep more
    // than a layer's shard: at the last layer, every layer's activations and the head's
    // shard. One token keeps less: at the first, its activations and every later
    // layer's shard beside the head's.
    const int64_t L = config.text.num_hidden_layers, head_shard = (head + 3) / 4 * 4;
    const int64_t layers_shard = (in_layers + 3) / 4 * 4, one_layer = stage2.activations / L;
    ASSERT_EQ(stage2.activations % L, 0) << "the tiny decoder's layers are alike";
    ASSERT_LT(layers_shard / L, one_layer);
    EXPECT_EQ(stage2.recomputed_layer, 0);
    EXPECT_EQ(stage2.inputs_left, stage2.activations);
    // no lookup rows yet; the hidden state's gradient from the layer above
    EXPECT_EQ(stage2.backward_gradients, 2 * (kept + unit) + 2 * rows + head_shard);
    EXPECT_EQ(stage2.reduction_rounds, rounds_of(unit, unit));  // after the layer's backward, a moment of its own
    MemoryEstimateInputs one = in;
    one.tokens_per_rank = 1;
    const MemoryEstimate short_step = estimate_memory(config, shapes, one);
    ASSERT_GT(layers_shard / L, one_layer / 64);
    EXPECT_EQ(short_step.inputs_left, one_layer / 64);
    EXPECT_EQ(short_step.backward_gradients,
              2 * (kept + unit + config.text.hidden_size) + head_shard + layers_shard * (L - 1) / L);
    EXPECT_LT(short_step.inputs_left + short_step.backward_gradients, short_step.activations + short_step.gradients);
  }
  EXPECT_EQ(stage2.head_gradient, 2 * head);  // whole, from the loss's backward
  // ... then its hook reduces it, the logits gone: its shard and a round.
  EXPECT_EQ(stage2.head_reduction, (head + 3) / 4 * 4 + rounds_of(head, head));
  EXPECT_EQ(stage2.update_gradients, 4 * quarter + 2 * kept);
  // every rank's rows, and their cat; the kept weights' rounds
  // stage 2 gathers every bucket back into the whole weights after the update: a round of any
  EXPECT_EQ(stage2.update_working_set, 2 * 4 * rows * 2 + rounds + slices);
  EXPECT_EQ(stage2.parameters, 2 * P);
  EXPECT_EQ(stage2.gathered_forward + stage2.gathered_loss + stage2.gathered_backward, 0);
  EXPECT_EQ(stage2.optimizer, sharded.optimizer);
  in.shard_level = parallel::ShardLevel::parameters;
  const MemoryEstimate stage3 = estimate_memory(config, shapes, in);
  // The head by rounds of rows (row_sharded_table.h): 4 ranks give B rows each a round,
  // B rows each (row_sharded_block).
  const int64_t V = config.text.vocab_size, h = config.text.hidden_size;
  const int64_t block = row_sharded_block(64, 64, V, 4, h * 2, 14), round = 4 * block * h;
  // One chunk of all T would be every rank's rows at once; a round's rows and logits
  // stay within 128 MiB instead.
  ASSERT_EQ(block, std::min<int64_t>((V + 3) / 4, (int64_t{128} << 20) / (4 * (2 * h + 64 * 14))));
  EXPECT_LT(block, (V + 3) / 4);
  EXPECT_EQ(stage3.parameters, 2 * kept);
  EXPECT_EQ(stage3.gathered_forward, 2 * (unit + 2 * unit));    // a layer, the next in flight (never the head)
  EXPECT_EQ(stage3.gathered_loss, 2 * (3 * round + 2 * unit));  // rounds of rows, the last layer in flight
  EXPECT_EQ(stage3.gathered_backward, 2 * 3 * unit);            // a layer, the one before in flight
  EXPECT_EQ(stage3.gathered_vision, 2 * 3 * block0);            // the tower's: a block, the one before in flight
  EXPECT_EQ(stage2.gathered_vision, 0);
  EXPECT_EQ(stage3.head_gradient, round * (2 + 2 * 4) + (V + 3) / 4 * h * 4);  // a round's, the head's shard
  // With chunks of 8 tokens: rounds of an eighth of the vocabulary, a quarter from each rank.
  {
    MemoryEstimateInputs chunked = in;
    chunked.loss_chunk = 8;
    const int64_t b8 = row_sharded_block(8, 64, V, 4, h * 2, 14);
    EXPECT_EQ(b8, (V / 8 + 3) / 4);
    EXPECT_EQ(estimate_memory(config, shapes, chunked).gathered_loss, 2 * (3 * 4 * b8 * h + 2 * unit));
    // Qwen2-VL-7B's rows (3,584 in bf16: 7 KB) over 8 ranks at 32k tokens: a round's rows
    // and their logits (14 B each) within 128 MiB, fewer rows than a chunk of 441 tokens.
    EXPECT_EQ(row_sharded_block(441, 32768, 152064, 8, 3584 * 2, 14), (128 << 20) / (8 * (3584 * 2 + 32768 * 14)));
  }
  // One decoder layer larger than any vision block: its neighbour in flight is a block.
  {
    ParameterLayout one_layer;  // layer 1's unit left empty
    one_layer.uses = shapes.uses;
    for (size_t i = 0; i < shapes.shapes.size(); ++i)
      if (shapes.shapes[i].first.find(".layers.1.") == std::string::npos) {
        one_layer.shapes.push_back(shapes.shapes[i]);
        one_layer.unit_of.push_back(shapes.unit_of[i]);
      }
    ASSERT_GT(layer0, block0);
    const MemoryEstimate cut = estimate_memory(config, one_layer, in);
    EXPECT_EQ(cut.gathered_backward, 2 * (layer0 + 2 * block0));
    EXPECT_EQ(cut.gathered_forward, 2 * (layer0 + 2 * block0));
  }
  EXPECT_EQ(stage3.gradients, stage2.gradients);
  // stage 3 only releases the weights after the update: the kept weights' rounds alone
  EXPECT_EQ(stage3.update_working_set, 2 * 4 * rows * 2 + rounds_of(kept, largest_kept) + slices);
}

// Every family's vision tower is a chain of hook units after the decoder's (Qwen's
// blocks, CLIP's and InternViT's encoder layers), one per block holding exactly that
// block's parameters; LLaVA's CLIP layer above vision_feature_layer (−2) is a unit the
// step never reads. The estimate keeps whole, under --shard parameters, what the model
// leaves outside its units, and no more.
TEST(MemoryEstimate, EveryTowersBlocksAreUnitsOfTheModelAndTheEstimate) {
  const std::vector<std::pair<std::string, std::string>> towers = {
      {"configs/tiny-qwen2-vl.json", "visual.blocks."},
      {"configs/tiny-qwen3-vl.json", "model.visual.blocks."},
      {"configs/tiny-llava.json", "vision_tower.vision_model.encoder.layers."},
      {"configs/tiny-internvl.json", "vision_tower.encoder.layer."}};
  for (const auto& [file, chain] : towers) {
    SCOPED_TRACE(file);
    const model::ModelConfig config = model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/" + file);
    model::ParameterInitScope meta(model::ParameterInit::meta);
    const std::shared_ptr<model::Vlm> vlm = model::build_vlm(config);
    const std::vector<model::HookUnit> units = vlm->hook_units();
    const size_t first_block = vlm->decoder().hook_units().size();
    auto name_of = [&](const at::Tensor& t) {
      for (const auto& item : vlm->named_parameters())
        if (item.value().is_same(t)) return item.key();
      return std::string("?");
    };
    int64_t depth = 0, in_units = 0, largest = 0, P = 0, in_chain = 0, in_vision_units = 0;
    const ParameterLayout shapes = parameter_layout(*vlm);
    for (const auto& item : vlm->named_parameters()) {
      P += item.value().numel();
      if (item.key().rfind(chain, 0) != 0) continue;
      depth = std::max<int64_t>(depth, std::stoll(item.key().substr(chain.size())) + 1);
      in_chain += item.value().numel();
    }
    ASSERT_GT(depth, 0);
    ASSERT_EQ(units.size(), first_block + depth);
    for (size_t u = 0; u < units.size(); ++u) {
      int64_t n = 0;
      for (const at::Tensor& p : units[u].parameters) {
        n += p.numel();
        if (u >= first_block) {
          EXPECT_EQ(name_of(p).rfind(chain + std::to_string(u - first_block) + ".", 0), 0u)
              << name_of(p) << " is in vision unit " << u - first_block;
        }
      }
      in_units += n;
      if (u >= first_block) in_vision_units += n;
      largest = std::max(largest, n);
    }
    EXPECT_EQ(in_vision_units, in_chain) << "every parameter of the chain is in a unit";
    EXPECT_FALSE(units[first_block].prefetched) << "block 0 follows a unit that is not a block";
    const bool llava = (clip_vision_of(config) != nullptr);
    for (size_t u = first_block + 1; u < units.size(); ++u) {
      const bool runs = !llava || u + 1 < units.size();  // tiny-llava: 2 layers, the features are layer 1's
      EXPECT_EQ(units[u].forward_uses, runs ? 1 : 0) << "vision unit " << u - first_block;
      EXPECT_EQ(units[u].backward_hooks, runs);
      EXPECT_EQ(units[u].prefetched, runs);
    }
    MemoryEstimateInputs in;
    in.tokens_per_rank = 64;
    in.compute_dtype = at::kBFloat16;
    in.shard_level = parallel::ShardLevel::parameters;
    in.shard_world = 4;
    EXPECT_EQ(estimate_memory(config, shapes, in).parameters, 2 * (P - in_units));
  }
}

// A step whose padding gives a rank more slots than --tokens-per-rank (zigzag pads each
// sequence to whole ring chunks) is priced for its slots; fewer change nothing.
// LoRA (rank 4 on the decoder's seven maps): only the adapters have gradients, masters and
// moments; the frozen head makes no gradient. Under --shard parameters the layers' frozen
// weights are sharded too (a quarter each on 4 ranks), the rest of the frozen ones whole;
// a unit is gathered whole (its frozen weights and adapters), the head read whole (no rounds).
TEST(MemoryEstimate, FrozenWeightsHaveNoGradientsAndShardWithTheirLayers) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen2-vl.json");
  ParameterLayout layout;
  {
    model::ParameterInitScope meta(model::ParameterInit::meta);
    const std::shared_ptr<model::Vlm> m = model::build_vlm(config);
    model::LoraOptions lora;
    lora.rank = 4;
    model::add_lora(*m, lora);
    layout = parameter_layout(*m);
  }
  int64_t adapters = 0, frozen = 0, frozen_in_layers = 0, largest_layer = 0;
  std::map<int, int64_t> per_unit;  // every parameter of the layers and blocks (units read whole)
  for (size_t i = 0; i < layout.shapes.size(); ++i) {
    const bool trains = model::is_lora_parameter(layout.shapes[i].first);
    layout.frozen.push_back(!trains);
    const int64_t n = count({layout.shapes[i]});
    (trains ? adapters : frozen) += n;
    const int unit = layout.unit_of[i];
    if (unit < 0 || layout.uses[unit].by_rows) continue;
    if (!trains) frozen_in_layers += n;
    largest_layer = std::max(largest_layer, per_unit[unit] += n);
  }
  ASSERT_GT(adapters, 0);
  ASSERT_GT(frozen_in_layers, 0);
  MemoryEstimateInputs in;
  in.tokens_per_rank = 64;
  const MemoryEstimate replicated = estimate_memory(config, layout, in);
  EXPECT_EQ(replicated.gradients, 4 * adapters);
  EXPECT_EQ(replicated.optimizer, 8 * adapters);
  EXPECT_EQ(replicated.head_gradient, 0) << "the frozen head has no gradient";
  EXPECT_EQ(replicated.backward_gradients, 4 * adapters + 4 * 64 * config.text.hidden_size);
  in.shard_level = parallel::ShardLevel::parameters;
  in.shard_world = 4;
  const MemoryEstimate zero3 = estimate_memory(config, layout, in);
  EXPECT_EQ(zero3.parameters, 4 * (frozen - frozen_in_layers + (frozen_in_layers + 3) / 4))
      << "the layers' frozen weights a quarter each, the others whole (the adapters are all in layers)";
  EXPECT_EQ(zero3.head_gradient, 0);
  EXPECT_EQ(zero3.head_reduction, 0);
  EXPECT_EQ(zero3.gathered_loss, 2 * 4 * largest_layer) << "the head read whole: no rounds of its rows";
  EXPECT_LE(zero3.gathered_backward, 3 * 4 * largest_layer) << "a layer and the next one";
  EXPECT_GE(zero3.gathered_backward, 4 * largest_layer);
}

TEST(MemoryEstimate, PaddedSlotsArePricedAsTokens) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen3-vl.json");
  const ParameterLayout shapes = skeleton("configs/tiny-qwen3-vl.json");
  MemoryEstimateInputs in;
  in.tokens_per_rank = 300;
  const MemoryEstimate nominal = estimate_memory(config, shapes, in);
  in.local_length = 200;
  EXPECT_EQ(estimate_memory(config, shapes, in).total(), nominal.total());
  in.local_length = 360;
  const MemoryEstimate padded = estimate_memory(config, shapes, in);
  in.tokens_per_rank = 360, in.local_length = 0;
  const MemoryEstimate longer = estimate_memory(config, shapes, in);
  EXPECT_GT(padded.total(), nominal.total());
  const auto longer_parts = longer.parts();
  for (const auto& [name, bytes] : padded.parts()) {
    const auto it =
        std::find_if(longer_parts.begin(), longer_parts.end(), [&](const auto& p) { return p.first == name; });
    ASSERT_NE(it, longer_parts.end());
    EXPECT_EQ(bytes, it->second) << name;
  }
}

// Checkpointing keeps each layer's input and one layer's activations; a loss chunk of n
// tokens holds n tokens' logits instead of T's (docs/train.md, "Memory: activation checkpointing and the chunked
// loss").
TEST(MemoryEstimate, CheckpointingAndLossChunksFollowTheirFormulas) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen3-vl.json");
  const ParameterLayout shapes = skeleton("configs/tiny-qwen3-vl.json");
  const model::TextConfig& t = config.text;
  const int64_t T = 1000, L = t.num_hidden_layers, h = t.hidden_size, V = t.vocab_size;
  MemoryEstimateInputs in;
  in.tokens_per_rank = T;
  const MemoryEstimate plain = estimate_memory(config, shapes, in);
  ASSERT_EQ(plain.activations % (L * T * 4), 0);
  const int64_t a = plain.activations / (L * T * 4);  // elements kept per token and layer
  EXPECT_GT(a, 4 * h);
  for (auto mode : {model::ActivationCheckpointing::decoder, model::ActivationCheckpointing::all}) {
    in.checkpointing = mode;
    const MemoryEstimate e = estimate_memory(config, shapes, in);
    EXPECT_EQ(e.activations, L * T * h * 4 + T * a * 4) << model::to_string(mode);
    EXPECT_LT(e.activations, plain.activations);
    // Unsharded, the backward starts with every input and the whole gradients, and the
    // hidden state's gradient from the layer above.
    EXPECT_EQ(e.recomputed_layer, T * a * 4);
    EXPECT_EQ(e.inputs_left, L * T * h * 4);
    EXPECT_EQ(e.backward_gradients, e.gradients + T * h * 4);
    const std::vector<std::string> moved = {"activations", "inputs left", "recomputed layer"};
    for (size_t k = 0; k < e.parts().size(); ++k)  // nothing else moves
      if (std::find(moved.begin(), moved.end(), e.parts()[k].first) == moved.end()) {
        EXPECT_EQ(e.parts()[k], plain.parts()[k]);
      }
  }
  in.checkpointing = model::ActivationCheckpointing::none;
  in.loss_chunk = 7;
  EXPECT_EQ(estimate_memory(config, shapes, in).logits, 7 * V * 12 + 4 * T);  // fp32: no wide copy
  EXPECT_EQ(estimate_memory(config, shapes, in).logits_backward, 7 * V * 8 + 4 * T + 4 * T * h);
  in.loss_chunk = 5000;  // more than T: all T at once
  EXPECT_EQ(estimate_memory(config, shapes, in).logits, plain.logits);
  in.loss_chunk = 7;
  in.compute_dtype = at::kBFloat16;  // + the head weight's fp32 gradient sum
  EXPECT_EQ(estimate_memory(config, shapes, in).logits, 7 * V * (2 + 4 + 8) + 4 * T);  // + the fp32 copy
  EXPECT_EQ(estimate_memory(config, shapes, in).logits_backward, 7 * V * (2 + 4 + 4) + 4 * T + 4 * T * h);
}

// --tiled-mlp drops the MLP's 4I per token and layer from what the layers keep and
// bounds its working set by a tile (the tile's 7 intermediates, one weight's gradient,
// the input's gradient); --offload-activations, off the host, moves the recomputed
// layers' inputs to host memory and leaves 2 on the device (one back, one coming).
TEST(MemoryEstimate, TiledMlpAndOffloadFollowTheirFormulas) {
  const std::string file = "configs/hf/Qwen2-VL-7B-Instruct.json";
  const model::ModelConfig config = model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/" + file);
  const ParameterLayout shapes = skeleton(file);
  const model::TextConfig& t = config.text;
  const int64_t T = 32768, L = t.num_hidden_layers, h = t.hidden_size, I = t.intermediate_size, b = 2;
  MemoryEstimateInputs in;
  in.compute_dtype = at::kBFloat16;
  in.tokens_per_rank = T;
  in.shard_level = parallel::ShardLevel::parameters;
  in.shard_world = 8;
  in.loss_chunk = 1024;
  const MemoryEstimate plain = estimate_memory(config, shapes, in);
  EXPECT_EQ(plain.working_set, 3 * T * I * b);  // the MLP's, 3.7 GB: the largest transient
  in.mlp_tile = model::mlp_tile_tokens(model::kAutoMlpTile, T, h);
  EXPECT_EQ(in.mlp_tile, 3277);  // 10 tiles: ceil(32768 / 3584) = 10
  const MemoryEstimate tiled = estimate_memory(config, shapes, in);
  EXPECT_EQ(plain.activations - tiled.activations, L * T * 4 * I * b);
  EXPECT_EQ(tiled.working_set, (7 * in.mlp_tile * I + h * I + T * h) * b);
  in.checkpointing = model::ActivationCheckpointing::decoder;
  const MemoryEstimate recomputed = estimate_memory(config, shapes, in);
  in.offload_activations = true;
  const MemoryEstimate offloaded = estimate_memory(config, shapes, in);
  EXPECT_EQ(offloaded.offloaded, L * T * h * b);
  EXPECT_EQ(recomputed.activations - offloaded.activations, (L - 2) * T * h * b);
  EXPECT_THAT(offloaded.table(), HasSubstr("host"));
  // The backward: on the device the inputs are the most at its last layer (6.6 GB beside
  // the head's shard), so it is priced there; offloaded they are 2 at every layer, so
  // at its first, with every later layer's shard reduced.
  int64_t decoder_layers = 0;
  for (size_t i = 0; i < shapes.shapes.size(); ++i)
    if (shapes.unit_of[i] >= 0 && shapes.unit_of[i] < L) decoder_layers += count({shapes.shapes[i]});
  const int64_t layers_shard = (decoder_layers + 7) / 8 * 4;
  EXPECT_EQ(recomputed.inputs_left, L * T * h * b);
  EXPECT_EQ(offloaded.inputs_left, 2 * T * h * b);
  EXPECT_EQ(offloaded.backward_gradients - recomputed.backward_gradients, layers_shard * (L - 1) / L);
  auto backward = [](const MemoryEstimate& e) {
    const auto moments = e.moments();
    return e.bytes_of(
        std::find_if(moments.begin(), moments.end(), [](const auto& m) { return m.name == "backward"; })->parts);
  };
  EXPECT_EQ(backward(offloaded) + (L - 2) * T * h * b - layers_shard * (L - 1) / L, backward(recomputed));
  EXPECT_LT(offloaded.total(), recomputed.total());
  const std::vector<std::string> moved = {"activations", "inputs left", "backward gradients"};
  for (size_t k = 0; k < offloaded.parts().size(); ++k)  // nothing else moves
    if (std::find(moved.begin(), moved.end(), offloaded.parts()[k].first) == moved.end()) {
      EXPECT_EQ(offloaded.parts()[k], recomputed.parts()[k]);
    }
}

// A hybrid model's working set is its Gated DeltaNet layer's backward when that is the
// largest, and the recomputed layer is its Gated DeltaNet layer when that keeps more than
// its attention layer (gated_delta_layer_bytes: measured by test_linear_attention);
// under a ring the layer also keeps its q_eff maps. Per this rank's token-head pairs.
TEST(MemoryEstimate, GatedDeltaNetWorkingSetFollowsItsFormula) {
  const std::string file = "configs/hf/Qwen3.5-0.8B.json";
  const model::ModelConfig config = model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/" + file);
  const ParameterLayout shapes = skeleton(file);
  const model::TextConfig& t = config.text;
  ASSERT_TRUE(t.is_hybrid());
  MemoryEstimateInputs in;
  in.tokens_per_rank = 8192;
  in.compute_dtype = at::kBFloat16;
  in.checkpointing = model::ActivationCheckpointing::all;
  const int64_t T = in.tokens_per_rank, Hk = t.linear_num_key_heads, Hv = t.linear_num_value_heads;
  const int64_t K = t.linear_key_head_dim, V = t.linear_value_head_dim, b = 2, conv = (2 * Hk * K + Hv * V) * b;
  const GatedDeltaLayerBytes layer = gated_delta_layer_bytes(t, b, 1);
  EXPECT_EQ(layer.kept, 3 * conv + Hv * (2 * K + V) * b + Hv * V * (2 * 4 + 7 * b));
  EXPECT_EQ(layer.backward, Hv * (2 * K + V) * b + 3 * Hv * V * 4 + 2 * conv);
  const MemoryEstimate e = estimate_memory(config, shapes, in);
  EXPECT_EQ(e.working_set, T * layer.backward);
  EXPECT_GT(e.working_set, 3 * T * t.intermediate_size * 2);  // larger than the MLP's at this size
  const int64_t h = t.hidden_size, norms_and_mlp = (6 * h + 4 * t.intermediate_size) * b;
  EXPECT_EQ(e.activations, t.num_hidden_layers * T * h * b + T * (norms_and_mlp + layer.kept));
  in.ring = 4;
  EXPECT_EQ(estimate_memory(config, shapes, in).working_set, T * (layer.backward + 2 * Hv * K * 4));
  // Over sequence tiles (--tiled-mlp; no ring): what travels, o | z and a state per tile
  // border kept; the gradients of what travels and of the layer's input (o | z's replaces
  // o | z) and one tile's whole work in the working set.
  in.ring = 1;
  in.mlp_tile = 1024;
  const GatedDeltaLayerBytes tiled = gated_delta_layer_bytes(t, b, 1, in.mlp_tile);
  const int64_t mixed = (2 * Hk * K + Hv * V + 2 * Hv) * b;
  EXPECT_EQ(tiled.kept, mixed + 2 * Hv * V * b + Hv * K * V * 4 / in.mlp_tile);
  EXPECT_EQ(tiled.backward, mixed + t.hidden_size * b);
  const int64_t rule_work = 3 * conv + 2 * Hv * (2 * K + V) * b + 2 * conv, norm_work = Hv * V * (8 + 7 * b + 12);
  EXPECT_EQ(tiled.tile, in.mlp_tile * std::max(rule_work, norm_work));
  EXPECT_EQ(gated_delta_layer_bytes(t, b, 1, in.mlp_tile, 4).tile, in.mlp_tile * std::max(rule_work / 4, norm_work));
  const MemoryEstimate e_tiled = estimate_memory(config, shapes, in);
  EXPECT_EQ(e_tiled.working_set, T * tiled.backward + tiled.tile);
  EXPECT_LT(e_tiled.working_set, e.working_set);
  EXPECT_LT(e_tiled.total(), e.total());
  in.ring = 4;  // a ring's share runs whole
  EXPECT_EQ(gated_delta_layer_bytes(t, b, 4, in.mlp_tile).kept, layer.kept);
  EXPECT_EQ(estimate_memory(config, shapes, in).working_set, T * (layer.backward + 2 * Hv * K * 4));
  in.mlp_tile = 0;
  // A model without linear-attention layers keeps the MLP / attention-block term.
  const model::ModelConfig dense =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen3-vl.json");
  in.compute_dtype = at::kFloat;
  EXPECT_EQ(estimate_memory(dense, skeleton("configs/tiny-qwen3-vl.json"), in).working_set,
            std::max<int64_t>(3 * T * dense.text.intermediate_size * 4,
                              4 * dense.text.num_attention_heads * in.attention_block * in.attention_block * 4));
}

// The step needs what is held through it and its largest moment, not every part at once.
TEST(MemoryEstimate, OverTheLimitIsRefusedNamingEveryPartAndTheFlags) {
  MemoryEstimate e;
  e.parameters = 3LL << 30;
  e.optimizer = 6LL << 30;
  e.gradients = e.backward_gradients = 3LL << 30;
  e.logits = 512LL << 20;
  e.head_gradient = 1LL << 30;
  e.update_gradients = 2LL << 30;
  EXPECT_EQ(e.held(), 9LL << 30);
  EXPECT_EQ(e.total(), 12LL << 30);  // the backward's 3 GiB, more than the loss's 0.5 and 1 and the update's 2
  e.update_working_set = 2LL << 30;
  EXPECT_EQ(e.total(), 13LL << 30);  // now the update's 4 GiB
  EXPECT_EQ(e.training_state(), 11LL << 30);
  EXPECT_NO_THROW(check_memory_fits(e, 0, "--memory-limit"));  // 0: no check
  EXPECT_NO_THROW(check_memory_fits(e, e.total(), "--memory-limit"));
  try {
    check_memory_fits(e, 8LL << 30, "--memory-limit");
    FAIL() << "no error";
  } catch (const Error& error) {
    const std::string what = error.what();
    EXPECT_THAT(what, HasSubstr("needs about 13.00 GiB per rank (held through the step 9.00 GiB: parameters "
                                "3.00 GiB, optimizer 6.00 GiB, plus the largest of its moments; loss "
                                "512.00 MiB: logits 512.00 MiB; loss backward 1.00 GiB: head gradient 1.00 GiB; "
                                "backward 3.00 GiB: backward gradients 3.00 GiB; update 4.00 GiB: update gradients "
                                "2.00 GiB, update working "
                                "set 2.00 GiB) but --memory-limit allows 8.00 GiB"));
    EXPECT_THAT(what, HasSubstr("--tokens-per-rank"));
    EXPECT_THAT(what, HasSubstr("--dtype bfloat16"));
  }
  // A step's vision tower (vision_load.h) is held through the forward, the loss and the
  // backward, and its own backward (the decoder's activations freed) adds its transients.
  e.vision = 1LL << 30;
  EXPECT_EQ(e.total(), 13LL << 30);  // the backward's 3 + 1 GiB: the update's 4 still the largest
  e.vision_working_set = 2LL << 30;
  EXPECT_EQ(e.total(), 15LL << 30);  // the vision backward's 1 + 2 + 3 (gradients) GiB
  try {
    check_memory_fits(e, 8LL << 30, "--memory-limit", "step 3 (samples 1 2)");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("step 3 (samples 1 2): it needs about 15.00 GiB per rank"));
    EXPECT_THAT(error.what(), HasSubstr("vision backward 6.00 GiB: gradients 3.00 GiB, vision 1.00 GiB, "
                                        "vision working set 2.00 GiB"));
    EXPECT_THAT(error.what(), HasSubstr("--vision-split auto spreads a large image or video"));
  }
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.00 MiB");
}

// The longest sequence a device holds by the estimate: T fits, T + step does not; more
// memory or recompute never shortens it.
TEST(MemoryEstimate, LongestTokensPerRankIsTheLastThatFits) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/hf/Qwen2-VL-7B-Instruct.json");
  TrainOptions o;
  o.inputs.dtype = parse_compute_dtype("bfloat16");
  // 8.3 B parameters at 18 bytes each (bf16 weights, fp32 masters and moments) need ~150 GB
  // before any activation: one 80 GB device holds none, 200 GB some.
  const int64_t capacity = 200'000'000'000, step = 256;
  const ParameterLayout shapes = skeleton("configs/hf/Qwen2-VL-7B-Instruct.json");
  auto total = [&](const TrainOptions& t, int64_t tokens) {
    MemoryEstimateInputs in;
    in.compute_dtype = at::kBFloat16;
    in.master_dtype = at::kFloat;
    in.tokens_per_rank = tokens;
    in.attention_block = t.parallel.attention_block;
    in.loss_chunk = default_loss_chunk(config.text.vocab_size);
    in.checkpointing = t.memory.checkpoint_activations;
    return estimate_memory(config, shapes, in).total();
  };
  const int64_t plain = longest_tokens_per_rank(config, o, 1, capacity, step);
  ASSERT_GT(plain, 0);
  EXPECT_EQ(plain % step, 0);
  EXPECT_LE(total(o, plain), capacity);
  EXPECT_GT(total(o, plain + step), capacity);
  TrainOptions recompute = o;
  recompute.memory.checkpoint_activations = model::ActivationCheckpointing::decoder;
  EXPECT_GE(longest_tokens_per_rank(config, recompute, 1, capacity, step), plain);
  EXPECT_GE(longest_tokens_per_rank(config, o, 1, 2 * capacity, step), plain);
  EXPECT_EQ(longest_tokens_per_rank(config, o, 1, 80'000'000'000, step), 0);  // not even the training state
  TrainOptions sharded = o;  // the state split over 8 ranks: 80 GB each holds a long sequence
  sharded.parallel.shard = parallel::parse_shard_level("parameters");
  EXPECT_GT(longest_tokens_per_rank(config, sharded, 8, 80'000'000'000, step), 0);
  EXPECT_THROW(longest_tokens_per_rank(config, sharded, 8, 80'000'000'000, step, 3), Error);  // 3 ∤ 8
}

// A hybrid model holds longer sequences under Ulysses (ring 1), where its Gated DeltaNet
// token mixers run over sequence tiles with --tiled-mlp, than with all ranks one ring.
TEST(MemoryEstimate, LongestUnderUlyssesTilesTheHybridsTokenMixer) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/hf/Qwen3.5-0.8B.json");
  TrainOptions o;
  o.inputs.dtype = parse_compute_dtype("bfloat16");
  o.parallel.shard = parallel::parse_shard_level("parameters");
  o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
  o.memory.tiled_mlp = model::kAutoMlpTile;
  const int64_t six = int64_t{6} << 30;
  const int64_t ring = longest_tokens_per_rank(config, o, 4, six, 256, 0);
  const int64_t ulysses = longest_tokens_per_rank(config, o, 4, six, 256, 1);
  EXPECT_GT(ulysses, 2 * ring) << "ring " << ring << ", ulysses " << ulysses;
  o.memory.tiled_mlp = 0;
  EXPECT_LT(longest_tokens_per_rank(config, o, 4, six, 256, 1), ulysses / 2);
}

TEST(MasterWeights, Fp32MastersTakeGradsAndRoundBackToBf16) {
  at::Tensor w = at::randn({4, 3}).to(at::kBFloat16).requires_grad_();
  at::Tensor unused = at::ones({2}).to(at::kBFloat16).requires_grad_();
  MasterWeights masters({{"w", w}, {"unused", unused}}, at::kFloat);
  ASSERT_TRUE(masters.mixed());
  const at::Tensor& m = masters.params()[0].second;
  EXPECT_EQ(m.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(m, w.to(at::kFloat)));  // bf16 -> fp32 is exact
  (w.to(at::kFloat) * 3).sum().backward();
  masters.take_grads();
  EXPECT_FALSE(w.grad().defined());  // the bf16 grad is released
  EXPECT_TRUE(at::equal(m.grad(), at::full({4, 3}, 3.0)));
  EXPECT_FALSE(masters.params()[1].second.grad().defined());  // no grad stays no grad
  // An update far below bf16's resolution accumulates in the master...
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 100; ++i) m.add_(1e-5);
  }
  masters.copy_to_model();
  EXPECT_TRUE(at::equal(w, m.to(at::kBFloat16)));
  // ...and fp32/fp64 training has no copies at all.
  at::Tensor d = at::randn({2}, at::kDouble).requires_grad_();
  MasterWeights same({{"d", d}}, at::kDouble);
  EXPECT_FALSE(same.mixed());
  EXPECT_TRUE(same.params()[0].second.is_same(d));
}

}  // namespace
}  // namespace mmsp::train
