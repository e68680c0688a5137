// Shared state of a multi-rank test run: every rank runs the same test binary
// under mmsp-run; this gives each test the job's store and fresh meshes on it.
#pragma once

#include "mmsp/dist/mesh.h"

namespace mmsp::test {

// The job's rank environment and store (built once by main()).
const dist::RankEnv& rank_env();

// A new mesh of `shape` over the job's store; every rank must ask for the same
// meshes in the same order. Collective timeout 60 s (tests fail, never hang).
dist::Mesh make_mesh(const dist::MeshShape& shape);

}  // namespace mmsp::test
