//===- TPCommOverlap.cpp - Sequence-parallel collectives fused with GEMMs -===//
//
// Megatron-LM's --tp-comm-overlap: under sequence parallelism every
// tensor-parallel region starts with an all-gather of the sequence shards
// that a column-parallel GEMM reads, and ends with a row-parallel GEMM whose
// partial sums are reduce-scattered (and the backward mirrors both). Each
// such pair becomes one op the runtime pipelines around the tp ring
// (dist.all_gather_matmul, dist.matmul_reduce_scatter), so that the
// transfer of one block of rows runs under the GEMM of another.
//
// The pass runs after autodiff, the recomputation and the zero-bubble
// split, so every phase's pairs are found as they will run; it changes no
// value, only how the collectives and GEMMs are scheduled together (but
// under bf16 activations, where the fused reduce-scatter sums the f32
// partial sums and rounds once instead of summing rounded ones). Under
// mixed precision tessera-cast-before-gather has already made the gathers
// carry the GEMMs' bf16 rows.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_TPCOMMOVERLAPPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct TPCommOverlapPass
    : tessera::dist::impl::TPCommOverlapPassBase<TPCommOverlapPass> {
  using TPCommOverlapPassBase::TPCommOverlapPassBase;
  void runOnOperation() override;
};

/// The tensor-parallel group's sequence collectives (Megatron's
/// gather_from_sequence_parallel_region and
/// reduce_scatter_to_sequence_parallel_region).
constexpr StringLiteral kTPGroup = "tp";

/// A GEMM the fused ops can take: rows of `lhs` (not transposed) times
/// op(`rhs`), plus `bias`, written as `result` with lhs's leading shape.
struct Gemm {
  Operation *op = nullptr;
  Value lhs, rhs, bias, result;
  bool transposeRhs = false;
};

std::optional<Gemm> asGemm(Operation *op) {
  Gemm g;
  g.op = op;
  if (auto l = dyn_cast<nn::LinearOp>(op)) {
    g.lhs = l.getInput();
    g.rhs = l.getWeight();
    g.bias = l.getBias();
    g.result = l.getResult();
    g.transposeRhs = true;
  } else if (auto m = dyn_cast<nn::MatmulOp>(op); m && !m.getTransposeLhs()) {
    g.lhs = m.getLhs();
    g.rhs = m.getRhs();
    g.result = m.getResult();
    g.transposeRhs = m.getTransposeRhs();
    // nn.matmul may give its result another shape of the same matrix; the
    // fused ops keep lhs's leading dimensions.
    auto lhs = cast<RankedTensorType>(g.lhs.getType());
    auto res = cast<RankedTensorType>(g.result.getType());
    if (res.getRank() != lhs.getRank() ||
        res.getShape().drop_back() != lhs.getShape().drop_back())
      return std::nullopt;
  } else {
    return std::nullopt;
  }
  // Both operands one value (x @ x^T) is not a GEMM of gathered rows.
  if (g.rhs == g.lhs || (g.bias && g.bias == g.lhs))
    return std::nullopt;
  return g;
}

bool isSequenceCollective(StringRef group, int64_t dim) {
  return group == kTPGroup && dim == 0;
}

/// The op after which `values` (and `after`) are all defined, in `after`'s
/// block; null when one is defined in another block.
Operation *lastDefinition(Operation *after, ArrayRef<Value> values) {
  for (Value v : values) {
    if (!v)
      continue;
    Operation *def = v.getDefiningOp();
    if (!def) {
      if (cast<BlockArgument>(v).getOwner() != after->getBlock())
        return nullptr;
      continue;
    }
    if (def->getBlock() != after->getBlock())
      return nullptr;
    if (after->isBeforeInBlock(def))
      after = def;
  }
  return after;
}

/// all_gather then the GEMM of its rows: one dist.all_gather_matmul where
/// the GEMM's operands are all defined and before every other reader of
/// the gathered rows.
bool fuseGather(AllGatherOp gather) {
  Value g = gather.getResult();
  SmallVector<Operation *> users(g.getUsers());
  if (llvm::any_of(users, [&](Operation *user) {
        return user->getBlock() != gather->getBlock();
      }))
    return false;
  llvm::sort(users, [](Operation *a, Operation *b) {
    return a->isBeforeInBlock(b);
  });
  std::optional<Gemm> gemm;
  for (Operation *user : users)
    if (auto candidate = asGemm(user); candidate && candidate->lhs == g) {
      gemm = candidate;
      break;
    }
  if (!gemm)
    return false;
  Operation *at = lastDefinition(gather, {gemm->rhs, gemm->bias});
  if (!at)
    return false;
  // Not above a wait that finishes a parameter bucket's gather
  // (--overlap-param-gather places it right before the bucket's first
  // reader, which may be this GEMM): its weight is ready only after it.
  for (Operation *op = gather->getNextNode(); op && op != gemm->op;
       op = op->getNextNode())
    if (isa<ParamSyncWaitOp>(op) && at->isBeforeInBlock(op))
      at = op;
  for (Operation *user : users)
    if (user != gemm->op && !at->isBeforeInBlock(user))
      return false;
  OpBuilder b(gather->getContext());
  b.setInsertionPointAfter(at);
  auto fused = AllGatherMatmulOp::create(
      b, gemm->op->getLoc(), TypeRange{g.getType(), gemm->result.getType()},
      gather.getInput(), gemm->rhs, gemm->bias, gather.getMeshAttr(),
      gather.getGroupAttr(), gemm->transposeRhs ? b.getUnitAttr() : nullptr);
  fused->setDiscardableAttrs(gemm->op->getDiscardableAttrDictionary());
  gemm->result.replaceAllUsesWith(fused.getResult());
  gemm->op->erase();
  g.replaceAllUsesWith(fused.getGathered());
  gather.erase();
  return true;
}

/// The GEMM whose partial sums a reduce_scatter reads (its only reader):
/// one dist.matmul_reduce_scatter. A GEMM with a bias is left alone (the
/// bias would be summed tp times; tp-partition adds it after the
/// reduction). Under bf16 activations the reduce-scatter reads the
/// partial sums rounded to bf16 (an nn.cast, their only reader): the fused
/// op's ring then carries the GEMM's f32 partial sums, and its result is
/// rounded once, after the sum.
bool fuseScatter(ReduceScatterOp scatter) {
  Value partial = scatter.getInput();
  nn::CastOp narrow = partial.getDefiningOp<nn::CastOp>();
  if (narrow && narrow.getInput().hasOneUse() &&
      cast<RankedTensorType>(narrow.getInput().getType())
          .getElementType()
          .isF32())
    partial = narrow.getInput();
  else
    narrow = nullptr;
  Operation *def = partial.getDefiningOp();
  if (!def || !scatter.getInput().hasOneUse() ||
      def->getBlock() != scatter->getBlock())
    return false;
  std::optional<Gemm> gemm = asGemm(def);
  if (!gemm || gemm->bias)
    return false;
  OpBuilder b(scatter);
  auto type = cast<RankedTensorType>(scatter.getType());
  auto fused = MatmulReduceScatterOp::create(
      b, scatter.getLoc(),
      RankedTensorType::get(type.getShape(),
                            cast<RankedTensorType>(partial.getType())
                                .getElementType()),
      gemm->lhs, gemm->rhs, scatter.getMeshAttr(), scatter.getGroupAttr(),
      gemm->transposeRhs ? b.getUnitAttr() : nullptr);
  fused->setDiscardableAttrs(scatter->getDiscardableAttrDictionary());
  Value result = fused.getResult();
  if (narrow) {
    auto rounded = nn::CastOp::create(b, scatter.getLoc(), type, result);
    rounded->setDiscardableAttrs(narrow->getDiscardableAttrDictionary());
    result = rounded.getResult();
  }
  scatter.getResult().replaceAllUsesWith(result);
  scatter.erase();
  if (narrow)
    narrow.erase();
  gemm->op->erase();
  return true;
}
} // namespace

void TPCommOverlapPass::runOnOperation() {
  SmallVector<AllGatherOp> gathers;
  SmallVector<ReduceScatterOp> scatters;
  getOperation().walk([&](Operation *op) {
    if (auto g = dyn_cast<AllGatherOp>(op);
        g && !g.getParamSync() && isSequenceCollective(g.getGroup(), g.getDim()))
      gathers.push_back(g);
    if (auto s = dyn_cast<ReduceScatterOp>(op);
        s && isSequenceCollective(s.getGroup(), s.getDim()))
      scatters.push_back(s);
  });
  // The reduce-scatters first: a GEMM between a gather and a scatter (a
  // region of one linear) then goes to the scatter, whose partial sums
  // cannot otherwise leave it, and the gather keeps its plain form.
  if (reduceScatter)
    for (ReduceScatterOp s : scatters)
      if (fuseScatter(s))
        ++numScatter;
  if (!allGather)
    return;
  for (AllGatherOp g : gathers)
    if (fuseGather(g))
      ++numGather;
}
