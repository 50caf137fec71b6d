//===- NcclExecutorTest.cpp - The executor on NCCL communicators (mpirun) -===//
//
// End-to-end test of the CUDA backend's communication wiring, without a GPU.
// For a device backend tessera-run (RankRun::setUp) hands the executor the
// communicators of Backend::createCommunicators (NCCL, ordered on the
// backend's stream) for its collectives and pipeline Send/Recv, while the
// MPI communicators keep the host-side loss reductions (lossReduce,
// lossReducePp) and the world. The executor then skips its host
// synchronisation before collectives and Send/Recv (syncForHostComm) and
// waits for the device once per iteration (collectLosses).
// NcclCommunicatorTest checks the communicator alone; this test checks that
// the executor drives it correctly and gets the MPI run's results.
//
// Each test builds the CommunicatorSet as RankRun::setUp does:
// createMpiCommunicators(artifact), then its groups replaced by those of
// createNcclCommunicators over FakeNccl (NCCL over MPI and host memory, with
// a call log) with a compute stream made through the fake. The executor
// runs the CPU backend wrapped in a RecordingBackend, which forwards every
// call and puts the backend's activity into the fake's call log as the CUDA
// backend's would appear there: each kernel (and host-to-device copy) as a
// launch on the compute stream, each host wait (synchronize, copyToHost) as
// a streamSynchronize of the compute stream. The same artifact also runs on
// the plain MPI communicators (and, for data parallelism, as its one-rank
// twin) for reference:
//  1. data-parallel training (softmaxRegression, dp = world size, Adam,
//     with the weight's gradient all-reduce started and waited for): losses
//     and parameters equal to the MPI run's within 1e-6 relative (identical
//     in practice: the fake reduces with the same MPI operations), losses
//     equal to the one-rank twin's within 1e-5, communication counters
//     (Executor::commCounters) equal to the MPI run's;
//  2. the distributed optimizer's in-place reduce-scatter and all-gather on
//     bucket shards and the started in-place reduce-scatter with its Wait
//     (shardedBuckets, f32 and bf16, tp 1 and, on 4 ranks, tp 2): results
//     and counters equal to the MPI run's; in the log, NCCL's in-place
//     layouts and the kernel between the start and the Wait running before
//     the compute stream waits for the collective (overlap);
//  3. the two-stage pipeline (twoStagePipeline, 2 ranks only): losses and
//     stage 0's accumulated gradients equal to the MPI run's; in the log,
//     every Send/Recv inside a groupStart ... groupEnd holding only
//     point-to-point calls, M + 1 batches per stage and iteration;
//  4. bf16 mixed-precision data-parallel training (mixedPrecisionRegression,
//     f32 and bf16 gradients): as 1, with bf16 all-reduces in the log for
//     bf16 gradients.
// In every case the stream ordering, from the merged log of an iteration
// (or function):
//  - every NCCL operation comes after a wait of its communication stream on
//    an event recorded on the compute stream after the last kernel launched
//    before the operation (it sees every kernel's result);
//  - the compute stream waits for every operation (on an event recorded on
//    its communication stream after it) before the next kernel, except a
//    started collective, whose wait comes at its Wait instruction;
//  - no host wait comes before the device work of the iteration is done:
//    the executor's host-sync-free path. The MPI run, whose executor
//    synchronises before every collective and Send/Recv, shows such waits,
//    so the check does see the executor's synchronisations.
//
// Every rank runs the whole suite; the exit code is the maximum over ranks.
// Tests avoid ASSERT_* before collectives so that a failing rank never
// leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "FakeNccl.h"
#include "RecordingBackend.h"
#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"
#include "tessera/rt/NcclCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

//===----------------------------------------------------------------------===//
// The CPU backend, traced into the fake's log
//===----------------------------------------------------------------------===//

/// The backend's activity as the CUDA backend's would appear in the fake's
/// log: each kernel (and host-to-device copy) a launch on the compute
/// stream, recorded with the log position it precedes; each host wait
/// (synchronize, copyToHost) a streamSynchronize of the compute stream.
struct Launch {
  size_t at;
  std::string kernel;
};

RecordingBackend::Observer traceInto(FakeNccl &fake, void *compute,
                                     std::vector<Launch> &launches) {
  static const std::set<std::string> notLaunches = {
      "allocate",       "deallocate",          "allocateHost",
      "deallocateHost", "createCommunicators", "abortCommunicators"};
  return [&fake, compute, &launches](const char *call) {
    std::string name = call;
    if (name == "synchronize" || name == "copyToHost")
      fake.api().streamSynchronize(compute).ignoreError();
    else if (!notLaunches.count(name))
      launches.push_back({fake.log().size(), name});
  };
}

//===----------------------------------------------------------------------===//
// Executors wired as tessera-run wires them
//===----------------------------------------------------------------------===//

enum class Wiring {
  /// createMpiCommunicators, groups replaced by createNcclCommunicators'.
  Nccl,
  /// createMpiCommunicators only (the reference).
  Mpi,
};

/// One rank's executor and what it runs on. The members are destroyed in
/// reverse order: the executor (with the NCCL group communicators it owns)
/// before the NCCL world communicator, both before the fake that their
/// destructors call.
struct Run {
  /// Both wirings have one: the MPI run's logs only the backend's host
  /// waits.
  std::unique_ptr<FakeNccl> fake;
  void *compute = nullptr;
  std::unique_ptr<NcclCommunicator> ncclWorld;
  /// The backend's launches (RecordingBackend through traceInto).
  std::vector<Launch> launches;
  std::unique_ptr<Executor> ex;
  /// The executor's backend (owned by it).
  RecordingBackend *backend = nullptr;

  int computeId() const { return fake->streamId(compute); }
  /// Empties the log, so that it holds what follows.
  void startLog() {
    fake->clearLog();
    launches.clear();
  }
};

std::shared_ptr<const LoadedArtifact> load(const ArtifactDesc &desc,
                                           const std::string &name) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  return loaded.ok() ? *loaded : nullptr;
}

/// This rank's executor of `artifact` (parameters initialised), wired as
/// tessera-run wires it for a device backend (Nccl) or for the CPU backend
/// (Mpi). Collective. Null on error (alike on every rank, but for executor
/// creation errors, which the tests expect not to happen unless they ask
/// for the status in `created`).
std::unique_ptr<Run> makeRun(const std::shared_ptr<const LoadedArtifact> &art,
                             Wiring wiring, bool deviceMemory = false,
                             Status *created = nullptr) {
  if (!art)
    return nullptr;
  auto run = std::make_unique<Run>();
  run->fake = std::make_unique<FakeNccl>();
  auto stream = run->fake->api().streamCreate();
  EXPECT_TRUE(stream.ok());
  if (!stream.ok())
    return nullptr;
  run->compute = *stream;

  const fb::Artifact &a = *art->root();
  auto comms = createMpiCommunicators(a);
  EXPECT_TRUE(comms.ok()) << comms.status().toString();
  if (!comms.ok())
    return nullptr;
  if (wiring == Wiring::Nccl) {
    // RankRun::setUp: the device communicators replace the MPI groups.
    auto nccl = createNcclCommunicators(run->fake->api(), run->compute, a,
                                        collectiveGroupKinds(a));
    EXPECT_TRUE(nccl.ok()) << nccl.status().toString();
    if (!nccl.ok())
      return nullptr;
    run->ncclWorld = std::move(nccl->world);
    // At one rank NCCL makes none: the executor's self communicators copy
    // through the backend, and no MPI group (host memory only) is left.
    std::map<std::string, std::unique_ptr<Communicator>> device;
    for (auto &[kind, comm] : nccl->groups)
      device[kind] = std::move(comm);
    useDeviceCommunicators(*comms, std::move(device));
    for (auto &[kind, comm] : comms->groups)
      EXPECT_TRUE(comm->streamOrdered()) << kind << " is not NCCL's";
    EXPECT_FALSE(comms->lossReduce && comms->lossReduce->streamOrdered());
  }

  auto cpu = BackendRegistry::global().create("cpu", {});
  EXPECT_TRUE(cpu.ok());
  if (!cpu.ok())
    return nullptr;
  auto backend = std::make_unique<RecordingBackend>(
      std::move(*cpu), traceInto(*run->fake, run->compute, run->launches),
      deviceMemory);
  run->backend = backend.get();
  auto ex =
      Executor::create(art, std::move(backend), std::move(*comms), worldRank());
  if (created)
    *created = ex.status();
  else
    EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  run->ex = std::move(*ex);
  EXPECT_TRUE(run->ex->initializeParameters().ok());
  return run;
}

/// The one-rank twin's executor (no communicators).
std::unique_ptr<Executor>
makeOneRank(const std::shared_ptr<const LoadedArtifact> &art) {
  if (!art)
    return nullptr;
  auto ex = Executor::create(
      art, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), 0);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  return std::move(*ex);
}

void expectSameCounters(const std::map<std::string, CommCounters> &nccl,
                        const std::map<std::string, CommCounters> &mpi) {
  EXPECT_EQ(nccl.size(), mpi.size());
  for (const auto &[kind, m] : mpi) {
    SCOPED_TRACE("group kind " + kind);
    auto it = nccl.find(kind);
    EXPECT_TRUE(it != nccl.end());
    if (it == nccl.end())
      continue;
    const CommCounters &n = it->second;
    EXPECT_EQ(n.allReduce, m.allReduce);
    EXPECT_EQ(n.allGather, m.allGather);
    EXPECT_EQ(n.reduceScatter, m.reduceScatter);
    EXPECT_EQ(n.p2p, m.p2p);
    EXPECT_EQ(n.calls, m.calls);
  }
}

/// `buffer` of both executors, equal within `rtol` relative (0: bitwise).
void expectSameBuffer(Executor &nccl, Executor &mpi, const std::string &buffer,
                      double rtol) {
  auto a = nccl.readFloatBuffer(buffer), b = mpi.readFloatBuffer(buffer);
  EXPECT_TRUE(a.ok() && b.ok()) << buffer;
  if (!a.ok() || !b.ok())
    return;
  EXPECT_EQ(a->size(), b->size()) << buffer;
  int wrong = 0;
  for (size_t k = 0; k < std::min(a->size(), b->size()) && wrong < 5; ++k)
    if (std::fabs((*a)[k] - (*b)[k]) > rtol * std::fabs((*b)[k]) ||
        (rtol == 0 && (*a)[k] != (*b)[k])) {
      ++wrong;
      ADD_FAILURE() << buffer << "[" << k << "]: " << (*a)[k] << " over NCCL, "
                    << (*b)[k] << " over MPI";
    }
}

//===----------------------------------------------------------------------===//
// The merged log
//===----------------------------------------------------------------------===//

constexpr size_t kNone = std::numeric_limits<size_t>::max();

/// A call of the fake table, or a launch of the backend (name "launch:
/// <kernel>", on the compute stream).
struct Entry {
  FakeNcclCall call;
  bool launch = false;
};

bool isNcclOperation(const Entry &e) {
  const std::string &n = e.call.name;
  return !e.launch && (n == "allReduce" || n == "allGather" ||
                       n == "reduceScatter" || n == "send" || n == "recv");
}

bool isHostWait(const Entry &e, int compute) {
  return !e.launch && e.call.name == "streamSynchronize" &&
         e.call.stream == compute;
}

/// The fake's log since Run::startLog with the backend's launches in place.
std::vector<Entry> mergedLog(const Run &run) {
  const std::vector<FakeNcclCall> &log = run.fake->log();
  const auto &launches = run.launches;
  std::vector<Entry> out;
  size_t next = 0;
  for (size_t i = 0; i <= log.size(); ++i) {
    for (; next < launches.size() && launches[next].at == i; ++next) {
      Entry e;
      e.call.name = "launch:" + launches[next].kernel;
      e.call.stream = run.computeId();
      e.launch = true;
      out.push_back(e);
    }
    if (i < log.size())
      out.push_back({log[i], false});
  }
  return out;
}

/// The last eventRecord of `event` before entry `before`, or kNone.
size_t lastRecord(const std::vector<Entry> &log, int event, size_t before) {
  for (size_t j = before; j-- > 0;)
    if (!log[j].launch && log[j].call.name == "eventRecord" &&
        log[j].call.event == event)
      return j;
  return kNone;
}

/// An NCCL operation of the merged log and where the compute stream waits
/// for it.
struct Operation {
  size_t at;
  FakeNcclCall call;
  /// The first streamWaitEvent(compute, e) after `at` whose event e was last
  /// recorded on the operation's stream after it; kNone if none.
  size_t joined = kNone;
  /// Launches between the operation and `joined`: kernels that overlap it.
  int overlapping = 0;
};

/// What the merged log of one iteration (or function) shows.
struct LogSummary {
  std::vector<Entry> log;
  std::vector<Operation> ops;
  /// streamSynchronize of the compute stream, and those followed by a
  /// launch or an NCCL operation (a host wait amid the device work).
  int hostWaits = 0, hostWaitsAmidWork = 0;
};

/// Summarises the log since run.startLog() and checks the stream order of
/// every NCCL operation in it (see the file comment).
LogSummary summarize(const Run &run) {
  LogSummary s;
  s.log = mergedLog(run);
  const std::vector<Entry> &log = s.log;
  const int compute = run.computeId();
  size_t lastWork = kNone;
  for (size_t i = 0; i < log.size(); ++i)
    if (log[i].launch || isNcclOperation(log[i]))
      lastWork = i;
  for (size_t i = 0; i < log.size(); ++i) {
    const FakeNcclCall &c = log[i].call;
    if (!log[i].launch && c.name == "streamSynchronize") {
      // Only the host waits of the backend; a communicator never waits for
      // its stream outside barrier() and destruction.
      EXPECT_EQ(c.stream, compute) << "streamSynchronize at entry " << i;
      ++s.hostWaits;
      if (lastWork != kNone && i < lastWork)
        ++s.hostWaitsAmidWork;
    }
    if (!isNcclOperation(log[i]))
      continue;
    SCOPED_TRACE(c.name + " at entry " + std::to_string(i) + " of the log");
    Operation op{i, c};
    // Ordered after the compute stream: the last wait of the operation's
    // stream before it is on an event recorded on the compute stream, with
    // no launch since that record.
    EXPECT_NE(c.stream, compute);
    size_t wait = kNone;
    for (size_t j = i; j-- > 0;)
      if (!log[j].launch && log[j].call.name == "streamWaitEvent" &&
          log[j].call.stream == c.stream) {
        wait = j;
        break;
      }
    EXPECT_NE(wait, kNone) << "the communication stream never waited";
    if (wait != kNone) {
      size_t rec = lastRecord(log, log[wait].call.event, wait);
      EXPECT_NE(rec, kNone);
      if (rec != kNone) {
        EXPECT_EQ(log[rec].call.stream, compute)
            << "the communication stream waited on an event not recorded on "
               "the compute stream";
        for (size_t j = rec + 1; j < i; ++j)
          EXPECT_FALSE(log[j].launch)
              << log[j].call.name << " launched after the compute stream's "
              << "event was recorded, and not ordered before the operation";
      }
    }
    // Joined: the compute stream waits on an event recorded on the
    // operation's stream after it.
    for (size_t j = i + 1; j < log.size() && op.joined == kNone; ++j) {
      if (log[j].launch) {
        ++op.overlapping;
        continue;
      }
      if (log[j].call.name != "streamWaitEvent" ||
          log[j].call.stream != compute)
        continue;
      size_t rec = lastRecord(log, log[j].call.event, j);
      if (rec != kNone && rec > i && log[rec].call.stream == c.stream)
        op.joined = j;
    }
    EXPECT_NE(op.joined, kNone) << "the compute stream never waited for it";
    s.ops.push_back(op);
  }
  return s;
}

/// Every operation of `s` joined before the next launch (a blocking
/// instruction, or a started one whose Wait follows with no kernel between).
void expectJoinedBeforeNextKernel(const LogSummary &s) {
  for (const Operation &op : s.ops)
    EXPECT_EQ(op.overlapping, 0)
        << op.call.name << " at entry " << op.at << ": " << op.overlapping
        << " kernels launched before the compute stream waited for it";
}

/// The host-sync-free path: host waits only once the iteration's device
/// work is done (at least one, reading the losses).
void expectNoHostWaitAmidWork(const LogSummary &s, bool iteration) {
  EXPECT_EQ(s.hostWaitsAmidWork, 0)
      << "the host waited for the compute stream before the iteration's "
         "last kernel or NCCL operation";
  if (iteration)
    EXPECT_GE(s.hostWaits, 1);
}

//===----------------------------------------------------------------------===//
// Data-parallel training
//===----------------------------------------------------------------------===//

/// Trains `dpDesc` (dp = world size) over NCCL and over MPI and `oneDesc`
/// (dp = 1, the same global batch) on one rank for `steps` iterations: the
/// NCCL run's losses equal the MPI run's within `rtolMpi` and the one-rank
/// twin's within `rtolOne` relative, its counters and parameters the MPI
/// run's. Calls `check` with each iteration's summary of the NCCL run's log.
/// Returns the NCCL run's counters (empty on failure).
std::map<std::string, CommCounters>
trainThreeWays(const ArtifactDesc &dpDesc, const ArtifactDesc &oneDesc,
               int steps, double rtolMpi, double rtolOne,
               const std::vector<std::string> &params,
               const std::function<void(const LogSummary &)> &check) {
  auto dpArt = load(dpDesc, "dp.tsr");
  auto nccl = makeRun(dpArt, Wiring::Nccl);
  auto mpi = makeRun(dpArt, Wiring::Mpi);
  auto one = makeOneRank(load(oneDesc, "one.tsr"));
  if (!nccl || !mpi || !one)
    return {};
  for (int it = 1; it <= steps; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    nccl->startLog();
    mpi->startLog();
    auto a = nccl->ex->runIteration(it);
    LogSummary s = summarize(*nccl);
    auto b = mpi->ex->runIteration(it);
    auto c = one->runIteration(it);
    EXPECT_TRUE(a.ok()) << a.status().toString();
    EXPECT_TRUE(b.ok() && c.ok());
    if (!a.ok() || !b.ok() || !c.ok())
      return {};
    EXPECT_NEAR(*a, *b, rtolMpi * std::fabs(*b));
    EXPECT_NEAR(*a, *c, rtolOne * std::fabs(*c));
    check(s);
    expectNoHostWaitAmidWork(s, /*iteration=*/true);
    // The reference: the executor waits for the device before every MPI
    // collective, which the same check sees.
    EXPECT_GT(summarize(*mpi).hostWaitsAmidWork, 0);
  }
  for (const std::string &p : params)
    expectSameBuffer(*nccl->ex, *mpi->ex, p, rtolMpi);
  expectSameCounters(nccl->ex->commCounters(), mpi->ex->commCounters());
  return nccl->ex->commCounters();
}

/// The dp gradient averaging of one iteration (appendDpAverage): the
/// weight's all-reduce (`weight` elements) started, the bias's (`bias`
/// elements) blocking, in `type`; the compute stream waits for the weight's
/// only at the Wait, after the bias's was issued.
void expectDpAveraging(const LogSummary &s, int64_t weight, int64_t bias,
                       ElementType type) {
  EXPECT_EQ(s.ops.size(), 2u);
  if (s.ops.size() != 2)
    return;
  const Operation &w = s.ops[0], &b = s.ops[1];
  EXPECT_EQ(w.call.name, "allReduce");
  EXPECT_EQ(b.call.name, "allReduce");
  EXPECT_EQ(w.call.count, size_t(weight));
  EXPECT_EQ(b.call.count, size_t(bias));
  EXPECT_EQ(w.call.type, type);
  EXPECT_EQ(b.call.type, type);
  EXPECT_EQ(w.call.op, ReduceKind::Sum);
  EXPECT_EQ(w.call.send, w.call.recv); // in place
  EXPECT_EQ(w.call.stream, b.call.stream);
  EXPECT_GT(w.joined, b.at) << "the started all-reduce was waited for before "
                               "its Wait instruction";
  expectJoinedBeforeNextKernel(s);
}

} // namespace

TEST(NcclExecutorTest, DataParallelTrainingMatchesMpiAndOneRank) {
  // dp = world size vs. dp = 1 on the same global batch, as MpiCommTest.
  const int n = worldSize();
  auto counters =
      trainThreeWays(softmaxRegression(8, 4, 4, 2, n, true, 0.05f),
                     softmaxRegression(8, 4, 4 * n, 2, 1, true, 0.05f), 5, 1e-6,
                     1e-5, {"fc.weight", "fc.bias"}, [](const LogSummary &s) {
                       expectDpAveraging(s, 32, 4, ElementType::F32);
                     });
  // Per step: gW (8x4 f32) and gb (4 f32) all-reduced over dp.
  EXPECT_EQ(counters["dp"].allReduce,
            5 * (ringAllReduceBytes(128, n) + ringAllReduceBytes(16, n)));
}

TEST(NcclExecutorTest, MixedPrecisionTrainingMatchesMpiAndOneRank) {
  // Megatron's --bf16: bf16 params with fp32 main params; gradients f32 or
  // bf16 (all-reduced in bf16). The one-rank tolerances are MpiCommTest's.
  const int n = worldSize();
  for (bool bf16Grads : {false, true}) {
    SCOPED_TRACE(bf16Grads ? "bf16 grads" : "f32 grads");
    const ElementType g = bf16Grads ? ElementType::BF16 : ElementType::F32;
    auto counters = trainThreeWays(
        mixedPrecisionRegression(8, 4, 4, 2, n, bf16Grads),
        mixedPrecisionRegression(8, 4, 4 * n, 2, 1, bf16Grads), 5, 1e-6,
        bf16Grads ? 2e-2 : 5e-3,
        {"fc.weight", "fc.bias", "main:fc.weight", "main:fc.bias"},
        [g](const LogSummary &s) { expectDpAveraging(s, 32, 4, g); });
    const uint64_t es = bf16Grads ? 2 : 4;
    EXPECT_EQ(counters["dp"].allReduce, 5 * (ringAllReduceBytes(32 * es, n) +
                                             ringAllReduceBytes(4 * es, n)));
  }
}

//===----------------------------------------------------------------------===//
// The distributed optimizer's in-place collectives
//===----------------------------------------------------------------------===//

namespace {

/// Rank `rank`'s bucket: small integers (every partial sum exact in f32 and
/// bf16, so that any summation order gives the same bits) as f32 or bf16
/// bytes.
std::vector<uint8_t> bucketOf(int rank, size_t count, bool bf16) {
  std::vector<float> v(count);
  for (size_t k = 0; k < count; ++k)
    v[k] = float(int((k * 7 + size_t(rank) * 3) % 17) - 8);
  std::vector<uint8_t> out(count * (bf16 ? 2 : 4));
  if (bf16) {
    std::vector<uint16_t> h(count);
    floatsToBf16(v.data(), h.data(), int64_t(count));
    std::memcpy(out.data(), h.data(), out.size());
  } else {
    std::memcpy(out.data(), v.data(), out.size());
  }
  return out;
}

/// shardedBuckets(tp, dp) over NCCL and over MPI with the same inputs: every
/// collective function gives the same bytes and counters, and the NCCL
/// run's log shows NCCL's in-place layouts, stream order and, for the
/// started reduce-scatter, the kernel before its Wait overlapping it.
void checkBuckets(int tp, int dp, bool bf16) {
  const int64_t block = 333;
  const size_t es = bf16 ? 2 : 4;
  const int r = worldRank(), dpIndex = r / tp;
  auto art = load(
      shardedBuckets(tp, dp, block, bf16 ? fb::DType::BF16 : fb::DType::F32),
      "buckets.tsr");
  auto nccl = makeRun(art, Wiring::Nccl);
  auto mpi = makeRun(art, Wiring::Mpi);
  if (!nccl || !mpi)
    return;

  const std::vector<uint8_t> bucket = bucketOf(r, size_t(block * dp), bf16);
  const size_t blockBytes = size_t(block) * es;
  std::vector<uint8_t> mine(bucket.begin() + long(dpIndex * blockBytes),
                            bucket.begin() + long((dpIndex + 1) * blockBytes));
  // Elsewhere in "param" garbage (0xee) that the gather must overwrite.
  std::vector<uint8_t> param(bucket.size(), 0xee);
  std::copy(mine.begin(), mine.end(),
            param.begin() + long(dpIndex * blockBytes));
  for (Run *run : {nccl.get(), mpi.get()}) {
    for (const char *name : {"grad", "grad.ref", "grad.async"})
      EXPECT_TRUE(
          run->ex->writeBuffer(name, bucket.data(), int64_t(bucket.size()))
              .ok());
    EXPECT_TRUE(
        run->ex->writeBuffer("param.src", mine.data(), int64_t(mine.size()))
            .ok());
    EXPECT_TRUE(
        run->ex->writeBuffer("param", param.data(), int64_t(param.size()))
            .ok());
  }

  for (const char *fn : {"rs.ref", "rs", "rsa", "ag.ref", "ag", "aga"}) {
    SCOPED_TRACE(std::string("function '") + fn + "'");
    nccl->startLog();
    mpi->startLog();
    CommCounters beforeN = nccl->ex->commCounters()["dp"];
    CommCounters beforeM = mpi->ex->commCounters()["dp"];
    Status a = nccl->ex->runFunction(fn);
    LogSummary s = summarize(*nccl);
    Status b = mpi->ex->runFunction(fn);
    EXPECT_TRUE(a.ok()) << a.toString();
    EXPECT_TRUE(b.ok()) << b.toString();
    if (!a.ok() || !b.ok())
      return;
    expectSameCounters({{"dp", nccl->ex->commCounters()["dp"] - beforeN}},
                       {{"dp", mpi->ex->commCounters()["dp"] - beforeM}});
    // No host wait at all over NCCL (runFunction does not synchronise);
    // over MPI the executor waits before the collective.
    EXPECT_EQ(s.hostWaits, 0);
    // One rank: no NCCL at all (a self communicator's copy or nothing).
    if (worldSize() == 1) {
      EXPECT_TRUE(s.ops.empty());
      continue;
    }
    EXPECT_GT(summarize(*mpi).hostWaits, 0);
    EXPECT_EQ(s.ops.size(), 1u);
    if (s.ops.size() != 1)
      continue;
    const FakeNcclCall &c = s.ops[0].call;
    const std::string f = fn;
    EXPECT_EQ(c.name, f.rfind("rs", 0) == 0 ? "reduceScatter" : "allGather");
    EXPECT_EQ(c.count, size_t(block));
    EXPECT_EQ(c.type, bf16 ? ElementType::BF16 : ElementType::F32);
    // The executor's rank-relative shard is NCCL's in-place layout: no copy.
    const char *send = static_cast<const char *>(c.send);
    const char *recv = static_cast<const char *>(c.recv);
    if (f == "rs" || f == "rsa")
      EXPECT_EQ(recv, send + dpIndex * blockBytes);
    if (f == "ag")
      EXPECT_EQ(send, recv + dpIndex * blockBytes);
    if (f == "rsa" || f == "aga") {
      // Started: the Fill between the start and the Wait runs before the
      // compute stream waits for the collective (overlap).
      EXPECT_EQ(s.ops[0].overlapping, 1);
      if (s.ops[0].joined != kNone)
        EXPECT_EQ(s.log[s.ops[0].joined - 1].call.name, "launch:fill");
    } else {
      expectJoinedBeforeNextKernel(s);
    }
  }

  // The results, bit for bit (integers: exact in any order). The in-place
  // reduce-scatters leave only this rank's block defined.
  auto bytes = [](Run &run, const char *name) {
    auto v = run.ex->readBuffer(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : std::vector<uint8_t>();
  };
  auto block0 = [&](const std::vector<uint8_t> &v) {
    if (v.size() != bucket.size())
      return std::vector<uint8_t>();
    return std::vector<uint8_t>(v.begin() + long(dpIndex * blockBytes),
                                v.begin() + long((dpIndex + 1) * blockBytes));
  };
  for (const char *name :
       {"shard.ref", "param", "param.ref", "param.async", "other"})
    EXPECT_TRUE(bytes(*nccl, name) == bytes(*mpi, name)) << name;
  // The started gather equals the synchronous one.
  EXPECT_TRUE(bytes(*nccl, "param.async") == bytes(*nccl, "param.ref"));
  for (const char *name : {"grad", "grad.async"}) {
    std::vector<uint8_t> got = block0(bytes(*nccl, name));
    EXPECT_FALSE(got.empty());
    EXPECT_TRUE(got == block0(bytes(*mpi, name))) << name;
    EXPECT_TRUE(got == bytes(*mpi, "shard.ref")) << name;
  }
  // The gather's every block is its member's input block.
  std::vector<uint8_t> gathered = bytes(*nccl, "param");
  for (int d = 0; d < dp && gathered.size() == bucket.size(); ++d) {
    std::vector<uint8_t> theirs =
        bucketOf(d * tp + r % tp, size_t(block * dp), bf16);
    EXPECT_TRUE(std::equal(gathered.begin() + long(d * blockBytes),
                           gathered.begin() + long((d + 1) * blockBytes),
                           theirs.begin() + long(d * blockBytes)))
        << "block " << d;
  }
}

} // namespace

TEST(NcclExecutorTest, InPlaceBucketCollectivesMatchMpi) {
  const int n = worldSize();
  std::vector<std::pair<int, int>> layouts = {{1, n}};
  if (n == 4)
    layouts.push_back({2, 2}); // dp index != world rank
  for (auto [tp, dp] : layouts)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp) +
                   (bf16 ? " bf16" : " f32"));
      checkBuckets(tp, dp, bf16);
    }
}

//===----------------------------------------------------------------------===//
// Expert parallelism's exchange
//===----------------------------------------------------------------------===//

/// ExpertDispatch and ExpertCombine over NCCL with a device-memory backend
/// (the CUDA backend's path: the counts' all-to-all staged through device
/// memory, since NCCL cannot read host vectors) against the MPI run: the
/// received rows, counts and splits, and the rows back, bit for bit; every
/// row comes back where it came from.
/// With `bf16` the rows are bf16 (bf16 activations): the same exchange of
/// 2-byte elements, the rows past the received ones zero in bf16.
namespace {
void checkExpertExchange(bool bf16) {
  const int n = worldSize(), r = worldRank();
  const int64_t experts = 2 * n, rows = 12, features = 5;
  const int64_t es = bf16 ? 2 : 4;
  auto art = load(expertExchange(n, experts, rows, features,
                                 bf16 ? fb::DType::BF16 : fb::DType::F32),
                  bf16 ? "ep16.tsr" : "ep.tsr");
  auto nccl = makeRun(art, Wiring::Nccl, /*deviceMemory=*/true);
  auto mpi = makeRun(art, Wiring::Mpi);
  if (!nccl || !mpi)
    return;
  // Rank r routes (e + r) % 4 rows to expert e (some none), fewer than its
  // rows in all.
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  int64_t routed = 0;
  for (int64_t e = 0; e < experts; ++e) {
    counts[size_t(e)] = int32_t((e + r) % 4);
    if (routed + counts[size_t(e)] > rows)
      counts[size_t(e)] = 0;
    routed += counts[size_t(e)];
  }
  // Distinct rows: f32 values, or bf16 bit patterns (small integers,
  // exact in bf16).
  std::vector<uint8_t> x(size_t(rows * features * es));
  for (int64_t i = 0; i < rows * features; ++i) {
    const float v = float(r * 100 + int(i));
    if (bf16) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t half = uint16_t(bits >> 16);
      std::memcpy(&x[size_t(i * es)], &half, 2);
    } else {
      std::memcpy(&x[size_t(i * es)], &v, 4);
    }
  }
  for (::Run *run : {nccl.get(), mpi.get()}) {
    EXPECT_TRUE(run->ex->writeBuffer("x", x.data(), int64_t(x.size())).ok());
    EXPECT_TRUE(run->ex->writeBuffer("counts", counts.data(),
                                     int64_t(counts.size() * 4))
                    .ok());
  }
  for (const char *fn : {"dispatch", "combine"}) {
    SCOPED_TRACE(fn);
    nccl->startLog();
    Status a = nccl->ex->runFunction(fn);
    Status b = mpi->ex->runFunction(fn);
    ASSERT_TRUE(a.ok()) << a.toString();
    ASSERT_TRUE(b.ok()) << b.toString();
    // NCCL reads and writes device memory only: the counts' exchange too.
    int p2p = 0;
    for (const FakeNcclCall &c : nccl->fake->log()) {
      if (c.name != "send" && c.name != "recv")
        continue;
      ++p2p;
      const void *buffer = c.name == "send" ? c.send : c.recv;
      // (The counts' exchange is I32; the rows are in the rows' dtype.)
      ASSERT_TRUE(c.type.has_value());
      if (c.type != ElementType::I32)
        EXPECT_EQ(*c.type, bf16 ? ElementType::BF16 : ElementType::F32);
      EXPECT_TRUE(
          nccl->backend->owns(buffer, int64_t(c.count) * elementSize(*c.type)))
          << c.name << " of " << c.count << " elements to/from peer "
          << c.peer << " is not in the backend's memory";
    }
    EXPECT_GT(p2p, 0);
  }
  auto bytes = [](::Run &run, const char *name) {
    auto v = run.ex->readBuffer(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : std::vector<uint8_t>();
  };
  for (const char *name : {"recv", "local", "splits", "out"})
    EXPECT_TRUE(bytes(*nccl, name) == bytes(*mpi, name)) << name;
  std::vector<uint8_t> back = bytes(*nccl, "out");
  ASSERT_EQ(back.size(), x.size());
  EXPECT_EQ(std::memcmp(back.data(), x.data(), size_t(routed * features * es)),
            0);
  // What every rank received for its experts: the splits sum to the rows
  // all ranks routed to them.
  std::vector<uint8_t> split = bytes(*nccl, "splits");
  ASSERT_EQ(split.size(), size_t(n * 2 * 4));
  const int32_t *s = reinterpret_cast<const int32_t *>(split.data());
  for (int src = 0; src < n; ++src)
    for (int e = 0; e < 2; ++e)
      EXPECT_EQ(s[src * 2 + e], (2 * r + e + src) % 4)
          << "source " << src << " expert " << e;
}
} // namespace

TEST(NcclExecutorTest, ExpertExchangeMatchesMpi) { checkExpertExchange(false); }

TEST(NcclExecutorTest, ExpertExchangeMatchesMpiBf16) {
  checkExpertExchange(true);
}

//===----------------------------------------------------------------------===//
// --tp-comm-overlap's GEMMs with their ring exchanges
//===----------------------------------------------------------------------===//

/// AllGatherGemm and GemmReduceScatter over NCCL: every exchange of the
/// ring is issued as its own group before the GEMM it runs under (so on a
/// GPU it travels on the communicator's stream while the GEMM computes),
/// and the results equal the MPI run's and the unfused instructions' (the
/// gather's GEMM by blocks of rows: equal here, where the fake's GEMM is
/// the CPU's; the reduce-scatter's sums in ring order: equal at tp 2).
namespace {
void checkTpCommOverlap(bool bf16) {
  const int n = worldSize(), r = worldRank();
  const int64_t rows = 6, k = 5, cols = 7;
  auto art = load(tpCommOverlap(n, rows, k, cols,
                                bf16 ? fb::DType::BF16 : fb::DType::F32),
                  bf16 ? "tpov16.tsr" : "tpov.tsr");
  auto nccl = makeRun(art, Wiring::Nccl, /*deviceMemory=*/true);
  auto mpi = makeRun(art, Wiring::Mpi);
  if (!nccl || !mpi)
    return;
  auto fill = [&](int64_t count, int salt) {
    std::vector<float> v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = float((int(i) * 7 + salt * 13 + r * 29) % 23) / 8.0f - 1.25f;
    return v;
  };
  const std::vector<std::pair<const char *, std::vector<float>>> inputs = {
      {"x", fill(rows * k, 1)},
      {"w", fill(cols * k, 2)},
      {"a", fill(n * rows * k, 3)},
      {"w2", fill(cols * k, 4)}};
  for (::Run *run : {nccl.get(), mpi.get()})
    for (const auto &[name, v] : inputs) {
      if (!bf16) {
        EXPECT_TRUE(
            run->ex->writeBuffer(name, v.data(), int64_t(v.size() * 4)).ok());
        continue;
      }
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        h[i] = floatToBf16(v[i]);
      EXPECT_TRUE(
          run->ex->writeBuffer(name, h.data(), int64_t(h.size() * 2)).ok());
    }
  nccl->startLog();
  for (::Run *run : {nccl.get(), mpi.get()})
    for (const char *fn : {"fused", "plain"}) {
      Status st = run->ex->runFunction(fn);
      ASSERT_TRUE(st.ok()) << fn << ": " << st.toString();
    }
  auto bytes = [](::Run &run, const char *name) {
    auto v = run.ex->readBuffer(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : std::vector<uint8_t>();
  };
  for (const char *name : {"gathered", "c", "y"})
    EXPECT_TRUE(bytes(*nccl, name) == bytes(*mpi, name)) << name;
  for (::Run *run : {nccl.get(), mpi.get()}) {
    EXPECT_TRUE(bytes(*run, "gathered") == bytes(*run, "gathered.ref"));
    EXPECT_TRUE(bytes(*run, "c") == bytes(*run, "c.ref"));
    if (n <= 2) {
      EXPECT_TRUE(bytes(*run, "y") == bytes(*run, "y.ref"));
    } else {
      // Another order of the same n-term sums: within a few roundings.
      auto y = run->ex->readFloatBuffer("y");
      auto ref = run->ex->readFloatBuffer("y.ref");
      ASSERT_TRUE(y.ok() && ref.ok());
      ASSERT_EQ(y->size(), ref->size());
      for (size_t i = 0; i < y->size(); ++i)
        EXPECT_NEAR((*y)[i], (*ref)[i], 1e-5 * (1 + std::fabs((*ref)[i])))
            << "y[" << i << "]";
    }
  }
  // The fused function's log: n - 1 groups of one send and one receive
  // (the neighbours in the ring) per instruction, each ended before the
  // GEMM launch it overlaps.
  LogSummary s = summarize(*nccl);
  int groups = 0, gemmsAfterGroup = 0;
  bool groupOpen = false, groupJustEnded = false;
  for (const Entry &e : s.log) {
    const FakeNcclCall &call = e.call;
    if (call.name == "groupStart") {
      groupOpen = true;
    } else if (call.name == "groupEnd") {
      groupOpen = false;
      groupJustEnded = true;
      ++groups;
    } else if (isNcclOperation(e) && groupOpen &&
               (call.name == "send" || call.name == "recv")) {
      EXPECT_EQ(call.peer, call.name == "send" ? (r + 1) % n : (r + n - 1) % n);
    } else if (e.launch && call.name.rfind("launch:gemm", 0) == 0) {
      if (groupJustEnded)
        ++gemmsAfterGroup;
      groupJustEnded = false;
    }
  }
  if (n > 1) {
    // The fused pair's 2 (n - 1) groups, then the plain collectives'.
    EXPECT_GE(groups, 2 * (n - 1));
    EXPECT_EQ(gemmsAfterGroup, 2 * (n - 1));
  }
  // The counters name the exchanges by the collective they carry out: the
  // fused and the plain pair each move the ring volumes.
  CommCounters c = nccl->ex->commCounters()["tp"];
  EXPECT_EQ(c.p2p, 0u);
  EXPECT_EQ(c.allGather, uint64_t(2 * (n - 1) * rows * k * (bf16 ? 2 : 4)));
  EXPECT_EQ(c.reduceScatter, uint64_t(2 * (n - 1) * rows * cols * 4));
  expectSameCounters(nccl->ex->commCounters(), mpi->ex->commCounters());
}
} // namespace

TEST(NcclExecutorTest, TpCommOverlapMatchesMpiAndUnfused) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    checkTpCommOverlap(bf16);
  }
}

//===----------------------------------------------------------------------===//
// Pipeline Send/Recv
//===----------------------------------------------------------------------===//

// The V-shaped schedules keep sends in flight while later phases receive
// and compute; NCCL would hold the receives behind them on its one
// stream, so an executor over NCCL communicators refuses such an
// artifact, naming the schedule. Over MPI the same artifact (the
// two-stage pipeline's order, run with sends in flight) gives 1F1B's
// losses exactly.
TEST(NcclExecutorTest, SendsInFlightAreRefusedOverNccl) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  const int64_t b = 2, f = 65536, M = 4; // (512 KiB: past MPI's eager limit)
  ArtifactDesc desc = twoStagePipeline(M, b, f);
  auto plain = load(desc, "pp2.tsr");
  for (auto &p : desc.programs)
    p.scheduleKind = "zbv";
  auto v = load(desc, "pp2v.tsr");
  Status created;
  auto nccl = makeRun(v, Wiring::Nccl, false, &created);
  EXPECT_EQ(nccl, nullptr);
  EXPECT_NE(created.message().find(
                "schedule 'zbv' keeps sends in flight while later phases "
                "receive and compute, which this backend's communicator "
                "cannot do yet"),
            std::string::npos)
      << created.toString();
  auto inFlight = makeRun(v, Wiring::Mpi);
  auto reference = makeRun(plain, Wiring::Mpi);
  if (!inFlight || !reference)
    return;
  for (int64_t it = 1; it <= 2; ++it) {
    auto a = inFlight->ex->runIteration(it);
    auto c = reference->ex->runIteration(it);
    ASSERT_TRUE(a.ok()) << a.status().toString();
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(*a, *c);
  }
}

TEST(NcclExecutorTest, PipelineSendRecvMatchesMpiInGroups) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  const int r = worldRank();
  for (int64_t f : {int64_t(4), int64_t(65536)}) {
    // f = 65536: 512 KiB messages, beyond MPI's eager limit.
    SCOPED_TRACE("features " + std::to_string(f));
    const int64_t b = 2, M = 4;
    auto art = load(twoStagePipeline(M, b, f), "pp2.tsr");
    auto nccl = makeRun(art, Wiring::Nccl);
    auto mpi = makeRun(art, Wiring::Mpi);
    if (!nccl || !mpi)
      return;
    EXPECT_EQ(nccl->ex->pipelineStage(), r);
    for (int64_t it = 1; it <= 2; ++it) {
      SCOPED_TRACE("iteration " + std::to_string(it));
      nccl->startLog();
      mpi->startLog();
      auto a = nccl->ex->runIteration(it);
      LogSummary s = summarize(*nccl);
      auto c = mpi->ex->runIteration(it);
      EXPECT_TRUE(a.ok()) << a.status().toString();
      EXPECT_TRUE(c.ok()) << c.status().toString();
      if (!a.ok() || !c.ok())
        return;
      // Every rank reports stage 1's loss, summed over the MPI loss channel.
      EXPECT_EQ(*a, *c);
      if (r == 0)
        expectSameBuffer(*nccl->ex, *mpi->ex, "acc.out", 0.0);

      expectNoHostWaitAmidWork(s, /*iteration=*/true);
      EXPECT_GT(summarize(*mpi).hostWaitsAmidWork, 0);
      // Each batch is completed before the next kernel.
      expectJoinedBeforeNextKernel(s);
      // M sends and M receives of [b, f] f32 with the other stage, each
      // inside a group that holds nothing but point-to-point calls.
      int sends = 0, recvs = 0, groups = 0, inGroup = -1;
      for (const Entry &e : s.log) {
        const FakeNcclCall &call = e.call;
        if (call.name == "groupStart") {
          EXPECT_EQ(inGroup, -1) << "nested group";
          inGroup = 0;
        } else if (call.name == "groupEnd") {
          EXPECT_GT(inGroup, 0) << "empty group or groupEnd without start";
          EXPECT_FALSE(call.failed);
          inGroup = -1;
          ++groups;
        } else if (isNcclOperation(e)) {
          EXPECT_TRUE(call.name == "send" || call.name == "recv") << call.name;
          EXPECT_GE(inGroup, 0) << call.name << " outside a group";
          EXPECT_TRUE(call.inGroup);
          EXPECT_EQ(call.peer, 1 - r);
          EXPECT_EQ(call.count, size_t(b * f));
          EXPECT_EQ(call.type, ElementType::F32);
          ++(call.name == "send" ? sends : recvs);
          if (inGroup >= 0)
            ++inGroup;
        } else if (inGroup >= 0) {
          ADD_FAILURE() << call.name << " inside a p2p group";
        }
      }
      EXPECT_EQ(inGroup, -1) << "group never ended";
      EXPECT_EQ(sends, M);
      EXPECT_EQ(recvs, M);
      // Under 1F1B each stage's batches are {first}, M - 1 of one send and
      // one receive, {last}: a send of one stage and the receive that
      // matches it are issued in the same-numbered batch on both sides.
      EXPECT_EQ(groups, M + 1);
    }
    expectSameCounters(nccl->ex->commCounters(), mpi->ex->commCounters());
    EXPECT_EQ(nccl->ex->commCounters()["pp"].p2p, uint64_t(2 * M * b * f * 4));
  }
}

// ZB-H1 through NCCL: stage 1's send of B's gradient, followed by a W,
// is issued at once as a group of its own (NCCL queues point-to-point
// calls until the batch's wait: Communicator::issue starts them) and
// waited for with the next batch, so it travels while W computes; the
// iteration equals MPI's, every send and receive is issued in a group, and
// none is left behind.
TEST(NcclExecutorTest, ZeroBubblePipelineMatchesMpi) {
  if (worldSize() != 2)
    GTEST_SKIP() << "needs 2 ranks";
  const int r = worldRank();
  for (int64_t f : {int64_t(4), int64_t(65536)}) {
    SCOPED_TRACE("features " + std::to_string(f));
    const int64_t b = 2, M = 4;
    auto art = load(zeroBubblePipeline(M, b, f), "zb.tsr");
    auto nccl = makeRun(art, Wiring::Nccl);
    auto mpi = makeRun(art, Wiring::Mpi);
    if (!nccl || !mpi)
      return;
    for (int64_t it = 1; it <= 2; ++it) {
      SCOPED_TRACE("iteration " + std::to_string(it));
      nccl->startLog();
      auto a = nccl->ex->runIteration(it);
      LogSummary s = summarize(*nccl);
      auto c = mpi->ex->runIteration(it);
      ASSERT_TRUE(a.ok()) << a.status().toString();
      ASSERT_TRUE(c.ok()) << c.status().toString();
      EXPECT_EQ(*a, *c);
      expectSameBuffer(*nccl->ex, *mpi->ex, r == 0 ? "acc.out" : "w.acc", 0.0);
      int sends = 0, recvs = 0, inGroup = -1, soloSends = 0;
      std::vector<std::string> group;
      for (const Entry &e : s.log) {
        if (e.call.name == "groupStart") {
          inGroup = 0;
          group.clear();
        } else if (e.call.name == "groupEnd") {
          inGroup = -1;
          soloSends += group == std::vector<std::string>{"send"};
        } else if (isNcclOperation(e)) {
          EXPECT_GE(inGroup, 0) << e.call.name << " outside a group";
          ++(e.call.name == "send" ? sends : recvs);
          group.push_back(e.call.name);
        }
      }
      EXPECT_EQ(inGroup, -1) << "group never ended";
      EXPECT_EQ(sends, M);
      EXPECT_EQ(recvs, M);
      // Stage 1 (order F0 B0 F1 B1 W0 F2 B2 W1 ...): the sends of B1 ..
      // B(M-1) are each followed by a W.
      if (r == 1)
        EXPECT_EQ(soloSends, M - 1);
    }
    expectSameCounters(nccl->ex->commCounters(), mpi->ex->commCounters());
  }
}
