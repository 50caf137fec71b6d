//===- Rng.h - Counter-based random numbers ---------------------*- C++ -*-===//
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11) used as a stateless function of (seed, name, index). Every
// value the runtime draws (weight init, synthetic data) is addressed by a
// global index, so any sharding or parallel layout reproduces the exact same
// numbers.
//
// Exact definition (so other tools can reproduce it):
//   h      = FNV-1a 64 of the name bytes (offset 0xcbf29ce484222325,
//            prime 0x100000001b3)
//   key    = { lo32(h), hi32(h) }
//   ctr    = { lo32(index), hi32(index), lo32(seed), hi32(seed) }
//   x[0..3] = Philox4x32-10(ctr, key)
//   uniform(seed, name, index) = ((x1 << 32 | x0) >> 11) * 2^-53  in [0, 1)
//   u2                          = ((x3 << 32 | x2) >> 11) * 2^-53
//   normal(seed, name, index)  = sqrt(-2 ln(1 - uniform)) * cos(2 pi u2)
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_RNG_H
#define TESSERA_RT_RNG_H

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace tessera::rt {

/// 64-bit FNV-1a hash of `s`.
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// One Philox4x32-10 block.
inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                             std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * ctr[0];
    uint64_t p1 = uint64_t(kM1) * ctr[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

/// A named random stream: the FNV hash is computed once.
class PhiloxStream {
public:
  PhiloxStream(uint64_t seed, std::string_view name)
      : seed(seed), hash(fnv1a64(name)) {}

  std::array<uint32_t, 4> block(uint64_t index) const {
    return philox4x32_10({uint32_t(index), uint32_t(index >> 32),
                          uint32_t(seed), uint32_t(seed >> 32)},
                         {uint32_t(hash), uint32_t(hash >> 32)});
  }

  /// Uniform double in [0, 1) from words 0 and 1 of the block.
  double uniform(uint64_t index) const {
    auto x = block(index);
    return toUnit(x[0], x[1]);
  }

  /// Standard normal via Box-Muller on the two uniforms of one block.
  double normal(uint64_t index) const {
    auto x = block(index);
    double u1 = toUnit(x[0], x[1]);
    double u2 = toUnit(x[2], x[3]);
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(kTwoPi * u2);
  }

  static double toUnit(uint32_t lo, uint32_t hi) {
    uint64_t bits = (uint64_t(hi) << 32) | lo;
    return double(bits >> 11) * (1.0 / 9007199254740992.0); // 2^-53
  }

private:
  uint64_t seed;
  uint64_t hash;
};

/// Uniform in [0, 1) addressed by (seed, name, index).
inline double uniform(uint64_t seed, std::string_view name, uint64_t index) {
  return PhiloxStream(seed, name).uniform(index);
}

/// Standard normal addressed by (seed, name, index).
inline double normal(uint64_t seed, std::string_view name, uint64_t index) {
  return PhiloxStream(seed, name).normal(index);
}

} // namespace tessera::rt

#endif // TESSERA_RT_RNG_H
