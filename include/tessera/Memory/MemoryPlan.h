//===- MemoryPlan.h - Static memory plan of transient buffers ---*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), like the rank groups, buckets and schedules:
// the offsets of a phase's transient buffers in its part of the arena,
// given when each buffer is live. tessera-lower-to-rt plans every phase
// with it; the phases of a program share the transient region, since they
// never run at once.
//
// Finding the smallest arena is NP-hard (dynamic storage allocation), so
// planTransients runs two heuristics and keeps the smaller arena:
//   - planLinearScan: a linear scan in program order with a coalescing
//     first-fit free list (O(n log n)): buffers are placed by start (larger
//     first among equal starts), a buffer is released once the scan passes
//     its last use, and a request that fits no free block grows the block
//     at the top of the arena if there is one. A transformer allocates
//     saved activations in the forward and frees them in reverse in the
//     backward; for such nested lifetimes first fit packs like a stack and
//     the arena is exactly the largest live sum (peakLiveBytes).
//   - planGreedyBySize: the largest buffers first, each at the lowest
//     offset of the smallest gap between the already placed buffers it is
//     live with (best fit; O(n^2) in the worst case). Where lifetimes
//     cross rather than nest (a forward's scratch next to the values it
//     saves, 16-bit activations beside their f32 copies), the scan leaves
//     holes that no later buffer fits and this does not.
// The scan is kept on a tie, and alone when it is within 0.1% of the lower
// bound (peakLiveBytes), where the greedy's quadratic time buys nothing.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_MEMORY_MEMORYPLAN_H
#define TESSERA_MEMORY_MEMORYPLAN_H

#include <cstdint>
#include <map>
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

/// The largest buffers first, each in the smallest gap (best fit) between
/// the buffers already placed that it is live with, or above them all.
/// Same guarantees as planLinearScan except the nested-lifetimes one.
Plan planGreedyBySize(const std::vector<Interval> &intervals,
                      int64_t alignment);

/// The smaller arena of planLinearScan and planGreedyBySize (the scan's on
/// a tie; the scan alone when it is within 0.1% of peakLiveBytes): what
/// tessera-lower-to-rt places each phase's transients with.
Plan planTransients(const std::vector<Interval> &intervals, int64_t alignment);

/// The largest sum of aligned sizes live at one position: what any plan
/// needs at least.
int64_t peakLiveBytes(const std::vector<Interval> &intervals,
                      int64_t alignment);

//===----------------------------------------------------------------------===//
// Microbatch slots of pipeline chunks
//===----------------------------------------------------------------------===//

/// What a pipeline chunk keeps per microbatch in flight: `bytes` of inputs
/// and saved activations, and how many slots it needs when it shares the
/// rank's pool with the other chunks (`poolSlots`, the schedule's slot
/// indices) or has a region of its own (`ownSlots`).
struct ChunkSlots {
  int64_t bytes = 0, poolSlots = 0, ownSlots = 0;
};

/// A chunk's slot region: `slots` copies of `bytes` from `base`.
struct SlotRegion {
  int64_t base = 0, bytes = 0, slots = 0;
};

struct SlotLayout {
  /// Per chunk.
  std::map<int64_t, SlotRegion> regions;
  /// One pool shared by every chunk (a slot as large as the largest
  /// chunk's), rather than a region per chunk.
  bool pooled = true;
  /// The first byte after the slot regions.
  int64_t end = 0;
};

/// Lays the chunks' slot regions out from `base`: one pool sized by the
/// largest chunk, or a region per chunk, whichever is smaller (chunks of
/// very different sizes, like the last one holding the logits, are better
/// apart); the pool on a tie.
SlotLayout planSlotRegions(const std::map<int64_t, ChunkSlots> &chunks,
                           int64_t base);

} // namespace tessera::memory

#endif // TESSERA_MEMORY_MEMORYPLAN_H
