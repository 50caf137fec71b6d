//===- DistOps.cpp - dist dialect operations ------------------------------===//
//
// Mesh verification, group resolution against the mesh (SymbolUserOpInterface),
// collective shape checks and the adjoints of the region ops and collectives.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/IR/DistOps.h"
#include "tessera/Mesh/RankGroups.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <map>

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

#include "dialects/dist/IR/DistEnums.cpp.inc"
#include "dialects/dist/IR/DistOpsDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/dist/IR/DistOpsTypes.cpp.inc"

void DistDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/dist/IR/DistOps.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialects/dist/IR/DistOpsTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Attributes: dist.sharding, dist.tied, dist.pp_rank, dist.stage, dist.chunk,
// dist.chunk_slot, dist.single_bucket_group
//===----------------------------------------------------------------------===//

namespace {
using namespace attr_check;
using attr_site::AnyOp;
using attr_site::Argument;
using attr_site::Function;
using attr_site::Module;

const AttrContract kDistAttrs[] = {
    {kShardingAttr, Argument,
     [](Attribute a, Type t) -> std::string {
       std::string error = dictionary(
           a, t,
           {{"axis", nonEmptyString},
            {"dim", dimensionOf},
            {"axis2", nonEmptyString, /*optional=*/true},
            {"dim2", dimensionOf, /*optional=*/true}});
       if (!error.empty())
         return error;
       // A second split names both its axis and its dim, of another dim.
       auto d = cast<DictionaryAttr>(a);
       auto dim = d.getAs<IntegerAttr>("dim");
       auto dim2 = d.getAs<IntegerAttr>("dim2");
       if (bool(d.get("axis2")) != bool(dim2))
         return "a dictionary whose second split has both axis2 and dim2";
       if (dim2 && dim2.getInt() == dim.getInt())
         return "a dictionary whose second split (dim2) is of another "
                "dimension than dim";
       return "";
     }},
    {kTiedAttr, Argument, nonEmptyString},
    {kPpRankAttr, Module, nonNegativeInt},
    {kStageAttr, Function,
     [](Attribute a, Type t) {
       return dictionary(a, t,
                         {{"stage", nonNegativeInt},
                          {"chunk", nonNegativeInt},
                          {"layers", i64Array}});
     }},
    {kChunkAttr, Function, nonNegativeInt},
    {kChunkSlotAttr, AnyOp, nonNegativeInt},
    {kSingleBucketGroupAttr, Module, unit},
};
} // namespace

LogicalResult DistDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  return verifyAttr(kDistAttrs, op, attr);
}

LogicalResult DistDialect::verifyRegionArgAttribute(Operation *op, unsigned,
                                                    unsigned argIndex,
                                                    NamedAttribute attr) {
  return verifyAttr(kDistAttrs, op, attr, attr_site::Argument, argIndex);
}

LogicalResult DistDialect::verifyRegionResultAttribute(Operation *op, unsigned,
                                                       unsigned resultIndex,
                                                       NamedAttribute attr) {
  return verifyAttr(kDistAttrs, op, attr, attr_site::Result, resultIndex);
}

MeshOp tessera::dist::lookupMesh(Operation *from) {
  // The mesh sits in the top-level module; pipeline-rank modules nest in it.
  auto module = isa<ModuleOp>(from) ? cast<ModuleOp>(from)
                                    : from->getParentOfType<ModuleOp>();
  for (; module; module = module->getParentOfType<ModuleOp>())
    if (auto mesh = module.lookupSymbol<MeshOp>(kMeshName))
      return mesh;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

mesh::MeshConfig MeshOp::getConfig() {
  mesh::MeshConfig c;
  c.tp = getTp();
  c.cp = getCp();
  c.ep = getEp();
  c.etp = getEtp();
  c.dp = getDp();
  c.pp = getPp();
  c.vpp = getVpp();
  c.order = getOrder().str();
  return c;
}

LogicalResult MeshOp::verify() {
  std::string error = mesh::validateMesh(getConfig());
  if (!error.empty())
    return emitOpError() << error;
  return success();
}

int64_t MeshOp::getWorldSize() { return getConfig().worldSize(); }

FailureOr<int64_t> MeshOp::getGroupSize(StringRef kind, std::string &error) {
  int64_t size = mesh::groupSize(getConfig(), kind.str(), error);
  if (!error.empty())
    return failure();
  return size;
}

//===----------------------------------------------------------------------===//
// Group resolution and shape checks
//===----------------------------------------------------------------------===//

/// Resolves `mesh` from `op` and returns the size of `group`, or fails with
/// an error naming the missing mesh or the unknown group.
/// The mesh `meshRef` names, searched from `op` outwards through the
/// enclosing symbol tables (pipeline-rank modules nest in the module that
/// holds the mesh).
static MeshOp findMesh(Operation *op, FlatSymbolRefAttr meshRef) {
  for (Operation *table = SymbolTable::getNearestSymbolTable(op); table;
       table = table->getParentOp()
                   ? SymbolTable::getNearestSymbolTable(table->getParentOp())
                   : nullptr)
    if (auto mesh = dyn_cast_or_null<MeshOp>(
            SymbolTable::lookupSymbolIn(table, meshRef)))
      return mesh;
  return nullptr;
}

static FailureOr<int64_t> resolveGroup(Operation *op, FlatSymbolRefAttr meshRef,
                                       StringRef group,
                                       SymbolTableCollection &symbolTable) {
  MeshOp mesh = findMesh(op, meshRef);
  if (!mesh)
    return op->emitOpError() << "refers to mesh " << meshRef
                             << ", which is not a dist.mesh in scope";
  std::string error;
  FailureOr<int64_t> size = mesh.getGroupSize(group, error);
  if (failed(size))
    return op->emitOpError() << "names an invalid rank group: " << error;
  return size;
}

/// Checks that `result` equals `input` with dim `dim` scaled by `num/den`.
static LogicalResult checkScaledDim(Operation *op, RankedTensorType input,
                                    RankedTensorType result, int64_t dim,
                                    int64_t groupSize, bool gather) {
  if (dim < 0 || dim >= input.getRank() || input.getRank() != result.getRank())
    return op->emitOpError() << "dim " << dim << " out of range for " << input;
  for (int64_t i = 0; i < input.getRank(); ++i) {
    int64_t in = input.getDimSize(i), out = result.getDimSize(i);
    if (ShapedType::isDynamic(in) || ShapedType::isDynamic(out))
      continue;
    if (i != dim) {
      if (in != out)
        return op->emitOpError() << "result shape " << result
                                 << " differs from input " << input
                                 << " outside dim " << dim;
      continue;
    }
    if (gather ? out != in * groupSize : in != out * groupSize)
      return op->emitOpError()
             << "dim " << dim << " of size " << in << " becomes " << out
             << ", expected " << (gather ? "times" : "divided by")
             << " the group size " << groupSize;
  }
  return success();
}

#define DEFINE_MESH_LOOKUP(OpTy)                                               \
  MeshOp OpTy::getMeshOp() {                                                   \
    return findMesh(*this, getMeshAttr());                                    \
  }

#define DEFINE_PLAIN_SYMBOL_USE(OpTy)                                          \
  LogicalResult OpTy::verifySymbolUses(SymbolTableCollection &st) {            \
    return resolveGroup(*this, getMeshAttr(), getGroup(), st);                 \
  }

#define DEFINE_SCALED_SYMBOL_USE(OpTy, DIM, GATHER)                            \
  LogicalResult OpTy::verifySymbolUses(SymbolTableCollection &st) {            \
    FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st); \
    if (failed(size))                                                          \
      return failure();                                                        \
    auto in = cast<RankedTensorType>(getInput().getType());                    \
    return checkScaledDim(*this, in, resultTensorType(*this), DIM, *size,      \
                          GATHER);                                             \
  }

template <typename OpTy> static RankedTensorType resultTensorType(OpTy op) {
  Type t = op.getResult().getType();
  if (auto async = dyn_cast<AsyncType>(t))
    t = async.getValueType();
  return cast<RankedTensorType>(t);
}

DEFINE_MESH_LOOKUP(CopyToRegionOp)
DEFINE_MESH_LOOKUP(ReduceFromRegionOp)
DEFINE_MESH_LOOKUP(ScatterToRegionOp)
DEFINE_MESH_LOOKUP(GatherFromRegionOp)
DEFINE_MESH_LOOKUP(AllReduceOp)
DEFINE_MESH_LOOKUP(AllGatherOp)
DEFINE_MESH_LOOKUP(ReduceScatterOp)
DEFINE_MESH_LOOKUP(AllReduceStartOp)
DEFINE_MESH_LOOKUP(AllGatherStartOp)
DEFINE_MESH_LOOKUP(ReduceScatterStartOp)

DEFINE_MESH_LOOKUP(AllToAllOp)
DEFINE_MESH_LOOKUP(ExpertDispatchOp)
DEFINE_MESH_LOOKUP(ExpertCombineOp)
DEFINE_MESH_LOOKUP(RingAttentionOp)
DEFINE_MESH_LOOKUP(RingAttentionGradOp)

DEFINE_PLAIN_SYMBOL_USE(CopyToRegionOp)
DEFINE_PLAIN_SYMBOL_USE(RingAttentionOp)
DEFINE_PLAIN_SYMBOL_USE(RingAttentionGradOp)
DEFINE_PLAIN_SYMBOL_USE(ReduceFromRegionOp)
DEFINE_PLAIN_SYMBOL_USE(AllReduceOp)
DEFINE_PLAIN_SYMBOL_USE(AllReduceStartOp)
DEFINE_SCALED_SYMBOL_USE(ScatterToRegionOp,
                         getDim().value_or(getInput().getType().getRank() - 1),
                         false)
DEFINE_SCALED_SYMBOL_USE(GatherFromRegionOp,
                         getDim().value_or(getInput().getType().getRank() - 1),
                         true)
DEFINE_SCALED_SYMBOL_USE(AllGatherOp, getDim(), true)
DEFINE_SCALED_SYMBOL_USE(ReduceScatterOp, getDim(), false)
DEFINE_SCALED_SYMBOL_USE(AllGatherStartOp, getDim(), true)
DEFINE_SCALED_SYMBOL_USE(ReduceScatterStartOp, getDim(), false)

LogicalResult AllReduceStartOp::verify() {
  if (getInput().getType() != getResult().getType().getValueType())
    return emitOpError() << "result must be !dist.async of the input type";
  return success();
}

LogicalResult WaitOp::verify() {
  if (getFuture().getType().getValueType() != getResult().getType())
    return emitOpError() << "result type " << getResult().getType()
                         << " differs from the awaited "
                         << getFuture().getType().getValueType();
  return success();
}

//===----------------------------------------------------------------------===//
// Adjoints (Megatron's f and g, and the collectives' transposes)
//===----------------------------------------------------------------------===//

LogicalResult CopyToRegionOp::buildAdjoint(OpBuilder &b,
                                           ArrayRef<Value> resultAdj,
                                           ArrayRef<bool> needed,
                                           SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = AllReduceOp::create(b, getLoc(), resultAdj[0].getType(),
                                 resultAdj[0], getMeshAttr(), getGroupAttr(),
                                 enumAttr(b, Reduction::Sum));
  return success();
}

LogicalResult ReduceFromRegionOp::buildAdjoint(OpBuilder &,
                                               ArrayRef<Value> resultAdj,
                                               ArrayRef<bool> needed,
                                               SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = resultAdj[0];
  return success();
}

LogicalResult ScatterToRegionOp::buildAdjoint(OpBuilder &b,
                                              ArrayRef<Value> resultAdj,
                                              ArrayRef<bool> needed,
                                              SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = GatherFromRegionOp::create(b, getLoc(), getInput().getType(),
                                        resultAdj[0], getMeshAttr(),
                                        getGroupAttr(), getDimAttr());
  return success();
}

LogicalResult GatherFromRegionOp::buildAdjoint(OpBuilder &b,
                                               ArrayRef<Value> resultAdj,
                                               ArrayRef<bool> needed,
                                               SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = ScatterToRegionOp::create(b, getLoc(), getInput().getType(),
                                       resultAdj[0], getMeshAttr(),
                                       getGroupAttr(), getDimAttr());
  return success();
}

LogicalResult AllReduceOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  if (getReduction() != Reduction::Sum)
    return emitOpError() << "has no gradient for reduction '"
                         << stringifyReduction(getReduction()) << "'";
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = AllReduceOp::create(b, getLoc(), resultAdj[0].getType(),
                                 resultAdj[0], getMeshAttr(), getGroupAttr(),
                                 getReductionAttr());
  return success();
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &st) {
  FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st);
  if (failed(size))
    return failure();
  auto type = cast<RankedTensorType>(getInput().getType());
  int64_t rows = type.getRank() ? type.getDimSize(0) : 1;
  if (type.getRank() == 0 ||
      (!ShapedType::isDynamic(rows) && rows % *size != 0))
    return emitOpError() << "dim 0 of " << type << " must hold one block per "
                         << "rank of group '" << getGroup() << "' (" << *size
                         << " ranks)";
  return success();
}

/// Checks the shapes of an expert exchange over a group of `size` ranks,
/// runs of `etp` of which share their experts: `rows` [n, h] of this rank,
/// `recv` [size n, h], counts [E] with E divisible by size / etp, local
/// counts [E etp / size], splits [size, E etp / size].
static LogicalResult checkExpertExchange(Operation *op, int64_t size,
                                         int64_t etp, RankedTensorType rows,
                                         RankedTensorType recv,
                                         RankedTensorType counts,
                                         RankedTensorType splits,
                                         RankedTensorType localCounts) {
  if (etp < 1 || size % etp != 0)
    return op->emitOpError() << "expects etp (" << etp
                             << ") to divide the group's " << size << " ranks";
  if (rows.getElementType() != recv.getElementType())
    return op->emitOpError() << "expects the rows " << rows
                             << " and the experts' side " << recv
                             << " in one dtype";
  if (!rows.getElementType().isF32() && etp > 1)
    return op->emitOpError() << "moves " << rows.getElementType()
                             << " rows, but etp " << etp
                             << " > 1 sums partial rows, in f32 only";
  const int64_t ep = size / etp;
  int64_t experts = counts.getDimSize(0);
  if (experts % ep != 0)
    return op->emitOpError() << experts << " experts do not split evenly over "
                             << ep << " expert-parallel ranks";
  int64_t local = experts / ep;
  if (recv.getDimSize(1) != rows.getDimSize(1) ||
      recv.getDimSize(0) != size * rows.getDimSize(0))
    return op->emitOpError() << "expects " << size << " x the rows " << rows
                             << " on the experts' side, got " << recv;
  if (splits.getShape() != ArrayRef<int64_t>{size, local} ||
      (localCounts && localCounts.getShape() != ArrayRef<int64_t>{local}))
    return op->emitOpError() << "expects splits [" << size << ", " << local
                             << "] and local counts [" << local << "]";
  return success();
}

LogicalResult ExpertDispatchOp::verifySymbolUses(SymbolTableCollection &st) {
  FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st);
  if (failed(size))
    return failure();
  return checkExpertExchange(*this, *size, getEtp(), getInput().getType(),
                             getResult().getType(), getCounts().getType(),
                             getSplits().getType(),
                             getLocalCounts().getType());
}

LogicalResult ExpertCombineOp::verifySymbolUses(SymbolTableCollection &st) {
  FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st);
  if (failed(size))
    return failure();
  return checkExpertExchange(*this, *size, getEtp(), getResult().getType(),
                             getInput().getType(), getCounts().getType(),
                             getSplits().getType(), RankedTensorType());
}

LogicalResult ExpertDispatchOp::buildAdjoint(OpBuilder &b,
                                             ArrayRef<Value> resultAdj,
                                             ArrayRef<bool> needed,
                                             SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0] && resultAdj[0])
    adj[0] = ExpertCombineOp::create(b, getLoc(), getInput().getType(),
                                     resultAdj[0], getSplits(), getCounts(),
                                     getMeshAttr(), getGroupAttr(), getEtpAttr());
  return success();
}

LogicalResult ExpertCombineOp::buildAdjoint(OpBuilder &b,
                                            ArrayRef<Value> resultAdj,
                                            ArrayRef<bool> needed,
                                            SmallVectorImpl<Value> &adj) {
  adj.assign(3, Value());
  if (needed[0] && resultAdj[0]) {
    auto splits = cast<RankedTensorType>(getSplits().getType());
    auto dispatch = ExpertDispatchOp::create(
        b, getLoc(),
        TypeRange{getInput().getType(),
                  RankedTensorType::get({splits.getDimSize(1)},
                                        splits.getElementType()),
                  splits},
        resultAdj[0], getCounts(), getMeshAttr(), getGroupAttr(), getEtpAttr());
    adj[0] = dispatch.getResult();
  }
  return success();
}

LogicalResult AllToAllOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                       ArrayRef<bool> needed,
                                       SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = AllToAllOp::create(b, getLoc(), resultAdj[0].getType(),
                                resultAdj[0], getMeshAttr(), getGroupAttr());
  return success();
}

LogicalResult AllGatherOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = ReduceScatterOp::create(b, getLoc(), getInput().getType(),
                                     resultAdj[0], getMeshAttr(),
                                     getGroupAttr(), getDimAttr());
  return success();
}

LogicalResult ReduceScatterOp::buildAdjoint(OpBuilder &b,
                                            ArrayRef<Value> resultAdj,
                                            ArrayRef<bool> needed,
                                            SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = AllGatherOp::create(b, getLoc(), getInput().getType(),
                                 resultAdj[0], getMeshAttr(), getGroupAttr(),
                                 getDimAttr());
  return success();
}


//===----------------------------------------------------------------------===//
// Pipeline ops
//===----------------------------------------------------------------------===//

static LogicalResult verifyTag(Operation *op, int64_t tag) {
  // 32767 is the largest tag every MPI implementation must accept.
  if (tag < 0 || tag > 32767)
    return op->emitOpError() << "tag " << tag << " is outside [0, 32767]";
  return success();
}

LogicalResult SendOp::verify() { return verifyTag(*this, getTag()); }
LogicalResult RecvOp::verify() { return verifyTag(*this, getTag()); }

LogicalResult RunOp::verifySymbolUses(SymbolTableCollection &st) {
  Operation *func = st.lookupNearestSymbolFrom(*this, getCalleeAttr());
  if (!func || !isa<FunctionOpInterface>(func))
    return emitOpError() << "runs '" << getCallee()
                         << "', which is not a function of this pipeline rank";
  auto phase = func->getAttrOfType<StringAttr>(kPhaseAttr);
  if (!phase ||
      (phase.getValue() != kForwardPhase && phase.getValue() != kBackwardPhase &&
       phase.getValue() != kBackwardWPhase))
    return emitOpError() << "runs '" << getCallee()
                         << "', which is not a forward, backward or "
                            "weight-gradient phase";
  return success();
}


//===----------------------------------------------------------------------===//
// Gradient buffers
//===----------------------------------------------------------------------===//

buckets::Buffer GradBufferOp::getLayout() {
  buckets::Buffer b;
  b.paramDtype = stringifyFloatDtype(getParamDtype()).str();
  b.gradDtype = stringifyFloatDtype(getGradDtype()).str();
  b.numel = getNumel();
  b.numelUnpadded = getNumelUnpadded();
  for (Attribute a : getParams()) {
    auto d = dyn_cast<DictionaryAttr>(a);
    if (!d)
      continue;
    buckets::ParamRange p;
    if (auto n = d.getAs<StringAttr>("name"))
      p.name = n.getValue().str();
    auto i64 = [&](StringRef key) {
      auto v = d.getAs<IntegerAttr>(key);
      return v ? v.getInt() : int64_t(-1);
    };
    p.start = i64("start");
    p.end = i64("end");
    p.bucket = i64("bucket");
    b.params.push_back(p);
  }
  for (Attribute a : getBuckets())
    if (auto arr = dyn_cast<DenseI64ArrayAttr>(a); arr && arr.size() == 3) {
      buckets::Bucket k;
      k.start = arr[0];
      k.end = arr[1];
      k.numelUnpadded = arr[2];
      b.buckets.push_back(k);
    }
  // Each bucket's parameters in buffer order: one pass over the parameters
  // and a sort per bucket (this runs in verifiers, once per pack/unpack).
  std::vector<std::vector<std::pair<int64_t, size_t>>> members(
      b.buckets.size());
  for (auto [i, p] : llvm::enumerate(b.params))
    if (p.bucket >= 0 && p.bucket < int64_t(b.buckets.size()))
      members[size_t(p.bucket)].push_back({p.start, i});
  for (auto [k, bucket] : llvm::enumerate(b.buckets)) {
    llvm::stable_sort(members[k]);
    for (auto [start, i] : members[k])
      bucket.params.push_back(b.params[i].name);
  }
  return b;
}

buckets::Bucket GradBufferOp::getBucket(int64_t bucket) {
  auto range = cast<DenseI64ArrayAttr>(getBuckets()[size_t(bucket)]);
  buckets::Bucket k;
  k.start = range[0];
  k.end = range[1];
  k.numelUnpadded = range[2];
  return k;
}

/// The entries of `params` (listed at decreasing offsets, verified) of
/// bucket `bucket`, in buffer order: the bucket's are the run of the list
/// inside its range, so a binary search, then the run backwards.
static SmallVector<DictionaryAttr> bucketEntries(ArrayAttr bucketsAttr,
                                                 ArrayAttr paramsAttr,
                                                 int64_t bucket) {
  auto range = cast<DenseI64ArrayAttr>(bucketsAttr[size_t(bucket)]);
  ArrayRef<Attribute> params = paramsAttr.getValue();
  auto startOf = [&](size_t i) {
    return cast<DictionaryAttr>(params[i]).getAs<IntegerAttr>("start").getInt();
  };
  size_t lo = 0, hi = params.size();
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (startOf(mid) >= range[1])
      lo = mid + 1;
    else
      hi = mid;
  }
  SmallVector<DictionaryAttr> entries;
  for (size_t i = lo; i < params.size() && startOf(i) >= range[0]; ++i) {
    auto d = cast<DictionaryAttr>(params[i]);
    if (d.getAs<IntegerAttr>("bucket").getInt() == bucket)
      entries.push_back(d);
  }
  std::reverse(entries.begin(), entries.end());
  return entries;
}

SmallVector<buckets::ParamRange>
GradBufferOp::getBucketParamRanges(int64_t bucket) {
  SmallVector<buckets::ParamRange> out;
  for (DictionaryAttr d : bucketEntries(getBuckets(), getParams(), bucket)) {
    buckets::ParamRange p;
    p.name = d.getAs<StringAttr>("name").getValue().str();
    p.start = d.getAs<IntegerAttr>("start").getInt();
    p.end = d.getAs<IntegerAttr>("end").getInt();
    p.bucket = bucket;
    out.push_back(p);
  }
  return out;
}

SmallVector<StringRef> GradBufferOp::getBucketParams(int64_t bucket) {
  SmallVector<StringRef> names;
  for (DictionaryAttr d : bucketEntries(getBuckets(), getParams(), bucket))
    names.push_back(d.getAs<StringAttr>("name").getValue());
  return names;
}

LogicalResult GradBufferOp::verify() {
  for (Attribute a : getParams()) {
    auto d = dyn_cast<DictionaryAttr>(a);
    if (!d || !d.getAs<StringAttr>("name") || !d.getAs<IntegerAttr>("start") ||
        !d.getAs<IntegerAttr>("end") || !d.getAs<IntegerAttr>("bucket"))
      return emitOpError() << "params must be {name, start, end, bucket} "
                              "dictionaries";
  }
  for (Attribute a : getBuckets()) {
    auto arr = dyn_cast<DenseI64ArrayAttr>(a);
    if (!arr || arr.size() != 3)
      return emitOpError() << "buckets must be [start, end, numel_unpadded] arrays";
  }
  if (getDp() < 1)
    return emitOpError() << "dp must be at least 1";
  if (getShardGrads() && !getDistributed())
    return emitOpError() << "shards its gradients (shard_grads) but not its "
                            "parameters' optimizer state (distributed): "
                            "ZeRO-2 builds on the distributed optimizer";
  if (getShardParams() && !getShardGrads())
    return emitOpError() << "shards its parameters (shard_params) but not its "
                            "gradients (shard_grads): ZeRO-3 builds on ZeRO-2";
  buckets::LayoutOptions o;
  o.dp = getDp();
  o.distributedOptimizer = getDistributed();
  o.padForHighNcclBusbw = getPadForHighBusbw();
  std::string error = buckets::validate(getLayout(), o);
  if (!error.empty())
    return emitOpError() << "has an invalid layout: " << error;
  return success();
}

/// The grad buffer a pack/unpack names, and the parameter sizes of its
/// bucket (buffer order) and the bucket's size.
static LogicalResult resolveBucket(Operation *op, FlatSymbolRefAttr ref,
                                   int64_t bucket, SymbolTableCollection &st,
                                   SmallVectorImpl<int64_t> &sizes,
                                   int64_t &bucketNumel,
                                   GradBufferOp *found = nullptr) {
  auto buf = st.lookupNearestSymbolFrom<GradBufferOp>(op, ref);
  if (found)
    *found = buf;
  if (!buf)
    return op->emitOpError() << "refers to " << ref
                             << ", which is not a dist.grad_buffer in scope";
  // Read straight from the attributes, without building the whole layout:
  // the parameters are listed at decreasing offsets (the grad buffer's
  // verifier checks it), so the bucket's are one run of the list, found by
  // binary search (every pack and unpack of a 175B model's hundreds of
  // buckets runs this, after every pass).
  ArrayAttr bucketsAttr = buf.getBuckets();
  if (bucket < 0 || bucket >= int64_t(bucketsAttr.size()))
    return op->emitOpError() << "names bucket " << bucket << " of " << ref
                             << ", which has " << bucketsAttr.size();
  auto range = dyn_cast<DenseI64ArrayAttr>(bucketsAttr[size_t(bucket)]);
  if (!range || range.size() != 3)
    return op->emitOpError() << "names bucket " << bucket << " of " << ref
                             << ", which is malformed";
  bucketNumel = range[1] - range[0];
  ArrayRef<Attribute> params = buf.getParams().getValue();
  auto field = [&](size_t i, StringRef name) -> std::optional<int64_t> {
    auto d = dyn_cast<DictionaryAttr>(params[i]);
    auto v = d ? d.getAs<IntegerAttr>(name) : IntegerAttr();
    return v ? std::optional<int64_t>(v.getInt()) : std::nullopt;
  };
  // The first parameter (in list order) that starts below the bucket's end.
  size_t lo = 0, hi = params.size();
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    std::optional<int64_t> start = field(mid, "start");
    if (!start)
      return op->emitOpError() << "refers to " << ref
                               << ", whose parameters are malformed";
    if (*start >= range[1])
      lo = mid + 1;
    else
      hi = mid;
  }
  // Buffer order: increasing offsets, the list's run backwards.
  SmallVector<int64_t> run;
  for (size_t i = lo; i < params.size(); ++i) {
    std::optional<int64_t> start = field(i, "start"), end = field(i, "end"),
                           b = field(i, "bucket");
    if (!start || !end || !b || *start < range[0])
      break;
    if (*b == bucket)
      run.push_back(*end - *start);
  }
  sizes.append(run.rbegin(), run.rend());
  return success();
}

static LogicalResult checkBucketTensors(Operation *op, TypeRange parts,
                                        Type flat, ArrayRef<int64_t> sizes,
                                        int64_t bucketNumel, FloatDtype dtype) {
  // The bucket holds the buffer's parameter or gradient dtype.
  auto dtypeOf = [](Type t) -> std::optional<FloatDtype> {
    Type e = cast<RankedTensorType>(t).getElementType();
    return floatDtypeOf(e);
  };
  for (Type t : llvm::concat<const Type>(parts, TypeRange(flat)))
    if (dtypeOf(t) != dtype)
      return op->emitOpError() << "tensor " << t << " is not of the bucket's "
                               << stringifyFloatDtype(dtype);
  if (parts.size() != sizes.size())
    return op->emitOpError() << "has " << parts.size()
                             << " parameter tensors, but the bucket holds "
                             << sizes.size();
  for (auto [i, t, n] : llvm::enumerate(parts, sizes))
    if (cast<RankedTensorType>(t).getNumElements() != n)
      return op->emitOpError() << "parameter tensor #" << i << " has "
                               << cast<RankedTensorType>(t).getNumElements()
                               << " elements, the bucket's slot " << n;
  auto f = cast<RankedTensorType>(flat);
  if (f.getRank() != 1 || f.getDimSize(0) != bucketNumel)
    return op->emitOpError() << "flat tensor " << flat << " must be 1-d with the "
                             << "bucket's " << bucketNumel << " elements";
  return success();
}

LogicalResult BucketReduceStartOp::verifySymbolUses(SymbolTableCollection &st) {
  SmallVector<int64_t> sizes;
  int64_t numel = 0;
  GradBufferOp buf;
  if (failed(resolveBucket(*this, getBufferAttr(), getBucket(), st, sizes, numel,
                           &buf)))
    return failure();
  if (getAccumulate() != buf.getShardGrads() ||
      (getAccumulate() && getKind() != BucketReduceKind::ReduceScatter))
    return emitOpError() << (getAccumulate() ? "accumulates" : "does not accumulate")
                         << " into the shard of @" << getBuffer()
                         << ", whose gradients are "
                         << (buf.getShardGrads() ? "" : "not ")
                         << "sharded (shard_grads); an accumulating reduction "
                            "is a reduce-scatter";
  if (getAccumulate() && getGrads().size() != sizes.size())
    return emitOpError() << "accumulates bucket " << getBucket() << " of @"
                         << getBuffer() << " from " << getGrads().size()
                         << " gradients, but it holds " << sizes.size()
                         << " parameters";
  if (failed(resolveGroup(*this, getMeshAttr(), getGroup(), st)))
    return failure();
  return success();
}

LogicalResult ParamSyncWaitOp::verifySymbolUses(SymbolTableCollection &st) {
  SmallVector<int64_t> sizes;
  int64_t numel = 0;
  return resolveBucket(*this, getBufferAttr(), getBucket(), st, sizes, numel);
}

UnpackOp AllGatherOp::getParamSyncUnpack() {
  if (!getResult().hasOneUse())
    return {};
  auto unpack = dyn_cast<UnpackOp>(*getResult().getUsers().begin());
  return unpack && unpack.getData() == BucketData::Param ? unpack : UnpackOp();
}

LogicalResult AllGatherOp::verify() {
  if (!getParamSync())
    return success();
  if (getDim() != 0 || !getParamSyncUnpack())
    return emitOpError() << "with param_sync gathers a parameter bucket: dim "
                            "0, its one user the dist.unpack of the bucket's "
                            "parameters";
  return success();
}

LogicalResult BucketReduceWaitOp::verifySymbolUses(SymbolTableCollection &st) {
  SmallVector<int64_t> sizes;
  int64_t numel = 0;
  return resolveBucket(*this, getBufferAttr(), getBucket(), st, sizes, numel);
}

LogicalResult PackOp::verifySymbolUses(SymbolTableCollection &st) {
  SmallVector<int64_t> sizes;
  int64_t numel = 0;
  GradBufferOp buf;
  if (failed(resolveBucket(*this, getBufferAttr(), getBucket(), st, sizes, numel,
                           &buf)))
    return failure();
  return checkBucketTensors(
      *this, getInputs().getTypes(), getType(), sizes, numel,
      getData() == BucketData::Grad ? buf.getGradDtype() : buf.getParamDtype());
}

LogicalResult UnpackOp::verifySymbolUses(SymbolTableCollection &st) {
  SmallVector<int64_t> sizes;
  int64_t numel = 0;
  GradBufferOp buf;
  if (failed(resolveBucket(*this, getBufferAttr(), getBucket(), st, sizes, numel,
                           &buf)))
    return failure();
  return checkBucketTensors(
      *this, getResultTypes(), getInput().getType(), sizes, numel,
      getData() == BucketData::Grad ? buf.getGradDtype() : buf.getParamDtype());
}

#define GET_OP_CLASSES
#include "dialects/dist/IR/DistOps.cpp.inc"

//===----------------------------------------------------------------------===//
// RingAttentionOp
//===----------------------------------------------------------------------===//

namespace tessera::dist {

/// Checks ring attention's shapes: qkv [s, b, 3 * heads * d], the context
/// [s, b, heads * d] and the log-sum-exp [s, b, heads], s even (the two
/// chunks of the load-balanced layout).
static LogicalResult verifyRingShapes(Operation *op, RankedTensorType qkv,
                                      RankedTensorType ctx,
                                      RankedTensorType lse, int64_t heads) {
  if (heads < 1)
    return op->emitOpError() << "num_heads must be positive";
  auto known = [](int64_t d) { return !ShapedType::isDynamic(d); };
  int64_t f = qkv.getDimSize(2);
  if (known(f) && f % (3 * heads) != 0)
    return op->emitOpError() << "qkv features " << f << " are not 3 x num_heads ("
                             << heads << ") x head_dim";
  int64_t s = qkv.getDimSize(0);
  if (known(s) && s % 2 != 0)
    return op->emitOpError()
           << "the local sequence (" << s
           << ") must be even: two chunks of the load-balanced layout";
  SmallVector<int64_t> wantCtx{s, qkv.getDimSize(1),
                               known(f) ? f / 3 : ShapedType::kDynamic};
  SmallVector<int64_t> wantLse{s, qkv.getDimSize(1), heads};
  if (!succeeded(verifyCompatibleShape(ctx.getShape(), wantCtx)) ||
      !succeeded(verifyCompatibleShape(lse.getShape(), wantLse)))
    return op->emitOpError() << "expects the context [s, b, heads * d] and the "
                                "log-sum-exp [s, b, heads] of qkv "
                             << qkv << ", got " << ctx << " and " << lse;
  return success();
}

LogicalResult RingAttentionOp::verify() {
  return verifyRingShapes(*this, getQkv().getType(), getResult().getType(),
                          getLse().getType(), getNumHeads());
}

LogicalResult RingAttentionGradOp::verify() {
  return verifyRingShapes(*this, getQkv().getType(), getOutput().getType(),
                          getLse().getType(), getNumHeads());
}

LogicalResult RingAttentionOp::buildAdjoint(OpBuilder &b,
                                            ArrayRef<Value> resultAdj,
                                            ArrayRef<bool> needed,
                                            SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (!needed[0])
    return success();
  if (!resultAdj[0])
    return emitOpError() << "has no gradient for its context";
  adj[0] = RingAttentionGradOp::create(
      b, getLoc(), getQkv().getType(), getQkv(), getResult(), getLse(),
      resultAdj[0], getMeshAttr(), getGroupAttr(), getNumHeadsAttr(),
      getCausalAttr());
  return success();
}

/// FLOPs of this rank's share, counted as nn.attention counts its whole
/// score matrix: its s queries against the s * cp keys of the sequence.
template <typename OpTy>
static int64_t ringFlops(OpTy op, int64_t matmuls) {
  RankedTensorType qkv = op.getQkv().getType();
  int64_t cp = 1;
  if (MeshOp mesh = op.getMeshOp()) {
    std::string error;
    FailureOr<int64_t> size = mesh.getGroupSize(op.getGroup(), error);
    cp = succeeded(size) ? *size : 1;
  }
  int64_t heads = op.getNumHeads();
  int64_t s = qkv.getDimSize(0), b = qkv.getDimSize(1);
  int64_t d = qkv.getDimSize(2) / (3 * heads);
  return b * heads * (matmuls * 2 * s * s * cp * d + 5 * s * s * cp);
}

int64_t RingAttentionOp::getFlops() { return ringFlops(*this, 2); }
int64_t RingAttentionGradOp::getFlops() { return ringFlops(*this, 5); }


//===----------------------------------------------------------------------===//
// Tensor-parallel communication overlapped with GEMMs
//===----------------------------------------------------------------------===//

DEFINE_MESH_LOOKUP(AllGatherMatmulOp)
DEFINE_MESH_LOOKUP(MatmulReduceScatterOp)

namespace {
/// A GEMM's shape as nn.matmul views its operands: lhs `[..., k]` as
/// `[rows, k]`, rhs as `[numel / last, last]` (transposed when asked).
struct GemmShape {
  int64_t k = 0, n = 0;
};
} // namespace

/// The columns of op(rhs): rhs viewed as [numel / last, last], transposed
/// when asked.
static int64_t productColumns(RankedTensorType rhs, bool transposeRhs) {
  ArrayRef<int64_t> shape = rhs.getShape();
  return transposeRhs ? ShapedType::getNumElements(shape.drop_back())
                      : shape.back();
}

/// The product's shape (lhs's leading dimensions, then n), or failure with
/// an error on `op` naming the operands.
static FailureOr<GemmShape> gemmShape(Operation *op, RankedTensorType lhs,
                                      RankedTensorType rhs, bool transposeRhs) {
  if (!lhs.hasStaticShape() || !rhs.hasStaticShape() || lhs.getRank() < 2 ||
      rhs.getRank() < 2)
    return op->emitOpError() << "needs static operands of rank 2 or more, got "
                             << lhs << " and " << rhs;
  if (lhs.getElementType() != rhs.getElementType() ||
      !isa<Float32Type, BFloat16Type, Float16Type>(lhs.getElementType()))
    return op->emitOpError() << "multiplies " << lhs << " by " << rhs
                             << ": both f32, or both bf16 or f16";
  GemmShape g;
  g.n = productColumns(rhs, transposeRhs);
  g.k = productColumns(rhs, !transposeRhs);
  if (lhs.getShape().back() != g.k)
    return op->emitOpError()
           << "multiplies rows of " << lhs.getShape().back() << " features by "
           << (transposeRhs ? "the transpose of " : "") << rhs
           << ", which has " << g.k << " rows";
  return g;
}

static RankedTensorType productType(RankedTensorType lhs, int64_t n) {
  SmallVector<int64_t> shape(lhs.getShape());
  shape.back() = n;
  return RankedTensorType::get(shape, Float32Type::get(lhs.getContext()));
}

LogicalResult AllGatherMatmulOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto gathered = cast<RankedTensorType>(getGathered().getType());
  if (gathered.getElementType() != in.getElementType())
    return emitOpError() << "gathers " << in << " into " << gathered
                         << " of another element type";
  FailureOr<GemmShape> g =
      gemmShape(*this, gathered, cast<RankedTensorType>(getRhs().getType()),
                getTransposeRhs());
  if (failed(g))
    return failure();
  RankedTensorType product = productType(gathered, g->n);
  if (getResult().getType() != product)
    return emitOpError() << "result " << getResult().getType()
                         << " must be the product " << product;
  if (Value bias = getBias()) {
    auto b = cast<RankedTensorType>(bias.getType());
    if (!b.getElementType().isF32() || !b.hasStaticShape() ||
        b.getNumElements() != g->n)
      return emitOpError() << "bias " << b << " must be " << g->n
                           << " f32 values";
  }
  return success();
}

LogicalResult
AllGatherMatmulOp::verifySymbolUses(SymbolTableCollection &st) {
  FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st);
  if (failed(size))
    return failure();
  return checkScaledDim(*this, cast<RankedTensorType>(getInput().getType()),
                        cast<RankedTensorType>(getGathered().getType()), 0,
                        *size, /*gather=*/true);
}

LogicalResult MatmulReduceScatterOp::verify() {
  auto lhs = cast<RankedTensorType>(getLhs().getType());
  FailureOr<GemmShape> g = gemmShape(
      *this, lhs, cast<RankedTensorType>(getRhs().getType()), getTransposeRhs());
  if (failed(g))
    return failure();
  auto result = cast<RankedTensorType>(getResult().getType());
  if (!result.getElementType().isF32())
    return emitOpError() << "result " << result << " must be f32";
  return success();
}

LogicalResult
MatmulReduceScatterOp::verifySymbolUses(SymbolTableCollection &st) {
  FailureOr<int64_t> size = resolveGroup(*this, getMeshAttr(), getGroup(), st);
  if (failed(size))
    return failure();
  auto lhs = cast<RankedTensorType>(getLhs().getType());
  int64_t n = productColumns(cast<RankedTensorType>(getRhs().getType()),
                             getTransposeRhs());
  return checkScaledDim(*this, productType(lhs, n),
                        cast<RankedTensorType>(getResult().getType()), 0, *size,
                        /*gather=*/false);
}

int64_t AllGatherMatmulOp::getFlops() {
  auto y = cast<RankedTensorType>(getResult().getType());
  auto xg = cast<RankedTensorType>(getGathered().getType());
  if (!y.hasStaticShape() || !xg.hasStaticShape())
    return 0;
  return 2 * y.getNumElements() * xg.getShape().back() +
         (getBias() ? y.getNumElements() : 0);
}

int64_t MatmulReduceScatterOp::getFlops() {
  auto lhs = cast<RankedTensorType>(getLhs().getType());
  auto rhs = cast<RankedTensorType>(getRhs().getType());
  if (!lhs.hasStaticShape() || !rhs.hasStaticShape())
    return 0;
  int64_t n = productColumns(rhs, getTransposeRhs());
  // The product's (the ring's additions are the reduction's, which no
  // collective counts).
  return 2 * lhs.getNumElements() * n;
}

} // namespace tessera::dist
