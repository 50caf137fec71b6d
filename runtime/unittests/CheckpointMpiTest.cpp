//===- CheckpointMpiTest.cpp - Mixed-precision checkpoints over MPI -------===//
//
// Every rank saves its shard of a bf16 model with fp32 main params in one
// tp x dp layout and loads the checkpoint into another: the per-parameter
// main params reshard with their parameter (each rank assembles its rows
// from the shards of other ranks' files), "init" is skipped when the main
// params were restored, and recomputes them from the parameters with
// --no-load-optim.
//
// Every rank runs the whole suite (under mpirun -n 2 and -n 4); the exit
// code is the maximum over ranks. Tests avoid ASSERT_* between collectives
// so that a failing rank never leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

int worldRank() { return tessera::rt::test::mpiWorldRank(); }
int worldSize() { return tessera::rt::test::mpiWorldSize(); }

constexpr int64_t kRows = 8, kCols = 3;

/// world = tp * dp (tp innermost): bf16 "w" [kRows, kCols] split by rows
/// over tp and a replicated bf16 "b" [kCols], their fp32 main params
/// (MainParam, the parameters' layouts), Adam state of w, the iteration and
/// an "init" that casts the parameters into the main params.
ArtifactDesc mixedTpModel(int tp, int dp) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.worldSize = tp * dp;
  a.mesh = {{"tp", tp}, {"dp", dp}, {"pp", 1}};
  addTpDpGroups(a, tp, dp);
  for (int r = 0; r < tp * dp; ++r)
    a.groups.push_back({"pp", {r}});
  a.microBatch = 8 / dp;
  a.globalBatch = 8;
  ProgramDesc p;
  auto sharded = [&](int index) {
    BufferDesc &b = p.buffers[size_t(index)];
    b.globalShape = {kRows, kCols};
    b.shardDim = 0;
    b.shardAxis = "tp";
  };
  int w = p.add("w", K::Param, {kRows / tp, kCols}, fb::DType::BF16,
                fb::InitKind::Normal, 1.0f);
  sharded(w);
  int b = p.add("b", K::Param, {kCols}, fb::DType::BF16, fb::InitKind::Normal,
                1.0f);
  int mw = p.add("main:w", K::MainParam, {kRows / tp, kCols}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, w);
  sharded(mw);
  int mb = p.add("main:b", K::MainParam, {kCols}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, b);
  int m = p.add("adam.exp_avg:w", K::OptState, {kRows / tp, kCols},
                fb::DType::F32, fb::InitKind::Zeros, 0.0f, w);
  sharded(m);
  p.iterationBuffer = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  auto &init = p.function("init");
  init.push_back(instr(O::Cast, {p.ref(w), p.ref(mw)}, "main.w"));
  init.push_back(instr(O::Cast, {p.ref(b), p.ref(mb)}, "main.b"));
  p.function("microbatch");
  p.function("step");
  a.programs.push_back(std::move(p));
  return a;
}

/// Global element (r, c) of each tensor: distinct values, main params not
/// representable in bf16 (so that a main param recomputed from its bf16
/// parameter would differ).
float mainValue(int64_t r, int64_t c) {
  return 1000.0f + float(r * kCols + c) + 0.3f;
}
float paramValue(int64_t r, int64_t c) {
  return float(r * kCols + c) * 0.125f - 1.0f;
}
float stateValue(int64_t r, int64_t c) { return float(r * kCols + c) * 0.5f; }

/// This rank's rows of the global function `f` for a layout of `tp`.
std::vector<float> localRows(int tp, float (*f)(int64_t, int64_t)) {
  int t = worldRank() % tp;
  std::vector<float> out;
  for (int64_t r = t * kRows / tp; r < (t + 1) * kRows / tp; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      out.push_back(f(r, c));
  return out;
}

std::vector<uint16_t> bf16Of(const std::vector<float> &v) {
  std::vector<uint16_t> h(v.size());
  floatsToBf16(v.data(), h.data(), int64_t(v.size()));
  return h;
}

std::unique_ptr<Executor> makeExecutor(const ArtifactDesc &desc,
                                       const std::string &name) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return nullptr;
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  auto ex = Executor::create(
      *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
      CommunicatorSet(), worldRank());
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  return std::move(*ex);
}

std::unique_ptr<Communicator> worldComm() {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  auto c = createMpiCommunicator(dup);
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

/// A directory every rank sees: created by rank 0, broadcast.
std::string sharedTempDir() {
  char path[256] = {};
  if (worldRank() == 0) {
    char tmpl[] = "/tmp/tessera-ckpt-mpi-XXXXXX";
    if (mkdtemp(tmpl))
      std::strncpy(path, tmpl, sizeof(path) - 1);
  }
  MPI_Bcast(path, int(sizeof(path)), MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

void removeSharedTempDir(const std::string &dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (worldRank() == 0 && !dir.empty())
    (void)std::system(("rm -rf '" + dir + "'").c_str());
}

} // namespace

TEST(CheckpointMpiTest, MainParamsReshardWithTheirParameter) {
  const int n = worldSize();
  const std::string dir = sharedTempDir();
  EXPECT_FALSE(dir.empty());
  auto world = worldComm();
  // Saved at tp = 2 (dp = n / 2).
  const int savedTp = 2;
  {
    auto ex = makeExecutor(mixedTpModel(savedTp, n / savedTp), "saved.tsr");
    if (ex) {
      EXPECT_TRUE(ex->runInit().ok());
      std::vector<float> main = localRows(savedTp, mainValue),
                         state = localRows(savedTp, stateValue);
      std::vector<uint16_t> w = bf16Of(localRows(savedTp, paramValue));
      EXPECT_TRUE(
          ex->writeBuffer("main:w", main.data(), int64_t(main.size() * 4))
              .ok());
      EXPECT_TRUE(ex->writeBuffer("adam.exp_avg:w", state.data(),
                                  int64_t(state.size() * 4))
                      .ok());
      EXPECT_TRUE(ex->writeBuffer("w", w.data(), int64_t(w.size() * 2)).ok());
      CheckpointSaveOptions so;
      so.dir = dir;
      so.info.iteration = 4;
      so.info.seed = 1234;
      auto saved = saveCheckpoint(*ex, so, world.get());
      EXPECT_TRUE(saved.ok()) << saved.status().toString();
    }
  }
  // Loaded at tp = 1 (every rank assembles w and main:w from both shards)
  // and at tp = n.
  for (int tp : {1, n}) {
    SCOPED_TRACE(testing::Message() << "load at tp=" << tp);
    auto ex = makeExecutor(mixedTpModel(tp, n / tp), "loaded.tsr");
    if (!ex)
      continue;
    CheckpointLoadOptions lo;
    auto loaded = loadCheckpoint(*ex, dir, lo, world.get());
    EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
    if (!loaded.ok())
      continue;
    EXPECT_EQ(loaded->resharded, tp != savedTp);
    EXPECT_EQ(*ex->readFloatBuffer("main:w"), localRows(tp, mainValue));
    EXPECT_EQ(*ex->readFloatBuffer("adam.exp_avg:w"),
              localRows(tp, stateValue));
    std::vector<uint16_t> w = bf16Of(localRows(tp, paramValue));
    std::vector<float> widened(w.size());
    bf16ToFloats(w.data(), widened.data(), int64_t(w.size()));
    auto raw = ex->readBuffer("w");
    EXPECT_TRUE(raw.ok() && raw->size() == w.size() * 2 &&
                std::memcmp(raw->data(), w.data(), raw->size()) == 0);
    EXPECT_EQ(*ex->readFloatBuffer("w"), widened);
    // Every main param restored: "init" is skipped.
    auto ran = ex->runInit();
    EXPECT_TRUE(ran.ok() && !*ran);
    EXPECT_EQ(*ex->readFloatBuffer("main:w"), localRows(tp, mainValue));

    // --no-load-optim: "init" recomputes the main params from the loaded
    // bf16 parameters.
    auto paramsOnly = makeExecutor(mixedTpModel(tp, n / tp), "loaded.tsr");
    if (!paramsOnly)
      continue;
    lo.loadOptimizer = false;
    loaded = loadCheckpoint(*paramsOnly, dir, lo, world.get());
    EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
    ran = paramsOnly->runInit();
    EXPECT_TRUE(ran.ok() && *ran);
    EXPECT_EQ(*paramsOnly->readFloatBuffer("main:w"), widened);
  }
  removeSharedTempDir(dir);
}
