// Shared state of a multi-rank test run: every rank runs the same test binary
// under mmsp-run; this gives each test the job's store and fresh meshes on it.
#pragma once

#include "mmsp/dist/mesh.h"

namespace mmsp::test {

// Reads the rank environment and, with more than one rank, joins the job's store.
// Called once by each test binary's main().
void init_multirank();

// The job's rank environment (one rank when started alone).
const dist::RankEnv& rank_env();

// A new mesh of `shape` over the job's store; every rank must ask for the same
// meshes in the same order. Collective timeout 60 s (tests fail, never hang).
// gpu: how CUDA tensors cross ranks (the gpu tests share one GPU: host_staged).
dist::Mesh make_mesh(const plan::Mesh& shape, dist::GpuCollectives gpu = dist::GpuCollectives::none);

// Every mesh shape of the world, built once, in the same order on every rank.
const std::vector<dist::Mesh>& all_meshes();

}  // namespace mmsp::test
