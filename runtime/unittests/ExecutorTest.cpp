//===- ExecutorTest.cpp - End-to-end interpreter tests on one rank --------===//

#include "TestArtifacts.h"

#include "tessera/rt/Executor.h"
#include "tessera/rt/Rng.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

std::unique_ptr<Executor> makeExecutor(const ArtifactDesc &desc,
                                       uint64_t seed = 1234) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mem.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return nullptr;
  auto backend = BackendRegistry::global().create("cpu", {});
  EXPECT_TRUE(backend.ok());
  ExecutorOptions options;
  options.seed = seed;
  auto ex = Executor::create(*loaded, std::move(*backend), CommunicatorSet(), 0,
                             options);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  Status st = (*ex)->initializeParameters();
  EXPECT_TRUE(st.ok()) << st.toString();
  return std::move(*ex);
}

std::vector<double> train(const ArtifactDesc &desc, int steps) {
  auto ex = makeExecutor(desc);
  std::vector<double> losses;
  if (!ex)
    return losses;
  for (int it = 1; it <= steps; ++it) {
    auto loss = ex->runIteration(it);
    EXPECT_TRUE(loss.ok()) << loss.status().toString();
    if (!loss.ok())
      break;
    losses.push_back(*loss);
  }
  return losses;
}

} // namespace

TEST(ExecutorTest, ParametersStartFromGlobalInit) {
  auto ex = makeExecutor(softmaxRegression(8, 4), 77);
  ASSERT_TRUE(ex);
  auto w = ex->readFloatBuffer("fc.weight");
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->size(), 32u);
  for (size_t g = 0; g < w->size(); ++g)
    EXPECT_EQ((*w)[g], float(double(0.1f) * normal(77, "fc.weight", g)));
  auto b = ex->readFloatBuffer("fc.bias");
  ASSERT_TRUE(b.ok());
  for (float v : *b)
    EXPECT_EQ(v, 0.0f);
}

TEST(ExecutorTest, SoftmaxRegressionLossDecreasesWithAdam) {
  auto losses = train(softmaxRegression(8, 4, 16, 2, 1, true, 0.05f), 10);
  ASSERT_EQ(losses.size(), 10u);
  // Initial loss is close to log(C) for small weights.
  EXPECT_NEAR(losses[0], std::log(4.0), 0.3);
  for (double l : losses)
    EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses[9], losses[0] * 0.8) << losses[0] << " -> " << losses[9];
}

TEST(ExecutorTest, SoftmaxRegressionLossDecreasesWithSgd) {
  auto losses = train(softmaxRegression(8, 4, 16, 1, 1, false, 0.5f), 10);
  ASSERT_EQ(losses.size(), 10u);
  EXPECT_LT(losses[9], losses[0]);
}

TEST(ExecutorTest, MicrobatchAccumulationMatchesOneBigBatch) {
  // Same global batch (32) as 1 x 32 or 4 x 8: same data, same averaged
  // gradients, hence (up to rounding) the same loss curve.
  auto big = train(softmaxRegression(8, 4, 32, 1, 1, false, 0.5f), 5);
  auto small = train(softmaxRegression(8, 4, 8, 4, 1, false, 0.5f), 5);
  ASSERT_EQ(big.size(), 5u);
  ASSERT_EQ(small.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(big[i], small[i], 1e-5 * big[i]) << "step " << i + 1;
}

TEST(ExecutorTest, GradientMatchesFiniteDifferences) {
  ArtifactDesc desc = softmaxRegression(3, 3, 4, 1, 1, false, 0.0f);
  auto ex = makeExecutor(desc);
  ASSERT_TRUE(ex);
  ASSERT_TRUE(ex->fillInputs(1, 0).ok());
  ASSERT_TRUE(ex->runFunction("microbatch").ok());
  auto grad = ex->readFloatBuffer("grad:fc.weight");
  ASSERT_TRUE(grad.ok());
  auto w = *ex->readFloatBuffer("fc.weight");
  auto lossAt = [&](const std::vector<float> &weights) {
    EXPECT_TRUE(ex->writeBuffer("fc.weight", weights.data(),
                                int64_t(weights.size() * 4))
                    .ok());
    EXPECT_TRUE(ex->runFunction("microbatch").ok());
    auto l = ex->readFloatBuffer("loss");
    return double((*l)[0]);
  };
  for (size_t i = 0; i < w.size(); ++i) {
    auto wp = w, wm = w;
    wp[i] += 1e-2f;
    wm[i] -= 1e-2f;
    double fd = (lossAt(wp) - lossAt(wm)) / 2e-2;
    EXPECT_NEAR((*grad)[i], fd, 2e-3) << "element " << i;
  }
}

TEST(ExecutorTest, FailingInstructionReportsFunctionAndLoc) {
  ArtifactDesc desc = softmaxRegression();
  InstrDesc wait = instr(fb::Opcode::Wait, {}, "dangling.wait");
  wait.event = 3;
  desc.programs[0].function("step").push_back(wait);
  auto ex = makeExecutor(desc);
  ASSERT_TRUE(ex);
  auto loss = ex->runIteration(1);
  ASSERT_FALSE(loss.ok());
  const std::string &msg = loss.status().message();
  EXPECT_NE(msg.find("function 'step'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dangling.wait"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mem.tsr"), std::string::npos) << msg;
}

TEST(ExecutorTest, AsyncAllReduceOnSelfCommunicator) {
  // A dp=1 artifact with explicit dp collectives runs on self communicators.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 1, 1);
  auto &step = desc.programs[0].function("step");
  InstrDesc start =
      instr(fb::Opcode::AllReduceStart, {desc.programs[0].ref(2)}, "ar.start");
  start.group = "dp";
  start.event = 1;
  InstrDesc wait = instr(fb::Opcode::Wait, {}, "ar.wait");
  wait.event = 1;
  step.insert(step.begin(), {start, wait});
  auto ex = makeExecutor(desc);
  ASSERT_TRUE(ex);
  auto loss = ex->runIteration(1);
  ASSERT_TRUE(loss.ok()) << loss.status().toString();
  auto counters = ex->commCounters();
  ASSERT_TRUE(counters.count("dp"));
  EXPECT_EQ(counters["dp"].allReduce, 0u); // group of one sends nothing
  EXPECT_EQ(counters["dp"].calls, 1u);
}

TEST(ExecutorTest, CollectiveOutsideEmbeddingGroupFailsToDecode) {
  // world 2 = dp 2; "embedding" holds rank 0 only. Rank 0 runs the embedding
  // all-reduce on a self communicator; rank 1 fails naming rank, kind, loc.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 1, 1);
  desc.worldSize = 2;
  desc.mesh = {{"tp", 1}, {"dp", 2}};
  desc.groups = {{"tp", {0}}, {"tp", {1}}, {"dp", {0, 1}}, {"embedding", {0}}};
  desc.globalBatch = 32;
  ProgramDesc &p = desc.programs[0];
  InstrDesc ar = instr(fb::Opcode::AllReduce, {p.ref(1)}, "emb.grad");
  ar.group = "embedding";
  p.function("microbatch").push_back(ar);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "emb.tsr");
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  CommunicatorSet rank0;
  rank0.groups["dp"] = createSelfCommunicator(); // stands in for MPI
  auto ex0 = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(rank0), 0);
  EXPECT_TRUE(ex0.ok()) << ex0.status().toString();
  CommunicatorSet rank1;
  rank1.groups["dp"] = createSelfCommunicator();
  auto ex1 = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(rank1), 1);
  ASSERT_FALSE(ex1.ok());
  const std::string &msg = ex1.status().message();
  for (const char *needle : {"rank 1 is in no rank group of kind 'embedding'",
                             "AllReduce at emb.grad", "emb.tsr"})
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

//===----------------------------------------------------------------------===//
// Pipeline schedules on one rank: microbatch slots, inputs and loss
//===----------------------------------------------------------------------===//

namespace {

std::unique_ptr<Executor> makeExecutor(const ArtifactDesc &desc,
                                       const ExecutorOptions &options) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "pp.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return nullptr;
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), 0, options);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  return std::move(*ex);
}

/// The synthetic features [b, F] of microbatch m of iteration `it`.
std::vector<float> expectedFeatures(const Executor &ex, int64_t it, int64_t m,
                                    int64_t features, int64_t classes) {
  const DataLayout &layout = ex.dataLayout();
  std::vector<float> x(size_t(layout.microBatch * features));
  for (int64_t i = 0; i < layout.microBatch; ++i) {
    int64_t g = globalSampleIndex(layout, it, m, i);
    syntheticFeatures(layout.seed, g, syntheticLabel(layout.seed, g, classes),
                      features, x.data() + i * features);
  }
  return x;
}

} // namespace

TEST(ExecutorScheduleTest, SlotsKeepMicrobatchesApart) {
  // F0(slot 0) F1(slot 1) B0(slot 0) B1(slot 1): each backward must read its
  // own forward's activations, and each forward its own microbatch's inputs.
  const int64_t b = 2, F = 4, M = 2;
  ExecutorOptions options;
  options.seed = 99;
  options.trace = true;
  auto ex = makeExecutor(slottedSchedule(2, M, b, F), options);
  ASSERT_TRUE(ex);
  ex->startTrace();
  for (int64_t it = 1; it <= 2; ++it) {
    auto loss = ex->runIteration(it);
    ASSERT_TRUE(loss.ok()) << loss.status().toString();
    std::vector<double> colsum(F, 0.0);
    double lossSum = 0.0;
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> x = expectedFeatures(*ex, it, m, F, 4);
      double total = 0.0;
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < F; ++j) {
          colsum[size_t(j)] += x[size_t(i * F + j)];
          total += x[size_t(i * F + j)];
        }
      lossSum += total / double(F);
    }
    // The loss is the mean over the microbatches of what forward wrote.
    EXPECT_NEAR(*loss, lossSum / double(M), 1e-5) << "iteration " << it;
    auto out = ex->readFloatBuffer("acc.out");
    ASSERT_TRUE(out.ok());
    for (int64_t j = 0; j < F; ++j)
      EXPECT_NEAR((*out)[size_t(j)], colsum[size_t(j)], 1e-4)
          << "iteration " << it << " column " << j;
    // Slot 0's copy of the input holds microbatch 0 (microbatch 1 went to
    // slot 1, slot_bytes further on).
    auto x0 = ex->readFloatBuffer("features");
    ASSERT_TRUE(x0.ok());
    EXPECT_EQ(*x0, expectedFeatures(*ex, it, 0, F, 4));
  }
  std::vector<std::string> phases;
  for (const TraceEvent &e : ex->traceEvents())
    if (e.track == "phase")
      phases.push_back(e.name);
  std::vector<std::string> expected = {"F c0 mb0", "F c0 mb1", "B c0 mb0",
                                       "B c0 mb1", "step"};
  ASSERT_EQ(phases.size(), 2 * expected.size());
  for (size_t i = 0; i < phases.size(); ++i)
    EXPECT_EQ(phases[i], expected[i % expected.size()]);
}

TEST(ExecutorScheduleTest, SameResultWithOneSlotAndInterleavedOrder) {
  // F0 B0 F1 B1 on one slot (or without slots: the input, in no slot
  // region, is filled in place by every forward) computes the same as
  // F0 F1 F2 B0 B1 B2 on three.
  const int64_t b = 3, F = 5, M = 3;
  auto three = makeExecutor(slottedSchedule(3, M, b, F), ExecutorOptions());
  auto one = makeExecutor(slottedSchedule(1, M, b, F), ExecutorOptions());
  auto none = makeExecutor(slottedSchedule(0, M, b, F), ExecutorOptions());
  ASSERT_TRUE(three && one && none);
  for (int64_t it = 1; it <= 2; ++it) {
    auto l3 = three->runIteration(it), l1 = one->runIteration(it),
         l0 = none->runIteration(it);
    ASSERT_TRUE(l3.ok() && l1.ok() && l0.ok());
    EXPECT_NEAR(*l3, *l1, 1e-6);
    EXPECT_NEAR(*l3, *l0, 1e-6);
    EXPECT_EQ(*three->readFloatBuffer("acc.out"),
              *one->readFloatBuffer("acc.out"));
    EXPECT_EQ(*three->readFloatBuffer("acc.out"),
              *none->readFloatBuffer("acc.out"));
  }
}

TEST(ExecutorScheduleTest, RunFunctionOnASlot) {
  auto ex = makeExecutor(slottedSchedule(2, 2, 2, 4), ExecutorOptions());
  ASSERT_TRUE(ex);
  EXPECT_TRUE(ex->runFunction("forward_c0", 1).ok());
  Status st = ex->runFunction("forward_c0", 2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("function 'forward_c0' has no slot 2"),
            std::string::npos)
      << st.message();
}

TEST(ExecutorScheduleTest, ScheduleNeedsNoMicrobatchFunction) {
  // Without a schedule the program still needs "microbatch".
  ArtifactDesc desc = slottedSchedule();
  desc.programs[0].schedule.clear();
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "pp.tsr");
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), 0);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("has no 'microbatch' function"),
            std::string::npos)
      << ex.status().message();
}

TEST(ExecutorScheduleTest, OperandStraddlingTheSlotRegionFailsToDecode) {
  ArtifactDesc desc = slottedSchedule(2, 2, 2, 4);
  ProgramDesc &p = desc.programs[0];
  const FunctionAttrs &slots = p.functionAttrs["forward_c0"];
  // 16 floats starting 32 bytes before the region's end.
  RefDesc wide{slots.slotBase + slots.slotBytes - 32, {16}};
  InstrDesc fill = instr(fb::Opcode::Fill, {wide}, "too.wide");
  fill.fattrs = {1.0f};
  p.function("forward_c0").push_back(fill);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "pp.tsr");
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  Status st = Executor::validate(**loaded);
  ASSERT_FALSE(st.ok());
  for (const char *needle : {"pp.tsr", "function 'forward_c0'", "too.wide",
                             "straddles the end of the slot region"})
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ExecutorScheduleTest, SendWithoutPipelineGroupIsRejected) {
  ArtifactDesc desc = slottedSchedule();
  ProgramDesc &p = desc.programs[0];
  InstrDesc send = instr(fb::Opcode::Send, {p.ref(0)}, "lonely.send");
  send.iattrs = {1, 0};
  p.function("forward_c0").push_back(send);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "pp.tsr");
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  Status st = Executor::validate(**loaded);
  ASSERT_FALSE(st.ok());
  for (const char *needle : {"pp.tsr", "lonely.send", "'pp' rank group"})
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ExecutorScheduleTest, SelfCommunicatorRefusesPointToPoint) {
  auto self = createSelfCommunicator();
  float x = 0.0f;
  auto send = self->isend(&x, 1, ElementType::F32, 0, 3);
  ASSERT_FALSE(send.ok());
  EXPECT_NE(send.status().message().find("group of one rank"),
            std::string::npos);
  EXPECT_FALSE(self->irecv(&x, 1, ElementType::F32, 0, 3).ok());
  EXPECT_TRUE(self->waitAll({}).ok());
  CommCounters c;
  c.p2p = 5;
  c.allReduce = 2;
  EXPECT_EQ(c.total(), 7u);
  EXPECT_EQ((c - c).p2p, 0u);
}
