//===- MpiCommTest.cpp - MPI collectives (run under mpirun) ---------------===//
//
// Every rank runs the whole gtest suite; the exit code is the maximum over
// ranks so that a failure on any rank fails the ctest test. Tests avoid
// ASSERT_* before collectives so that a failing rank never leaves the others
// hanging.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

using namespace tessera::rt;
using namespace tessera::rt::test;

TEST(MpiCommTest, AllReduceSumAndMax) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  EXPECT_EQ(r, worldRank());
  std::vector<float> f = {float(r), float(2 * r + 1), -float(r)};
  EXPECT_TRUE(
      comm->allReduce(f.data(), 3, ElementType::F32, ReduceKind::Sum).ok());
  float s = float(n * (n - 1) / 2);
  EXPECT_EQ(f[0], s);
  EXPECT_EQ(f[1], 2 * s + n);
  EXPECT_EQ(f[2], -s);
  std::vector<int64_t> i = {r, -r};
  EXPECT_TRUE(
      comm->allReduce(i.data(), 2, ElementType::I64, ReduceKind::Max).ok());
  EXPECT_EQ(i[0], n - 1);
  EXPECT_EQ(i[1], 0);
  std::vector<int32_t> j = {r + 10};
  EXPECT_TRUE(
      comm->allReduce(j.data(), 1, ElementType::I32, ReduceKind::Max).ok());
  EXPECT_EQ(j[0], n + 9);
}

TEST(MpiCommTest, AsyncStartWait) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<float> a(1000, float(r + 1)), b(10, 1.0f);
  auto ha =
      comm->allReduceStart(a.data(), 1000, ElementType::F32, ReduceKind::Sum);
  auto hb =
      comm->allReduceStart(b.data(), 10, ElementType::F32, ReduceKind::Sum);
  EXPECT_TRUE(ha.ok() && hb.ok());
  EXPECT_TRUE(comm->wait(*hb).ok());
  EXPECT_TRUE(comm->wait(*ha).ok());
  EXPECT_EQ(a[999], float(n * (n + 1) / 2));
  EXPECT_EQ(b[0], float(n));
  EXPECT_FALSE(comm->wait(*ha).ok()); // already completed
}

TEST(MpiCommTest, AllGatherAndReduceScatter) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<float> send = {float(r), float(10 * r)};
  std::vector<float> recv(size_t(2 * n));
  EXPECT_TRUE(
      comm->allGather(send.data(), recv.data(), 2, ElementType::F32).ok());
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(recv[size_t(2 * k)], float(k));
    EXPECT_EQ(recv[size_t(2 * k + 1)], float(10 * k));
  }
  std::vector<float> full(size_t(3 * n));
  for (size_t k = 0; k < full.size(); ++k)
    full[k] = float(k + r);
  std::vector<float> part(3);
  EXPECT_TRUE(comm->reduceScatter(full.data(), part.data(), 3, ElementType::F32,
                                  ReduceKind::Sum)
                  .ok());
  float rankSum = float(n * (n - 1) / 2);
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(part[size_t(k)], float(n * (3 * r + k)) + rankSum);
}

// The equal-split all-to-all: block q of rank r's input arrives as block r
// of rank q's output, in f32 and bf16, counting (n - 1) / n of the input.
TEST(MpiCommTest, AllToAllExchangesBlocks) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  const int64_t block = 3;
  std::vector<float> send(size_t(block * n)), recv(send.size(), -1.0f);
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < block; ++k)
      send[size_t(q * block + k)] = float(100 * r + 10 * q + k);
  comm->resetCounters();
  EXPECT_TRUE(
      comm->allToAll(send.data(), recv.data(), block, ElementType::F32).ok());
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < block; ++k)
      EXPECT_EQ(recv[size_t(q * block + k)], float(100 * q + 10 * r + k))
          << "block " << q;
  EXPECT_EQ(comm->counters().allToAll, uint64_t(n - 1) * block * 4);
  std::vector<uint16_t> hs(send.size()), hr(send.size());
  for (size_t i = 0; i < send.size(); ++i)
    hs[i] = floatToBf16(send[i]);
  EXPECT_TRUE(
      comm->allToAll(hs.data(), hr.data(), block, ElementType::BF16).ok());
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(hr[size_t(q * block)], floatToBf16(float(100 * q + 10 * r)));
  EXPECT_EQ(comm->counters().allToAll, uint64_t(n - 1) * block * 6);
}

/// Rank r sends r + q + 1 elements to rank q (values 1000 r + 100 q + k),
/// packed in rank order; the counts and offsets of both sides.
struct UnevenExchange {
  std::vector<int64_t> sendCounts, sendOffsets, recvCounts, recvOffsets;
  std::vector<float> send;
  int64_t recvTotal = 0;
  UnevenExchange(int n, int r) {
    int64_t at = 0;
    for (int q = 0; q < n; ++q) {
      sendCounts.push_back(r + q + 1);
      sendOffsets.push_back(at);
      for (int64_t k = 0; k < r + q + 1; ++k)
        send.push_back(float(1000 * r + 100 * q + k));
      at += r + q + 1;
      recvCounts.push_back(q + r + 1);
      recvOffsets.push_back(recvTotal);
      recvTotal += q + r + 1;
    }
  }
};

// The all-to-all with per-rank counts (expert parallelism's dropless
// exchange): each rank's variable-length block lands at its offset.
TEST(MpiCommTest, AllToAllVExchangesUnevenBlocks) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  UnevenExchange x(n, r);
  std::vector<float> recv(size_t(x.recvTotal), -1.0f);
  comm->resetCounters();
  EXPECT_TRUE(comm->allToAllV(x.send.data(), x.sendCounts.data(),
                              x.sendOffsets.data(), recv.data(),
                              x.recvCounts.data(), x.recvOffsets.data(),
                              ElementType::F32)
                  .ok());
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < q + r + 1; ++k)
      EXPECT_EQ(recv[size_t(x.recvOffsets[size_t(q)] + k)],
                float(1000 * q + 100 * r + k))
          << "from rank " << q;
  uint64_t sent = 0;
  for (int q = 0; q < n; ++q)
    if (q != r)
      sent += uint64_t(x.sendCounts[size_t(q)]) * 4;
  EXPECT_EQ(comm->counters().allToAll, sent);
}

// The distributed optimizer's overlapped reduce-scatter: started, driven by
// progress() while "computing", completed by wait(); the same block as the
// blocking reduce-scatter.
TEST(MpiCommTest, ReduceScatterStartProgressWait) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<float> full(size_t(1000 * n));
  for (size_t k = 0; k < full.size(); ++k)
    full[k] = float(k % 97 + r);
  std::vector<float> part(1000), expect(1000);
  EXPECT_TRUE(comm->reduceScatter(full.data(), expect.data(), 1000,
                                  ElementType::F32, ReduceKind::Sum)
                  .ok());
  auto h = comm->reduceScatterStart(full.data(), part.data(), 1000,
                                    ElementType::F32, ReduceKind::Sum);
  ASSERT_TRUE(h.ok());
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(comm->progress(*h).ok());
  EXPECT_TRUE(comm->wait(*h).ok());
  EXPECT_EQ(part, expect);
}

// overlap_param_gather's started all-gathers, in place (the distributed
// optimizer's parameter bucket: this rank's block already in place) and not;
// bf16 as the parameters of --bf16 are. Each equals the synchronous gather
// and counts the same bytes.
TEST(MpiCommTest, AllGatherStartMatchesAllGather) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<uint16_t> mine(300), expect(size_t(300 * n));
  for (size_t k = 0; k < mine.size(); ++k)
    mine[k] = uint16_t(0x3f80 + (k % 61) + 7 * r);
  const uint64_t before = comm->counters().allGather;
  ASSERT_TRUE(
      comm->allGather(mine.data(), expect.data(), 300, ElementType::BF16).ok());
  const uint64_t bytes = comm->counters().allGather - before;

  std::vector<uint16_t> out(size_t(300 * n));
  auto h = comm->allGatherStart(mine.data(), out.data(), 300, ElementType::BF16);
  ASSERT_TRUE(h.ok());
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(comm->progress(*h).ok());
  EXPECT_TRUE(comm->wait(*h).ok());
  EXPECT_EQ(out, expect);

  std::vector<uint16_t> inPlace(size_t(300 * n), 0xffff);
  std::copy(mine.begin(), mine.end(), inPlace.begin() + 300 * r);
  auto g = comm->allGatherInPlaceStart(inPlace.data(), 300, ElementType::BF16);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(comm->progress(*g).ok());
  EXPECT_TRUE(comm->wait(*g).ok());
  EXPECT_EQ(inPlace, expect);
  EXPECT_EQ(comm->counters().allGather - before, 3 * bytes);
}

TEST(MpiCommTest, ByteCountersUseRingVolumes) {
  auto comm = worldComm();
  int n = comm->size();
  std::vector<float> buf(size_t(100 * n));
  std::vector<float> out(size_t(100 * n));
  EXPECT_TRUE(
      comm->allReduce(buf.data(), 100 * n, ElementType::F32, ReduceKind::Sum)
          .ok());
  EXPECT_TRUE(
      comm->allGather(buf.data(), out.data(), 100, ElementType::F32).ok());
  EXPECT_TRUE(comm->reduceScatter(buf.data(), out.data(), 100, ElementType::F32,
                                  ReduceKind::Sum)
                  .ok());
  auto req =
      comm->allReduceStart(buf.data(), 100, ElementType::F32, ReduceKind::Sum);
  EXPECT_TRUE(req.ok() && comm->wait(*req).ok());
  uint64_t full = uint64_t(400 * n);
  EXPECT_EQ(comm->counters().allReduce,
            2 * uint64_t(n - 1) * full / uint64_t(n) +
                2 * uint64_t(n - 1) * 400 / uint64_t(n));
  EXPECT_EQ(comm->counters().allGather, uint64_t(n - 1) * full / uint64_t(n));
  EXPECT_EQ(comm->counters().reduceScatter,
            uint64_t(n - 1) * full / uint64_t(n));
  EXPECT_EQ(comm->counters().calls, 4u);
  EXPECT_EQ(ringAllReduceBytes(1000, 1), 0u);
  EXPECT_EQ(ringAllReduceBytes(1000, 4), 1500u);
}

TEST(MpiCommTest, SplitByArtifactGroups) {
  int n = worldSize(), r = worldRank();
  int tp = n >= 4 ? 2 : 1, dp = n / tp;
  ArtifactDesc desc = tpDpMeshArtifact(tp, dp);
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mesh.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return; // same on every rank
  auto set = createMpiCommunicators(*(*loaded)->root());
  EXPECT_TRUE(set.ok()) << set.status().toString();
  if (!set.ok())
    return;
  auto &groups = set->groups;
  EXPECT_EQ(groups.size(), 2u);
  Communicator &tpc = *groups.at("tp");
  Communicator &dpc = *groups.at("dp");
  EXPECT_EQ(tpc.size(), tp);
  EXPECT_EQ(dpc.size(), dp);
  EXPECT_EQ(tpc.rank(), r % tp);
  EXPECT_EQ(dpc.rank(), r / tp);
  ASSERT_TRUE(set->lossReduce);
  EXPECT_EQ(set->lossReduce->size(), dp);
  // Sum of world ranks within each group.
  int32_t v = r;
  EXPECT_TRUE(tpc.allReduce(&v, 1, ElementType::I32, ReduceKind::Sum).ok());
  int base = (r / tp) * tp;
  EXPECT_EQ(v, tp * base + tp * (tp - 1) / 2); // e.g. tp [[0,1],[2,3]]
  int32_t w = r;
  EXPECT_TRUE(dpc.allReduce(&w, 1, ElementType::I32, ReduceKind::Sum).ok());
  EXPECT_EQ(w, dp * (r % tp) + tp * dp * (dp - 1) / 2); // dp [[0,2],[1,3]]
  EXPECT_EQ(tpc.counters().allReduce, ringAllReduceBytes(4, tp));
}

namespace {
/// Trains `dpDesc` on the world (dp = world size) and `oneDesc` (dp = 1,
/// the same global batch) side by side for `steps` iterations; each
/// iteration's losses agree within `rtol` relative. Returns the dp run's
/// communication counters (empty on failure).
std::map<std::string, CommCounters> trainAgainstOneRank(const ArtifactDesc &dpDesc,
                                                        const ArtifactDesc &oneDesc,
                                                        int steps, double rtol) {
  auto dpLoaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(dpDesc)), "dp.tsr");
  auto oneLoaded = LoadedArtifact::loadFromMemory(
      buildFile(buildPayload(oneDesc)), "one.tsr");
  EXPECT_TRUE(dpLoaded.ok() && oneLoaded.ok());
  if (!dpLoaded.ok() || !oneLoaded.ok())
    return {};
  auto set = createMpiCommunicators(*(*dpLoaded)->root());
  EXPECT_TRUE(set.ok());
  if (!set.ok())
    return {};
  auto ex = Executor::create(
      *dpLoaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(*set), worldRank());
  auto ref = Executor::create(
      *oneLoaded, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), 0);
  EXPECT_TRUE(ex.ok() && ref.ok());
  if (!ex.ok() || !ref.ok())
    return {};
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  EXPECT_TRUE((*ref)->initializeParameters().ok());
  for (int it = 1; it <= steps; ++it) {
    auto a = (*ex)->runIteration(it);
    auto b = (*ref)->runIteration(it);
    EXPECT_TRUE(a.ok() && b.ok()) << a.status().toString();
    if (a.ok() && b.ok())
      EXPECT_NEAR(*a, *b, rtol * *b) << "iteration " << it;
  }
  return (*ex)->commCounters();
}
} // namespace

TEST(MpiCommTest, DataParallelTrainingMatchesSingleRank) {
  // dp = world size vs. dp = 1 on the same global batch: identical data and
  // averaged gradients, so the losses agree to rounding.
  int n = worldSize();
  auto counters = trainAgainstOneRank(softmaxRegression(8, 4, 4, 2, n, true, 0.05f),
                                      softmaxRegression(8, 4, 4 * n, 2, 1, true, 0.05f),
                                      5, 1e-5);
  // Per step: gW (8x4 f32) and gb (4 f32) all-reduced over dp.
  EXPECT_EQ(counters["dp"].allReduce,
            5 * (ringAllReduceBytes(128, n) + ringAllReduceBytes(16, n)));
}

//===----------------------------------------------------------------------===//
// bf16 collectives (mixed precision gradients)
//===----------------------------------------------------------------------===//

namespace {

std::vector<uint16_t> toBf16(const std::vector<float> &v) {
  std::vector<uint16_t> h(v.size());
  floatsToBf16(v.data(), h.data(), int64_t(v.size()));
  return h;
}

/// Every rank's `mine` (count bf16 values), gathered as floats, rank-major.
std::vector<float> gatherAsFloats(Communicator &comm,
                                  const std::vector<uint16_t> &mine) {
  std::vector<float> f(mine.size()), all(mine.size() * size_t(comm.size()));
  bf16ToFloats(mine.data(), f.data(), int64_t(f.size()));
  EXPECT_TRUE(
      comm.allGather(f.data(), all.data(), int64_t(f.size()), ElementType::F32)
          .ok());
  return all;
}

/// Rank r's input: small multiples of 1/4 (every partial sum is exact in
/// bf16, so the result is exactly the rounded f32 sum), or normals.
std::vector<uint16_t> bf16Input(int r, size_t n, bool exact) {
  std::vector<float> v(n);
  std::mt19937 gen(uint32_t(100 + r));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i)
    v[i] = exact ? float((r + 1) * int(i % 16)) * 0.25f : dist(gen);
  return toBf16(v);
}

/// Checks `got` (bf16, element i of the reduced range starting at `first`)
/// against the f32 sum over ranks of `inputs` (rank-major, `n` per rank)
/// rounded to bf16: equal when `exact`, else within the pairwise roundings'
/// error, n - 1 half-ulps of the sum of magnitudes.
void expectBf16Sum(const std::vector<uint16_t> &got,
                   const std::vector<float> &inputs, size_t n, size_t first,
                   int ranks, bool exact) {
  for (size_t i = 0; i < got.size(); ++i) {
    float sum = 0.0f, magnitude = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      sum += inputs[size_t(r) * n + first + i];
      magnitude += std::fabs(inputs[size_t(r) * n + first + i]);
    }
    if (exact)
      ASSERT_EQ(got[i], floatToBf16(sum)) << "element " << first + i;
    else
      ASSERT_NEAR(bf16ToFloat(got[i]), bf16ToFloat(floatToBf16(sum)),
                  float(ranks - 1) * std::ldexp(magnitude, -8) + 1e-30f)
          << "element " << first + i;
  }
}

/// Every rank holds the same bits.
void expectSameOnEveryRank(Communicator &comm,
                           const std::vector<uint16_t> &mine) {
  std::vector<uint16_t> all(mine.size() * size_t(comm.size()));
  EXPECT_TRUE(comm.allGather(mine.data(), all.data(), int64_t(mine.size()),
                             ElementType::BF16)
                  .ok());
  for (int r = 0; r < comm.size(); ++r)
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(),
                           all.begin() + long(size_t(r) * mine.size())))
        << "rank " << r << " differs";
}

} // namespace

TEST(MpiCommBf16Test, AllReduceIsTheRoundedSum) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "exact" : "normals");
    const size_t count = 10007;
    std::vector<uint16_t> buf = bf16Input(r, count, exact);
    std::vector<float> inputs = gatherAsFloats(*comm, buf);
    EXPECT_TRUE(comm->allReduce(buf.data(), int64_t(count), ElementType::BF16,
                                ReduceKind::Sum)
                    .ok());
    expectBf16Sum(buf, inputs, count, 0, n, exact || n == 2);
    expectSameOnEveryRank(*comm, buf);
  }
}

TEST(MpiCommBf16Test, AllReduceStartWait) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<uint16_t> a = bf16Input(r, 5000, true),
                        b = bf16Input(r, 7, false);
  std::vector<float> inA = gatherAsFloats(*comm, a),
                     inB = gatherAsFloats(*comm, b);
  auto ha = comm->allReduceStart(a.data(), int64_t(a.size()), ElementType::BF16,
                                 ReduceKind::Sum);
  auto hb = comm->allReduceStart(b.data(), int64_t(b.size()), ElementType::BF16,
                                 ReduceKind::Sum);
  EXPECT_TRUE(ha.ok() && hb.ok());
  if (!ha.ok() || !hb.ok())
    return;
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(comm->progress(*ha).ok());
  EXPECT_TRUE(comm->wait(*hb).ok());
  EXPECT_TRUE(comm->wait(*ha).ok());
  expectBf16Sum(a, inA, a.size(), 0, n, true);
  expectBf16Sum(b, inB, b.size(), 0, n, n == 2);
  expectSameOnEveryRank(*comm, b);
}

TEST(MpiCommBf16Test, ReduceScatterBlockingAndStarted) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  const size_t block = 3001;
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "exact" : "normals");
    std::vector<uint16_t> full = bf16Input(r, block * size_t(n), exact);
    std::vector<float> inputs = gatherAsFloats(*comm, full);
    std::vector<uint16_t> part(block), started(block);
    EXPECT_TRUE(comm->reduceScatter(full.data(), part.data(), int64_t(block),
                                    ElementType::BF16, ReduceKind::Sum)
                    .ok());
    expectBf16Sum(part, inputs, block * size_t(n), block * size_t(r), n,
                  exact || n == 2);
    auto h =
        comm->reduceScatterStart(full.data(), started.data(), int64_t(block),
                                 ElementType::BF16, ReduceKind::Sum);
    EXPECT_TRUE(h.ok());
    if (!h.ok())
      return;
    for (int i = 0; i < 5; ++i)
      EXPECT_TRUE(comm->progress(*h).ok());
    EXPECT_TRUE(comm->wait(*h).ok());
    expectBf16Sum(started, inputs, block * size_t(n), block * size_t(r), n,
                  exact || n == 2);
  }
}

TEST(MpiCommBf16Test, AllGatherAndByteCounters) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<uint16_t> send = {uint16_t(0x3f80 + r), uint16_t(0x7fc0),
                                uint16_t(0x8000 | r)};
  std::vector<uint16_t> recv(size_t(3 * n));
  EXPECT_TRUE(
      comm->allGather(send.data(), recv.data(), 3, ElementType::BF16).ok());
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(recv[size_t(3 * k)], uint16_t(0x3f80 + k));
    EXPECT_EQ(recv[size_t(3 * k + 1)], 0x7fc0); // bits travel unchanged
    EXPECT_EQ(recv[size_t(3 * k + 2)], uint16_t(0x8000 | k));
  }
  // 2 bytes per element in every counter.
  comm->resetCounters();
  std::vector<uint16_t> buf(size_t(100 * n), 0x3f80), out(size_t(100 * n));
  EXPECT_TRUE(
      comm->allReduce(buf.data(), 100 * n, ElementType::BF16, ReduceKind::Sum)
          .ok());
  EXPECT_TRUE(
      comm->allGather(buf.data(), out.data(), 100, ElementType::BF16).ok());
  EXPECT_TRUE(comm->reduceScatter(buf.data(), out.data(), 100,
                                  ElementType::BF16, ReduceKind::Sum)
                  .ok());
  auto req = comm->reduceScatterStart(buf.data(), out.data(), 100,
                                      ElementType::BF16, ReduceKind::Sum);
  EXPECT_TRUE(req.ok() && comm->wait(*req).ok());
  uint64_t full = uint64_t(200 * n);
  EXPECT_EQ(comm->counters().allReduce, ringAllReduceBytes(full, n));
  EXPECT_EQ(comm->counters().allGather, ringAllGatherBytes(full, n));
  EXPECT_EQ(comm->counters().reduceScatter,
            2 * ringReduceScatterBytes(full, n));
  // No bf16 max: an error on every rank alike, before any communication.
  Status st =
      comm->allReduce(buf.data(), 4, ElementType::BF16, ReduceKind::Max);
  EXPECT_EQ(st.getCode(), StatusCode::Unimplemented);
  EXPECT_NE(st.message().find("16-bit float max reductions are not supported"),
            std::string::npos)
      << st.message();
}

// f16 (--fp16): the sum op of its own, each pair added in f32 and rounded
// to f16, so that a sum of small integers is exact; an f16 overflow is
// infinity on every rank.
TEST(MpiCommBf16Test, F16AllReduceSumsInItsFormat) {
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  std::vector<float> mine = {1.0f + float(r), -0.5f, 40000.0f, 3.0f};
  std::vector<uint16_t> h(mine.size());
  floatsToF16(mine.data(), h.data(), int64_t(h.size()));
  EXPECT_TRUE(comm->allReduce(h.data(), int64_t(h.size()), ElementType::F16,
                              ReduceKind::Sum)
                  .ok());
  EXPECT_EQ(f16ToFloat(h[0]), float(n) + float(n * (n - 1) / 2));
  EXPECT_EQ(f16ToFloat(h[1]), -0.5f * float(n));
  EXPECT_TRUE(n == 1 ? f16ToFloat(h[2]) == 40000.0f
                     : std::isinf(f16ToFloat(h[2])));
  EXPECT_EQ(f16ToFloat(h[3]), 3.0f * float(n));
  Status st = comm->allReduce(h.data(), 4, ElementType::F16, ReduceKind::Max);
  EXPECT_EQ(st.getCode(), StatusCode::Unimplemented);
}

TEST(MpiCommBf16Test, MixedPrecisionDataParallelMatchesSingleRank) {
  // bf16 parameters with fp32 main params, f32 or bf16 gradients all-reduced
  // over dp = world vs dp = 1 on the same global batch.
  int n = worldSize();
  for (bool bf16Grads : {false, true}) {
    SCOPED_TRACE(bf16Grads ? "bf16 grads" : "f32 grads");
    auto counters = trainAgainstOneRank(
        mixedPrecisionRegression(8, 4, 4, 2, n, bf16Grads),
        mixedPrecisionRegression(8, 4, 4 * n, 2, 1, bf16Grads), 5,
        bf16Grads ? 2e-2 : 5e-3);
    // Per step: gW (8x4) and gb (4) all-reduced, 2 or 4 bytes each.
    uint64_t es = bf16Grads ? 2 : 4;
    EXPECT_EQ(counters["dp"].allReduce,
              5 * (ringAllReduceBytes(32 * es, n) + ringAllReduceBytes(4 * es, n)));
  }
}

TEST(MpiCommTest, PointToPointRingInOneBatch) {
  // Every rank sends to the next and receives from the previous, both
  // posted before one waitAll: with messages too large for eager sends,
  // waiting for the send alone would deadlock the ring.
  auto comm = worldComm();
  int n = comm->size(), r = comm->rank();
  const int64_t count = 1 << 18; // 1 MiB
  std::vector<float> send(size_t(count), float(r + 1));
  std::vector<float> recv(size_t(count), -1.0f);
  std::vector<int32_t> small = {r, 2 * r}, smallIn(2, -1);
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<CommRequest> batch;
  for (auto req :
       {comm->isend(send.data(), count, ElementType::F32, next, 5),
        comm->isend(small.data(), 2, ElementType::I32, next, 6),
        comm->irecv(smallIn.data(), 2, ElementType::I32, prev, 6),
        comm->irecv(recv.data(), count, ElementType::F32, prev, 5)}) {
    EXPECT_TRUE(req.ok()) << req.status().toString();
    if (req.ok())
      batch.push_back(*req);
  }
  EXPECT_TRUE(comm->waitAll(batch).ok());
  EXPECT_EQ(recv[0], float(prev + 1));
  EXPECT_EQ(recv[size_t(count - 1)], float(prev + 1));
  EXPECT_EQ(smallIn, (std::vector<int32_t>{prev, 2 * prev}));
  EXPECT_EQ(comm->counters().p2p, uint64_t(count * 4 + 8));
  EXPECT_EQ(comm->counters().total(), comm->counters().p2p);
  EXPECT_EQ(comm->counters().calls, 4u);
  // Requests are consumed; bad peers and tags are errors.
  EXPECT_FALSE(comm->waitAll(batch).ok());
  EXPECT_FALSE(comm->isend(send.data(), 1, ElementType::F32, n, 0).ok());
  EXPECT_FALSE(comm->irecv(recv.data(), 1, ElementType::F32, -1, 0).ok());
  EXPECT_FALSE(comm->isend(send.data(), 1, ElementType::F32, next, -3).ok());
}
