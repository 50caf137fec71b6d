//===- GatherParams.cpp - ZeRO-3: gather a bucket before its readers ------===//
//
// With a `shard_params` grad buffer (ZeRO-3, Megatron's
// --data-parallel-sharding-strategy optim_grads_params, the all-gather
// before use of Megatron-FSDP and PyTorch's FSDP) a rank keeps only its
// shard of each bucket's parameters, `pshard:<buffer>:<k>`. Every phase
// that reads a bucket's parameters all-gathers the bucket right before the
// first op of each run of ops that read it, and unpacks it: the unpacked
// parameters are views of the gathered bucket, which lower-to-rt keeps
// only until the run's last reader. A run ends where an op reads the
// parameters of other buckets only, so the forward gathers each bucket
// once, the backward (which reads the layers in reverse) gathers it again,
// and a bucket read by adjacent forward and backward ops (the output
// layer's) is gathered once for both: Megatron-FSDP's all-gather before
// each module's forward and backward, with the resharding after it. With
// `prefetch` the next run's gather starts under the current run.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"

#include "tessera/Support/Model.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include <map>
#include <set>

namespace tessera::dist {
#define GEN_PASS_DEF_GATHERPARAMSPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {

struct GatherParamsPass
    : tessera::dist::impl::GatherParamsPassBase<GatherParamsPass> {
  using GatherParamsPassBase::GatherParamsPassBase;
  void runOnOperation() override;
};

/// A bucket of a shard_params grad buffer.
struct BucketRef {
  mutable GradBufferOp buffer; // (its accessors are not const)
  int64_t bucket;
  bool operator<(const BucketRef &o) const {
    if (buffer.getSymName() != o.buffer.getSymName())
      return buffer.getSymName() < o.buffer.getSymName();
    return bucket < o.bucket;
  }
};

/// The shard arguments of the buckets `f` reads ("pshard:<buffer>:<k>"),
/// added at the end in one go (an argument inserted one at a time would
/// rewrite the function type each time: quadratic in the buckets).
std::map<BucketRef, Value> shardArguments(func::FuncOp f,
                                          const std::set<BucketRef> &read) {
  std::map<BucketRef, Value> shards;
  llvm::StringMap<unsigned> existing;
  for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
    if (auto b = f.getArgAttrOfType<StringAttr>(i, kBufferAttr))
      existing[b.getValue()] = i;
  Builder b(f.getContext());
  SmallVector<unsigned> indices;
  SmallVector<Type> types;
  SmallVector<DictionaryAttr> attrs;
  SmallVector<Location> locs;
  SmallVector<BucketRef> added;
  for (const BucketRef &ref : read) {
    std::string name = ("pshard:" + ref.buffer.getSymName() + ":" +
                        Twine(ref.bucket))
                           .str();
    if (auto it = existing.find(name); it != existing.end()) {
      shards[ref] = f.getArgument(it->second);
      continue;
    }
    const buckets::Bucket k = ref.buffer.getBucket(ref.bucket);
    indices.push_back(f.getNumArguments());
    types.push_back(RankedTensorType::get(
        {(k.end - k.start) / ref.buffer.getDp()},
        floatDtypeType(f.getContext(), ref.buffer.getParamDtype())));
    attrs.push_back(b.getDictionaryAttr(
        b.getNamedAttr(kBufferAttr, b.getStringAttr(name))));
    locs.push_back(f.getLoc());
    added.push_back(ref);
  }
  const unsigned first = f.getNumArguments();
  if (!added.empty() &&
      failed(f.insertArguments(indices, types, attrs, locs)))
    return {};
  for (auto [i, ref] : llvm::enumerate(added))
    shards[ref] = f.getArgument(first + unsigned(i));
  return shards;
}

/// Prefetch: every gather but the first starts right after the previous
/// one's unpack (under the previous run) and is waited for where it was.
void prefetch(ArrayRef<std::pair<AllGatherOp, UnpackOp>> gathers) {
  for (size_t i = 1; i < gathers.size(); ++i) {
    auto [gather, unpack] = gathers[i];
    OpBuilder b(gathers[i - 1].second);
    b.setInsertionPointAfter(gathers[i - 1].second);
    auto start = AllGatherStartOp::create(
        b, gather.getLoc(), AsyncType::get(b.getContext(), gather.getType()),
        gather.getInput(), gather.getMeshAttr(), gather.getGroupAttr(),
        gather.getDimAttr());
    b.setInsertionPoint(gather);
    auto wait = WaitOp::create(b, gather.getLoc(), gather.getType(), start);
    gather.replaceAllUsesWith(wait.getResult());
    gather.erase();
  }
}

LogicalResult gatherInPhase(func::FuncOp f, MeshOp mesh,
                            const llvm::StringMap<BucketRef> &bucketOf,
                            const llvm::StringMap<Type> &paramTypes,
                            bool prefetchNext) {
  // The bucket (and index in it) of each parameter argument.
  llvm::DenseMap<Value, std::pair<BucketRef, unsigned>> paramArg;
  for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
    if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr)) {
      auto it = bucketOf.find(name.getValue());
      if (it == bucketOf.end())
        continue;
      SmallVector<StringRef> params =
          it->second.buffer.getBucketParams(it->second.bucket);
      auto pos = llvm::find(params, name.getValue());
      paramArg[f.getArgument(i)] = {it->second,
                                    unsigned(pos - params.begin())};
    }
  if (paramArg.empty())
    return success();
  // The unpacked types of each bucket read, in buffer order (a phase
  // need not take every parameter of a bucket it reads: a backward takes
  // only those it reads; the types are the program's).
  std::map<BucketRef, SmallVector<Type>> typesOf;
  for (auto &[arg, where] : paramArg) {
    SmallVector<Type> &types = typesOf[where.first];
    if (!types.empty())
      continue;
    for (StringRef name : where.first.buffer.getBucketParams(where.first.bucket))
      types.push_back(paramTypes.lookup(name));
  }
  // Every bucket the phase reads gets its shard argument first.
  std::set<BucketRef> read;
  for (auto &[arg, where] : paramArg)
    if (!arg.use_empty())
      read.insert(where.first);
  std::map<BucketRef, Value> shards = shardArguments(f, read);
  // Each bucket's current run: the unpacked parameters readers use.
  std::map<BucketRef, UnpackOp> open;
  // Every gather, in order.
  SmallVector<std::pair<AllGatherOp, UnpackOp>> gathers;
  Block &body = f.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  for (Operation *op : ops) {
    std::map<BucketRef, bool> reads;
    op->walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        if (auto it = paramArg.find(v); it != paramArg.end())
          reads[it->second.first] = true;
    });
    if (reads.empty())
      continue;
    // Runs of other buckets end here.
    for (auto it = open.begin(); it != open.end();)
      it = reads.count(it->first) ? std::next(it) : open.erase(it);
    for (auto &[ref, unused] : reads) {
      if (open.count(ref))
        continue;
      Value shard = shards[ref];
      if (!shard)
        return f.emitOpError() << "cannot take the shard of bucket "
                               << ref.bucket << " of @"
                               << ref.buffer.getSymName();
      const buckets::Bucket k = ref.buffer.getBucket(ref.bucket);
      auto shardType = cast<RankedTensorType>(shard.getType());
      OpBuilder b(op);
      auto gather = AllGatherOp::create(
          b, op->getLoc(),
          RankedTensorType::get({k.end - k.start},
                                shardType.getElementType()),
          shard, FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
          ref.buffer.getGroupAttr(), b.getI64IntegerAttr(0));
      SmallVector<Type> &types = typesOf[ref];
      if (llvm::any_of(types, [](Type t) { return !t; }))
        return f.emitOpError()
               << "reads bucket " << ref.bucket << " of @"
               << ref.buffer.getSymName()
               << " but no phase of the program takes every parameter of it";
      open[ref] = UnpackOp::create(
          b, op->getLoc(), types,
          FlatSymbolRefAttr::get(ref.buffer.getSymNameAttr()),
          b.getI64IntegerAttr(ref.bucket),
          enumAttr(b, BucketData::Param), gather);
      gathers.push_back({gather, open[ref]});
    }
    op->walk([&](Operation *inner) {
      for (OpOperand &use : inner->getOpOperands())
        if (auto it = paramArg.find(use.get()); it != paramArg.end())
          use.set(open[it->second.first].getResult(it->second.second));
    });
  }
  if (prefetchNext)
    prefetch(gathers);
  return success();
}

void GatherParamsPass::runOnOperation() {
  ModuleOp root = getOperation();
  for (ModuleOp program : getPrograms(root)) {
    llvm::StringMap<BucketRef> bucketOf;
    for (auto gb : program.getOps<GradBufferOp>())
      if (gb.getShardParams())
        for (const buckets::ParamRange &p : gb.getLayout().params)
          bucketOf[p.name] = {gb, p.bucket};
    if (bucketOf.empty())
      continue;
    MeshOp mesh = lookupMesh(program);
    if (!mesh) {
      emitError(program.getLoc()) << "shards parameters without a mesh";
      return signalPassFailure();
    }
    // Each parameter's type, from the phases that take it.
    llvm::StringMap<Type> paramTypes;
    for (auto f : program.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          paramTypes[name.getValue()] = f.getArgumentTypes()[i];
    for (auto f : program.getOps<func::FuncOp>()) {
      auto phase = f->getAttrOfType<StringAttr>(kPhaseAttr);
      if (!phase || phase.getValue() == kStepPhase ||
          phase.getValue() == kInitPhase)
        continue;
      if (failed(gatherInPhase(f, mesh, bucketOf, paramTypes, prefetch)))
        return signalPassFailure();
    }
  }
}

} // namespace
