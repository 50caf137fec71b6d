//===- DPGradAllReduce.cpp - Data-parallel gradient averaging -------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_DPGRADALLREDUCEPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct DPGradAllReducePass
    : tessera::dist::impl::DPGradAllReducePassBase<DPGradAllReducePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp micro = getPhaseFunc(module, kMicrobatchPhase);
    if (!micro) {
      emitError(module.getLoc()) << "tessera-dp-grad-allreduce needs the "
                                    "microbatch phase (run tessera-autodiff)";
      return signalPassFailure();
    }
    if (getPhaseFunc(module, kStepPhase)) {
      emitError(module.getLoc()) << "the module already has a step phase";
      return signalPassFailure();
    }
    MeshOp mesh = lookupMesh(module);
    int64_t dp = mesh ? mesh.getDp() : 1;

    // The gradients the microbatch phase accumulates. A gradient that ends
    // in a sum all-reduce (a parameter entering a tensor-parallel region
    // through copy_to_region, e.g. layer norms under sequence parallelism)
    // is accumulated unreduced and reduced once per step: the sum of the
    // reductions is the reduction of the sum, and it moves 1/M the bytes
    // (Megatron all-reduces these gradients once, after the last
    // microbatch).
    SmallVector<Type> types;
    SmallVector<StringAttr> names;
    SmallVector<StringAttr> deferredGroups;
    auto ret = cast<func::ReturnOp>(micro.getBody().front().getTerminator());
    for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
      if (auto of = micro.getResultAttrOfType<StringAttr>(i, kGradOfAttr)) {
        types.push_back(micro.getResultTypes()[i]);
        names.push_back(of);
        StringAttr group;
        auto reduce = ret.getOperand(i).getDefiningOp<AllReduceOp>();
        if (reduce && reduce.getReduction() == "sum" &&
            reduce.getResult().hasOneUse()) {
          group = reduce.getGroupAttr();
          ret.setOperand(i, reduce.getInput());
          reduce.erase();
        }
        deferredGroups.push_back(group);
      }

    OpBuilder b(module.getContext());
    b.setInsertionPointAfter(micro);
    auto step = func::FuncOp::create(b, micro.getLoc(), "step",
                                     b.getFunctionType(types, types));
    step->setAttr(kPhaseAttr, b.getStringAttr(kStepPhase));
    Block *body = step.addEntryBlock();
    b.setInsertionPointToStart(body);
    SmallVector<Value> results;
    // Bindings set in one go: per-argument updates rebuild the whole
    // attribute array each time (quadratic in the number of parameters).
    SmallVector<DictionaryAttr> bindings;
    for (auto [i, name] : llvm::enumerate(names)) {
      bindings.push_back(b.getDictionaryAttr(b.getNamedAttr(
          kBufferAttr, b.getStringAttr("grad:" + name.getValue()))));
      Value g = body->getArgument(i);
      if (StringAttr group = deferredGroups[i])
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g,
                                FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                                group, b.getStringAttr("sum"));
      if (dp > 1) {
        // Megatron scales by 1/dp before the sum (gradient_scaling_factor).
        g = nn::ScaleOp::create(b, step.getLoc(), g,
                                b.getF32FloatAttr(1.0f / float(dp)));
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g,
                                FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                                b.getStringAttr("dp"), b.getStringAttr("sum"));
      }
      results.push_back(g);
    }
    func::ReturnOp::create(b, step.getLoc(), results);
    step.setAllArgAttrs(bindings);
    step.setAllResultAttrs(bindings);
  }
};
} // namespace
