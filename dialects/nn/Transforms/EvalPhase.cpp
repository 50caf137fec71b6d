//===- EvalPhase.cpp - tessera-eval-phase: the forward-only phase ---------===//
//
// Megatron's evaluate() runs forward_backward_func(forward_only=True) with
// the model in eval mode: the loss of each microbatch and nothing else. The
// pass copies the microbatch phase (or each pipeline chunk's forward) and
// keeps of the copy what the loss and the activation sends need (and the
// waits of overlap-param-gather: an evaluation right after a step reads
// the parameters its gathers are still writing).
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/IR/NNOps.h"
#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/SetVector.h"

namespace tessera::nn {
#define GEN_PASS_DEF_EVALPHASEPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;

namespace {

struct EvalPhasePass : tessera::nn::impl::EvalPhasePassBase<EvalPhasePass> {
  void runOnOperation() override;
};

/// The evaluation copy of `source` (a microbatch or forward phase), placed
/// after it.
void addEvalPhase(func::FuncOp source) {
  OpBuilder b(source);
  b.setInsertionPointAfter(source);
  auto eval = cast<func::FuncOp>(b.clone(*source.getOperation()));
  StringRef name = source.getSymName();
  // forward_c<k> -> eval_c<k>; the microbatch phase -> eval.
  eval.setSymName(name.starts_with("forward")
                      ? (kEvalPhase + name.drop_front(7)).str()
                      : kEvalPhase.str());
  eval->setAttr(kPhaseAttr, b.getStringAttr(kEvalPhase));

  // Model.eval(): dropout passes its input through.
  SmallVector<nn::DropoutOp> dropouts;
  eval.walk([&](nn::DropoutOp d) { dropouts.push_back(d); });
  for (nn::DropoutOp d : dropouts) {
    d.getResult().replaceAllUsesWith(d.getInput());
    d.erase();
  }

  // The loss is the one result kept (gradients and saved activations go).
  Block &body = eval.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  llvm::BitVector drop(eval.getNumResults());
  SmallVector<Value> kept;
  for (unsigned i = 0, e = eval.getNumResults(); i < e; ++i) {
    auto binding = eval.getResultAttrOfType<StringAttr>(i, kBufferAttr);
    if (binding && binding.getValue() == "loss")
      kept.push_back(ret.getOperand(i));
    else
      drop.set(i);
  }
  ret->setOperands(kept);
  (void)eval.eraseResults(drop);

  // What the loss and the sends of activations need; the rest (the
  // backward, its collectives, bucket reductions) goes.
  llvm::SetVector<Operation *> needed;
  SmallVector<Operation *> work{ret};
  for (Operation &op : body)
    if (isa<dist::SendOp, dist::ParamSyncWaitOp>(op))
      work.push_back(&op);
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    if (!needed.insert(op))
      continue;
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && def->getBlock() == &body)
        work.push_back(def);
  }
  SmallVector<Operation *> dead;
  for (Operation &op : llvm::reverse(body))
    if (!needed.contains(&op))
      dead.push_back(&op);
  for (Operation *op : dead) {
    op->dropAllUses();
    op->erase();
  }
}

void EvalPhasePass::runOnOperation() {
  for (ModuleOp program : getPrograms(getOperation())) {
    SmallVector<func::FuncOp> sources;
    for (auto f : program.getOps<func::FuncOp>()) {
      auto phase = f->getAttrOfType<StringAttr>(kPhaseAttr);
      // The last microbatch's variant differs in its gradient reductions
      // only.
      if (!phase || f->hasAttr(kLastMicrobatchAttr))
        continue;
      if (phase.getValue() == kMicrobatchPhase || phase.getValue() == kForwardPhase)
        sources.push_back(f);
    }
    for (func::FuncOp f : sources)
      addEvalPhase(f);
  }
}

} // namespace
