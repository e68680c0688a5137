// Self-test of every differentiable collective over every group of a mesh: each
// rank encodes (rank, index) into its inputs, checks where every value landed, then
// backpropagates a known weighting and checks the gradient against the one worked
// out by hand. Used by `mmsp selftest` and by the multi-rank tests.
#pragma once

#include <string>
#include <vector>

#include "mmsp/dist/mesh.h"

namespace mmsp::dist {

struct SelftestResult {
  std::string collective;  // "all_to_all", ...
  std::string group;       // group name, e.g. "ring[dp=0,u=1]"
  int group_size = 1;
  int64_t bytes_sent = 0;     // forward + backward, this rank, from the byte counters
  double forward_error = 0;   // max |got - expected| of the output
  double backward_error = 0;  // max |got - expected| of the input gradient
  bool ok() const { return forward_error == 0 && backward_error == 0; }
};

// Runs on every rank of `mesh` (collectively); fp64, exact comparisons.
// `device`: where the collectives' tensors live (CUDA: NCCL, or Gloo through host memory
// in the shared-GPU test mode).
std::vector<SelftestResult> run_selftest(const Mesh& mesh, const at::Device& device = at::kCPU);

}  // namespace mmsp::dist
