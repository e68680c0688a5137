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

// Encodes the given items (indices into this dp row's items) and returns their rows in
// item order, [Σ rows, width]. Called with an empty list it must still return a
// [0, width] tensor that is part of the autograd graph (the rank then still takes
// part in the collectives' backward).
using EncodeItems = std::function<at::Tensor(const std::vector<int64_t>& items)>;

struct RoutedRows {
  at::Tensor rows;   // [V, width], the rows this rank's placeholder slots receive
  at::Tensor slots;  // int64 [V], the local slot of each row
};

// Runs the encoder on this rank's share of the items and routes the rows.
using VisionRouter = std::function<RoutedRows(const EncodeItems& encode)>;

}  // namespace mmsp::model
