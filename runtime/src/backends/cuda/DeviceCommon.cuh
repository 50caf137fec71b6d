//===- DeviceCommon.cuh - Pieces every kernel file uses ---------*- CUDA -*-===//
//
// Launch geometry, grid-stride loops, block reductions and the DeviceError
// record, shared by Kernels.cu and MoEKernels.cu (each a separate
// translation unit; everything here is inline).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_DEVICECOMMON_CUH
#define TESSERA_RT_BACKENDS_CUDA_DEVICECOMMON_CUH

#include "DeviceError.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/math/HostDevice.h"

#include <algorithm>
#include <cstdint>

namespace tessera::rt::cuda {

inline constexpr int kThreads = 256;
/// Threads of the single-block reductions (mean, token mean).
inline constexpr int kReduceThreads = 1024;

/// Blocks for a grid-stride loop over n elements.
inline unsigned blocksFor(int64_t n) {
  return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20));
}

/// A kernel operand stored in FloatFormat F (the Backend's FloatIn and
/// FloatOut on the device): element i loads as f32 (exactly), and a store
/// rounds once to F, to nearest even. For F32 these are plain loads and
/// stores, so the f32 kernels compile to what they were.
template <FloatFormat F> struct Floats {
  void *p;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return loadFloat<F>(p, i);
  }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    storeFloat<F>(p, i, v);
  }
  __device__ __forceinline__ Floats operator+(int64_t i) const {
    return {static_cast<char *>(p) + i * (F == FloatFormat::F32 ? 4 : 2)};
  }
};

/// fn(Floats<F>{p}) for the F that `format` names: a kernel templated on
/// its operands' accessors is instantiated for each format.
template <class Fn> auto withFloats(void *p, FloatFormat format, Fn &&fn) {
  switch (format) {
  case FloatFormat::BF16:
    return fn(Floats<FloatFormat::BF16>{p});
  case FloatFormat::F16:
    return fn(Floats<FloatFormat::F16>{p});
  default:
    return fn(Floats<FloatFormat::F32>{p});
  }
}

__device__ __forceinline__ int64_t firstIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridStride() {
  return int64_t(gridDim.x) * blockDim.x;
}

#define TESSERA_GRID_LOOP(i, n)                                                \
  for (int64_t i = firstIndex(); i < (n); i += gridStride())

/// Records the first data error (later ones are dropped).
__device__ inline void recordError(DeviceError *err, int kind, long long value,
                            long long row, long long limit, long long extra) {
  if (atomicCAS(&err->kind, int(kNoError), kind) == int(kNoError)) {
    err->value = value;
    err->row = row;
    err->limit = limit;
    err->extra = extra;
  }
}

struct SumOp {
  template <typename T> __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
/// max that skips NaN, as the CPU's rowMax does.
struct MaxOp {
  __device__ float operator()(float a, float b) const {
    return math::selectf(b > a, b, a);
  }
};

/// Reduces `v` over the block (blockDim.x a multiple of 32, at most 1024);
/// every thread gets the result.
template <typename T, typename Op>
__device__ inline T blockReduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); // partial may still be read by a previous reduction
  if (lane == 0)
    partial[warp] = v;
  __syncthreads();
  const int warps = int(blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : identity;
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ inline float blockSum(float v) { return blockReduce(v, SumOp(), 0.0f); }
__device__ inline double blockSumD(double v) { return blockReduce(v, SumOp(), 0.0); }
__device__ inline float blockMax(float v) {
  return blockReduce(v, MaxOp(), -INFINITY);
}
__device__ inline long long blockCount(long long v) {
  return blockReduce(v, SumOp(), 0ll);
}

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_DEVICECOMMON_CUH
