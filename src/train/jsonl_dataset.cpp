// Reading and checking a .jsonl dataset, and decoding its pixels on demand.
#include "mmsp/train/jsonl_dataset.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/model/families/internvl/dynamic_tiling.h"
#include "mmsp/model/safetensors.h"

namespace mmsp::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::array<std::string, 7> kFieldNames = {"input_ids", "loss_mask", "images", "image_grid_thw",
                                                "videos", "video_grid_thw", "second_per_grid_ts"};
const char* const kFields = "input_ids, loss_mask, images, image_grid_thw, videos, video_grid_thw, "
                            "second_per_grid_ts";

std::string grid_text(const plan::Grid& g) {
  return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]");
}

// Pixel geometry of the model: what a grid means in pixels and in rows.
struct Geometry {
  bool qwen = true;
  bool internvl = false;  // images are tiles of image_size, as many as the dynamic tiling cuts
  int64_t channels = 3, patch = 14, merge = 2, temporal = 2, row_width = 0;
  int64_t image_size = 0;  // LLaVA: the fixed square side; InternVL: the tile's side
  model::TilingOptions tiling;

  explicit Geometry(const model::ModelConfig& c)
      : qwen(c.family != plan::ModelFamily::llava && c.family != plan::ModelFamily::internvl),
        internvl(c.family == plan::ModelFamily::internvl) {
    if (internvl) {
      const model::InternVisionConfig& v = *c.intern_vision;
      channels = v.num_channels, patch = v.patch_size, merge = c.internvl->scale(), temporal = 1;
      image_size = tiling.tile_size = v.image_size;
    } else if (qwen) {
      const model::QwenVisionConfig& v = *c.qwen_vision;
      channels = v.in_channels, patch = v.patch_size, merge = v.spatial_merge_size;
      temporal = v.temporal_patch_size;
      row_width = channels * temporal * patch * patch;
    } else {
      const model::ClipVisionConfig& v = *c.clip_vision;
      channels = v.num_channels, patch = v.patch_size, merge = 1, temporal = 1;
      image_size = v.image_size;
    }
  }
};

// One line's parsing: every message starts with "file:line: ".
struct LineReader {
  const std::string& where;  // "file.jsonl:7"
  const json& object;

  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    throw Error(detail::concat(where, ": ", std::forward<Args>(args)...));
  }

  int64_t integer(const json& v, const std::string& name) const {
    const bool fits = v.is_number_integer() &&
                      (!v.is_number_unsigned() ||
                       v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!fits) fail(name, " is ", v.dump(), ", expected an integer");
    return v.get<int64_t>();
  }

  const json* find(const char* key) const {
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  const json& array(const json& v, const std::string& name) const {
    if (!v.is_array()) fail(name, " must be a list, got ", v.dump());
    return v;
  }

  std::vector<int64_t> integers(const char* key) const {
    std::vector<int64_t> out;
    if (const json* v = find(key)) {
      const json& a = array(*v, key);
      out.reserve(a.size());
      for (size_t k = 0; k < a.size(); ++k) out.push_back(integer(a[k], detail::concat(key, "[", k, "]")));
    }
    return out;
  }

  std::vector<plan::Grid> grids(const char* key) const {
    std::vector<plan::Grid> out;
    if (const json* v = find(key)) {
      const json& a = array(*v, key);
      for (size_t k = 0; k < a.size(); ++k) {
        const std::string name = detail::concat(key, "[", k, "]");
        if (!a[k].is_array() || a[k].size() != 3) fail(name, " is ", a[k].dump(), ", expected [t, h, w]");
        out.push_back({integer(a[k][0], name + "[0]"), integer(a[k][1], name + "[1]"),
                       integer(a[k][2], name + "[2]")});
      }
    }
    return out;
  }

  std::string text(const json& v, const std::string& name) const {
    if (!v.is_string() || v.get<std::string>().empty()) fail(name, " must be a non-empty string, got ", v.dump());
    return v.get<std::string>();
  }
};

fs::path resolve(const fs::path& dir, const std::string& file) {
  const fs::path p(file);
  return p.is_absolute() ? p : dir / p;
}

// Width and height of an image file from its header (stbi_info reads no pixels).
// Width and height are checked against `max_pixels` here, before anything is decoded.
std::pair<int64_t, int64_t> image_size(const LineReader& r, const std::string& name, const fs::path& file,
                                       int64_t max_pixels) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    r.fail(name, " file \"", file.string(), "\" does not exist (or is not a regular file)");
  int w = 0, h = 0, n = 0;
  if (!stbi_info(file.string().c_str(), &w, &h, &n))
    r.fail(name, " file \"", file.string(), "\" is not an image stb_image can read (",
           stbi_failure_reason(), ")");
  if (int64_t{w} * h > max_pixels)
    r.fail(name, " file \"", file.string(), "\" is ", w, " x ", h, " = ", int64_t{w} * h,
           " pixels, more than --max-image-pixels ", max_pixels, " (decoded it would take ",
           int64_t{w} * h * 3 / (1 << 20), " MiB as RGB); shrink it or raise the limit");
  return {w, h};
}

// The whole image, RGB (or grey for 1 channel), resized to width x height, as [C, H, W] in 0..1.
at::Tensor load_image(const std::string& where, const fs::path& file, int64_t channels, int64_t width,
                      int64_t height) {
  int w = 0, h = 0, n = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> data(
      stbi_load(file.string().c_str(), &w, &h, &n, static_cast<int>(channels)), stbi_image_free);
  MMSP_CHECK(data != nullptr, where, ": cannot decode \"", file.string(), "\": ", stbi_failure_reason());
  at::Tensor out = at::empty({height, width, channels}, at::kByte);
  if (w == width && h == height) {
    std::memcpy(out.data_ptr<uint8_t>(), data.get(), static_cast<size_t>(w) * h * channels);
  } else {
    const int ok = stbir_resize_uint8(data.get(), w, h, 0, out.data_ptr<uint8_t>(), static_cast<int>(width),
                                      static_cast<int>(height), 0, static_cast<int>(channels));
    MMSP_CHECK(ok, where, ": resizing \"", file.string(), "\" from ", w, " x ", h, " to ", width, " x ",
               height, " failed");
  }
  return out.permute({2, 0, 1}).to(at::kFloat).div_(255.0f).contiguous();
}

}  // namespace

JsonlDataset::JsonlDataset(const std::string& path, const model::ModelConfig& config, int64_t max_image_pixels)
    : path_(path), config_(config), norm_(pixel_norm(config.family)) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), "jsonl dataset: cannot open \"", path, "\"");
  const fs::path dir = fs::path(path).parent_path();
  const Geometry geo(config);
  const plan::ModelConventions& conv = config.conventions;
  const int64_t vocab = config.text.vocab_size;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
    const std::string where = detail::concat(path, ":", number);
    json object = parse_json_text(line, where);
    MMSP_CHECK(object.is_object(), where, ": expected a JSON object, got ", object.type_name());
    for (const auto& item : object.items())
      MMSP_CHECK(std::find(kFieldNames.begin(), kFieldNames.end(), item.key()) != kFieldNames.end(),
                 where, ": unknown field \"", item.key(), "\" (fields: ", kFields, ")");
    const LineReader r{where, object};
    const int64_t index = static_cast<int64_t>(samples_.size());
    Sample s;
    s.line = number;
    plan::Sequence& seq = s.sequence;

    MMSP_CHECK(r.find("input_ids") != nullptr, where, ": input_ids is missing");
    seq.input_ids = r.integers("input_ids");
    MMSP_CHECK(!seq.input_ids.empty(), where, ": input_ids is empty");
    for (size_t k = 0; k < seq.input_ids.size(); ++k)
      MMSP_CHECK(seq.input_ids[k] >= 0 && seq.input_ids[k] < vocab, where, ": input_ids[", k, "] = ",
                 seq.input_ids[k], " is outside the model's vocabulary 0..", vocab - 1);
    seq.loss_mask = r.integers("loss_mask");
    if (r.find("loss_mask") != nullptr) {
      MMSP_CHECK(seq.loss_mask.size() == seq.input_ids.size(), where, ": loss_mask has ",
                 seq.loss_mask.size(), " entries but input_ids has ", seq.input_ids.size());
      for (size_t k = 0; k < seq.loss_mask.size(); ++k)
        MMSP_CHECK(seq.loss_mask[k] == 0 || seq.loss_mask[k] == 1, where, ": loss_mask[", k, "] = ",
                   seq.loss_mask[k], ", expected 0 or 1");
    }
    if (const json* v = r.find("second_per_grid_ts")) {
      for (size_t k = 0; k < r.array(*v, "second_per_grid_ts").size(); ++k) {
        MMSP_CHECK((*v)[k].is_number() && (*v)[k].get<double>() >= 0 &&
                       (*v)[k].get<double>() <= plan::kMaxSecondsPerGrid,
                   where, ": second_per_grid_ts[", k, "] is ", (*v)[k].dump(), ", expected a number of seconds in [0, ",
                   plan::kMaxSecondsPerGrid, "]");
        seq.second_per_grid_ts.push_back((*v)[k].get<double>());
      }
    }

    // Pixel sources and their grids, derived where the line leaves them out.
    for (const bool video : {false, true}) {
      const char* items_key = video ? "videos" : "images";
      const char* grid_key = video ? "video_grid_thw" : "image_grid_thw";
      const char* kind = video ? "video" : "image";
      std::vector<plan::Grid> grids = r.grids(grid_key);
      const bool given = r.find(grid_key) != nullptr;
      std::vector<Source>& sources = video ? s.videos : s.images;
      if (const json* v = r.find(items_key)) {
        const json& list = r.array(*v, items_key);
        MMSP_CHECK(!video || geo.qwen, where, ": videos are not supported by ", config.model_type,
                   " (it has no video placeholder token)");
        MMSP_CHECK(!given || grids.size() == list.size(), where, ": ", grid_key, " has ", grids.size(),
                   " entries but ", items_key, " has ", list.size());
        for (size_t k = 0; k < list.size(); ++k) {
          const std::string name = detail::concat(kind, " ", k);
          const json& item = list[k];
          MMSP_CHECK(item.is_object(), where, ": ", name, " is ", item.dump(), ", expected an object with \"",
                     video ? "frames" : "path", "\" or \"safetensors\" and \"tensor\"");
          Source src;
          std::optional<plan::Grid> derived;
          if (item.contains("safetensors")) {
            src.safetensors = resolve(dir, r.text(item["safetensors"], name + " safetensors")).string();
            MMSP_CHECK(item.contains("tensor"), where, ": ", name, " names safetensors file \"",
                       src.safetensors, "\" but no \"tensor\"");
            src.tensor = r.text(item["tensor"], name + " tensor");
            std::error_code ec;
            MMSP_CHECK(fs::is_regular_file(src.safetensors, ec), where, ": ", name, " file \"",
                       src.safetensors, "\" does not exist (or is not a regular file)");
            model::SafetensorsHeader header;
            try {
              header = model::read_safetensors_header(src.safetensors);
            } catch (const Error& e) {
              MMSP_CHECK(false, where, ": ", name, ": ", e.what());
            }
            const auto t = header.tensors.find(src.tensor);
            MMSP_CHECK(t != header.tensors.end(), where, ": ", name, ": tensor \"", src.tensor,
                       "\" is not in \"", src.safetensors, "\"");
            const at::ScalarType st = t->second.scalar_type;
            MMSP_CHECK(at::isFloatingType(st), where, ": ", name, ": tensor \"", src.tensor, "\" is ",
                       t->second.dtype, ", expected a float dtype (F32, F64, F16, BF16)");
            const std::vector<int64_t>& shape = t->second.shape;
            if (geo.qwen) {
              MMSP_CHECK(given, where, ": ", name, " comes from safetensors, so ", grid_key,
                         " must give its grid");
              const plan::Grid& g = grids[k];
              const std::vector<int64_t> want{g[0] * g[1] * g[2], geo.row_width};
              MMSP_CHECK(shape == want, where, ": ", name, ": tensor \"", src.tensor, "\" has shape ",
                         at::IntArrayRef(shape), " but grid ", grid_text(g), " needs [", want[0], ", ",
                         want[1], "] (patches x channels*temporal_patch_size*patch_size^2)");
            } else if (geo.internvl) {
              MMSP_CHECK(given, where, ": ", name, " comes from safetensors, so ", grid_key,
                         " must give its grid (its tile count)");
              const std::vector<int64_t> want{grids[k][0], geo.channels, geo.image_size, geo.image_size};
              MMSP_CHECK(shape == want, where, ": ", name, ": tensor \"", src.tensor, "\" has shape ",
                         at::IntArrayRef(shape), " but grid ", grid_text(grids[k]), " needs [", want[0], ", ",
                         want[1], ", ", want[2], ", ", want[3], "] (tiles x channels x image_size^2)");
            } else {
              const std::vector<int64_t> want{geo.channels, geo.image_size, geo.image_size};
              MMSP_CHECK(shape == want, where, ": ", name, ": tensor \"", src.tensor, "\" has shape ",
                         at::IntArrayRef(shape), " but the model takes [", want[0], ", ", want[1], ", ",
                         want[2], "] images");
            }
          } else {
            std::vector<std::string> files;
            if (video) {
              MMSP_CHECK(item.contains("frames") && item["frames"].is_array() && !item["frames"].empty(),
                         where, ": ", name, " is ", item.dump(),
                         ", expected {\"frames\": [paths...]} or {\"safetensors\": ..., \"tensor\": ...}");
              for (size_t f = 0; f < item["frames"].size(); ++f)
                files.push_back(item["frames"][f].is_string() ? item["frames"][f].get<std::string>() : "");
            } else {
              MMSP_CHECK(item.contains("path"), where, ": ", name, " is ", item.dump(),
                         ", expected {\"path\": ...} or {\"safetensors\": ..., \"tensor\": ...}");
              files.push_back(r.text(item["path"], name + " path"));
            }
            std::pair<int64_t, int64_t> first{0, 0};
            for (size_t f = 0; f < files.size(); ++f) {
              const std::string fname = video ? detail::concat(name, " frame ", f) : name;
              MMSP_CHECK(!files[f].empty(), where, ": ", fname, " path must be a non-empty string");
              src.files.push_back(resolve(dir, files[f]).string());
              const auto wh = image_size(r, fname, src.files.back(), max_image_pixels);
              if (f == 0) first = wh;
              if (!given && geo.qwen)
                MMSP_CHECK(wh == first, where, ": ", fname, " \"", src.files.back(), "\" is ", wh.first,
                           " x ", wh.second, " but frame 0 is ", first.first, " x ", first.second,
                           "; frames of a video without video_grid_thw must have one size");
            }
            const int64_t frames = static_cast<int64_t>(files.size());
            const int64_t t = (frames + geo.temporal - 1) / geo.temporal;
            if (geo.internvl) {  // the processor's dynamic tiling of the file's size
              const int64_t side = geo.image_size / geo.patch;
              derived = plan::Grid{model::tile_count(first.second, first.first, geo.tiling), side, side};
              MMSP_CHECK(!given || grids[k] == *derived, where, ": ", grid_key, "[", k, "] = ", grid_text(grids[k]),
                         " but ", config.model_type, " cuts ", name, " (", first.first, " x ", first.second,
                         " pixels) into ", (*derived)[0], " tiles of ", geo.image_size, " px: grid ",
                         grid_text(*derived));
            } else if (!geo.qwen) {
              const int64_t side = geo.image_size / geo.patch;
              derived = plan::Grid{1, side, side};
            } else if (!given) {
              const int64_t unit = geo.patch * geo.merge;
              MMSP_CHECK(first.first % unit == 0 && first.second % unit == 0, where, ": ", name, " \"",
                         src.files[0], "\" is ", first.first, " x ", first.second,
                         " pixels (W x H), not a multiple of patch_size * spatial_merge_size = ", unit,
                         " on each side; resize the file or give ", grid_key, " to resize it on load");
              derived = plan::Grid{t, first.second / geo.patch, first.first / geo.patch};
            } else {
              MMSP_CHECK(grids[k][0] == t, where, ": ", grid_key, "[", k, "] = ", grid_text(grids[k]),
                         " has t = ", grids[k][0], " but ", name, " has ", frames, " frame(s), which make ",
                         t, " temporal patch(es) of ", geo.temporal);
            }
          }
          if (derived) {
            if (given) {
              MMSP_CHECK(grids[k] == *derived, where, ": ", grid_key, "[", k, "] = ", grid_text(grids[k]),
                         " but ", config.model_type, " images of ", geo.image_size, " px have grid ",
                         grid_text(*derived));
            } else {
              grids.push_back(*derived);
            }
          }
          sources.push_back(std::move(src));
        }
      } else {
        MMSP_CHECK(grids.empty(), where, ": ", grid_key, " has ", grids.size(), " entries but there is no ",
                   items_key, " list to take their pixels from");
      }
      (video ? seq.video_grid_thw : seq.image_grid_thw) = std::move(grids);
    }

    try {
      plan::parse_sequence(seq, conv, index);
    } catch (const Error& e) {
      MMSP_CHECK(false, where, ": ", e.what());
    }
    samples_.push_back(std::move(s));
  }
  MMSP_CHECK(!samples_.empty(), "jsonl dataset: \"", path, "\" holds no sample");
}

const JsonlDataset::Sample& JsonlDataset::sample(int64_t index) const {
  MMSP_CHECK(index >= 0 && index < size(), "jsonl dataset \"", path_, "\": sample index ", index,
             " is outside 0..", size() - 1);
  return samples_[index];
}

void JsonlDataset::check_lengths(int64_t row_limit) const {
  for (const Sample& s : samples_) {
    const auto length = static_cast<int64_t>(s.sequence.input_ids.size());
    MMSP_CHECK(length <= row_limit, path_, ":", s.line, ": the sample has ", length,
               " tokens, more than one row of a step holds (", row_limit,
               " = --tokens-per-rank × world / rows); raise --tokens-per-rank or shorten the sample");
  }
}

std::string JsonlDataset::location(int64_t index) const {
  return detail::concat(path_, ":", sample(index).line);
}

plan::Sequence JsonlDataset::sequence(int64_t index) const { return sample(index).sequence; }

at::Tensor JsonlDataset::pixels(const Sample& s, const Source& src, const plan::Grid& g, bool video,
                                int64_t item) const {
  const std::string where = detail::concat(path_, ":", s.line, ": ", video ? "video " : "image ", item);
  const Geometry geo(config_);
  if (!src.safetensors.empty()) {
    std::map<std::string, at::Tensor> tensors = model::load_safetensors(src.safetensors);
    const auto it = tensors.find(src.tensor);
    MMSP_CHECK(it != tensors.end(), where, ": tensor \"", src.tensor, "\" is no longer in \"",
               src.safetensors, "\"");
    return it->second.to(at::kFloat).contiguous();
  }
  if (geo.internvl) {  // the whole image at its own size, then the processor's tiles
    int w = 0, h = 0, n = 0;
    MMSP_CHECK(stbi_info(src.files[0].c_str(), &w, &h, &n), where, ": cannot read \"", src.files[0], "\"");
    std::vector<at::Tensor> tiles;
    for (const at::Tensor& tile : model::tile_image(load_image(where, src.files[0], geo.channels, w, h), geo.tiling).unbind(0))
      tiles.push_back(normalize_image(tile, norm_));
    MMSP_CHECK(static_cast<int64_t>(tiles.size()) == g[0], where, ": \"", src.files[0], "\" now cuts into ",
               tiles.size(), " tiles, but its grid says ", g[0], " (did the file change?)");
    return at::stack(tiles);
  }
  if (!geo.qwen) {
    return normalize_image(load_image(where, src.files[0], geo.channels, geo.image_size, geo.image_size),
                           norm_);
  }
  std::vector<at::Tensor> frames;
  for (const std::string& f : src.files)
    frames.push_back(load_image(where, f, geo.channels, g[2] * geo.patch, g[1] * geo.patch));
  QwenPatches out = qwen_patches(at::stack(frames), *config_.qwen_vision, norm_);
  MMSP_ASSERT(out.grid == g, where, ": patches of grid ", grid_text(out.grid), " for grid ", grid_text(g));
  return out.rows;
}

at::Tensor JsonlDataset::image_pixels(int64_t index, int64_t image) const {
  const Sample& s = sample(index);
  MMSP_CHECK(image >= 0 && image < static_cast<int64_t>(s.images.size()), location(index), ": sample ",
             index, " has ", s.images.size(), " images, no image ", image);
  return pixels(s, s.images[image], s.sequence.image_grid_thw[image], false, image);
}

at::Tensor JsonlDataset::video_pixels(int64_t index, int64_t video) const {
  const Sample& s = sample(index);
  MMSP_CHECK(video >= 0 && video < static_cast<int64_t>(s.videos.size()), location(index), ": sample ",
             index, " has ", s.videos.size(), " videos, no video ", video);
  return pixels(s, s.videos[video], s.sequence.video_grid_thw[video], true, video);
}

std::string JsonlDataset::describe() const {
  int64_t images = 0, videos = 0, tokens = 0;
  for (const Sample& s : samples_) {
    images += static_cast<int64_t>(s.images.size());
    videos += static_cast<int64_t>(s.videos.size());
    tokens += static_cast<int64_t>(s.sequence.input_ids.size());
  }
  return detail::concat("jsonl: ", path_, ", ", size(), " samples, ", tokens, " tokens, ", images,
                        " images, ", videos, " videos");
}

}  // namespace mmsp::train
