//===- MemoryPlanTest.cpp - Property tests of the static memory plan ------===//
//
// Random interval sets (fixed seeds): no two buffers live at the same time
// share a byte, every offset is aligned, the arena is the highest byte in
// use and at least the largest live sum, and for nested lifetimes (the
// forward/backward shape of a transformer) exactly that sum.
//
//===----------------------------------------------------------------------===//

#include "tessera/Memory/MemoryPlan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
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
    Plan plan = planLinearScan(intervals, kAlignment);
    checkPlan(intervals, plan);
    EXPECT_EQ(peakLiveBytes(intervals, kAlignment), bruteForcePeak(intervals));
  }
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
  }
}
