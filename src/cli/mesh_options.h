// Mesh flags shared by the commands that join ranks (the axes' sizes, --timeout
// --heartbeat-timeout --device) and the one place that reads the launcher's environment.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "mesh_size_flags.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/mesh.h"

namespace mmsp::cli {

struct MeshFlags {
  MeshSizeFlags sizes{/*infer_fastest=*/true};  // --dp --ring --ulysses (0: what the world leaves) --expert
  double timeout_s = 300;
  double heartbeat_timeout_s = 10;
  std::string device = "auto";

  void add_to(CLI::App& app) {
    // Ranges are checked in check() with messages that state the rule.
    sizes.add_to(app);
    app.add_option("--timeout", timeout_s,
                   "seconds the start-up and every collective may wait for a peer (0 < T <= 1e6)");
    app.add_option("--heartbeat-timeout", heartbeat_timeout_s,
                   "seconds without a heartbeat after which a rank counts as hung and the job ends");
    app.add_option("--device", device,
                   "auto | cpu | cuda: where each rank computes (auto: cuda:LOCAL_RANK when the machine has a "
                   "GPU per local rank, else cpu; docs/gpu.md)");
  }

  // This rank's device (the GPU made current); an error names a bad --device or a rank
  // without its GPU, before the mesh connects.
  dist::RankDevice rank_device(const dist::RankEnv& env) const {
    return dist::use_rank_device(dist::parse_device_request(device), env, device_env());
  }

  // MMSP_SHARE_GPU and CUDA_VISIBLE_DEVICES: cli/ reads the environment, the library is told.
  static dist::DeviceEnv device_env() {
    dist::DeviceEnv e;
    const char* share = std::getenv("MMSP_SHARE_GPU");
    e.share_gpu = share != nullptr && std::string(share) == "1";
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) e.visible_devices = v;
    return e;
  }

  // Longest --timeout: 11.6 days, far below what milliseconds in int64 can hold.
  static constexpr double kMaxTimeoutS = 1e6;

  void check() const {
    sizes.check();
    MMSP_CHECK(std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= kMaxTimeoutS, "--timeout ", timeout_s,
               " must be a number of seconds in (0, ", kMaxTimeoutS, "]");
    MMSP_CHECK(std::isfinite(heartbeat_timeout_s) && heartbeat_timeout_s > 0 && heartbeat_timeout_s <= kMaxTimeoutS,
               "--heartbeat-timeout ", heartbeat_timeout_s, " must be a number of seconds in (0, ", kMaxTimeoutS, "]");
  }

  plan::Mesh shape(int world_size) const {
    check();
    return sizes.shape(world_size);
  }

  // The mesh's options; `agreed`: the command's own flags that every rank must share
  // (the mesh's shape, timeouts and mmsp's build are added here).
  dist::MeshOptions options(dist::AgreedFlags agreed = {}, const dist::RankDevice& rank = {}) const {
    dist::MeshOptions o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    o.gpu_collectives = rank.collectives;
    o.agreed = {{"mmsp build", MMSP_BUILD_ID},
                {"--timeout", dist::exact_number(timeout_s)},
                {"--heartbeat-timeout", dist::exact_number(heartbeat_timeout_s)},
                // as resolved: "auto" and "cpu" agree on a machine without a GPU
                {"--device", c10::DeviceTypeName(rank.device.type(), /*lower_case=*/true)}};
    o.agreed.insert(o.agreed.end(), agreed.begin(), agreed.end());
    return o;
  }

  // Heartbeats of this rank over the store Mesh::connect opened (docs/reliability.md);
  // none for one rank. Keep it alive while the rank works.
  std::unique_ptr<dist::Heartbeat> start_heartbeat(const dist::RankEnv& env, const dist::Mesh& mesh,
                                                   std::shared_ptr<const dist::RankActivity> activity) const {
    dist::HeartbeatOptions o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_timeout_s * 1000));
    o.hosts = mesh.hosts();
    return std::make_unique<dist::Heartbeat>(env, o, std::move(activity));
  }
};

}  // namespace mmsp::cli
