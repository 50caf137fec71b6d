//===- MemoryPlanTest.cpp - Property tests of the static memory plan ------===//
//
// Random interval sets (fixed seeds), for the linear scan, greedy by size
// and the better of the two: no two buffers live at the same time share a
// byte, every offset is aligned, the arena is the highest byte in use and
// at least the largest live sum, and for nested lifetimes (the
// forward/backward shape of a transformer) exactly that sum. Slot regions:
// the smaller of a shared pool and a region per chunk, each chunk's slots
// inside, separate regions apart.
//
//===----------------------------------------------------------------------===//

#include "tessera/Memory/MemoryPlan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

using namespace tessera::memory;

namespace {

constexpr int64_t kAlignment = 64;

/// Every property that holds for any interval set.
void checkPlan(const std::vector<Interval> &intervals, const Plan &plan) {
  ASSERT_EQ(plan.offsets.size(), intervals.size());
  int64_t highest = 0;
  for (size_t i = 0; i < intervals.size(); ++i) {
    const int64_t offset = plan.offsets[i];
    const int64_t size = alignTo(intervals[i].bytes, kAlignment);
    EXPECT_GE(offset, 0);
    EXPECT_EQ(offset % kAlignment, 0) << "interval " << i;
    highest = std::max(highest, offset + size);
    for (size_t j = i + 1; j < intervals.size(); ++j) {
      const Interval &a = intervals[i], &b = intervals[j];
      bool liveTogether = a.start <= b.end && b.start <= a.end;
      if (!liveTogether)
        continue;
      const int64_t bOffset = plan.offsets[j];
      const int64_t bSize = alignTo(b.bytes, kAlignment);
      bool apart = offset + size <= bOffset || bOffset + bSize <= offset;
      EXPECT_TRUE(apart || size == 0 || bSize == 0)
          << "intervals " << i << " [" << a.start << ", " << a.end << "] at "
          << offset << "+" << size << " and " << j << " [" << b.start << ", "
          << b.end << "] at " << bOffset << "+" << bSize << " overlap";
    }
  }
  EXPECT_EQ(plan.arenaBytes, highest);
  EXPECT_GE(plan.arenaBytes, peakLiveBytes(intervals, kAlignment));
}

/// The largest live sum, by brute force over every position.
int64_t bruteForcePeak(const std::vector<Interval> &intervals) {
  int64_t last = 0;
  for (const Interval &in : intervals)
    last = std::max(last, in.end);
  int64_t peak = 0;
  for (int64_t t = 0; t <= last; ++t) {
    int64_t sum = 0;
    for (const Interval &in : intervals)
      if (in.start <= t && t <= in.end)
        sum += alignTo(in.bytes, kAlignment);
    peak = std::max(peak, sum);
  }
  return peak;
}

} // namespace

TEST(MemoryPlanTest, AlignsSizesAndOffsets) {
  EXPECT_EQ(alignTo(0, 64), 0);
  EXPECT_EQ(alignTo(1, 64), 64);
  EXPECT_EQ(alignTo(64, 64), 64);
  EXPECT_EQ(alignTo(65, 64), 128);
  // Disjoint lifetimes reuse the same bytes.
  std::vector<Interval> intervals = {{0, 1, 100}, {2, 3, 100}, {2, 2, 10}};
  Plan plan = planLinearScan(intervals, kAlignment);
  checkPlan(intervals, plan);
  EXPECT_EQ(plan.offsets[0], 0);
  EXPECT_EQ(plan.offsets[1], 0);
  EXPECT_EQ(plan.offsets[2], 128);
  EXPECT_EQ(plan.arenaBytes, 192);
  EXPECT_EQ(peakLiveBytes(intervals, kAlignment), 192);
}

TEST(MemoryPlanTest, EmptySetNeedsNoArena) {
  Plan plan = planLinearScan({}, kAlignment);
  EXPECT_TRUE(plan.offsets.empty());
  EXPECT_EQ(plan.arenaBytes, 0);
  EXPECT_EQ(peakLiveBytes({}, kAlignment), 0);
}

TEST(MemoryPlanTest, GrowsTheTopFreeBlockInsteadOfLeavingAHole) {
  // A freed 64-byte block at the top, then a 128-byte request: it grows
  // that block to 128 bytes rather than starting a new one above it.
  std::vector<Interval> intervals = {{0, 5, 64}, {0, 0, 64}, {1, 2, 128}};
  Plan plan = planLinearScan(intervals, kAlignment);
  checkPlan(intervals, plan);
  EXPECT_EQ(plan.offsets[2], 64);
  EXPECT_EQ(plan.arenaBytes, 192);
}

TEST(MemoryPlanTest, RandomIntervalsNeverOverlap) {
  std::mt19937_64 rng(20261123);
  for (int trial = 0; trial < 300; ++trial) {
    std::uniform_int_distribution<int> count(0, 60);
    std::uniform_int_distribution<int64_t> position(0, 80), length(0, 30),
        bytes(0, 5000);
    std::vector<Interval> intervals(size_t(count(rng)));
    for (Interval &in : intervals) {
      in.start = position(rng);
      in.end = in.start + length(rng);
      in.bytes = bytes(rng);
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    Plan scan = planLinearScan(intervals, kAlignment);
    checkPlan(intervals, scan);
    Plan greedy = planGreedyBySize(intervals, kAlignment);
    checkPlan(intervals, greedy);
    Plan best = planTransients(intervals, kAlignment);
    checkPlan(intervals, best);
    EXPECT_EQ(best.arenaBytes, std::min(scan.arenaBytes, greedy.arenaBytes));
    EXPECT_EQ(peakLiveBytes(intervals, kAlignment), bruteForcePeak(intervals));
  }
}

TEST(MemoryPlanTest, GreedyBySizeFillsTheHolesTheScanLeaves) {
  // Crossing lifetimes: the scan puts the 256-byte buffer of [1, 4] above
  // the 64 bytes of [0, 3], and the 192 bytes of [3, 6] then fit neither
  // the hole the 192 of [0, 1] left (under [0, 3]'s 64) nor above; largest
  // first, the two 256s share offset 0 and the rest packs under the peak.
  std::vector<Interval> intervals = {
      {3, 6, 192}, {0, 3, 64}, {0, 1, 192}, {1, 4, 256}, {4, 5, 256}};
  Plan scan = planLinearScan(intervals, kAlignment);
  Plan greedy = planGreedyBySize(intervals, kAlignment);
  checkPlan(intervals, scan);
  checkPlan(intervals, greedy);
  EXPECT_EQ(scan.arenaBytes, 768);
  EXPECT_EQ(greedy.arenaBytes, 704);
  EXPECT_EQ(peakLiveBytes(intervals, kAlignment), 704);
  Plan best = planTransients(intervals, kAlignment);
  EXPECT_EQ(best.arenaBytes, 704);
  EXPECT_EQ(best.offsets, greedy.offsets);
}

TEST(MemoryPlanTest, KeepsTheScanWhenItReachesThePeak) {
  // Nested lifetimes: the scan is exact, and is what planTransients keeps
  // (its offsets, not only its size).
  std::vector<Interval> intervals = {{0, 9, 100}, {1, 8, 3000}, {2, 3, 64},
                                     {4, 7, 500}};
  Plan scan = planLinearScan(intervals, kAlignment);
  ASSERT_EQ(scan.arenaBytes, peakLiveBytes(intervals, kAlignment));
  EXPECT_EQ(planTransients(intervals, kAlignment).offsets, scan.offsets);
}

TEST(MemoryPlanTest, NestedLifetimesPackLikeAStack) {
  // Laminar families (any two lifetimes nested or disjoint), the shape of
  // activations saved in a forward and freed in reverse in a backward:
  // the arena is exactly the largest live sum.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Interval> intervals;
    std::uniform_int_distribution<int64_t> bytes(1, 4096);
    std::uniform_int_distribution<int> children(0, 3);
    int64_t clock = 0;
    // A random forest: each node's lifetime strictly contains its
    // children's.
    std::function<void(int)> grow = [&](int depth) {
      Interval in;
      in.start = clock++;
      in.bytes = bytes(rng);
      size_t at = intervals.size();
      intervals.push_back(in);
      int n = depth < 4 ? children(rng) : 0;
      for (int c = 0; c < n; ++c)
        grow(depth + 1);
      intervals[at].end = clock++;
    };
    std::uniform_int_distribution<int> roots(1, 4);
    for (int r = roots(rng); r > 0; --r)
      grow(0);
    // The planner must not depend on the order it is given.
    std::shuffle(intervals.begin(), intervals.end(), rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    Plan plan = planLinearScan(intervals, kAlignment);
    checkPlan(intervals, plan);
    EXPECT_EQ(plan.arenaBytes, bruteForcePeak(intervals));
    EXPECT_EQ(planTransients(intervals, kAlignment).arenaBytes,
              bruteForcePeak(intervals));
  }
}

//===----------------------------------------------------------------------===//
// Slot regions
//===----------------------------------------------------------------------===//

TEST(SlotRegionsTest, PoolsChunksOfSimilarSize) {
  // Two chunks of 1000 bytes; the schedule's pool needs 3 slots, regions of
  // their own 2 each: the pool (3000) beats separate regions (4000).
  SlotLayout layout =
      planSlotRegions({{0, {1000, 3, 2}}, {1, {1000, 3, 2}}}, 640);
  EXPECT_TRUE(layout.pooled);
  for (int c : {0, 1}) {
    EXPECT_EQ(layout.regions[c].base, 640);
    EXPECT_EQ(layout.regions[c].bytes, 1000);
    EXPECT_EQ(layout.regions[c].slots, 3);
  }
  EXPECT_EQ(layout.end, 640 + 3000);
}

TEST(SlotRegionsTest, SeparatesChunksOfVeryDifferentSizes) {
  // The last chunk holds the logits: 10x the first. A pool would size every
  // slot by it (4 x 10000); separate regions take 3 x 1000 + 2 x 10000.
  SlotLayout layout =
      planSlotRegions({{0, {1000, 4, 3}}, {1, {10000, 4, 2}}}, 0);
  EXPECT_FALSE(layout.pooled);
  EXPECT_EQ(layout.regions[0].base, 0);
  EXPECT_EQ(layout.regions[0].slots, 3);
  EXPECT_EQ(layout.regions[1].base, 3000);
  EXPECT_EQ(layout.regions[1].bytes, 10000);
  EXPECT_EQ(layout.regions[1].slots, 2);
  EXPECT_EQ(layout.end, 23000);
}

TEST(SlotRegionsTest, RandomLayoutsHoldEveryChunkWithoutOverlap) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> count(1, 6);
  std::uniform_int_distribution<int64_t> bytes(0, 5000), slots(1, 8);
  for (int trial = 0; trial < 200; ++trial) {
    std::map<int64_t, ChunkSlots> chunks;
    for (int c = count(rng) - 1; c >= 0; --c) {
      int64_t own = slots(rng);
      chunks[c] = {alignTo(bytes(rng), kAlignment), own + slots(rng) - 1,
                   own};
    }
    SlotLayout layout = planSlotRegions(chunks, 128);
    int64_t pooled = 0, separate = 0, poolSlots = 0;
    for (auto &[c, s] : chunks) {
      pooled = std::max(pooled, s.bytes);
      poolSlots = std::max(poolSlots, s.poolSlots);
      separate += s.bytes * s.ownSlots;
    }
    // The smaller of the two layouts.
    EXPECT_EQ(layout.end - 128, std::min(pooled * poolSlots, separate));
    for (auto &[c, s] : chunks) {
      const SlotRegion &r = layout.regions.at(c);
      EXPECT_GE(r.bytes, s.bytes);
      EXPECT_GE(r.slots, layout.pooled ? s.poolSlots : s.ownSlots);
      EXPECT_LE(r.base + r.bytes * r.slots, layout.end);
      if (!layout.pooled)
        for (auto &[d, t] : chunks) {
          const SlotRegion &q = layout.regions.at(d);
          if (d != c) {
            EXPECT_TRUE(r.base + r.bytes * r.slots <= q.base ||
                        q.base + q.bytes * q.slots <= r.base);
          }
        }
    }
  }
}
