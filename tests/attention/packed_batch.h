// Test helpers for attention: packed-batch layouts (the reference attention itself
// is the library's naive_attention).
#pragma once

#include <ATen/ATen.h>

#include <random>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::test {

// A packed batch: segments of the given lengths, each padded at its end to a
// multiple of `pad_to` with padding tokens (segment -1).
inline attention::TokenLayout packed_layout(const std::vector<int64_t>& lengths, int64_t pad_to) {
  std::vector<int64_t> seg, ord;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t padded = (lengths[s] + pad_to - 1) / pad_to * pad_to;
    for (int64_t i = 0; i < padded; ++i) {
      seg.push_back(i < lengths[s] ? static_cast<int64_t>(s) : -1);
      ord.push_back(i);
    }
  }
  auto t = [](const std::vector<int64_t>& x) { return at::tensor(at::ArrayRef<int64_t>(x), at::kLong).clone(); };
  return {t(seg), t(ord)};
}

inline std::vector<int64_t> random_lengths(std::mt19937& rng, int count, int max_length) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < count; ++i) lengths.push_back(std::uniform_int_distribution<int>(1, max_length)(rng));
  return lengths;
}

// Global token index of each slot of ring rank p's share (−1: padding added so the
// share splits over U ulysses ranks), written from docs/runtime.md#sharding-layout's rule independently
// of plan/. Segments are already padded to 2R. zigzag: chunks p and 2R−1−p of each
// segment; otherwise chunk p of R per segment (any layout is valid for attention).
inline std::vector<int64_t> share_of(const attention::TokenLayout& global, int R, int U, int p, bool zigzag) {
  std::vector<int64_t> slots;
  const int64_t* ord = global.order.data_ptr<int64_t>();
  const int64_t T = global.size();
  for (int64_t start = 0; start < T;) {  // one padded segment at a time
    int64_t end = start + 1;
    while (end < T && ord[end] != 0) ++end;
    auto take = [&](int64_t chunk, int64_t chunks) {
      const int64_t len = (end - start) / chunks;
      for (int64_t i = 0; i < len; ++i) slots.push_back(start + chunk * len + i);
    };
    if (zigzag) {
      take(p, 2 * R);
      take(2 * R - 1 - p, 2 * R);
    } else {
      take(p, R);
    }
    start = end;
  }
  while (slots.size() % U) slots.push_back(-1);
  return slots;
}

// The layout of the given global slots (−1: padding).
inline attention::TokenLayout layout_of(const attention::TokenLayout& global, const std::vector<int64_t>& slots) {
  std::vector<int64_t> seg, ord;
  for (int64_t s : slots) {
    seg.push_back(s >= 0 ? global.segment[s].item<int64_t>() : -1);
    ord.push_back(s >= 0 ? global.order[s].item<int64_t>() : 0);
  }
  return {at::tensor(at::ArrayRef<int64_t>(seg), at::kLong).clone(),
          at::tensor(at::ArrayRef<int64_t>(ord), at::kLong).clone()};
}

// Every ring share's layout and this rank's slots (ring rank r, ulysses rank u): the
// sharded view of a global packed batch that the multi-rank tests feed the schemes.
struct ContextSlots {
  std::vector<attention::TokenLayout> shares;
  std::vector<int64_t> mine;  // global token of each local slot, -1 for padding
};
inline ContextSlots context_slots(const attention::TokenLayout& global, int R, int U, int r, int u, bool zigzag) {
  ContextSlots out;
  for (int p = 0; p < R; ++p) {
    std::vector<int64_t> slots = share_of(global, R, U, p, zigzag);
    out.shares.push_back(layout_of(global, slots));
    if (p == r) {
      const int64_t n = static_cast<int64_t>(slots.size()) / U;
      out.mine.assign(slots.begin() + u * n, slots.begin() + (u + 1) * n);
    }
  }
  return out;
}

}  // namespace mmsp::test
