// The three vision modes; see vision_routing.h. Where rows go is read off the plan's
// routes: nothing here searches token ids.
#include "mmsp/parallel/vision_routing.h"

#include <ATen/ATen.h>

#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::parallel {

using model::EncodeItems;
using model::RoutedRows;
using model::SplitEncoding;
using model::VisionMode;
using model::VisionRouter;

namespace {

at::Tensor index_tensor(const std::vector<int64_t>& values) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong).clone();
}
// The same rows as an index on `rows`' device (the plan is made on the host).
at::Tensor index_on(const std::vector<int64_t>& values, const at::Tensor& rows) {
  return index_tensor(values).to(rows.device());
}

// The split items' attention goes over the context group: Ulysses' all-to-all-v from
// patches to heads and back (the item's patches are this group's tokens).
SplitEncoding split_encoding(const plan::StepPlan& plan, const dist::GroupPtr& context) {
  SplitEncoding split;
  split.items = plan.mine.routes.split_items;
  split.rank = plan.mine.coords.context_rank(plan.options.mesh);
  MMSP_CHECK(split.items.empty() || context->rank() == split.rank, "the context group's rank ", context->rank(),
             " is not the plan's context rank ", split.rank);
  split.exchange = [context](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& tokens, const model::AttendGathered& inner) {
    return attention::ulysses_attention_v(q, k, v, context, tokens, inner);
  };
  return split;
}

}  // namespace

RoutedRows route_vision_rows(const plan::StepPlan& plan, const EncodeItems& encode, const dist::GroupPtr& context,
                             VisionMode mode) {
  const plan::RankRoutes& routes = plan.mine.routes;
  const std::vector<plan::VisionItem>& items = plan.rows.at(plan.mine.coords.dp).items;
  const int S = context->size();
  MMSP_CHECK(S == plan.options.mesh.context(), "the plan's context group has ", plan.options.mesh.context(),
             " ranks but the step runs on ", S);
  // Received rows come from rank 0 first, each source's rows in slot order.
  std::vector<int64_t> slots, pick;
  for (const auto& from : routes.recv)
    for (const plan::RouteRow& r : from) slots.push_back(r.slot);
  RoutedRows out;
  out.slots = index_tensor(slots);

  if (mode == VisionMode::routed) {
    at::Tensor mine = encode(routes.encoder_items, split_encoding(plan, context));
    std::vector<int64_t> send_rows, send_counts(S), recv_counts(S);
    for (int dst = 0; dst < S; ++dst) {
      send_counts[dst] = static_cast<int64_t>(routes.send[dst].size());
      for (const plan::RouteRow& r : routes.send[dst]) send_rows.push_back(r.src_row);
    }
    for (int src = 0; src < S; ++src) recv_counts[src] = static_cast<int64_t>(routes.recv[src].size());
    out.rows = dist::all_to_all_v(mine.index_select(0, index_on(send_rows, mine)), send_counts, recv_counts, context);
    return out;
  }
  if (mode == VisionMode::gather) {
    at::Tensor mine = encode(routes.encoder_items, split_encoding(plan, context));
    std::vector<int64_t> counts(S, 0), offset(S, 0);
    for (const plan::VisionItem& item : items)
      for (int r = 0; r < S; ++r) counts[r] += item.rows_encoded_by(r);
    for (int r = 1; r < S; ++r) offset[r] = offset[r - 1] + counts[r - 1];
    at::Tensor all = dist::all_gather_v(mine, counts, context);
    for (int src = 0; src < S; ++src)
      for (const plan::RouteRow& r : routes.recv[src]) pick.push_back(offset[src] + r.src_row);
    out.rows = all.index_select(0, index_on(pick, all));
    return out;
  }
  // replicate: every item of the row, whole (split ones too), in item order
  std::vector<int64_t> every(items.size()), first_row(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    every[i] = static_cast<int64_t>(i);
    if (i > 0) first_row[i] = first_row[i - 1] + items[i - 1].rows;
  }
  at::Tensor all = encode(every, SplitEncoding{});
  for (int src = 0; src < S; ++src)
    for (const plan::RouteRow& r : routes.recv[src]) pick.push_back(first_row.at(r.item) + r.row);
  out.rows = all.index_select(0, index_on(pick, all));
  return out;
}

VisionRouter vision_router(const plan::StepPlan& plan, dist::GroupPtr context, VisionMode mode) {
  return [&plan, context = std::move(context), mode](const EncodeItems& encode) {
    return route_vision_rows(plan, encode, context, mode);
  };
}

}  // namespace mmsp::parallel
