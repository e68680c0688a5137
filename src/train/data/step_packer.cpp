// Token-budget step packing over deterministic epoch permutations.
#include "mmsp/train/data/step_packer.h"

#include <algorithm>
#include <numeric>

#include "mmsp/core/check.h"
#include "mmsp/plan/packing.h"
#include "mmsp/train/data/splitmix64.h"

namespace mmsp::train {

StepPacker::StepPacker(const Dataset& dataset, const PackerOptions& options) : dataset_(dataset), options_(options) {
  const PackerOptions& o = options_;
  MMSP_CHECK(o.tokens_per_row >= 1, "step packer: tokens_per_row is ", o.tokens_per_row, ", expected >= 1");
  MMSP_CHECK(o.rows >= 1, "step packer: rows is ", o.rows, ", expected >= 1");
  MMSP_CHECK(dataset.size() >= o.rows, "step packer: dataset has ", dataset.size(), " samples, fewer than rows (",
             o.rows, "); every row needs at least one sample per step (", dataset.describe(), ")");
}

int64_t StepPacker::budget() const { return row_limit() * options_.rows; }
int64_t StepPacker::row_limit() const { return options_.tokens_per_row; }

std::vector<int64_t> StepPacker::epoch_order(int64_t epoch) const {
  const int64_t n = dataset_.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (!options_.shuffle) return order;
  SplitMix64 rng(options_.seed, static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  return order;
}

const std::vector<int64_t>& StepPacker::order(int64_t epoch) const {
  for (const auto& cached : orders_)
    if (cached.first == epoch) return cached.second;
  if (orders_.size() == 2) orders_.erase(orders_.begin());
  orders_.emplace_back(epoch, epoch_order(epoch));
  return orders_.back().second;
}

std::vector<int64_t> StepPacker::next_step(DataPosition& position) const {
  const int64_t n = dataset_.size();
  MMSP_CHECK(position.epoch >= 0 && position.offset >= 0 && position.offset < n, "step packer: data position (epoch ",
             position.epoch, ", offset ", position.offset, ") is outside an epoch of ", n, " samples");
  std::vector<int64_t> samples, lengths;
  DataPosition cursor = position;
  int64_t total = 0;
  while (static_cast<int64_t>(samples.size()) < n) {
    const int64_t sample = order(cursor.epoch)[cursor.offset];
    const int64_t length = static_cast<int64_t>(dataset_.sequence(sample).input_ids.size());
    if (total + length > budget() && !samples.empty()) break;  // it opens the next step
    MMSP_CHECK(length <= row_limit(), "step packer: sample ", sample, " has ", length,
               " tokens, more than one row holds (tokens_per_row ", row_limit(),
               "); raise the tokens per row, or shorten the sample");
    total += length;
    samples.push_back(sample);
    lengths.push_back(length);
    if (++cursor.offset == n) cursor = {cursor.epoch + 1, 0};
  }
  // Give back from the end until the planner's row assignment fits every row. Any `rows`
  // samples fit (one per row), so at least min(rows, taken) stay.
  for (;;) {
    const auto rows = plan::assign_sequences_to_dp(lengths, options_.rows);
    int64_t worst = 0;
    for (const auto& row : rows) {
      int64_t sum = 0;
      for (int64_t k : row) sum += lengths[k];
      worst = std::max(worst, sum);
    }
    if (worst <= row_limit()) break;
    samples.pop_back();
    lengths.pop_back();
  }
  MMSP_ASSERT(static_cast<int64_t>(samples.size()) >= options_.rows, "step of ", samples.size(), " samples for ",
              options_.rows, " rows");
  // advance by exactly the samples kept
  position.offset += static_cast<int64_t>(samples.size());
  position.epoch += position.offset / n;
  position.offset %= n;
  return samples;
}

plan::Batch make_batch(const Dataset& dataset, const std::vector<int64_t>& samples) {
  plan::Batch batch;
  batch.sequences.reserve(samples.size());
  for (int64_t s : samples) batch.sequences.push_back(dataset.sequence(s));
  return batch;
}

}  // namespace mmsp::train
