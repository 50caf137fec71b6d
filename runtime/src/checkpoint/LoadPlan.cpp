//===- LoadPlan.cpp - Checkpoint compatibility and resharding -------------===//
//
// The load planner (tessera/rt/checkpoint/LoadPlan.h). From the manifest of
// a checkpoint and the target artifact's own description it checks that
// the checkpoint can be loaded (parameter set and global shapes, optimizer,
// global batch, seed, distributed-optimizer bucket layouts) and plans, per
// buffer of one rank, the boxes of saved tensors that make it up:
// resharding through global shapes, per-parameter views of the
// distributed optimizer's bucket shards (savedTensors), and F32 <-> BF16
// parameters and main params. Pure except checkCheckpointForLaunch, which
// also reads the manifest and the shard headers before tessera-run starts
// the job.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/checkpoint/LoadPlan.h"

#include "Layout.h"
#include "Strings.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/Data.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>

namespace tessera::rt {

using ckpt::endsWith;
using ckpt::hex32;
using ckpt::isOptimizerKind;
using ckpt::isSavedKind;
using ckpt::kMainPrefix;
using ckpt::layoutOf;
using ckpt::nameOf;
using ckpt::paramLayout;
using ckpt::ppStage;
using ckpt::shapeString;
using ckpt::TensorLayout;

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

int64_t TensorBox::volume() const {
  int64_t v = 1;
  for (size_t d = 0; d < lo.size(); ++d)
    v *= std::max<int64_t>(0, hi[d] - lo[d]);
  return v;
}

TensorBox shardBox(const std::vector<int64_t> &globalShape, int dim, int index,
                   int count) {
  TensorBox box;
  box.lo.assign(globalShape.size(), 0);
  box.hi = globalShape;
  if (dim >= 0 && dim < int(globalShape.size()) && count > 1) {
    int64_t size = globalShape[size_t(dim)] / count;
    box.lo[size_t(dim)] = size * index;
    box.hi[size_t(dim)] = size * (index + 1);
  }
  return box;
}

TensorBox shardBox(const ManifestTensor &t, int j) {
  const int n2 = std::max(t.numShards2, 1);
  TensorBox box = shardBox(t.globalShape, t.shardDim, j / n2, t.numShards / n2);
  if (t.shard2Dim >= 0 && n2 > 1) {
    const int64_t size = t.globalShape[size_t(t.shard2Dim)] / n2;
    box.lo[size_t(t.shard2Dim)] = size * (j % n2);
    box.hi[size_t(t.shard2Dim)] = size * (j % n2 + 1);
  }
  return box;
}

/// The block of the global tensor layout `l` holds.
static TensorBox layoutBox(const TensorLayout &l) {
  TensorBox box = shardBox(l.global, l.shardDim, l.index, l.count);
  if (l.shardDim2 >= 0 && l.count2 > 1) {
    const int64_t size = l.global[size_t(l.shardDim2)] / l.count2;
    box.lo[size_t(l.shardDim2)] = size * l.index2;
    box.hi[size_t(l.shardDim2)] = size * (l.index2 + 1);
  }
  return box;
}

static bool intersectBoxes(const TensorBox &a, const TensorBox &b,
                           TensorBox &out) {
  out.lo.resize(a.lo.size());
  out.hi.resize(a.lo.size());
  for (size_t d = 0; d < a.lo.size(); ++d) {
    out.lo[d] = std::max(a.lo[d], b.lo[d]);
    out.hi[d] = std::min(a.hi[d], b.hi[d]);
    if (out.lo[d] >= out.hi[d])
      return false;
  }
  return true;
}

void copyTensorBox(const uint8_t *src, const TensorBox &srcBox, uint8_t *dst,
                   const TensorBox &dstBox, const TensorBox &region,
                   int64_t elementSize) {
  size_t rank = region.lo.size();
  if (srcBox == region && dstBox == region) {
    std::memcpy(dst, src, size_t(region.volume() * elementSize));
    return;
  }
  if (rank == 0) {
    std::memcpy(dst, src, size_t(elementSize));
    return;
  }
  // Row-major strides (elements) of both boxes.
  std::vector<int64_t> srcStride(rank, 1), dstStride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    srcStride[d - 1] = srcStride[d] * (srcBox.hi[d] - srcBox.lo[d]);
    dstStride[d - 1] = dstStride[d] * (dstBox.hi[d] - dstBox.lo[d]);
  }
  int64_t run = (region.hi[rank - 1] - region.lo[rank - 1]) * elementSize;
  std::vector<int64_t> idx(region.lo.begin(), region.lo.end());
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      s += (idx[d] - srcBox.lo[d]) * srcStride[d];
      t += (idx[d] - dstBox.lo[d]) * dstStride[d];
    }
    std::memcpy(dst + t * elementSize, src + s * elementSize, size_t(run));
    // Next index over the leading dimensions.
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < region.hi[d])
        break;
      idx[d] = region.lo[d];
      if (d == 0)
        return;
    }
    if (rank == 1)
      return;
  }
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

namespace {

/// Why the seed still matters once the checkpoint is loaded ("" if it does
/// not).
std::string seedDependence(const LoadedArtifact &artifact, bool loadOptimizer) {
  for (const fb::Program *p : *artifact.root()->programs()) {
    if (p->inputs())
      for (const fb::InputSpec *spec : *p->inputs())
        if (!isTokenInput(*spec))
          return "the synthetic input '" +
                 (spec->name() ? spec->name()->str() : std::string()) +
                 "' is drawn from it";
    if (p->functions())
      for (const fb::Function *fn : *p->functions())
        if (fn->instrs())
          for (const fb::Instr *in : *fn->instrs())
            if (in->op() == fb::Opcode::Dropout)
              return "the model has dropout, whose masks are keyed by it";
    for (const fb::Buffer *b : *p->buffers()) {
      bool restored = b->kind() == fb::BufferKind::Param ||
                      b->kind() == fb::BufferKind::Iteration ||
                      (loadOptimizer && b->kind() == fb::BufferKind::OptState);
      if (!restored && (b->init() == fb::InitKind::Normal ||
                        b->init() == fb::InitKind::Uniform))
        return "buffer '" + nameOf(*b) +
               "' is initialised from it and not restored";
    }
  }
  return "";
}

/// The members of the instance of group `kind` holding `rank` in the
/// manifest and the rank's index in it (null when no instance holds it).
const std::vector<int> *manifestGroup(const CheckpointManifest &m,
                                      const std::string &kind, int rank,
                                      int *index = nullptr) {
  auto it = m.groups.find(kind);
  if (it == m.groups.end())
    return nullptr;
  for (const std::vector<int> &members : it->second)
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank) {
        if (index)
          *index = int(i);
        return &members;
      }
  return nullptr;
}

int manifestStage(const CheckpointManifest &m, int rank) {
  int index = 0;
  return manifestGroup(m, "pp", rank, &index) ? index : 0;
}

/// A saved distributed-optimizer bucket shard: "<prefix><bucket>" of one
/// rank, 1/dp of the bucket's flat elements.
bool isBucketShard(const ManifestTensor &t) {
  return t.distributedOptimizer && !t.reshardable && t.holders.size() == 1 &&
         t.globalShape.size() == 1 && t.shardDim == 0 && !t.param.empty() &&
         t.name.size() > t.param.size() && endsWith(t.name, t.param);
}

/// The checkpoint's tensors by name, as the planner reshards them: the
/// reshardable ones, plus per-parameter views of the distributed
/// optimizer's state. Bucket shard "<prefix><bucket>" (prefix "adam.exp_avg:",
/// "adam.exp_avg_sq:", "main:", ...) holds, for every parameter P laid out
/// in the bucket at [start, start + numel), part of the flattened local
/// state "<prefix>P" of P's shard on that rank; the dp group of a holder of
/// P's shard j together holds all of it. The views take P's layout; the
/// runs assemble shard j from the bucket shards of one such dp group (the
/// loading rank's own, when it is one).
struct SavedTensors {
  std::map<std::string, const ManifestTensor *> byName;
  std::deque<ManifestTensor> views;
  std::map<std::pair<std::string, int>, std::vector<FlatRun>> runs;
};

SavedTensors savedTensors(const CheckpointManifest &m, int preferRank) {
  SavedTensors s;
  for (const ManifestTensor &t : m.tensors)
    if (t.reshardable)
      s.byName[t.name] = &t;
  // Bucket shards by (name, stage, rank), and the prefixes of each bucket.
  std::map<std::tuple<std::string, int, int>, const ManifestTensor *> shards;
  std::map<std::pair<int, std::string>, std::map<std::string, fb::BufferKind>>
      prefixes;
  // The group whose ranks split each bucket (dp, dp-cp or edp).
  std::map<std::pair<int, std::string>, std::string> groupOf;
  for (const ManifestTensor &t : m.tensors)
    if (isBucketShard(t)) {
      shards[{t.name, t.stage, t.holders[0].first}] = &t;
      prefixes[{t.stage, t.param}][t.name.substr(
          0, t.name.size() - t.param.size())] = t.kind;
      groupOf[{t.stage, t.param}] = t.shardAxis.empty() ? "dp" : t.shardAxis;
    }
  for (const ManifestBucket &bucket : m.buckets) {
    auto pre = prefixes.find({bucket.stage, bucket.name});
    if (pre == prefixes.end())
      continue;
    for (const auto &[param, start, numel] : bucket.params) {
      auto pit = s.byName.find(param);
      if (pit == s.byName.end() || pit->second->kind != fb::BufferKind::Param)
        continue;
      const ManifestTensor &p = *pit->second;
      for (const auto &[prefix, kind] : pre->second) {
        std::string name = prefix + param;
        // Per-parameter state saved as such, or a view made from another
        // stage's bucket (a parameter shared across stages).
        if (s.byName.count(name))
          continue;
        ManifestTensor view;
        std::map<int, std::vector<FlatRun>> runsOf;
        const std::string &group = groupOf[{bucket.stage, bucket.name}];
        for (int j = 0; j < p.numShards; ++j) {
          // Holders of shard j on this bucket's stage; the one whose group
          // of the bucket holds the loading rank first.
          std::vector<int> holders;
          for (const auto &[q, index] : p.holders)
            if (index == j && manifestStage(m, q) == bucket.stage)
              holders.push_back(q);
          std::sort(holders.begin(), holders.end());
          std::stable_partition(holders.begin(), holders.end(), [&](int q) {
            const std::vector<int> *g = manifestGroup(m, group, q);
            return g && std::count(g->begin(), g->end(), preferRank);
          });
          for (int q : holders) {
            const std::vector<int> *g = manifestGroup(m, group, q);
            std::vector<int> members = g ? *g : std::vector<int>{q};
            std::vector<FlatRun> runs;
            int64_t covered = 0;
            bool complete = true;
            for (int member : members) {
              auto sh = shards.find({prefix + bucket.name, bucket.stage,
                                     member});
              if (sh == shards.end()) {
                complete = false;
                break;
              }
              const ManifestTensor &t = *sh->second;
              int64_t n = t.globalShape[0], per = n / t.numShards;
              int64_t lo = per * t.holders[0].second, hi = lo + per;
              int64_t a = std::max(lo, start), b = std::min(hi, start + numel);
              if (n != bucket.numel) {
                complete = false;
                break;
              }
              if (a >= b)
                continue;
              runs.push_back({member, t.name, a - lo, a - start, b - a});
              covered += b - a;
              view.dtype = t.dtype;
            }
            if (complete && covered == numel) {
              runsOf[j] = std::move(runs);
              break;
            }
          }
        }
        // Only a view that has every shard of the parameter.
        if (int(runsOf.size()) != p.numShards)
          continue;
        view.name = name;
        view.kind = kind;
        view.shape = p.shape;
        view.globalShape = p.globalShape;
        view.shardDim = p.shardDim;
        view.shardAxis = p.shardAxis;
        view.numShards = p.numShards;
        view.shard2Dim = p.shard2Dim;
        view.shard2Axis = p.shard2Axis;
        view.numShards2 = p.numShards2;
        view.param = param;
        view.distributedOptimizer = true;
        for (auto &[j, runs] : runsOf) {
          view.holders.emplace_back(runs.empty() ? 0 : runs[0].sourceRank, j);
          s.runs[{name, j}] = std::move(runs);
        }
        s.views.push_back(std::move(view));
        s.byName[name] = &s.views.back();
      }
    }
  }
  return s;
}

/// Same mesh and the same bucket layouts: distributed-optimizer state is
/// read back as saved, each rank its own shards.
bool sameBucketLayouts(const CheckpointManifest &m,
                       const CheckpointManifest &target) {
  bool sameMesh = m.worldSize == target.worldSize && m.mesh == target.mesh &&
                  m.order == target.order && m.vpp == target.vpp;
  if (!sameMesh)
    return false;
  auto sorted = [](std::vector<ManifestBucket> v) {
    std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
      return std::tie(a.stage, a.name) < std::tie(b.stage, b.name);
    });
    return v;
  };
  return sorted(m.buckets) == sorted(target.buckets);
}

struct ParamInfo {
  std::vector<int64_t> global;
  fb::DType dtype;
};

/// Parameter dtypes a checkpoint converts between on load.
bool convertibleDtypes(fb::DType a, fb::DType b) {
  return isFloatDType(a) && isFloatDType(b);
}

Status checkCompatibility(const CheckpointManifest &m,
                          const CheckpointManifest &target,
                          const LoadedArtifact &artifact,
                          const CheckpointLoadOptions &o,
                          const std::string &dir,
                          std::vector<std::string> &notes) {
  const std::string ck = "checkpoint " + dir;
  const std::string art = artifact.name();
  // The parameter set and global shapes.
  std::map<std::string, ParamInfo> saved, wanted;
  for (const ManifestTensor &t : m.tensors)
    if (t.kind == fb::BufferKind::Param)
      saved[t.name] = {t.globalShape, t.dtype};
  for (const ManifestTensor &t : target.tensors)
    if (t.kind == fb::BufferKind::Param)
      wanted[t.name] = {t.globalShape, t.dtype};
  auto models = [&] {
    return " (the checkpoint's model '" + m.model + "' has " +
           std::to_string(saved.size()) + " parameters, the artifact's '" +
           target.model + "' " + std::to_string(wanted.size()) +
           "): a different model cannot be loaded";
  };
  for (const auto &[name, info] : wanted) {
    auto it = saved.find(name);
    if (it == saved.end())
      return failedPrecondition(ck, " has no parameter '", name, "' of ", art,
                                models());
    if (it->second.global != info.global)
      return failedPrecondition(
          "parameter '", name, "' has global shape ",
          shapeString(it->second.global), " in ", ck, " but ",
          shapeString(info.global), " in ", art,
          ": a different model (or vocabulary padding) cannot be loaded");
    if (it->second.dtype != info.dtype &&
        !convertibleDtypes(it->second.dtype, info.dtype))
      return failedPrecondition(
          "parameter '", name, "' is ", fb::EnumNameDType(it->second.dtype),
          " in ", ck, " but ", fb::EnumNameDType(info.dtype), " in ", art,
          ": only float (F32, BF16, F16) parameters convert into each other");
  }
  // F32 <-> BF16 or F16 (--bf16 or --fp16 on or off between save and
  // load): converted, to a 16-bit format rounded to nearest even, to f32
  // exactly (see planRank for the main params).
  std::set<std::string> savedMain;
  for (const auto &[name, t] : savedTensors(m, 0).byName)
    if (t->kind == fb::BufferKind::MainParam && t->dtype == fb::DType::F32)
      savedMain.insert(name);
  std::map<std::pair<fb::DType, fb::DType>, std::vector<std::string>> converted;
  for (const auto &[name, info] : wanted) {
    fb::DType from = saved.at(name).dtype;
    // BF16 -> F32 from the main params instead (noted by planRank).
    bool fromMain = from != fb::DType::F32 && info.dtype == fb::DType::F32 &&
                    o.loadOptimizer &&
                    savedMain.count(std::string(kMainPrefix) + name);
    if (from != info.dtype && !fromMain)
      converted[{from, info.dtype}].push_back(name);
  }
  for (const auto &[types, names] : converted)
    notes.push_back(std::to_string(names.size()) + " parameter" +
                    (names.size() == 1 ? "" : "s") + " ('" + names.front() +
                    "'" + (names.size() > 1 ? ", ..." : "") +
                    ") converted from " + fb::EnumNameDType(types.first) +
                    " in the checkpoint to " + fb::EnumNameDType(types.second) +
                    (types.second != fb::DType::F32
                         ? " (rounded to nearest even)"
                         : " (exact)"));
  for (const auto &entry : saved)
    if (!wanted.count(entry.first))
      return failedPrecondition(ck, " holds parameter '", entry.first,
                                "', which ", art, " does not have", models());
  if (m.model != target.model)
    notes.push_back("the checkpoint was saved from model '" + m.model +
                    "', the artifact's is '" + target.model +
                    "'; the parameters match");

  if (m.globalBatch != target.globalBatch)
    return failedPrecondition(
        ck, " was saved with global batch size ", m.globalBatch, ", ", art,
        " has ", target.globalBatch,
        ": the data position is addressed by iteration x global batch size, "
        "so changing it on resume is not supported");

  if (o.seed != m.seed) {
    std::string why = seedDependence(artifact, o.loadOptimizer);
    if (!why.empty())
      return failedPrecondition("--seed ", o.seed, " differs from the seed ",
                                m.seed, " of ", ck,
                                ", and the seed matters "
                                "after loading: ",
                                why, "; resume with --seed ", m.seed);
    notes.push_back("--seed " + std::to_string(o.seed) +
                    " differs from the checkpoint's " + std::to_string(m.seed) +
                    "; harmless here (token data, no dropout, every "
                    "seed-initialised buffer is restored)");
  }
  if (!o.datasetPrefix.empty() && !m.datasetPrefix.empty() &&
      o.datasetTokens >= 0 && m.datasetTokens >= 0 &&
      o.datasetTokens != m.datasetTokens)
    notes.push_back("the checkpoint was trained on " + m.datasetPrefix + " (" +
                    std::to_string(m.datasetTokens) +
                    " tokens), this run uses " + o.datasetPrefix + " (" +
                    std::to_string(o.datasetTokens) + " tokens)");

  if (!o.loadOptimizer)
    return Status();
  if (m.optimizer != target.optimizer)
    return failedPrecondition(
        ck, " was saved with optimizer '", m.optimizer, "', but ", art,
        " uses '", target.optimizer,
        "': its optimizer state cannot be loaded (pass --no-load-optim to "
        "load only the parameters)");
  // Distributed-optimizer state (Adam shards of buckets and the main params
  // of parameter buckets) reshards per parameter through the bucket layouts
  // of the manifest, which must therefore record every bucket it shards;
  // other state of an unknown layout loads only where it was saved.
  if (sameBucketLayouts(m, target))
    return Status();
  const std::string way =
      "; resume with the configuration that saved it, or pass "
      "--no-load-optim to load only the parameters";
  for (const ManifestTensor &t : m.tensors) {
    if (!isOptimizerKind(t.kind) || t.reshardable)
      continue;
    if (!isBucketShard(t))
      return failedPrecondition(
          ck, " holds optimizer state '", t.name, "' of an unknown layout (",
          m.configString(), "), which cannot be resharded to ", art, " (",
          target.configString(), ")", way);
    bool recorded = false;
    for (const ManifestBucket &b : m.buckets)
      recorded |= b.stage == t.stage && b.name == t.param &&
                  b.numel == t.globalShape[0];
    if (!recorded)
      return failedPrecondition(
          ck, " was saved with the distributed optimizer (", m.configString(),
          "), but its manifest records no layout of bucket '", t.param,
          "' of stage ", t.stage, " (", t.globalShape[0],
          " elements), which its state '", t.name,
          "' shards: it cannot be resharded to ", art, " (",
          target.configString(), ")", way);
  }
  return Status();
}

/// The plan of `rank` once the checkpoint `m` is known to be compatible
/// with `target` (the artifact's own description).
StatusOr<CheckpointLoadPlan> planRank(const CheckpointManifest &m,
                                      const CheckpointManifest &target,
                                      const LoadedArtifact &artifact, int rank,
                                      const CheckpointLoadOptions &o,
                                      const std::string &dir) {
  const fb::Artifact &a = *artifact.root();
  if (rank < 0 || rank >= a.world_size())
    return invalidArgument(artifact.name(), ": rank ", rank,
                           " outside world size ", a.world_size());
  CheckpointLoadPlan plan;
  plan.rank = rank;
  plan.targetConfig = target.configString();
  plan.resharded = m.worldSize != target.worldSize || m.mesh != target.mesh ||
                   m.vpp != target.vpp;

  const std::string ck = "checkpoint " + dir;
  const SavedTensors saved = savedTensors(m, rank);
  const std::map<std::string, const ManifestTensor *> &byName = saved.byName;
  const bool sameBuckets = sameBucketLayouts(m, target);
  const fb::Program *p = artifact.programForWorldRank(rank);
  if (!p)
    return invalidArgument(artifact.name(), ": no program for rank ", rank);
  std::set<int> sources;
  // Main params that "init" computes from the parameters instead, main
  // params taken from F32 parameters and F32 parameters taken from main
  // params (dtype changes between save and load).
  std::vector<std::string> mainFromInit, mainFromParams, paramsFromMain;

  // The pieces of saved tensor `t` (or of a view of distributed-optimizer
  // state) that make up `box`, which is `name`'s.
  auto addPieces = [&](const ManifestTensor &t, const TensorBox &box,
                       const std::string &name,
                       std::vector<RestorePiece> &pieces) -> Status {
    std::map<int, std::vector<int>> holdersOf; // shard index -> ranks
    for (const auto &[r, index] : t.holders)
      holdersOf[index].push_back(r);
    int64_t covered = 0;
    for (int j = 0; j < t.numShards; ++j) {
      auto h = holdersOf.find(j);
      if (h == holdersOf.end())
        return dataLoss(dir, "/manifest.json: no rank holds shard ", j, " of ",
                        t.numShards, " of '", name, "'");
      TensorBox src = shardBox(t, j);
      TensorBox region;
      if (!intersectBoxes(src, box, region))
        continue;
      covered += region.volume();
      auto runs = saved.runs.find({t.name, j});
      if (runs != saved.runs.end()) {
        // Assembled from bucket shards: always another layout.
        plan.resharded = true;
        RestorePiece piece{-1, t.name, src, region, t.dtype, {}};
        piece.runs = runs->second;
        for (const FlatRun &run : piece.runs)
          sources.insert(run.sourceRank);
        pieces.push_back(std::move(piece));
        continue;
      }
      // Prefer this rank's own file, then a file already being read.
      const std::vector<int> &ranks = h->second;
      int source = *std::min_element(ranks.begin(), ranks.end());
      for (int candidate : ranks)
        if (sources.count(candidate) && !sources.count(source))
          source = candidate;
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
        source = rank;
      if (!(src == box) || source != rank)
        plan.resharded = true;
      pieces.push_back({source, t.name, src, region, t.dtype, {}});
      sources.insert(source);
    }
    if (covered != box.volume())
      return dataLoss(dir, "/manifest.json: the shards of '", name,
                      "' do not cover ", shapeString(t.globalShape));
    return Status();
  };

  for (const fb::Buffer *b : *p->buffers()) {
    fb::BufferKind kind = b->kind();
    if (!isSavedKind(kind) || (isOptimizerKind(kind) && !o.loadOptimizer)) {
      if (kind == fb::BufferKind::MainParam)
        mainFromInit.push_back(nameOf(*b));
      continue;
    }
    BufferRestore br;
    br.name = nameOf(*b);
    br.kind = kind;
    br.dtype = b->dtype();
    if (kind == fb::BufferKind::Iteration) {
      if (b->dtype() != fb::DType::I64 || numElements(b->shape()) != 1)
        return invalidArgument(artifact.name(), ": iteration buffer '", br.name,
                               "' is not an i64 scalar");
      br.isIteration = true;
      plan.buffers.push_back(std::move(br));
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(TensorLayout l, layoutOf(artifact, *p, *b, rank));
    br.box = layoutBox(l);
    if (!l.reshardable) {
      // The same configuration and bucket layout: the same rank holds the
      // same tensor.
      const ManifestTensor *found = nullptr;
      for (const ManifestTensor &t : m.tensors)
        if (t.name == br.name && !t.reshardable)
          for (const auto &h : t.holders)
            if (h.first == rank)
              found = &t;
      bool flat = l.distOpt && l.local.size() == 1 &&
                  endsWith(br.name, l.param) && br.name.size() > l.param.size();
      if (found && (sameBuckets || !flat) && found->shape == l.local &&
          found->dtype == b->dtype() && found->stage == ppStage(a, rank)) {
        TensorBox whole = shardBox(l.local, -1, 0, 1);
        br.box = whole;
        br.pieces.push_back({rank, br.name, whole, whole, b->dtype(), {}});
        sources.insert(rank);
        plan.buffers.push_back(std::move(br));
        continue;
      }
      if (!flat)
        return failedPrecondition(
            ck, " holds no optimizer state '", br.name, "' of shape ",
            shapeString(l.local), " for rank ", rank,
            " (optimizer state of an unknown layout is only loadable into "
            "the configuration that saved it)");
      // A bucket shard of the distributed optimizer in another layout: the
      // parameters of the bucket (the target's own layout) that overlap
      // this rank's 1/dp of it, each from its per-parameter state.
      const std::string prefix =
          br.name.substr(0, br.name.size() - l.param.size());
      const ManifestBucket *bucket = nullptr;
      for (const ManifestBucket &bk : target.buckets)
        if (bk.stage == ppStage(a, rank) && bk.name == l.param)
          bucket = &bk;
      if (!bucket || l.count < 1 || bucket->numel != l.local[0] * l.count)
        return invalidArgument(artifact.name(), ": distributed-optimizer "
                               "state '", br.name, "' of rank ", rank,
                               " has no bucket layout of ", l.local[0],
                               " x ", l.count, " elements (bucket view '",
                               l.param, "')");
      const int64_t lo = l.local[0] * l.index, hi = lo + l.local[0];
      br.box = shardBox(l.local, -1, 0, 1);
      bool fromInit = false, fromParams = false;
      for (const auto &[param, start, numel] : bucket->params) {
        int64_t x = std::max(lo, start), y = std::min(hi, start + numel);
        if (x >= y)
          continue;
        const fb::Buffer *pb = nullptr;
        for (const fb::Buffer *c : *p->buffers())
          if (c->kind() == fb::BufferKind::Param && nameOf(*c) == param)
            pb = c;
        if (!pb)
          return invalidArgument(artifact.name(), ": bucket '", l.param,
                                 "' lists no parameter '", param, "'");
        TESSERA_ASSIGN_OR_RETURN(TensorLayout pl,
                                 paramLayout(artifact, *pb, rank));
        RestoreSegment seg;
        seg.param = param;
        seg.box = layoutBox(pl);
        seg.begin = x - start;
        seg.end = y - start;
        seg.offset = x - lo;
        auto it = byName.find(prefix + param);
        if (it == byName.end() && kind == fb::BufferKind::MainParam) {
          // Saved without --bf16: the F32 parameter is exactly the main
          // param; otherwise "init" computes the shard.
          auto pt = byName.find(param);
          if (pt == byName.end() || pt->second->kind != fb::BufferKind::Param ||
              pt->second->dtype != fb::DType::F32) {
            fromInit = true;
            break;
          }
          it = pt;
          fromParams = true;
        }
        if (it == byName.end())
          return failedPrecondition(ck, " has no optimizer state '",
                                    prefix + param, "' (of parameter '", param,
                                    "') for '", br.name,
                                    "'; pass --no-load-optim to load only the "
                                    "parameters");
        const ManifestTensor &t = *it->second;
        if (t.dtype != b->dtype() || t.globalShape != pl.global ||
            (t.kind != kind && t.kind != fb::BufferKind::Param))
          return failedPrecondition(
              "buffer '", t.name, "' is ", fb::EnumNameBufferKind(t.kind), " ",
              fb::EnumNameDType(t.dtype), shapeString(t.globalShape), " in ",
              ck, " but the state of parameter '", param, "' in '", br.name,
              "' is ", fb::EnumNameBufferKind(kind), " ",
              fb::EnumNameDType(b->dtype()), shapeString(pl.global), " in ",
              artifact.name());
        TESSERA_RETURN_IF_ERROR(
            addPieces(t, seg.box, prefix + param, seg.pieces));
        br.segments.push_back(std::move(seg));
      }
      if (fromInit) {
        mainFromInit.push_back(br.name);
        continue;
      }
      if (fromParams)
        mainFromParams.push_back(br.name);
      plan.resharded = true;
      plan.buffers.push_back(std::move(br));
      continue;
    }
    auto it = byName.find(br.name);
    if (kind == fb::BufferKind::MainParam && it == byName.end()) {
      // Saved without --bf16: the F32 parameter is exactly the main param
      // (its rounding is the BF16 parameter); otherwise "init" computes it.
      auto param = byName.find(l.param);
      if (param == byName.end() ||
          param->second->kind != fb::BufferKind::Param ||
          param->second->dtype != fb::DType::F32) {
        mainFromInit.push_back(br.name);
        continue;
      }
      it = param;
      mainFromParams.push_back(br.name);
    }
    if (kind == fb::BufferKind::Param && it != byName.end() &&
        it->second->dtype != fb::DType::F32 && b->dtype() == fb::DType::F32 &&
        o.loadOptimizer) {
      // Saved with --bf16 or --fp16, loaded without: the fp32 main param
      // holds the value the 16-bit parameter was rounded from.
      auto main = byName.find(std::string(kMainPrefix) + br.name);
      if (main != byName.end() &&
          main->second->kind == fb::BufferKind::MainParam &&
          main->second->dtype == fb::DType::F32) {
        it = main;
        paramsFromMain.push_back(br.name);
      }
    }
    if (it == byName.end()) {
      if (kind == fb::BufferKind::OptState)
        return failedPrecondition(ck, " has no optimizer state '", br.name,
                                  "' (of parameter '", l.param,
                                  "'); pass --no-load-optim to load only the "
                                  "parameters");
      return failedPrecondition(ck, " has no parameter '", br.name, "'");
    }
    const ManifestTensor &t = *it->second;
    // Parameters convert between F32 and BF16; main params may come from
    // parameters and back (above).
    bool substitute = t.name != br.name;
    bool convert =
        kind == fb::BufferKind::Param && convertibleDtypes(t.dtype, b->dtype());
    if ((t.kind != kind && !substitute) ||
        (t.dtype != b->dtype() && !convert) || t.globalShape != l.global)
      return failedPrecondition(
          "buffer '", br.name, "' is ", fb::EnumNameBufferKind(t.kind), " ",
          fb::EnumNameDType(t.dtype), shapeString(t.globalShape), " in ", ck,
          " but ", fb::EnumNameBufferKind(kind), " ",
          fb::EnumNameDType(b->dtype()), shapeString(l.global), " in ",
          artifact.name());
    TESSERA_RETURN_IF_ERROR(addPieces(t, br.box, br.name, br.pieces));
    plan.buffers.push_back(std::move(br));
  }
  if (sources.count(rank))
    plan.sourceRanks.push_back(rank);
  for (int s : sources)
    if (s != rank)
      plan.sourceRanks.push_back(s);
  auto some = [](const std::vector<std::string> &names) {
    return std::to_string(names.size()) + " ('" + names.front() + "'" +
           (names.size() > 1 ? ", ..." : "") + ")";
  };
  if (!mainFromInit.empty())
    plan.notes.push_back("fp32 main params " + some(mainFromInit) +
                         (o.loadOptimizer
                              ? " are not in the checkpoint"
                              : " are optimizer state, not loaded") +
                         ": 'init' computes them from the loaded parameters");
  if (!mainFromParams.empty())
    plan.notes.push_back("fp32 main params " + some(mainFromParams) +
                         " restored from the checkpoint's F32 parameters");
  if (!paramsFromMain.empty())
    plan.notes.push_back("F32 parameters " + some(paramsFromMain) +
                         " restored from the checkpoint's fp32 main params");
  return plan;
}

/// The artifact's own description and the compatibility checks.
StatusOr<CheckpointManifest> checkedTarget(const CheckpointManifest &m,
                                           const LoadedArtifact &artifact,
                                           const CheckpointLoadOptions &o,
                                           const std::string &dir,
                                           std::vector<std::string> &notes) {
  CheckpointRunInfo info;
  info.seed = o.seed;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           describeCheckpoint(artifact, info));
  TESSERA_RETURN_IF_ERROR(
      checkCompatibility(m, target, artifact, o, dir, notes));
  return target;
}

} // namespace

StatusOr<CheckpointLoadPlan> planCheckpointLoad(const CheckpointManifest &m,
                                                const LoadedArtifact &artifact,
                                                int rank,
                                                const CheckpointLoadOptions &o,
                                                const std::string &dir) {
  std::vector<std::string> notes;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           checkedTarget(m, artifact, o, dir, notes));
  TESSERA_ASSIGN_OR_RETURN(CheckpointLoadPlan plan,
                           planRank(m, target, artifact, rank, o, dir));
  notes.insert(notes.end(), plan.notes.begin(), plan.notes.end());
  plan.notes = std::move(notes);
  return plan;
}

Status checkCheckpointForLaunch(const LoadedArtifact &artifact,
                                const std::string &dir,
                                const CheckpointLoadOptions &options) {
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation loc, locateCheckpoint(dir));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, readManifest(loc));
  std::vector<std::string> notes;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           checkedTarget(m, artifact, options, loc.dir, notes));
  std::set<int> needed;
  for (int r = 0; r < artifact.root()->world_size(); ++r) {
    TESSERA_ASSIGN_OR_RETURN(
        CheckpointLoadPlan plan,
        planRank(m, target, artifact, r, options, loc.dir));
    needed.insert(plan.sourceRanks.begin(), plan.sourceRanks.end());
  }
  for (int q : needed) {
    std::string path = loc.dir + "/" + shardFileName(q);
    TESSERA_ASSIGN_OR_RETURN(ShardHeader h, readShardHeader(path));
    const ManifestShardFile &f = m.files[size_t(q)];
    if (h.worldSize != m.worldSize || h.rank != q)
      return dataLoss(path, ": holds rank ", h.rank, " of world size ",
                      h.worldSize, ", but the manifest expects rank ", q,
                      " of ", m.worldSize);
    if (h.crc != f.crc || h.payloadSize + ckpt::kShardHeaderSize != f.bytes)
      return dataLoss(path, ": does not belong to this checkpoint (",
                      h.payloadSize + ckpt::kShardHeaderSize, " bytes, CRC-32 ",
                      hex32(h.crc), "; the manifest records ", f.bytes,
                      " bytes, CRC-32 ", hex32(f.crc), ")");
  }
  return Status();
}

} // namespace tessera::rt
