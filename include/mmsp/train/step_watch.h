// The bookkeeping around one training step, kept out of the step itself (trainer.cpp's
// run_step): the rank's heartbeat phase (what a hung rank was doing, dist/heartbeat.h),
// the test hooks that perturb one rank (TestHooks), and the step's
// accounting: its time and the time split, the bytes this rank sent by purpose, the
// peaks of the backward and of the update.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "mmsp/core/phase_timer.h"
#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/trainer.h"

namespace mmsp::train {

// Bytes this rank has sent, by purpose, told apart by the mesh group that sent them:
// attention = the ring and Ulysses groups (ring K/V exchange, Ulysses all-to-alls, the
// Gated DeltaNet halo and state gathers), vision = the context group (vision rows
// routed to their tokens), grad = the world, dp and expert_replica groups (within a step:
// gradient sync, the sharded optimizer's reduce-scatter, weight all-gather and norm),
// experts = the expert group (mixture-of-experts tokens to their experts' ranks and back).
struct SentBytes {
  int64_t attention = 0, vision = 0, grad = 0, experts = 0;
  int64_t total() const { return attention + vision + grad + experts; }
  SentBytes operator-(const SentBytes& earlier) const {
    return {attention - earlier.attention, vision - earlier.vision, grad - earlier.grad, experts - earlier.experts};
  }
};
SentBytes sent_bytes(const dist::Mesh& mesh);

// What one step cost this rank.
struct StepAccount {
  double seconds = 0;
  PhaseTimes phases;
  int64_t peak_bytes = 0;           // the step's peak: the largest of the three below
  int64_t forward_peak_bytes = 0;   // the forward's and the loss's peak
  int64_t backward_peak_bytes = 0;  // the backward's own peak
  int64_t update_peak_bytes = 0;    // the update's own peak
  SentBytes sent;
};

class StepWatch {
 public:
  // Starts the step's clock and counters; the heartbeat enters (step, "data").
  StepWatch(int64_t step, const dist::Mesh& mesh, dist::RankActivity& doing, PhaseTimer& phases, MemoryCounter& memory,
            const TestHooks& test);

  // The samples this rank reads: the skew hook drops one on its rank and step.
  std::vector<int64_t> samples(std::vector<int64_t> samples) const;
  // The heartbeat enters `phase` (a string literal); "forward" runs the sleep hook.
  void phase(const char* phase);
  // What this rank holds now (the training state and the step's batch).
  int64_t held_bytes() const { return memory_.current_bytes(); }
  // The forward and the loss are done: their peak is kept, the backward's is measured apart.
  void forward_done();
  // The backward is done: its peak is kept, the update's is measured apart.
  void backward_done();
  // The heartbeat enters "metrics"; the step's account.
  StepAccount finish();

 private:
  int64_t step_;
  const dist::Mesh& mesh_;
  dist::RankActivity& doing_;
  PhaseTimer& phases_;
  MemoryCounter& memory_;
  const TestHooks& test_;
  std::chrono::steady_clock::time_point start_;
  SentBytes sent_at_start_;
  int64_t forward_peak_ = 0, backward_peak_ = 0;
};

}  // namespace mmsp::train
