//===- BF16.h - bfloat16 <-> float conversions ------------------*- C++ -*-===//
//
// bfloat16 is the high half of an IEEE float: 1 sign, 8 exponent and 7
// mantissa bits. Widening is exact (the bits shifted left by 16); narrowing
// rounds to nearest, ties to even, as Megatron's (PyTorch's) .bfloat16()
// does. A NaN stays a NaN (made quiet, sign kept), which plain rounding
// would not guarantee: a NaN whose payload lies only in the low 16 bits
// would otherwise round to infinity. Values beyond the largest bf16 round
// to infinity, like any other overflow.
//
// The functions are branch-free on integers so that loops over them
// vectorise; the executor's kernels, the MPI reduction of bf16 buffers and
// checkpoint dtype conversion all use these, so every path rounds alike;
// the two conversions are host/device functions (math/HostDevice.h), so the
// CUDA kernels round exactly as the CPU does.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BF16_H
#define TESSERA_RT_BF16_H

#include "tessera/rt/math/HostDevice.h"

#include <cstdint>

namespace tessera::rt {

/// The float with bf16 bits `h` (exact).
TESSERA_HD float bf16ToFloat(uint16_t h) {
  return math::bitsFloat(uint32_t(h) << 16);
}

/// `f` rounded to bf16, to nearest with ties to even; NaN -> quiet NaN.
TESSERA_HD uint16_t floatToBf16(float f) {
  uint32_t bits = math::floatBits(f);
  // Adding 0x7fff plus the lowest kept bit rounds the dropped half to
  // nearest, ties to the even kept value; a carry into the exponent is the
  // correct rounding up to the next binade (or to infinity).
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // NaN: keep the sign and the top payload bits and set the quiet bit.
  uint32_t quiet = (bits >> 16) | 0x0040u;
  bool isNan = int32_t(bits & 0x7fffffffu) > int32_t(0x7f800000u);
  return uint16_t(isNan ? quiet : rounded);
}

/// Element i of an f32 (Bf16 false) or bf16 array as a float.
template <bool Bf16> TESSERA_HD float loadFloat(const void *p, int64_t i) {
  if constexpr (Bf16)
    return bf16ToFloat(static_cast<const uint16_t *>(p)[i]);
  else
    return static_cast<const float *>(p)[i];
}

/// Stores `v` as element i of an f32 or bf16 array (bf16: nearest even).
template <bool Bf16> TESSERA_HD void storeFloat(void *p, int64_t i, float v) {
  if constexpr (Bf16)
    static_cast<uint16_t *>(p)[i] = floatToBf16(v);
  else
    static_cast<float *>(p)[i] = v;
}

/// out[i] = floatToBf16(in[i]) for i < n.
inline void floatsToBf16(const float *in, uint16_t *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = floatToBf16(in[i]);
}

/// out[i] = bf16ToFloat(in[i]) for i < n.
inline void bf16ToFloats(const uint16_t *in, float *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = bf16ToFloat(in[i]);
}

} // namespace tessera::rt

#endif // TESSERA_RT_BF16_H
