// Which samples form each training step: samples in a deterministic per-epoch order,
// taken while they fit a global token budget, then given back from the end until the
// planner's own dp row assignment fits every row. A pure function of the dataset's
// lengths, the options and the position: no communication, the same on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/sequence.h"
#include "mmsp/train/data/dataset.h"

namespace mmsp::train {

// Where the next step starts: `offset` is the position within epoch `epoch`'s order.
struct DataPosition {
  int64_t epoch = 0, offset = 0;
};

struct PackerOptions {
  // real tokens one packed row holds at most (the trainer: tokens per rank × world / rows)
  int64_t tokens_per_row = 4096;
  // packed rows per step (the trainer: --data-rows, by default the mesh's dp)
  int rows = 1;
  // epoch e's order is a Fisher-Yates permutation drawn from splitmix64(seed, e)
  uint64_t seed = 0;
  // false: every epoch in index order
  bool shuffle = true;
  // Samples come in groups of this many consecutive indices (2: a DPO pair's chosen and
  // rejected sides) that a step takes or leaves whole, and an epoch's order permutes
  // whole groups. The dataset's size must be a multiple of it.
  int group = 1;
};

class StepPacker {
 public:
  // Checks the options (sizes >= 1, dataset at least `rows` samples, whole groups).
  StepPacker(const Dataset& dataset, const PackerOptions& options);

  // The samples of the step at `position` (in order), and advances `position` past them.
  // Takes samples while their total length is <= tokens_per_row x rows (the step's
  // budget), then gives back samples from the end while plan::assign_sequences_to_dp
  // puts more than tokens_per_row tokens on some row. A step may run over the end of an
  // epoch into the next (then a sample can appear in both parts); it holds at most
  // size() samples. A sample longer than tokens_per_row is an error naming it.
  std::vector<int64_t> next_step(DataPosition& position) const;

  // Epoch `epoch`'s sample order (a permutation of 0 .. size() - 1).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  int64_t budget() const;     // tokens_per_row x rows
  int64_t row_limit() const;  // tokens_per_row
  const PackerOptions& options() const { return options_; }

 private:
  const std::vector<int64_t>& order(int64_t epoch) const;

  const Dataset& dataset_;
  PackerOptions options_;
  // the last two epochs' orders (a step spans at most two); not thread-safe
  mutable std::vector<std::pair<int64_t, std::vector<int64_t>>> orders_;
};

// The step's token metadata, in the order of `samples` (what plan::make_step_plan reads).
plan::Batch make_batch(const Dataset& dataset, const std::vector<int64_t>& samples);

}  // namespace mmsp::train
