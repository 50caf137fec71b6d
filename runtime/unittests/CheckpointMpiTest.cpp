//===- CheckpointMpiTest.cpp - Mixed-precision checkpoints over MPI -------===//
//
// Every rank saves its shard of a bf16 model with fp32 main params in one
// tp x dp layout and loads the checkpoint into another: the per-parameter
// main params reshard with their parameter (each rank assembles its rows
// from the shards of other ranks' files), "init" is skipped when the main
// params were restored, and recomputes them from the parameters with
// --no-load-optim. The distributed optimizer's bucket shards of Adam state
// and main params, saved at one tp x dp and bucket layout, load into
// another and into per-parameter state (and back), element by element.
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

//===----------------------------------------------------------------------===//
// Distributed-optimizer state in another configuration
//===----------------------------------------------------------------------===//

namespace {

constexpr int64_t kB = 5;
/// Adam's two moments and the fp32 main params.
const char *const kStates[] = {"adam.exp_avg:", "adam.exp_avg_sq:", "main:"};

/// A parameter bucket of the distributed optimizer: its view and the
/// parameters in it (element offsets, 64-aligned).
struct BucketSpec {
  std::string name;
  int64_t numel;
  std::vector<std::pair<std::string, int64_t>> params;
};

/// One bucket of 128 elements (w at 0, b at 64), or (`split`) two of 64:
/// b in "pbuf:gb:0", w in "pbuf:gb:1".
std::vector<BucketSpec> bucketsOf(bool split) {
  if (split)
    return {{"pbuf:gb:0", 64, {{"b", 0}}}, {"pbuf:gb:1", 64, {{"w", 0}}}};
  return {{"pbuf:gb:0", 128, {{"w", 0}, {"b", 64}}}};
}

int64_t localNumel(const std::string &param, int tp) {
  return param == "w" ? kRows / tp * kCols : kB;
}

/// Global (row-major) element index of element `l` of this rank's shard
/// of `param` at `tp`.
int64_t globalIndex(const std::string &param, int tp, int64_t l) {
  return param == "w" ? (worldRank() % tp) * localNumel("w", tp) + l : l;
}

/// Element g of the global state `s` (kStates) of `param`: distinct, not
/// representable in bf16.
float stateOf(int s, const std::string &param, int64_t g) {
  return 100.0f * float(s + 1) + (param == "w" ? 0.0f : 60.0f) + float(g) +
         0.3f;
}
float paramOf(const std::string &param, int64_t g) {
  return (param == "w" ? 0.0f : 40.0f) + float(g) * 0.37f - 1.0f;
}

/// This rank's 1/dp of bucket `k`'s flat state `s`; `pad` between and
/// after the parameters.
std::vector<float> flatShard(int tp, int dp, bool split, size_t k, int s,
                             float pad) {
  const BucketSpec bucket = bucketsOf(split)[k];
  const int64_t per = bucket.numel / dp, lo = per * (worldRank() / tp);
  std::vector<float> out(size_t(per), pad);
  for (const auto &[param, start] : bucket.params)
    for (int64_t l = 0; l < localNumel(param, tp); ++l)
      if (start + l >= lo && start + l < lo + per)
        out[size_t(start + l - lo)] = stateOf(s, param, globalIndex(param, tp, l));
  return out;
}

/// This rank's shard of a parameter's state `s` at `tp` (s = -1: the
/// parameter).
std::vector<float> localState(int tp, int s, const std::string &param) {
  std::vector<float> out;
  for (int64_t l = 0; l < localNumel(param, tp); ++l) {
    int64_t g = globalIndex(param, tp, l);
    out.push_back(s < 0 ? paramOf(param, g) : stateOf(s, param, g));
  }
  return out;
}

void setGroups(ArtifactDesc &a, int tp, int dp) {
  a.worldSize = tp * dp;
  a.mesh = {{"tp", tp}, {"dp", dp}, {"pp", 1}};
  addTpDpGroups(a, tp, dp);
  for (int r = 0; r < tp * dp; ++r)
    a.groups.push_back({"pp", {r}});
  a.microBatch = 8 / dp;
  a.globalBatch = 8;
}

/// The distributed optimizer at tp x dp: bf16 "w" [kRows, kCols] split by
/// rows over tp and a replicated bf16 "b" [kB] in the parameter buckets of
/// bucketsOf(split) (views of their memory), with this rank's 1/dp of each
/// bucket's Adam state and fp32 main params.
ArtifactDesc distOptModel(int tp, int dp, bool split) {
  using K = fb::BufferKind;
  ArtifactDesc a;
  setGroups(a, tp, dp);
  ProgramDesc p;
  // The buckets' memory: elements [0, 128) of bf16; w at 0, b at 64.
  auto param = [&](const std::string &name, std::vector<int64_t> shape,
                   int64_t element) {
    BufferDesc b;
    b.name = name;
    b.kind = K::Param;
    b.dtype = fb::DType::BF16;
    b.shape = b.globalShape = shape;
    b.init = fb::InitKind::Normal;
    b.initScale = 1.0f;
    b.offset = element * 2;
    p.buffers.push_back(b);
    return int(p.buffers.size()) - 1;
  };
  int w = param("w", {kRows / tp, kCols}, 0);
  p.buffers[size_t(w)].globalShape = {kRows, kCols};
  p.buffers[size_t(w)].shardDim = 0;
  p.buffers[size_t(w)].shardAxis = "tp";
  param("b", {kB}, 64);
  p.arenaBytes = 256;
  std::vector<BucketSpec> buckets = bucketsOf(split);
  for (const BucketSpec &bucket : buckets) {
    BufferDesc view;
    view.name = bucket.name;
    view.kind = K::View;
    view.dtype = fb::DType::BF16;
    view.shape = view.globalShape = {bucket.numel};
    view.offset = 2 * (bucket.params[0].first == "b" && split ? 64 : 0);
    p.buffers.push_back(view);
    int v = int(p.buffers.size()) - 1;
    for (int s = 0; s < 2; ++s)
      p.add(kStates[s] + bucket.name, K::OptState, {bucket.numel / dp},
            fb::DType::F32, fb::InitKind::Zeros, 0.0f, v);
    p.add("main:" + bucket.name, K::MainParam, {bucket.numel / dp},
          fb::DType::F32);
  }
  p.iterationBuffer = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  p.function("microbatch");
  p.function("step");
  a.programs.push_back(std::move(p));
  return a;
}

/// Per-parameter state at tp x dp: "w" (split by rows over tp) and "b",
/// their Adam moments and, `mixed`, bf16 parameters with fp32 main params.
ArtifactDesc perParamModel(int tp, int dp, bool mixed) {
  using K = fb::BufferKind;
  ArtifactDesc a;
  setGroups(a, tp, dp);
  ProgramDesc p;
  const fb::DType pt = mixed ? fb::DType::BF16 : fb::DType::F32;
  auto sharded = [&](int index) {
    BufferDesc &b = p.buffers[size_t(index)];
    b.globalShape = {kRows, kCols};
    b.shardDim = 0;
    b.shardAxis = "tp";
  };
  int w = p.add("w", K::Param, {kRows / tp, kCols}, pt, fb::InitKind::Normal,
                1.0f);
  sharded(w);
  int b = p.add("b", K::Param, {kB}, pt, fb::InitKind::Normal, 1.0f);
  for (int s = 0; s < 3; ++s) {
    if (s == 2 && !mixed)
      break;
    K kind = s == 2 ? K::MainParam : K::OptState;
    sharded(p.add(kStates[s] + std::string("w"), kind, {kRows / tp, kCols},
                  fb::DType::F32, fb::InitKind::Zeros, 0.0f, w));
    p.add(kStates[s] + std::string("b"), kind, {kB}, fb::DType::F32,
          fb::InitKind::Zeros, 0.0f, b);
  }
  p.iterationBuffer = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  p.function("microbatch");
  p.function("step");
  a.programs.push_back(std::move(p));
  return a;
}

/// Writes the global state of stateOf / paramOf into `ex` (a model of
/// distOptModel(tp, dp, split) when `distOpt`, else perParamModel(tp, dp,
/// mixed)), with garbage in the buckets' padding.
void fill(Executor &ex, int tp, int dp, bool distOpt, bool split, bool mixed) {
  for (const char *param : {"w", "b"}) {
    std::vector<float> v = localState(tp, -1, param);
    if (mixed || distOpt) {
      std::vector<uint16_t> h = bf16Of(v);
      EXPECT_TRUE(ex.writeBuffer(param, h.data(), int64_t(h.size() * 2)).ok());
    } else {
      EXPECT_TRUE(ex.writeBuffer(param, v.data(), int64_t(v.size() * 4)).ok());
    }
  }
  for (int s = 0; s < 3; ++s) {
    if (distOpt) {
      std::vector<BucketSpec> buckets = bucketsOf(split);
      for (size_t k = 0; k < buckets.size(); ++k) {
        std::vector<float> v = flatShard(tp, dp, split, k, s, -777.0f);
        EXPECT_TRUE(ex.writeBuffer(kStates[s] + buckets[k].name, v.data(),
                                   int64_t(v.size() * 4))
                        .ok());
      }
    } else if (s < 2 || mixed) {
      for (const char *param : {"w", "b"}) {
        std::vector<float> v = localState(tp, s, param);
        EXPECT_TRUE(ex.writeBuffer(kStates[s] + std::string(param), v.data(),
                                   int64_t(v.size() * 4))
                        .ok());
      }
    }
  }
}

/// Checks element by element that `ex` holds the global state where its
/// layout puts it (padding `pad`: zero, or what was saved when loaded as
/// saved); `mainFromParams`: the main params are the (f32) parameters.
void expectState(Executor &ex, int tp, int dp, bool distOpt, bool split,
                 bool mixed, bool mainFromParams, float pad) {
  for (int s = 0; s < 3; ++s) {
    if (distOpt) {
      std::vector<BucketSpec> buckets = bucketsOf(split);
      for (size_t k = 0; k < buckets.size(); ++k) {
        std::vector<float> want = flatShard(tp, dp, split, k, s, pad);
        if (s == 2 && mainFromParams) {
          // stateOf(2, ...) replaced by paramOf in the expected shard.
          const BucketSpec &bucket = buckets[k];
          const int64_t per = bucket.numel / dp, lo = per * (worldRank() / tp);
          for (const auto &[param, start] : bucket.params)
            for (int64_t l = 0; l < localNumel(param, tp); ++l)
              if (start + l >= lo && start + l < lo + per)
                want[size_t(start + l - lo)] =
                    paramOf(param, globalIndex(param, tp, l));
        }
        EXPECT_EQ(*ex.readFloatBuffer(kStates[s] + buckets[k].name), want)
            << kStates[s] << buckets[k].name << " on rank " << worldRank();
      }
    } else if (s < 2 || mixed) {
      for (const char *param : {"w", "b"})
        EXPECT_EQ(*ex.readFloatBuffer(kStates[s] + std::string(param)),
                  mainFromParams && s == 2 ? localState(tp, -1, param)
                                           : localState(tp, s, param))
            << kStates[s] << param << " on rank " << worldRank();
    }
  }
  // The parameters: bf16 of the values.
  for (const char *param : {"w", "b"}) {
    std::vector<uint16_t> h = bf16Of(localState(tp, -1, param));
    std::vector<float> widened(h.size());
    bf16ToFloats(h.data(), widened.data(), int64_t(h.size()));
    if (mixed || distOpt)
      EXPECT_EQ(*ex.readFloatBuffer(param), widened) << param;
  }
}

struct Config {
  int tp;
  bool distOpt, split, mixed;
};

/// Saves `from` (world n) and loads it into every configuration of `to`.
void saveAndLoad(const Config &from, const std::vector<Config> &to) {
  const int n = worldSize();
  const std::string dir = sharedTempDir();
  EXPECT_FALSE(dir.empty());
  auto world = worldComm();
  auto modelOf = [&](const Config &c) {
    return c.distOpt ? distOptModel(c.tp, n / c.tp, c.split)
                     : perParamModel(c.tp, n / c.tp, c.mixed);
  };
  {
    auto ex = makeExecutor(modelOf(from), "saved.tsr");
    if (ex) {
      fill(*ex, from.tp, n / from.tp, from.distOpt, from.split, from.mixed);
      CheckpointSaveOptions so;
      so.dir = dir;
      so.info.iteration = 3;
      so.info.seed = 1234;
      auto saved = saveCheckpoint(*ex, so, world.get());
      EXPECT_TRUE(saved.ok()) << saved.status().toString();
    }
  }
  for (const Config &c : to) {
    SCOPED_TRACE(testing::Message()
                 << "load at tp=" << c.tp << " distOpt=" << c.distOpt
                 << " split=" << c.split << " mixed=" << c.mixed);
    auto ex = makeExecutor(modelOf(c), "loaded.tsr");
    if (!ex)
      continue;
    auto loaded = loadCheckpoint(*ex, dir, CheckpointLoadOptions(), world.get());
    EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
    if (!loaded.ok())
      continue;
    bool same = c.tp == from.tp && c.distOpt == from.distOpt &&
                c.split == from.split && c.mixed == from.mixed;
    EXPECT_EQ(loaded->resharded, !same);
    bool mainFromParams = !from.distOpt && !from.mixed;
    expectState(*ex, c.tp, n / c.tp, c.distOpt, c.split, c.mixed,
                mainFromParams, same ? -777.0f : 0.0f);
    // Every main param restored: "init" is skipped.
    if (c.distOpt || c.mixed) {
      auto ran = ex->runInit();
      EXPECT_TRUE(ran.ok() && !*ran);
    }
  }
  removeSharedTempDir(dir);
}

} // namespace

TEST(CheckpointMpiTest, DistributedOptimizerStateReshards) {
  const int n = worldSize();
  // Saved with the distributed optimizer at dp = n, one bucket: as saved,
  // into another bucket layout, into tp = 2 (dp = n / 2) with either
  // layout, and into per-parameter state at tp = 1 and tp = 2.
  saveAndLoad({1, true, false, true}, {{1, true, false, true},
                                       {1, true, true, true},
                                       {2, true, false, true},
                                       {2, true, true, true},
                                       {1, false, false, true},
                                       {2, false, false, true}});
  // Saved at tp = 2 x dp = n / 2, two buckets: into dp = n.
  saveAndLoad({2, true, true, true}, {{1, true, false, true},
                                      {n, false, false, true}});
  // Per-parameter bf16 state at tp = 2 into the distributed optimizer at
  // dp = n and dp = n / 2.
  saveAndLoad({2, false, false, true}, {{1, true, true, true},
                                        {2, true, false, true}});
  // An fp32 checkpoint (no main params): the main-param shards are its f32
  // parameters.
  saveAndLoad({1, false, false, false}, {{1, true, false, true},
                                         {2, true, true, true}});
}
