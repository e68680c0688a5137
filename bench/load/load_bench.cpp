// Hugging Face directory load benchmark; see load_bench.h. Rank 0 writes the directory;
// the ranks then move through the phases together (a store barrier before each), so
// every figure is taken with all ranks doing the same thing at once.
#include "load_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/train/memory/memory_counter.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void barrier(c10d::Store& store, const std::string& name, int world_size) {
  store.add(name, 1);
  while (store.add(name, 0) < world_size) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void put(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string get(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

// A decoder's tensors at Qwen2-VL-2B's sizes (hidden 1536, 2 KV heads of 128,
// intermediate 8960, vocabulary 151936), bf16: the embedding when it takes at most half
// of `bytes`, then whole layers until `bytes` is reached.
std::vector<std::pair<std::string, at::Tensor>> realistic_tensors(uint64_t bytes) {
  const int64_t h = 1536, kv = 256, ffn = 8960, vocab = 151936;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  uint64_t total = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += static_cast<uint64_t>(n) * 2;
    shapes.emplace_back(name, std::move(shape));
  };
  if (static_cast<uint64_t>(vocab * h * 2) <= bytes / 2) add("model.embed_tokens.weight", {vocab, h});
  for (int layer = 0; total < bytes; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {h, h});
    add(p + "self_attn.q_proj.bias", {h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.k_proj.bias", {kv});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.bias", {kv});
    add(p + "self_attn.o_proj.weight", {h, h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {ffn, h});
    add(p + "mlp.up_proj.weight", {ffn, h});
    add(p + "mlp.down_proj.weight", {h, ffn});
  }
  add("model.norm.weight", {h});
  std::vector<std::pair<std::string, at::Tensor>> out;
  at::manual_seed(1);
  for (auto& [name, shape] : shapes) out.emplace_back(name, at::empty(shape, at::kBFloat16).uniform_(-0.05, 0.05));
  return out;
}

uint64_t vm_hwm_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  return 0;
}

// `cat` of the shards to /dev/null, in seconds.
double time_cat(const hf::HfDirectory& dir) {
  std::string command = "cat";
  for (const std::string& f : dir.files) command += " '" + dir.path + "/" + f + "'";
  command += " > /dev/null";
  const Clock::time_point start = Clock::now();
  MMSP_CHECK(std::system(command.c_str()) == 0, "bench load: `", command, "` failed");
  return seconds_since(start);
}

}  // namespace

json bench_load(const dist::RankEnv& env, const LoadBenchOptions& o) {
  MMSP_CHECK(o.bytes > 0 && o.shards > 0, "bench load: --bytes and --shards must be > 0");
  train::MemoryCounter memory;  // this benchmark's tensors, from here on
  at::set_num_threads(1);
  auto store = dist::Mesh::rendezvous(env, std::chrono::seconds(900)).store;
  const int world = env.world_size;

  // Rank 0 writes the directory and tells the others where it is.
  json written;
  if (env.rank == 0) {
    const std::string dir = o.dir.empty() ? "/tmp/mmsp-bench-load-" + std::to_string(::getpid()) : o.dir;
    auto tensors = realistic_tensors(o.bytes);
    uint64_t bytes = 0;
    for (const auto& [name, t] : tensors) bytes += t.nbytes();
    // hub's plan packs greedily, so bytes / shards can give more files than asked:
    // grow the limit in 1% steps until the plan (names in order, as saved) has at most K.
    std::vector<std::pair<std::string, uint64_t>> by_name;
    for (const auto& [name, t] : tensors) by_name.emplace_back(name, t.nbytes());
    std::sort(by_name.begin(), by_name.end());
    std::vector<uint64_t> sizes;
    for (const auto& [name, n] : by_name) sizes.push_back(n);
    hf::HfSaveOptions save;
    save.max_shard_bytes = (bytes + o.shards - 1) / o.shards;
    while (hf::plan_hf_shards(sizes, save.max_shard_bytes).size() > static_cast<size_t>(o.shards))
      save.max_shard_bytes += save.max_shard_bytes / 100 + 1;
    const Clock::time_point start = Clock::now();
    hf::save_hf_directory(dir, tensors, R"({"model_type": "qwen2_vl"})", save);
    written = {{"dir", dir},
               {"tensors", tensors.size()},
               {"tensor_bytes", bytes},
               {"max_shard_bytes", save.max_shard_bytes},
               {"save_s", seconds_since(start)}};
    put(*store, "bench-load/dir", dir);
  }
  store->wait({"bench-load/dir"});
  const std::string dir = get(*store, "bench-load/dir");

  json rank;
  rank["rank"] = env.rank;
  barrier(*store, "bench-load/open", world);
  Clock::time_point start = Clock::now();
  const hf::HfDirectory hf = hf::open_hf_directory(dir);
  rank["open_s"] = seconds_since(start);
  rank["files"] = hf.files.size();

  for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    const std::string label = type == at::kFloat ? "fp32_params" : "bf16_params";
    // The parameters exist and are initialised before a load, as a model's would be.
    std::vector<std::pair<std::string, at::Tensor>> params;
    uint64_t kept = 0;
    for (const auto& [name, t] : hf.tensors) {
      params.emplace_back(name, at::zeros(t.entry.shape, at::TensorOptions().dtype(type)));
      kept += params.back().second.nbytes();
    }
    barrier(*store, "bench-load/cat-" + label, world);
    const double cat_s = time_cat(hf);
    barrier(*store, "bench-load/load-" + label, world);
    const int64_t before = memory.current_bytes();
    memory.reset_peak();
    start = Clock::now();
    hf::load_hf_weights(hf, params, {});
    const double load_s = seconds_since(start);
    const int64_t extra = memory.peak_bytes() - before;
    // The same load into the same parameters again: what the read costs once the pages
    // have been written by a read before (see the note on first writes).
    barrier(*store, "bench-load/cat2-" + label, world);
    const double cat2_s = time_cat(hf);
    barrier(*store, "bench-load/reload-" + label, world);
    start = Clock::now();
    hf::load_hf_weights(hf, params, {});
    const double reload_s = seconds_since(start);
    rank[label] = {{"load_s", load_s},
                   {"cat_s", cat_s},
                   {"load_over_cat", load_s / cat_s},
                   {"reload_s", reload_s},
                   {"cat_before_reload_s", cat2_s},
                   {"reload_over_cat", reload_s / cat2_s},
                   {"kept_bytes", kept},
                   {"peak_over_kept", static_cast<double>(kept + extra) / static_cast<double>(kept)},
                   {"load_GBps", static_cast<double>(hf.total_bytes) / load_s / 1e9}};
  }
  rank["vm_hwm_bytes"] = vm_hwm_bytes();
  put(*store, "bench-load/rank/" + std::to_string(env.rank), rank.dump());
  barrier(*store, "bench-load/done", world);
  if (env.rank != 0) return {};

  json ranks = json::array();
  for (int r = 0; r < world; ++r) ranks.push_back(json::parse(get(*store, "bench-load/rank/" + std::to_string(r))));
  if (o.dir.empty()) std::filesystem::remove_all(dir);
  return {{"written", written},
          {"ranks", ranks},
          {"targets", {{"load_over_cat", 1.5}, {"peak_over_kept", 1.2}}},
          {"notes",
           "cat of the same shards runs right before each load on every rank, so both read from the "
           "page cache (rank 0 has just written the files); parameters are allocated and zeroed "
           "before the timer starts; all ranks run each phase at once; peak = counting allocator "
           "(train/memory_counter.h) during the load, over the bytes of the parameters kept; "
           "ATen threads: 1 per rank; load_s is the first read into freshly initialised parameters, "
           "reload_s the same read again (on this sandboxed VM the first kernel write into a page "
           "costs several times a later one, which cat, reading into one small buffer, never pays)"}};
}

}  // namespace mmsp::bench
