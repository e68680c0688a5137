// InternVL's dynamic tiling, as its Hugging Face image processor (GotOcr2's
// crop_to_patches) does it: an image is resized to the grid of square tiles whose aspect
// ratio is closest to its own (min_tiles..max_tiles tiles), cut into those tiles
// row-major, and, when there is more than one, followed by a thumbnail (the whole image
// resized to one tile). Decoding and resizing files is the data readers' business.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mmsp::model {

struct TilingOptions {
  // side of a tile in pixels (vision_config.image_size)
  int64_t tile_size = 448;
  // fewest and most tiles of the grid (the processor's min_patches, max_patches)
  int64_t min_tiles = 1;
  int64_t max_tiles = 12;
  // a thumbnail tile after the grid's tiles when the grid has more than one
  bool use_thumbnail = true;
};

// A grid of tiles: `columns` across, `rows` down.
struct TileGrid {
  int64_t columns = 1;
  int64_t rows = 1;
  int64_t tiles() const { return columns * rows; }
  bool operator==(const TileGrid& o) const { return columns == o.columns && rows == o.rows; }
};

// The grid for an image of height × width pixels: candidates (c, r) with
// min_tiles <= c·r <= max_tiles, in order of c·r (then c, then r); the one whose c / r is
// closest to width / height wins, a later one of equal distance replacing it while the
// image's area exceeds half the candidate's (so larger grids win ties on large images).
TileGrid closest_tile_grid(int64_t height, int64_t width, const TilingOptions& options);

// Tiles the processor yields for the image: the grid's, + 1 thumbnail when the grid has more than one.
int64_t tile_count(int64_t height, int64_t width, const TilingOptions& options);

// canvas [C, rows·S, columns·S] (the image resized to the grid) -> tiles [rows·columns, C, S, S],
// tile i at row i / columns, column i % columns.
at::Tensor cut_tiles(const at::Tensor& canvas, const TileGrid& grid, int64_t tile_size);

// image [C, H, W] (float, 0..1) -> the processor's tiles [tile_count, C, S, S] (0..1): the image
// resized (bicubic with antialiasing, as PIL's resize; clamped to 0..1) to the grid and cut,
// then the thumbnail (the image resized to S × S) when the grid has more than one tile.
at::Tensor tile_image(const at::Tensor& image, const TilingOptions& options);

}  // namespace mmsp::model
