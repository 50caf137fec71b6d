//===- CastBeforeGather.cpp - Gather the GEMMs' 16-bit rows ---------------===//
//
// Under mixed precision (tessera-mixed-precision) a GEMM reads the bf16 or
// f16 cast of its f32 operand. Where the operand is an all-gather (sequence
// parallelism's gather before each column-parallel GEMM, and autodiff's
// gradient gather before each row-parallel input gradient), the gather can
// carry the cast rows instead: the cast is elementwise, so gathering the
// cast is the cast of the gather, bit for bit, in half the bytes. Megatron-
// LM's bf16 runs gather bf16 activations the same way.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_CASTBEFOREGATHERPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct CastBeforeGatherPass
    : tessera::dist::impl::CastBeforeGatherPassBase<CastBeforeGatherPass> {
  void runOnOperation() override;
};

/// A gather whose only readers cast it to one type gathers the cast: the
/// same values (the cast is elementwise), half the bytes for bf16, and the
/// GEMM then reads the gather directly.
bool hoistCast(AllGatherOp gather) {
  Value g = gather.getResult();
  if (g.use_empty())
    return false;
  Type to;
  for (Operation *user : g.getUsers()) {
    auto c = dyn_cast<nn::CastOp>(user);
    if (!c || c->getBlock() != gather->getBlock())
      return false;
    Type t = c.getType().getElementType();
    if (to && t != to)
      return false;
    to = t;
  }
  // Only a narrowing cast: a wider one would gather more bytes.
  auto in = gather.getInput().getType();
  if (in.getElementType() == to ||
      to.getIntOrFloatBitWidth() >= in.getElementType().getIntOrFloatBitWidth())
    return false;
  auto first = cast<nn::CastOp>(*llvm::min_element(
      g.getUsers(), [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      }));
  OpBuilder b(gather);
  auto shard = nn::CastOp::create(b, first.getLoc(), in.clone(to),
                                  gather.getInput());
  shard->setDiscardableAttrs(first->getDiscardableAttrDictionary());
  auto gathered = AllGatherOp::create(
      b, gather.getLoc(), gather.getType().clone(to), shard,
      gather.getMeshAttr(), gather.getGroupAttr(), gather.getDimAttr(),
      /*param_sync=*/nullptr);
  gathered->setDiscardableAttrs(gather->getDiscardableAttrDictionary());
  for (Operation *user : llvm::make_early_inc_range(g.getUsers())) {
    user->getResult(0).replaceAllUsesWith(gathered.getResult());
    user->erase();
  }
  gather.erase();
  return true;
}

} // namespace

void CastBeforeGatherPass::runOnOperation() {
  SmallVector<AllGatherOp> gathers;
  getOperation().walk([&](AllGatherOp g) {
    if (!g.getParamSync())
      gathers.push_back(g);
  });
  for (AllGatherOp g : gathers)
    if (hoistCast(g))
      ++numHoisted;
}
