//===- NcclCommunicatorTest.cpp - NCCL communicator over a fake (mpirun) --===//
//
// NcclCommunicator against FakeNccl (NcclApi over MPI and host memory), on 2
// and 4 ranks without a GPU:
//  - results and byte counters equal MpiCommunicator's on the same inputs
//    (all-reduce sum and max in f32, bf16, i32, i64, f64; all-gather;
//    reduce-scatter; the in-place and started forms; a batched ring
//    exchange), and bf16 max, which only NCCL has;
//  - the call log: NCCL's in-place pointer arithmetic, counts and dtypes,
//    stream and event order (record on the compute stream, the
//    communication stream waits, the operation on it, record there, the
//    compute stream waits; started forms make the compute stream wait only
//    at wait()), point-to-point queued until waitAll and issued inside one
//    group, barrier, destruction, abort and asynchronous errors;
//  - createNcclCommunicators over an artifact's group table, including a
//    membership mismatch and a failure on one rank that the others learn of;
//  - streamOrdered() for NCCL, MPI and the self communicator.
//
// Every rank runs the whole suite; the exit code is the maximum over ranks.
// Tests avoid ASSERT_* before collectives so that a failing rank never
// leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "FakeNccl.h"
#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/MpiCommunicator.h"
#include "tessera/rt/NcclCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

/// A fake table, a compute stream made through it (as the CUDA backend makes
/// its own) and an NCCL communicator over the world; the log starts empty.
/// `fake` is declared first so that it outlives the communicator.
struct NcclWorld {
  FakeNccl fake;
  void *compute = nullptr;
  std::unique_ptr<NcclCommunicator> comm;

  NcclWorld() {
    auto stream = fake.api().streamCreate();
    EXPECT_TRUE(stream.ok());
    compute = stream.ok() ? *stream : nullptr;
    auto c = createNcclWorldCommunicator(fake.api(), compute);
    EXPECT_TRUE(c.ok()) << c.status().toString();
    if (c.ok())
      comm = std::move(*c);
    fake.clearLog();
  }
  int computeId() const { return fake.streamId(compute); }
  int commStreamId() const { return fake.streamId(comm->commStream()); }
  int commId() const { return fake.commId(comm->ncclComm()); }
};

const char *typeName(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return "f32";
  case ElementType::I32:
    return "i32";
  case ElementType::I64:
    return "i64";
  case ElementType::BF16:
    return "bf16";
  case ElementType::F64:
    return "f64";
  }
  return "?";
}

/// Rank `rank`'s input: `count` elements of `type`, small integers (times
/// 1/4 for bf16, times 2^40 for i64) where every partial sum is exact, else
/// normals (floating types only).
std::vector<uint8_t> inputOf(ElementType type, int rank, size_t count,
                             bool exact, uint32_t salt = 0) {
  std::mt19937 gen(uint32_t(7919 * rank + 31 * int(type)) + salt);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<uint8_t> out(count * size_t(elementSize(type)));
  for (size_t k = 0; k < count; ++k) {
    int small = int((k * 7 + size_t(rank) * 3 + salt) % 17) - 8;
    double v = exact ? double(small) : normal(gen);
    switch (type) {
    case ElementType::F32: {
      float f = float(v);
      std::memcpy(&out[k * 4], &f, 4);
      break;
    }
    case ElementType::F64:
      std::memcpy(&out[k * 8], &v, 8);
      break;
    case ElementType::I32: {
      int32_t i = small * 1000 + rank;
      std::memcpy(&out[k * 4], &i, 4);
      break;
    }
    case ElementType::I64: {
      int64_t i = int64_t(small) * (int64_t(1) << 40) + rank;
      std::memcpy(&out[k * 8], &i, 8);
      break;
    }
    case ElementType::BF16: {
      uint16_t h = floatToBf16(float(exact ? v * 0.25 : v));
      std::memcpy(&out[k * 2], &h, 2);
      break;
    }
    }
  }
  return out;
}

/// "" if equal, else where the first difference is.
std::string difference(const std::vector<uint8_t> &got,
                       const std::vector<uint8_t> &expected) {
  if (got.size() != expected.size())
    return "sizes " + std::to_string(got.size()) + " and " +
           std::to_string(expected.size());
  auto [a, b] = std::mismatch(got.begin(), got.end(), expected.begin());
  if (a == got.end())
    return "";
  return "first difference at byte " + std::to_string(a - got.begin());
}

/// The bytes of block `index` (`bytes` each) of `buffer`.
std::vector<uint8_t> blockOf(const std::vector<uint8_t> &buffer, int index,
                             size_t bytes) {
  auto first = buffer.begin() + long(size_t(index) * bytes);
  return std::vector<uint8_t>(first, first + long(bytes));
}

void expectSameCounters(const CommCounters &nccl, const CommCounters &mpi) {
  EXPECT_EQ(nccl.allReduce, mpi.allReduce);
  EXPECT_EQ(nccl.allGather, mpi.allGather);
  EXPECT_EQ(nccl.reduceScatter, mpi.reduceScatter);
  EXPECT_EQ(nccl.allToAll, mpi.allToAll);
  EXPECT_EQ(nccl.p2p, mpi.p2p);
  EXPECT_EQ(nccl.calls, mpi.calls);
}

/// Entries of `log` named `name`.
std::vector<FakeNcclCall> callsNamed(const std::vector<FakeNcclCall> &log,
                                     const std::string &name) {
  std::vector<FakeNcclCall> out;
  for (const FakeNcclCall &c : log)
    if (c.name == name)
      out.push_back(c);
  return out;
}

std::vector<std::string> names(const std::vector<FakeNcclCall> &log) {
  std::vector<std::string> out;
  for (const FakeNcclCall &c : log)
    out.push_back(c.name);
  return out;
}

/// log[at], log[at + 1] order the communication stream after the compute
/// stream: eventRecord(e, compute), streamWaitEvent(comm stream, e).
void expectAfterCompute(const std::vector<FakeNcclCall> &log, size_t at,
                        const NcclWorld &w) {
  ASSERT_LT(at + 1, log.size());
  EXPECT_EQ(log[at].name, "eventRecord");
  EXPECT_EQ(log[at].stream, w.computeId());
  EXPECT_EQ(log[at + 1].name, "streamWaitEvent");
  EXPECT_EQ(log[at + 1].stream, w.commStreamId());
  EXPECT_EQ(log[at + 1].event, log[at].event);
}

/// log[at], log[at + 1] order the compute stream after the communication
/// stream: eventRecord(e, comm stream), streamWaitEvent(compute, e).
void expectBeforeCompute(const std::vector<FakeNcclCall> &log, size_t at,
                         const NcclWorld &w) {
  ASSERT_LT(at + 1, log.size());
  EXPECT_EQ(log[at].name, "eventRecord");
  EXPECT_EQ(log[at].stream, w.commStreamId());
  EXPECT_EQ(log[at + 1].name, "streamWaitEvent");
  EXPECT_EQ(log[at + 1].stream, w.computeId());
  EXPECT_EQ(log[at + 1].event, log[at].event);
}

/// Whether an entry of `log` makes the compute stream wait.
bool computeWaits(const std::vector<FakeNcclCall> &log, const NcclWorld &w) {
  for (const FakeNcclCall &c : log)
    if (c.name == "streamWaitEvent" && c.stream == w.computeId())
      return true;
  return false;
}

const std::vector<ElementType> kAllTypes = {ElementType::F32, ElementType::BF16,
                                            ElementType::I32, ElementType::I64,
                                            ElementType::F64};

} // namespace

//===----------------------------------------------------------------------===//
// (e) streamOrdered
//===----------------------------------------------------------------------===//

TEST(NcclCommTest, StreamOrderedOnlyForNccl) {
  NcclWorld w;
  if (!w.comm)
    return;
  EXPECT_TRUE(w.comm->streamOrdered());
  EXPECT_FALSE(worldComm()->streamOrdered());
  EXPECT_FALSE(createSelfCommunicator()->streamOrdered());
  EXPECT_EQ(w.comm->rank(), worldRank());
  EXPECT_EQ(w.comm->size(), worldSize());
}

//===----------------------------------------------------------------------===//
// (a), (c) Results and counters equal MpiCommunicator's
//===----------------------------------------------------------------------===//

TEST(NcclCommTest, AllReduceMatchesMpi) {
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const size_t count = 1001;
  for (ElementType type : kAllTypes)
    for (ReduceKind op : {ReduceKind::Sum, ReduceKind::Max})
      for (bool exact : {true, false}) {
        bool integer = type == ElementType::I32 || type == ElementType::I64;
        if (integer && !exact)
          continue;
        SCOPED_TRACE(std::string(typeName(type)) +
                     (op == ReduceKind::Sum ? " sum" : " max") +
                     (exact ? " exact" : " normals"));
        const std::vector<uint8_t> input = inputOf(type, r, count, exact);
        std::vector<uint8_t> viaNccl = input, viaMpi = input;
        w.comm->resetCounters();
        mpi->resetCounters();
        EXPECT_TRUE(
            w.comm->allReduce(viaNccl.data(), int64_t(count), type, op).ok());
        if (type == ElementType::BF16 && op == ReduceKind::Max) {
          // MPI has no bf16 max: the exact max over the gathered inputs.
          std::vector<uint8_t> all(input.size() * size_t(n));
          EXPECT_TRUE(
              mpi->allGather(input.data(), all.data(), int64_t(count), type)
                  .ok());
          viaMpi.assign(input.size(), 0);
          for (size_t k = 0; k < count; ++k) {
            uint16_t best = 0;
            for (int q = 0; q < n; ++q) {
              uint16_t h;
              std::memcpy(&h, &all[(size_t(q) * count + k) * 2], 2);
              if (q == 0 || bf16ToFloat(h) > bf16ToFloat(best))
                best = h;
            }
            std::memcpy(&viaMpi[k * 2], &best, 2);
          }
          EXPECT_EQ(w.comm->counters().allReduce,
                    ringAllReduceBytes(count * 2, n));
          EXPECT_EQ(w.comm->counters().calls, 1u);
        } else {
          EXPECT_TRUE(
              mpi->allReduce(viaMpi.data(), int64_t(count), type, op).ok());
          expectSameCounters(w.comm->counters(), mpi->counters());
        }
        EXPECT_EQ(difference(viaNccl, viaMpi), "");
      }
}

// NCCL has no all-to-all: one group of a send and a receive per rank gives
// MPI_Alltoall's result and byte count.
TEST(NcclCommTest, AllToAllMatchesMpi) {
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const size_t block = 333;
  for (ElementType type : kAllTypes) {
    SCOPED_TRACE(typeName(type));
    const std::vector<uint8_t> input =
        inputOf(type, r, block * size_t(n), true, 3);
    std::vector<uint8_t> viaNccl(input.size()), viaMpi(input.size());
    w.comm->resetCounters();
    mpi->resetCounters();
    EXPECT_TRUE(
        w.comm->allToAll(input.data(), viaNccl.data(), int64_t(block), type)
            .ok());
    EXPECT_TRUE(
        mpi->allToAll(input.data(), viaMpi.data(), int64_t(block), type).ok());
    EXPECT_EQ(difference(viaNccl, viaMpi), "");
    expectSameCounters(w.comm->counters(), mpi->counters());
  }
}

// Per-rank counts: rank r sends r + q + 1 elements to rank q.
TEST(NcclCommTest, AllToAllVMatchesMpi) {
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  std::vector<int64_t> sc, so, rc, ro;
  int64_t sendTotal = 0, recvTotal = 0;
  for (int q = 0; q < n; ++q) {
    sc.push_back(r + q + 1);
    so.push_back(sendTotal);
    sendTotal += r + q + 1;
    rc.push_back(q + r + 1);
    ro.push_back(recvTotal);
    recvTotal += q + r + 1;
  }
  for (ElementType type : kAllTypes) {
    SCOPED_TRACE(typeName(type));
    const std::vector<uint8_t> input = inputOf(type, r, size_t(sendTotal), true, 4);
    const size_t es = size_t(elementSize(type));
    std::vector<uint8_t> viaNccl(size_t(recvTotal) * es),
        viaMpi(size_t(recvTotal) * es);
    w.comm->resetCounters();
    mpi->resetCounters();
    EXPECT_TRUE(w.comm
                    ->allToAllV(input.data(), sc.data(), so.data(),
                                viaNccl.data(), rc.data(), ro.data(), type)
                    .ok());
    EXPECT_TRUE(mpi->allToAllV(input.data(), sc.data(), so.data(),
                               viaMpi.data(), rc.data(), ro.data(), type)
                    .ok());
    EXPECT_EQ(difference(viaNccl, viaMpi), "");
    expectSameCounters(w.comm->counters(), mpi->counters());
  }
}

TEST(NcclCommTest, AllGatherAndReduceScatterMatchMpi) {
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const size_t block = 777;
  for (ElementType type : kAllTypes)
    for (bool exact : {true, false}) {
      bool integer = type == ElementType::I32 || type == ElementType::I64;
      if (integer && !exact)
        continue;
      SCOPED_TRACE(std::string(typeName(type)) +
                   (exact ? " exact" : " normals"));
      const size_t es = size_t(elementSize(type)), bytes = block * es;
      const std::vector<uint8_t> mine = inputOf(type, r, block, exact, 1);
      const std::vector<uint8_t> full =
          inputOf(type, r, block * size_t(n), exact, 2);
      w.comm->resetCounters();
      mpi->resetCounters();

      // All-gather, out of place and in place (the other blocks garbage).
      std::vector<uint8_t> gatheredNccl(bytes * size_t(n)),
          gatheredMpi(bytes * size_t(n));
      EXPECT_TRUE(w.comm
                      ->allGather(mine.data(), gatheredNccl.data(),
                                  int64_t(block), type)
                      .ok());
      EXPECT_TRUE(
          mpi->allGather(mine.data(), gatheredMpi.data(), int64_t(block), type)
              .ok());
      EXPECT_EQ(difference(gatheredNccl, gatheredMpi), "");
      std::vector<uint8_t> inPlaceNccl(bytes * size_t(n), 0xa5),
          inPlaceMpi(bytes * size_t(n), 0x5a);
      std::memcpy(&inPlaceNccl[size_t(r) * bytes], mine.data(), bytes);
      std::memcpy(&inPlaceMpi[size_t(r) * bytes], mine.data(), bytes);
      EXPECT_TRUE(
          w.comm->allGatherInPlace(inPlaceNccl.data(), int64_t(block), type)
              .ok());
      EXPECT_TRUE(
          mpi->allGatherInPlace(inPlaceMpi.data(), int64_t(block), type).ok());
      EXPECT_EQ(difference(inPlaceNccl, gatheredMpi), "");
      EXPECT_EQ(difference(inPlaceMpi, gatheredMpi), "");

      // Reduce-scatter (max too, except bf16, which MPI lacks), out of place
      // and in place: this rank's block.
      for (ReduceKind op : {ReduceKind::Sum, ReduceKind::Max}) {
        if (type == ElementType::BF16 && op == ReduceKind::Max)
          continue;
        std::vector<uint8_t> partNccl(bytes), partMpi(bytes);
        EXPECT_TRUE(w.comm
                        ->reduceScatter(full.data(), partNccl.data(),
                                        int64_t(block), type, op)
                        .ok());
        EXPECT_TRUE(mpi->reduceScatter(full.data(), partMpi.data(),
                                       int64_t(block), type, op)
                        .ok());
        EXPECT_EQ(difference(partNccl, partMpi), "");
        std::vector<uint8_t> bufNccl = full, bufMpi = full;
        EXPECT_TRUE(
            w.comm
                ->reduceScatterInPlace(bufNccl.data(), int64_t(block), type, op)
                .ok());
        EXPECT_TRUE(
            mpi->reduceScatterInPlace(bufMpi.data(), int64_t(block), type, op)
                .ok());
        EXPECT_EQ(difference(blockOf(bufNccl, r, bytes), partMpi), "");
        EXPECT_EQ(difference(blockOf(bufMpi, r, bytes), partMpi), "");
      }
      expectSameCounters(w.comm->counters(), mpi->counters());
    }
}

TEST(NcclCommTest, StartFormsMatchMpi) {
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int r = worldRank(), n = worldSize();
  const size_t count = 2003;
  // Exact inputs: MPI's started forms may sum in another order than its
  // blocking ones, which the fake uses.
  for (ElementType type : {ElementType::F32, ElementType::BF16,
                           ElementType::I64, ElementType::F64}) {
    SCOPED_TRACE(typeName(type));
    const size_t bytes = count * size_t(elementSize(type));
    const std::vector<uint8_t> a = inputOf(type, r, count, true, 3),
                               full =
                                   inputOf(type, r, count * size_t(n), true, 4);
    w.comm->resetCounters();
    mpi->resetCounters();
    std::vector<uint8_t> arN = a, arM = a, rsN(bytes), rsM(bytes), ipN = full,
                         ipM = full;
    auto h1 = w.comm->allReduceStart(arN.data(), int64_t(count), type,
                                     ReduceKind::Sum);
    auto h2 = w.comm->reduceScatterStart(full.data(), rsN.data(),
                                         int64_t(count), type, ReduceKind::Sum);
    auto h3 = w.comm->reduceScatterInPlaceStart(ipN.data(), int64_t(count),
                                                type, ReduceKind::Sum);
    auto m1 =
        mpi->allReduceStart(arM.data(), int64_t(count), type, ReduceKind::Sum);
    auto m2 = mpi->reduceScatterStart(full.data(), rsM.data(), int64_t(count),
                                      type, ReduceKind::Sum);
    auto m3 = mpi->reduceScatterInPlaceStart(ipM.data(), int64_t(count), type,
                                             ReduceKind::Sum);
    EXPECT_TRUE(h1.ok() && h2.ok() && h3.ok() && m1.ok() && m2.ok() && m3.ok());
    if (!(h1.ok() && h2.ok() && h3.ok() && m1.ok() && m2.ok() && m3.ok()))
      return;
    EXPECT_TRUE(w.comm->progress(*h1).ok());
    EXPECT_TRUE(w.comm->wait(*h2).ok());
    EXPECT_TRUE(w.comm->waitAll({*h3, *h1}).ok());
    EXPECT_TRUE(mpi->wait(*m2).ok());
    EXPECT_TRUE(mpi->waitAll({*m3, *m1}).ok());
    EXPECT_EQ(difference(arN, arM), "");
    EXPECT_EQ(difference(rsN, rsM), "");
    EXPECT_EQ(difference(blockOf(ipN, r, bytes), blockOf(ipM, r, bytes)), "");
    // overlap_param_gather's started all-gathers, out of place and in place
    // (this rank's block of the full buffer is its input).
    std::vector<uint8_t> agN(bytes * size_t(n)), agM(bytes * size_t(n)),
        agipN(bytes * size_t(n), 0xab), agipM(bytes * size_t(n), 0xcd);
    std::copy(a.begin(), a.end(), agipN.begin() + long(size_t(r) * bytes));
    std::copy(a.begin(), a.end(), agipM.begin() + long(size_t(r) * bytes));
    auto h4 = w.comm->allGatherStart(a.data(), agN.data(), int64_t(count), type);
    auto h5 = w.comm->allGatherInPlaceStart(agipN.data(), int64_t(count), type);
    auto m4 = mpi->allGatherStart(a.data(), agM.data(), int64_t(count), type);
    auto m5 = mpi->allGatherInPlaceStart(agipM.data(), int64_t(count), type);
    EXPECT_TRUE(h4.ok() && h5.ok() && m4.ok() && m5.ok());
    if (!(h4.ok() && h5.ok() && m4.ok() && m5.ok()))
      return;
    EXPECT_TRUE(w.comm->waitAll({*h5, *h4}).ok());
    EXPECT_TRUE(mpi->waitAll({*m4, *m5}).ok());
    EXPECT_EQ(difference(agN, agM), "");
    EXPECT_EQ(difference(agipN, agipM), "");
    EXPECT_EQ(difference(agN, agipN), "");
    expectSameCounters(w.comm->counters(), mpi->counters());
    // Consumed.
    EXPECT_EQ(w.comm->wait(*h1).getCode(), StatusCode::InvalidArgument);
    EXPECT_EQ(w.comm->waitAll({*h2}).getCode(), StatusCode::InvalidArgument);
    EXPECT_EQ(w.comm->wait(*h5).getCode(), StatusCode::InvalidArgument);
  }
}

TEST(NcclCommTest, PointToPointRingMatchesMpi) {
  // Every rank sends two messages to the next and receives two from the
  // previous, posted in different tag orders on the two sides: NCCL matches
  // by order, so the batch is issued by tag.
  NcclWorld w;
  auto mpi = worldComm();
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t big = 1 << 16;
  auto exchange = [&](Communicator &c, std::vector<float> &bigIn,
                      std::vector<int64_t> &smallIn) {
    std::vector<float> bigOut(size_t(big), float(r + 1));
    std::vector<int64_t> smallOut = {r, -r, int64_t(1) << 40};
    std::vector<CommRequest> batch;
    for (auto req : {c.isend(smallOut.data(), 3, ElementType::I64, next, 9),
                     c.irecv(bigIn.data(), big, ElementType::F32, prev, 4),
                     c.isend(bigOut.data(), big, ElementType::F32, next, 4),
                     c.irecv(smallIn.data(), 3, ElementType::I64, prev, 9)}) {
      EXPECT_TRUE(req.ok()) << req.status().toString();
      if (req.ok())
        batch.push_back(*req);
    }
    EXPECT_TRUE(c.waitAll(batch).ok());
  };
  std::vector<float> bigN(size_t(big), -1.0f), bigM(size_t(big), -2.0f);
  std::vector<int64_t> smallN(3, -1), smallM(3, -2);
  exchange(*w.comm, bigN, smallN);
  exchange(*mpi, bigM, smallM);
  EXPECT_EQ(bigN, bigM);
  EXPECT_EQ(smallN, smallM);
  EXPECT_EQ(bigN[0], float(prev + 1));
  EXPECT_EQ(smallN, (std::vector<int64_t>{prev, -prev, int64_t(1) << 40}));
  expectSameCounters(w.comm->counters(), mpi->counters());
  EXPECT_EQ(w.comm->counters().p2p, uint64_t(big * 4 + 24));
}

//===----------------------------------------------------------------------===//
// (b) The call sequence
//===----------------------------------------------------------------------===//

TEST(NcclCommLogTest, BlockingCollectivesAreStreamOrdered) {
  NcclWorld w;
  if (!w.comm)
    return;
  std::vector<float> buf(64, 1.0f);
  EXPECT_TRUE(
      w.comm->allReduce(buf.data(), 64, ElementType::F32, ReduceKind::Max)
          .ok());
  const auto &log = w.fake.log();
  EXPECT_EQ(names(log), (std::vector<std::string>{
                            "eventRecord", "streamWaitEvent", "allReduce",
                            "eventRecord", "streamWaitEvent"}));
  if (log.size() != 5)
    return;
  expectAfterCompute(log, 0, w);
  const FakeNcclCall &ar = log[2];
  EXPECT_EQ(ar.stream, w.commStreamId());
  EXPECT_EQ(ar.comm, w.commId());
  EXPECT_EQ(ar.send, buf.data());
  EXPECT_EQ(ar.recv, buf.data());
  EXPECT_EQ(ar.count, 64u);
  EXPECT_EQ(ar.type, ElementType::F32);
  EXPECT_EQ(ar.op, ReduceKind::Max);
  EXPECT_FALSE(ar.inGroup);
  expectBeforeCompute(log, 3, w);
  // No host synchronisation anywhere.
  EXPECT_TRUE(callsNamed(log, "streamSynchronize").empty());
}

TEST(NcclCommLogTest, InPlaceFormsUseNcclLayouts) {
  NcclWorld w;
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const int64_t count = 37;
  std::vector<uint16_t> bf(size_t(count * n));
  std::vector<double> f64(size_t(count * n));
  std::vector<int32_t> i32(size_t(count * n));
  std::vector<float> send(size_t(count * n)), recv(static_cast<size_t>(count));
  EXPECT_TRUE(
      w.comm->allGatherInPlace(bf.data(), count, ElementType::BF16).ok());
  EXPECT_TRUE(w.comm
                  ->reduceScatterInPlace(f64.data(), count, ElementType::F64,
                                         ReduceKind::Sum)
                  .ok());
  auto h = w.comm->reduceScatterInPlaceStart(i32.data(), count,
                                             ElementType::I32, ReduceKind::Max);
  EXPECT_TRUE(h.ok() && w.comm->wait(*h).ok());
  EXPECT_TRUE(w.comm
                  ->reduceScatter(send.data(), recv.data(), count,
                                  ElementType::F32, ReduceKind::Sum)
                  .ok());
  auto gathers = callsNamed(w.fake.log(), "allGather");
  auto scatters = callsNamed(w.fake.log(), "reduceScatter");
  EXPECT_EQ(gathers.size(), 1u);
  EXPECT_EQ(scatters.size(), 3u);
  if (gathers.size() != 1 || scatters.size() != 3)
    return;
  // All-gather: sendbuff = recvbuff + rank * count elements (2 bytes).
  EXPECT_EQ(gathers[0].recv, bf.data());
  EXPECT_EQ(gathers[0].send,
            reinterpret_cast<const char *>(bf.data()) + r * count * 2);
  EXPECT_EQ(gathers[0].count, size_t(count));
  EXPECT_EQ(gathers[0].type, ElementType::BF16);
  // Reduce-scatter: recvbuff = sendbuff + rank * count elements.
  EXPECT_EQ(scatters[0].send, f64.data());
  EXPECT_EQ(scatters[0].recv,
            reinterpret_cast<char *>(f64.data()) + r * count * 8);
  EXPECT_EQ(scatters[0].count, size_t(count));
  EXPECT_EQ(scatters[0].type, ElementType::F64);
  EXPECT_EQ(scatters[0].op, ReduceKind::Sum);
  EXPECT_EQ(scatters[1].send, i32.data());
  EXPECT_EQ(scatters[1].recv,
            reinterpret_cast<char *>(i32.data()) + r * count * 4);
  EXPECT_EQ(scatters[1].type, ElementType::I32);
  EXPECT_EQ(scatters[1].op, ReduceKind::Max);
  // Out of place: the caller's buffers.
  EXPECT_EQ(scatters[2].send, send.data());
  EXPECT_EQ(scatters[2].recv, recv.data());
  EXPECT_EQ(scatters[2].count, size_t(count));
  for (const FakeNcclCall &c : w.fake.log())
    if (c.name == "allGather" || c.name == "reduceScatter")
      EXPECT_EQ(c.stream, w.commStreamId());
}

TEST(NcclCommLogTest, StartedFormsMakeComputeWaitOnlyAtWait) {
  NcclWorld w;
  if (!w.comm)
    return;
  const int n = worldSize();
  std::vector<float> a(100, 1.0f), b(size_t(10 * n), 1.0f), part(10);
  auto ha =
      w.comm->allReduceStart(a.data(), 100, ElementType::F32, ReduceKind::Sum);
  auto hb = w.comm->reduceScatterStart(b.data(), part.data(), 10,
                                       ElementType::BF16, ReduceKind::Sum);
  EXPECT_TRUE(ha.ok() && hb.ok());
  if (!ha.ok() || !hb.ok())
    return;
  std::vector<FakeNcclCall> started = w.fake.log();
  // Per start: record on compute, comm stream waits, the operation, record
  // its completion event on the comm stream (two new events, from the
  // pool's first use). The compute stream never waits.
  EXPECT_EQ(names(started),
            (std::vector<std::string>{
                "eventRecord", "streamWaitEvent", "allReduce", "eventCreate",
                "eventRecord", "eventRecord", "streamWaitEvent",
                "reduceScatter", "eventCreate", "eventRecord"}));
  EXPECT_FALSE(computeWaits(started, w));
  if (started.size() != 10)
    return;
  expectAfterCompute(started, 0, w);
  expectAfterCompute(started, 5, w);
  int eventA = started[4].event, eventB = started[9].event;
  EXPECT_EQ(started[4].stream, w.commStreamId());
  EXPECT_EQ(started[9].stream, w.commStreamId());
  EXPECT_NE(eventA, eventB);
  EXPECT_TRUE(w.comm->progress(*ha).ok());
  EXPECT_EQ(w.fake.log().size(), started.size()); // progress: nothing

  // wait(): the compute stream waits on the request's event, nothing else.
  w.fake.clearLog();
  EXPECT_TRUE(w.comm->wait(*hb).ok());
  EXPECT_EQ(names(w.fake.log()), (std::vector<std::string>{"streamWaitEvent"}));
  if (w.fake.log().size() == 1) {
    EXPECT_EQ(w.fake.log()[0].stream, w.computeId());
    EXPECT_EQ(w.fake.log()[0].event, eventB);
  }
  // Completed events are reused: the next start creates none.
  w.fake.clearLog();
  auto hc =
      w.comm->allReduceStart(a.data(), 100, ElementType::F32, ReduceKind::Sum);
  EXPECT_TRUE(hc.ok());
  EXPECT_TRUE(callsNamed(w.fake.log(), "eventCreate").empty());
  auto records = callsNamed(w.fake.log(), "eventRecord");
  if (records.size() == 2)
    EXPECT_EQ(records[1].event, eventB);
  w.fake.clearLog();
  EXPECT_TRUE(hc.ok() && w.comm->waitAll({*ha, *hc}).ok());
  auto waits = callsNamed(w.fake.log(), "streamWaitEvent");
  EXPECT_EQ(w.fake.log().size(), 2u);
  if (waits.size() == 2) {
    EXPECT_EQ(waits[0].event, eventA);
    EXPECT_EQ(waits[1].event, eventB);
    EXPECT_EQ(waits[0].stream, w.computeId());
    EXPECT_EQ(waits[1].stream, w.computeId());
  }
}

TEST(NcclCommLogTest, PointToPointIsQueuedAndIssuedAsOneGroup) {
  NcclWorld w;
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> out(8, float(r)), in(8), out2(3, 1.0f), in2(3);
  auto s1 = w.comm->isend(out.data(), 8, ElementType::F32, next, 7);
  auto r1 = w.comm->irecv(in.data(), 8, ElementType::F32, prev, 7);
  auto s2 = w.comm->isend(out2.data(), 3, ElementType::F32, next, 2);
  auto r2 = w.comm->irecv(in2.data(), 3, ElementType::F32, prev, 2);
  EXPECT_TRUE(s1.ok() && r1.ok() && s2.ok() && r2.ok());
  if (!(s1.ok() && r1.ok() && s2.ok() && r2.ok()))
    return;
  // Queued only.
  EXPECT_TRUE(w.fake.log().empty());
  EXPECT_EQ(w.comm->counters().p2p, uint64_t(44));
  EXPECT_EQ(w.comm->counters().calls, 4u);
  EXPECT_TRUE(w.comm->waitAll({*s1, *r1, *s2, *r2}).ok());
  const auto &log = w.fake.log();
  EXPECT_EQ(names(log),
            (std::vector<std::string>{
                "eventRecord", "streamWaitEvent", "groupStart", "send", "recv",
                "send", "recv", "groupEnd", "eventRecord", "streamWaitEvent"}));
  if (log.size() == 10) {
    expectAfterCompute(log, 0, w);
    // By tag (2 before 7), then in posting order; all inside the group.
    const void *bufs[] = {out2.data(), in2.data(), out.data(), in.data()};
    for (int k = 0; k < 4; ++k) {
      const FakeNcclCall &c = log[size_t(3 + k)];
      EXPECT_TRUE(c.inGroup) << k;
      EXPECT_EQ(c.stream, w.commStreamId());
      EXPECT_EQ(c.comm, w.commId());
      EXPECT_EQ(c.peer, k % 2 == 0 ? next : prev);
      EXPECT_EQ(k % 2 == 0 ? c.send : c.recv, bufs[k]);
      EXPECT_EQ(c.count, k < 2 ? 3u : 8u);
      EXPECT_EQ(c.type, ElementType::F32);
    }
    EXPECT_FALSE(log[7].inGroup);
    expectBeforeCompute(log, 8, w);
  }
  EXPECT_EQ(in[0], float(prev));
  EXPECT_EQ(in2[2], 1.0f);

  // A rank may exchange with itself (NCCL allows it), in one group.
  w.fake.clearLog();
  std::vector<int32_t> selfOut = {r}, selfIn = {-1};
  auto ss = w.comm->isend(selfOut.data(), 1, ElementType::I32, r, 0);
  auto sr = w.comm->irecv(selfIn.data(), 1, ElementType::I32, r, 0);
  EXPECT_TRUE(ss.ok() && sr.ok());
  if (!ss.ok() || !sr.ok())
    return;
  EXPECT_TRUE(w.comm->waitAll({*sr, *ss}).ok());
  EXPECT_EQ(selfIn[0], r);
  EXPECT_EQ(callsNamed(w.fake.log(), "groupStart").size(), 1u);

  // wait() on one queued operation issues it alone, as a group of one
  // ordered like any other. (Every rank waits its send first: the fake
  // sends a small message eagerly, and NCCL would only enqueue it.)
  w.fake.clearLog();
  std::vector<int32_t> one = {r + 100}, got = {-1};
  auto lone = w.comm->isend(one.data(), 1, ElementType::I32, next, 1);
  auto loneIn = w.comm->irecv(got.data(), 1, ElementType::I32, prev, 1);
  EXPECT_TRUE(lone.ok() && loneIn.ok());
  if (!lone.ok() || !loneIn.ok())
    return;
  EXPECT_TRUE(w.comm->wait(*lone).ok());
  EXPECT_EQ(names(w.fake.log()),
            (std::vector<std::string>{"eventRecord", "streamWaitEvent",
                                      "groupStart", "send", "groupEnd",
                                      "eventRecord", "streamWaitEvent"}));
  EXPECT_TRUE(w.comm->wait(*loneIn).ok());
  EXPECT_EQ(got[0], prev + 100);
}

// A batch that also holds a started collective: the point-to-point group
// is issued first (it need not wait for the collective), then the compute
// stream waits for the collective's completion event.
TEST(NcclCommLogTest, WaitAllIssuesTheBatchBeforeWaitingForCollectives) {
  NcclWorld w;
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  std::vector<float> grad(32, 1.0f), act(4, float(r)), in(4, -1.0f);
  auto h = w.comm->allReduceStart(grad.data(), 32, ElementType::F32,
                                  ReduceKind::Sum);
  auto s = w.comm->isend(act.data(), 4, ElementType::F32, (r + 1) % n, 0);
  auto q = w.comm->irecv(in.data(), 4, ElementType::F32, (r + n - 1) % n, 0);
  EXPECT_TRUE(h.ok() && s.ok() && q.ok());
  if (!(h.ok() && s.ok() && q.ok()))
    return;
  int done = callsNamed(w.fake.log(), "eventRecord").back().event;
  w.fake.clearLog();
  EXPECT_TRUE(w.comm->waitAll({*h, *s, *q}).ok());
  const auto &log = w.fake.log();
  EXPECT_EQ(names(log), (std::vector<std::string>{
                            "eventRecord", "streamWaitEvent", "groupStart",
                            "send", "recv", "groupEnd", "eventRecord",
                            "streamWaitEvent", "streamWaitEvent"}));
  if (log.size() == 9) {
    expectAfterCompute(log, 0, w);
    expectBeforeCompute(log, 6, w);
    EXPECT_EQ(log[8].stream, w.computeId());
    EXPECT_EQ(log[8].event, done);
  }
  EXPECT_EQ(grad[0], float(n));
  EXPECT_EQ(in[0], float((r + n - 1) % n));
}

TEST(NcclCommLogTest, ErrorsConsumeRequests) {
  NcclWorld w;
  if (!w.comm)
    return;
  const int n = worldSize(), r = worldRank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Bad arguments: errors before anything is logged or counted.
  std::vector<float> buf(16);
  EXPECT_EQ(
      w.comm->isend(buf.data(), 1, ElementType::F32, n, 0).status().getCode(),
      StatusCode::InvalidArgument);
  EXPECT_EQ(
      w.comm->irecv(buf.data(), 1, ElementType::F32, -1, 0).status().getCode(),
      StatusCode::InvalidArgument);
  EXPECT_EQ(w.comm->isend(buf.data(), 1, ElementType::F32, next, -1)
                .status()
                .getCode(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(w.comm->allReduce(buf.data(), -1, ElementType::F32, ReduceKind::Sum)
                .getCode(),
            StatusCode::InvalidArgument);
  EXPECT_TRUE(w.fake.log().empty());
  EXPECT_EQ(w.comm->counters().calls, 0u);

  // Every rank's first send fails (before any message is posted, so no
  // rank waits for another): the group is still ended, the error names the
  // call, the compute stream is not made to wait, and the requests are gone.
  auto send = w.comm->isend(buf.data(), 4, ElementType::F32, next, 0);
  auto recv = w.comm->irecv(buf.data() + 8, 4, ElementType::F32, prev, 0);
  EXPECT_TRUE(send.ok() && recv.ok());
  if (!send.ok() || !recv.ok())
    return;
  w.fake.failNext("send");
  Status st = w.comm->waitAll({*send, *recv});
  EXPECT_EQ(st.getCode(), StatusCode::Internal);
  EXPECT_NE(st.message().find("fake failure of send"), std::string::npos)
      << st.toString();
  EXPECT_EQ(names(w.fake.log()),
            (std::vector<std::string>{"eventRecord", "streamWaitEvent",
                                      "groupStart", "send", "groupEnd"}));
  EXPECT_FALSE(computeWaits(w.fake.log(), w));
  EXPECT_EQ(w.comm->waitAll({*send, *recv}).getCode(),
            StatusCode::InvalidArgument);

  // An unknown request next to a started collective: the collective is
  // still waited on (and consumed), the error names the unknown id.
  auto h =
      w.comm->allReduceStart(buf.data(), 4, ElementType::F32, ReduceKind::Sum);
  EXPECT_TRUE(h.ok());
  if (!h.ok())
    return;
  w.fake.clearLog();
  st = w.comm->waitAll({CommRequest{12345}, *h});
  EXPECT_EQ(st.getCode(), StatusCode::InvalidArgument);
  EXPECT_NE(st.message().find("12345"), std::string::npos);
  EXPECT_TRUE(computeWaits(w.fake.log(), w));
  EXPECT_EQ(w.comm->wait(*h).getCode(), StatusCode::InvalidArgument);
}

TEST(NcclCommLogTest, BarrierAllReducesScratchAndSynchronizes) {
  NcclWorld w;
  if (!w.comm)
    return;
  EXPECT_TRUE(w.comm->barrier().ok());
  EXPECT_TRUE(w.comm->barrier().ok());
  const auto &log = w.fake.log();
  EXPECT_EQ(names(log), (std::vector<std::string>{
                            "memAlloc", "allReduce", "streamSynchronize",
                            "allReduce", "streamSynchronize"}));
  if (log.size() == 5) {
    void *scratch = log[0].recv;
    for (size_t i : {1, 3}) {
      EXPECT_EQ(log[i].send, scratch);
      EXPECT_EQ(log[i].recv, scratch);
      EXPECT_EQ(log[i].count, 1u);
      EXPECT_EQ(log[i].stream, w.commStreamId());
      EXPECT_EQ(log[i + 1].stream, w.commStreamId());
    }
  }
  // Barriers send no counted bytes, as MPI_Barrier.
  EXPECT_EQ(w.comm->counters().total(), 0u);
}

TEST(NcclCommLogTest, DestructionSynchronizesAndFreesEverything) {
  NcclWorld w;
  if (!w.comm)
    return;
  std::vector<float> a(10, 1.0f);
  auto h =
      w.comm->allReduceStart(a.data(), 10, ElementType::F32, ReduceKind::Sum);
  EXPECT_TRUE(h.ok());
  EXPECT_TRUE(w.comm->barrier().ok());
  int commStream = w.commStreamId(), comm = w.commId();
  w.fake.clearLog();
  w.comm.reset();
  const auto &log = w.fake.log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front().name, "streamSynchronize");
  EXPECT_EQ(log.front().stream, commStream);
  EXPECT_EQ(callsNamed(log, "eventDestroy").size(), 3u);
  EXPECT_EQ(callsNamed(log, "memFree").size(), 1u);
  EXPECT_EQ(log.back().name, "commDestroy");
  EXPECT_EQ(log.back().comm, comm);
  // Only the compute stream is left.
  EXPECT_EQ(w.fake.liveStreams(), 1u);
  EXPECT_EQ(w.fake.liveEvents(), 0u);
  EXPECT_EQ(w.fake.liveComms(), 0u);
  EXPECT_EQ(w.fake.liveAllocations(), 0u);
}

TEST(NcclCommLogTest, AbortAndAsyncErrors) {
  NcclWorld w;
  if (!w.comm)
    return;
  EXPECT_TRUE(w.comm->asyncError().ok());
  w.fake.setAsyncError(unavailable("peer 3 is gone"));
  Status async = w.comm->asyncError();
  EXPECT_EQ(async.getCode(), StatusCode::Unavailable);
  EXPECT_EQ(async.message(), "peer 3 is gone");

  // Local on every rank: abort needs no peer.
  int comm = w.commId();
  EXPECT_TRUE(w.comm->abort().ok());
  EXPECT_TRUE(w.comm->abort().ok()); // idempotent
  std::vector<float> a(4);
  EXPECT_EQ(w.comm->allReduce(a.data(), 4, ElementType::F32, ReduceKind::Sum)
                .getCode(),
            StatusCode::Aborted);
  EXPECT_EQ(
      w.comm->isend(a.data(), 4, ElementType::F32, 0, 0).status().getCode(),
      StatusCode::Aborted);
  EXPECT_EQ(w.comm->barrier().getCode(), StatusCode::Aborted);
  EXPECT_EQ(w.comm->asyncError().getCode(), StatusCode::Aborted);
  w.comm.reset();
  // Aborted once; never destroyed nor synchronised afterwards.
  auto aborts = callsNamed(w.fake.log(), "commAbort");
  EXPECT_EQ(aborts.size(), 1u);
  if (!aborts.empty())
    EXPECT_EQ(aborts[0].comm, comm);
  EXPECT_TRUE(callsNamed(w.fake.log(), "commDestroy").empty());
  EXPECT_TRUE(callsNamed(w.fake.log(), "streamSynchronize").empty());
  EXPECT_EQ(w.fake.liveComms(), 0u);
  EXPECT_EQ(w.fake.liveEvents(), 0u);
}

//===----------------------------------------------------------------------===//
// (d) Communicators from the artifact's group table
//===----------------------------------------------------------------------===//

namespace {

std::shared_ptr<const LoadedArtifact> load(const ArtifactDesc &desc) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "mesh.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  return loaded.ok() ? *loaded : nullptr;
}

} // namespace

TEST(NcclGroupsTest, SplitsByTheArtifactsGroups) {
  const int n = worldSize(), r = worldRank();
  const int tp = 2, dp = n / 2;
  auto artifact = load(tpDpMeshArtifact(tp, dp));
  if (!artifact)
    return; // alike on every rank
  FakeNccl fake;
  void *compute = *fake.api().streamCreate();
  // "ep" is absent: no colour on any rank, no entry.
  std::vector<std::string> kinds = {"tp", "ep", "dp"};
  auto set =
      createNcclCommunicators(fake.api(), compute, *artifact->root(), kinds);
  EXPECT_TRUE(set.ok()) << set.status().toString();
  if (!set.ok())
    return;
  EXPECT_EQ(set->groups.size(), 2u);
  EXPECT_TRUE(set->world && set->groups.count("tp") && set->groups.count("dp"));
  if (!set->world || !set->groups.count("tp") || !set->groups.count("dp"))
    return;
  NcclCommunicator &tpc = *set->groups.at("tp");
  NcclCommunicator &dpc = *set->groups.at("dp");
  EXPECT_EQ(set->world->size(), n);
  EXPECT_EQ(set->world->rank(), r);
  EXPECT_EQ(tpc.size(), tp);
  EXPECT_EQ(tpc.rank(), r % tp);
  EXPECT_EQ(dpc.size(), dp);
  EXPECT_EQ(dpc.rank(), r / tp);
  EXPECT_EQ(tpc.computeStream(), compute);
  EXPECT_NE(tpc.commStream(), dpc.commStream());

  // The log: rank 0 alone made the id; one init over the world; then one
  // split per kind, in order, with colour = instance and key = position.
  const auto &log = fake.log();
  EXPECT_EQ(callsNamed(log, "getUniqueId").size(), r == 0 ? 1u : 0u);
  auto inits = callsNamed(log, "commInitRank");
  EXPECT_EQ(inits.size(), 1u);
  if (inits.size() == 1) {
    EXPECT_EQ(inits[0].key, n);
    EXPECT_EQ(inits[0].rank, r);
  }
  auto splits = callsNamed(log, "commSplit");
  EXPECT_EQ(splits.size(), 3u);
  if (splits.size() == 3) {
    int worldComm = fake.commId(set->world->ncclComm());
    EXPECT_EQ(splits[0].color, std::optional<int>(r / tp));
    EXPECT_EQ(splits[0].key, r % tp);
    EXPECT_FALSE(splits[1].color.has_value());
    EXPECT_EQ(splits[2].color, std::optional<int>(r % tp));
    EXPECT_EQ(splits[2].key, r / tp);
    for (const FakeNcclCall &s : splits)
      EXPECT_EQ(s.comm, worldComm);
  }

  // Each group sums exactly its members (world ranks), as over MPI.
  auto mpiGroups = createMpiGroupCommunicators(*artifact->root(), kinds);
  EXPECT_TRUE(mpiGroups.ok());
  for (const char *kind : {"tp", "dp"}) {
    int32_t viaNccl = r, viaMpi = r;
    EXPECT_TRUE(set->groups.at(kind)
                    ->allReduce(&viaNccl, 1, ElementType::I32, ReduceKind::Sum)
                    .ok());
    if (mpiGroups.ok())
      EXPECT_TRUE(mpiGroups->at(kind)
                      ->allReduce(&viaMpi, 1, ElementType::I32, ReduceKind::Sum)
                      .ok());
    EXPECT_EQ(viaNccl, viaMpi) << kind;
  }
  int32_t tpSum = r;
  EXPECT_TRUE(tpc.allReduce(&tpSum, 1, ElementType::I32, ReduceKind::Sum).ok());
  EXPECT_EQ(tpSum, 2 * (r / tp) * tp + 1);
  EXPECT_TRUE(set->world->barrier().ok());

  // Duplicate kinds: refused before any collective.
  auto twice = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                       {"dp", "tp", "dp"});
  EXPECT_EQ(twice.status().getCode(), StatusCode::InvalidArgument);
}

// Run alone (ctest TesseraNcclCommunicatorTest.np1): a one-rank world makes
// no NCCL call unless asked to, and then the communicators NCCL would make.
TEST(NcclGroupsTest, OneRankWorldNeedsNoNcclUnlessAsked) {
  if (worldSize() != 1)
    GTEST_SKIP() << "needs a world of one rank";
  auto artifact = load(tpDpMeshArtifact(1, 1));
  ASSERT_TRUE(artifact);
  FakeNccl fake;
  void *compute = *fake.api().streamCreate();
  fake.clearLog();
  auto none = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                      {"tp", "dp"});
  ASSERT_TRUE(none.ok()) << none.status().toString();
  EXPECT_FALSE(none->world);
  EXPECT_TRUE(none->groups.empty());
  EXPECT_TRUE(fake.log().empty());

  auto asked = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                       {"tp", "dp"}, /*atOneRank=*/true);
  ASSERT_TRUE(asked.ok()) << asked.status().toString();
  ASSERT_TRUE(asked->world);
  EXPECT_EQ(asked->world->size(), 1);
  EXPECT_EQ(asked->groups.size(), 2u);
  EXPECT_EQ(callsNamed(fake.log(), "getUniqueId").size(), 1u);
  EXPECT_EQ(callsNamed(fake.log(), "commInitRank").size(), 1u);
  EXPECT_EQ(callsNamed(fake.log(), "commSplit").size(), 2u);
}

TEST(NcclGroupsTest, MembershipMismatchIsReportedAfterAllSplits) {
  const int r = worldRank(), n = worldSize();
  ArtifactDesc good = tpDpMeshArtifact(2, n / 2);
  // Rank 1 alone lists tp instance 0 as [1, 0]: the members are right, the
  // order (so rank 1's position) is not.
  ArtifactDesc reordered = good;
  for (auto &[kind, ranks] : reordered.groups)
    if (kind == "tp" && ranks == std::vector<int>{0, 1}) {
      std::swap(ranks[0], ranks[1]);
      break;
    }
  auto artifact = load(r == 1 ? reordered : good);
  if (!artifact)
    return;
  FakeNccl fake;
  void *compute = *fake.api().streamCreate();
  {
    auto set = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                       {"tp", "dp"});
    EXPECT_EQ(set.ok(), r != 1) << set.status().toString();
    if (!set.ok()) {
      EXPECT_EQ(set.status().getCode(), StatusCode::FailedPrecondition);
      const std::string &msg = set.status().message();
      for (const std::string &needle :
           {std::string("membership check failed for kind 'tp'"),
            std::string("on rank 1"), std::string("holds world ranks [0, 1]"),
            std::string("the artifact's instance is [1, 0]")})
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
    // Every rank split both kinds (the failing one too).
    EXPECT_EQ(callsNamed(fake.log(), "commSplit").size(), 2u);
  }
  // Nothing left behind on the failing rank either.
  EXPECT_EQ(fake.liveComms(), 0u);
  EXPECT_EQ(fake.liveEvents(), 0u);
  EXPECT_EQ(fake.liveStreams(), 1u);
}

TEST(NcclGroupsTest, OneRanksFailureReachesEveryRank) {
  const int r = worldRank();
  auto artifact = load(tpDpMeshArtifact(2, worldSize() / 2));
  if (!artifact)
    return;
  FakeNccl fake;
  void *compute = *fake.api().streamCreate();
  // Rank 0 cannot make the unique id: nobody initialises.
  if (r == 0)
    fake.failNext("getUniqueId");
  auto noId = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                      {"tp", "dp"});
  EXPECT_FALSE(noId.ok());
  EXPECT_NE(noId.status().message().find(r == 0 ? "fake failure of getUniqueId"
                                                : "rank 0 could not create"),
            std::string::npos)
      << noId.status().toString();
  EXPECT_TRUE(callsNamed(fake.log(), "commInitRank").empty());

  // Rank 0 fails after initialising (its communication stream): the others
  // learn of it before splitting.
  fake.clearLog();
  if (r == 0)
    fake.failNext("streamCreate");
  auto noStream = createNcclCommunicators(fake.api(), compute,
                                          *artifact->root(), {"tp", "dp"});
  EXPECT_FALSE(noStream.ok());
  EXPECT_NE(noStream.status().message().find(
                r == 0 ? "fake failure of streamCreate"
                       : "NCCL initialisation failed on another rank"),
            std::string::npos)
      << noStream.status().toString();
  EXPECT_TRUE(callsNamed(fake.log(), "commSplit").empty());

  // Rank 0 fails after the tp split: no rank goes on to split dp.
  fake.clearLog();
  if (r == 0)
    fake.failNext("commUserRank");
  auto noTp = createNcclCommunicators(fake.api(), compute, *artifact->root(),
                                      {"tp", "dp"});
  EXPECT_FALSE(noTp.ok());
  if (r != 0)
    EXPECT_EQ(noTp.status().getCode(), StatusCode::Unavailable);
  EXPECT_NE(noTp.status().message().find("group kind 'tp'"), std::string::npos)
      << noTp.status().toString();
  EXPECT_EQ(callsNamed(fake.log(), "commSplit").size(), 1u);
  EXPECT_EQ(fake.liveComms(), 0u);
}
