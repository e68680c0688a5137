// Dynamic tiling; see dynamic_tiling.h. Follows transformers' get_optimal_tiled_canvas and
// GotOcr2ImageProcessor.crop_image_to_patches.
#include "mmsp/model/families/internvl/dynamic_tiling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/model/vision/image_resize.h"

namespace mmsp::model {

TileGrid closest_tile_grid(int64_t height, int64_t width, const TilingOptions& o) {
  MMSP_CHECK(height > 0 && width > 0, "dynamic tiling: the image is ", width, " x ", height,
             " pixels; both sides must be > 0");
  MMSP_CHECK(o.min_tiles >= 1 && o.min_tiles <= o.max_tiles, "dynamic tiling: min_tiles ", o.min_tiles,
             " and max_tiles ", o.max_tiles, " must satisfy 1 <= min_tiles <= max_tiles");
  std::vector<TileGrid> candidates;  // columns-major enumeration, then a stable sort by tile count
  for (int64_t c = 1; c <= o.max_tiles; ++c)
    for (int64_t r = 1; r <= o.max_tiles; ++r)
      if (c * r >= o.min_tiles && c * r <= o.max_tiles) candidates.push_back({c, r});
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const TileGrid& a, const TileGrid& b) { return a.tiles() < b.tiles(); });
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double tile_area = static_cast<double>(o.tile_size) * static_cast<double>(o.tile_size);
  double best_distance = std::numeric_limits<double>::infinity();
  TileGrid best;
  for (const TileGrid& g : candidates) {
    const double distance = std::fabs(aspect - static_cast<double>(g.columns) / static_cast<double>(g.rows));
    if (distance < best_distance) {
      best_distance = distance;
      best = g;
    } else if (distance == best_distance && area > 0.5 * tile_area * static_cast<double>(g.tiles())) {
      best = g;
    }
  }
  return best;
}

int64_t tile_count(int64_t height, int64_t width, const TilingOptions& o) {
  const int64_t tiles = closest_tile_grid(height, width, o).tiles();
  return tiles + (o.use_thumbnail && tiles > 1 ? 1 : 0);
}

at::Tensor cut_tiles(const at::Tensor& canvas, const TileGrid& grid, int64_t S) {
  MMSP_CHECK(canvas.dim() == 3 && canvas.size(1) == grid.rows * S && canvas.size(2) == grid.columns * S,
             "cut_tiles: canvas ", canvas.sizes(), " is not [C, ", grid.rows, "·", S, ", ", grid.columns, "·", S, "]");
  const int64_t C = canvas.size(0);
  // [C, rows, S, columns, S] -> [rows, columns, C, S, S]
  return canvas.reshape({C, grid.rows, S, grid.columns, S})
      .permute({1, 3, 0, 2, 4})
      .reshape({grid.tiles(), C, S, S})
      .contiguous();
}

namespace {

// [C, H, W] -> [C, height, width], as the processor resizes: PIL's bicubic on the 8-bit image.
at::Tensor resize(const at::Tensor& image, int64_t height, int64_t width) {
  return resize_unit_float_like_pil(image, height, width);
}

}  // namespace

at::Tensor tile_image(const at::Tensor& image, const TilingOptions& o) {
  MMSP_CHECK(image.dim() == 3, "tile_image: image must be [C, H, W], got ", image.sizes());
  const TileGrid grid = closest_tile_grid(image.size(1), image.size(2), o);
  const int64_t S = o.tile_size;
  at::Tensor tiles = cut_tiles(resize(image, grid.rows * S, grid.columns * S), grid, S);
  if (o.use_thumbnail && grid.tiles() > 1) tiles = at::cat({tiles, resize(image, S, S).unsqueeze(0)}, 0);
  return tiles;
}

}  // namespace mmsp::model
