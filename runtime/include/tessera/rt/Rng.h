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

#include "tessera/rt/math/Philox.h"

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

/// One Philox4x32-10 block (math/Philox.h, shared with the CUDA kernels).
inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                             std::array<uint32_t, 2> key) {
  math::Philox4 out = math::philox4x32_10(
      math::Philox4{{ctr[0], ctr[1], ctr[2], ctr[3]}}, key[0], key[1]);
  return {out.x[0], out.x[1], out.x[2], out.x[3]};
}

/// A named random stream: the FNV hash is computed once.
class PhiloxStream {
public:
  PhiloxStream(uint64_t seed, std::string_view name)
      : seed(seed), hash(fnv1a64(name)) {}

  std::array<uint32_t, 4> block(uint64_t index) const {
    math::Philox4 out = math::philoxBlock(seed, hash, index);
    return {out.x[0], out.x[1], out.x[2], out.x[3]};
  }

  /// The FNV-1a hash of the stream's name (the Philox key).
  uint64_t nameHash() const { return hash; }

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
