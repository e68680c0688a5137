// Comparing one rank's token rows with a single-process reference: the rows of the
// whole sequence a rank's slots hold (slot −1: padding, a zero row), and the check that
// every slot's row equals the reference row of its token in fp64 (1e-9 relative).
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace mmsp::test {

// x [T, ...] -> [slots, ...]: row slots[i] of x, zeros where slots[i] < 0.
inline at::Tensor gather_rows(const at::Tensor& x, const std::vector<int64_t>& slots) {
  std::vector<at::Tensor> rows;
  for (int64_t s : slots) rows.push_back(s >= 0 ? x[s] : at::zeros_like(x[0]));
  return at::stack(rows);
}

// got [slots, ...] against gather_rows(ref, slots); reports the first differing slot.
inline void expect_rows_match(const at::Tensor& got, const at::Tensor& ref, const std::vector<int64_t>& slots,
                              const std::string& what) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const at::Tensor expected = slots[i] >= 0 ? ref[slots[i]] : at::zeros_like(ref[0]);
    const double diff = (got[i] - expected).abs().max().item<double>();
    const double tol = 1e-9 * (1 + expected.abs().max().item<double>());
    if (diff > tol) {
      ADD_FAILURE() << what << ": slot " << i << " (global token " << slots[i] << ") differs by " << diff;
      return;  // the first mismatch says enough
    }
  }
}

}  // namespace mmsp::test
