// Finding vision blocks in input_ids and checking them against the grids.
#include "mmsp/plan/sequence.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mmsp/core/check.h"

namespace mmsp::plan {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string grid_text(const Grid& g) { return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]"); }

// First index >= i whose token lies in [lo, lo + span], or n. Eight tokens per step
// without an early exit, so the compiler can vectorise the common all-text case.
int64_t skip_outside(const int64_t* ids, int64_t i, int64_t n, int64_t lo, uint64_t span) {
  const uint64_t base = static_cast<uint64_t>(lo);
  for (; i + 8 <= n; i += 8) {
    int hit = 0;
    for (int k = 0; k < 8; ++k) hit |= (static_cast<uint64_t>(ids[i + k]) - base) <= span;
    if (hit) break;
  }
  while (i < n && (static_cast<uint64_t>(ids[i]) - base) > span) ++i;
  return i;
}

// First index >= i whose token is not v, or n.
int64_t skip_equal(const int64_t* ids, int64_t i, int64_t n, int64_t v) {
  for (; i + 8 <= n; i += 8) {
    int miss = 0;
    for (int k = 0; k < 8; ++k) miss |= ids[i + k] != v;
    if (miss) break;
  }
  while (i < n && ids[i] == v) ++i;
  return i;
}

struct Scanner {
  const Sequence& seq;
  const ModelConventions& conv;
  int64_t si;
  ParsedSequence out;
  int64_t next_image = 0;
  int64_t next_video = 0;
  int64_t next_frame = 0;  // Qwen3-VL: frame of the current video

  void add_image(int64_t start, int64_t count) {
    MMSP_CHECK(next_image < static_cast<int64_t>(seq.image_grid_thw.size()), "sequence ", si,
               ": image placeholder tokens at index ", start, " belong to image ", next_image,
               " but image_grid_thw has only ", seq.image_grid_thw.size(), " entries");
    const Grid& g = seq.image_grid_thw[next_image];
    const int64_t m = conv.spatial_merge_size;
    const int64_t need = vision_row_count(g, conv);
    MMSP_CHECK(count == need, "sequence ", si, ": image ", next_image, " has ", count, " placeholder tokens but grid ",
               grid_text(g), " with spatial_merge_size ", m, " needs ", need,
               conv.class_rows > 0 ? " (its patches + 1 class token: vision_feature_select_strategy \"full\")" : "");
    VisionBlock b;
    b.kind = VisionKind::image;
    b.item = next_image++;
    b.start = start;
    b.class_rows = conv.class_rows;
    b.t = g[0];
    b.h = g[1] / m;
    b.w = g[2] / m;
    out.blocks.push_back(b);
  }

  void add_video(int64_t start, int64_t count) {
    MMSP_CHECK(next_video < static_cast<int64_t>(seq.video_grid_thw.size()), "sequence ", si,
               ": video placeholder tokens at index ", start, " belong to video ", next_video,
               " but video_grid_thw has only ", seq.video_grid_thw.size(), " entries");
    const Grid& g = seq.video_grid_thw[next_video];
    const int64_t m = conv.spatial_merge_size;
    VisionBlock b;
    b.kind = VisionKind::video;
    b.item = next_video;
    b.start = start;
    b.h = g[1] / m;
    b.w = g[2] / m;
    if (conv.video_frames_as_blocks()) {
      const int64_t need = b.h * b.w;
      MMSP_CHECK(count == need, "sequence ", si, ": video ", next_video, " frame ", next_frame, " has ", count,
                 " placeholder tokens but grid ", grid_text(g), " with spatial_merge_size ", m, " needs ", need,
                 " per frame (Qwen3-VL writes each temporal patch as its own vision block)");
      b.t = 1;
      b.first_frame = next_frame;
      b.first_row = next_frame * need;
      if (++next_frame == g[0]) {
        next_frame = 0;
        ++next_video;
      }
    } else {
      const int64_t need = vision_row_count(g, m);
      MMSP_CHECK(count == need, "sequence ", si, ": video ", next_video, " has ", count,
                 " placeholder tokens but grid ", grid_text(g), " with spatial_merge_size ", m, " needs ", need);
      b.t = g[0];
      ++next_video;
    }
    out.blocks.push_back(b);
  }

  // Qwen3-VL and Qwen3.5 as transformers 5.x writes them: the chat template's own start and
  // end markers left around a video's timestamped frame blocks, `<start><0.3 seconds><start>
  // <video>...<end><1.5 seconds>...<end>`. transformers 5.17 gives those two markers text
  // positions (they are not placeholders), so they are text here too; the released
  // processor (4.57) and vLLM write the frames without them. A wrapper holds whole videos'
  // frame blocks and their timestamps, nothing else. (One video as a processor writes it;
  // mmsp.patch hands each temporal patch over as a video of its own, as get_rope_index
  // splits them.)
  int64_t wrapper_open = -1;       // index of the open wrapper's start marker, or -1
  size_t wrapper_first_block = 0;  // out.blocks' size when it opened: its blocks follow

  void open_wrapper(int64_t i, int64_t next_token) {
    MMSP_CHECK(conv.video_frames_as_blocks() && conv.supports_video(), "sequence ", si, ": vision start token ",
               conv.vision_start_token_id, " at index ", i, " is followed by token ", next_token,
               ", expected image placeholder ", conv.image_token_id,
               (conv.supports_video() ? detail::concat(" or video placeholder ", conv.video_token_id) : ""));
    MMSP_CHECK(wrapper_open < 0, "sequence ", si, ": vision start token ", conv.vision_start_token_id, " at index ", i,
               " is followed by token ", next_token, " inside the video wrapper opened at index ", wrapper_open,
               "; a wrapper holds whole videos' timestamped frame blocks and does not nest");
    MMSP_CHECK(next_frame == 0, "sequence ", si, ": a video wrapper opens at index ", i, " but video ", next_video,
               " has blocks for ", next_frame, " of its frames before it");
    wrapper_open = i;
    wrapper_first_block = out.blocks.size();
  }

  void close_wrapper(int64_t i) {
    MMSP_CHECK(out.blocks.size() > wrapper_first_block, "sequence ", si, ": the video wrapper opened at index ",
               wrapper_open, " and closed at index ", i, " holds no video frame block");
    MMSP_CHECK(next_frame == 0, "sequence ", si, ": the video wrapper opened at index ", wrapper_open,
               " closes at index ", i, " after ", next_frame, " frames of video ", next_video, " (grid ",
               grid_text(seq.video_grid_thw[next_video]), "); a wrapper holds whole videos' frames");
    wrapper_open = -1;
  }

  // Qwen and InternVL: start marker, placeholders, end marker.
  void scan_marked() {
    const auto& ids = seq.input_ids;
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t start_id = conv.vision_start_token_id, end_id = conv.vision_end_token_id;
    const int64_t image_id = conv.image_token_id, video_id = conv.video_token_id;
    // Text tokens outside [lo, hi] of the four special ids skip every comparison.
    const int64_t lo = std::min({start_id, end_id, image_id, video_id < 0 ? image_id : video_id});
    const int64_t hi = std::max({start_id, end_id, image_id, video_id});
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    for (int64_t i = 0; i < n;) {
      i = skip_outside(ids.data(), i, n, lo, span);
      if (i == n) break;
      const int64_t tok = ids[i];
      if (tok == start_id) {
        MMSP_CHECK(i + 1 < n, "sequence ", si, ": vision start token ", start_id, " at index ", i,
                   " is the last token; a vision block needs placeholders and end token ", end_id);
        const int64_t pad = ids[i + 1];
        const bool image = pad == image_id;
        const bool video = video_id >= 0 && pad == video_id;
        if (!image && !video) {
          open_wrapper(i, pad);
          ++i;
          continue;
        }
        MMSP_CHECK(!(image && wrapper_open >= 0), "sequence ", si, ": an image block at index ", i,
                   " is inside the video wrapper opened at index ", wrapper_open,
                   "; a wrapper holds whole videos' timestamped frame blocks");
        const int64_t j = skip_equal(ids.data(), i + 1, n, pad);
        MMSP_CHECK(j < n && ids[j] == end_id, "sequence ", si, ": vision block opened at index ", i,
                   " is not closed by end token ", end_id, " after its ", j - i - 1, " placeholder tokens (found ",
                   (j < n ? detail::concat("token ", ids[j], " at index ", j) : std::string("the end of the sequence")),
                   ")");
        if (image)
          add_image(i + 1, j - i - 1);
        else
          add_video(i + 1, j - i - 1);
        i = j + 1;
        continue;
      }
      if (tok == end_id && wrapper_open >= 0) {
        close_wrapper(i);
        ++i;
        continue;
      }
      MMSP_CHECK(tok != end_id, "sequence ", si, ": vision end token ", end_id, " at index ", i,
                 " has no matching start token ", start_id);
      MMSP_CHECK(tok != image_id && (video_id < 0 || tok != video_id), "sequence ", si, ": placeholder token ", tok,
                 " at index ", i, " is outside a vision block (expected start token ", start_id, " before it)");
      ++i;
    }
  }

  // LLaVA: bare runs of the image token; consecutive images split by their grids.
  void scan_runs() {
    const auto& ids = seq.input_ids;
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t image_id = conv.image_token_id;
    for (int64_t i = 0; i < n;) {
      i = skip_outside(ids.data(), i, n, image_id, 0);
      if (i == n) break;
      const int64_t j = skip_equal(ids.data(), i, n, image_id);
      for (int64_t p = i; p < j;) {
        MMSP_CHECK(next_image < static_cast<int64_t>(seq.image_grid_thw.size()), "sequence ", si, ": ", j - p,
                   " image placeholder tokens from index ", p, " are left over after the ", seq.image_grid_thw.size(),
                   " images of image_grid_thw");
        const int64_t need = vision_row_count(seq.image_grid_thw[next_image], conv);
        add_image(p, std::min(need, j - p));
        p += need;
      }
      i = j;
    }
  }
};

void check_loss_mask(const Sequence& seq, int64_t si) {
  if (seq.loss_mask.empty()) return;
  MMSP_CHECK(seq.loss_mask.size() == seq.input_ids.size(), "sequence ", si, ": loss_mask has ", seq.loss_mask.size(),
             " entries but input_ids has ", seq.input_ids.size());
  for (size_t i = 0; i < seq.loss_mask.size(); ++i)
    MMSP_CHECK(seq.loss_mask[i] == 0 || seq.loss_mask[i] == 1, "sequence ", si, ": loss_mask[", i, "] is ",
               seq.loss_mask[i], ", expected 0 or 1");
}

}  // namespace

const char* to_string(VisionKind kind) { return kind == VisionKind::image ? "image" : "video"; }

int64_t vision_row_count(const Grid& g, int64_t m) { return g[0] * (g[1] / m) * (g[2] / m); }

int64_t vision_row_count(const Grid& g, const ModelConventions& conv) {
  return conv.class_rows + vision_row_count(g, conv.spatial_merge_size);
}

void check_grid(const Grid& g, const ModelConventions& conv, int64_t si, VisionKind kind, int64_t item) {
  const int64_t m = conv.spatial_merge_size;
  MMSP_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1, "sequence ", si, ": ", to_string(kind), " ", item, " grid ",
             grid_text(g), " must have t, h, w >= 1");
  MMSP_CHECK(g[1] % m == 0 && g[2] % m == 0, "sequence ", si, ": ", to_string(kind), " ", item, " grid ", grid_text(g),
             " is not divisible by spatial_merge_size ", m);
  const double patches = static_cast<double>(g[0]) * g[1] * g[2];
  MMSP_CHECK(patches <= kInt32Max, "sequence ", si, ": ", to_string(kind), " ", item, " grid ", grid_text(g), " has ",
             patches, " patches; the vision encoder's cu_seqlens are int32, ", "so an item holds at most ", kInt32Max,
             " patches");
}

ParsedSequence parse_sequence(const Sequence& seq, const ModelConventions& conv, int64_t si) {
  const int64_t n = static_cast<int64_t>(seq.input_ids.size());
  MMSP_CHECK(n > 0, "sequence ", si, ": input_ids is empty");
  MMSP_CHECK(n <= kInt32Max, "sequence ", si, ": ", n, " tokens is beyond int32 (", kInt32Max,
             ") that the attention kernel indexes with");
  check_loss_mask(seq, si);
  MMSP_CHECK(conv.supports_video() || seq.video_grid_thw.empty(), "sequence ", si, ": model ", conv.name,
             " has no video placeholder token but video_grid_thw has ", seq.video_grid_thw.size(), " entries");
  for (size_t k = 0; k < seq.image_grid_thw.size(); ++k)
    check_grid(seq.image_grid_thw[k], conv, si, VisionKind::image, static_cast<int64_t>(k));
  for (size_t k = 0; k < seq.video_grid_thw.size(); ++k)
    check_grid(seq.video_grid_thw[k], conv, si, VisionKind::video, static_cast<int64_t>(k));
  if (!seq.second_per_grid_ts.empty()) {
    MMSP_CHECK(conv.scales_video_time(), "sequence ", si, ": second_per_grid_ts is only used by qwen2_5_vl, not ",
               conv.name);
    MMSP_CHECK(seq.second_per_grid_ts.size() == seq.video_grid_thw.size(), "sequence ", si, ": second_per_grid_ts has ",
               seq.second_per_grid_ts.size(), " entries but video_grid_thw has ", seq.video_grid_thw.size());
    for (size_t k = 0; k < seq.second_per_grid_ts.size(); ++k)
      MMSP_CHECK(std::isfinite(seq.second_per_grid_ts[k]) && seq.second_per_grid_ts[k] >= 0, "sequence ", si,
                 ": second_per_grid_ts[", k, "] is ", seq.second_per_grid_ts[k], ", expected a finite number >= 0");
  }

  Scanner s{seq, conv, si, {}, 0, 0, 0};
  s.out.length = n;
  if (conv.has_block_markers())
    s.scan_marked();
  else
    s.scan_runs();
  MMSP_CHECK(s.wrapper_open < 0, "sequence ", si, ": the video wrapper opened by vision start token ",
             conv.vision_start_token_id, " at index ", s.wrapper_open, " is not closed by end token ",
             conv.vision_end_token_id);

  MMSP_CHECK(s.next_image == static_cast<int64_t>(seq.image_grid_thw.size()), "sequence ", si, ": image_grid_thw has ",
             seq.image_grid_thw.size(), " entries but the sequence has placeholders for ", s.next_image, " images");
  if (conv.video_frames_as_blocks() && s.next_frame != 0)
    MMSP_FAIL("sequence ", si, ": video ", s.next_video, " grid ", grid_text(seq.video_grid_thw[s.next_video]), " has ",
              seq.video_grid_thw[s.next_video][0], " frames but the sequence has blocks for ", s.next_frame);
  MMSP_CHECK(s.next_video == static_cast<int64_t>(seq.video_grid_thw.size()), "sequence ", si, ": video_grid_thw has ",
             seq.video_grid_thw.size(), " entries but the sequence has placeholders for ", s.next_video, " videos");
  return std::move(s.out);
}

}  // namespace mmsp::plan
