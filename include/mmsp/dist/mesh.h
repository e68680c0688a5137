// The device mesh: its ranks joined by c10d, with one process group per named axis of
// plan::mesh_axes() (the world, dp, ring, ulysses, context = ring × ulysses, and the folded
// expert axes), found by name or by axis. Built once by cli/ or train/ and passed down;
// validated on every rank before any connection.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "mmsp/dist/comm_stats.h"
#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/group.h"
#include "mmsp/dist/job_hosts.h"
#include "mmsp/dist/rank_device.h"
#include "mmsp/dist/rank_env.h"
#include "mmsp/dist/rendezvous.h"
#include "mmsp/plan/mesh.h"

namespace c10d {
class Store;
}

namespace mmsp::dist {

// The mesh arithmetic is the plan's (plan/mesh.h): one type, dist adds the groups.
using plan::MeshAxis;

struct MeshOptions {
  // Limit for the rendezvous and for every collective; a dead or stuck peer ends
  // the job with an error after at most this long instead of hanging.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // What every rank must share, compared at the rendezvous before any group exists
  // (flag_agreement.h); the mesh's shape is added by connect().
  AgreedFlags agreed;
  // Non-empty: this rank cannot start (a check only it can make failed, e.g. rank 0's
  // --out lock). It still meets the others, so that every rank ends at once with this
  // message instead of waiting for it until the timeout.
  std::string refusal;
  // How CUDA tensors cross ranks (rank_device.h): none makes no NCCL group; nccl one per
  // group (with NCCL's async error handling on, and the same timeout); host_staged copies
  // them through Gloo (tests that share one GPU between ranks).
  GpuCollectives gpu_collectives = GpuCollectives::none;
};

// The byte counters of a mesh: one CommStats per axis group, so what a step sent can
// be told apart by the group that sent it (the training metrics split it by purpose).
class MeshStats {
 public:
  MeshStats();
  CommSnapshot snapshot() const;               // every group of the mesh
  CommSnapshot snapshot(MeshAxis axis) const;  // one axis group's
  const std::shared_ptr<CommStats>& of(MeshAxis axis) const { return axes_[static_cast<int>(axis)]; }

 private:
  std::shared_ptr<CommStats> axes_[plan::kMeshAxes];  // indexed by MeshAxis
};

class Mesh {
 public:
  // Rendezvous through a c10d TCPStore at env.master_addr:env.master_port that
  // rank 0 hosts, then builds the groups; all within options.timeout (+ 2 s), whatever
  // the peers do (startup_deadline.h), or the process ends naming what it waited for.
  static Mesh connect(const RankEnv& env, const plan::Mesh& shape, const MeshOptions& options = {});

  // Builds the groups over an existing store. `prefix` keeps meshes that share
  // one store apart (every rank must build the same meshes in the same order).
  static Mesh create(const c10::intrusive_ptr<c10d::Store>& store, const RankEnv& env, const plan::Mesh& shape,
                     const MeshOptions& options, const std::string& prefix);
  // The same over the ranks' rendezvous: each rank's Gloo listens on the address the
  // rendezvous chose for it (job_hosts.h), and the mesh knows every rank's host.
  static Mesh create(const Rendezvous& met, const RankEnv& env, const plan::Mesh& shape, const MeshOptions& options,
                     const std::string& prefix);

  // A one-rank mesh (1 × 1 × 1) that needs no store: the single-process reference
  // of a distributed computation, run inside a multi-rank job.
  static Mesh solo();

  // Opens the job's TCPStore (rank 0 serves it) and waits for every rank of the
  // same run (join_rendezvous in rendezvous.h).
  static Rendezvous rendezvous(const RankEnv& env, std::chrono::milliseconds timeout);

  const plan::Mesh& shape() const { return shape_; }
  const plan::RankCoords& coords() const { return coords_; }
  int rank() const { return rank_; }
  int world_size() const { return shape_.world(); }

  const GroupPtr& group(MeshAxis axis) const;
  const GroupPtr& group(std::string_view axis_name) const;  // by plan::mesh_axes()'s name; throws if unknown
  const GroupPtr& world() const { return group(MeshAxis::world); }
  const GroupPtr& dp() const { return group(MeshAxis::dp); }
  const GroupPtr& ring() const { return group(MeshAxis::ring); }
  const GroupPtr& ulysses() const { return group(MeshAxis::ulysses); }
  const GroupPtr& context() const { return group(MeshAxis::context); }
  // the ranks that split each MoE layer's experts, and those holding the same experts (whose
  // expert gradients sum); with expert 1, a one-rank group and the world
  const GroupPtr& expert() const { return group(MeshAxis::expert); }
  const GroupPtr& expert_replica() const { return group(MeshAxis::expert_replica); }

  // The job's store (null for one rank): heartbeats and step fingerprints use it.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  const MeshStats& stats() const { return stats_; }

  // Every rank's host (empty for one rank or a mesh made over a bare store): messages
  // name a lost rank's host with it.
  const JobHosts& hosts() const { return hosts_; }

 private:
  static Mesh build(const c10::intrusive_ptr<c10d::Store>& store, const RankEnv& env, const plan::Mesh& shape,
                    const MeshOptions& options, const std::string& prefix, const JobHosts& hosts);

  plan::Mesh shape_;
  plan::RankCoords coords_;
  int rank_ = 0;
  MeshStats stats_;
  GroupPtr groups_[plan::kMeshAxes];  // indexed by MeshAxis
  c10::intrusive_ptr<c10d::Store> store_;
  JobHosts hosts_;
};

}  // namespace mmsp::dist
