// One training sequence as a Hugging Face processor writes it, and its vision blocks
// found from the placeholder tokens and checked against the grids. Everything later in
// the plan reads the blocks; nothing searches token ids again.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "mmsp/plan/model_conventions.h"

namespace mmsp::plan {

// [t, h, w] in patches, as image_grid_thw / video_grid_thw.
using Grid = std::array<int64_t, 3>;

struct Sequence {
  std::vector<int64_t> input_ids;
  std::vector<Grid> image_grid_thw;        // one per image, in order of appearance
  std::vector<Grid> video_grid_thw;        // one per video, in order of appearance
  std::vector<double> second_per_grid_ts;  // Qwen2.5-VL: one per video (empty: 1.0 each)
  std::vector<int64_t> loss_mask;          // empty: every token is a target; else 0/1 per token
};

struct Batch {
  std::vector<Sequence> sequences;
};

enum class VisionKind { image, video };
const char* to_string(VisionKind kind);

// A run of placeholder tokens that receives consecutive embedding rows of one item.
// Qwen2/2.5-VL, LLaVA, InternVL: one block per item; Qwen3-VL: one block per video frame.
struct VisionBlock {
  VisionKind kind = VisionKind::image;
  int64_t item = 0;         // index among this sequence's images (or videos)
  int64_t start = 0;        // index of the first placeholder token in the sequence
  int64_t t = 1;            // temporal patches in this block
  int64_t h = 1, w = 1;     // merged grid (patches / spatial_merge_size)
  int64_t first_row = 0;    // embedding row of the item at the block's first token
  int64_t first_frame = 0;  // temporal patch of the item at the block's first token
  int64_t class_rows = 0;   // rows before the patches' (LLaVA "full": the class token)
  int64_t size() const { return class_rows + t * h * w; }
};

struct ParsedSequence {
  int64_t length = 0;
  std::vector<VisionBlock> blocks;  // in token order
};

// Merged patch rows of an item: t * (h / m) * (w / m).
int64_t vision_row_count(const Grid& grid, int64_t spatial_merge_size);
// Embedding rows (= placeholder tokens) of an item: its merged patch rows, plus the
// class token's row where the conventions keep it (LLaVA "full").
int64_t vision_row_count(const Grid& grid, const ModelConventions& conventions);

// Finds the vision blocks and checks them against the grids; every error names the
// sequence index and the offending value.
ParsedSequence parse_sequence(const Sequence& sequence, const ModelConventions& conventions, int64_t sequence_index);

// Checks a grid (positive, divisible by the merge size, row count within int32).
void check_grid(const Grid& grid, const ModelConventions& conventions, int64_t sequence_index, VisionKind kind,
                int64_t item);

}  // namespace mmsp::plan
