// `mmsp plan` in-process: its source compiled into test_model (it reads conventions
// through the model layer's family registry), driven with real files from configs/ and
// examples/.
#include <CLI/CLI.hpp>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../support/json_mutants.h"
#include "mmsp/core/json_read.h"
#include "plan_command.h"
#include "plan_test_util.h"
#include "scratch_dir.h"

namespace mmsp::plan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int status = -1;
  std::string out, err;
};

Result run_plan(std::vector<std::string> args) {
  CLI::App app{"mmsp"};
  auto command = mmsp::cli::add_plan_command(app);
  args.insert(args.begin(), "plan");
  std::vector<const char*> argv{"mmsp"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  std::stringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  Result r;
  r.status = command.run();
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

const std::string kDir = MMSP_SOURCE_DIR;

TEST(PlanCommand, TextSummaryOfTheExample) {
  const Result r = run_plan({"--config", kDir + "/configs/tiny-qwen2-vl.json", "--batch",
                             kDir + "/examples/batch-qwen2-vl.json", "--ring", "2", "--ulysses", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mesh dp 1 x ring 2 x ulysses 2"));
  EXPECT_THAT(r.out, HasSubstr("max/mean"));
  EXPECT_THAT(r.out, HasSubstr("rank 3 (dp 0, ring 1, ulysses 1)"));
  EXPECT_THAT(r.out, HasSubstr("placement, zigzag | adaptive"));
  // The bytes are priced for the model planned (4 heads, 2 K/V heads of 16, 2 layers), not Qwen2-VL-7B's.
  EXPECT_THAT(r.out, HasSubstr("attention bytes per step: H 4, H_kv 2, D 16, 2 bytes, 2 layers)"));
  EXPECT_THAT(r.out, Not(HasSubstr("note: attention bytes priced at")));
}

TEST(PlanCommand, PlacementFlag) {
  const std::vector<std::string> base{"--config",  kDir + "/configs/tiny-qwen2-vl.json",
                                      "--batch",   kDir + "/examples/batch-qwen2-vl.json",
                                      "--ring",    "2",
                                      "--ulysses", "2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return run_plan(args);
  };
  Result r = with({"--placement", "adaptive", "--format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["placement"], "adaptive");
  EXPECT_EQ(j["balance"][0]["padding"].size(), 4u);
  EXPECT_EQ(j["balance"][0]["ring_bytes"].size(), 4u);
  EXPECT_TRUE(j["segments"][0].contains("home"));
  r = with({"--placement", "adaptive"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("placement adaptive"));
  EXPECT_THAT(r.out, HasSubstr("placement, zigzag | adaptive"));
  r = with({"--placement", "dynamic"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mmsp plan: error: placement \"dynamic\" is unknown; use zigzag or adaptive"));
  r = with({"--placement", "adaptive", "--layout", "contiguous"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("placement adaptive splits long segments in zigzag order; it needs layout zigzag"));
}

TEST(PlanCommand, JsonOfOneRank) {
  const Result r =
      run_plan({"--config", kDir + "/configs/tiny-qwen2-vl.json", "--batch", kDir + "/examples/batch-qwen2-vl.json",
                "--ring", "2", "--ulysses", "2", "--rank", "1", "--format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ranks"].size(), 1u);
  EXPECT_EQ(j["ranks"][0]["rank"], 1);
  EXPECT_EQ(j["ranks"][0]["coords"]["ulysses"], 1);
  EXPECT_EQ(j["position_ids"][0].size(), 3u);
  EXPECT_EQ(j["mesh"]["world"], 4);
}

// Every shipped example plans with its tiny config, token ids within its vocabulary.
TEST(PlanCommand, EveryExampleWithItsConfig) {
  for (const char* family : {"qwen2-vl", "qwen2_5-vl", "qwen3-vl", "qwen3_5-vl", "llava"}) {
    const Result r = run_plan({"--config", kDir + "/configs/tiny-" + family + ".json", "--batch",
                               kDir + "/examples/batch-" + family + ".json", "--dp", "2", "--ring", "2", "--ulysses",
                               "2", "--format", "json"});
    ASSERT_EQ(r.status, 0) << family << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ranks"].size(), 8u) << family;
    EXPECT_EQ(j["cu_seqlens"].size(), 2u) << family;
  }
}

TEST(PlanCommand, BadInputsExitTwoWithTheMessage) {
  Result r = run_plan({"--config", kDir + "/configs/tiny-qwen2-vl.json", "--batch",
                       kDir + "/examples/batch-qwen2-vl.json", "--ring", "2", "--world", "3"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mmsp plan: error: world size 3 is not dp(1) × ring(2) × ulysses(1) = 2"));
  r = run_plan({"--config", kDir + "/configs/missing.json", "--batch", kDir + "/examples/batch-qwen2-vl.json"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mmsp plan: error: cannot read --config file"));
  r = run_plan({"--config", kDir + "/configs/tiny-llava.json", "--batch", kDir + "/examples/batch-qwen2-vl.json"});
  EXPECT_EQ(r.status, 2);
  // LLaVA's config against a Qwen2-VL batch: its token ids are outside LLaVA's vocabulary,
  // which is checked (as mmsp train does) before the placeholders.
  EXPECT_THAT(r.err, HasSubstr("sequence 0: input_ids[0] = 101089 is outside the vocabulary 0..32063 of "));
  r = run_plan({"--config", kDir + "/configs/tiny-qwen2-vl.json", "--batch", kDir + "/examples/batch-qwen2-vl.json",
                "--format", "xml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--format \"xml\" is unknown"));
}

std::string write_temp(const std::string& name, const std::string& text) {
  static const std::string dir = mmsp::test::scratch_dir("plan_input_");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Token ids, values that feed positions, loss_mask lengths and config types: exit 2 naming the value.
TEST(PlanCommand, RefusesBadIdsPositionScalesMasksAndConfigTypes) {
  const std::string qwen = kDir + "/configs/tiny-qwen2-vl.json";
  const std::string qwen25 = kDir + "/configs/tiny-qwen2_5-vl.json";
  const struct {
    const char* name;
    std::string config, batch, message;
  } cases[] = {
      {"negative", qwen, R"({"sequences": [{"input_ids": [1, -5, 2]}]})", "input_ids[1] = -5 is not a token id"},
      {"uint64_max", qwen, R"({"sequences": [{"input_ids": [1, 18446744073709551615]}]})",
       "input_ids[1] = 18446744073709551615 is beyond the int64 range"},
      {"vocab", qwen, R"({"sequences": [{"input_ids": [1, 151936]}]})",
       "input_ids[1] = 151936 is outside the vocabulary 0..151935"},
      {"empty_mask", qwen, R"({"sequences": [{"input_ids": [1, 2, 3], "loss_mask": []}]})",
       "loss_mask has 0 entries but input_ids has 3"},
      {"seconds", qwen25,
       R"({"sequences": [{"input_ids": [1, 151652, 151656, 151656, 151653], "video_grid_thw": [[2, 2, 4]],
           "second_per_grid_ts": [1e19]}]})",
       "second_per_grid_ts[0] must be a number of seconds in [0, 10000]"},
  };
  for (const auto& c : cases) {
    const Result r = run_plan({"--config", c.config, "--batch", write_temp(c.name, c.batch)});
    EXPECT_EQ(r.status, 2) << c.name << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.name;
  }
  const std::string batch = kDir + "/examples/batch-qwen2-vl.json";
  Result r = run_plan({"--config", write_temp("type.json", R"({"model_type": 7})"), "--batch", batch});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("config.json: model_type must be a string (qwen2_vl"));
  EXPECT_THAT(r.err, HasSubstr("got 7"));
  r = run_plan({"--config",
                write_temp("tps.json", R"({"model_type": "qwen2_5_vl", "vision_config": {"tokens_per_second": 1e19}})"),
                "--batch", batch});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("vision_config.tokens_per_second must be a number in [0, 10000]"));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `mmsp plan` on mutants of batch.json and of config.json: every one ends with exit 0
// or exit 2 and a message; never a signal, another exception or a hang.
TEST(PlanCommand, MutatedBatchAndConfigFilesExitZeroOrTwo) {
  char name[] = "/tmp/mmsp-plan-mutants-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const std::string dir = name, file = dir + "/mutant.json";
  const std::string config = kDir + "/configs/tiny-qwen2-vl.json", batch = kDir + "/examples/batch-qwen2-vl.json";
  for (const bool mutate_batch : {true, false}) {
    const test::MutantReport r =
        test::check_mutants(slurp(mutate_batch ? batch : config), mutate_batch ? 3 : 5, 400, [&](const std::string& m) {
          std::ofstream(file, std::ios::binary | std::ios::trunc) << m;
          const Result res = run_plan({"--config", mutate_batch ? config : file, "--batch", mutate_batch ? file : batch,
                                       "--ring", "2", "--ulysses", "2"});
          MMSP_CHECK(res.status == 0, "exit ", res.status);  // counted as refused
          if (res.status != 0 && res.status != 2) throw std::runtime_error("exit status " + std::to_string(res.status));
        });
    std::printf("mmsp plan, mutated %s: %d mutants, %d planned, %d refused (exit 2), %.2f s\n",
                mutate_batch ? "batch.json" : "config.json", r.mutants, r.accepted, r.refused, r.seconds);
    EXPECT_TRUE(r.failures.empty()) << r.failures.size() << " failures, first: " << r.failures.front();
    EXPECT_LT(r.seconds, 30.0);
  }
  std::remove(file.c_str());
  ::rmdir(dir.c_str());
}

TEST(PlanCommand, DuplicateKeysDeepNestingAndTokenIdsAreRefused) {
  char name[] = "/tmp/mmsp-plan-bad-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const std::string dir = name, config = kDir + "/configs/tiny-qwen2-vl.json";
  auto write = [&](const std::string& file, const std::string& text) {
    std::ofstream(dir + "/" + file) << text;
    return dir + "/" + file;
  };
  Result r = run_plan({"--config", config, "--batch",
                       write("dup.json", R"({"sequences": [{"input_ids": [1, 2], "input_ids": [3]}]})")});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("dup.json: the key \"input_ids\" appears twice in one object"));
  r = run_plan({"--config", config, "--batch",
                write("deep.json", R"({"sequences": [{"input_ids": [1, 2, )" + std::string(1000000, '[') + "}]}")});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("deep.json: JSON nests deeper than 64 levels"));
  // token ids against the config's vocab_size
  const std::string ids = write("ids.json", R"({"sequences": [{"input_ids": [1, 2, 151936]}]})");
  r = run_plan({"--config", config, "--batch", ids});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ids.json: sequence 0: input_ids[2] = 151936 is outside the vocabulary 0..151935"));
  std::filesystem::remove_all(dir);
}

// A config with only what planning reads plans: transformers' defaults for the rest
// (Qwen2-VL's text hidden size 8192 against its vision merger's 3584; LLaVA's vocab_size
// 32000, which equals its image_token_index) are not checked as if they had been read.
// A declared vocabulary still bounds the config's own token ids.
TEST(PlanCommand, AConfigWithOnlyWhatPlanningUsesPlans) {
  char name[] = "/tmp/mmsp-plan-min-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const std::string dir = name;
  auto write = [&](const std::string& file, const std::string& text) {
    std::ofstream(dir + "/" + file) << text;
    return dir + "/" + file;
  };
  const std::string qwen = write("qwen.json", R"({"model_type": "qwen2_vl", "image_token_id": 151655,
      "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
      "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vision_config": {"spatial_merge_size": 2}})");
  const std::string qwen_batch = write("qb.json", R"({"sequences": [{"input_ids": [1, 151652, 151655, 151653, 2],
      "image_grid_thw": [[1, 2, 2]]}]})");
  Result r = run_plan({"--config", qwen, "--batch", qwen_batch, "--ring", "2"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 1"));
  const std::string llava = write("llava.json", R"({"model_type": "llava", "image_token_index": 32000})");
  const std::string llava_batch = write("lb.json", R"({"sequences": [{"input_ids": [1, 32000, 32000, 32000, 32000, 2],
      "image_grid_thw": [[1, 2, 2]]}]})");
  r = run_plan({"--config", llava, "--batch", llava_batch});
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string small = write("small.json", R"({"model_type": "llava", "image_token_index": 32000,
      "text_config": {"vocab_size": 1000}})");
  r = run_plan({"--config", small, "--batch", llava_batch});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(
      r.err,
      HasSubstr("small.json: the image token id 32000 is outside the vocabulary 0..999 that vocab_size declares"));
  std::filesystem::remove_all(dir);
}

// A config the planner reads but the model refuses (mrope_section against head_dim) still
// plans; its bytes are priced at the default shape, and the note says why.
TEST(PlanCommand, AConfigTheModelRefusesIsPricedAtTheDefaultShapeWithANote) {
  std::ifstream in(kDir + "/configs/tiny-qwen2-vl.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"mrope_section\": [2, 3, 3]";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"mrope_section\": [2, 3, 4]");
  const Result r = run_plan(
      {"--config", write_temp("mrope.json", text), "--batch", kDir + "/examples/batch-qwen2-vl.json", "--ring", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("note: attention bytes priced at Qwen2-VL-7B's shape: "));
  EXPECT_THAT(r.out, HasSubstr("mrope_section [2, 3, 4] sums to 9"));
  EXPECT_THAT(r.out, HasSubstr("H 28, H_kv 4, D 128, 2 bytes, 28 layers"));
}

}  // namespace
}  // namespace mmsp::plan
