//===- LrScheduleTest.cpp - Megatron's learning-rate schedule -------------===//

#include "tessera/rt/LrSchedule.h"

#include <gtest/gtest.h>

using namespace tessera::rt;

TEST(LrSchedule, WarmupThenDecayStyles) {
  LrSchedule s;
  s.maxLr = 1.0;
  s.minLr = 0.1;
  s.warmupIters = 4;
  s.decayIters = 14;
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.at(1), 0.25);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.style = "linear";
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 0.1 + 0.5 * 0.9);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(15), 0.1);
  s.style = "cosine";
  EXPECT_DOUBLE_EQ(s.at(9), 0.1 + 0.5 * 0.9); // cos(pi/2) = 0
  EXPECT_NEAR(s.at(14), 0.1, 1e-12);
  EXPECT_GT(s.at(5), s.at(6));
  // No warmup: the first iteration already runs at the peak.
  s.warmupIters = 0;
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.at(1), 1.0);
}
