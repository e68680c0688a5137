"""The bounds `mmsp train` applies to each line of a `.jsonl`, which `mmsp prepare` applies to each
record, with the same numbers: a sample prepare writes is one train reads.

`mmsp prepare` runs without mmsp's C++ (it needs no build), so the numbers are restated here,
each naming the C++ it comes from; tests/python/test_prepare_bounds.py reads those sources and
fails when one changes without the other.
"""

# include/mmsp/core/json_read.h kMaxJsonDepth: mmsp's JSON reader refuses deeper nesting.
MAX_JSON_DEPTH = 64

# include/mmsp/train/train_options.h InputOptions::max_image_pixels (`mmsp train --max-image-pixels`'s
# default; `mmsp pixels` has the same): width x height of one image file at most, read from the
# file's header before anything is decoded (src/train/data/jsonl_dataset.cpp image_size).
MAX_IMAGE_PIXELS = 16777216

# include/mmsp/train/run_checks.h kMaxImagePixelsBound: the largest --max-image-pixels train takes.
MAX_IMAGE_PIXELS_BOUND = 1 << 31

# stb_image.h STBI_MAX_DIMENSIONS (mmsp's image reader: src/train/data/image_file.cpp uses the
# default): a wider or taller image is one stb_image does not read.
STB_MAX_DIMENSION = 1 << 24

# src/plan/sequence.cpp kInt32Max: the tokens of a sequence (the attention kernel's int32 indices)
# and the patches of one vision item (the vision encoder's int32 cu_seqlens), at most.
INT32_MAX = 2 ** 31 - 1

# include/mmsp/plan/model_conventions.h kMaxSecondsPerGrid: second_per_grid_ts (Qwen2.5-VL) in
# [0, this] (src/train/data/jsonl_dataset.cpp read_seconds).
MAX_SECONDS_PER_GRID = 1e4
