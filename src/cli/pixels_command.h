// `mmsp pixels --model M --data D.jsonl --out F.safetensors`: the pixels mmsp feeds the
// vision tower for each image and video of a data file, as the training run decodes them
// (docs/data.md#pixels), written to one safetensors file to compare with an image
// processor's pixel_values (tests/hf/test_pixels.py) or to look at.
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_pixels_command(CLI::App& parent);
}  // namespace mmsp::cli
