// How vision rows reach the ranks that hold their placeholder slots (the routing itself
// is parallel/vision_routing.h):
//  routed:    each rank encodes its items (Vision DP), an all-to-all-v sends just the rows
//             each rank needs (default)
//  gather:    each rank encodes its items, an all-gather brings every row to every rank,
//             each keeps its own (the Python Vision DP patches); backward reduces and slices
//  replicate: every rank encodes every item of its row (plain Ulysses)
#pragma once

#include <string>

namespace mmsp::model {

enum class VisionMode { routed, gather, replicate };
VisionMode parse_vision_mode(const std::string& name);
const char* to_string(VisionMode mode);

}  // namespace mmsp::model
