// Sharded optimizer state in checkpoints; see sharded_checkpoint.h.
#include "mmsp/train/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "mmsp/core/check.h"
#include "mmsp/core/file_descriptor.h"
#include "mmsp/core/json_read.h"
#include "mmsp/hf/safetensors.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "mmsp.adamw-shard";
const std::array<const char*, 3> kSuffix = {".master", ".exp_avg", ".exp_avg_sq"};

}  // namespace

std::string optimizer_shard_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d-of-%05d.safetensors", rank, world);
  return name;
}

std::map<std::string, at::Tensor> optimizer_shard_tensors(const std::vector<const ShardedAdamW*>& optimizers) {
  std::map<std::string, at::Tensor> tensors;
  for (const ShardedAdamW* optimizer : optimizers)
    for (const parallel::ShardPiece& piece : optimizer->pieces()) {
      const std::string& name = optimizer->model_params()[piece.param].first;
      for (ShardTensor which : {ShardTensor::master, ShardTensor::exp_avg, ShardTensor::exp_avg_sq})
        tensors[name + kSuffix[static_cast<int>(which)]] = optimizer->piece(piece, which);
    }
  return tensors;
}

std::map<std::string, std::string> optimizer_shard_metadata(const std::vector<const ShardedAdamW*>& optimizers,
                                                            int rank, int world) {
  MMSP_CHECK(!optimizers.empty(), "optimizer_shard_metadata: no optimizer");
  json pieces = json::object();
  for (const ShardedAdamW* optimizer : optimizers) {
    MMSP_CHECK(optimizer->steps_taken() == optimizers.front()->steps_taken(),
               "optimizer_shard_metadata: ", "optimizers of ", optimizers.front()->steps_taken(), " and ",
               optimizer->steps_taken(), " steps");
    for (const parallel::ShardPiece& piece : optimizer->pieces())
      pieces[optimizer->model_params()[piece.param].first] = {optimizer->whole_offset(piece), piece.length};
  }
  const json meta = {{"rank", rank}, {"world", world}, {"step", optimizers.front()->steps_taken()}, {"pieces", pieces}};
  return {{"format", kFormat}, {kFormat, meta.dump()}};
}

OptimizerShards open_optimizer_shards(const std::string& dir,
                                      const std::map<std::string, std::vector<int64_t>>& shapes) {
  OptimizerShards out;
  out.dir = dir;
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  MMSP_CHECK(!files.empty(), dir, ": no optimizer shard files");
  out.world = static_cast<int>(files.size());
  std::map<std::string, int64_t> numel;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    numel[name] = n;
  }
  for (int rank = 0; rank < out.world; ++rank) {
    const std::string want = optimizer_shard_file(rank, out.world);
    MMSP_CHECK(files[rank] == want, dir, ": holds ", files[rank], " where ", want,
               " was expected (one file per rank of the saving run, nothing else)");
    const std::string path = dir + "/" + want;
    const hf::SafetensorsHeader header = hf::read_safetensors_header(path);
    auto format = header.metadata.find("format");
    MMSP_CHECK(format != header.metadata.end() && format->second == kFormat && header.metadata.count(kFormat), path,
               ": not an mmsp optimizer shard (metadata \"format\" must be \"", kFormat, "\")");
    const json meta = parse_json_text(header.metadata.at(kFormat), path + " (metadata)");
    MMSP_CHECK(meta.is_object() && meta.value("rank", -1) == rank && meta.value("world", -1) == out.world &&
                   meta.contains("step") && meta.at("step").is_number_integer() && meta.contains("pieces") &&
                   meta.at("pieces").is_object(),
               path, ": metadata must give rank ", rank, ", world ", out.world, ", step and pieces");
    const int64_t steps = meta.at("step").get<int64_t>();
    MMSP_CHECK(steps >= 0 && (rank == 0 || steps == out.steps), path, ": step ", steps, " differs from rank 0's ",
               out.steps);
    out.steps = steps;
    const uint64_t data_start = 8 + header.header_bytes;
    size_t listed = 0;
    for (const auto& item : meta.at("pieces").items()) {
      const std::string& name = item.key();
      const json& range = item.value();
      MMSP_CHECK(numel.count(name), path, ": has a piece of ", name, ", which is not a weight of the checkpoint");
      MMSP_CHECK(range.is_array() && range.size() == 2 && range[0].is_number_integer() && range[1].is_number_integer(),
                 path, ": piece of ", name, " must be [offset, length]");
      OptimizerShards::Piece piece;
      piece.path = path;
      piece.offset = range[0].get<int64_t>();
      piece.length = range[1].get<int64_t>();
      MMSP_CHECK(piece.offset >= 0 && piece.length > 0 && piece.offset + piece.length <= numel.at(name), path,
                 ": piece [", piece.offset, ", +", piece.length, ") of ", name, " lies outside its ", numel.at(name),
                 " elements");
      for (int k = 0; k < 3; ++k) {
        auto it = header.tensors.find(name + kSuffix[k]);
        MMSP_CHECK(it != header.tensors.end(), path, ": ", name + kSuffix[k], " is missing");
        const hf::SafetensorsEntry& e = it->second;
        MMSP_CHECK(e.shape == std::vector<int64_t>{piece.length} && at::isFloatingType(e.scalar_type), path, ": ",
                   name + kSuffix[k], " must be a floating 1-D tensor of ", piece.length, " elements");
        MMSP_CHECK(k == 0 || e.scalar_type == piece.dtype, path, ": ", name, "'s tensors differ in dtype");
        piece.dtype = e.scalar_type;
        piece.data_offset[k] = data_start + e.data_begin;
        ++listed;
      }
      out.pieces[name].push_back(piece);
    }
    MMSP_CHECK(listed == header.tensors.size(), path, ": holds tensors its metadata does not list");
  }
  for (const auto& [name, n] : numel) {
    auto it = out.pieces.find(name);
    // A weight no optimizer steps (--freeze, a LoRA run's base) has no state; one the run
    // steps is asked for by name when restored (read_optimizer_shards names it if absent).
    if (it == out.pieces.end()) continue;
    std::sort(it->second.begin(), it->second.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    int64_t next = 0;
    for (const auto& piece : it->second) {
      MMSP_CHECK(piece.offset == next, dir, ": the pieces of ", name, " leave a gap or overlap at element ", next);
      next += piece.length;
    }
    MMSP_CHECK(next == n, dir, ": the pieces of ", name, " cover ", next, " of its ", n, " elements");
  }
  return out;
}

at::Tensor read_optimizer_shards(const OptimizerShards& shards, const std::string& name, ShardTensor which,
                                 int64_t offset, int64_t length) {
  auto it = shards.pieces.find(name);
  MMSP_CHECK(it != shards.pieces.end(), shards.dir, ": no optimizer state for ", name);
  at::Tensor out = at::empty({length}, it->second.front().dtype);
  const int64_t size = static_cast<int64_t>(out.element_size());
  for (const auto& piece : it->second) {
    const int64_t first = std::max(offset, piece.offset);
    const int64_t last = std::min(offset + length, piece.offset + piece.length);
    if (first >= last) continue;
    FileDescriptor fd(::open(piece.path.c_str(), O_RDONLY | O_CLOEXEC));
    MMSP_CHECK(fd.get() >= 0, piece.path, ": cannot open");
    at::Tensor part = out.narrow(0, first - offset, last - first);
    hf::pread_exact(fd.get(), part.data_ptr(), static_cast<uint64_t>((last - first) * size),
                    piece.data_offset[static_cast<int>(which)] + static_cast<uint64_t>((first - piece.offset) * size),
                    piece.path);
  }
  return out;
}

std::map<std::string, AdamWParamMoments> gather_adamw_moments(const OptimizerShards& shards,
                                                              const model::NamedParams& weights) {
  std::map<std::string, AdamWParamMoments> moments;
  if (shards.steps == 0) return moments;  // no step taken: no state, as AdamW keeps none
  for (const auto& [name, w] : weights) {
    AdamWParamMoments m;
    m.step = shards.steps;
    m.exp_avg = read_optimizer_shards(shards, name, ShardTensor::exp_avg, 0, w.numel()).view(w.sizes());
    m.exp_avg_sq = read_optimizer_shards(shards, name, ShardTensor::exp_avg_sq, 0, w.numel()).view(w.sizes());
    moments[name] = m;
  }
  return moments;
}

}  // namespace mmsp::train
