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

// Megatron's split options, against the splits its get_num_layers_to_build
// and get_transformer_layer_offset give.
namespace {
std::vector<int64_t> split(const SplitOptions &o, int64_t pp, int64_t vpp,
                           int64_t layers, std::string *error = nullptr) {
  PipelineConfig c;
  c.pp = pp;
  c.vpp = vpp;
  c.layers = layers;
  c.microbatches = pp;
  c.kind = vpp > 1 ? Kind::Interleaved : Kind::OneFOneB;
  std::string e = resolveSplit(o, c);
  if (e.empty())
    e = validate(c);
  if (error)
    *error = e;
  return e.empty() ? c.virtualStageLayers : std::vector<int64_t>();
}
} // namespace

TEST(PipelineSchedule, MegatronLayouts) {
  std::vector<std::string> stages;
  EXPECT_EQ(parseLayout("Et*3|(tt|)*29,m|L", stages), "");
  ASSERT_EQ(stages.size(), 32u);
  EXPECT_EQ(stages[0], "Ettt");
  EXPECT_EQ(stages[29], "tt");
  EXPECT_EQ(stages[30], "m");
  EXPECT_EQ(stages[31], "L");
  EXPECT_EQ(parseLayout("E|t||tL", stages), "");
  EXPECT_EQ(stages, (std::vector<std::string>{"E", "t", "", "tL"}));
  // A trailing '|' is one more (empty) stage.
  EXPECT_EQ(parseLayout("t|t|", stages), "");
  EXPECT_EQ(stages.size(), 3u);
  EXPECT_NE(parseLayout("E|x|L", stages).find("Invalid layer character: x"),
            std::string::npos);
  EXPECT_NE(parseLayout("E|(t|*2|L", stages).find("'('"), std::string::npos);
  EXPECT_NE(parseLayout("E|(t|)|L", stages).find("needs '*N'"),
            std::string::npos);
  // Bounded: a repeat count, the expansion and the stages.
  EXPECT_NE(parseLayout("E|t*1000000|L", stages).find("repeat count above"),
            std::string::npos);
  EXPECT_NE(parseLayout("E|(t*99999)*99999|L", stages)
                .find("expands to more than"),
            std::string::npos);
  EXPECT_NE(parseLayout("*2E|L", stages).find("'*' needs a symbol"),
            std::string::npos);
  EXPECT_NE(parseLayout("E(|)*20000L", stages).find("stages, more than"),
            std::string::npos);

  SplitOptions o;
  // The docstring's example on pp 4: vpp 2, stage s = chunk * pp + rank.
  o.layout = "E|(tt|)*2,(t|)*4,L";
  std::string error;
  EXPECT_EQ(layoutVpp(o.layout, 4, error), 2);
  EXPECT_EQ(split(o, 4, 2, 8), (std::vector<int64_t>{0, 2, 2, 1, 1, 1, 1, 0}));
  EXPECT_EQ(layoutVpp(o.layout, 3, error), 0);
  EXPECT_NE(error.find("must be divisible by pipeline_model_parallel_size "
                       "(num_stages=8, pipeline_model_parallel_size=3)"),
            std::string::npos);
  split(o, 4, 1, 8, &error);
  EXPECT_NE(error.find("detected_vpp_size=2"), std::string::npos) << error;
  split(o, 4, 2, 9, &error);
  EXPECT_NE(error.find("Number of decoder layers 8 must match num_layers 9"),
            std::string::npos);
  o.layout = "t|E|t|L";
  split(o, 4, 1, 2, &error);
  EXPECT_NE(error.find("The first layer must be embedding, but got decoder"),
            std::string::npos);
  o.layout = "E|t|t|Lt";
  split(o, 4, 1, 3, &error);
  EXPECT_NE(error.find("The last layer must be loss, but got decoder"),
            std::string::npos);
  // Tessera keeps the loss on the last stage.
  o.layout = "E|t|tL|";
  split(o, 4, 1, 2, &error);
  EXPECT_NE(error.find("the loss (L) must be in the layout's last stage"),
            std::string::npos);
  o.layout = "E|t|E|tL";
  split(o, 4, 1, 2, &error);
  EXPECT_NE(error.find("Embedding must be specified exactly once"),
            std::string::npos);
  o.layout = "E|t|m|tL";
  split(o, 4, 1, 2, &error);
  EXPECT_NE(error.find("mtp_num_layers"), std::string::npos);
  o.layout = "|Et|t|tL";
  split(o, 4, 1, 3, &error);
  EXPECT_NE(error.find("first stage"), std::string::npos);
  o.firstStageLayers = 1;
  split(o, 4, 1, 3, &error);
  EXPECT_NE(error.find("cannot be set with other pipeline layout arguments"),
            std::string::npos);
}

TEST(PipelineSchedule, MegatronFirstLastAndAccountedSplits) {
  SplitOptions o;
  o.firstStageLayers = 3;
  o.lastStageLayers = 5;
  EXPECT_EQ(split(o, 4, 1, 16), (std::vector<int64_t>{3, 4, 4, 5}));
  // With vpp every chunk repeats the proportions: pp 4 x vpp 2, 14 layers,
  // first 2, last 4 (ranks hold 2, 4, 4, 4).
  o.firstStageLayers = 2;
  o.lastStageLayers = 4;
  EXPECT_EQ(split(o, 4, 2, 14),
            (std::vector<int64_t>{1, 2, 2, 2, 1, 2, 2, 2}));
  std::string error;
  o.firstStageLayers = 3;
  split(o, 4, 2, 15, &error);
  EXPECT_NE(error.find("number of layers at first stage: 3 must be divisible "
                       "by virtual pipeline parallel degree 2"),
            std::string::npos);
  o.firstStageLayers = 2;
  o.lastStageLayers = 3;
  split(o, 4, 1, 16, &error);
  EXPECT_NE(error.find("number of layers at middle stage: 11 must be "
                       "divisible by the middle pipeline model parallel size 2"),
            std::string::npos);
  o.lastStageLayers = -1;
  o.firstStageLayers = 0;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("num_layers_in_first_pipeline_stage must be larger "
                       "than 0"),
            std::string::npos);
  o.firstStageLayers = 4;
  o.lastStageLayers = 1;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("place more layers than the model's 4"),
            std::string::npos);
  o.firstStageLayers = -3;
  o.lastStageLayers = -1;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("num_layers_in_first_pipeline_stage must be larger "
                       "than 0"),
            std::string::npos);
  o.firstStageLayers = int64_t(1) << 62;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("is more than the model's 4 layers"), std::string::npos);
  o.firstStageLayers = 4;
  o.lastStageLayers = 1;
  o.lastStageLayers = -1;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("Mismatch: 0 middle layers remaining but 1 middle PP "
                       "stages available."),
            std::string::npos);
  o.accountForLoss = true;
  split(o, 2, 1, 4, &error);
  EXPECT_NE(error.find("cannot be set at the same time with "
                       "account_for_embedding_in_pipeline_split"),
            std::string::npos);

  // The embedding and the loss counted as layers: 6 layers on pp 4 give
  // [E 0] [1 2] [3 4] [5 L].
  SplitOptions a;
  a.accountForEmbedding = a.accountForLoss = true;
  EXPECT_EQ(split(a, 4, 1, 6), (std::vector<int64_t>{1, 2, 2, 1}));
  // With vpp: 14 layers + 2 over pp 2 x vpp 2 (4 a virtual stage).
  EXPECT_EQ(split(a, 2, 2, 14), (std::vector<int64_t>{3, 4, 4, 3}));
  split(a, 4, 1, 7, &error);
  EXPECT_NE(error.find("number of middle layers: 9 must be divisible by "
                       "middle pipeline_model_parallel_size 4"),
            std::string::npos);
  split(a, 2, 2, 4, &error);
  EXPECT_NE(error.find("number of layers on each pipeline rank: 3 (after "
                       "enable"),
            std::string::npos);
  // One layer a stage: the first holds the embedding alone.
  a.accountForLoss = false;
  EXPECT_EQ(split(a, 2, 1, 1), (std::vector<int64_t>{0, 1}));
  PipelineConfig c;
  c.pp = 2;
  c.layers = 3;
  c.virtualStageLayers = {0, 3};
  std::vector<LayerPlacement> placed = placeLayers(c);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_EQ(placed[0].ppRank, 1);
  // --pp-layers and Megatron's options exclude each other.
  c.stageLayers = {1, 2};
  EXPECT_NE(resolveSplit(a, c).find("--pp-layers cannot be combined"),
            std::string::npos);
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

namespace {
/// "F0 F1 B0 W0 ..." for a rank's order.
/// "F0 B0 W0 ..."; with `chunks`, a ' marks chunk 1 (the V's second leg).
std::string orderText(const RankSchedule &rs, bool chunks = false) {
  std::string out;
  for (const Step &s : rs.order)
    out += std::string(out.empty() ? "" : " ") +
           (s.forward ? "F" : s.weight ? "W" : "B") +
           std::to_string(s.microbatch) + (chunks && s.chunk ? "'" : "");
  return out;
}
} // namespace

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"), the order of the
// authors' hand-written generator (and of PyTorch's
// ScheduleInterleavedZeroBubble with one stage per rank) at p = 4, m = 8.
TEST(PipelineSchedule, ZbH1Order) {
  PipelineConfig c;
  c.pp = 4;
  c.microbatches = 8;
  c.layers = 4;
  c.kind = Kind::ZbH1;
  ASSERT_EQ(validate(c), "");
  auto ranks = buildSchedule(c);
  EXPECT_EQ(orderText(ranks[0]), "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 "
                                 "W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(orderText(ranks[1]), "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 "
                                 "B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  EXPECT_EQ(orderText(ranks[2]), "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 "
                                 "F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  EXPECT_EQ(orderText(ranks[3]), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 "
                                 "W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  c.vpp = 2;
  c.layers = 8;
  EXPECT_NE(validate(c).find("needs the interleaved schedule"),
            std::string::npos);
}

// Every F, B and W once per microbatch, B after F, W after B in microbatch
// order (the last W is the last microbatch's: the gradients' reductions
// start there), 1F1B's warmup and F/B order, and at most min(p, m)
// microbatches held (F done, W not yet): 1F1B's peak, that of its first
// rank.
TEST(PipelineSchedule, ZbH1EveryStepOnce) {
  for (int64_t pp : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16}) {
      PipelineConfig c;
      c.pp = pp;
      c.microbatches = m;
      c.layers = pp;
      c.kind = Kind::OneFOneB;
      auto oneF1B = buildSchedule(c);
      c.kind = Kind::ZbH1;
      ASSERT_EQ(validate(c), "");
      auto ranks = buildSchedule(c);
      for (const RankSchedule &rs : ranks) {
        EXPECT_EQ(rs.warmup, std::min(pp - rs.ppRank - 1, m));
        std::vector<int> done(size_t(m), 0); // 0, F, B, W
        int64_t held = 0, peak = 0, lastW = -1;
        std::vector<Step> fb;
        for (const Step &s : rs.order) {
          int &d = done[size_t(s.microbatch)];
          int kind = s.forward ? 1 : s.weight ? 3 : 2;
          EXPECT_EQ(d, kind - 1) << "pp " << pp << " m " << m;
          d = kind;
          held += s.forward ? 1 : s.weight ? -1 : 0;
          peak = std::max(peak, held);
          if (s.weight) {
            EXPECT_EQ(s.microbatch, lastW + 1);
            lastW = s.microbatch;
          } else {
            fb.push_back(s);
          }
        }
        EXPECT_EQ(lastW, m - 1);
        EXPECT_LE(peak, std::min(pp, m));
        // Without the W's, 1F1B's order.
        const auto &ref = oneF1B[size_t(rs.ppRank)].order;
        ASSERT_EQ(fb.size(), ref.size());
        for (size_t i = 0; i < fb.size(); ++i)
          EXPECT_TRUE(fb[i].forward == ref[i].forward &&
                      fb[i].microbatch == ref[i].microbatch);
      }
      EXPECT_EQ(simulate(c, ranks).deadlock, "");
    }
}

// The zero-bubble paper's bubble: ZB-H1 idles (p - 1)(F + B - W) per
// rank against 1F1B's (p - 1)(F + B + W): with F = B = W a third, (p - 1) /
// (3 m) of the busy time; also with unequal costs.
TEST(PipelineSchedule, ZbH1SimulatedBubble) {
  for (int64_t pp : {2, 4, 8})
    for (int64_t m : {8, 16, 32}) {
      PipelineConfig c;
      c.pp = pp;
      c.microbatches = m;
      c.layers = pp;
      c.kind = Kind::ZbH1;
      auto ranks = buildSchedule(c);
      Simulation sim = simulate(c, ranks); // F 1, B = W = 1
      ASSERT_EQ(sim.deadlock, "");
      EXPECT_NEAR(sim.bubbleFraction, double(pp - 1) / double(3 * m), 1e-9)
          << "pp " << pp << " m " << m;
      const double f = 2, b = 2, w = 1;
      sim = simulate(c, ranks, std::vector<double>(size_t(pp), f),
                     std::vector<double>(size_t(pp), b),
                     std::vector<double>(size_t(pp), w));
      ASSERT_EQ(sim.deadlock, "");
      EXPECT_NEAR(sim.bubbleFraction,
                  double(pp - 1) * (f + b - w) / (double(m) * (f + b + w)),
                  1e-9)
          << "pp " << pp << " m " << m << " (F 2, B 2, W 1)";
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

// The V placement: stage s on rank s, then back up; rank r holds stages r
// and 2p - 1 - r, so the last rank holds the V's turn and rank 0 the
// embedding and the loss. Layers in stage order.
TEST(PipelineSchedule, VPlacement) {
  PipelineConfig c;
  c.pp = 4;
  c.vpp = 2;
  c.layers = 16;
  c.microbatches = 8;
  c.kind = Kind::Zbv;
  ASSERT_EQ(validate(c), "");
  for (int64_t s = 0; s < 8; ++s) {
    EXPECT_EQ(stageRank(c, s), s < 4 ? s : 7 - s);
    EXPECT_EQ(stageChunk(c, s), s / 4);
    EXPECT_EQ(stageOf(c, stageRank(c, s), stageChunk(c, s)), s);
  }
  std::vector<LayerPlacement> placed = placeLayers(c);
  ASSERT_EQ(placed.size(), 16u);
  for (const LayerPlacement &p : placed) {
    EXPECT_EQ(p.ppRank, stageRank(c, p.layer / 2));
    EXPECT_EQ(p.chunk, p.layer / 8);
  }
  // Megatron's per-stage split keeps its stage order on the V.
  c.virtualStageLayers = {1, 2, 2, 2, 2, 2, 2, 3};
  placed = placeLayers(c);
  EXPECT_EQ(placed.back().ppRank, 0);
  EXPECT_EQ(placed.back().chunk, 1);
  EXPECT_EQ(placed[1].ppRank, 1);
  // Megatron's per-rank split (--decoder-first-pipeline-num-layers) puts
  // a rank's layers in its two stages: rank 0's 2 in stages 0 and 3, rank
  // 1's 4 in stages 1 and 2.
  PipelineConfig f;
  f.pp = 2;
  f.vpp = 2;
  f.layers = 6;
  f.kind = Kind::Zbv;
  SplitOptions first;
  first.firstStageLayers = 2;
  ASSERT_EQ(resolveSplit(first, f), "");
  EXPECT_EQ(f.virtualStageLayers, (std::vector<int64_t>{1, 2, 2, 1}));
  // Two chunks per rank exactly; DualPipeV needs 2p microbatches.
  c.virtualStageLayers.clear();
  c.vpp = 3;
  c.layers = 12;
  EXPECT_NE(validate(c).find("exactly two chunks per rank"), std::string::npos);
  c.vpp = 2;
  c.layers = 16;
  c.kind = Kind::DualPipeV;
  c.microbatches = 7;
  EXPECT_NE(validate(c).find("at least as many micro-batches as virtual "
                             "stages (2 x pp = 8), got 7"),
            std::string::npos);
  c.stageLayers = {4, 4, 4, 4};
  c.microbatches = 8;
  EXPECT_NE(validate(c).find("pp-layers"), std::string::npos);
}

// PyTorch's orders (ScheduleZBVZeroBubble, ScheduleDualPipeV) at p = 2,
// m = 4: ZBV's warmup 2(p - r) - 1 chunk-0 forwards, DualPipeV's mix of
// full backwards (B then W) and B's whose W waits.
TEST(PipelineSchedule, VOrders) {
  PipelineConfig c;
  c.pp = 2;
  c.vpp = 2;
  c.layers = 4;
  c.microbatches = 4;
  c.kind = Kind::Zbv;
  auto ranks = buildSchedule(c);
  EXPECT_EQ(orderText(ranks[0], true),
            "F0 F1 F2 F0' B0' W0' F1' B1' W1' F3 B0 W0 F2' B2' W2' B1 W1 "
            "F3' B3' W3' B2 W2 B3 W3");
  EXPECT_EQ(orderText(ranks[1], true),
            "F0 F0' F1 F1' B0' W0' F2 B0 W0 F2' B1' W1' F3 B1 W1 F3' B2' "
            "W2' B2 B3' B3 W2 W3' W3");
  EXPECT_EQ(ranks[0].warmup, 4); // (its leading forwards)
  c.kind = Kind::DualPipeV;
  ranks = buildSchedule(c);
  // (Worked through PyTorch's eight steps by hand: rank 0's last pair of
  // backwards splits B from W, rank 1's last two are B's whose W's end it.)
  EXPECT_EQ(orderText(ranks[0], true),
            "F0 F1 F2 F0' B0' W0' F1' F3 B1' W1' F2' B0 W0 B2' W2' F3' B1 W1 "
            "B3' W3' B2 W2 B3 W3");
  EXPECT_EQ(orderText(ranks[1], true),
            "F0 F0' F1 F1' F2 B0' W0' F2' B0 W0 F3 B1' W1' F3' B1 W1 B2' W2' "
            "B2 W2 B3' B3 W3' W3");
}

// Every (microbatch, chunk) F, B and W once, in that order, each chunk's
// W's in microbatch order (the last W is the last microbatch's: the
// reductions start there), free of deadlock; the simulated bubble at
// F = B = W per chunk is (p - 1) / (6 m) for both (each rank idles (p - 1)
// F while the first microbatch travels down the V: half of ZB-H1's
// fraction at the same work per rank), against interleaved 1F1B's
// (p - 1) / (2 m).
TEST(PipelineSchedule, VEveryStepOnceAndBubble) {
  for (Kind kind : {Kind::Zbv, Kind::DualPipeV})
    for (int64_t pp : {2, 3, 4, 8})
      for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16, 32}) {
        PipelineConfig c;
        c.pp = pp;
        c.vpp = 2;
        c.microbatches = m;
        c.layers = 2 * pp;
        c.kind = kind;
        if (!validate(c).empty()) {
          EXPECT_TRUE(kind == Kind::DualPipeV && m < 2 * pp);
          continue;
        }
        auto ranks = buildSchedule(c);
        for (const RankSchedule &rs : ranks) {
          std::vector<int> done(size_t(2 * m), 0);
          int64_t lastW[2] = {-1, -1};
          for (const Step &s : rs.order) {
            int &d = done[size_t(s.chunk * m + s.microbatch)];
            int k = s.forward ? 1 : s.weight ? 3 : 2;
            EXPECT_EQ(d, k - 1) << kindName(kind) << " pp " << pp << " m " << m;
            d = k;
            if (s.weight) {
              EXPECT_EQ(s.microbatch, lastW[s.chunk] + 1);
              lastW[s.chunk] = s.microbatch;
            }
          }
          EXPECT_EQ(lastW[0], m - 1);
          EXPECT_EQ(lastW[1], m - 1);
          // On rank 0 (the tied embedding's), chunk 0's last W is last.
          if (rs.ppRank == 0)
            EXPECT_TRUE(rs.order.back().weight && rs.order.back().chunk == 0);
        }
        Simulation sim = simulate(c, ranks);
        ASSERT_EQ(sim.deadlock, "");
        if (m >= 2 * pp)
          EXPECT_NEAR(sim.bubbleFraction, double(pp - 1) / double(6 * m), 1e-9)
              << kindName(kind) << " pp " << pp << " m " << m;
      }
}
