// XXH64 (Yann Collet's xxHash, 64-bit variant), streaming, for checkpoint checksums
// and step fingerprints. Written here rather than taken from libxxhash-dev so that
// the build needs no new package; checked against the published test vectors
// (tests/train/test_checkpoint.cpp). Not cryptographic: it catches corruption, not
// an adversary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace mmsp {

class XxHash64 {
 public:
  explicit XxHash64(uint64_t seed = 0) { reset(seed); }

  void reset(uint64_t seed = 0) {
    v_[0] = seed + kP1 + kP2;
    v_[1] = seed + kP2;
    v_[2] = seed;
    v_[3] = seed - kP1;
    seed_ = seed;
    total_ = 0;
    buffered_ = 0;
  }

  XxHash64& update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (n < 32 - buffered_) {  // (buffered_ < 32 always; no sum that could wrap)
      if (n) std::memcpy(buffer_ + buffered_, p, n);
      buffered_ += n;
      return *this;
    }
    if (buffered_) {
      const size_t fill = 32 - buffered_;
      std::memcpy(buffer_ + buffered_, p, fill);
      stripe(buffer_);
      p += fill;
      n -= fill;
      buffered_ = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(p);
    if (n) std::memcpy(buffer_, p, n);
    buffered_ = n;
    return *this;
  }
  XxHash64& update(const std::string& s) { return update(s.data(), s.size()); }
  template <typename T>
  XxHash64& add(const T& value) {  // a trivially copyable value, by its bytes
    return update(&value, sizeof value);
  }

  uint64_t digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
      for (uint64_t v : v_) h = (h ^ round(0, v)) * kP1 + kP4;
    } else {
      h = seed_ + kP5;
    }
    h += total_;
    const unsigned char* p = buffer_;
    size_t n = buffered_;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, read64(p)), 27) * kP1 + kP4;
    if (n >= 4) {
      h = rotl(h ^ (uint64_t{read32(p)} * kP1), 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = rotl(h ^ (*p * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  static uint64_t of(const void* data, size_t n, uint64_t seed = 0) { return XxHash64(seed).update(data, n).digest(); }
  static uint64_t of(const std::string& s, uint64_t seed = 0) { return of(s.data(), s.size(), seed); }

  // "ef46db3751d8e999": 16 lowercase hex digits.
  static std::string hex(uint64_t h) {
    static const char digits[] = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 15; i >= 0; --i, h >>= 4) out[i] = digits[h & 15];
    return out;
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL,
                            kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t round(uint64_t acc, uint64_t input) { return rotl(acc + input * kP2, 31) * kP1; }
  static uint64_t read64(const unsigned char* p) {  // little-endian hosts (x86-64, aarch64)
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  static uint32_t read32(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void stripe(const unsigned char* p) {
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], read64(p + 8 * i));
  }

  uint64_t v_[4];
  uint64_t seed_ = 0, total_ = 0;
  unsigned char buffer_[32];
  size_t buffered_ = 0;
};

}  // namespace mmsp
