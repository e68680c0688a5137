// Positions per sequence as pieces, following transformers' get_rope_index:
// text continues from (largest position so far) + 1; a vision block starts where its
// text run would have continued and adds (t, row, column) of its merged grid.
#include "mmsp/plan/mrope_positions.h"

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::plan {

namespace {

// Temporal index of frame f. Qwen2.5-VL computes it in float32 tensors and truncates
// (`(arange(t) * second_per_grid_t * tokens_per_second).long()`).
inline int64_t time_index(const PositionPiece& p, int64_t frame) {
  if (!p.scaled_time) return frame;
  float v = static_cast<float>(frame) * p.seconds_per_frame;
  v = v * p.tokens_per_second;
  return static_cast<int64_t>(v);
}

}  // namespace

SequencePositions::SequencePositions(std::vector<PositionPiece> pieces, int rows, int64_t length)
    : pieces_(std::move(pieces)), rows_(rows), length_(length) {
  int64_t max_position = -1;
  for (const PositionPiece& p : pieces_) {
    int64_t m;
    if (!p.vision) {
      m = p.base + p.length - 1;
    } else {
      const int64_t frames = p.length / (p.h * p.w);
      m = p.base + std::max({time_index(p, p.first_frame + frames - 1), p.h - 1, p.w - 1});
    }
    max_position = std::max(max_position, m);
  }
  rope_delta_ = rows_ == 3 ? max_position + 1 - length_ : 0;
}

void SequencePositions::fill(int64_t begin, int64_t count, int64_t* const* out) const {
  MMSP_ASSERT(begin >= 0 && count >= 0 && begin + count <= length_, "range [", begin, ", ", begin + count,
              ") of a sequence of ", length_);
  if (count == 0) return;
  // Last piece starting at or before `begin`.
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                             [](int64_t v, const PositionPiece& p) { return v < p.start; });
  size_t k = static_cast<size_t>(it - pieces_.begin()) - 1;
  int64_t i = begin;
  int64_t written = 0;
  while (written < count) {
    const PositionPiece& p = pieces_[k];
    const int64_t end = std::min(p.start + p.length, begin + count);
    if (!p.vision) {
      for (; i < end; ++i, ++written) {
        const int64_t v = p.base + (i - p.start);
        for (int r = 0; r < rows_; ++r) out[r][written] = v;
      }
    } else {
      const int64_t hw = p.h * p.w;
      for (; i < end; ++i, ++written) {
        const int64_t off = i - p.start;
        const int64_t frame = off / hw;
        const int64_t rem = off - frame * hw;
        const int64_t row = rem / p.w;
        out[0][written] = p.base + time_index(p, p.first_frame + frame);
        out[1][written] = p.base + row;
        out[2][written] = p.base + (rem - row * p.w);
      }
    }
    ++k;
  }
}

SequencePositions make_sequence_positions(const ParsedSequence& parsed, const Sequence& seq,
                                          const ModelConventions& conv) {
  const int64_t n = parsed.length;
  std::vector<PositionPiece> pieces;
  if (!conv.uses_mrope()) {
    PositionPiece text;
    text.start = 0;
    text.length = n;
    pieces.push_back(text);
    return SequencePositions(std::move(pieces), 1, n);
  }
  pieces.reserve(2 * parsed.blocks.size() + 1);
  int64_t st = 0;    // first token not yet placed
  int64_t next = 0;  // largest position so far + 1
  for (const VisionBlock& b : parsed.blocks) {
    const int64_t text_len = b.start - st;
    if (text_len > 0) {
      PositionPiece text;
      text.start = st;
      text.length = text_len;
      text.base = next;
      pieces.push_back(text);
    }
    PositionPiece v;
    v.vision = true;
    v.start = b.start;
    v.length = b.size();
    v.base = next + text_len;
    v.h = b.h;
    v.w = b.w;
    // Qwen3-VL sets every frame block's t to 1: its temporal index is always 0.
    v.first_frame = conv.video_frames_as_blocks() ? 0 : b.first_frame;
    if (conv.scales_video_time()) {
      v.scaled_time = true;
      v.tokens_per_second = static_cast<float>(conv.tokens_per_second);
      if (b.kind == VisionKind::image)
        v.seconds_per_frame = 0.0f;
      else if (!seq.second_per_grid_ts.empty())
        v.seconds_per_frame = static_cast<float>(seq.second_per_grid_ts[b.item]);
      else
        v.seconds_per_frame = 1.0f;
    }
    const int64_t frames = b.t;
    next = v.base + std::max({time_index(v, v.first_frame + frames - 1), v.h - 1, v.w - 1}) + 1;
    pieces.push_back(v);
    st = b.start + b.size();
  }
  if (st < n) {
    PositionPiece text;
    text.start = st;
    text.length = n - st;
    text.base = next;
    pieces.push_back(text);
  }
  return SequencePositions(std::move(pieces), 3, n);
}

}  // namespace mmsp::plan
