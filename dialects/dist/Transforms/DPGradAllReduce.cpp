//===- DPGradAllReduce.cpp - Data-parallel gradient averaging -------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"

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
    for (ModuleOp program : getPrograms(getOperation()))
      if (failed(runOnProgram(program)))
        return signalPassFailure();
  }

  LogicalResult runOnProgram(ModuleOp module) {
    // The functions that produce gradients: the microbatch phase, or the
    // backward phase of every pipeline chunk.
    SmallVector<func::FuncOp> producers;
    for (auto f : module.getOps<func::FuncOp>())
      if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr))
        if (p.getValue() == kMicrobatchPhase || p.getValue() == kBackwardPhase)
          producers.push_back(f);
    if (producers.empty())
      return emitError(module.getLoc())
             << "tessera-dp-grad-allreduce needs the microbatch or backward "
                "phases (run tessera-autodiff)";
    if (getPhaseFunc(module, kStepPhase))
      return emitError(module.getLoc()) << "the module already has a step phase";
    MeshOp mesh = lookupMesh(module);
    int64_t dp = mesh ? mesh.getDp() : 1;

    // Parameters shared with another pipeline rank (dist.tied).
    llvm::StringMap<StringAttr> tiedGroup;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          if (auto group = f.getArgAttrOfType<StringAttr>(i, kTiedAttr))
            tiedGroup[name.getValue()] = group;

    // The gradients the phases accumulate, in order of first appearance. A
    // gradient that ends in a sum all-reduce (a parameter entering a
    // tensor-parallel region through copy_to_region, e.g. layer norms under
    // sequence parallelism) is accumulated unreduced and reduced once per
    // step: the sum of the reductions is the reduction of the sum, and it
    // moves 1/M the bytes (Megatron all-reduces these gradients once, after
    // the last microbatch).
    llvm::StringMap<unsigned> producerCount;
    for (func::FuncOp f : producers)
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        if (auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
          ++producerCount[of.getValue()];
    SmallVector<Type> types;
    SmallVector<StringAttr> names;
    SmallVector<StringAttr> deferredGroups;
    llvm::StringSet<> seen;
    for (func::FuncOp f : producers) {
      auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i) {
        auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr);
        if (!of || !seen.insert(of.getValue()).second)
          continue;
        types.push_back(f.getResultTypes()[i]);
        names.push_back(of);
        StringAttr group;
        auto reduce = ret.getOperand(i).getDefiningOp<AllReduceOp>();
        if (producerCount[of.getValue()] == 1 && reduce &&
            reduce.getReduction() == "sum" && reduce.getResult().hasOneUse()) {
          group = reduce.getGroupAttr();
          ret.setOperand(i, reduce.getInput());
          reduce.erase();
        }
        deferredGroups.push_back(group);
      }
    }

    OpBuilder b(module.getContext());
    b.setInsertionPointAfter(producers.back());
    auto step = func::FuncOp::create(b, producers.back().getLoc(), "step",
                                     b.getFunctionType(types, types));
    step->setAttr(kPhaseAttr, b.getStringAttr(kStepPhase));
    Block *body = step.addEntryBlock();
    b.setInsertionPointToStart(body);
    SmallVector<Value> results;
    // Bindings set in one go: per-argument updates rebuild the whole
    // attribute array each time (quadratic in the number of parameters).
    SmallVector<DictionaryAttr> bindings;
    auto meshRef = [&] { return FlatSymbolRefAttr::get(mesh.getSymNameAttr()); };
    for (auto [i, name] : llvm::enumerate(names)) {
      bindings.push_back(b.getDictionaryAttr(b.getNamedAttr(
          kBufferAttr, b.getStringAttr("grad:" + name.getValue()))));
      Value g = body->getArgument(i);
      if (StringAttr group = deferredGroups[i])
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g, meshRef(),
                                group, b.getStringAttr("sum"));
      // The tied embedding: both pipeline ranks' parts of the gradient
      // (Megatron's embedding-group all-reduce).
      if (StringAttr group = tiedGroup.lookup(name.getValue()))
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g, meshRef(),
                                group, b.getStringAttr("sum"));
      if (dp > 1) {
        // Megatron scales by 1/dp before the sum (gradient_scaling_factor).
        g = nn::ScaleOp::create(b, step.getLoc(), g,
                                b.getF32FloatAttr(1.0f / float(dp)));
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g, meshRef(),
                                b.getStringAttr("dp"), b.getStringAttr("sum"));
      }
      results.push_back(g);
    }
    func::ReturnOp::create(b, step.getLoc(), results);
    step.setAllArgAttrs(bindings);
    step.setAllResultAttrs(bindings);
    return success();
  }
};
} // namespace
