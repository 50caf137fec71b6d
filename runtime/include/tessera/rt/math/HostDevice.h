//===- HostDevice.h - Code shared by the CPU and CUDA kernels ---*- C++ -*-===//
//
// The per-element and per-row math of the kernels lives in headers under
// tessera/rt/math/ that both the CPU backend (g++) and the CUDA backend
// (nvcc) compile, so the two backends compute the same formulas from one
// source: TESSERA_HD marks a function callable from host and device code.
// The CPU tests compile these headers too, which is how the CUDA kernels'
// math is checked on machines without a GPU.
//
// Only what both compilers accept belongs here: no std::array, no
// std::memcpy on the device, no exceptions, no library calls other than the
// <cmath> functions CUDA provides for device code (sqrt, log, pow, fabs).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_MATH_HOSTDEVICE_H
#define TESSERA_RT_MATH_HOSTDEVICE_H

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
/// Always inlined on the host: the CPU backend's `#pragma omp simd` loops
/// vectorise only when every call in them is inlined.
#define TESSERA_HD __attribute__((always_inline)) inline
#endif

namespace tessera::rt::math {

/// The bits of `f` (bit_cast; memcpy on the host, the intrinsic on the
/// device).
TESSERA_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
#endif
}

/// The float with bits `bits`.
TESSERA_HD float bitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

/// `c ? a : b` through bit masks. A plain conditional on a float lets GCC
/// thread jumps and specialise the code after it per constant, which the
/// vectoriser then rejects as control flow (FP ops may trap); on the device
/// it compiles to a select.
TESSERA_HD float selectf(bool c, float a, float b) {
  uint32_t mask = 0u - uint32_t(c);
  return bitsFloat((floatBits(a) & mask) | (floatBits(b) & ~mask));
}

} // namespace tessera::rt::math

#endif // TESSERA_RT_MATH_HOSTDEVICE_H
