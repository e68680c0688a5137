// splitmix64: the small portable generator behind every random draw of the data side
// (shapes samples, epoch permutations). Plain integer arithmetic, so a (seed, index)
// draws the same values with every compiler and standard library; no std distributions.
#pragma once

#include <cstdint>

namespace mmsp::train {

// Steele, Lea & Flood's splitmix64 step: advances `state` and returns the next output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stream for one (seed, key) pair, e.g. (dataset seed, sample index) or (seed, epoch).
class SplitMix64 {
 public:
  SplitMix64(uint64_t seed, uint64_t key) : state_(seed) {
    uint64_t k = key ^ 0xD1B54A32D192ED03ull;
    state_ ^= splitmix64(k);
  }
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [0, n) for n >= 1 (Lemire's multiply-shift; bias below n / 2^64).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }
  // Uniform in [lo, hi], both included.
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace mmsp::train
