//===- PipelineMpiTest.cpp - Pipeline p2p over MPI (2 ranks) --------------===//
//
// Two pipeline stages (world 2 = pp 2) built by hand: activations and
// gradients cross the stages with Send/Recv under 1F1B, the loss reported by
// the last stage reaches both ranks, p2p bytes are counted, a batch that
// sends and receives both ways completes even for messages too large to be
// sent eagerly, and a stage waiting for a peer that stalls is described by
// the watchdog (stage, function, microbatch, operation).
//
// Every rank runs the whole suite; the exit code is the maximum over ranks.
// Tests avoid ASSERT_* before collectives so that a failing rank never
// leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {


/// Loads `desc` and creates this rank's executor with MPI communicators (as
/// tessera-run does). Collective. Null on error (on every rank alike, except
/// for executor creation errors, which the tests expect not to happen).
std::unique_ptr<Executor> makeExecutor(const ArtifactDesc &desc,
                                       const std::string &name) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return nullptr;
  Status valid = Executor::validate(**loaded);
  EXPECT_TRUE(valid.ok()) << valid.toString();
  auto comms = createMpiCommunicators(*(*loaded)->root());
  EXPECT_TRUE(comms.ok()) << comms.status().toString();
  if (!comms.ok())
    return nullptr;
  EXPECT_TRUE(comms->lossReducePp);
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(*comms), worldRank());
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  return std::move(*ex);
}

std::vector<float> features(const Executor &ex, int64_t it, int64_t m,
                            int64_t f) {
  const DataLayout &layout = ex.dataLayout();
  std::vector<float> x(size_t(layout.microBatch * f));
  for (int64_t i = 0; i < layout.microBatch; ++i) {
    int64_t g = globalSampleIndex(layout, it, m, i);
    syntheticFeatures(layout.seed, g, syntheticLabel(layout.seed, g, 4), f,
                      x.data() + i * f);
  }
  return x;
}

/// Both stages run forward_c0 once: X = stage + 1 (`elements`), Send X
/// (iattrs `send`), Recv into Y (`received` elements, iattrs `recv`),
/// or the Recv first (`receiveFirst`), then Z = Y; instruction names
/// "<name>.send" and "<name>.recv".
ArtifactDesc sendRecv(const char *name, int64_t elements, int64_t received,
                      std::vector<int64_t> sendAttrs,
                      std::vector<int64_t> recvAttrs, bool receiveFirst,
                      const char *scheduleKind) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a = twoStagePipeline(1);
  for (int stage = 0; stage < 2; ++stage) {
    ProgramDesc p;
    p.ppRank = stage;
    int x = p.add("X", K::Param, {elements});
    int y = p.add("Y", K::Param, {received});
    int z = p.add("Z", K::Param, {received});
    auto &fwd = p.function("forward_c0");
    InstrDesc fill = instr(O::Fill, {p.ref(x)}, "fill.x");
    fill.fattrs = {float(stage + 1)};
    fwd.push_back(fill);
    InstrDesc send =
        instr(O::Send, {p.ref(x)}, std::string(name) + ".send");
    send.iattrs = sendAttrs;
    InstrDesc recv =
        instr(O::Recv, {p.ref(y)}, std::string(name) + ".recv");
    recv.iattrs = recvAttrs;
    fwd.push_back(receiveFirst ? recv : send);
    fwd.push_back(receiveFirst ? send : recv);
    fwd.push_back(instr(O::Copy, {p.ref(y), p.ref(z)}, "use.y"));
    p.schedule = {{"forward_c0", 0, 0}};
    if (scheduleKind)
      p.scheduleKind = scheduleKind;
    a.programs[size_t(stage)] = std::move(p);
  }
  return a;
}

/// Each stage sends X to the other (+1 / -1, tag 7) and receives Y. The
/// Send and the Recv are one batch, completed at the Copy; with blocking
/// sends both stages would wait for each other.
ArtifactDesc exchange(int64_t elements) {
  return sendRecv("exchange", elements, elements, {+1, 7}, {-1, 7},
                  /*receiveFirst=*/false, nullptr);
}

/// Each stage sends X (`elements`) to itself on tag 3 and receives it into
/// Y (`received` elements), or receives first (`receiveFirst`): the V's
/// turn (peer 0), a copy through the executor's queue, no message.
ArtifactDesc selfExchange(int64_t elements, int64_t received,
                          bool receiveFirst) {
  return sendRecv("self", elements, received, {0, 3}, {0, 3}, receiveFirst,
                  "zbv");
}

} // namespace

// A Send and Recv to the rank itself copy through the executor's queue:
// the value arrives, nothing crosses MPI; receiving before sending, or
// another size than was sent, is an error naming the tag.
TEST(PipelineMpiTest, SendToItselfIsAQueueCopy) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  const int64_t n = 1 << 16;
  auto ex = makeExecutor(selfExchange(n, n, false), "self.tsr");
  if (!ex)
    return;
  for (int64_t it = 1; it <= 2; ++it) {
    auto loss = ex->runIteration(it);
    ASSERT_TRUE(loss.ok()) << loss.status().toString();
  }
  auto z = ex->readFloatBuffer("Z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ((*z)[0], float(worldRank() + 1));
  EXPECT_EQ((*z)[size_t(n - 1)], float(worldRank() + 1));
  EXPECT_EQ(ex->commCounters()["pp"].p2p, uint64_t(0));

  auto early = makeExecutor(selfExchange(n, n, true), "self-early.tsr");
  ASSERT_TRUE(early);
  auto st = early->runIteration(1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find(
                "receives from pp rank " + std::to_string(worldRank()) +
                " itself on tag 3, which sent nothing there"),
            std::string::npos)
      << st.status().toString();

  auto sized = makeExecutor(selfExchange(n, n / 2, false), "self-size.tsr");
  ASSERT_TRUE(sized);
  st = sized->runIteration(1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find(
                "receives " + std::to_string(n * 2) + " bytes from pp rank " +
                std::to_string(worldRank()) + " itself on tag 3, which sent " +
                std::to_string(n * 4)),
            std::string::npos)
      << st.status().toString();
}

TEST(PipelineMpiTest, OneFOneBMovesActivationsAndGradients) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  for (int64_t f : {int64_t(4), int64_t(65536)}) {
    // f = 65536: 512 KiB messages, beyond MPI's eager limit.
    const int64_t b = 2, M = 4;
    auto ex = makeExecutor(twoStagePipeline(M, b, f), "pp2.tsr");
    if (!ex)
      return;
    EXPECT_EQ(ex->pipelineStage(), worldRank());
    EXPECT_EQ(ex->pipelineStages(), 2);
    for (int64_t it = 1; it <= 2; ++it) {
      auto loss = ex->runIteration(it);
      EXPECT_TRUE(loss.ok()) << loss.status().toString();
      if (!loss.ok())
        return;
      // Expected: the mean over microbatches of mean(features), and on
      // stage 0 acc.out = 2 * the sum of the microbatches' features.
      double expected = 0.0;
      std::vector<double> acc(size_t(b * f), 0.0);
      for (int64_t m = 0; m < M; ++m) {
        std::vector<float> x = features(*ex, it, m, f);
        double sum = 0.0;
        for (size_t k = 0; k < x.size(); ++k) {
          sum += x[k];
          acc[k] += 2.0 * x[k];
        }
        expected += sum / double(x.size()) / double(M);
      }
      EXPECT_NEAR(*loss, expected, 1e-5) << "rank " << worldRank();
      double other = *loss;
      MPI_Bcast(&other, 1, MPI_DOUBLE, 1, MPI_COMM_WORLD);
      EXPECT_EQ(*loss, other) << "every rank reports stage 1's loss";
      if (worldRank() == 0) {
        auto out = ex->readFloatBuffer("acc.out");
        EXPECT_TRUE(out.ok());
        size_t bad = 0;
        if (out.ok())
          for (size_t k = 0; k < acc.size(); ++k)
            if (std::fabs((*out)[k] - acc[k]) > 1e-4 && bad++ < 5)
              ADD_FAILURE() << "acc.out[" << k << "] = " << (*out)[k]
                            << ", expected " << acc[k];
      }
    }
    auto counters = ex->commCounters();
    // Per iteration each stage sends M tensors of b x f floats.
    EXPECT_EQ(counters["pp"].p2p, uint64_t(2 * M * b * f * 4));
    EXPECT_EQ(counters["pp"].allReduce, 0u); // the loss channel is separate
    EXPECT_EQ(counters["pp"].total(), counters["pp"].p2p);
  }
}

TEST(PipelineMpiTest, SendAndRecvBothWaysInOneBatch) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  const int64_t n = 1 << 18; // 1 MiB each way: no eager completion
  auto ex = makeExecutor(exchange(n), "exchange.tsr");
  if (!ex)
    return;
  auto loss = ex->runIteration(1);
  EXPECT_TRUE(loss.ok()) << loss.status().toString();
  if (loss.ok())
    EXPECT_TRUE(std::isnan(*loss)); // no program has a loss buffer
  auto z = ex->readFloatBuffer("Z");
  EXPECT_TRUE(z.ok());
  if (z.ok()) {
    EXPECT_EQ(z->size(), size_t(n));
    EXPECT_EQ((*z)[0], float(2 - worldRank()));
    EXPECT_EQ((*z)[size_t(n - 1)], float(2 - worldRank()));
  }
  EXPECT_EQ(ex->commCounters()["pp"].p2p, uint64_t(n * 4));
}

TEST(PipelineMpiTest, WatchdogNamesStageAndPendingOperations) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  auto ex = makeExecutor(exchange(16), "stall.tsr");
  if (!ex)
    return;
  std::string seen;
  std::atomic<bool> done{false};
  std::thread watcher;
  if (worldRank() == 0)
    watcher = std::thread([&] {
      while (!done.load() && seen.empty()) {
        seen = ex->stalledInstruction(0.2);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  else // stage 1 stalls, so stage 0 waits for its Recv
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto loss = ex->runIteration(1);
  done.store(true);
  if (watcher.joinable())
    watcher.join();
  EXPECT_TRUE(loss.ok()) << loss.status().toString();
  if (worldRank() == 0) {
    for (const char *needle :
         {"stall.tsr: pipeline stage 0 (pp rank 0 of 2): waiting for the p2p "
          "batch opened by function 'forward_c0' microbatch 0: ",
          "send to pp rank 1 tag 7, [16] f32 at exchange.send; ",
          "recv from pp rank 1 tag 7, [16] f32 at exchange.recv made no "
          "progress for "})
      EXPECT_NE(seen.find(needle), std::string::npos) << seen;
  }
  EXPECT_EQ(ex->stalledInstruction(0.0), "");
}

TEST(PipelineMpiTest, TraceShowsStepsAndPointToPoint) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  ArtifactDesc desc = twoStagePipeline(2);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "t.tsr");
  EXPECT_TRUE(loaded.ok());
  if (!loaded.ok())
    return;
  auto comms = createMpiCommunicators(*(*loaded)->root());
  EXPECT_TRUE(comms.ok());
  if (!comms.ok())
    return;
  ExecutorOptions options;
  options.trace = true;
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(*comms), worldRank(), options);
  EXPECT_TRUE(ex.ok());
  if (!ex.ok())
    return;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  EXPECT_TRUE((*ex)->runIteration(1).ok());
  std::vector<std::string> phases, p2p;
  for (const TraceEvent &e : (*ex)->traceEvents()) {
    if (e.track == "phase")
      phases.push_back(e.name);
    if (e.track == "p2p" && e.name != "p2p wait")
      p2p.push_back(e.name);
  }
  using V = std::vector<std::string>;
  if (worldRank() == 0) {
    EXPECT_EQ(phases,
              (V{"F c0 mb0", "F c0 mb1", "B c0 mb0", "B c0 mb1", "step"}));
    EXPECT_EQ(p2p, (V{"send\u2192pp1", "send\u2192pp1", "recv\u2190pp1",
                      "recv\u2190pp1"}));
  } else {
    EXPECT_EQ(phases, (V{"F c0 mb0", "B c0 mb0", "F c0 mb1", "B c0 mb1"}));
    EXPECT_EQ(p2p, (V{"recv\u2190pp0", "send\u2192pp0", "recv\u2190pp0",
                      "send\u2192pp0"}));
  }
  // Every p2p wait lies inside a phase, and instructions never overlap.
  const auto &events = (*ex)->traceEvents();
  for (const TraceEvent &e : events) {
    if (e.track == "phase")
      continue;
    bool inside = false;
    for (const TraceEvent &p : events)
      inside |= p.track == "phase" && p.startUs <= e.startUs + 1e-3 &&
                e.startUs + e.durationUs <= p.startUs + p.durationUs + 1e-3;
    EXPECT_TRUE(inside) << e.name << " on " << e.track;
  }
}
