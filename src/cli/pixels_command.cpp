// `mmsp pixels`; see pixels_command.h.
#include "pixels_command.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/data/jsonl_dataset.h"

namespace mmsp::cli {

namespace {

struct PixelsFlags {
  std::string model, data, out;
  int64_t first = 0, count = -1;  // the samples written: [first, first + count)
  int64_t max_image_pixels = int64_t{1} << 24;
};

int run_pixels(const PixelsFlags& f) {
  MMSP_CHECK(f.first >= 0, "--first ", f.first, " must be ≥ 0");
  MMSP_CHECK(f.count >= -1, "--count ", f.count, " must be ≥ 0 (-1: to the end)");
  const train::ResolvedModel model = train::resolve_model(f.model);
  const train::JsonlDataset data(f.data, model.config, f.max_image_pixels);
  const int64_t end = f.count < 0 ? data.size() : std::min(data.size(), f.first + f.count);
  MMSP_CHECK(f.first < data.size() || data.size() == 0, "--first ", f.first, " is beyond the ", data.size(),
             " samples of ", f.data);
  std::map<std::string, at::Tensor> tensors;
  int64_t images = 0, videos = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = f.first; s < end; ++s) {
    const plan::Sequence seq = data.sequence(s);
    const std::string prefix = "sample" + std::to_string(s);
    for (size_t i = 0; i < seq.image_grid_thw.size(); ++i, ++images)
      tensors[prefix + ".image" + std::to_string(i)] = data.image_pixels(s, static_cast<int64_t>(i)).contiguous();
    for (size_t v = 0; v < seq.video_grid_thw.size(); ++v, ++videos)
      tensors[prefix + ".video" + std::to_string(v)] = data.video_pixels(s, static_cast<int64_t>(v)).contiguous();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  hf::save_safetensors(f.out, tensors, {{"format", "pt"}, {"model", f.model}, {"data", f.data}});
  const train::VideoDecodeCounts decoded = data.video_decode_counts();
  std::printf(
      "mmsp pixels: %lld images and %lld videos of samples %lld..%lld of %s written to %s "
      "(pixels made in %.3f s; video files: %lld frames decoded, %lld seeks)\n",
      static_cast<long long>(images), static_cast<long long>(videos), static_cast<long long>(f.first),
      static_cast<long long>(end - 1), data.describe().c_str(), f.out.c_str(), seconds,
      static_cast<long long>(decoded.frames_decoded), static_cast<long long>(decoded.seeks));
  return 0;
}

}  // namespace

Subcommand add_pixels_command(CLI::App& parent) {
  auto f = std::make_shared<PixelsFlags>();
  CLI::App* app = parent.add_subcommand(
      "pixels", "write the pixels mmsp feeds the vision tower for a data file's images (a safetensors file)");
  app->add_option("--model", f->model, "built-in model name, model directory or config.json")->required();
  app->add_option("--data", f->data, "a JSON-lines data file (docs/data.md)")->required();
  app->add_option("--out", f->out, "the safetensors file to write: sample<N>.image<i>, sample<N>.video<j>")->required();
  app->add_option("--first", f->first, "first sample (0-based line of data, blank lines skipped)")
      ->capture_default_str();
  app->add_option("--count", f->count, "samples to write (-1: to the end)")->capture_default_str();
  app->add_option("--max-image-pixels", f->max_image_pixels, "width × height of one image file at most")
      ->capture_default_str();
  return {app, [f]() { return run_pixels(*f); }};
}

}  // namespace mmsp::cli
