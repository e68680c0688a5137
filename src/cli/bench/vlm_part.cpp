// `mmsp bench vision` / `mmsp bench step`: peak memory and bytes of the VLM's vision
// part / whole training step in the three vision modes on 1, 2 and 4 ranks
// (mmsp-run -n 4); and `mmsp bench vision-split`: one large item on one rank, by
// Vision DP, and split over the context group.
#include <memory>

#include "bench_part.h"
#include "vision_split_bench.h"
#include "vlm_bench.h"

namespace mmsp::cli {

void add_vlm_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto vlm = std::make_shared<bench::VlmBenchOptions>();
  CLI::App* vision = bench.add_subcommand(
      "vision", "VLM vision part: peak memory per rank and bytes, routed vs gather vs replicate, 1/2/4 ranks");
  CLI::App* step = bench.add_subcommand(
      "step", "whole VLM training step: peak memory per rank and bytes, three vision modes, 1/2/4 ranks");
  for (CLI::App* sub : {vision, step}) {
    sub->add_option("--images", vlm->images, "images in the batch (one per sequence)");
    sub->add_option("--image-side", vlm->image_side, "patches per image side (even)");
    sub->add_option("--model", vlm->model,
                    "config.json of any supported model_type (default: the built-in Qwen2-VL of docs/model.md)");
    sub->add_option("--image-width", vlm->image_width, "--model: image width in pixels");
    sub->add_option("--image-height", vlm->image_height, "--model: image height in pixels");
    sub->add_option("--repeats", vlm->repeats, "runs of each row; seconds are the fastest run's")
        ->capture_default_str();
    add_out_flag(*sub, out);
    parts.push_back({sub, [vlm, whole_step = sub == step](const dist::RankEnv& env) {
                       vlm->step = whole_step;
                       return bench::bench_vlm(env, *vlm);
                     }});
  }
}

void add_vision_split_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto o = std::make_shared<bench::VisionSplitBenchOptions>();
  CLI::App* app = bench.add_subcommand(
      "vision-split",
      "vision-tower SP: one large item encoded on one rank, by Vision DP, and split over the ranks: "
      "peak memory, bytes against the formula, seconds (run under mmsp-run -n 4)");
  app->add_option("--patches", o->patches,
                  "item sizes in patches (square images up to 128², else videos of 64 × 64 frames)")
      ->capture_default_str();
  app->add_option("--small-items", o->small_items,
                  "small 32 × 32 images beside the first item in the planned mixed batch")
      ->capture_default_str();
  app->add_option("--repeats", o->repeats, "runs of each row; seconds are the fastest run's")->capture_default_str();
  add_out_flag(*app, out);
  parts.push_back({app, [o](const dist::RankEnv& env) { return bench::bench_vision_split(env, *o); }});
}

}  // namespace mmsp::cli
