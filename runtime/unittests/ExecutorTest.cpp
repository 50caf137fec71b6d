//===- ExecutorTest.cpp - End-to-end interpreter tests on one rank --------===//

#include "RecordingBackend.h"
#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/Rng.h"
#include "tessera/rt/math/Kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

// ZeRO-3: the staged parameters' initial values go into this rank's shard
// of their bucket (at their layout offsets, padding zero); reading one
// needs the shards gathered (and gathered again once an iteration has
// updated them); writing one (a checkpoint's load) updates the shard.
TEST(ExecutorTest, StagedParametersLiveInTheirBucketShard) {
  auto ex = makeExecutor(zero3Bucket(), 77);
  ASSERT_TRUE(ex);
  auto shard = ex->readFloatBuffer("pshard:b:0");
  ASSERT_TRUE(shard.ok()) << shard.status().toString();
  ASSERT_EQ(shard->size(), 128u);
  std::vector<float> w0(4);
  for (size_t g = 0; g < 4; ++g) {
    w0[g] = float(double(0.1f) * normal(77, "w", g));
    EXPECT_EQ((*shard)[g], w0[g]);
    EXPECT_EQ((*shard)[64 + g], 1.0f);
  }
  for (size_t i : {size_t(4), size_t(63), size_t(68), size_t(127)})
    EXPECT_EQ((*shard)[i], 0.0f) << i;
  ASSERT_FALSE(ex->readBuffer("w").ok());
  ASSERT_TRUE(ex->gatherStagedParameters().ok());
  auto w = ex->readFloatBuffer("w");
  ASSERT_TRUE(w.ok()) << w.status().toString();
  EXPECT_EQ(*w, w0);

  ASSERT_TRUE(ex->runIteration(1).ok());
  auto stale = ex->readBuffer("w");
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.status().message().find(
                "is kept as shards of its bucket (ZeRO-3); gather them"),
            std::string::npos)
      << stale.status().toString();
  ASSERT_TRUE(ex->gatherStagedParameters().ok());
  w = ex->readFloatBuffer("w");
  auto v = ex->readFloatBuffer("v");
  ASSERT_TRUE(w.ok() && v.ok());
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ((*w)[g], 2 * w0[g]);
    EXPECT_EQ((*v)[g], 2.0f);
  }

  const float five[4] = {5, 5, 5, 5};
  ASSERT_TRUE(ex->writeBuffer("v", five, sizeof(five)).ok());
  ASSERT_FALSE(ex->readBuffer("v").ok());
  shard = ex->readFloatBuffer("pshard:b:0");
  ASSERT_TRUE(shard.ok());
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ((*shard)[64 + g], 5.0f);
    EXPECT_EQ((*shard)[g], 2 * w0[g]);
  }
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

TEST(ExecutorTest, GeluFormFollowsItsIattr) {
  // Gelu and GeluGrad with iattrs [1] run the tanh form, with [0] the erf
  // form: the executor passes the flag on (both forms, then their
  // gradients, written into the bias at the end of the microbatch).
  using O = fb::Opcode;
  for (int64_t tanh : {0, 1}) {
    ArtifactDesc desc = softmaxRegression(8, 4, 16, 1, 1, false, 0.0f);
    ProgramDesc &p = desc.programs[0];
    int bias = 1; // fc.bias [4]
    ASSERT_EQ(p.buffers[size_t(bias)].name, "fc.bias");
    RefDesc x = p.scratch({4}), dy = p.scratch({4});
    auto &mb = p.function("microbatch");
    InstrDesc fx = instr(O::Fill, {x});
    fx.fattrs = {1.3f};
    InstrDesc fdy = instr(O::Fill, {dy});
    fdy.fattrs = {0.7f};
    InstrDesc g = instr(O::Gelu, {x, p.ref(bias)});
    g.iattrs = {tanh};
    mb.push_back(fx);
    mb.push_back(fdy);
    mb.push_back(g);
    auto ex = makeExecutor(desc);
    ASSERT_TRUE(ex);
    ASSERT_TRUE(ex->fillInputs(1, 0).ok());
    ASSERT_TRUE(ex->runFunction("microbatch").ok());
    auto y = ex->readFloatBuffer("fc.bias");
    ASSERT_TRUE(y.ok());
    float want = tanh ? math::geluTanh(1.3f) : math::gelu(1.3f);
    EXPECT_EQ((*y)[0], want) << "tanh " << tanh;
    // The two forms differ here, so the check tells them apart.
    EXPECT_NE(math::geluTanh(1.3f), math::gelu(1.3f));

    InstrDesc gg = instr(O::GeluGrad, {x, dy, p.ref(bias)});
    gg.iattrs = {tanh};
    mb.back() = gg;
    auto ex2 = makeExecutor(desc);
    ASSERT_TRUE(ex2);
    ASSERT_TRUE(ex2->fillInputs(1, 0).ok());
    ASSERT_TRUE(ex2->runFunction("microbatch").ok());
    auto dxv = ex2->readFloatBuffer("fc.bias");
    ASSERT_TRUE(dxv.ok());
    float wantDx = tanh ? math::geluTanhGrad(1.3f, 0.7f)
                        : math::geluGrad(1.3f, 0.7f);
    EXPECT_EQ((*dxv)[0], wantDx) << "tanh " << tanh;
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

//===----------------------------------------------------------------------===//
// Mixed precision: bf16 parameters, fp32 main params and "init"
//===----------------------------------------------------------------------===//

namespace {

/// Every element of `v` rounded to bf16 and widened back.
std::vector<float> roundedToBf16(const std::vector<float> &v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = bf16ToFloat(floatToBf16(v[i]));
  return out;
}

Status validateDesc(const ArtifactDesc &desc) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mp.tsr");
  if (!loaded.ok())
    return loaded.status();
  return Executor::validate(**loaded);
}

} // namespace

TEST(ExecutorTest, FusedKernelsCheckTheirShapes) {
  // The decoder's shape rules of the fused opcodes name the operand.
  using O = fb::Opcode;
  auto expectError = [](const ArtifactDesc &desc, const std::string &needle) {
    Status st = validateDesc(desc);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  auto withInstr = [](std::vector<int64_t> xShape, InstrDesc (*make)(ProgramDesc &,
                                                                   std::vector<int64_t>)) {
    ArtifactDesc desc = softmaxRegression(8, 4, 16, 1, 1, false, 0.0f);
    ProgramDesc &p = desc.programs[0];
    p.function("microbatch").push_back(make(p, xShape));
    return desc;
  };
  // BiasGelu: a bias of 5 for rows of 4.
  expectError(withInstr({8, 4}, [](ProgramDesc &p, std::vector<int64_t> x) {
                InstrDesc in = instr(O::BiasGelu,
                                     {p.scratch(x), p.scratch({5}), p.scratch(x)});
                in.iattrs = {0};
                return in;
              }),
              "bias F32[5] does not match the last dimension of F32[8, 4]");
  // BiasGeluGrad: a bias gradient of 3.
  expectError(withInstr({8, 4}, [](ProgramDesc &p, std::vector<int64_t> x) {
                InstrDesc in = instr(O::BiasGeluGrad,
                                     {p.scratch(x), p.scratch({4}), p.scratch(x),
                                      p.scratch(x), p.scratch({3})});
                in.iattrs = {1};
                return in;
              }),
              "bias gradient F32[3] does not match the last dimension");
  // AddLayerNorm: gamma of 3; AddLayerNormGrad: dR of another size.
  expectError(withInstr({8, 4}, [](ProgramDesc &p, std::vector<int64_t> x) {
                InstrDesc in = instr(O::AddLayerNorm,
                                     {p.scratch(x), p.scratch(x), p.scratch({3}),
                                      p.scratch({4}), p.scratch(x), p.scratch(x)});
                in.fattrs = {1e-5f};
                return in;
              }),
              "gamma (operand 2)");
  expectError(withInstr({8, 4}, [](ProgramDesc &p, std::vector<int64_t> x) {
                InstrDesc in = instr(O::AddLayerNormGrad,
                                     {p.scratch(x), p.scratch({4}), p.scratch(x),
                                      p.scratch({16}), p.scratch(x), p.scratch({4}),
                                      p.scratch({4})});
                in.fattrs = {1e-5f};
                return in;
              }),
              "must have the same number of elements");
  // LogitsStats: one max per row.
  expectError(withInstr({8, 4}, [](ProgramDesc &p, std::vector<int64_t> x) {
                InstrDesc in = instr(O::LogitsStats,
                                     {p.scratch(x), p.scratch({8}, fb::DType::I32),
                                      p.scratch({7}), p.scratch({8}), p.scratch({8})});
                in.iattrs = {-100};
                return in;
              }),
              "M (operand 2)");
}

TEST(ExecutorTest, TpCommOverlapInstructionsCheckTheirShapes) {
  // AllGatherGemm [X, B, Xg, C] and GemmReduceScatter [A, B, W, Y] over a
  // tp group of 2 (x [6, 5], w [7, 5] transposed): the decoder names the
  // operand whose shape or placement is wrong.
  using O = fb::Opcode;
  auto expectError = [](const ArtifactDesc &desc, const std::string &needle) {
    Status st = validateDesc(desc);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  // Operand `i` of the fused function's instruction `which` replaced.
  auto with = [](int which, int i, auto make) {
    ArtifactDesc desc = tpCommOverlap(2, 6, 5, 7);
    ProgramDesc &p = desc.programs[0];
    RefDesc ref = make(p, p.function("fused")[size_t(which)].operands);
    p.function("fused")[size_t(which)].operands[size_t(i)] = ref;
    return desc;
  };
  EXPECT_TRUE(validateDesc(tpCommOverlap(2, 6, 5, 7)).ok());
  using Ops = std::vector<RefDesc>;
  expectError(with(0, 2, [](ProgramDesc &p, const Ops &) {
                return p.scratch({6, 5});
              }),
              "must hold 2 (size of group 'tp') blocks of X");
  expectError(with(0, 3, [](ProgramDesc &p, const Ops &) {
                return p.scratch({12, 6});
              }),
              "must be [12, 7]: Xg's rows times op(B)");
  expectError(with(0, 1, [](ProgramDesc &p, const Ops &) {
                return p.scratch({7, 4});
              }),
              "rows of 5 features times B F32[7, 4] transposed, which has 4 rows");
  // X in Xg's second block: not this rank's (index 0 when validating).
  expectError(with(0, 0, [](ProgramDesc &, const Ops &ops) {
                RefDesc x = ops[2];
                x.shape = {6, 5};
                x.offset += 6 * 5 * 4;
                return x;
              }),
              "but is not this rank's block of it");
  expectError(with(0, 3, [](ProgramDesc &, const Ops &ops) {
                RefDesc c = ops[1];
                c.shape = {12, 7};
                return c;
              }),
              "overlaps operand 1");
  expectError(with(1, 3, [](ProgramDesc &p, const Ops &) {
                return p.scratch({12, 7});
              }),
              "must be [12 / 2 (size of group 'tp'), 7]");
  expectError(with(1, 2, [](ProgramDesc &p, const Ops &) {
                return p.scratch({100});
              }),
              "holds fewer than three blocks of Y (126 floats)");
  expectError(with(1, 3, [](ProgramDesc &, const Ops &ops) {
                RefDesc y = ops[2];
                y.shape = {6, 7};
                return y;
              }),
              "overlaps operand 2");
}

TEST(ExecutorMixedPrecisionTest, Bf16ParamsAreTheF32InitRounded) {
  auto ex = makeExecutor(mixedPrecisionRegression(8, 4), 77);
  ASSERT_TRUE(ex);
  auto raw = ex->readBuffer("fc.weight");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->size(), 32u * 2);
  std::vector<uint16_t> bits(32);
  std::memcpy(bits.data(), raw->data(), raw->size());
  for (size_t g = 0; g < bits.size(); ++g)
    EXPECT_EQ(bits[g],
              floatToBf16(float(double(0.1f) * normal(77, "fc.weight", g))))
        << "element " << g;
  // The main params stay zero until "init" runs.
  auto main = ex->readFloatBuffer("main:fc.weight");
  ASSERT_TRUE(main.ok());
  for (float v : *main)
    EXPECT_EQ(v, 0.0f);
}

TEST(ExecutorMixedPrecisionTest, InitRunsOnceAndIsNotAnIteration) {
  auto ex = makeExecutor(mixedPrecisionRegression(8, 4));
  ASSERT_TRUE(ex);
  auto w = *ex->readFloatBuffer("fc.weight");
  auto ran = ex->runInit();
  ASSERT_TRUE(ran.ok()) << ran.status().toString();
  EXPECT_TRUE(*ran);
  // main = the bf16 parameter widened, exactly (readFloatBuffer widens).
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.weight"), w);
  // The loss and the iteration are untouched.
  EXPECT_EQ(*ex->readFloatBuffer("loss"), std::vector<float>{0.0f});
  EXPECT_EQ(*ex->readBuffer("iteration"), std::vector<uint8_t>(8, 0));
  // Once: a second call (and the first iteration) do not run it again.
  ASSERT_TRUE(
      ex->writeBuffer("main:fc.bias", std::vector<float>(4, 7.0f).data(), 16)
          .ok());
  ran = ex->runInit();
  ASSERT_TRUE(ran.ok());
  EXPECT_FALSE(*ran);
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.bias"), std::vector<float>(4, 7.0f));
  // initializeParameters makes it due again, with zero main params.
  ASSERT_TRUE(ex->initializeParameters().ok());
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.bias"), std::vector<float>(4, 0.0f));
  EXPECT_TRUE(*ex->runInit());
}

TEST(ExecutorMixedPrecisionTest, FirstIterationRunsInitFirst) {
  // Without an explicit runInit the first iteration runs it: the step
  // updates main params that start at the parameters, not at zero.
  const float lr = 0.01f;
  auto ex = makeExecutor(mixedPrecisionRegression(8, 4, 16, 2, 1, false, lr));
  ASSERT_TRUE(ex);
  auto w0 = *ex->readFloatBuffer("fc.weight");
  auto loss = ex->runIteration(1);
  ASSERT_TRUE(loss.ok()) << loss.status().toString();
  auto main = *ex->readFloatBuffer("main:fc.weight");
  auto w1 = *ex->readFloatBuffer("fc.weight");
  EXPECT_EQ(w1, roundedToBf16(main)); // the step casts main into the param
  for (size_t i = 0; i < w0.size(); ++i)
    EXPECT_LE(std::fabs(main[i] - w0[i]), lr * 1.01f) << "element " << i;
  EXPECT_FALSE(*ex->runInit());
}

TEST(ExecutorMixedPrecisionTest, InitSkippedWhenEveryMainParamWasRestored) {
  auto ex = makeExecutor(mixedPrecisionRegression(8, 4));
  ASSERT_TRUE(ex);
  std::vector<float> w(32, 0.25f), b(4, -0.5f);
  // One of two restored: "init" still runs and overwrites both.
  ASSERT_TRUE(ex->writeBuffer("main:fc.weight", w.data(), 128).ok());
  EXPECT_TRUE(*ex->runInit());
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.weight"),
            *ex->readFloatBuffer("fc.weight"));
  // Both restored (as a checkpoint load does): skipped.
  ASSERT_TRUE(ex->initializeParameters().ok());
  ASSERT_TRUE(ex->writeBuffer("main:fc.weight", w.data(), 128).ok());
  ASSERT_TRUE(ex->writeBuffer("main:fc.bias", b.data(), 16).ok());
  auto ran = ex->runInit();
  ASSERT_TRUE(ran.ok());
  EXPECT_FALSE(*ran);
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.weight"), w);
  EXPECT_EQ(*ex->readFloatBuffer("main:fc.bias"), b);
  ASSERT_TRUE(ex->runIteration(1).ok());
  // A program without "init" has nothing to run.
  auto plain = makeExecutor(softmaxRegression());
  ASSERT_TRUE(plain);
  EXPECT_FALSE(*plain->runInit());
}

TEST(ExecutorMixedPrecisionTest, TrainsLikeF32) {
  auto f32 = train(softmaxRegression(8, 4, 16, 2, 1, true, 0.05f), 10);
  for (bool bf16Grads : {false, true}) {
    SCOPED_TRACE(bf16Grads ? "bf16 grads" : "f32 grads");
    auto mixed =
        train(mixedPrecisionRegression(8, 4, 16, 2, 1, bf16Grads, 0.05f), 10);
    ASSERT_EQ(mixed.size(), 10u);
    for (size_t i = 0; i < mixed.size(); ++i) {
      EXPECT_TRUE(std::isfinite(mixed[i]));
      // bf16 weights keep ~3 significant digits.
      EXPECT_NEAR(mixed[i], f32[i], 0.02 * f32[i]) << "step " << i + 1;
    }
    EXPECT_LT(mixed[9], mixed[0] * 0.8);
  }
}

TEST(ExecutorMixedPrecisionTest, LoadChecksNameTheOpAndDtype) {
  using O = fb::Opcode;
  auto expectError = [](const Status &st, const std::string &needle) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  {
    ArtifactDesc desc = mixedPrecisionRegression();
    ProgramDesc &p = desc.programs[0];
    p.function("microbatch")
        .push_back(instr(O::Gelu,
                         {p.ref(0), p.scratch({8, 4}, fb::DType::BF16)}, "g"));
    expectError(validateDesc(desc),
                "(g): Gelu operand 0 (X) must be F32, got BF16[8, 4] (16-bit "
                "values need a Cast to f32 first)");
  }
  {
    ArtifactDesc desc = mixedPrecisionRegression();
    ProgramDesc &p = desc.programs[0];
    p.function("step").push_back(
        instr(O::Scale, {p.ref(0), p.scratch({8, 4})}, "s"));
    expectError(validateDesc(desc),
                "Scale operands BF16[8, 4] and F32[8, 4] must be both F32 or "
                "both BF16");
  }
  {
    ArtifactDesc desc = mixedPrecisionRegression();
    ProgramDesc &p = desc.programs[0];
    p.function("step").push_back(
        instr(O::Cast, {p.scratch({4}, fb::DType::I32), p.ref(1)}, "c"));
    expectError(validateDesc(desc),
                "Cast operand 0 (X) must be F32, BF16 or F16, got I32[4]");
    p.function("step").back().operands[0] = p.scratch({5});
    expectError(validateDesc(desc), "must have the same number of elements");
  }
  {
    ArtifactDesc desc = mixedPrecisionRegression(8, 4, 16, 2, 2, true);
    ProgramDesc &p = desc.programs[0];
    InstrDesc mx = instr(O::AllReduce, {p.ref(4)}, "mx");
    mx.group = "dp";
    mx.reduce = fb::ReduceOp::Max;
    p.function("step").push_back(mx);
    expectError(
        validateDesc(desc),
        "AllReduce with reduce Max on BF16[8, 4] is not supported (16-bit "
        "reductions are sums)");
  }
  // The bf16 kernels and casts themselves decode.
  EXPECT_TRUE(
      validateDesc(mixedPrecisionRegression(8, 4, 16, 2, 2, true)).ok());
}

TEST(ExecutorMixedPrecisionTest, PipelineProgramRunsItsInitBeforeTheSchedule) {
  // A scheduled program with "init": it runs once, before the first
  // schedule step, outside every microbatch; the loss is unaffected.
  const int64_t b = 2, F = 4, M = 2;
  ArtifactDesc desc = slottedSchedule(2, M, b, F);
  ProgramDesc &p = desc.programs[0];
  int main = p.add("main:acc", fb::BufferKind::MainParam, {F}, fb::DType::F32,
                   fb::InitKind::Zeros, 0.0f, 0);
  InstrDesc fill = instr(fb::Opcode::Fill, {p.ref(main)}, "main.fill");
  fill.fattrs = {3.0f};
  p.function("init").push_back(fill);
  ExecutorOptions options;
  options.trace = true;
  auto ex = makeExecutor(desc, options);
  auto plain = makeExecutor(slottedSchedule(2, M, b, F), ExecutorOptions());
  ASSERT_TRUE(ex && plain);
  ex->startTrace();
  for (int64_t it = 1; it <= 2; ++it) {
    auto loss = ex->runIteration(it), expected = plain->runIteration(it);
    ASSERT_TRUE(loss.ok() && expected.ok()) << loss.status().toString();
    EXPECT_EQ(*loss, *expected);
  }
  EXPECT_EQ(*ex->readFloatBuffer("main:acc"), std::vector<float>(F, 3.0f));
  std::vector<std::string> phases;
  for (const TraceEvent &e : ex->traceEvents())
    if (e.track == "phase")
      phases.push_back(e.name);
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.front(), "init");
  EXPECT_EQ(std::count(phases.begin(), phases.end(), "init"), 1);
}

//===----------------------------------------------------------------------===//
// Rank-relative refs: every rank decodes its own shard
//===----------------------------------------------------------------------===//

namespace {

StatusOr<std::unique_ptr<Executor>>
createForRank(const ArtifactDesc &desc, int worldRank,
              const std::string &name = "shards.tsr") {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
  if (!loaded.ok())
    return loaded.status();
  return Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), worldRank);
}

} // namespace

// The decode of rank r (no communicators needed: "mark" has no collective)
// puts its rank-relative Fills at its dp and tp blocks, on 2 and 4 ranks,
// including a 2 x 2 mesh where the dp index is not the world rank.
TEST(ExecutorTest, RankRelativeRefsResolveToEachRanksShard) {
  const int64_t block = 5;
  for (auto [tp, dp] : {std::pair{1, 2}, {1, 4}, {2, 2}, {2, 1}}) {
    for (int r = 0; r < tp * dp; ++r) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp) +
                   " rank " + std::to_string(r));
      auto ex = createForRank(
          shardedBuckets(tp, dp, block, fb::DType::F32, false), r);
      ASSERT_TRUE(ex.ok()) << ex.status().toString();
      ASSERT_TRUE((*ex)->initializeParameters().ok());
      ASSERT_TRUE((*ex)->runFunction("mark").ok());
      auto param = (*ex)->readFloatBuffer("param");
      auto tpbuf = (*ex)->readFloatBuffer("tpbuf");
      ASSERT_TRUE(param.ok() && tpbuf.ok());
      int dpIndex = r / tp, tpIndex = r % tp;
      for (int64_t k = 0; k < dp * block; ++k)
        EXPECT_EQ((*param)[size_t(k)], k / block == dpIndex ? 7.0f : 0.0f)
            << "param element " << k;
      for (int64_t k = 0; k < tp * block; ++k)
        EXPECT_EQ((*tpbuf)[size_t(k)], k / block == tpIndex ? 5.0f : 0.0f)
            << "tpbuf element " << k;
    }
  }
}

TEST(ExecutorTest, RankRelativeRefOutsideEmbeddingGroupFailsToDecode) {
  // "embedding" holds rank 0 of 2: rank 1 has no index in it.
  ArtifactDesc desc = shardedBuckets(1, 2, 4, fb::DType::F32, false);
  desc.groups.push_back({"embedding", {0}});
  ProgramDesc &p = desc.programs[0];
  InstrDesc fill =
      instr(fb::Opcode::Fill, {rankBlock(p.ref(0), {2}, "embedding")}, "emb");
  fill.fattrs = {1.0f};
  p.function("mark").push_back(fill);
  EXPECT_TRUE(createForRank(desc, 0).ok());
  auto ex1 = createForRank(desc, 1, "emb.tsr");
  ASSERT_FALSE(ex1.ok());
  const std::string &msg = ex1.status().message();
  for (const char *needle :
       {"emb.tsr", "function 'mark' instruction 2 (Fill at emb)",
        "operand 0: rank 1 is in no rank group of kind 'embedding'"})
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  // tessera-run's pre-launch validation finds it too.
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "emb.tsr");
  ASSERT_TRUE(loaded.ok());
  Status st = Executor::validate(**loaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("operand 0 is relative to rank group kind "
                              "'embedding', but rank 1 is in no rank group "
                              "of that kind"),
            std::string::npos)
      << st.message();
}

// dp = 1: the self communicator's in-place forms leave the buffer as it is
// (it is its own reduction), and a shard that overlaps the bucket elsewhere
// than at this rank's block fails to decode, naming the instruction.
TEST(ExecutorTest, InPlaceCollectivesOnOneRankAndBadOverlap) {
  ArtifactDesc desc = shardedBuckets(1, 1, 6);
  auto ex = createForRank(desc, 0);
  ASSERT_TRUE(ex.ok()) << ex.status().toString();
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  for (const char *name : {"grad", "grad.async", "param"})
    ASSERT_TRUE((*ex)->writeBuffer(name, values.data(), 24).ok());
  for (const char *fn : {"rs", "rsa", "ag"})
    ASSERT_TRUE((*ex)->runFunction(fn).ok()) << fn;
  for (const char *name : {"grad", "grad.async", "param"})
    EXPECT_EQ(*(*ex)->readFloatBuffer(name), values) << name;

  for (fb::Opcode op : {fb::Opcode::ReduceScatter, fb::Opcode::AllGather}) {
    SCOPED_TRACE(fb::EnumNameOpcode(op));
    ArtifactDesc bad = shardedBuckets(1, 1, 6);
    ProgramDesc &p = bad.programs[0];
    RefDesc full = p.ref(0);
    RefDesc shifted{full.offset + 4, {6}, fb::DType::F32};
    InstrDesc in = instr(op,
                         op == fb::Opcode::AllGather
                             ? std::vector<RefDesc>{shifted, full}
                             : std::vector<RefDesc>{full, shifted},
                         "bad.overlap");
    in.group = "dp";
    p.function("rs").push_back(in);
    auto failed = createForRank(bad, 0, "overlap.tsr");
    ASSERT_FALSE(failed.ok());
    std::string needle = std::string("function 'rs' instruction 1 (") +
                         fb::EnumNameOpcode(op) + " at bad.overlap)";
    const std::string &msg = failed.status().message();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("but is not this rank's block of it (dp index 0: "),
              std::string::npos)
        << msg;
    auto loaded = LoadedArtifact::loadFromMemory(buildFile(buildPayload(bad)),
                                                 "overlap.tsr");
    ASSERT_TRUE(loaded.ok());
    EXPECT_FALSE(Executor::validate(**loaded).ok());
  }
}

// The pre-launch validation decodes rank-relative operands and in-place
// collectives at every rank's index, not only index 0: a shard at block 0
// on every rank (stride 0) is rank 0's in-place all-gather but overlaps the
// bucket wrongly at every other dp index, including where the dp index is
// not the world rank (tp 2 x dp 2). The per-rank decode says the same.
TEST(ExecutorTest, ValidationChecksEveryIndexOfRankRelativeOperands) {
  const int64_t block = 16;
  for (auto [tp, dp] : {std::pair{1, 2}, {1, 4}, {2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp));
    // No other collectives: the per-rank decode needs no communicator
    // before it reaches the all-gather.
    ArtifactDesc desc = shardedBuckets(tp, dp, block, fb::DType::F32, false);
    ProgramDesc &p = desc.programs[0];
    RefDesc param = p.ref(4);
    RefDesc first{param.offset, {block}, fb::DType::F32, "dp", 0};
    InstrDesc ag = instr(fb::Opcode::AllGather, {first, param}, "ag.block0");
    ag.group = "dp";
    p.function("ag").push_back(ag);
    auto loaded = LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)),
                                                 "block0.tsr");
    ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
    Status st = Executor::validate(**loaded);
    ASSERT_FALSE(st.ok());
    std::string blockAt = std::to_string(param.offset + block * 4);
    for (std::string needle :
         {std::string("block0.tsr"),
          std::string("function 'ag' instruction 0 (AllGather at ag.block0)"),
          "but is not this rank's block of it (dp index 1: bytes " + blockAt})
      EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    // The first rank of dp index 1 fails to decode with the same message.
    auto ex = createForRank(desc, tp, "block0.tsr");
    ASSERT_FALSE(ex.ok());
    EXPECT_NE(ex.status().message().find(st.message()), std::string::npos)
        << ex.status().message() << "\nvs\n"
        << st.message();
  }
  // A correct layout (stride one block) validates.
  auto loaded = LoadedArtifact::loadFromMemory(
      buildFile(buildPayload(shardedBuckets(2, 2, block))), "ok.tsr");
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(Executor::validate(**loaded).ok());
}

//===----------------------------------------------------------------------===//
// Host waits: an iteration waits for the backend once (the one
// synchronize and the one read of the losses), however many microbatches,
// collectives, optimizer buckets or schedule steps it has; a GPU backend
// relies on this (the CPU backend's waits are free).
//===----------------------------------------------------------------------===//

namespace {

/// Runs `iterations` iterations of `desc` on the CPU backend behind a
/// RecordingBackend, and returns the calls recorded during the iterations.
std::vector<std::string> callsOfIterations(const ArtifactDesc &desc,
                                           int iterations) {
  std::vector<std::string> calls;
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mem.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return calls;
  auto cpu = BackendRegistry::global().create("cpu", {});
  EXPECT_TRUE(cpu.ok());
  auto ex = Executor::create(
      *loaded, std::make_unique<RecordingBackend>(std::move(*cpu), calls),
      CommunicatorSet(), 0);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return calls;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  EXPECT_TRUE((*ex)->runInit().ok());
  calls.clear();
  for (int it = 1; it <= iterations; ++it) {
    auto loss = (*ex)->runIteration(it);
    EXPECT_TRUE(loss.ok()) << loss.status().toString();
  }
  return calls;
}

} // namespace

TEST(ExecutorHostWaitTest, OneWaitPerIteration) {
  // 4 microbatches, Adam, and dp collectives (started and blocking) on a
  // group of one rank.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 4, 1, true, 0.05f);
  auto &step = desc.programs[0].function("step");
  InstrDesc start =
      instr(fb::Opcode::AllReduceStart, {desc.programs[0].ref(2)}, "ar.start");
  start.group = "dp";
  start.event = 1;
  InstrDesc wait = instr(fb::Opcode::Wait, {}, "ar.wait");
  wait.event = 1;
  InstrDesc blocking =
      instr(fb::Opcode::AllReduce, {desc.programs[0].ref(2)}, "ar");
  blocking.group = "dp";
  step.insert(step.begin(), {start, wait, blocking});
  auto calls = callsOfIterations(desc, 3);
  EXPECT_EQ(RecordingBackend::count(calls, "synchronize"), 3);
  EXPECT_EQ(RecordingBackend::count(calls, "copyToHost"), 3);
  EXPECT_EQ(RecordingBackend::count(calls, "adam"), 3 * 2);
  // Every microbatch's loss is staged on the device, not read.
  EXPECT_EQ(RecordingBackend::count(calls, "copy"), 3 * 4);
  // Nothing is allocated per iteration.
  EXPECT_EQ(RecordingBackend::count(calls, "allocate"), 0);
  EXPECT_EQ(RecordingBackend::count(calls, "allocateHost"), 0);
}

TEST(ExecutorHostWaitTest, OneWaitPerScheduledIteration) {
  auto calls = callsOfIterations(slottedSchedule(2, 2, 2, 4), 2);
  EXPECT_EQ(RecordingBackend::count(calls, "synchronize"), 2);
  EXPECT_EQ(RecordingBackend::count(calls, "copyToHost"), 2);
}

TEST(ExecutorHostWaitTest, DeviceMemoryPathsGiveTheSameTraining) {
  // A backend whose memory is not host memory gets its parameters and
  // checkpoint buffers through pinned chunks: the losses and a buffer round
  // trip are those of the host path.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 1, true, 0.05f);
  std::vector<double> reference = train(desc, 4);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mem.tsr");
  ASSERT_TRUE(loaded.ok());
  std::vector<std::string> calls;
  auto ex = Executor::create(
      *loaded,
      std::make_unique<RecordingBackend>(
          std::move(*BackendRegistry::global().create("cpu", {})), calls,
          /*deviceMemory=*/true),
      CommunicatorSet(), 0);
  ASSERT_TRUE(ex.ok()) << ex.status().toString();
  ASSERT_TRUE((*ex)->initializeParameters().ok());
  for (int it = 1; it <= 4; ++it) {
    auto loss = (*ex)->runIteration(it);
    ASSERT_TRUE(loss.ok()) << loss.status().toString();
    EXPECT_EQ(*loss, reference[size_t(it - 1)]) << "iteration " << it;
  }
  EXPECT_EQ(RecordingBackend::count(calls, "allocateHost"), 2)
      << "the input staging and the pinned transfer chunk";
  const std::string name = (*loaded)->root()->programs()->Get(0)
                               ->buffers()->Get(0)->name()->str();
  auto bytes = (*ex)->readBuffer(name);
  ASSERT_TRUE(bytes.ok());
  std::vector<uint8_t> changed = *bytes;
  for (uint8_t &byte : changed)
    byte ^= 0x5a;
  ASSERT_TRUE(
      (*ex)->writeBuffer(name, changed.data(), int64_t(changed.size())).ok());
  auto back = (*ex)->readBuffer(name);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, changed);
}

// A backend that lacks an instruction the program uses is an error when the
// executor loads the program (before any training), naming the
// instruction: how a CUDA run of a context-parallel or MoE model stops.
TEST(ExecutorTest, UnsupportedInstructionFailsAtLoad) {
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 1, true, 0.05f);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mem.tsr");
  ASSERT_TRUE(loaded.ok());
  std::vector<std::string> calls;
  auto backend = std::make_unique<RecordingBackend>(
      std::move(*BackendRegistry::global().create("cpu", {})), calls);
  backend->unsupported = "Gemm";
  auto ex = Executor::create(*loaded, std::move(backend), CommunicatorSet(), 0);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("Gemm"), std::string::npos)
      << ex.status().message();
  EXPECT_NE(ex.status().message().find("does not implement Gemm"),
            std::string::npos)
      << ex.status().message();
  EXPECT_NE(ex.status().message().find("mem.tsr: program 0 function"),
            std::string::npos)
      << ex.status().message();
}

//===----------------------------------------------------------------------===//
// Gradient clipping and weight-decay runs (Megatron's clip_grad_norm_fp32
// and its no-decay parameter group)
//===----------------------------------------------------------------------===//

namespace {

/// One rank's step over a 12-element parameter: the sum of squares of the
/// gradient's runs `normRuns`, the norm and coefficient for `maxNorm`, the
/// gradient scaled, then Adam (weight decay 0.1) without decay on `noDecay`.
ArtifactDesc clippedStep(std::vector<int64_t> normRuns,
                         std::vector<int64_t> noDecay, float maxNorm,
                         bool unscale = false) {
  ArtifactDesc desc;
  ProgramDesc p;
  using K = fb::BufferKind;
  int param = p.add("w", K::Param, {12});
  int grad = p.add("grad:w", K::Grad, {12}, fb::DType::F32,
                   fb::InitKind::Zeros, 0.0f, param);
  int m = p.add("adam.exp_avg:w", K::OptState, {12});
  int v = p.add("adam.exp_avg_sq:w", K::OptState, {12});
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  int norm = p.add("grad_norm", K::Metric, {});
  p.iterationBuffer = it;
  RefDesc sumsq = p.scratch({}), coeff = p.scratch({});
  p.function("microbatch"); // nothing: the test writes the gradient
  std::vector<InstrDesc> &step = p.function("step");
  InstrDesc ss = instr(fb::Opcode::SumSquares, {p.ref(grad), sumsq}, "ss");
  ss.iattrs = std::move(normRuns);
  step.push_back(ss);
  InstrDesc clip = instr(fb::Opcode::ClipGradNorm,
                         {sumsq, p.ref(norm), coeff}, "clip");
  clip.fattrs = {maxNorm};
  clip.iattrs = {unscale ? 1 : 0};
  step.push_back(clip);
  step.push_back(instr(fb::Opcode::ScaleBy, {p.ref(grad), coeff, p.ref(grad)},
                       "scale"));
  InstrDesc adam = instr(fb::Opcode::Adam,
                         {p.ref(param), p.ref(grad), p.ref(m), p.ref(v),
                          p.ref(it)},
                         "adam");
  adam.fattrs = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  adam.iattrs = std::move(noDecay);
  step.push_back(adam);
  desc.programs.push_back(std::move(p));
  return desc;
}

} // namespace

// The norm reads only the runs, the coefficient clips it to max_norm, every
// gradient element is scaled, and Adam decays outside its runs only: each
// element against a scalar reference.
TEST(ExecutorTest, ClippingAndWeightDecayRuns) {
  std::vector<float> w(12), g(12);
  for (int i = 0; i < 12; ++i) {
    w[size_t(i)] = 0.5f + 0.1f * float(i);
    g[size_t(i)] = 0.25f * float(i % 5) - 0.4f;
  }
  const int64_t one = 1;
  // Runs [0, 3) and [8, 12) in the norm; [3, 8) without decay.
  for (float maxNorm : {0.5f, 100.0f, 0.0f}) {
    SCOPED_TRACE("max_norm " + std::to_string(maxNorm));
    auto ex = createForRank(clippedStep({12, 0, 3, 8, 12}, {12, 3, 8}, maxNorm),
                            0, "clip.tsr");
    ASSERT_TRUE(ex.ok()) << ex.status().toString();
    ASSERT_TRUE((*ex)->writeBuffer("w", w.data(), 48).ok());
    ASSERT_TRUE((*ex)->writeBuffer("grad:w", g.data(), 48).ok());
    ASSERT_TRUE((*ex)->writeBuffer("iteration", &one, 8).ok());
    ASSERT_TRUE((*ex)->runFunction("step").ok());
    double sumsq = 0;
    for (int i : {0, 1, 2, 8, 9, 10, 11})
      sumsq += double(g[size_t(i)]) * g[size_t(i)];
    const float norm = float(std::sqrt(sumsq));
    EXPECT_FLOAT_EQ((*(*ex)->readFloatBuffer("grad_norm"))[0], norm);
    const float c = math::clipCoefficient(norm, maxNorm);
    if (maxNorm == 0.5f)
      EXPECT_LT(c, 1.0f); // it binds
    else
      EXPECT_EQ(c, 1.0f);
    std::vector<float> got = *(*ex)->readFloatBuffer("w");
    for (int i = 0; i < 12; ++i) {
      float p = w[size_t(i)], mi = 0, vi = 0;
      const bool decays = i < 3 || i >= 8;
      math::adamUpdate(p, g[size_t(i)] * c, mi, vi, 0.9f, 0.95f,
                       math::adamBiasCorrection(0.9f, 1),
                       math::adamBiasCorrection(0.95f, 1), 0.01f,
                       1e-8f, decays ? 0.1f : 0.0f);
      EXPECT_FLOAT_EQ(got[size_t(i)], p) << "element " << i;
    }
  }
}

// fp16: the gradients are of a loss scaled by 8; ClipGradNorm {unscale}
// gives the unscaled norm and a coefficient that unscales as it clips (the
// update equals the one of the unscaled gradients), and a gradient that is
// not finite skips the update: parameters and Adam state stay as they
// were. LossSeed writes its value times the loss scale.
TEST(ExecutorTest, Fp16UnscalesAndSkipsOverflowingSteps) {
  std::vector<float> w(12), g(12), scaled(12);
  for (int i = 0; i < 12; ++i) {
    w[size_t(i)] = 0.5f + 0.1f * float(i);
    g[size_t(i)] = 0.25f * float(i % 5) - 0.4f;
    scaled[size_t(i)] = 8.0f * g[size_t(i)];
  }
  const int64_t one = 1;
  for (float maxNorm : {0.5f, 0.0f}) {
    SCOPED_TRACE("max_norm " + std::to_string(maxNorm));
    auto ex = createForRank(clippedStep({}, {}, maxNorm, /*unscale=*/true), 0,
                            "fp16.tsr");
    ASSERT_TRUE(ex.ok()) << ex.status().toString();
    (*ex)->setLossScale(8.0);
    ASSERT_TRUE((*ex)->writeBuffer("w", w.data(), 48).ok());
    ASSERT_TRUE((*ex)->writeBuffer("grad:w", scaled.data(), 48).ok());
    ASSERT_TRUE((*ex)->writeBuffer("iteration", &one, 8).ok());
    ASSERT_TRUE((*ex)->runFunction("step").ok());
    EXPECT_FALSE((*ex)->lastIterationSkipped());
    double sumsq = 0;
    for (float x : g)
      sumsq += double(x) * x;
    const float norm = float(std::sqrt(sumsq));
    EXPECT_EQ((*(*ex)->readFloatBuffer("grad_norm"))[0], norm);
    const float c = math::clipCoefficient(norm, maxNorm);
    std::vector<float> got = *(*ex)->readFloatBuffer("w");
    for (int i = 0; i < 12; ++i) {
      float p = w[size_t(i)], mi = 0, vi = 0;
      math::adamUpdate(p, g[size_t(i)] * c, mi, vi, 0.9f, 0.95f,
                       math::adamBiasCorrection(0.9f, 1),
                       math::adamBiasCorrection(0.95f, 1), 0.01f, 1e-8f, 0.1f);
      EXPECT_EQ(got[size_t(i)], p) << "element " << i;
    }
  }
  // An inf in the gradients: nothing is updated.
  auto ex = createForRank(clippedStep({}, {}, 1.0f, /*unscale=*/true), 0,
                          "fp16.tsr");
  ASSERT_TRUE(ex.ok()) << ex.status().toString();
  (*ex)->setLossScale(65536.0);
  scaled[5] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE((*ex)->writeBuffer("w", w.data(), 48).ok());
  ASSERT_TRUE((*ex)->writeBuffer("grad:w", scaled.data(), 48).ok());
  ASSERT_TRUE((*ex)->writeBuffer("iteration", &one, 8).ok());
  ASSERT_TRUE((*ex)->runFunction("step").ok());
  EXPECT_TRUE((*ex)->lastIterationSkipped());
  EXPECT_TRUE(std::isinf((*(*ex)->readFloatBuffer("grad_norm"))[0]));
  EXPECT_EQ(*(*ex)->readFloatBuffer("w"), w);
  EXPECT_EQ(*(*ex)->readFloatBuffer("adam.exp_avg:w"), std::vector<float>(12));
  EXPECT_EQ(*(*ex)->readFloatBuffer("adam.exp_avg_sq:w"),
            std::vector<float>(12));
}

TEST(ExecutorTest, ClipGradNormUnscaleIsAFlag) {
  ArtifactDesc desc = clippedStep({}, {}, 1.0f, /*unscale=*/true);
  for (InstrDesc &in : desc.programs[0].function("step"))
    if (in.op == fb::Opcode::ClipGradNorm)
      in.iattrs = {2};
  auto ex = createForRank(desc, 0, "flag.tsr");
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("ClipGradNorm's unscale is 0 or 1, got 2"),
            std::string::npos)
      << ex.status().message();
}

TEST(ExecutorTest, LossSeedCarriesTheLossScale) {
  ArtifactDesc desc;
  ProgramDesc p;
  int y = p.add("seed", fb::BufferKind::Metric, {});
  InstrDesc seed = instr(fb::Opcode::LossSeed, {p.ref(y)}, "seed");
  seed.fattrs = {0.25f};
  p.function("microbatch").push_back(seed);
  desc.programs.push_back(std::move(p));
  auto ex = createForRank(desc, 0, "seed.tsr");
  ASSERT_TRUE(ex.ok()) << ex.status().toString();
  ASSERT_TRUE((*ex)->runFunction("microbatch").ok());
  EXPECT_EQ((*(*ex)->readFloatBuffer("seed"))[0], 0.25f);
  (*ex)->setLossScale(4294967296.0);
  ASSERT_TRUE((*ex)->runFunction("microbatch").ok());
  EXPECT_EQ((*(*ex)->readFloatBuffer("seed"))[0], 1073741824.0f);
}

// Runs must be well formed and within the operand's shard; the validator
// names the instruction.
// overlap_param_gather's sync ids are program-wide: a wait names a start of
// the program, and one start per id.
TEST(ExecutorTest, ParamSyncIdsMatchTheirStarts) {
  using O = fb::Opcode;
  {
    ArtifactDesc a = softmaxRegression();
    InstrDesc wait = instr(O::ParamSyncWait, {}, "stray");
    wait.event = 5;
    a.programs[0].function("microbatch").push_back(wait);
    auto ex = createForRank(a, 0, "sync.tsr");
    ASSERT_FALSE(ex.ok());
    EXPECT_NE(ex.status().message().find(
                  "ParamSyncWait of sync id 5, which no ParamSyncStart of the "
                  "program starts"),
              std::string::npos)
        << ex.status().message();
  }
  {
    ArtifactDesc a = softmaxRegression();
    ProgramDesc &p = a.programs[0];
    RefDesc w = p.ref(p.add("w.full", fb::BufferKind::Activation, {8}));
    RefDesc s = p.ref(p.add("w.shard", fb::BufferKind::Activation, {8}));
    for (const char *loc : {"first", "second"}) {
      InstrDesc start = instr(O::ParamSyncStart, {s, w}, loc);
      start.group = "dp";
      start.event = 1;
      p.function("step").push_back(start);
    }
    auto ex = createForRank(a, 0, "sync.tsr");
    ASSERT_FALSE(ex.ok());
    EXPECT_NE(ex.status().message().find("ParamSyncStart of sync id 1, which"),
              std::string::npos)
        << ex.status().message();
    EXPECT_NE(ex.status().message().find("already starts"), std::string::npos)
        << ex.status().message();
  }
}

TEST(ExecutorTest, BadRunsFailToValidate) {
  for (auto [runs, why] :
       {std::pair<std::vector<int64_t>, const char *>{
            {12, 5, 3}, "runs must be non-empty, ascending and disjoint"},
        {{12, 0}, "runs are [shard_elements] followed by [start, end) pairs"},
        {{0, 0, 4}, "runs need shard_elements >= 1"}}) {
    SCOPED_TRACE(why);
    auto ex = createForRank(clippedStep(runs, {}, 1.0f), 0, "bad.tsr");
    ASSERT_FALSE(ex.ok());
    EXPECT_NE(ex.status().message().find(why), std::string::npos)
        << ex.status().message();
  }
}
