// A step's heartbeat, test hooks and accounting; see step_watch.h.
#include "mmsp/train/step_watch.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "mmsp/core/check.h"

namespace mmsp::train {

SentBytes sent_bytes(const dist::Mesh& mesh) {
  const dist::MeshStats& s = mesh.stats();
  auto bytes = [&](plan::MeshAxis axis) { return s.snapshot(axis).total_bytes(); };
  return {bytes(plan::MeshAxis::ring) + bytes(plan::MeshAxis::ulysses), bytes(plan::MeshAxis::context),
          bytes(plan::MeshAxis::world) + bytes(plan::MeshAxis::dp) + bytes(plan::MeshAxis::expert_replica),
          bytes(plan::MeshAxis::expert)};
}

StepWatch::StepWatch(int64_t step, const dist::Mesh& mesh, dist::RankActivity& doing, PhaseTimer& phases,
                     MemoryCounter& memory, const TestHooks& test)
    : step_(step),
      mesh_(mesh),
      doing_(doing),
      phases_(phases),
      memory_(memory),
      test_(test),
      start_(std::chrono::steady_clock::now()) {
  phases_.reset();
  memory_.reset_peak();
  sent_at_start_ = sent_bytes(mesh_);
  doing_.set(step_, "data");
}

std::vector<int64_t> StepWatch::samples(std::vector<int64_t> samples) const {
  if (test_.skew_batch_rank == mesh_.rank() && test_.skew_batch_step == step_ && samples.size() > 1) samples.pop_back();
  return samples;
}

void StepWatch::phase(const char* phase) {
  doing_.set_phase(phase);
  if (std::strcmp(phase, "forward") == 0 && test_.sleep_rank == mesh_.rank() && test_.sleep_step == step_)
    std::this_thread::sleep_for(std::chrono::duration<double>(test_.sleep_seconds));
}

void StepWatch::forward_done() {
  // The forward's and the loss's peak apart from the backward's: the preflight
  // estimates them as moments of their own (memory_estimate.h). With --accumulate, the
  // largest of the micro-steps'.
  forward_peak_ = std::max(forward_peak_, memory_.peak_bytes());
  memory_.reset_peak();
}

void StepWatch::backward_done() {
  backward_peak_ = std::max(backward_peak_, memory_.peak_bytes());
  memory_.reset_peak();
}

StepAccount StepWatch::finish() {
  doing_.set_phase("metrics");
  StepAccount a;
  a.update_peak_bytes = memory_.peak_bytes();
  a.forward_peak_bytes = forward_peak_;
  a.backward_peak_bytes = backward_peak_;
  a.peak_bytes = std::max({forward_peak_, backward_peak_, a.update_peak_bytes});
  a.sent = sent_bytes(mesh_) - sent_at_start_;
  MMSP_ASSERT(a.sent.total() == (mesh_.stats().snapshot().total_bytes() - sent_at_start_.total()),
              "the bytes split by purpose miss a mesh group");
  a.phases = phases_.times();
  a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return a;
}

}  // namespace mmsp::train
