//===- BF16.h - bfloat16 and IEEE half <-> float conversions ----*- C++ -*-===//
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
// IEEE half (f16, Megatron's --fp16): 1 sign, 5 exponent and 10 mantissa
// bits, largest finite 65504, subnormals down to 2^-24. Widening is exact;
// narrowing rounds to nearest, ties to even (as PyTorch's .half()), values
// from 65520 up become infinity (the overflow fp16's loss scaling detects),
// small ones round to subnormals or zero, and a NaN stays a quiet NaN.
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

/// The float with f16 bits `h` (exact).
TESSERA_HD float f16ToFloat(uint16_t h) {
  // Exponent and mantissa moved to a float's places and the exponent
  // rebiased (15 -> 127); infinities and NaNs take the top exponent, and
  // subnormals (and zero) are renormalised by one exact subtraction. All
  // three are computed and one selected, so that loops vectorise.
  const uint32_t shiftedExp = 0x7c00u << 13;
  const uint32_t bits = uint32_t(h & 0x7fffu) << 13;
  const uint32_t exp = bits & shiftedExp;
  const uint32_t normal = bits + ((127u - 15u) << 23);
  const uint32_t special = normal + ((128u - 16u) << 23);
  const uint32_t subnormal = math::floatBits(
      math::bitsFloat(normal + (1u << 23)) - math::bitsFloat(113u << 23));
  const uint32_t out = exp == shiftedExp ? special
                       : exp == 0        ? subnormal
                                         : normal;
  return math::bitsFloat(out | (uint32_t(h & 0x8000u) << 16));
}

/// `f` rounded to f16, to nearest with ties to even; overflow -> infinity,
/// NaN -> quiet NaN. Branch-free (the three cases computed, one selected).
TESSERA_HD uint16_t floatToF16(float f) {
  uint32_t bits = math::floatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  // 2^16 and beyond (infinity, NaN): no finite f16 is that close.
  const uint32_t big = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Below 2^-14: a subnormal f16 or zero. Adding 0.5 puts the ten mantissa
  // bits of the result at the bottom of a float, rounded to nearest even by
  // the float addition itself. (For larger values the sum is unused.)
  const float magic = math::bitsFloat(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const float small = math::bitsFloat(bits < (113u << 23) ? bits : 0u);
  const uint32_t sub = math::floatBits(small + magic) - math::floatBits(magic);
  // Normal: rebias the exponent and round the 13 dropped bits to nearest
  // even; a carry may reach the exponent (65520 -> infinity).
  const uint32_t odd = (bits >> 13) & 1u;
  const uint32_t normal = (bits + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  const uint32_t out = bits >= ((127u + 16u) << 23) ? big
                       : bits < (113u << 23)       ? sub
                                                   : normal;
  return uint16_t(out | sign);
}

/// Storage format of a floating-point tensor: f32, or one of the 16-bit
/// formats of mixed precision (bf16 for --bf16, IEEE half for --fp16).
enum class FloatFormat { F32, BF16, F16 };

/// "f32", "bf16" or "f16", for messages.
inline const char *formatName(FloatFormat format) {
  return format == FloatFormat::F32    ? "f32"
         : format == FloatFormat::BF16 ? "bf16"
                                       : "f16";
}

/// Bytes per element of `format`.
TESSERA_HD int64_t formatBytes(FloatFormat format) {
  return format == FloatFormat::F32 ? 4 : 2;
}

/// The float with 16-bit pattern `h` of `format` (BF16 or F16).
TESSERA_HD float halfToFloat(FloatFormat format, uint16_t h) {
  return format == FloatFormat::F16 ? f16ToFloat(h) : bf16ToFloat(h);
}
/// `f` rounded to `format` (BF16 or F16), nearest even.
TESSERA_HD uint16_t floatToHalf(FloatFormat format, float f) {
  return format == FloatFormat::F16 ? floatToF16(f) : floatToBf16(f);
}

/// Element i of an array of format F as a float.
template <FloatFormat F> TESSERA_HD float loadFloat(const void *p, int64_t i) {
  if constexpr (F == FloatFormat::BF16)
    return bf16ToFloat(static_cast<const uint16_t *>(p)[i]);
  else if constexpr (F == FloatFormat::F16)
    return f16ToFloat(static_cast<const uint16_t *>(p)[i]);
  else
    return static_cast<const float *>(p)[i];
}

/// Stores `v` as element i of an array of format F (16-bit formats: nearest
/// even).
template <FloatFormat F> TESSERA_HD void storeFloat(void *p, int64_t i, float v) {
  if constexpr (F == FloatFormat::BF16)
    static_cast<uint16_t *>(p)[i] = floatToBf16(v);
  else if constexpr (F == FloatFormat::F16)
    static_cast<uint16_t *>(p)[i] = floatToF16(v);
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

/// out[i] = floatToF16(in[i]) for i < n.
inline void floatsToF16(const float *in, uint16_t *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = floatToF16(in[i]);
}

/// out[i] = f16ToFloat(in[i]) for i < n.
inline void f16ToFloats(const uint16_t *in, float *out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = f16ToFloat(in[i]);
}

/// The 16-bit `format` (BF16 or F16) conversions of whole arrays.
inline void floatsToHalf(FloatFormat format, const float *in, uint16_t *out,
                         int64_t n) {
  if (format == FloatFormat::F16)
    floatsToF16(in, out, n);
  else
    floatsToBf16(in, out, n);
}
inline void halfToFloats(FloatFormat format, const uint16_t *in, float *out,
                         int64_t n) {
  if (format == FloatFormat::F16)
    f16ToFloats(in, out, n);
  else
    bf16ToFloats(in, out, n);
}

} // namespace tessera::rt

#endif // TESSERA_RT_BF16_H
