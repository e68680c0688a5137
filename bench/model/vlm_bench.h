// `mmsp bench vision` / `mmsp bench step`: peak tensor memory per rank (counting CPU
// allocator) and bytes communicated, of the vision part alone and of the whole
// training step (forward + backward), for the three vision modes on context groups
// of 1, 2 and 4 ranks, all in one run of `mmsp-run -n 4`; on a built-in Qwen2-VL shape or
// a Qwen-VL config.json (--model, e.g. configs/tiny-qwen3_5-vl.json for the hybrid decoder).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "mmsp/dist/rank_env.h"
#include "mmsp/model/config/config.h"

namespace mmsp::bench {

struct VlmBenchOptions {
  int images = 16;          // one image per sequence
  int64_t image_side = 16;  // built-in model: patches per side (image_side² patches, /4 rows)
  bool step = false;        // false: vision part only; true: the whole step
  // a config.json of any registered family (model::family_for); empty: the built-in
  // Qwen2-VL of the figures in docs/model.md (width 64 vision, 128 decoder)
  std::string model;
  // --model: each image's size in pixels, as the family's processor geometry reads a file
  // of that size (InternVL: its dynamic tiling); 0: the family's fixed side if it has one,
  // else image_side merged-patch units per side.
  int64_t image_width = 0, image_height = 0;
  int repeats = 1;  // runs of each row; its seconds are the fastest run's
};

// The built-in Qwen2-VL of the figures in docs/model.md: vision 64 wide (4 heads, 2
// blocks), decoder 128 wide (2 layers); `mmsp bench vision-split` uses it too.
model::ModelConfig bench_qwen2_vl_config();

// Every rank calls it; rank 0's result holds the table.
nlohmann::json bench_vlm(const dist::RankEnv& env, const VlmBenchOptions& options);

}  // namespace mmsp::bench
