//===- InPlaceCollectivesMpiTest.cpp - In-place dp collectives (mpirun) ---===//
//
// The distributed optimizer's in-place reduce-scatter (blocking and
// started) and all-gather, through the communicator and through the
// executor (rank-relative refs naming this rank's block of a bucket), on 2
// and 4 ranks in f32 and bf16: the results equal a reference sum computed
// on the host (exactly where every value is a small integer) and the
// out-of-place forms, and count the same bytes. A shard that overlaps its
// bucket anywhere but at the rank's block fails to decode.
//
// Every rank runs the whole suite; the exit code is the maximum over ranks.
// Tests avoid ASSERT_* before collectives so that a failing rank never
// leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"

#include "MpiTestMain.h"


#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {



/// The input of world rank `rank`: `count` small integers in [-8, 8]
/// (exact), else normals; bf16 inputs are rounded to bf16.
std::vector<float> inputOf(int rank, size_t count, bool exact, bool bf16) {
  std::vector<float> v(count);
  std::mt19937 gen(uint32_t(977 * rank + 13));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t k = 0; k < count; ++k)
    v[k] = exact ? float(int((k * 7 + size_t(rank) * 3) % 17) - 8) : normal(gen);
  if (bf16)
    for (float &x : v)
      x = bf16ToFloat(floatToBf16(x));
  return v;
}

std::vector<uint16_t> toBf16(const std::vector<float> &v) {
  std::vector<uint16_t> h(v.size());
  floatsToBf16(v.data(), h.data(), int64_t(v.size()));
  return h;
}

/// Raw bytes of `v` as f32 or bf16.
std::vector<uint8_t> bytesOf(const std::vector<float> &v, bool bf16) {
  std::vector<uint8_t> out;
  if (bf16) {
    std::vector<uint16_t> h = toBf16(v);
    out.resize(h.size() * 2);
    std::memcpy(out.data(), h.data(), out.size());
  } else {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  }
  return out;
}

/// Checks `got` (block `index` of the reduction of `members`' inputs) against
/// the sum in double: exactly when the inputs are small integers, else
/// within the rounding of n - 1 additions in f32 or bf16.
void expectReducedBlock(const std::vector<float> &got,
                        const std::vector<int> &members, size_t block,
                        size_t index, bool exact, bool bf16,
                        const std::string &what) {
  const size_t full = block * members.size();
  std::vector<std::vector<float>> inputs;
  for (int m : members)
    inputs.push_back(inputOf(m, full, exact, bf16));
  ASSERT_EQ(got.size(), block) << what;
  int wrong = 0;
  for (size_t k = 0; k < block && wrong < 5; ++k) {
    double sum = 0.0, magnitude = 0.0;
    for (const auto &in : inputs) {
      sum += in[index * block + k];
      magnitude += std::fabs(in[index * block + k]);
    }
    double tol = exact ? 0.0
                       : double(members.size()) * magnitude *
                                 (bf16 ? std::ldexp(1.0, -8) : 1e-6) +
                             1e-6;
    if (std::fabs(double(got[k]) - sum) > tol) {
      ++wrong;
      ADD_FAILURE() << what << ": element " << k << " of block " << index
                    << " is " << got[k] << ", expected " << sum << " +- "
                    << tol;
    }
  }
}

std::vector<int> worldMembers() {
  std::vector<int> all(static_cast<size_t>(worldSize()));
  for (int r = 0; r < worldSize(); ++r)
    all[size_t(r)] = r;
  return all;
}

std::vector<float> asFloats(const std::vector<uint8_t> &bytes, bool bf16) {
  std::vector<float> out(bytes.size() / (bf16 ? 2 : 4));
  if (bf16) {
    std::vector<uint16_t> h(out.size());
    std::memcpy(h.data(), bytes.data(), bytes.size());
    bf16ToFloats(h.data(), out.data(), int64_t(out.size()));
  } else {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  }
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Communicator
//===----------------------------------------------------------------------===//

TEST(InPlaceCommTest, MatchesOutOfPlaceInF32AndBf16) {
  auto comm = worldComm();
  const int n = comm->size(), r = comm->rank();
  const size_t block = 1001;
  for (bool bf16 : {false, true})
    for (bool exact : {true, false}) {
      std::string what = std::string(bf16 ? "bf16" : "f32") +
                         (exact ? " integers" : " normals");
      SCOPED_TRACE(what);
      const ElementType type = bf16 ? ElementType::BF16 : ElementType::F32;
      const size_t es = bf16 ? 2 : 4;
      std::vector<uint8_t> input =
          bytesOf(inputOf(r, block * size_t(n), exact, bf16), bf16);
      comm->resetCounters();
      // Out of place.
      std::vector<uint8_t> part(block * es);
      EXPECT_TRUE(comm->reduceScatter(input.data(), part.data(),
                                      int64_t(block), type, ReduceKind::Sum)
                      .ok());
      CommCounters outOfPlace = comm->counters();
      // In place, blocking and started.
      std::vector<uint8_t> inPlace = input, started = input;
      EXPECT_TRUE(comm->reduceScatterInPlace(inPlace.data(), int64_t(block),
                                             type, ReduceKind::Sum)
                      .ok());
      CommCounters afterInPlace = comm->counters() - outOfPlace;
      auto h = comm->reduceScatterInPlaceStart(started.data(), int64_t(block),
                                               type, ReduceKind::Sum);
      EXPECT_TRUE(h.ok());
      if (!h.ok())
        return;
      for (int i = 0; i < 5; ++i)
        EXPECT_TRUE(comm->progress(*h).ok());
      EXPECT_TRUE(comm->wait(*h).ok());
      CommCounters afterStarted =
          comm->counters() - outOfPlace - afterInPlace;
      EXPECT_EQ(afterInPlace.reduceScatter, outOfPlace.reduceScatter);
      EXPECT_EQ(afterStarted.reduceScatter, outOfPlace.reduceScatter);
      EXPECT_EQ(afterInPlace.calls, 1u);
      auto blockOf = [&](const std::vector<uint8_t> &buf) {
        return std::vector<uint8_t>(buf.begin() + long(size_t(r) * block * es),
                                    buf.begin() +
                                        long(size_t(r + 1) * block * es));
      };
      std::vector<int> members = worldMembers();
      expectReducedBlock(asFloats(part, bf16), members, block, size_t(r),
                         exact, bf16, "out of place");
      expectReducedBlock(asFloats(blockOf(inPlace), bf16), members, block,
                         size_t(r), exact, bf16, "in place");
      expectReducedBlock(asFloats(blockOf(started), bf16), members, block,
                         size_t(r), exact, bf16, "started in place");
      if (exact) {
        EXPECT_TRUE(blockOf(inPlace) == part);
        EXPECT_TRUE(blockOf(started) == part);
      }

      // All-gather: bit-identical to the out-of-place form.
      std::vector<uint8_t> gathered(block * es * size_t(n));
      comm->resetCounters();
      EXPECT_TRUE(
          comm->allGather(part.data(), gathered.data(), int64_t(block), type)
              .ok());
      std::vector<uint8_t> buffer(block * es * size_t(n), 0xee);
      std::memcpy(buffer.data() + size_t(r) * block * es, part.data(),
                  part.size());
      EXPECT_TRUE(
          comm->allGatherInPlace(buffer.data(), int64_t(block), type).ok());
      EXPECT_TRUE(buffer == gathered);
      EXPECT_EQ(comm->counters().allGather,
                2 * ringAllGatherBytes(block * es * size_t(n), n));
    }
}

//===----------------------------------------------------------------------===//
// Executor: rank-relative refs and in-place instructions
//===----------------------------------------------------------------------===//

namespace {

/// Runs shardedBuckets(tp, dp) on this rank with MPI communicators: fills
/// every bucket with this rank's input, runs the out-of-place and in-place
/// functions and checks results and byte counters.
void checkShardedBuckets(int tp, int dp, bool bf16, bool exact) {
  const int64_t block = 777;
  const int r = worldRank();
  const int dpIndex = r / tp, tpIndex = r % tp;
  std::vector<int> members;
  for (int d = 0; d < dp; ++d)
    members.push_back(d * tp + tpIndex);
  const fb::DType dtype = bf16 ? fb::DType::BF16 : fb::DType::F32;
  const size_t es = bf16 ? 2 : 4;
  auto loaded = LoadedArtifact::loadFromMemory(
      buildFile(buildPayload(shardedBuckets(tp, dp, block, dtype))),
      "buckets.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return;
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  auto set = createMpiCommunicators(*(*loaded)->root());
  EXPECT_TRUE(set.ok()) << set.status().toString();
  if (!set.ok())
    return;
  ExecutorOptions options;
  options.profile = true;
  options.trace = true;
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(*set), r, options);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return;
  Executor &e = **ex;
  EXPECT_TRUE(e.initializeParameters().ok());

  const std::vector<float> input = inputOf(r, size_t(block * dp), exact, bf16);
  std::vector<uint8_t> bytes = bytesOf(input, bf16);
  for (const char *name : {"grad", "grad.ref", "grad.async"})
    EXPECT_TRUE(e.writeBuffer(name, bytes.data(), int64_t(bytes.size())).ok());
  // All-gather inputs: this rank's block of `input`; elsewhere in "param"
  // garbage that the gather must overwrite.
  std::vector<float> mine(input.begin() + long(dpIndex * block),
                          input.begin() + long((dpIndex + 1) * block));
  std::vector<float> param(size_t(block * dp), -1234.5f);
  std::copy(mine.begin(), mine.end(), param.begin() + long(dpIndex * block));
  std::vector<uint8_t> mineBytes = bytesOf(mine, bf16),
                       paramBytes = bytesOf(param, bf16);
  EXPECT_TRUE(
      e.writeBuffer("param.src", mineBytes.data(), int64_t(mineBytes.size()))
          .ok());
  EXPECT_TRUE(
      e.writeBuffer("param", paramBytes.data(), int64_t(paramBytes.size()))
          .ok());
  EXPECT_TRUE(
      e.writeBuffer("param.sync", paramBytes.data(), int64_t(paramBytes.size()))
          .ok());

  // Runs `fn` and returns the dp bytes it counted.
  auto run = [&](const char *fn) -> CommCounters {
    CommCounters before = e.commCounters()["dp"];
    Status st = e.runFunction(fn);
    EXPECT_TRUE(st.ok()) << fn << ": " << st.toString();
    return e.commCounters()["dp"] - before;
  };
  CommCounters rsRef = run("rs.ref"), rs = run("rs"), rsa = run("rsa");
  CommCounters agRef = run("ag.ref"), ag = run("ag");
  // overlap_param_gather: the gather outlives "ps.start"; "ps.wait"
  // finishes it, and does nothing when none is in flight.
  CommCounters ps = run("ps.start");
  EXPECT_TRUE(e.paramSyncInFlight());
  run("ps.wait");
  EXPECT_FALSE(e.paramSyncInFlight());
  run("ps.wait");
  EXPECT_EQ(ps.allGather, agRef.allGather);
  EXPECT_EQ(rs.reduceScatter, rsRef.reduceScatter);
  EXPECT_EQ(rsa.reduceScatter, rsRef.reduceScatter);
  EXPECT_EQ(rsRef.reduceScatter,
            ringReduceScatterBytes(uint64_t(block * dp) * es, dp));
  EXPECT_EQ(ag.allGather, agRef.allGather);
  EXPECT_EQ(agRef.allGather, ringAllGatherBytes(uint64_t(block * dp) * es, dp));

  auto floats = [&](const char *name) {
    auto v = e.readFloatBuffer(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : std::vector<float>();
  };
  auto myBlock = [&](const std::vector<float> &v) {
    if (v.size() != size_t(block * dp))
      return std::vector<float>();
    return std::vector<float>(v.begin() + long(dpIndex * block),
                              v.begin() + long((dpIndex + 1) * block));
  };
  std::vector<float> shardRef = floats("shard.ref");
  std::vector<float> inPlace = myBlock(floats("grad"));
  std::vector<float> started = myBlock(floats("grad.async"));
  expectReducedBlock(shardRef, members, size_t(block), size_t(dpIndex), exact,
                     bf16, "ReduceScatter out of place");
  expectReducedBlock(inPlace, members, size_t(block), size_t(dpIndex), exact,
                     bf16, "ReduceScatter in place");
  expectReducedBlock(started, members, size_t(block), size_t(dpIndex), exact,
                     bf16, "ReduceScatterStart in place");
  if (exact) {
    EXPECT_EQ(inPlace, shardRef);
    EXPECT_EQ(started, shardRef);
  }
  // The gather copies bits: every block is its member's input block.
  std::vector<float> gathered = floats("param"), gatheredRef = floats("param.ref");
  EXPECT_EQ(gathered, gatheredRef);
  EXPECT_EQ(floats("param.sync"), gatheredRef);
  // A start finished by finishParamSync (what a checkpoint save does).
  run("ps.start");
  EXPECT_TRUE(e.finishParamSync().ok());
  EXPECT_FALSE(e.paramSyncInFlight());
  EXPECT_EQ(floats("param.sync"), gatheredRef);
  for (int d = 0; d < dp && gathered.size() == size_t(block * dp); ++d) {
    std::vector<float> theirs = inputOf(members[size_t(d)],
                                        size_t(block * dp), exact, bf16);
    EXPECT_TRUE(std::equal(gathered.begin() + long(d * block),
                           gathered.begin() + long((d + 1) * block),
                           theirs.begin() + long(d * block)))
        << "block " << d;
  }

  // Profile and trace name the instructions by opcode.
  for (const char *op : {"ReduceScatter", "ReduceScatterStart", "AllGather",
                         "ParamSyncStart", "ParamSyncWait"})
    EXPECT_TRUE(e.kernelSeconds().count(op)) << op;
  int collectives = 0;
  for (const TraceEvent &ev : e.traceEvents())
    collectives += ev.track == "communication" &&
                   (ev.name == "ReduceScatter" ||
                    ev.name == "ReduceScatterStart" || ev.name == "AllGather");
  EXPECT_EQ(collectives, 5); // rs.ref, rs, rsa's start, ag.ref, ag
}

} // namespace

TEST(InPlaceExecutorTest, BucketsOverDp) {
  const int n = worldSize();
  std::vector<std::pair<int, int>> layouts = {{1, n}};
  if (n == 4)
    layouts.push_back({2, 2}); // dp index != world rank
  for (auto [tp, dp] : layouts)
    for (bool bf16 : {false, true})
      for (bool exact : {true, false}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp) +
                     (bf16 ? " bf16" : " f32") +
                     (exact ? " integers" : " normals"));
        checkShardedBuckets(tp, dp, bf16, exact);
      }
}

// A shard at block 0 on every rank (stride 0) is rank 0's in-place
// all-gather but overlaps the bucket wrongly on every other rank: those fail
// to decode, naming the instruction (create runs no collective, so the
// ranks may disagree).
TEST(InPlaceExecutorTest, ShardOutsideTheRanksBlockFailsToDecode) {
  const int n = worldSize(), r = worldRank();
  ArtifactDesc desc = shardedBuckets(1, n, 16);
  ProgramDesc &p = desc.programs[0];
  RefDesc param = p.ref(4);
  RefDesc first{param.offset, {16}, fb::DType::F32, "dp", 0};
  InstrDesc ag = instr(fb::Opcode::AllGather, {first, param}, "ag.block0");
  ag.group = "dp";
  p.function("ag").push_back(ag);
  auto loaded = LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)),
                                               "block0.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return;
  auto set = createMpiCommunicators(*(*loaded)->root());
  EXPECT_TRUE(set.ok());
  if (!set.ok())
    return;
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      std::move(*set), r);
  if (r == 0) {
    EXPECT_TRUE(ex.ok()) << ex.status().toString();
    return;
  }
  EXPECT_FALSE(ex.ok());
  if (ex.ok())
    return;
  const std::string &msg = ex.status().message();
  std::string blockAt = std::to_string(param.offset + r * 64);
  for (std::string needle :
       {std::string("block0.tsr"),
        std::string("function 'ag' instruction 1 (AllGather at ag.block0)"),
        "but is not this rank's block of it (dp index " + std::to_string(r) +
            ": bytes " + blockAt})
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

