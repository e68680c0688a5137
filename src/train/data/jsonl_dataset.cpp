// Reading and checking a .jsonl dataset, and decoding its pixels on demand.
#include "mmsp/train/data/jsonl_dataset.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/model/family.h"
#include "mmsp/model/vision/image_resize.h"
#include "mmsp/plan/labels.h"
#include "mmsp/train/data/image_file.h"
#include "mmsp/train/data/video_file.h"

namespace mmsp::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::array<std::string, 10> kFieldNames = {
    "input_ids",      "loss_mask",          "images",     "image_grid_thw", "videos",
    "video_grid_thw", "second_per_grid_ts", "advantages", "old_logprobs",   "ref_logprobs"};
const char* const kFields =
    "input_ids, loss_mask, images, image_grid_thw, videos, video_grid_thw, "
    "second_per_grid_ts; and an RL objective's advantages, old_logprobs, ref_logprobs";

std::string grid_text(const plan::Grid& g) { return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]"); }

// One line's parsing: every message starts with "file:line: ".
struct LineReader {
  const std::string& where;  // "file.jsonl:7"
  const json& object;

  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    throw Error(detail::concat(where, ": ", std::forward<Args>(args)...));
  }

  int64_t integer(const json& v, const std::string& name) const {
    const bool fits =
        v.is_number_integer() &&
        (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
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
        out.push_back({integer(a[k][0], name + "[0]"), integer(a[k][1], name + "[1]"), integer(a[k][2], name + "[2]")});
      }
    }
    return out;
  }

  std::string text(const json& v, const std::string& name) const {
    if (!v.is_string() || v.get<std::string>().empty()) fail(name, " must be a non-empty string, got ", v.dump());
    return v.get<std::string>();
  }

  // A file's path: text without a NUL, where the system would cut it (and open another file).
  std::string path(const json& v, const std::string& name) const {
    std::string p = text(v, name);
    if (const size_t nul = p.find('\0'); nul != std::string::npos)
      fail(name, " ", v.dump(), " holds a NUL character (at byte ", nul, "); a path cannot hold one");
    return p;
  }
};

// Why `file` is not a file to read ("" when it is one), in words after its name.
std::string not_a_file(const fs::path& file) {
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (fs::is_regular_file(st)) return "";
  if (st.type() == fs::file_type::not_found) return "does not exist";
  if (ec == std::errc::too_many_symbolic_link_levels)
    return detail::concat("is a loop of symbolic links (", ec.message(), ")");
  if (ec) return detail::concat("cannot be reached (", ec.message(), ")");
  return fs::is_directory(st) ? "is a directory, not a file" : "is not a regular file";
}

// An image or video entry is one of the forms docs/data.md lists, whole: a key of two forms,
// or of none, is refused (a typo or a leftover would otherwise be ignored, or win silently).
void check_entry_keys(const LineReader& r, const json& item, bool video, const std::string& name) {
  using Form = std::vector<std::string>;
  static const std::vector<Form> kImage = {{"path"}, {"safetensors", "tensor"}};
  static const std::vector<Form> kVideo = {{"path", "frame_indices"}, {"frames"}, {"safetensors", "tensor"}};
  const char* forms = video ? "{\"path\": video file, \"frame_indices\": [...]}, {\"frames\": [paths...]} or "
                              "{\"safetensors\": ..., \"tensor\": ...}"
                            : "{\"path\": ...} or {\"safetensors\": ..., \"tensor\": ...}";
  const Form* form = nullptr;
  for (const Form& f : video ? kVideo : kImage) {
    if (!item.contains(f[0])) continue;
    if (form) r.fail(name, " has both \"", (*form)[0], "\" and \"", f[0], "\": an entry is one of ", forms);
    form = &f;
  }
  for (const auto& key : item.items())
    if (form && std::find(form->begin(), form->end(), key.key()) == form->end())
      r.fail(name, " has the key \"", key.key(), "\", which an entry with \"", (*form)[0], "\" does not take (", forms,
             ")");
}

fs::path resolve(const std::string& dir, const std::string& file) {
  const fs::path p(file);
  return p.is_absolute() ? p : fs::path(dir) / p;
}

// Width and height of an image file from its header (image_file.h: nothing is decoded),
// checked against `max_pixels` before anything is, and refused when mmsp would not read its
// pixels as transformers' processors (PIL) do.
std::pair<int64_t, int64_t> image_size(const LineReader& r, const std::string& name, const fs::path& file,
                                       int64_t max_pixels) {
  if (const std::string why = not_a_file(file); !why.empty()) r.fail(name, " file \"", file.string(), "\" ", why);
  const ImageFileHeader h = read_image_header(file);
  if (h.width * h.height > max_pixels)
    r.fail(name, " file \"", file.string(), "\" is ", h.width, " x ", h.height, " = ", h.width * h.height,
           " pixels, more than --max-image-pixels ", max_pixels, " (decoded it would take ",
           h.width * h.height * 3 / (1 << 20), " MiB as RGB); shrink it or raise the limit");
  if (!h.problem.empty()) r.fail(name, " file \"", file.string(), "\" is ", h.problem);
  return {h.width, h.height};
}

// The whole image, RGB (or grey for 1 channel), resized to width x height, as [C, H, W] in 0..1.
at::Tensor load_image(const std::string& where, const fs::path& file, int64_t channels, int64_t width, int64_t height) {
  at::Tensor decoded;
  try {
    decoded = decode_image_file(file, channels);
  } catch (const Error& e) { MMSP_FAIL(where, ": ", e.what()); }
  // As the Hugging Face processors resize (PIL's bicubic on the 8-bit image; a copy when the
  // file already has the size).
  const at::Tensor out = model::resize_bicubic_like_pil(decoded, height, width);
  return out.permute({2, 0, 1}).to(at::kFloat).div_(255.0f).contiguous();
}

// A video's frames as transformers' video processors take them: decoded to uint8 (a video
// file by video_file.h's torchcodec-equal decoder, a frame folder's files as PIL reads them),
// resized by ATen's antialiased bicubic on the uint8 frames (what torchvision's resize calls
// on the CPU), [T, C, H, W] uint8.
at::Tensor video_frames(const std::string& where, const std::vector<std::string>& files,
                        const std::vector<int64_t>& frame_indices, int64_t channels, int64_t width, int64_t height,
                        VideoDecodeCounts& counts) {
  at::Tensor frames;  // [T, H, W, C]
  try {
    if (!frame_indices.empty()) {
      MMSP_CHECK(channels == 3, where, ": video files give RGB frames, but the vision tower takes ", channels,
                 " channels");
      frames = decode_video_frames(files[0], frame_indices, &counts);
    } else {
      std::vector<at::Tensor> decoded;
      for (const std::string& f : files) decoded.push_back(decode_image_file(f, channels));
      frames = at::stack(decoded);
    }
  } catch (const Error& e) { MMSP_FAIL(where, ": ", e.what()); }
  at::Tensor x = frames.permute({0, 3, 1, 2});  // channels last in memory, as torchcodec gives them
  if (x.size(2) != height || x.size(3) != width)
    x = at::_upsample_bicubic2d_aa(x, {height, width}, /*align_corners=*/false, std::nullopt, std::nullopt);
  return x;
}

}  // namespace

// Everything one line needs while it is read.
struct JsonlDataset::Line {
  LineReader r;
  const std::string& where;  // "file.jsonl:7"
};

JsonlDataset::JsonlDataset(const std::string& path, const model::ModelConfig& config, int64_t max_image_pixels,
                           int64_t max_line_bytes)
    : path_(path),
      dir_(fs::path(path).parent_path().string()),
      config_(config),
      geometry_(model::pixel_geometry(config)),
      max_image_pixels_(max_image_pixels) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), "jsonl dataset: cannot open \"", path, "\"");
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
    MMSP_CHECK(max_line_bytes <= 0 || static_cast<int64_t>(text.size()) <= max_line_bytes, path, ":", number,
               ": the line is ", text.size(), " bytes, more than a sample that fits one row of a step needs (at most ",
               max_line_bytes, " bytes); split the sample, or raise --tokens-per-rank if it is meant to fit");
    read_line(text, number);
  }
  MMSP_CHECK(!samples_.empty(), "jsonl dataset: \"", path, "\" holds no sample");
}

void JsonlDataset::read_line(const std::string& text, int64_t number) {
  const std::string where = detail::concat(path_, ":", number);
  const json object = parse_json_text(text, where);
  MMSP_CHECK(object.is_object(), where, ": expected a JSON object, got ", object.type_name());
  if (!object.contains("chosen") && !object.contains("rejected")) {
    MMSP_CHECK(samples_.empty() || samples_.back().rollout.preference.pair < 0, where,
               ": a line that is not a preference pair after pairs: a file is all pairs or none");
    samples_.push_back(read_sample(object, where, number));
    return;
  }
  read_pair(object, where, number);
}

JsonlDataset::Sample JsonlDataset::read_sample(const json& object, const std::string& where, int64_t number) const {
  MMSP_CHECK(object.is_object(), where, ": expected a JSON object, got ", object.type_name());
  for (const auto& item : object.items())
    MMSP_CHECK(std::find(kFieldNames.begin(), kFieldNames.end(), item.key()) != kFieldNames.end(), where,
               ": unknown field \"", item.key(), "\" (fields: ", kFields, ")");
  const Line line{LineReader{where, object}, where};
  Sample s;
  s.line = number;
  read_tokens(line, s.sequence);
  read_seconds(line, s.sequence);
  for (const bool video : {false, true}) read_items(line, video, s);
  try {
    plan::parse_sequence(s.sequence, config_.conventions, static_cast<int64_t>(samples_.size()));
  } catch (const Error& e) { MMSP_FAIL(where, ": ", e.what()); }
  s.rollout = read_rollout_values(object, plan::count_labels(s.sequence, config_.conventions), where);
  return s;
}

void JsonlDataset::read_tokens(const Line& line, plan::Sequence& seq) const {
  const std::string& where = line.where;
  const int64_t vocab = config_.text.vocab_size;
  MMSP_CHECK(line.r.find("input_ids") != nullptr, where, ": input_ids is missing");
  seq.input_ids = line.r.integers("input_ids");
  MMSP_CHECK(!seq.input_ids.empty(), where, ": input_ids is empty");
  for (size_t k = 0; k < seq.input_ids.size(); ++k)
    MMSP_CHECK(seq.input_ids[k] >= 0 && seq.input_ids[k] < vocab, where, ": input_ids[", k, "] = ", seq.input_ids[k],
               " is outside the model's vocabulary 0..", vocab - 1);
  if (line.r.find("loss_mask") == nullptr) return;
  seq.loss_mask = line.r.integers("loss_mask");
  MMSP_CHECK(seq.loss_mask.size() == seq.input_ids.size(), where, ": loss_mask has ", seq.loss_mask.size(),
             " entries but input_ids has ", seq.input_ids.size());
  for (size_t k = 0; k < seq.loss_mask.size(); ++k)
    MMSP_CHECK(seq.loss_mask[k] == 0 || seq.loss_mask[k] == 1, where, ": loss_mask[", k, "] = ", seq.loss_mask[k],
               ", expected 0 or 1");
}

void JsonlDataset::read_seconds(const Line& line, plan::Sequence& seq) const {
  const json* v = line.r.find("second_per_grid_ts");
  if (!v) return;
  for (size_t k = 0; k < line.r.array(*v, "second_per_grid_ts").size(); ++k) {
    MMSP_CHECK((*v)[k].is_number() && (*v)[k].get<double>() >= 0 && (*v)[k].get<double>() <= plan::kMaxSecondsPerGrid,
               line.where, ": second_per_grid_ts[", k, "] is ", (*v)[k].dump(),
               ", expected a number of seconds in [0, ", plan::kMaxSecondsPerGrid, "]");
    seq.second_per_grid_ts.push_back((*v)[k].get<double>());
  }
}

// The pixel sources of the line's images (or videos) and their grids: as given, else
// derived from the files by the family's geometry.
void JsonlDataset::read_items(const Line& line, bool video, Sample& s) const {
  const std::string& where = line.where;
  const char* items_key = video ? "videos" : "images";
  const char* grid_key = video ? "video_grid_thw" : "image_grid_thw";
  std::vector<plan::Grid> grids = line.r.grids(grid_key);
  const bool given = line.r.find(grid_key) != nullptr;
  const json* v = line.r.find(items_key);
  if (!v) {
    MMSP_CHECK(grids.empty(), where, ": ", grid_key, " has ", grids.size(), " entries but there is no ", items_key,
               " list to take their pixels from");
    (video ? s.sequence.video_grid_thw : s.sequence.image_grid_thw) = std::move(grids);
    return;
  }
  const json& list = line.r.array(*v, items_key);
  MMSP_CHECK(!video || geometry_->takes_videos(), where, ": videos are not supported by ", config_.model_type,
             " (it has no video placeholder token)");
  MMSP_CHECK(!given || grids.size() == list.size(), where, ": ", grid_key, " has ", grids.size(), " entries but ",
             items_key, " has ", list.size());
  std::vector<Source>& sources = video ? s.videos : s.images;
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string name = detail::concat(video ? "video " : "image ", k);
    const json& item = list[k];
    MMSP_CHECK(item.is_object(), where, ": ", name, " is ", item.dump(), ", expected an object with \"",
               video ? "frames" : "path", "\" or \"safetensors\" and \"tensor\"");
    check_entry_keys(line.r, item, video, name);
    const std::string grid_name = detail::concat(grid_key, "[", k, "]");
    if (item.contains("safetensors")) {
      // A tensor has no pixel size: its grid is the data's, unless the family fixes it.
      const int64_t side = geometry_->fixed_side();
      MMSP_CHECK(given || side > 0, where, ": ", name, " comes from safetensors, so ", grid_key, " must give its grid");
      if (!given) grids.push_back(geometry_->grid_for(1, side, side, name));
      sources.push_back(read_tensor_source(line, item, name, grids[k]));
      continue;
    }
    ItemFiles files = read_files(line, item, video, name);
    const int64_t frames = files.frames;
    if (given) {
      const std::string mismatch = geometry_->grid_mismatch(grids[k], frames, files.width, files.height, name);
      MMSP_CHECK(mismatch.empty(), where, ": ", grid_name, " = ", grid_text(grids[k]), " ", mismatch);
    } else {
      try {
        grids.push_back(geometry_->grid_for(frames, files.width, files.height,
                                            detail::concat(where, ": ", name, " \"", files.source.files[0], "\"")));
      } catch (const Error& e) {
        throw Error(detail::concat(e.what(), "; resize the file or give ", grid_key, " to resize it on load"));
      }
    }
    sources.push_back(std::move(files.source));
  }
  (video ? s.sequence.video_grid_thw : s.sequence.image_grid_thw) = std::move(grids);
}

// A pre-processed tensor: checked against the grid now (header only), read on demand.
JsonlDataset::Source JsonlDataset::read_tensor_source(const Line& line, const json& item, const std::string& name,
                                                      const plan::Grid& grid) const {
  const std::string& where = line.where;
  Source src;
  src.safetensors = resolve(dir_, line.r.path(item["safetensors"], name + " safetensors")).string();
  MMSP_CHECK(item.contains("tensor"), where, ": ", name, " names safetensors file \"", src.safetensors,
             "\" but no \"tensor\"");
  src.tensor = line.r.text(item["tensor"], name + " tensor");
  if (const std::string why = not_a_file(src.safetensors); !why.empty())
    line.r.fail(name, " file \"", src.safetensors, "\" ", why);
  hf::SafetensorsHeader header;
  try {
    header = hf::read_safetensors_header(src.safetensors);
  } catch (const Error& e) { MMSP_FAIL(where, ": ", name, ": ", e.what()); }
  const auto t = header.tensors.find(src.tensor);
  MMSP_CHECK(t != header.tensors.end(), where, ": ", name, ": tensor \"", src.tensor, "\" is not in \"",
             src.safetensors, "\"");
  MMSP_CHECK(at::isFloatingType(t->second.scalar_type), where, ": ", name, ": tensor \"", src.tensor, "\" is ",
             t->second.dtype, ", expected a float dtype (F32, F64, F16, BF16)");
  const std::vector<int64_t> want = geometry_->item_shape(grid);
  // A processor's output for one item may keep its batch dimension of 1 (LLaVA's
  // pixel_values [1, C, S, S]): the same values, taken as they are.
  std::vector<int64_t> batched{1};
  batched.insert(batched.end(), want.begin(), want.end());
  MMSP_CHECK(t->second.shape == want || t->second.shape == batched, where, ": ", name, ": tensor \"", src.tensor,
             "\" has shape ", at::IntArrayRef(t->second.shape), " but grid ", grid_text(grid), " needs ",
             at::IntArrayRef(want), " (", geometry_->item_layout(), "), or ", at::IntArrayRef(batched),
             " as a processor returns one item");
  return src;
}

// Image files: one for an image, the frames of a video; sizes from their headers.
JsonlDataset::ItemFiles JsonlDataset::read_files(const Line& line, const json& item, bool video,
                                                 const std::string& name) const {
  const std::string& where = line.where;
  std::vector<std::string> files;
  if (video && item.contains("path")) return read_video_file(line, item, name);
  if (video) {
    MMSP_CHECK(item.contains("frames") && item["frames"].is_array() && !item["frames"].empty(), where, ": ", name,
               " is ", item.dump(),
               ", expected {\"frames\": [paths...]}, {\"path\": video file, \"frame_indices\": [...]} or "
               "{\"safetensors\": ..., \"tensor\": ...}");
    for (size_t f = 0; f < item["frames"].size(); ++f)
      files.push_back(line.r.path(item["frames"][f], detail::concat(name, " frame ", f, " path")));
  } else {
    MMSP_CHECK(item.contains("path"), where, ": ", name, " is ", item.dump(),
               ", expected {\"path\": ...} or {\"safetensors\": ..., \"tensor\": ...}");
    files.push_back(line.r.path(item["path"], name + " path"));
  }
  const int64_t channels = geometry_->channels();
  MMSP_CHECK(channels == 1 || channels == 3, where, ": ", name,
             " is read from image files, which give 1 (grey) or 3 "
             "(RGB) channels, but the model's vision tower takes ",
             channels,
             "; give its pixels as "
             "{\"safetensors\": ..., \"tensor\": ...}");
  ItemFiles out;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string fname = video ? detail::concat(name, " frame ", f) : name;
    out.source.files.push_back(resolve(dir_, files[f]).string());
    const auto [w, h] = image_size(line.r, fname, out.source.files.back(), max_image_pixels_);
    if (f == 0) out.width = out.source.width = w, out.height = out.source.height = h;
    // A video's frames are one tensor to the video processors (they resize it whole): every
    // frame must have the first one's size, grid or not.
    MMSP_CHECK(w == out.width && h == out.height, where, ": ", fname, " \"", out.source.files.back(), "\" is ", w,
               " x ", h, " but frame 0 is ", out.width, " x ", out.height, "; a video's frames must have one size");
  }
  out.frames = static_cast<int64_t>(out.source.files.size());
  return out;
}

// A video file and the frames to decode from it (mmsp prepare's choice: the processor's
// sampling); its size from the container, nothing decoded.
JsonlDataset::ItemFiles JsonlDataset::read_video_file(const Line& line, const json& item,
                                                      const std::string& name) const {
  const std::string& where = line.where;
  ItemFiles out;
  const std::string file = line.r.path(item["path"], name + " path");
  out.source.files.push_back(resolve(dir_, file).string());
  const std::string& path = out.source.files.back();
  MMSP_CHECK(item.contains("frame_indices") && item["frame_indices"].is_array() && !item["frame_indices"].empty(),
             where, ": ", name, " is the video file \"", file,
             "\" without \"frame_indices\": give the frames to "
             "decode (mmsp prepare writes the ones the processor sampled)");
  for (const json& i : item["frame_indices"]) {
    MMSP_CHECK(i.is_number_integer() && i.get<int64_t>() >= 0, where, ": ", name, " frame_indices holds ", i.dump(),
               "; frame indices are integers >= 0");
    out.source.frame_indices.push_back(i.get<int64_t>());
  }
  if (const std::string why = not_a_file(path); !why.empty()) line.r.fail(name, " file \"", path, "\" ", why);
  const VideoFileHeader h = read_video_header(path);
  if (!h.problem.empty()) line.r.fail(name, " file \"", path, "\" is ", h.problem);
  const int64_t last = *std::max_element(out.source.frame_indices.begin(), out.source.frame_indices.end());
  if (h.frames > 0 && last >= h.frames)
    line.r.fail(name, " frame index ", last, " is past the end of \"", path, "\", whose header counts ", h.frames,
                " frames");
  if (h.width * h.height > max_image_pixels_)
    line.r.fail(name, " file \"", path, "\" has frames of ", h.width, " x ", h.height, " = ", h.width * h.height,
                " pixels, more than --max-image-pixels ", max_image_pixels_);
  out.width = out.source.width = h.width;
  out.height = out.source.height = h.height;
  out.frames = static_cast<int64_t>(out.source.frame_indices.size());
  return out;
}

const JsonlDataset::Sample& JsonlDataset::sample(int64_t index) const {
  MMSP_CHECK(index >= 0 && index < size(), "jsonl dataset \"", path_, "\": sample index ", index, " is outside 0..",
             size() - 1);
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
  const Sample& s = sample(index);
  return detail::concat(path_, ":", s.line, s.side.empty() ? "" : " ", s.side);
}

plan::Sequence JsonlDataset::sequence(int64_t index) const { return sample(index).sequence; }

const RolloutValues* JsonlDataset::rollout(int64_t index) const {
  const Sample& s = sample(index);
  return s.rollout.empty() ? nullptr : &s.rollout;
}

at::Tensor JsonlDataset::pixels(const Sample& s, const Source& src, const plan::Grid& g, bool video,
                                int64_t item) const {
  const std::string where = detail::concat(path_, ":", s.line, ": ", video ? "video " : "image ", item);
  if (!src.safetensors.empty()) {
    std::map<std::string, at::Tensor> tensors = hf::load_safetensors(src.safetensors);
    const auto it = tensors.find(src.tensor);
    MMSP_CHECK(it != tensors.end(), where, ": tensor \"", src.tensor, "\" is no longer in \"", src.safetensors, "\"");
    const std::vector<int64_t> want = geometry_->item_shape(g);
    MMSP_CHECK(it->second.numel() == c10::multiply_integers(want), where, ": tensor \"", src.tensor, "\" in \"",
               src.safetensors, "\" is now ", it->second.sizes(), ", not the ", at::IntArrayRef(want),
               " it was when the data was read");
    at::Tensor values = it->second.to(at::kFloat).reshape(want).contiguous();
    // NaN or Inf would show only as a NaN loss, blamed on a weight: refused, naming the file.
    const at::Tensor finite = values.isfinite();
    MMSP_CHECK(finite.all().item<bool>(), where, ": tensor \"", src.tensor, "\" in \"", src.safetensors,
               "\" holds a NaN or infinite value at element ",
               finite.view({-1}).logical_not().nonzero()[0][0].item<int64_t>(), "; pixel values must be finite");
    return values;
  }
  at::Tensor out;
  if (video) {
    out = video_rows(where, src, g);
  } else {
    const auto [width, height] = geometry_->frame_size(g, src.width, src.height);
    out = geometry_->item_pixels(load_image(where, src.files[0], geometry_->channels(), width, height).unsqueeze(0));
  }
  MMSP_ASSERT(out.sizes() == at::IntArrayRef(geometry_->item_shape(g)), where, ": pixels ", out.sizes(), " for grid ",
              grid_text(g));
  return out;
}

at::Tensor JsonlDataset::image_pixels(int64_t index, int64_t image) const {
  const Sample& s = sample(index);
  MMSP_CHECK(image >= 0 && image < static_cast<int64_t>(s.images.size()), location(index), ": sample ", index, " has ",
             s.images.size(), " images, no image ", image);
  return pixels(s, s.images[image], s.sequence.image_grid_thw[image], false, image);
}

at::Tensor JsonlDataset::video_pixels(int64_t index, int64_t video) const {
  const Sample& s = sample(index);
  MMSP_CHECK(video >= 0 && video < static_cast<int64_t>(s.videos.size()), location(index), ": sample ", index, " has ",
             s.videos.size(), " videos, no video ", video);
  return pixels(s, s.videos[video], s.sequence.video_grid_thw[video], true, video);
}

at::Tensor JsonlDataset::video_pixel_rows(int64_t index, int64_t video, int64_t first, int64_t rows) const {
  const Sample& s = sample(index);
  MMSP_CHECK(video >= 0 && video < static_cast<int64_t>(s.videos.size()), location(index), ": sample ", index, " has ",
             s.videos.size(), " videos, no video ", video);
  const Source& src = s.videos[video];
  const plan::Grid& g = s.sequence.video_grid_thw[video];
  const int64_t per_group = geometry_->video_frames_per_group(), group_rows = geometry_->video_rows_per_group(g);
  const int64_t frames = static_cast<int64_t>(src.frame_indices.empty() ? src.files.size() : src.frame_indices.size());
  MMSP_CHECK(rows > 0 && first >= 0 && first + rows <= geometry_->batch_rows(g), location(index), ": rows ", first,
             "..", first + rows, " of video ", video, " are beyond its ", geometry_->batch_rows(g), " rows");
  if (!src.safetensors.empty() || per_group <= 0 || group_rows <= 0)
    return video_pixels(index, video).narrow(0, first, rows);
  // The temporal groups [g0, g1] the rows fall in, and their frames (the last group's padding,
  // the last frame repeated, is made by the geometry as for the whole video).
  const int64_t g0 = first / group_rows, g1 = (first + rows - 1) / group_rows;
  const int64_t f0 = g0 * per_group, f1 = std::min((g1 + 1) * per_group, frames);
  Source part = src;
  if (src.frame_indices.empty()) {
    part.files.assign(src.files.begin() + f0, src.files.begin() + f1);
  } else {
    part.frame_indices.assign(src.frame_indices.begin() + f0, src.frame_indices.begin() + f1);
  }
  return video_rows(detail::concat(path_, ":", s.line, ": video ", video), part, g)
      .narrow(0, first - g0 * group_rows, rows);
}

// The rows of a video's frames (all of src's, or a share's): decoded, resized to the grid's
// frame size and cut as the family's video processor does.
at::Tensor JsonlDataset::video_rows(const std::string& where, const Source& src, const plan::Grid& g) const {
  const auto [width, height] = geometry_->frame_size(g, src.width, src.height);
  VideoDecodeCounts counts;
  at::Tensor frames = video_frames(where, src.files, src.frame_indices, geometry_->channels(), width, height, counts);
  frames_decoded_ += counts.frames_decoded;
  seeks_ += counts.seeks;
  return geometry_->video_pixels(frames);
}

VideoDecodeCounts JsonlDataset::video_decode_counts() const {
  VideoDecodeCounts c;
  c.frames_decoded = frames_decoded_.load();
  c.seeks = seeks_.load();
  return c;
}

std::string JsonlDataset::describe() const {
  int64_t images = 0, videos = 0, tokens = 0;
  for (const Sample& s : samples_) {
    images += static_cast<int64_t>(s.images.size());
    videos += static_cast<int64_t>(s.videos.size());
    tokens += static_cast<int64_t>(s.sequence.input_ids.size());
  }
  return detail::concat("jsonl: ", path_, ", ", size(), " samples, ", tokens, " tokens, ", images, " images, ", videos,
                        " videos");
}

}  // namespace mmsp::train
