// Helpers shared by the planner tests: sequences written the way each family's processor
// writes them, and plain per-token references (HF's get_rope_index loop, label shift)
// written independently of src/plan.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::plan::testing {

// The released conventions of `model_type`, as its family gives them (model/families/*).
inline ModelConventions released(const std::string& model_type) {
  return model::conventions_from_config(nlohmann::json{{"model_type", model_type}});
}

using ::mmsp::test::error_of;  // tests/support/error_of.h

// Builds one sequence: text tokens are ids 10..999 so they never collide with markers.
class SeqBuilder {
 public:
  explicit SeqBuilder(const ModelConventions& c, uint32_t seed = 1) : c_(c), rng_(seed) {}

  SeqBuilder& text(int64_t n) {
    std::uniform_int_distribution<int64_t> d(10, 999);
    for (int64_t i = 0; i < n; ++i) s_.input_ids.push_back(d(rng_));
    return *this;
  }
  SeqBuilder& image(Grid g) {
    s_.image_grid_thw.push_back(g);
    block(c_.image_token_id, vision_row_count(g, c_));
    return *this;
  }
  // Qwen3-VL: a timestamp text run before each frame block.
  SeqBuilder& video(Grid g, double seconds = -1) {
    s_.video_grid_thw.push_back(g);
    if (seconds >= 0) s_.second_per_grid_ts.push_back(seconds);
    const int64_t m = c_.spatial_merge_size;
    if (c_.video_frames_as_blocks()) {
      for (int64_t f = 0; f < g[0]; ++f) {
        text(3);  // "<1.5 seconds>" as text tokens
        block(c_.video_token_id, (g[1] / m) * (g[2] / m));
      }
    } else {
      block(c_.video_token_id, vision_row_count(g, m));
    }
    return *this;
  }
  // Qwen3-VL as transformers 5.x writes a video: the template's start and end markers left
  // around the timestamped frame blocks (text to get_rope_index).
  SeqBuilder& wrapped_video(Grid g) {
    s_.input_ids.push_back(c_.vision_start_token_id);
    video(g);
    s_.input_ids.push_back(c_.vision_end_token_id);
    return *this;
  }
  SeqBuilder& mask_first(int64_t n) {  // loss_mask 0 on the first n tokens (a prompt)
    s_.loss_mask.assign(s_.input_ids.size(), 1);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(s_.loss_mask.size()); ++i) s_.loss_mask[i] = 0;
    return *this;
  }
  Sequence build() const { return s_; }

 private:
  void block(int64_t pad, int64_t n) {
    if (c_.has_block_markers()) s_.input_ids.push_back(c_.vision_start_token_id);
    for (int64_t i = 0; i < n; ++i) s_.input_ids.push_back(pad);
    if (c_.has_block_markers()) s_.input_ids.push_back(c_.vision_end_token_id);
  }
  ModelConventions c_;
  std::mt19937 rng_;
  Sequence s_;
};

// Reference positions: transformers' get_rope_index loop for one sequence, token by
// token (rows x length), and its rope delta. 1-D families: arange.
struct RefPositions {
  std::vector<std::vector<int64_t>> rows;
  int64_t delta = 0;
};

inline RefPositions reference_positions(const Sequence& s, const ModelConventions& c) {
  const int64_t n = static_cast<int64_t>(s.input_ids.size());
  RefPositions out;
  if (!c.uses_mrope()) {
    out.rows.assign(1, std::vector<int64_t>(n));
    for (int64_t i = 0; i < n; ++i) out.rows[0][i] = i;
    return out;
  }
  out.rows.assign(3, std::vector<int64_t>(n, -7));
  std::vector<Grid> videos = s.video_grid_thw;
  std::vector<double> secs = s.second_per_grid_ts;
  if (c.video_frames_as_blocks()) {  // Qwen3-VL: repeat_interleave by t, then t = 1
    videos.clear();
    for (const Grid& g : s.video_grid_thw)
      for (int64_t f = 0; f < g[0]; ++f) videos.push_back({1, g[1], g[2]});
  }
  const auto& ids = s.input_ids;
  int64_t images = 0, vids = 0;
  for (int64_t i = 0; i + 1 < n; ++i)
    if (ids[i] == c.vision_start_token_id) {
      images += ids[i + 1] == c.image_token_id;
      vids += ids[i + 1] == c.video_token_id;
    }
  int64_t st = 0, max_pos = -1, image_index = 0, video_index = 0;
  auto find = [&](int64_t tok, int64_t from) {
    for (int64_t i = from; i < n; ++i)
      if (ids[i] == tok) return i;
    return n + 1;
  };
  int64_t remain_images = images, remain_videos = vids;
  for (int64_t k = 0; k < images + vids; ++k) {
    const int64_t ed_image = remain_images > 0 ? find(c.image_token_id, st) : n + 1;
    const int64_t ed_video = remain_videos > 0 ? find(c.video_token_id, st) : n + 1;
    Grid g;
    double second = 0.0;
    int64_t ed;
    if (ed_image < ed_video) {
      g = s.image_grid_thw[image_index++];
      --remain_images;
      ed = ed_image;
    } else {
      second = secs.empty() ? 1.0 : secs[video_index];
      g = videos[video_index++];
      --remain_videos;
      ed = ed_video;
    }
    const int64_t gt = g[0], gh = g[1] / c.spatial_merge_size, gw = g[2] / c.spatial_merge_size;
    const int64_t text_len = ed - st;
    const int64_t st_idx = max_pos + 1;
    for (int64_t i = 0; i < text_len; ++i)
      for (int r = 0; r < 3; ++r) out.rows[r][st + i] = st_idx + i;
    int64_t m = st_idx + text_len - 1;
    int64_t p = ed;
    for (int64_t t = 0; t < gt; ++t)
      for (int64_t h = 0; h < gh; ++h)
        for (int64_t w = 0; w < gw; ++w, ++p) {
          int64_t tv = t;
          if (c.scales_video_time()) {
            const float v =
                static_cast<float>(t) * static_cast<float>(second) * static_cast<float>(c.tokens_per_second);
            tv = static_cast<int64_t>(v);
          }
          out.rows[0][p] = tv + text_len + st_idx;
          out.rows[1][p] = h + text_len + st_idx;
          out.rows[2][p] = w + text_len + st_idx;
          for (int r = 0; r < 3; ++r) m = std::max(m, out.rows[r][p]);
        }
    max_pos = std::max(max_pos, m);
    st = ed + gt * gh * gw;
  }
  if (st < n) {
    const int64_t st_idx = max_pos + 1;
    for (int64_t i = st; i < n; ++i)
      for (int r = 0; r < 3; ++r) out.rows[r][i] = st_idx + (i - st);
    max_pos = st_idx + (n - st) - 1;
  }
  out.delta = max_pos + 1 - n;
  return out;
}

// Reference labels: the unsharded row shifted by one.
inline std::vector<int64_t> reference_labels(const Sequence& s, const ModelConventions& c) {
  const int64_t n = static_cast<int64_t>(s.input_ids.size());
  std::vector<int64_t> out(n, -100);
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t next = s.input_ids[i + 1];
    const bool placeholder = next == c.image_token_id || (c.video_token_id >= 0 && next == c.video_token_id);
    const bool masked = !s.loss_mask.empty() && s.loss_mask[i + 1] == 0;
    if (!placeholder && !masked) out[i] = next;
  }
  return out;
}

}  // namespace mmsp::plan::testing
