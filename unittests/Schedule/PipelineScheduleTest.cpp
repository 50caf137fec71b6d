//===- PipelineScheduleTest.cpp - Megatron pipeline schedules -------------===//

#include "tessera/Schedule/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <map>

using namespace tessera::schedule;

TEST(PipelineSchedule, SeedLayerOffsets) {
  // Megatron's example of virtual-pipeline layer offsets: 8 layers, pp 2,
  // vpp 2 -> rank 0 holds [0, 1] and [4, 5].
  PipelineConfig c;
  c.pp = 2;
  c.vpp = 2;
  c.layers = 8;
  c.microbatches = 4;
  c.kind = Kind::Interleaved;
  ASSERT_EQ(validate(c), "");
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> held;
  for (const LayerPlacement &l : placeLayers(c))
    held[{l.ppRank, l.chunk}].push_back(l.layer);
  EXPECT_EQ(held[std::make_pair(int64_t(0), int64_t(0))], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(held[std::make_pair(int64_t(0), int64_t(1))], (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(held[std::make_pair(int64_t(1), int64_t(0))], (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(held[std::make_pair(int64_t(1), int64_t(1))], (std::vector<int64_t>{6, 7}));
}

// Every schedule runs each (microbatch, chunk) forward and backward exactly
// once per rank, each backward after its forward, with Megatron's warmup
// (num_warmup_microbatches of its schedules).
TEST(PipelineSchedule, EveryStepOnceBackwardAfterForward) {
  for (Kind kind : {Kind::None, Kind::OneFOneB, Kind::Interleaved})
    for (int64_t pp : {1, 2, 3, 4, 8})
      for (int64_t vpp : {1, 2, 3})
        for (int64_t m : {1, 2, 4, 6, 8, 12, 16}) {
          PipelineConfig c;
          c.pp = pp;
          c.vpp = vpp;
          c.microbatches = m;
          c.layers = pp * vpp * 2;
          c.kind = kind;
          if (!validate(c).empty())
            continue;
          for (const RankSchedule &rs : buildSchedule(c)) {
            std::map<std::pair<int64_t, int64_t>, int> forwards, backwards;
            for (const Step &s : rs.order) {
              auto key = std::make_pair(s.microbatch, s.chunk);
              ASSERT_GE(s.microbatch, 0);
              ASSERT_LT(s.microbatch, m);
              ASSERT_LT(s.chunk, vpp);
              if (s.forward) {
                EXPECT_EQ(forwards[key]++, 0);
              } else {
                EXPECT_EQ(forwards[key], 1) << "backward before forward";
                EXPECT_EQ(backwards[key]++, 0);
              }
            }
            EXPECT_EQ(int64_t(forwards.size()), m * vpp);
            EXPECT_EQ(int64_t(backwards.size()), m * vpp);
            int64_t expected =
                kind == Kind::None ? 0
                : kind == Kind::OneFOneB
                    ? std::min(pp - rs.ppRank - 1, m)
                    : std::min((pp - rs.ppRank - 1) * 2 + (vpp - 1) * pp,
                               m * vpp);
            EXPECT_EQ(rs.warmup, expected);
            // 1F1B bounds the in-flight microbatches by pp on rank 0.
            if (kind == Kind::OneFOneB) {
              int64_t inFlight = 0, peak = 0;
              for (const Step &s : rs.order) {
                inFlight += s.forward ? 1 : -1;
                peak = std::max(peak, inFlight);
              }
              EXPECT_LE(peak, pp - rs.ppRank);
            }
          }
        }
}

TEST(PipelineSchedule, Errors) {
  PipelineConfig c;
  c.pp = 4;
  c.vpp = 2;
  c.layers = 16;
  c.microbatches = 6;
  c.kind = Kind::Interleaved;
  EXPECT_NE(validate(c).find("multiple of pp (4)"), std::string::npos);
  c.microbatches = 8;
  c.stageLayers = {4, 4, 4, 4};
  EXPECT_NE(validate(c).find("cannot be combined"), std::string::npos);
  c = PipelineConfig();
  c.pp = 2;
  c.layers = 5;
  EXPECT_NE(validate(c).find("do not split evenly"), std::string::npos);
  c.stageLayers = {2, 3};
  EXPECT_EQ(validate(c), "");
  c.stageLayers = {0, 5};
  EXPECT_NE(validate(c).find("at least one layer"), std::string::npos);
}

// Simulated with Megatron's cost model (a chunk costs 1/v of a stage, a
// backward twice a forward), the bubble is (p - 1) / m for 1F1B and
// (p - 1) / (v m) for the interleaved schedule (the bubble fractions of
// the Megatron-LM paper, Narayanan et al. 2021).
TEST(PipelineSchedule, SimulatedBubbleMatchesTheFormulas) {
  for (int64_t pp : {2, 4, 8})
    for (int64_t m : {8, 16, 32}) {
      PipelineConfig c;
      c.pp = pp;
      c.microbatches = m;
      c.layers = pp * 4;
      c.kind = Kind::OneFOneB;
      Simulation sim = simulate(c, buildSchedule(c));
      ASSERT_EQ(sim.deadlock, "");
      EXPECT_NEAR(sim.bubbleFraction, double(pp - 1) / double(m), 1e-9)
          << "1f1b pp " << pp << " m " << m;
      for (int64_t v : {2, 4}) {
        c.vpp = v;
        c.kind = Kind::Interleaved;
        sim = simulate(c, buildSchedule(c), 1.0 / double(v), 2.0 / double(v));
        ASSERT_EQ(sim.deadlock, "");
        EXPECT_NEAR(sim.bubbleFraction, double(pp - 1) / double(v * m), 1e-9)
            << "interleaved pp " << pp << " vpp " << v << " m " << m;
        c.vpp = 1;
      }
    }
}

TEST(PipelineSchedule, SimulationFindsADeadlock) {
  PipelineConfig c;
  c.pp = 2;
  c.microbatches = 4;
  c.layers = 4;
  auto ranks = buildSchedule(c);
  // The last stage runs a backward before the forward it needs.
  std::swap(ranks[1].order[0], ranks[1].order[1]);
  Simulation sim = simulate(c, ranks);
  EXPECT_EQ(sim.deadlock,
            "deadlock: pipeline rank 0 waits at backward of microbatch 0, "
            "chunk 0 (step 2 of its order); pipeline rank 1 waits at backward "
            "of microbatch 0, chunk 0 (step 0 of its order)");
}

// Each virtual stage at its own costs (tessera-plan's refinement): one
// microbatch through two stages takes the sum of both directions' costs,
// equal costs give the uniform simulation, and a missing cost is reported.
TEST(PipelineSchedule, SimulationWithPerStageCosts) {
  PipelineConfig c;
  c.pp = 2;
  c.microbatches = 1;
  c.layers = 2;
  auto ranks = buildSchedule(c);
  Simulation sim = simulate(c, ranks, std::vector<double>{1, 3},
                            std::vector<double>{2, 6});
  ASSERT_EQ(sim.deadlock, "");
  EXPECT_DOUBLE_EQ(sim.makespan, 1 + 3 + 6 + 2);

  c.pp = 4;
  c.vpp = 2;
  c.microbatches = 8;
  c.layers = 8;
  c.kind = Kind::Interleaved;
  ranks = buildSchedule(c);
  Simulation uniform = simulate(c, ranks, 0.5, 1.0);
  Simulation staged = simulate(c, ranks, std::vector<double>(8, 0.5),
                               std::vector<double>(8, 1.0));
  EXPECT_DOUBLE_EQ(staged.makespan, uniform.makespan);
  EXPECT_DOUBLE_EQ(staged.bubbleFraction, uniform.bubbleFraction);
  // Slower last stages only lengthen the schedule.
  std::vector<double> f(8, 0.5), b(8, 1.0);
  f[7] = 1.0;
  b[7] = 2.0;
  EXPECT_GT(simulate(c, ranks, f, b).makespan, uniform.makespan);

  Simulation missing = simulate(c, ranks, std::vector<double>(3, 1.0),
                                std::vector<double>(3, 2.0));
  EXPECT_EQ(missing.deadlock.rfind("no cost given for virtual stage ", 0), 0u)
      << missing.deadlock;
}
