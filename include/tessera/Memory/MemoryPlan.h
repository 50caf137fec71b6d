//===- MemoryPlan.h - Static memory plan of transient buffers ---*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), like the rank groups, buckets and schedules:
// the offsets of a phase's transient buffers in its part of the arena,
// given when each buffer is live. tessera-lower-to-rt plans every phase
// with it; the phases of a program share the transient region, since they
// never run at once.
//
// The plan is a linear scan in program order with a coalescing first-fit
// free list (O(n log n)): buffers are placed by start (larger first among
// equal starts), a buffer is released once the scan passes its last use,
// and a request that fits no free block grows the block at the top of the
// arena if there is one. A transformer allocates saved activations in the
// forward and frees them in reverse in the backward; for such nested
// lifetimes first fit packs like a stack and the arena is exactly the
// largest live sum (peakLiveBytes).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_MEMORY_MEMORYPLAN_H
#define TESSERA_MEMORY_MEMORYPLAN_H

#include <cstdint>
#include <vector>

namespace tessera::memory {

/// A transient buffer of `bytes` bytes, live from the op at position
/// `start` to the op at position `end` (both included; start <= end).
struct Interval {
  int64_t start = 0, end = 0, bytes = 0;
};

struct Plan {
  /// Offset of each interval from the start of the transient region, a
  /// multiple of the alignment.
  std::vector<int64_t> offsets;
  /// The region's size: the largest offset + aligned size.
  int64_t arenaBytes = 0;
};

/// `bytes` rounded up to a multiple of `alignment` (> 0).
int64_t alignTo(int64_t bytes, int64_t alignment);

/// Places every interval so that no two whose lifetimes intersect share a
/// byte, each at a multiple of `alignment` and taking its size rounded up
/// to it.
Plan planLinearScan(const std::vector<Interval> &intervals, int64_t alignment);

/// The largest sum of aligned sizes live at one position: what any plan
/// needs at least.
int64_t peakLiveBytes(const std::vector<Interval> &intervals,
                      int64_t alignment);

} // namespace tessera::memory

#endif // TESSERA_MEMORY_MEMORYPLAN_H
