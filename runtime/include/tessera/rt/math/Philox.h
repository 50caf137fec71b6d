//===- Philox.h - Philox4x32-10 and the dropout mask ------------*- C++ -*-===//
//
// The counter-based generator behind every random number of the runtime
// (tessera/rt/Rng.h documents the exact definition), in a form the CUDA
// kernels share with the CPU: a dropout mask is a pure function of (seed,
// stream, global sample, global position, feature), so the CPU and the GPU
// drop exactly the same elements, whatever the parallel layout.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_MATH_PHILOX_H
#define TESSERA_RT_MATH_PHILOX_H

#include "tessera/rt/math/HostDevice.h"

namespace tessera::rt::math {

/// One 128-bit Philox block (counter in, random words out).
struct Philox4 {
  uint32_t x[4];
};

/// Philox4x32-10 of counter `c` under key {k0, k1} (Salmon et al., SC'11).
TESSERA_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * c.x[0];
    uint64_t p1 = uint64_t(kM1) * c.x[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    Philox4 next = {{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    c = next;
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

/// The block at `index` of the stream keyed by name hash `hash` and `seed`
/// (counter {index, seed}, key = the hash's halves).
TESSERA_HD Philox4 philoxBlock(uint64_t seed, uint64_t hash, uint64_t index) {
  Philox4 c = {{uint32_t(index), uint32_t(index >> 32), uint32_t(seed),
                uint32_t(seed >> 32)}};
  return philox4x32_10(c, uint32_t(hash), uint32_t(hash >> 32));
}

/// Dropout keeps element `counter` of a stream when its 32-bit word u
/// satisfies u * 2^-32 >= rate, i.e. u >= ceil(rate * 2^32): this integer
/// threshold (both sides exact in double) is what every backend compares
/// against, so masks are bit-identical.
TESSERA_HD uint64_t dropoutThreshold(float rate) {
  double t = double(rate) * 4294967296.0;
  uint64_t threshold = uint64_t(t);
  return double(threshold) < t ? threshold + 1 : threshold;
}

/// The 32-bit word of element `counter` of the stream: word counter % 4 of
/// block counter / 4 (one block gives four elements).
TESSERA_HD uint32_t philoxWord(uint64_t seed, uint64_t hash, uint64_t counter) {
  Philox4 b = philoxBlock(seed, hash, counter >> 2);
  // Selected without indexing by a variable, which would put the block in
  // local memory on the device.
  const uint32_t lo = counter & 1 ? b.x[1] : b.x[0];
  const uint32_t hi = counter & 1 ? b.x[3] : b.x[2];
  return counter & 2 ? hi : lo;
}

/// The counter of feature `h` at global position `position` of global
/// sample `sample`, for activations of `seqTotal` positions and `hidden`
/// features: (sample * seqTotal + position) * hidden + h. It depends on no
/// parallel split, which is why every layout drops the same elements.
TESSERA_HD uint64_t dropoutCounter(int64_t sample, int64_t seqTotal,
                                   int64_t position, int64_t hidden,
                                   int64_t h) {
  return (uint64_t(sample) * uint64_t(seqTotal) + uint64_t(position)) *
             uint64_t(hidden) +
         uint64_t(h);
}

/// The global sample index of batch column `column` of microbatch
/// `microbatch` of iteration `iteration` (1-based) for a data-parallel
/// replica `dpIndex` of `dpSize` (Megatron's batch sampler order: an
/// iteration's global batch is microbatch-major, then replica, then column).
TESSERA_HD int64_t globalSample(int64_t globalBatch, int64_t microBatch,
                                int64_t dpSize, int64_t dpIndex,
                                int64_t iteration, int64_t microbatch,
                                int64_t column) {
  return (iteration - 1) * globalBatch + microbatch * microBatch * dpSize +
         dpIndex * microBatch + column;
}

} // namespace tessera::rt::math

#endif // TESSERA_RT_MATH_PHILOX_H
