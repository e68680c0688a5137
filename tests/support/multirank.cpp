// Multi-rank test support; see multirank.h.
#include "multirank.h"

#include <ATen/Parallel.h>

#include <string>

namespace mmsp::test {
namespace {
dist::RankEnv g_env;
dist::Rendezvous g_met;
int g_mesh_counter = 0;
}  // namespace

void init_multirank() {
  at::set_num_threads(1);
  g_env = dist::rank_env_from(dist::process_environment());
  // Alone, the multi-rank suites run as one rank: its groups never touch a store.
  if (g_env.world_size > 1) g_met = dist::Mesh::rendezvous(g_env, std::chrono::seconds(60));
}

const dist::RankEnv& rank_env() { return g_env; }

dist::Mesh make_mesh(const plan::Mesh& shape, dist::GpuCollectives gpu) {
  dist::MeshOptions options;
  options.gpu_collectives = gpu;
  options.timeout = std::chrono::seconds(60);
  return dist::Mesh::create(g_met, g_env, shape, options, "test-mesh-" + std::to_string(g_mesh_counter++));
}

const std::vector<dist::Mesh>& all_meshes() {
  static std::vector<dist::Mesh> meshes = [] {
    std::vector<dist::Mesh> out;
    for (const plan::Mesh& shape : plan::all_meshes(g_env.world_size)) out.push_back(make_mesh(shape));
    return out;
  }();
  return meshes;
}

}  // namespace mmsp::test
