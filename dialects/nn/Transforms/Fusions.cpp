//===- Fusions.cpp - Model-level fusions of elementwise ops ---------------===//
//
// Rewrites of the model (before autodiff) that let the runtime run two
// passes over an activation as one kernel, the way Megatron's fused
// kernels do. Each is a pass of its own, so that the pipeline can turn it
// off for comparison; the rewritten model computes the same values.
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::nn {
#define GEN_PASS_DEF_FUSEBIASGELUPASS
#define GEN_PASS_DEF_FUSECROSSENTROPYPASS
#define GEN_PASS_DEF_FUSEADDLAYERNORMPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {

/// The model's functions (of every pipeline program); fails, with an error,
/// on a training phase: the fusions rewrite the forward model.
FailureOr<SmallVector<func::FuncOp>> modelFunctions(ModuleOp root,
                                                    StringRef pass) {
  SmallVector<func::FuncOp> funcs;
  for (ModuleOp program : getPrograms(root))
    for (auto f : program.getOps<func::FuncOp>()) {
      if (f->hasAttr(kPhaseAttr)) {
        f.emitOpError() << "is a training phase; " << pass
                        << " runs on the model, before tessera-autodiff";
        return failure();
      }
      if (!f.isExternal())
        funcs.push_back(f);
    }
  return funcs;
}

struct FuseBiasGeluPass
    : tessera::nn::impl::FuseBiasGeluPassBase<FuseBiasGeluPass> {
  void runOnOperation() override {
    auto funcs = modelFunctions(getOperation(), getArgument());
    if (failed(funcs))
      return signalPassFailure();
    for (func::FuncOp f : *funcs) {
      SmallVector<GeluOp> gelus;
      f.walk([&](GeluOp g) { gelus.push_back(g); });
      for (GeluOp g : gelus)
        fuse(g);
    }
  }

  /// Rewrites `gelu(linear(x, W, b))` or `gelu(bias_add(y, b))` when the
  /// GELU is the biased value's only reader.
  static void fuse(GeluOp gelu) {
    Value in = gelu.getInput();
    if (!in.hasOneUse())
      return;
    Operation *def = in.getDefiningOp();
    if (def && !sameRecomputeGroup(def, gelu))
      return;
    OpBuilder b(gelu);
    Value unbiased, bias;
    if (auto linear = dyn_cast_or_null<LinearOp>(def)) {
      if (!linear.getBias())
        return;
      b.setInsertionPoint(linear);
      auto gemm = LinearOp::create(b, linear.getLoc(), linear.getInput(),
                                   linear.getWeight(), Value());
      gemm->setDiscardableAttrs(linear->getDiscardableAttrDictionary());
      unbiased = gemm.getResult();
      bias = linear.getBias();
    } else if (auto add = dyn_cast_or_null<BiasAddOp>(def)) {
      unbiased = add.getInput();
      bias = add.getBias();
    } else {
      return;
    }
    b.setInsertionPoint(gelu);
    auto fused = BiasGeluOp::create(b, gelu.getLoc(), unbiased, bias,
                                    gelu.getApproximate());
    fused->setDiscardableAttrs(gelu->getDiscardableAttrDictionary());
    gelu.replaceAllUsesWith(fused.getResult());
    gelu.erase();
    def->erase();
  }
};

struct FuseCrossEntropyPass
    : tessera::nn::impl::FuseCrossEntropyPassBase<FuseCrossEntropyPass> {
  void runOnOperation() override {
    auto funcs = modelFunctions(getOperation(), getArgument());
    if (failed(funcs))
      return signalPassFailure();
    for (func::FuncOp f : *funcs) {
      SmallVector<SoftmaxCrossEntropyOp> losses;
      f.walk([&](SoftmaxCrossEntropyOp ce) {
        if (ce.getIgnoreIndex())
          losses.push_back(ce);
      });
      for (SoftmaxCrossEntropyOp ce : losses) {
        OpBuilder b(ce);
        IntegerAttr ignore = ce.getIgnoreIndexAttr();
        auto stats = LogitsStatsOp::create(b, ce.getLoc(), ce.getLogits(),
                                           ce.getLabels(), ignore);
        auto loss = CrossEntropyFromStatsOp::create(
            b, ce.getLoc(), ce.getLogits(), ce.getLabels(), stats.getMax(),
            stats.getSumExp(), stats.getPredicted(), ignore,
            /*vocab_shard_group=*/nullptr);
        stats->setDiscardableAttrs(ce->getDiscardableAttrDictionary());
        loss->setDiscardableAttrs(ce->getDiscardableAttrDictionary());
        ce.replaceAllUsesWith(loss.getResult());
        ce.erase();
      }
    }
  }
};

struct FuseAddLayerNormPass
    : tessera::nn::impl::FuseAddLayerNormPassBase<FuseAddLayerNormPass> {
  void runOnOperation() override {
    auto funcs = modelFunctions(getOperation(), getArgument());
    if (failed(funcs))
      return signalPassFailure();
    for (func::FuncOp f : *funcs) {
      SmallVector<Operation *> norms;
      f.walk([&](Operation *op) {
        if (isa<LayerNormOp, RMSNormOp>(op) &&
            op->getOperand(0).getDefiningOp<AddOp>())
          norms.push_back(op);
      });
      for (Operation *norm : norms) {
        // Another norm of the same sum may have fused it already.
        auto add = norm->getOperand(0).getDefiningOp<AddOp>();
        // A recomputed group starts from one saved tensor: the residual
        // add ending one group stays apart from the next group's norm.
        if (!add || !sameRecomputeGroup(add, norm))
          continue;
        // At the norm when the sum's other readers follow it (its weight
        // and bias, which tessera-mixed-precision may cast right before it,
        // are defined there); else at the add, if they are defined there
        // already.
        OpBuilder b(norm);
        if (!llvm::all_of(add->getUsers(), [&](Operation *u) {
              return u == norm || norm->isBeforeInBlock(u);
            })) {
          if (!llvm::all_of(norm->getOperands().drop_front(),
                            [&](Value v) { return definedBefore(v, add); }))
            continue;
          b.setInsertionPoint(add);
        }
        Operation *fused;
        if (auto ln = dyn_cast<LayerNormOp>(norm))
          fused = AddLayerNormOp::create(b, add.getLoc(), add.getLhs(),
                                         add.getRhs(), ln.getWeight(),
                                         ln.getBias(), ln.getEpsAttr());
        else
          fused = AddRMSNormOp::create(
              b, add.getLoc(), add.getLhs(), add.getRhs(),
              cast<RMSNormOp>(norm).getWeight(),
              cast<RMSNormOp>(norm).getEpsAttr());
        fused->setDiscardableAttrs(norm->getDiscardableAttrDictionary());
        norm->getResult(0).replaceAllUsesWith(fused->getResult(1));
        norm->erase();
        add.replaceAllUsesWith(fused->getResult(0));
        add.erase();
      }
    }
  }

  /// Whether `v` is available at `add` (an argument, or defined before it).
  static bool definedBefore(Value v, AddOp add) {
    Operation *def = v.getDefiningOp();
    return !def || (def->getBlock() == add->getBlock() &&
                    def->isBeforeInBlock(add));
  }
};

} // namespace
