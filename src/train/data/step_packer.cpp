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
  MMSP_CHECK(o.group >= 1 && dataset.size() % o.group == 0, "step packer: ", dataset.size(),
             " samples do not make whole groups of ", o.group, " (", dataset.describe(), ")");
}

int64_t StepPacker::budget() const { return row_limit() * options_.rows; }
int64_t StepPacker::row_limit() const { return options_.tokens_per_row; }

std::vector<int64_t> StepPacker::epoch_order(int64_t epoch) const {
  const int64_t g = options_.group, n = dataset_.size() / g;  // whole groups
  std::vector<int64_t> groups(n);
  std::iota(groups.begin(), groups.end(), 0);
  if (options_.shuffle) {
    SplitMix64 rng(options_.seed, static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) std::swap(groups[i], groups[rng.below(i + 1)]);
  }
  if (g == 1) return groups;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n * g));
  for (const int64_t k : groups)
    for (int64_t j = 0; j < g; ++j) order.push_back(k * g + j);
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
  const int g = options_.group;
  MMSP_CHECK(position.offset % g == 0, "step packer: data position offset ", position.offset, " is inside a group of ",
             g, " samples");
  std::vector<int64_t> samples, lengths;
  DataPosition cursor = position;
  int64_t total = 0;
  while (static_cast<int64_t>(samples.size()) < n) {  // a group at a time
    const std::vector<int64_t>& epoch = order(cursor.epoch);
    std::vector<int64_t> members, member_lengths;
    int64_t group_length = 0;
    for (int j = 0; j < g; ++j) {
      members.push_back(epoch[cursor.offset + j]);
      member_lengths.push_back(static_cast<int64_t>(dataset_.sequence(members.back()).input_ids.size()));
      group_length += member_lengths.back();
    }
    if (total + group_length > budget() && !samples.empty()) break;  // it opens the next step
    for (int j = 0; j < g; ++j) {
      MMSP_CHECK(member_lengths[j] <= row_limit(), "step packer: sample ", members[j], " has ", member_lengths[j],
                 " tokens, more than one row holds (tokens_per_row ", row_limit(),
                 "); raise the tokens per row, or shorten the sample");
      samples.push_back(members[j]);
      lengths.push_back(member_lengths[j]);
    }
    total += group_length;
    cursor.offset += g;
    if (cursor.offset == n) cursor = {cursor.epoch + 1, 0};
  }
  // Give back from the end (a group at a time) until the planner's row assignment fits
  // every row. Any `rows` samples fit (one per row), so with groups of one at least
  // min(rows, taken) stay.
  for (;;) {
    const auto rows = plan::assign_sequences_to_dp(lengths, options_.rows);
    int64_t worst = 0;
    for (const auto& row : rows) {
      int64_t sum = 0;
      for (int64_t k : row) sum += lengths[k];
      worst = std::max(worst, sum);
    }
    if (worst <= row_limit()) break;
    MMSP_CHECK(static_cast<int64_t>(samples.size()) > g, "step packer: the group of samples ", samples.front(), "..",
               samples.back(), " (", total, " tokens) does not fit the step's ", options_.rows, " rows of ",
               row_limit(), " tokens; raise the tokens per row");
    samples.resize(samples.size() - g);
    lengths.resize(lengths.size() - g);
  }
  MMSP_CHECK(static_cast<int64_t>(samples.size()) >= options_.rows, "step packer: the step's whole groups of ", g,
             " fill ", samples.size(), " of --data-rows ", options_.rows, " rows; raise the tokens per row");
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
