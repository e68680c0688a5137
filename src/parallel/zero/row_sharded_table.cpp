// The LM head and the embedding by rows under ZeRO-3; see row_sharded_table.h.
#include "mmsp/parallel/zero/row_sharded_table.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::parallel {

RowShardedTable::RowShardedTable(int64_t vocab, int64_t width, at::Tensor master, std::function<at::Tensor()> grad,
                                 at::ScalarType model_dtype, dist::GroupPtr world)
    : vocab_(vocab),
      width_(width),
      rows_per_rank_(rows_per_rank(vocab, world->size())),
      master_(std::move(master)),
      grad_(std::move(grad)),
      model_dtype_(model_dtype),
      world_(std::move(world)) {
  MMSP_CHECK(master_.numel() == rows_per_rank_ * width_, "RowShardedTable: a shard of ", master_.numel(),
             " elements for ", rows_per_rank_, " rows of width ", width_);
}

at::Tensor RowShardedTable::my_round(int64_t k, int64_t block) const {
  const int64_t first = k * block, n = std::clamp<int64_t>(rows_per_rank_ - first, 0, block);
  at::Tensor piece = at::zeros({block * width_}, master_.options().dtype(model_dtype_));
  if (n > 0) piece.narrow(0, 0, n * width_).copy_(master_.narrow(0, first * width_, n * width_));
  return piece;
}

void RowShardedTable::start(int64_t k, int64_t block) {
  incoming_ = at::empty({world_->size() * block * width_}, master_.options().dtype(model_dtype_));
  pending_ = dist::all_gather_into_async(my_round(k, block), incoming_, world_);
  pending_round_ = k;
  pending_block_ = block;
}

at::Tensor RowShardedTable::gather_round(int64_t k, int64_t block) {
  MMSP_CHECK(block > 0 && k >= 0 && k < rounds(block), "RowShardedTable: round ", k, " of ", rounds(block),
             " (blocks of ", block, " rows)");
  at::NoGradGuard no_grad;
  if (pending_round_ != k || pending_block_ != block) start(k, block);  // not prefetched: gather now
  pending_.wait();
  at::Tensor out = std::move(incoming_);
  pending_round_ = -1;
  if (k + 1 < rounds(block)) start(k + 1, block);  // moves while round k computes
  return out.view({world_->size() * block, width_});
}

void RowShardedTable::reduce_round(int64_t k, int64_t block, const at::Tensor& grad) {
  MMSP_CHECK(grad.dim() == 2 && grad.size(0) == world_->size() * block && grad.size(1) == width_,
             "RowShardedTable: round gradient ", grad.sizes(), ", want [", world_->size() * block, ", ", width_, "]");
  at::NoGradGuard no_grad;
  const at::Tensor mine = dist::reduce_scatter(grad.to(master_.scalar_type()).reshape({-1}), *world_);  // [block·h]
  const int64_t first = k * block, n = std::clamp<int64_t>(rows_per_rank_ - first, 0, block);
  if (n > 0) grad_().narrow(0, first * width_, n * width_).add_(mine.narrow(0, 0, n * width_));
}

at::Tensor RowShardedTable::lookup(const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  const int64_t P = world_->size(), me = world_->rank(), R = rows_per_rank_;
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong);
  if (flat.numel() > 0)
    MMSP_CHECK(flat.min().item<int64_t>() >= 0 && flat.max().item<int64_t>() < vocab_, "token ids outside [0, ", vocab_,
               ") looked up in a row-sharded table");
  // Each distinct id once, asked of the rank that owns its row (ascending ids: grouped by owner).
  const auto [unique, inverse, counts_unused] = at::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true);
  (void)counts_unused;
  const at::Tensor send = at::bincount(at::floor_divide(unique, R), {}, P).to(at::kLong).cpu();  // [P]
  // Every rank's asks, so each knows how many ids it gets from each.
  const at::Tensor all = dist::all_gather_v(send.to(flat.device()), std::vector<int64_t>(P, P), world_).cpu();
  std::vector<int64_t> send_counts(P), recv_counts(P);
  for (int64_t p = 0; p < P; ++p)
    send_counts[p] = send[p].item<int64_t>(), recv_counts[p] = all[p * P + me].item<int64_t>();
  const at::Tensor asked = dist::all_to_all_v(unique, send_counts, recv_counts, world_);  // ids of my rows
  const at::Tensor rows = master_.view({R, width_}).index_select(0, asked - me * R).to(model_dtype_);
  const at::Tensor back = dist::all_to_all_v(rows, recv_counts, send_counts, world_);  // [unique, h]
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(width_);
  return back.index_select(0, inverse).view(shape);
}

}  // namespace mmsp::parallel
