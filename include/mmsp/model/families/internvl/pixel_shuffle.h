// InternVL's pixel shuffle: a tile's square grid of patch features becomes a grid k times
// smaller per side whose rows concatenate each k×k block of patches (k = 1/downsample_ratio),
// as transformers' InternVLModel.pixel_shuffle orders them: block row offset first, then
// column offset. Pure tensor reshaping; the projector that follows is apart.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mmsp::model {

// features [N, side², D] (patches row-major) -> [N, (side/k)², k²·D]; side = sqrt(rows),
// which k must divide. Row (r, c) of the result is [x(kr, kc), x(kr, kc+1), ...,
// x(kr+1, kc), ...]: the k×k block with its first row first.
// (Call it qualified, model::pixel_shuffle: ATen has a pixel_shuffle of its own that ADL finds.)
at::Tensor pixel_shuffle(const at::Tensor& features, int64_t k);

}  // namespace mmsp::model
