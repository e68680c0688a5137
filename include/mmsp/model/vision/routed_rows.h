// The contract between the VLM step and the vision routing, without the routing itself:
// the step hands the router a way to encode items, the router (made outside the model,
// parallel/vision_routing.h) decides which items this rank encodes, moves the rows over the
// context group and returns the rows this rank's placeholder slots receive.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace mmsp::model {

// The attention exchange of vision-tower SP (plan/vision_split.h): q, k, v [this rank's
// patches of the split items, H, D] -> the same shape, where `inner` runs on every
// context rank's patches joined in rank order (tokens[p] of them from rank p) for
// H / ranks heads. Differentiable: the backward runs the mirrored exchanges on every rank.
using AttendGathered = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
using SplitExchange = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const std::vector<int64_t>& tokens, const AttendGathered& inner)>;

// This rank's part in the items split over its context group: which items (indices into
// the dp row's items, ascending) and the exchange their attention runs through.
struct SplitEncoding {
  std::vector<int64_t> items;
  int rank = 0;  // this context rank
  SplitExchange exchange;
  bool empty() const { return items.empty(); }
};

// Encodes the items `whole` (indices into this dp row's items) and this rank's shard of
// every split item; returns their rows, the whole items' in item order and then the
// shards', [Σ rows, width]. Called with nothing to encode it must still return a
// [0, width] tensor that is part of the autograd graph (the rank then still takes
// part in the collectives' backward).
using EncodeItems = std::function<at::Tensor(const std::vector<int64_t>& whole, const SplitEncoding& split)>;

struct RoutedRows {
  at::Tensor rows;   // [V, width], the rows this rank's placeholder slots receive
  at::Tensor slots;  // int64 [V], the local slot of each row
};

// Runs the encoder on this rank's share of the items and routes the rows.
using VisionRouter = std::function<RoutedRows(const EncodeItems& encode)>;

}  // namespace mmsp::model
