// Mesh construction: validation, TCPStore rendezvous, one Gloo (and NCCL) group per
// axis; see mesh.h.
#include "mmsp/dist/mesh.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef MMSP_WITH_NCCL
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/dist/rendezvous.h"
#include "mmsp/dist/startup_deadline.h"

namespace mmsp::dist {
namespace {

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0; }

// Where this rank's Gloo listens: GLOO_SOCKET_IFNAME's interface when set; else the
// address the rendezvous chose (the one that reaches rank 0's host, job_hosts.h); a mesh
// over a bare store (tests, benches on one host) keeps c10d's own choice.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const RankEnv& env, const JobHosts& hosts) {
  if (!env.gloo_interface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(env.gloo_interface);
  if (hosts.known()) return c10d::ProcessGroupGloo::createDeviceForHostname(hosts.listen_address(env.rank).address);
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// "--dp × --ring × --ulysses, --expert": the flags that set the mesh, for messages.
std::string mesh_flags() {
  std::string dims, folded;
  for (const plan::AxisSpec& spec : plan::mesh_axes()) {
    if (spec.kind == plan::AxisKind::dimension) dims += (dims.empty() ? "--" : " × --") + std::string(spec.name);
    if (spec.kind == plan::AxisKind::folded && spec.size) folded += ", --" + std::string(spec.name);
  }
  return dims + folded;
}

}  // namespace

Rendezvous Mesh::rendezvous(const RankEnv& env, std::chrono::milliseconds timeout) {
  StartupDeadline deadline(env.rank, timeout, env.master_addr + ":" + std::to_string(env.master_port),
                           "opening the rendezvous");
  return join_rendezvous(env, timeout, {}, &deadline);
}

Mesh Mesh::connect(const RankEnv& env, const plan::Mesh& shape, const MeshOptions& options) {
  plan::validate_mesh(shape, env.world_size);  // before any connection, on every rank
  // One rank has no peer to meet: no store, no port (two single-rank jobs on one host
  // would otherwise fight over MASTER_PORT's default).
  MMSP_CHECK(env.world_size > 1 || options.refusal.empty(), options.refusal);
  if (env.world_size == 1) return create(c10::intrusive_ptr<c10d::Store>(), env, shape, options, "mesh");
  // One deadline for the whole start-up: the rendezvous, then the groups' connections.
  StartupDeadline deadline(env.rank, options.timeout, env.master_addr + ":" + std::to_string(env.master_port),
                           "opening the rendezvous");
  AgreedFlags agreed = options.agreed;
  agreed.emplace_back("the mesh (" + mesh_flags() + ")", shape.str());
  const Rendezvous met = join_rendezvous(env, options.timeout, agreed, &deadline, options.refusal);
  deadline.stage("connecting the process groups");
  return create(met, env, shape, options, "mesh");
}

Mesh Mesh::create(const c10::intrusive_ptr<c10d::Store>& store, const RankEnv& env, const plan::Mesh& shape,
                  const MeshOptions& options, const std::string& prefix) {
  return build(store, env, shape, options, prefix, JobHosts{});
}

Mesh Mesh::create(const Rendezvous& met, const RankEnv& env, const plan::Mesh& shape, const MeshOptions& options,
                  const std::string& prefix) {
  return build(met.store, env, shape, options, prefix, met.hosts);
}

Mesh Mesh::build(const c10::intrusive_ptr<c10d::Store>& store, const RankEnv& env, const plan::Mesh& shape,
                 const MeshOptions& options, const std::string& prefix, const JobHosts& hosts) {
  plan::validate_mesh(shape, env.world_size);
  MMSP_CHECK(options.timeout.count() > 0, "collective timeout must be positive, got ", options.timeout.count(), " ms");
  Mesh mesh;
  mesh.shape_ = shape;
  mesh.rank_ = env.rank;
  mesh.coords_ = plan::rank_coords(shape, env.rank);
  mesh.store_ = store;
  mesh.hosts_ = hosts;

  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  if (env.world_size > 1) gloo_options->devices.push_back(make_gloo_device(env, hosts));
  const bool stage = options.gpu_collectives == GpuCollectives::host_staged;
#ifdef MMSP_WITH_NCCL
  const bool with_nccl = options.gpu_collectives == GpuCollectives::nccl;
  // A failed or timed-out NCCL collective aborts its communicator and raises in wait()
  // (which names the group) instead of hanging; the user's own setting wins.
  if (with_nccl) ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", /*overwrite=*/0);
  // Across hosts NCCL's sockets (its bootstrap, and its data where no InfiniBand is) use
  // the interface Gloo listens on, which reaches the other hosts; the user's
  // NCCL_SOCKET_IFNAME wins.
  if (with_nccl && hosts.spans_hosts() && !hosts.listen_address(env.rank).interface.empty())
    ::setenv("NCCL_SOCKET_IFNAME", hosts.listen_address(env.rank).interface.c_str(), /*overwrite=*/0);
#else
  MMSP_CHECK(options.gpu_collectives != GpuCollectives::nccl,
             "NCCL collectives were asked for, but this mmsp was built against a LibTorch without NCCL");
#endif

  // Every rank builds its groups in the same axis order (plan::mesh_axes()); a group's
  // members meet in its own store namespace, so disjoint groups connect independently.
  for (const plan::AxisSpec& spec : plan::mesh_axes()) {
    const MeshAxis axis = spec.axis;
    std::vector<int> members = plan::group_members(shape, axis, env.rank);
    if (axis == MeshAxis::expert_replica && static_cast<int>(members.size()) == shape.world()) {
      // expert 1: the ranks holding the same experts are the world; its group serves (no second
      // connection). An expert group of the whole world gets its own, so that its bytes (the
      // tokens' exchange) are counted apart from the world's (the gradients').
      mesh.groups_[static_cast<int>(axis)] = mesh.groups_[static_cast<int>(MeshAxis::world)];
      continue;
    }
    const int group_rank = static_cast<int>(std::find(members.begin(), members.end(), env.rank) - members.begin());
    const std::string name = plan::group_name(shape, axis, env.rank);
    const int size = static_cast<int>(members.size());
    c10::intrusive_ptr<Backend> cpu, gpu;
    if (size > 1) {
      auto group_store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/" + name, store);
      cpu = c10::make_intrusive<c10d::ProcessGroupGloo>(group_store, group_rank, size, gloo_options);
#ifdef MMSP_WITH_NCCL
      if (with_nccl) {
        auto nccl_store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/nccl/" + name, store);
        auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
        nccl_options->timeout = options.timeout;
        gpu = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, group_rank, size, nccl_options);
      }
#endif
    }
    mesh.groups_[static_cast<int>(axis)] = c10::make_intrusive<Group>(name, std::move(members), group_rank, cpu, gpu,
                                                                      mesh.stats_.of(axis), options.timeout, stage);
  }
  return mesh;
}

MeshStats::MeshStats() {
  for (auto& stats : axes_) stats = std::make_shared<CommStats>();
}

CommSnapshot MeshStats::snapshot(MeshAxis axis) const { return of(axis)->snapshot(); }

CommSnapshot MeshStats::snapshot() const {
  CommSnapshot sum;
  for (const auto& stats : axes_) {
    const CommSnapshot one = stats->snapshot();
    for (int k = 0; k < kNumCommKinds; ++k)
      for (int p = 0; p < 2; ++p) {
        sum.counts[k][p].calls += one.counts[k][p].calls;
        sum.counts[k][p].bytes += one.counts[k][p].bytes;
      }
  }
  return sum;
}

Mesh Mesh::solo() {
  RankEnv env;
  env.rank = 0;
  env.world_size = 1;
  return create(c10::intrusive_ptr<c10d::Store>(), env, plan::Mesh{1, 1, 1}, MeshOptions{}, "solo");
}

const GroupPtr& Mesh::group(std::string_view axis_name) const {
  const std::optional<MeshAxis> axis = plan::axis_named(axis_name);
  MMSP_CHECK(axis.has_value(), "the mesh has no axis named '", axis_name, "'");
  return group(*axis);
}

const GroupPtr& Mesh::group(MeshAxis axis) const {
  const GroupPtr& g = groups_[static_cast<int>(axis)];
  MMSP_ASSERT(g, "mesh group ", plan::axis_name(axis), " not built");
  return g;
}

}  // namespace mmsp::dist
