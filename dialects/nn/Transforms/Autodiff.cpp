//===- Autodiff.cpp - Reverse-mode differentiation ------------------------===//
//
// The model function becomes the microbatch phase: forward, then a reverse
// sweep that asks each op for its adjoints (DifferentiableOpInterface), then
// a return of the loss and one gradient per parameter. Only values that
// depend on a parameter are differentiated.
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::nn {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {
struct AutodiffPass : tessera::nn::impl::AutodiffPassBase<AutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (getPhaseFunc(module, kMicrobatchPhase)) {
      emitError(module.getLoc()) << "the module is already differentiated";
      return signalPassFailure();
    }
    func::FuncOp model = getModelFunc(module);
    if (!model)
      return signalPassFailure();
    Block &body = model.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    if (ret.getNumOperands() != 1 ||
        !isa<RankedTensorType>(ret.getOperand(0).getType()) ||
        cast<RankedTensorType>(ret.getOperand(0).getType()).getRank() != 0) {
      model.emitOpError() << "must return exactly one 0-d loss tensor to be "
                             "differentiated";
      return signalPassFailure();
    }
    Value loss = ret.getOperand(0);

    // Forward: which values depend on a parameter.
    DenseSet<Value> active;
    SmallVector<BlockArgument> params;
    for (BlockArgument arg : body.getArguments())
      if (model.getArgAttr(arg.getArgNumber(), kParamAttr)) {
        active.insert(arg);
        params.push_back(arg);
      }
    for (Operation &op : body.without_terminator())
      if (!op.hasTrait<NonDifferentiable>() &&
          llvm::any_of(op.getOperands(),
                       [&](Value v) { return active.contains(v); }))
        for (Value r : op.getResults())
          active.insert(r);

    // Reverse sweep.
    OpBuilder b(ret);
    DenseMap<Value, Value> adjoint;
    auto accumulate = [&](Value v, Value adj) {
      auto [it, inserted] = adjoint.try_emplace(v, adj);
      if (!inserted)
        it->second = AddOp::create(b, adj.getLoc(), it->second, adj);
    };
    float seed = 1.0f / float(getNumMicrobatches(module));
    accumulate(loss, FillOp::create(b, loss.getLoc(), loss.getType(),
                                    b.getF32FloatAttr(seed)));

    SmallVector<Operation *> forward;
    for (Operation &op : body.without_terminator())
      forward.push_back(&op);
    for (Operation *op : llvm::reverse(forward)) {
      SmallVector<Value> resultAdj;
      bool any = false;
      for (Value r : op->getResults()) {
        Value a = adjoint.lookup(r);
        any |= bool(a);
        resultAdj.push_back(a);
      }
      if (!any)
        continue;
      SmallVector<bool> needed;
      bool anyNeeded = false;
      for (Value operand : op->getOperands()) {
        needed.push_back(active.contains(operand));
        anyNeeded |= needed.back();
      }
      if (!anyNeeded)
        continue;
      auto diff = dyn_cast<DifferentiableOpInterface>(op);
      if (!diff) {
        op->emitOpError() << "has no gradient rule (DifferentiableOpInterface)";
        return signalPassFailure();
      }
      // Results nothing depends on have a null adjoint; each op's rule
      // treats that as zero.
      if (op->getNumResults() > 1 &&
          llvm::any_of(resultAdj, [](Value v) { return !v; })) {
        op->emitOpError() << "has results without adjoints; its gradient "
                             "rule needs every result's adjoint";
        return signalPassFailure();
      }
      SmallVector<Value> operandAdj;
      if (failed(diff.buildAdjoint(b, resultAdj, needed, operandAdj)))
        return signalPassFailure();
      for (auto [operand, adj] : llvm::zip(op->getOperands(), operandAdj))
        if (adj && active.contains(operand))
          accumulate(operand, adj);
    }

    // Return the loss and one gradient per parameter.
    SmallVector<Value> results{loss};
    for (BlockArgument p : params) {
      Value g = adjoint.lookup(p);
      if (!g) // unused parameter: zero gradient
        g = FillOp::create(b, p.getLoc(), p.getType(), b.getF32FloatAttr(0));
      results.push_back(g);
    }
    func::ReturnOp::create(b, ret.getLoc(), results);
    ret.erase();
    updateFunctionType(model);

    SmallVector<DictionaryAttr> resultAttrs{b.getDictionaryAttr(
        b.getNamedAttr(kBufferAttr, b.getStringAttr("loss")))};
    for (BlockArgument p : params)
      resultAttrs.push_back(b.getDictionaryAttr(b.getNamedAttr(
          kGradOfAttr, model.getArgAttr(p.getArgNumber(), kParamAttr))));
    model.setAllResultAttrs(resultAttrs);
    model->setAttr(kPhaseAttr, b.getStringAttr(kMicrobatchPhase));
  }
};
} // namespace
