// `mmsp selftest [--dp D --ring R --ulysses U]`: run under mmsp-run (or torchrun,
// mpirun, srun). Rank 0 prints a table; every rank exits non-zero on any mismatch.
#include "selftest_command.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <memory>

#include "mesh_options.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/selftest.h"

namespace mmsp::cli {

Subcommand add_selftest_command(CLI::App& parent) {
  auto flags = std::make_shared<MeshFlags>();
  CLI::App* app =
      parent.add_subcommand("selftest", "check every collective (values and gradients) across the current ranks");
  flags->add_to(*app);
  return {app, [flags]() {
            const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
            const plan::Mesh shape = flags->shape(env.world_size);
            const dist::RankDevice rank_device = flags->rank_device(env);
            dist::Mesh mesh = dist::Mesh::connect(env, shape, flags->options({}, rank_device));
            if (env.rank == 0 && mesh.hosts().spans_hosts())
              std::printf("mmsp selftest: %s\n", mesh.hosts().summary().c_str());
            auto activity = std::make_shared<dist::RankActivity>();
            activity->set(0, "selftest");
            const auto heartbeat = flags->start_heartbeat(env, mesh, activity);
            const auto results = dist::run_selftest(mesh, rank_device.device);

            int64_t failures = 0;
            for (const auto& r : results) failures += r.ok() ? 0 : 1;
            at::Tensor all_failures = at::full({1}, failures, at::kLong);
            dist::all_reduce_(all_failures, *mesh.world());
            failures = all_failures.item<int64_t>();

            if (env.rank == 0) {
              std::printf("mmsp selftest: %d ranks, mesh %s, tensors on %s (%s)\n", env.world_size, shape.str().c_str(),
                          rank_device.device.str().c_str(),
                          rank_device.collectives == dist::GpuCollectives::nccl          ? "NCCL"
                          : rank_device.collectives == dist::GpuCollectives::host_staged ? "Gloo through host memory"
                                                                                         : "Gloo");
              std::printf("%-14s %-20s %5s %12s %10s %10s  %s\n", "collective", "group (rank 0)", "size", "bytes sent",
                          "fwd err", "bwd err", "result");
              for (const auto& r : results)
                std::printf("%-14s %-20s %5d %12lld %10.3g %10.3g  %s\n", r.collective.c_str(), r.group.c_str(),
                            r.group_size, static_cast<long long>(r.bytes_sent), r.forward_error, r.backward_error,
                            r.ok() ? "ok" : "MISMATCH");
              std::printf("%s: %lld mismatches over all ranks\n", failures ? "FAILED" : "passed",
                          static_cast<long long>(failures));
            }
            for (const auto& r : results)
              if (!r.ok())
                std::fprintf(stderr, "rank %d: %s on %s: forward error %g, backward error %g\n", env.rank,
                             r.collective.c_str(), r.group.c_str(), r.forward_error, r.backward_error);
            return failures ? 1 : 0;
          }};
}

}  // namespace mmsp::cli
