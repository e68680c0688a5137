// The optimizer state of a `--shard optimizer` run in a checkpoint: every rank writes
// its own shards, none holds the whole state.
//
//   step-N/optimizer/rank-0000K-of-0000W.safetensors
//       "<param>.master", "<param>.exp_avg", "<param>.exp_avg_sq": 1-D, the elements
//       [offset, offset + length) of the flattened parameter that rank K owned
//       metadata "format": "mmsp.adamw-shard", "mmsp.adamw-shard": JSON {"rank", "world",
//       "step" (AdamW steps taken), "pieces": {param: [offset, length]}}
//
// The files of all W ranks together cover every element of every parameter once; a
// resume on any number of ranks, sharded or not, reads the ranges it needs. The masters
// (exact training weights, fp32 in a bf16 run) are here rather than in master/.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mmsp/model/named_params.h"
#include "mmsp/train/optim/optimizer_state.h"
#include "mmsp/train/optim/sharded_adamw.h"

namespace mmsp::train {

constexpr const char* kOptimizerShardDir = "optimizer";

// "rank-00002-of-00004.safetensors"
std::string optimizer_shard_file(int rank, int world);

// This rank's pieces as safetensors contents (views of the optimizers' state: one, or the
// dense and the experts' of expert parallelism, whose parameters differ), each piece at
// its offset in the whole parameter (ShardedAdamW::whole_offset).
std::map<std::string, at::Tensor> optimizer_shard_tensors(const std::vector<const ShardedAdamW*>& optimizers);
std::map<std::string, std::string> optimizer_shard_metadata(const std::vector<const ShardedAdamW*>& optimizers,
                                                            int rank, int world);

// A checkpoint's optimizer/ dir, checked: W files named for ranks 0..W−1, headers and
// metadata that agree, pieces of every parameter in `shapes` (and no other) covering
// it exactly once. Reads no tensor data.
struct OptimizerShards {
  struct Piece {
    std::string path;  // the rank's file
    int64_t offset = 0, length = 0;
    at::ScalarType dtype = at::kFloat;
    std::array<uint64_t, 3> data_offset{};  // absolute, by ShardTensor
  };
  std::string dir;
  int world = 0;
  int64_t steps = 0;
  std::map<std::string, std::vector<Piece>> pieces;  // by parameter, in offset order
};
OptimizerShards open_optimizer_shards(const std::string& dir,
                                      const std::map<std::string, std::vector<int64_t>>& shapes);

// Elements [offset, offset + length) of one parameter's master or moment, in the
// file's dtype (reads only those bytes).
at::Tensor read_optimizer_shards(const OptimizerShards& shards, const std::string& name, ShardTensor which,
                                 int64_t offset, int64_t length);

// Every parameter's whole moments, as the replicated optimizer keeps them (a sharded
// checkpoint resumed with --shard none); none before the first step.
std::map<std::string, AdamWParamMoments> gather_adamw_moments(const OptimizerShards& shards,
                                                              const model::NamedParams& weights);

}  // namespace mmsp::train
