//===- GradScalerTest.cpp - fp16's loss scale, as Megatron's --------------===//

#include "tessera/rt/GradScaler.h"

#include <gtest/gtest.h>

using namespace tessera::rt;

namespace {

GradScalerConfig dynamicConfig(double initial, int64_t window,
                               int64_t hysteresis, double min = 1.0) {
  GradScalerConfig c;
  c.initialScale = initial;
  c.minScale = min;
  c.window = window;
  c.hysteresis = hysteresis;
  return c;
}

} // namespace

TEST(GradScalerTest, HysteresisDelaysTheFirstHalving) {
  // DynamicGradScaler with hysteresis 2: the first overflow only counts,
  // the second halves, and every later one halves again (the hysteresis
  // count is not restored until the scale grows).
  GradScaler s(dynamicConfig(65536.0, 1000, 2));
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 16384.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 16384.0);
  EXPECT_EQ(s.saved().growthTracker, 1);
}

TEST(GradScalerTest, AWindowOfCleanIterationsDoublesAndRestoresHysteresis) {
  GradScaler s(dynamicConfig(8.0, 3, 2));
  s.update(true); // hysteresis 2 -> 1
  EXPECT_EQ(s.saved().hysteresisTracker, 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false); // the third clean one in a row
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.saved().growthTracker, 0);
  EXPECT_EQ(s.saved().hysteresisTracker, 2);
  // An overflow resets the growth count.
  s.update(false);
  s.update(false);
  s.update(true);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
}

TEST(GradScalerTest, NeverBelowTheMinimum) {
  GradScaler s(dynamicConfig(4.0, 1000, 1, /*min=*/2.0));
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
}

TEST(GradScalerTest, ConstantScaleNeverMoves) {
  GradScalerConfig c;
  c.constantScale = 128.0;
  GradScaler s(c);
  EXPECT_FALSE(s.dynamic());
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(GradScalerTest, RestoredStateContinuesAsTheUninterruptedRun) {
  GradScaler a(dynamicConfig(1024.0, 2, 2)), b(dynamicConfig(1024.0, 2, 2));
  const bool overflows[] = {true, false, true, true, false, false, false};
  for (int i = 0; i < 3; ++i)
    a.update(overflows[i]);
  b.restore(a.saved());
  for (int i = 3; i < 7; ++i) {
    a.update(overflows[i]);
    b.update(overflows[i]);
    EXPECT_EQ(a.scale(), b.scale());
  }
  EXPECT_EQ(a.saved().growthTracker, b.saved().growthTracker);
  EXPECT_EQ(a.saved().hysteresisTracker, b.saved().hysteresisTracker);
}
