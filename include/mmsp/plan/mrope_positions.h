// Rotary positions of a sequence, computed for any token range without building the
// whole row: 3-D mRoPE exactly as transformers' get_rope_index of Qwen2-VL, Qwen2.5-VL
// and Qwen3-VL computes them for the sequence alone, or 1-D positions (LLaVA, InternVL).
// Packing restarts positions per segment because each sequence is planned alone.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::plan {

// A stretch of tokens whose positions follow one rule: text (base + k on every row)
// or a vision block (base + t index, base + row, base + column).
struct PositionPiece {
  int64_t start = 0;  // first token of the piece in the sequence
  int64_t length = 0;
  int64_t base = 0;
  bool vision = false;
  int64_t h = 1, w = 1;            // merged grid of one frame
  int64_t first_frame = 0;         // frame of the item at the piece's first token
  float seconds_per_frame = 1.0f;  // Qwen2.5-VL temporal scale (second_per_grid_t)
  float tokens_per_second = 1.0f;
  bool scaled_time = false;  // Qwen2.5-VL: t = int(frame * s * tps); else t = frame
};

class SequencePositions {
 public:
  SequencePositions() = default;
  SequencePositions(std::vector<PositionPiece> pieces, int rows, int64_t length);

  int rows() const { return rows_; }  // 3 (mRoPE) or 1
  int64_t length() const { return length_; }
  int64_t rope_delta() const { return rope_delta_; }  // max position + 1 - length (0 for 1-D)
  const std::vector<PositionPiece>& pieces() const { return pieces_; }

  // Positions of tokens [begin, begin + count); out[r] receives row r (rows() pointers).
  void fill(int64_t begin, int64_t count, int64_t* const* out) const;

 private:
  std::vector<PositionPiece> pieces_;
  int rows_ = 1;
  int64_t length_ = 0;
  int64_t rope_delta_ = 0;
};

// Position value of padding slots (transformers initialises position_ids with ones).
constexpr int64_t kPadPosition = 1;

SequencePositions make_sequence_positions(const ParsedSequence& parsed, const Sequence& sequence,
                                          const ModelConventions& conventions);

}  // namespace mmsp::plan
