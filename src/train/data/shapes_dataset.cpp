// Drawing, captioning and tokenizing the shapes samples. Each sample's random values come
// from splitmix64 over (seed, index) in a fixed order, so they do not depend on the
// standard library, the rank or the order in which samples are asked for.
#include "mmsp/train/data/shapes_dataset.h"

#include <algorithm>
#include <array>

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"
#include "mmsp/train/data/splitmix64.h"

namespace mmsp::train {

namespace {

constexpr std::array<const char*, 2> kSizes = {"small", "big"};
constexpr std::array<const char*, 6> kColours = {"red", "green", "blue", "yellow", "white", "magenta"};
constexpr std::array<std::array<float, 3>, 6> kRgb = {
    {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0}, {1, 1, 1}, {1, 0, 1}}};
constexpr std::array<const char*, 4> kShapes = {"circle", "square", "triangle", "cross"};
constexpr std::array<const char*, 5> kPlaces = {"left", "right", "top", "bottom", "centre"};
// shape centre (x, y) as a fraction of the image, per place
constexpr std::array<std::array<double, 2>, 5> kPlaceXY = {
    {{0.27, 0.5}, {0.73, 0.5}, {0.5, 0.27}, {0.5, 0.73}, {0.5, 0.5}}};
constexpr std::array<const char*, 4> kDirections = {"left", "right", "up", "down"};
// half-size of a shape as a fraction of the image's shorter side, per size; with the
// places above and jitter below every shape stays inside its image
constexpr std::array<double, 2> kRadius = {0.11, 0.22};
constexpr double kJitter = 0.04;

}  // namespace

struct ShapesDataset::Draw {
  bool video = false;
  int64_t height = 0, width = 0, frames = 1;
  int size = 0, colour = 0, shape = 0, place = 0;  // place: direction index for videos
  double jitter_x = 0, jitter_y = 0, background = 0;
};

std::string ShapesItem::caption() const {
  std::string where;
  if (video)
    where = "moves " + place;
  else if (place == "left" || place == "right")
    where = "on the " + place;
  else if (place == "centre")
    where = "in the centre";
  else
    where = "at the " + place;
  return "a " + size + " " + colour + " " + shape + " " + where;
}

ShapesDataset::ShapesDataset(const ShapesOptions& options, const model::ModelConfig& config)
    : options_(options), config_(config), tokenizer_(config), geometry_(model::pixel_geometry(config)) {
  const ShapesOptions& o = options_;
  MMSP_CHECK(o.samples >= 1, "shapes dataset: samples is ", o.samples, ", expected >= 1");
  MMSP_CHECK(o.min_tokens_per_side >= 1 && o.min_tokens_per_side <= o.max_tokens_per_side,
             "shapes dataset: tokens per side range [", o.min_tokens_per_side, ", ", o.max_tokens_per_side,
             "] must satisfy 1 <= min <= max");
  MMSP_CHECK(o.multi_image_fraction >= 0 && o.video_fraction >= 0 && o.multi_image_fraction + o.video_fraction <= 1,
             "shapes dataset: multi_image_fraction (", o.multi_image_fraction, ") and video_fraction (",
             o.video_fraction, ") must be >= 0 and sum to at most 1");
  MMSP_CHECK(geometry_->channels() == 3, "shapes dataset draws RGB images but ", config.model_type,
             "'s vision tower reads ", geometry_->channels(), " channel(s)");
  if (geometry_->takes_videos()) {
    MMSP_CHECK(o.min_frames >= 1 && o.min_frames <= o.max_frames, "shapes dataset: frames range [", o.min_frames, ", ",
               o.max_frames, "] must satisfy 1 <= min <= max");
    // timestamps "<k.0 seconds>" exist for temporal patches 0..9 (word_tokenizer)
    const plan::Grid longest = geometry_->grid_for(o.max_frames, geometry_->side_unit(), geometry_->side_unit(),
                                                   "the shapes dataset's smallest video");
    MMSP_CHECK(longest[0] <= 10, "shapes dataset: max_frames ", o.max_frames, " gives ", longest[0],
               " temporal patches, more than 10; the built-in vocabulary has timestamps <0.0 .. <9.0");
  }
}

std::vector<ShapesDataset::Draw> ShapesDataset::draw_unbounded(int64_t index) const {
  MMSP_CHECK(index >= 0 && index < options_.samples, "shapes dataset: sample index ", index, " is outside 0..",
             options_.samples - 1);
  SplitMix64 rng(options_.seed, static_cast<uint64_t>(index));
  const double u = rng.unit();
  const bool video = geometry_->takes_videos() && u < options_.video_fraction;
  int64_t count = 1;
  if (!video && u >= options_.video_fraction && u < options_.video_fraction + options_.multi_image_fraction)
    count = rng.between(2, 3);
  std::vector<Draw> out(count);
  for (Draw& d : out) {
    d.video = video;
    if (geometry_->fixed_side() == 0) {
      const int64_t unit = geometry_->side_unit();
      d.height = unit * rng.between(options_.min_tokens_per_side, options_.max_tokens_per_side);
      d.width = unit * rng.between(options_.min_tokens_per_side, options_.max_tokens_per_side);
    } else {
      d.height = d.width = geometry_->fixed_side();
    }
    if (video) d.frames = rng.between(options_.min_frames, options_.max_frames);
    d.size = static_cast<int>(rng.below(kSizes.size()));
    d.colour = static_cast<int>(rng.below(kColours.size()));
    d.shape = static_cast<int>(rng.below(kShapes.size()));
    d.place = static_cast<int>(rng.below(video ? kDirections.size() : kPlaces.size()));
    d.jitter_x = kJitter * (2 * rng.unit() - 1);
    d.jitter_y = kJitter * (2 * rng.unit() - 1);
    d.background = 0.25 * rng.unit();
  }
  return out;
}

// A sample longer than max_sequence_tokens loses its last items, then (one item left) is
// drawn at the smallest sides and frames: the same sample on every run, and a run's
// samples that fit are the ones an unbounded dataset draws (it would stop at the others).
std::vector<ShapesDataset::Draw> ShapesDataset::draw(int64_t index) const {
  std::vector<Draw> out = draw_unbounded(index);
  const int64_t limit = options_.max_sequence_tokens;
  auto too_long = [&] { return limit > 0 && static_cast<int64_t>(sequence_of(out).input_ids.size()) > limit; };
  while (out.size() > 1 && too_long()) out.pop_back();
  if (too_long()) {
    Draw& d = out.front();
    if (geometry_->fixed_side() == 0) d.height = d.width = geometry_->side_unit() * options_.min_tokens_per_side;
    if (d.video) d.frames = options_.min_frames;
  }
  return out;
}

std::vector<ShapesItem> ShapesDataset::items(int64_t index) const { return items_of(draw(index)); }

std::vector<ShapesItem> ShapesDataset::items_of(const std::vector<Draw>& draws) {
  std::vector<ShapesItem> out;
  for (const Draw& d : draws) {
    ShapesItem it;
    it.video = d.video;
    it.height = d.height;
    it.width = d.width;
    it.frames = d.frames;
    it.size = kSizes[d.size];
    it.colour = kColours[d.colour];
    it.shape = kShapes[d.shape];
    it.place = d.video ? kDirections[d.place] : kPlaces[d.place];
    out.push_back(it);
  }
  return out;
}

std::string ShapesDataset::caption(int64_t index) const { return caption_of(draw(index)); }

std::string ShapesDataset::caption_of(const std::vector<Draw>& draws) {
  std::string out;
  for (const ShapesItem& it : items_of(draws)) out += (out.empty() ? "" : " and ") + it.caption();
  return out;
}

plan::Sequence ShapesDataset::sequence(int64_t index) const { return sequence_of(draw(index)); }

plan::Sequence ShapesDataset::sequence_of(const std::vector<Draw>& draws) const {
  const plan::ModelConventions& c = config_.conventions;
  plan::Sequence s;
  s.input_ids.push_back(WordTokenizer::kBos);
  auto block = [&](int64_t pad, int64_t n) {
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_start_token_id);
    s.input_ids.insert(s.input_ids.end(), n, pad);
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_end_token_id);
  };
  for (const Draw& d : draws) {
    const plan::Grid g = geometry_->grid_for(d.frames, d.width, d.height, "a shapes image");
    const int64_t rows = geometry_->placeholder_rows(g);
    if (!d.video) {
      s.image_grid_thw.push_back(g);
      block(c.image_token_id, rows);
      continue;
    }
    const int64_t per_frame = rows / g[0];
    s.video_grid_thw.push_back(g);
    // frames are 1 / tp seconds apart, so temporal patch k starts at k seconds
    if (c.scales_video_time()) s.second_per_grid_ts.push_back(1.0);
    if (c.video_frames_as_blocks()) {
      for (int64_t k = 0; k < g[0]; ++k) {
        for (int64_t w : tokenizer_.encode("<" + std::to_string(k) + ".0 seconds>")) s.input_ids.push_back(w);
        block(c.video_token_id, per_frame);
      }
    } else {
      block(c.video_token_id, g[0] * per_frame);
    }
  }
  const int64_t prompt = static_cast<int64_t>(s.input_ids.size());
  for (int64_t w : tokenizer_.encode(caption_of(draws))) s.input_ids.push_back(w);
  s.input_ids.push_back(WordTokenizer::kEos);
  s.loss_mask.assign(s.input_ids.size(), 1);
  std::fill(s.loss_mask.begin(), s.loss_mask.begin() + prompt, 0);
  return s;
}

at::Tensor ShapesDataset::render(const Draw& d) const {
  const int64_t H = d.height, W = d.width, T = d.frames;
  const double side = static_cast<double>(std::min(H, W));
  const double r = kRadius[d.size] * side;
  const at::Tensor xs = (at::arange(W, at::kDouble) + 0.5).view({1, W});  // pixel centres
  const at::Tensor ys = (at::arange(H, at::kDouble) + 0.5).view({H, 1});
  at::Tensor frames = at::empty({T, 3, H, W}, at::kFloat);
  for (int64_t f = 0; f < T; ++f) {
    at::Tensor frame = frames[f];
    if (options_.blank_images) {
      for (int64_t ch = 0; ch < 3; ++ch) frame[ch].fill_(static_cast<float>(geometry_->norm().mean[ch]));
      continue;
    }
    double fx, fy;
    if (d.video) {  // from 0.3 to 0.7 of the image (or back) along the direction
      const double s = T > 1 ? static_cast<double>(f) / (T - 1) : 0.5;
      const double along = 0.3 + 0.4 * s, across = 0.5;
      switch (d.place) {
        case 0:
          fx = 1 - along, fy = across;
          break;  // left
        case 1:
          fx = along, fy = across;
          break;  // right
        case 2:
          fx = across, fy = 1 - along;
          break;  // up
        default:
          fx = across, fy = along;
          break;  // down
      }
    } else {
      fx = kPlaceXY[d.place][0], fy = kPlaceXY[d.place][1];
    }
    const at::Tensor dx = xs - (fx + d.jitter_x) * W;  // [1, W]
    const at::Tensor dy = ys - (fy + d.jitter_y) * H;  // [H, 1]
    const at::Tensor ax = dx.abs(), ay = dy.abs();
    at::Tensor mask;  // [H, W] bool
    switch (d.shape) {
      case 0:
        mask = (dx * dx + dy * dy) <= r * r;
        break;  // circle
      case 1:
        mask = (ax <= 0.85 * r).logical_and(ay <= 0.85 * r);
        break;  // square
      case 2:
        mask = (ay <= r).logical_and(ax <= (dy + r) * 0.5);
        break;  // triangle, apex up
      default:  // cross
        mask = (ax <= r).logical_and(ay <= r / 3).logical_or((ay <= r).logical_and(ax <= r / 3));
    }
    for (int64_t ch = 0; ch < 3; ++ch)
      frame[ch].copy_(at::where(mask, at::scalar_tensor(kRgb[d.colour][ch], at::kFloat),
                                at::scalar_tensor(static_cast<float>(d.background), at::kFloat)));
  }
  return frames;
}

at::Tensor ShapesDataset::render(int64_t index, int64_t item) const {
  const std::vector<Draw> draws = draw(index);
  MMSP_CHECK(item >= 0 && item < static_cast<int64_t>(draws.size()), "shapes dataset: sample ", index, " has ",
             draws.size(), " items, no item ", item);
  return render(draws[item]);
}

at::Tensor ShapesDataset::item_pixels(int64_t index, bool video, int64_t which) const {
  const std::vector<Draw> draws = draw(index);
  int64_t seen = 0;
  for (const Draw& d : draws) {
    if (d.video != video || seen++ != which) continue;
    return geometry_->item_pixels(render(d));
  }
  MMSP_FAIL("shapes dataset: sample ", index, " has ", seen, video ? " videos" : " images", ", no ",
            video ? "video " : "image ", which);
}

at::Tensor ShapesDataset::image_pixels(int64_t index, int64_t image) const { return item_pixels(index, false, image); }

at::Tensor ShapesDataset::video_pixels(int64_t index, int64_t video) const { return item_pixels(index, true, video); }

std::string ShapesDataset::describe() const {
  const ShapesOptions& o = options_;
  std::string s = detail::concat("shapes: ", o.samples, " samples per epoch, seed ", o.seed, ", ", config_.model_type);
  if (geometry_->fixed_side() == 0) {
    s += detail::concat(", sides ", o.min_tokens_per_side, "..", o.max_tokens_per_side, " tokens, ",
                        o.multi_image_fraction * 100, "% multi-image");
  } else {
    s += detail::concat(", ", geometry_->fixed_side(), " px images, ", o.multi_image_fraction * 100, "% multi-image");
  }
  if (geometry_->takes_videos())
    s += detail::concat(", ", o.video_fraction * 100, "% video (", o.min_frames, "..", o.max_frames, " frames)");
  if (o.blank_images) s += ", images blanked";
  return s;
}

}  // namespace mmsp::train
