// `mmsp train`'s own flags (the mesh's are MeshFlags): added to the command in groups,
// then resolved once into train::TrainOptions. Resolving parses the text flags, reads the
// test hooks (hidden flags, and the crash hooks mmsp-run hands on in the environment:
// cli/ is where the environment is read) and sizes --memory-limit for the rank's device.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "mmsp/dist/rank_env.h"
#include "mmsp/train/trainer.h"

namespace mmsp::cli {

struct TrainFlags {
  train::TrainOptions options;
  // Flags given as text, parsed by resolve().
  std::string vision = "routed", layout = "zigzag", placement = "zigzag", vision_split = "auto";
  std::string save_shard_size = "5GB", memory_limit = "auto", checkpointing = "none", tiled_mlp = "off";
  std::string prefetch_pixels = "auto";
  std::string dtype = "float32", save_dtype, shard = "none", attention_kernel = "auto";
  std::string overlap_communication = "on";
  std::string test_sleep, test_skew;      // hidden: "RANK:STEP:SECONDS", "RANK:STEP" (docs/reliability.md)
  std::string freeze;                     // --freeze vision,merger,llm,embeddings
  std::string lora_targets;               // --lora-targets q_proj,v_proj (empty: the default)
  CLI::Option* lora_rank_flag = nullptr;  // given: a rank of 0 is refused (not "no LoRA")
  CLI::Option* lora_alpha_flag = nullptr;
  std::string base_model;  // --base-model DIR: the base of a peft adapter given as --model
  // --objective and its knobs (parse_objective); clip sides < 0: as --clip-ratio.
  std::string objective = "cross-entropy", loss_agg, kl = "k3";
  double clip_ratio = 0.2, clip_low = -1, clip_high = -1;
  CLI::Option* clip_flag = nullptr;
  CLI::Option* clip_c_flag = nullptr;

  void add_to(CLI::App& app);
  // The text flags and test hooks into `options`, checked against each other (before the
  // rank's device is chosen, so that a bad flag is named first).
  void parse();
  // The rank's device into `options`, and --memory-limit auto sized for it: its free
  // memory on CUDA, this host's available memory shared by its ranks on the CPU.
  void place(const dist::RankEnv& env, const c10::Device& device);

 private:
  void add_model_and_data(CLI::App& app);
  void add_schedule(CLI::App& app);
  void add_memory(CLI::App& app);
  void add_run_directory(CLI::App& app);
  void add_finetune(CLI::App& app);
  void add_objective(CLI::App& app);
  void parse_objective();
  void read_test_hooks();
};

}  // namespace mmsp::cli
