// Hugging Face directories: hub's shard plan worked out by hand, save -> open -> load
// bitwise for every float dtype (files, index text and shard bytes as transformers
// writes them), dtype conversion across load pieces, every malformed directory as an
// mmsp::Error with its text, tied embeddings, and each tiny model's own and
// released/legacy naming. Real files in the gtest temp dir, real tensors.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/json_mutants.h"
#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/peft_adapter.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/family.h"
#include "mmsp/model/peft_naming.h"
#include "mmsp/model/vlm.h"
#include "scratch_dir.h"

namespace mmsp::model {
namespace {

using ::testing::HasSubstr;
using Named = std::vector<std::pair<std::string, at::Tensor>>;
using Plan = std::vector<std::vector<size_t>>;

std::string temp_dir() { return mmsp::test::scratch_dir("hf_"); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

using test::error_of;

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

const char* kConfig = R"({"model_type": "test", "hidden_size": 8})";

// ---- the shard plan ----

TEST(HfDirectory, PlanShardsAsHubSplitsThem) {
  EXPECT_EQ(hf::plan_hf_shards({}, 10), Plan{});
  EXPECT_EQ(hf::plan_hf_shards({1, 2, 3}, 10), (Plan{{0, 1, 2}}));    // all fit one
  EXPECT_EQ(hf::plan_hf_shards({4, 6, 5}, 10), (Plan{{0, 1}, {2}}));  // 4 + 6 is exactly the limit
  EXPECT_EQ(hf::plan_hf_shards({10}, 10), (Plan{{0}}));               // at the limit is not over it
  // hub's docstring: [6, 6, 2, 6, 2, 2] under 10 -> [6], [6+2], [6+2+2]
  EXPECT_EQ(hf::plan_hf_shards({6, 6, 2, 6, 2, 2}, 10), (Plan{{0}, {1, 2}, {3, 4, 5}}));
  // 12 > 10 in the middle is appended at once, before the shard in progress [3, 4]
  // closes; that shard then takes 2 more and closes when 5 does not fit.
  EXPECT_EQ(hf::plan_hf_shards({3, 4, 12, 2, 5}, 10), (Plan{{2}, {0, 1, 3}, {4}}));
  // oversized first and last, zero-size tensors ride along
  EXPECT_EQ(hf::plan_hf_shards({11, 0, 5, 5, 0, 11}, 10), (Plan{{0}, {5}, {1, 2, 3, 4}}));
}

// ---- save -> open -> load ----

// a.weight [4,8], b.bias [8], c.weight [8,8], d [3,3]: 32, 8, 64, 9 elements. Under a
// limit of 50 elements hub plans [c] (over the limit, its own shard at once), then
// [a, b, d] (32 + 8 + 9 = 49).
Named sample_tensors(at::ScalarType type, int seed) {
  at::manual_seed(seed);
  return {{"d", at::randn({3, 3}).to(type)},
          {"a.weight", at::randn({4, 8}).to(type)},
          {"c.weight", at::randn({8, 8}).to(type)},
          {"b.bias", at::randn({8}).to(type)}};
}

Named zeros_like(const Named& tensors, std::optional<at::ScalarType> type = std::nullopt) {
  Named out;
  for (const auto& [name, t] : tensors)
    out.emplace_back(name, at::zeros(t.sizes(), t.options().dtype(type.value_or(t.scalar_type()))));
  return out;
}

std::map<std::string, at::Tensor> subset(const Named& tensors, const std::vector<std::string>& names) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : tensors)
    if (std::find(names.begin(), names.end(), name) != names.end()) out.emplace(name, t);
  return out;
}

class HfDirectoryRoundTrip : public testing::TestWithParam<at::ScalarType> {};

TEST_P(HfDirectoryRoundTrip, ShardedSaveOpenLoadIsBitwise) {
  const at::ScalarType type = GetParam();
  const Named tensors = sample_tensors(type, 1);
  const std::string dir = temp_dir() + "/out";
  hf::HfSaveOptions options;
  options.max_shard_bytes = 50 * c10::elementSize(type);
  uint64_t progressed = 0;
  options.progress = [&](uint64_t n) { progressed += n; };
  hf::save_hf_directory(dir, tensors, kConfig, options);

  const std::string first = "model-00001-of-00002.safetensors", second = "model-00002-of-00002.safetensors";
  EXPECT_FALSE(exists(dir + "/model.safetensors"));
  EXPECT_EQ(slurp(dir + "/" + first), hf::serialize_safetensors(subset(tensors, {"c.weight"}), {{"format", "pt"}}));
  EXPECT_EQ(slurp(dir + "/" + second),
            hf::serialize_safetensors(subset(tensors, {"a.weight", "b.bias", "d"}), {{"format", "pt"}}));
  const uint64_t bytes = 113 * c10::elementSize(type);
  const std::string index = slurp(dir + "/model.safetensors.index.json");
  EXPECT_EQ(index,
            "{\n  \"metadata\": {\n    \"total_parameters\": 113,\n    \"total_size\": " + std::to_string(bytes) +
                "\n  },\n  \"weight_map\": {\n"
                "    \"a.weight\": \"model-00002-of-00002.safetensors\",\n"
                "    \"b.bias\": \"model-00002-of-00002.safetensors\",\n"
                "    \"c.weight\": \"model-00001-of-00002.safetensors\",\n"
                "    \"d\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  const std::string config = slurp(dir + "/config.json");
  const char* dtype_name = type == at::kFloat      ? "float32"
                           : type == at::kDouble   ? "float64"
                           : type == at::kBFloat16 ? "bfloat16"
                                                   : "float16";
  EXPECT_EQ(config, std::string("{\n  \"hidden_size\": 8,\n  \"model_type\": \"test\",\n  \"torch_dtype\": \"") +
                        dtype_name + "\"\n}\n");
  EXPECT_EQ(progressed, config.size() + index.size() + slurp(dir + "/" + first).size() +
                            slurp(dir + "/" + second).size() + slurp(dir + "/checksums.json").size());
  EXPECT_FALSE(exists(dir + "/" + first + ".tmp"));

  const hf::HfDirectory opened = hf::open_hf_directory(dir);
  EXPECT_TRUE(opened.checksums_verified);
  EXPECT_TRUE(opened.indexed);
  EXPECT_EQ(opened.files, (std::vector<std::string>{first, second}));
  EXPECT_EQ(opened.total_bytes, bytes);
  EXPECT_EQ(opened.dominant_dtype(), type);
  EXPECT_EQ(opened.config_json, config);
  EXPECT_EQ(opened.tensors.at("c.weight").file, first);
  const Named params = zeros_like(tensors);
  hf::load_hf_weights(opened, params, {});
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(params[i].second, tensors[i].second)) << params[i].first;
}

TEST_P(HfDirectoryRoundTrip, SingleFileSaveOpenLoadIsBitwise) {
  const at::ScalarType type = GetParam();
  const Named tensors = sample_tensors(type, 2);
  const std::string dir = temp_dir();  // exists and is empty: allowed
  hf::save_hf_directory(dir, tensors, kConfig);
  EXPECT_FALSE(exists(dir + "/model.safetensors.index.json"));
  std::map<std::string, at::Tensor> all(tensors.begin(), tensors.end());
  EXPECT_EQ(slurp(dir + "/model.safetensors"), hf::serialize_safetensors(all, {{"format", "pt"}}));
  const hf::HfDirectory opened = hf::open_hf_directory(dir);
  EXPECT_FALSE(opened.indexed);
  EXPECT_EQ(opened.files, std::vector<std::string>{"model.safetensors"});
  const Named params = zeros_like(tensors);
  hf::load_hf_weights(opened, params, {});
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(params[i].second, tensors[i].second)) << params[i].first;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HfDirectoryRoundTrip,
                         testing::Values(at::kFloat, at::kDouble, at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(HfDirectory, SaveConvertsToTheRequestedDtypeAndNamesIt) {
  const Named tensors = sample_tensors(at::kFloat, 3);
  const std::string dir = temp_dir() + "/bf16";
  hf::HfSaveOptions options;
  options.dtype = at::kBFloat16;
  hf::save_hf_directory(dir, tensors, kConfig, options);
  EXPECT_THAT(slurp(dir + "/config.json"), HasSubstr("\"torch_dtype\": \"bfloat16\""));
  const hf::HfDirectory opened = hf::open_hf_directory(dir);
  EXPECT_EQ(opened.tensors.at("d").entry.dtype, "BF16");
  const Named params = zeros_like(tensors);  // fp32 parameters from a bf16 file
  hf::load_hf_weights(opened, params, {});
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(params[i].second.equal(tensors[i].second.to(at::kBFloat16).to(at::kFloat)));
}

TEST(HfDirectory, SaveWithoutDtypeNamesTheDtypeHoldingMostBytes) {
  const Named mixed = {
      {"big", at::ones({64}, at::kBFloat16)}, {"small", at::ones({8}, at::kFloat)}, {"ids", at::arange(100)}};
  const std::string dir = temp_dir() + "/mixed";
  hf::save_hf_directory(dir, mixed, kConfig);
  EXPECT_THAT(slurp(dir + "/config.json"), HasSubstr("\"torch_dtype\": \"bfloat16\""));
}

TEST(HfDirectory, SaveWithNoTensorsWritesAnEmptyFile) {
  const std::string dir = temp_dir() + "/empty";
  hf::save_hf_directory(dir, {}, kConfig);
  const hf::HfDirectory opened = hf::open_hf_directory(dir);
  EXPECT_TRUE(opened.tensors.empty());
  EXPECT_EQ(opened.files, std::vector<std::string>{"model.safetensors"});
}

TEST(HfDirectory, SaveRefusesANonEmptyDirectory) {
  const std::string dir = temp_dir();
  write_text(dir + "/notes.txt", "mine");
  EXPECT_THAT(error_of([&] { hf::save_hf_directory(dir, sample_tensors(at::kFloat, 4), kConfig); }),
              HasSubstr(dir + ": exists and is not empty"));
  EXPECT_FALSE(exists(dir + "/config.json"));
  EXPECT_FALSE(exists(dir + "/model.safetensors"));
}

// ---- dtype conversion on load ----

TEST(HfDirectory, LoadConvertsDtypes) {
  const Named bf16 = sample_tensors(at::kBFloat16, 5);
  const std::string bf16_dir = temp_dir() + "/bf16";
  hf::save_hf_directory(bf16_dir, bf16, kConfig);
  const Named fp32_params = zeros_like(bf16, at::kFloat);
  hf::load_hf_weights(hf::open_hf_directory(bf16_dir), fp32_params, {});
  for (size_t i = 0; i < bf16.size(); ++i)
    EXPECT_TRUE(fp32_params[i].second.equal(bf16[i].second.to(at::kFloat))) << bf16[i].first;

  const Named fp32 = sample_tensors(at::kFloat, 6);
  const std::string fp32_dir = temp_dir() + "/fp32";
  hf::save_hf_directory(fp32_dir, fp32, kConfig);
  const Named bf16_params = zeros_like(fp32, at::kBFloat16);
  hf::load_hf_weights(hf::open_hf_directory(fp32_dir), bf16_params, {});
  for (size_t i = 0; i < fp32.size(); ++i)
    EXPECT_TRUE(bf16_params[i].second.equal(fp32[i].second.to(at::kBFloat16))) << fp32[i].first;
}

TEST(HfDirectory, LoadConvertsATensorLargerThanOnePiece) {
  // One full piece of bf16 and a partial one: 8 Mi + 1000 elements (16 MiB + 2000 bytes).
  const int64_t piece = static_cast<int64_t>(hf::kHfLoadPieceBytes / 2);
  at::manual_seed(7);
  const Named big = {{"w", at::randn({piece + 1000}).to(at::kBFloat16)}};
  const std::string dir = temp_dir() + "/big";
  hf::save_hf_directory(dir, big, kConfig);
  const Named params = zeros_like(big, at::kFloat);
  hf::load_hf_weights(hf::open_hf_directory(dir), params, {});
  EXPECT_TRUE(params[0].second.equal(big[0].second.to(at::kFloat)));
}

// ---- malformed directories ----

// A directory written by hand: config.json, shard files, and the index text if given.
std::string hand_made(const std::map<std::string, std::map<std::string, at::Tensor>>& files,
                      const std::string& index = "") {
  const std::string dir = temp_dir();
  write_text(dir + "/config.json", kConfig);
  for (const auto& [file, tensors] : files) hf::save_safetensors(dir + "/" + file, tensors, {{"format", "pt"}});
  if (!index.empty()) write_text(dir + "/model.safetensors.index.json", index);
  return dir;
}

std::string open_error(const std::string& dir) {
  return error_of([&] { hf::open_hf_directory(dir); });
}

const at::Tensor kFour = at::ones({4});  // 16 bytes of F32

TEST(HfDirectoryErrors, MissingShardFile) {
  const std::string dir =
      hand_made({{"s1.safetensors", {{"a", kFour}}}},
                R"({"metadata": {"total_size": 32}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(open_error(dir), HasSubstr(dir + ": shard file s2.safetensors is missing"));
}

TEST(HfDirectoryErrors, ANameInTwoShards) {
  const std::string dir =
      hand_made({{"s1.safetensors", {{"a", kFour}}}, {"s2.safetensors", {{"a", kFour}, {"b", kFour}}}},
                R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(open_error(dir), HasSubstr(dir + ": tensor \"a\" is in two shards, s1.safetensors and s2.safetensors"));
}

TEST(HfDirectoryErrors, IndexListsATensorItsShardLacks) {
  const std::string dir = hand_made({{"s1.safetensors", {{"a", kFour}}}},
                                    R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  EXPECT_THAT(
      open_error(dir),
      HasSubstr("model.safetensors.index.json lists tensor \"ghost\" in s1.safetensors, which does not hold it"));
}

TEST(HfDirectoryErrors, ShardHoldsATensorTheIndexDoesNotList) {
  const std::string dir =
      hand_made({{"s1.safetensors", {{"a", kFour}, {"extra", kFour}}}}, R"({"weight_map": {"a": "s1.safetensors"}})");
  EXPECT_THAT(open_error(dir),
              HasSubstr("s1.safetensors holds tensor \"extra\", which model.safetensors.index.json does not list"));
}

TEST(HfDirectoryErrors, IndexTotalSizeWrong) {
  const std::string dir =
      hand_made({{"s1.safetensors", {{"a", kFour}}}, {"s2.safetensors", {{"b", kFour}}}},
                R"({"metadata": {"total_size": 31}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(open_error(dir), HasSubstr("metadata.total_size is 31 but the shards' tensors hold 32 bytes"));
}

TEST(HfDirectoryErrors, UnsupportedDtype) {
  const std::string dir = hand_made({{"model.safetensors", {{"a", kFour}, {"position_ids", at::arange(4)}}}});
  EXPECT_THAT(open_error(dir), HasSubstr(dir + "/model.safetensors: tensor \"position_ids\" has dtype I64; "
                                               "a model loads from F32, F16, BF16 or F64 only"));
}

TEST(HfDirectoryErrors, NoWeightsFileNoConfig) {
  const std::string dir = hand_made({});
  EXPECT_THAT(open_error(dir), HasSubstr(dir + ": has neither model.safetensors.index.json nor model.safetensors"));
  const std::string bare = temp_dir();
  EXPECT_THAT(open_error(bare), HasSubstr(bare + ": has no config.json"));
  EXPECT_FALSE(hf::is_hf_directory(bare));
  EXPECT_TRUE(hf::is_hf_directory(dir));
}

TEST(HfDirectoryErrors, MalformedIndex) {
  const std::map<std::string, std::map<std::string, at::Tensor>> one = {{"s1.safetensors", {{"a", kFour}}}};
  EXPECT_THAT(open_error(hand_made(one, "{\"weight_map\": {")),
              HasSubstr("model.safetensors.index.json: not valid JSON: "));
  EXPECT_THAT(open_error(hand_made(one, "[1, 2]")), HasSubstr("must be a JSON object"));
  EXPECT_THAT(open_error(hand_made(one, R"({"weight_map": ["a"]})")), HasSubstr("\"weight_map\" must be an object"));
  EXPECT_THAT(open_error(hand_made(one, R"({"metadata": {}})")), HasSubstr("has no \"weight_map\""));
  EXPECT_THAT(open_error(hand_made(one, R"({"weight_map": {"a": 3}})")),
              HasSubstr("weight_map[\"a\"] must be a shard file name (string), got 3"));
  EXPECT_THAT(
      open_error(hand_made(one, R"({"metadata": {"total_size": "16"}, "weight_map": {"a": "s1.safetensors"}})")),
      HasSubstr("metadata.total_size must be an integer"));
  EXPECT_THAT(open_error(hand_made(one, R"({"weight_map": {"a": "../s1.safetensors"}})")),
              HasSubstr("names the shard file \"../s1.safetensors\"; a shard must be a plain file name"));
  EXPECT_THAT(open_error(hand_made(one, R"({"weight_map": {"a": ".."}})")), HasSubstr("plain file name"));
}

TEST(HfDirectoryErrors, MatchListsMissingUnexpectedAndMisshapedAndWritesNothing) {
  const std::string dir = hand_made({{"model.safetensors", {{"a", kFour}, {"b", kFour}, {"stray", kFour}}}});
  const hf::HfDirectory opened = hf::open_hf_directory(dir);
  const Named params = {{"a", at::full({4}, 7.0)}, {"b", at::full({2, 2}, 7.0)}, {"c", at::full({4}, 7.0)}};
  const std::string error = error_of([&] { hf::load_hf_weights(opened, params, {}); });
  EXPECT_THAT(error, HasSubstr(dir + ": the weights do not match the model"));
  EXPECT_THAT(error, HasSubstr("1 missing from the files, e.g. \"c\" [4]"));
  EXPECT_THAT(error, HasSubstr("1 unexpected (the model has no such parameter), e.g. \"stray\" in model.safetensors"));
  EXPECT_THAT(error,
              HasSubstr("1 with the wrong shape, e.g. \"b\" is [4] in model.safetensors, the model's \"b\" is [2,2]"));
  for (const auto& [name, p] : params) EXPECT_TRUE(p.eq(7).all().item<bool>()) << name << " was written";
}

TEST(HfDirectoryErrors, MatchListsTheFirstFiveAndTheCount) {
  const std::string dir = hand_made({{"model.safetensors", {{"a", kFour}}}});
  hf::ExpectedShapes expected = {{"a", {4}}};
  for (int i = 0; i < 12; ++i) expected.emplace_back("m" + std::to_string(i), std::vector<int64_t>{1});
  const std::string error = error_of([&] { hf::match_hf_tensors(hf::open_hf_directory(dir), expected, {}); });
  EXPECT_THAT(
      error,
      HasSubstr("12 missing from the files, e.g. \"m0\" [1], \"m1\" [1], \"m2\" [1], \"m3\" [1], \"m4\" [1], ..."));
}

// ---- tied embeddings ----

TEST(HfDirectory, TiedEmbeddings) {
  hf::CheckpointNaming tied;
  tied.tied_output = "lm_head.weight";
  tied.tied_input = "model.embed_tokens.weight";
  const at::Tensor embed = at::arange(8, at::kFloat).reshape({2, 4});
  const at::Tensor head = -embed;
  auto load_embed = [&](const std::map<std::string, at::Tensor>& file) {
    const Named params = {{"model.embed_tokens.weight", at::zeros({2, 4})}};
    hf::load_hf_weights(hf::open_hf_directory(hand_made({{"model.safetensors", file}})), params, tied);
    return params[0].second;
  };
  EXPECT_TRUE(load_embed({{"model.embed_tokens.weight", embed}}).equal(embed));  // no lm_head
  EXPECT_TRUE(load_embed({{"model.embed_tokens.weight", embed}, {"lm_head.weight", head}}).equal(embed));
  EXPECT_TRUE(load_embed({{"lm_head.weight", head}}).equal(head));  // only the output: feeds the embedding
  // untied, the same lm_head is a tensor the model lacks
  EXPECT_THAT(error_of([&] {
                hf::load_hf_weights(
                    hf::open_hf_directory(hand_made(
                        {{"model.safetensors", {{"model.embed_tokens.weight", embed}, {"lm_head.weight", head}}}})),
                    {{"model.embed_tokens.weight", at::zeros({2, 4})}}, {});
              }),
              HasSubstr("1 unexpected"));
}

// ---- each family's naming, on the tiny models ----

// The tiny config with a small vocabulary (and special token ids inside it), so each
// model's files stay small.
nlohmann::json tiny_config(const std::string& file, bool tied = false) {
  nlohmann::json j = nlohmann::json::parse(slurp(std::string(MMSP_SOURCE_DIR) + "/configs/" + file));
  int64_t next_id = 200;
  auto shrink = [&](nlohmann::json& o) {
    for (auto& [key, value] : o.items()) {
      const bool id =
          key.size() > 8 && (key.rfind("token_id") == key.size() - 8 || key.rfind("_index") == key.size() - 6);
      if (id && value.is_number_integer()) value = next_id++;
      if (id && value.is_array())
        for (auto& v : value) v = next_id++;
      if (key == "vocab_size") value = 256;
    }
  };
  if (j.value("model_type", "") == "internvl") {  // <img>, </img>: InternVL3's ids unless set
    j["image_start_token_id"] = 0;
    j["image_end_token_id"] = 0;
  }
  shrink(j);
  if (j.contains("text_config")) shrink(j["text_config"]);
  if (tied) j["tie_word_embeddings"] = true;
  return j;
}

std::shared_ptr<torch::nn::Module> build(const ModelConfig& config) { return build_vlm(config); }

Named parameters_of(const torch::nn::Module& m) {
  Named out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// The model's names rewritten by the first matching (from, to) prefix pair.
Named renamed(const Named& tensors, const std::vector<std::pair<std::string, std::string>>& rules) {
  Named out;
  for (const auto& [name, t] : tensors) {
    std::string n = name;
    for (const auto& [from, to] : rules)
      if (name.rfind(from, 0) == 0) {
        n = to + name.substr(from.size());
        break;
      }
    out.emplace_back(n, t);
  }
  return out;
}

struct FamilyCase {
  std::string config_file;
  // from mmsp's names to the family's other layout (released or legacy)
  std::vector<std::pair<std::string, std::string>> other_layout;
};

void PrintTo(const FamilyCase& c, std::ostream* out) { *out << c.config_file; }

class HfDirectoryNaming : public testing::TestWithParam<FamilyCase> {};

void expect_loads(const std::string& dir, const ModelConfig& config, const Named& source) {
  auto fresh = build(config);
  const Named params = parameters_of(*fresh);
  for (const auto& [name, p] : params) {
    at::NoGradGuard no_grad;
    p.zero_();
  }
  hf::load_hf_weights(hf::open_hf_directory(dir), params, checkpoint_naming(config));
  ASSERT_EQ(params.size(), source.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].second.equal(source[i].second)) << params[i].first;
}

TEST_P(HfDirectoryNaming, OwnAndOtherLayoutLoad) {
  const FamilyCase& c = GetParam();
  const nlohmann::json json = tiny_config(c.config_file);
  const ModelConfig config = parse_model_config(json, c.config_file);
  const auto model = build(config);
  const Named own = parameters_of(*model);

  const std::string own_dir = temp_dir() + "/own";
  hf::save_hf_directory(own_dir, own, json.dump());
  expect_loads(own_dir, config, own);

  Named other = renamed(own, c.other_layout);
  if (config.model_type == "qwen3_5" || config.model_type == "qwen3_5_moe")
    other.emplace_back("mtp.fc.weight", at::ones({4, 4}));  // dropped
  const std::string other_dir = temp_dir() + "/other";
  hf::HfSaveOptions sharded;
  sharded.max_shard_bytes = 4096;
  hf::save_hf_directory(other_dir, other, json.dump(), sharded);
  EXPECT_TRUE(hf::open_hf_directory(other_dir).indexed);
  expect_loads(other_dir, config, own);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, HfDirectoryNaming,
    testing::Values(
        // Qwen2-VL files are legacy (visual.*, model.*); the other layout is transformers' new one.
        FamilyCase{"tiny-qwen2-vl.json", {{"visual.", "model.visual."}, {"model.", "model.language_model."}}},
        // Qwen3-VL / Qwen3.5 files are new; the other layout is the legacy one.
        FamilyCase{"tiny-qwen3-vl.json", {{"model.visual.", "visual."}, {"model.language_model.", "model."}}},
        FamilyCase{"tiny-qwen3_5-vl.json", {{"model.visual.", "visual."}, {"model.language_model.", "model."}}},
        FamilyCase{"tiny-qwen3-vl-moe.json", {{"model.visual.", "visual."}, {"model.language_model.", "model."}}},
        FamilyCase{"tiny-qwen3_5-moe.json", {{"model.visual.", "visual."}, {"model.language_model.", "model."}}},
        // llava-1.5-*-hf files are legacy; the other layout is transformers >= 4.52's.
        FamilyCase{"tiny-llava.json",
                   {{"language_model.model.", "model.language_model."},
                    {"vision_tower.", "model.vision_tower."},
                    {"multi_modal_projector.", "model.multi_modal_projector."},
                    {"language_model.lm_head.", "lm_head."}}},
        // InternVL3-*-hf files: LLaVA's layout, and transformers >= 4.52's the same way.
        FamilyCase{"tiny-internvl.json",
                   {{"language_model.model.", "model.language_model."},
                    {"vision_tower.", "model.vision_tower."},
                    {"multi_modal_projector.", "model.multi_modal_projector."},
                    {"language_model.lm_head.", "lm_head."}}}),
    [](const auto& info) {
      std::string name = info.param.config_file.substr(5, info.param.config_file.size() - 10);
      for (char& ch : name)
        if (ch == '-' || ch == '.') ch = '_';
      return name;
    });

// ---- mixture-of-experts layouts, and expert parallelism's share of them ----

// Each tensor as `f` has it (the expert tensors of a fused layout transposed: what
// transformers >= 5 writes for Qwen3-VL-MoE).
Named transposed_experts(const Named& tensors) {
  Named out;
  for (const auto& [name, t] : tensors)
    out.emplace_back(name, name.find(".mlp.experts.") != std::string::npos ? t.transpose(1, 2).contiguous() : t);
  return out;
}

// A rank's model under expert parallelism reads its experts from the whole model's files
// (the released layout, and transformers 5's transposed one for the fused experts): its
// block's rows of each fused tensor, its block's experts of the per-expert layout (the
// others skipped, not unexpected), everything else whole.
TEST(HfDirectory, ExpertsLoadInEveryLayoutAndAsARanksShare) {
  for (const std::string file : {"tiny-qwen3-vl-moe.json", "tiny-qwen3_5-moe.json"}) {
    const nlohmann::json json = tiny_config(file);
    const ModelConfig config = parse_model_config(json, file);
    const Named own = parameters_of(*build(config));
    const std::string dir = temp_dir() + "/own";
    hf::save_hf_directory(dir, own, json.dump());
    std::vector<std::string> dirs = {dir};
    if (config.text.moe.layout == ExpertLayout::fused) {
      dirs.push_back(temp_dir() + "/transformers5");
      hf::save_hf_directory(dirs.back(), transposed_experts(own), json.dump());
      expect_loads(dirs.back(), config, own);
    }
    std::map<std::string, at::Tensor> whole(own.begin(), own.end());
    ModelConfig shard = config;
    set_expert_shard(shard.text.moe, 4, 1);  // experts 2 and 3 of 8
    for (const std::string& from : dirs) {
      const Named params = parameters_of(*build(shard));
      hf::load_hf_weights(hf::open_hf_directory(from), params, checkpoint_naming(shard));
      int experts = 0;
      for (const auto& [name, p] : params) {
        at::Tensor want = whole.at(name);
        if (name.find(".mlp.experts.gate_up_proj") != std::string::npos ||
            name.find(".mlp.experts.down_proj") != std::string::npos)
          want = want.narrow(0, 2, 2);
        experts += name.find(".mlp.experts.") != std::string::npos;
        EXPECT_TRUE(p.equal(want)) << file << " from " << from << ": " << name;
      }
      EXPECT_GT(experts, 0);
      if (config.text.moe.layout == ExpertLayout::per_expert) { EXPECT_LT(params.size(), own.size()); }
    }
  }
}

// A checkpoint of 8 experts under a config of 16 (and one whose expert 8 lies beyond a
// config of 8): refused naming the tensor, both counts and the rule, before any weight is read.
TEST(HfDirectoryErrors, ExpertCountDiffersFromTheConfig) {
  for (const std::string file : {"tiny-qwen3-vl-moe.json", "tiny-qwen3_5-moe.json"}) {
    nlohmann::json json = tiny_config(file);
    const ModelConfig config = parse_model_config(json, file);
    const std::string dir = temp_dir() + "/eight";
    hf::save_hf_directory(dir, parameters_of(*build(config)), json.dump());
    json["text_config"]["num_experts"] = 16;
    const std::string error =
        error_of([&] { check_expert_count(hf::open_hf_directory(dir), parse_model_config(json, file)); });
    EXPECT_THAT(error, HasSubstr("but config.json's num_experts is 16: the checkpoint and the config must describe "
                                 "the same experts"));
    EXPECT_THAT(error, HasSubstr(config.text.moe.layout == ExpertLayout::fused ? "holds 8 experts" : "is expert 7"));
  }
  const nlohmann::json json = tiny_config("tiny-qwen3_5-moe.json");
  const ModelConfig config = parse_model_config(json, "tiny-qwen3_5-moe.json");
  Named extra = parameters_of(*build(config));
  extra.emplace_back("model.language_model.layers.0.mlp.experts.8.up_proj.weight", at::ones({24, 64}));
  const std::string dir = temp_dir() + "/nine";
  hf::save_hf_directory(dir, extra, json.dump());
  EXPECT_THAT(error_of([&] { check_expert_count(hf::open_hf_directory(dir), config); }),
              HasSubstr("\"model.language_model.layers.0.mlp.experts.8.up_proj.weight\" is expert 8, but "
                        "config.json's num_experts is 8"));
}

// transformers 5 writes LLaVA's CLIP tower without CLIPVisionModel's vision_model level:
// vision_tower.embeddings.* (seen from transformers 5.17's save_pretrained; tests/hf
// checks it against transformers itself). The other names stay llava-1.5-hf's.
TEST(HfDirectory, LlavaLoadsTheLayoutTransformers5Writes) {
  const nlohmann::json json = tiny_config("tiny-llava.json");
  const ModelConfig config = parse_model_config(json, "tiny-llava.json");
  const auto model = build(config);
  const Named own = parameters_of(*model);
  const Named v5 = renamed(own, {{"vision_tower.vision_model.", "vision_tower."}});
  ASSERT_NE(v5.front().first, own.front().first);  // the tower comes first
  const std::string dir = temp_dir() + "/v5";
  hf::save_hf_directory(dir, v5, json.dump());
  expect_loads(dir, config, own);
  // and transformers 5's names in memory (model.vision_tower.*), as a user's own save may hold them
  const std::string memory_dir = temp_dir() + "/v5-memory";
  hf::save_hf_directory(memory_dir, renamed(v5, {{"vision_tower.", "model.vision_tower."}}), json.dump());
  expect_loads(memory_dir, config, own);
}

// Qwen2.5-VL's model is not built yet (windowed vision blocks); its files are named as
// Qwen2-VL's, and so is its naming.
TEST(HfDirectory, Qwen2_5VlNamesAsQwen2Vl) {
  const hf::CheckpointNaming qwen2 = checkpoint_naming(parse_model_config(tiny_config("tiny-qwen2-vl.json")));
  const hf::CheckpointNaming qwen2_5 = checkpoint_naming(parse_model_config(tiny_config("tiny-qwen2_5-vl.json")));
  EXPECT_EQ(qwen2_5.prefix_aliases, qwen2.prefix_aliases);
  EXPECT_TRUE(qwen2_5.ignored_prefixes.empty() && qwen2_5.tied_output.empty());
  const hf::CheckpointNaming tied = checkpoint_naming(parse_model_config(tiny_config("tiny-qwen2_5-vl.json", true)));
  EXPECT_EQ(tied.tied_output, "lm_head.weight");
  EXPECT_EQ(tied.tied_input, "model.embed_tokens.weight");
}

TEST(HfDirectory, TiedTinyModelLoadsWithOrWithoutLmHead) {
  for (const std::string file : {"tiny-qwen2-vl.json", "tiny-qwen3-vl.json", "tiny-llava.json"}) {
    const nlohmann::json json = tiny_config(file, /*tied=*/true);
    const ModelConfig config = parse_model_config(json, file);
    const hf::CheckpointNaming naming = checkpoint_naming(config);
    const auto model = build(config);
    const Named own = parameters_of(*model);
    for (const auto& [name, t] : own) EXPECT_NE(name, naming.tied_output) << file;
    const std::string without = temp_dir() + "/without";
    hf::save_hf_directory(without, own, json.dump());
    expect_loads(without, config, own);
    Named with = own;
    at::Tensor embed;
    for (const auto& [name, t] : own)
      if (name == naming.tied_input) embed = t;
    ASSERT_TRUE(embed.defined()) << file << ": no " << naming.tied_input;
    with.emplace_back(naming.tied_output, embed.detach() + 1);  // ignored: the embedding is there
    const std::string with_dir = temp_dir() + "/with";
    hf::save_hf_directory(with_dir, with, json.dump());
    expect_loads(with_dir, config, own);
  }
}

// ---- parsers: mutants of a sharded index and of every shipped config -----------------

TEST(HfDirectoryErrors, IndexMutantsEndInAResultOrAnError) {
  const std::string dir = hand_made({{"s1.safetensors", {{"a", kFour}}}, {"s2.safetensors", {{"b", kFour}}}},
                                    R"({"metadata": {"total_parameters": 8, "total_size": 32}, )"
                                    R"("weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string text = slurp(index);
  const test::MutantReport r = test::check_mutants(text, 7, 300, [&](const std::string& mutant) {
    write_text(index, mutant);
    hf::open_hf_directory(dir);
  });
  std::printf("HF index: %d mutants, %d accepted, %d refused, %.2f s\n", r.mutants, r.accepted, r.refused, r.seconds);
  EXPECT_TRUE(r.failures.empty()) << r.failures.size() << " failures, first: " << r.failures.front();
  EXPECT_LT(r.seconds, 30.0);
}

TEST(ConfigMutants, EveryShippedConfigEndsInAResultOrAnError) {
  for (const char* name : {"tiny-qwen2-vl", "tiny-qwen2_5-vl", "tiny-qwen3-vl", "tiny-qwen3_5-vl", "tiny-llava",
                           "tiny-internvl", "shapes-qwen2-vl"}) {
    const std::string text = slurp(std::string(MMSP_SOURCE_DIR) + "/configs/" + name + ".json");
    const test::MutantReport r = test::check_mutants(text, 11, 300, [](const std::string& mutant) {
      parse_model_config(parse_json_text(mutant, "config.json"), "config.json");
    });
    std::printf("%s config.json: %d mutants, %d accepted, %d refused, %.2f s\n", name, r.mutants, r.accepted, r.refused,
                r.seconds);
    EXPECT_TRUE(r.failures.empty()) << name << ": " << r.failures.size() << " failures, first: " << r.failures.front();
    EXPECT_LT(r.seconds, 30.0);
  }
}

TEST(JsonRead, DepthDuplicatesUtf8AndIntegers) {
  auto error = [](const std::string& text) { return error_of([&] { parse_json_text(text, "x.json"); }); };
  EXPECT_THAT(error(std::string(100000, '[') + std::string(100000, ']')),
              HasSubstr("x.json: JSON nests deeper than 64 levels"));
  EXPECT_EQ(error(std::string(64, '[') + std::string(64, ']')), "(no error)");
  EXPECT_EQ(error(R"({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})"),
            "(no error)");  // in a string
  EXPECT_THAT(error(R"({"a": 1, "b": {"c": 2, "c": 3}})"), HasSubstr("x.json: the key \"c\" appears twice"));
  EXPECT_EQ(error(R"({"a": {"c": 2}, "b": {"c": 3}})"), "(no error)");               // same key, other objects
  EXPECT_THAT(error("{\"a\": \"\xff\xfe\"}"), HasSubstr("x.json: not valid JSON"));  // ill-formed UTF-8
  EXPECT_THAT(error("{\"a\": \"\xc3\"}"), HasSubstr("x.json: not valid JSON"));      // truncated sequence
  EXPECT_EQ(error("{\"a\": \"\xc3\xa9\"}"), "(no error)");                           // é
  const auto j = parse_json_text(R"({"n": 18446744073709551615, "m": -3, "f": 1.5, "s": "7"})", "x.json");
  EXPECT_THAT(error_of([&] { json_int(j, "n", "x.json", 0, INT64_MAX); }), HasSubstr("x.json: n must be an integer"));
  EXPECT_THAT(error_of([&] { json_int(j, "m", "x.json", 0, 10); }), HasSubstr("x.json: m = -3 is outside [0, 10]"));
  EXPECT_THAT(error_of([&] { json_int(j, "f", "x.json", 0, 10); }), HasSubstr("must be an integer"));
  EXPECT_THAT(error_of([&] { json_int(j, "s", "x.json", 0, 10); }), HasSubstr("must be an integer, got a string"));
  EXPECT_THAT(error_of([&] { json_int(j, "z", "x.json", 0, 10); }), HasSubstr("x.json: \"z\" is missing"));
}

// ---- a peft adapter directory read back (`mmsp train --model ADAPTER_DIR`) ----

// An adapter as save_peft_adapter writes it: two decoder maps and a vision one, rank 2.
std::string write_adapter() {
  hf::PeftAdapter a;
  a.rank = 2;
  a.alpha = 4;
  a.base_model = "/models/base";
  for (const char* m : {"model.language_model.layers.0.self_attn.q_proj", "model.language_model.layers.1.mlp.up_proj",
                        "model.visual.blocks.0.attn.qkv"})
    a.modules.emplace_back(m, at::randn({2, 8}, at::kDouble), at::randn({6, 2}, at::kDouble));
  a.target_modules = "x";
  const std::string dir = temp_dir() + "/adapter";
  hf::save_peft_adapter(dir, a);
  return dir;
}

TEST(PeftAdapter, ReadsWhatSaveWritesAndGivesItsTargets) {
  const std::string dir = write_adapter();
  EXPECT_TRUE(hf::is_peft_adapter_directory(dir));
  const hf::PeftAdapterFiles got = hf::open_peft_adapter(dir);
  EXPECT_EQ(got.rank, 2);
  EXPECT_EQ(got.alpha, 4);
  EXPECT_EQ(got.base_model, "/models/base");
  EXPECT_EQ(got.modules,
            (std::vector<std::string>{"model.language_model.layers.0.self_attn.q_proj",
                                      "model.language_model.layers.1.mlp.up_proj", "model.visual.blocks.0.attn.qkv"}));
  EXPECT_EQ(got.weights.tensors.size(), 6u);
  EXPECT_EQ(lora_targets_of(got.modules), (std::vector<std::string>{"q_proj", "up_proj", "vision.qkv"}));
  write_text(dir + "/config.json", "{}");  // a model directory, not an adapter
  EXPECT_FALSE(hf::is_peft_adapter_directory(dir));
}

TEST(PeftAdapter, RefusesWhatChangesTheComputationNamingTheField) {
  const std::string dir = write_adapter();
  const std::string file = dir + "/" + hf::kPeftConfigFile;
  const nlohmann::json good = nlohmann::json::parse(slurp(file));
  auto error_with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json c = good;
    c[field] = value;
    write_text(file, c.dump());
    return error_of([&] { hf::open_peft_adapter(dir); });
  };
  EXPECT_THAT(error_with("use_dora", true), HasSubstr("use_dora is true: DoRA is not supported"));
  EXPECT_THAT(error_with("use_rslora", true), HasSubstr("use_rslora is true"));
  EXPECT_THAT(error_with("rank_pattern", {{"q_proj", 8}}), HasSubstr("rank_pattern is {\"q_proj\":8}"));
  EXPECT_THAT(error_with("modules_to_save", {"lm_head"}), HasSubstr("modules_to_save"));
  EXPECT_THAT(error_with("target_parameters", {"mlp.experts.gate_up_proj"}), HasSubstr("target_parameters"));
  EXPECT_THAT(error_with("bias", "all"), HasSubstr("bias is \"all\""));
  EXPECT_THAT(error_with("r", 0), HasSubstr("r is 0; it must be an integer in [1, 2^20]"));
  EXPECT_THAT(error_with("r", 3), HasSubstr("are not of rank r = 3"));
  EXPECT_THAT(error_with("lora_alpha", "8"), HasSubstr("lora_alpha is \"8\"; it must be a number"));
  EXPECT_THAT(error_with("peft_type", "IA3"), HasSubstr("peft_type is \"IA3\""));
  EXPECT_THAT(error_with("peft_type", 3), HasSubstr("peft_type is 3; it must be a string"));
  EXPECT_EQ(error_with("lora_dropout", 0.05), "(no error)");  // said and not applied
  EXPECT_EQ(error_with("use_dora", false), "(no error)");
  // A key that is not lora_A / lora_B of a module, and a module with one side only.
  write_text(file, good.dump());
  const std::string weights = dir + "/" + hf::kPeftWeightsFile;
  hf::save_safetensors(weights, {{"base_model.model.m.lora_A.weight", at::zeros({2, 4})},
                                 {"base_model.model.lm_head.modules_to_save.weight", at::zeros({4, 4})}});
  EXPECT_THAT(error_of([&] { hf::open_peft_adapter(dir); }),
              HasSubstr("\"base_model.model.lm_head.modules_to_save.weight\" is not a LoRA weight"));
  hf::save_safetensors(weights, {{"base_model.model.m.lora_A.weight", at::zeros({2, 4})}});
  EXPECT_THAT(error_of([&] { hf::open_peft_adapter(dir); }), HasSubstr("m has lora_A but no lora_B"));
}

TEST(PeftAdapter, ConfigMutantsEndInAResultOrAnError) {
  const std::string dir = write_adapter();
  const std::string file = dir + "/" + hf::kPeftConfigFile;
  const std::string text = slurp(file);
  const test::MutantReport r = test::check_mutants(text, 71, 300, [&](const std::string& mutant) {
    write_text(file, mutant);
    hf::open_peft_adapter(dir);
  });
  std::printf("adapter_config.json: %d mutants, %d accepted, %d refused, %.2f s\n", r.mutants, r.accepted, r.refused,
              r.seconds);
  EXPECT_TRUE(r.failures.empty()) << r.failures.size() << " failures, first: " << r.failures.front();
}

}  // namespace
}  // namespace mmsp::model
