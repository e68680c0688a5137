// Plan -> step tensors, and the globally normalised loss; see rank_inputs.h.
#include "mmsp/model/rank_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"

namespace mmsp::model {
namespace {

at::Tensor as_tensor(const std::vector<int64_t>& values) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong).clone();
}

}  // namespace

RankInputs rank_inputs(const plan::Batch& batch, const plan::StepPlan& plan) {
  const plan::RankPlan& mine = plan.mine;
  const plan::RowPlan& row = plan.rows.at(mine.coords.dp);
  std::vector<int64_t> ids(mine.local_length, 0), real;
  for (int64_t slot = 0; slot < mine.local_length; ++slot) {
    const int32_t seg = mine.segment_ids[slot];
    if (seg < 0) continue;
    const plan::Segment& segment = row.packing.segments.at(seg);
    const int64_t index = mine.segment_index[slot];
    if (index < segment.length) {
      ids[slot] = batch.sequences.at(segment.sequence).input_ids.at(index);
      real.push_back(slot);
    }
  }
  RankInputs in;
  in.token_ids = as_tensor(ids);
  in.real = as_tensor(real);
  in.positions = as_tensor(mine.positions).view({mine.position_rows, mine.local_length});
  in.labels = as_tensor(mine.labels);
  in.ring_shares = attention::ring_shares(row.shards);
  in.split_slots = attention::split_slots(row.shards);
  in.label_count = plan.label_count;
  for (const plan::Sequence& s : batch.sequences)
    in.longest_sequence = std::max(in.longest_sequence, static_cast<int64_t>(s.input_ids.size()));
  return in;
}

}  // namespace mmsp::model
