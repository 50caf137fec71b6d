//===- Optimizer.cpp - SGD / Adam update in the step phase ----------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::nn {
#define GEN_PASS_DEF_OPTIMIZERPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {
struct OptimizerPass : tessera::nn::impl::OptimizerPassBase<OptimizerPass> {
  using OptimizerPassBase::OptimizerPassBase;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    if (failed(checkOptions(root)))
      return signalPassFailure();
    for (ModuleOp program : getPrograms(root))
      if (failed(runOnProgram(program)))
        return signalPassFailure();
    setOptimizerAttr(root);
  }

  LogicalResult checkOptions(ModuleOp module) {
    if (optimizer != "sgd" && optimizer != "adam") {
      emitError(module.getLoc()) << "unknown optimizer '" << std::string(optimizer)
                                 << "' (expected sgd or adam)";
      return failure();
    }
    if (lrDecayStyle != "constant" && lrDecayStyle != "linear" &&
        lrDecayStyle != "cosine") {
      emitError(module.getLoc()) << "unknown lr-decay-style '"
                                 << std::string(lrDecayStyle)
                                 << "' (expected constant, linear or cosine)";
      return failure();
    }
    if (lrWarmupIters < 0 || minLr < 0 || minLr > lr ||
        (lrDecayStyle != "constant" && lrDecayIters <= lrWarmupIters)) {
      emitError(module.getLoc())
          << "invalid learning-rate schedule: warmup " << int64_t(lrWarmupIters)
          << ", decay to iteration " << int64_t(lrDecayIters) << ", lr "
          << double(lr) << ", min-lr " << double(minLr)
          << " (a decay needs lr-decay-iters > lr-warmup-iters and 0 <= "
             "min-lr <= lr)";
      return failure();
    }
    return success();
  }

  LogicalResult runOnProgram(ModuleOp module) {
    func::FuncOp step = getPhaseFunc(module, kStepPhase);
    if (!step)
      return emitError(module.getLoc())
             << "tessera-optimizer needs the microbatch (or forward) and step "
                "phases (run tessera-autodiff and tessera-dp-grad-allreduce)";

    // Parameter types by name, from the phases that take parameters.
    llvm::StringMap<Type> paramTypes;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          paramTypes[name.getValue()] = f.getArgumentTypes()[i];

    Block &body = step.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    OpBuilder b(ret);
    Location loc = step.getLoc();
    bool adam = optimizer == "adam";

    SmallVector<Value> newResults;
    SmallVector<std::string> newBindings;
    SmallVector<std::pair<Value, std::string>> zeroGrads;
    Value iteration;
    if (adam)
      iteration = body.addArgument(
          RankedTensorType::get({}, b.getI64Type()), loc);

    unsigned numGrads = ret.getNumOperands();
    SmallVector<std::string> argBindings;
    for (unsigned i = 0; i < numGrads; ++i) {
      auto binding = step.getResultAttrOfType<StringAttr>(i, kBufferAttr);
      if (!binding || !binding.getValue().starts_with("grad:")) {
        step.emitOpError() << "result #" << i << " is not a gradient";
        return failure();
      }
      std::string name = binding.getValue().drop_front(5).str();
      Value grad = ret.getOperand(i);
      Type type = paramTypes.lookup(name);
      if (!type) {
        step.emitOpError() << "gradient of unknown parameter '" << name << "'";
        return failure();
      }
      Value param = body.addArgument(type, loc);
      argBindings.push_back(name);
      if (adam) {
        Value m = body.addArgument(type, loc);
        Value v = body.addArgument(type, loc);
        argBindings.push_back("adam.exp_avg:" + name);
        argBindings.push_back("adam.exp_avg_sq:" + name);
        auto update = AdamOp::create(
            b, loc, type, type, type, param, grad, m, v, iteration,
            b.getF32FloatAttr(lr), b.getF32FloatAttr(beta1),
            b.getF32FloatAttr(beta2), b.getF32FloatAttr(eps),
            b.getF32FloatAttr(weightDecay));
        newResults.append({update.getNewParam(), update.getNewExpAvg(),
                           update.getNewExpAvgSq()});
        newBindings.append({name, "adam.exp_avg:" + name,
                            "adam.exp_avg_sq:" + name});
      } else {
        auto update = SgdOp::create(b, loc, param, grad, b.getF32FloatAttr(lr),
                                    b.getF32FloatAttr(weightDecay));
        newResults.push_back(update);
        newBindings.push_back(name);
      }
      zeroGrads.push_back({grad, binding.getValue().str()});
    }
    if (adam)
      argBindings.insert(argBindings.begin(), "iteration");
    // Gradients start from zero in the next step.
    for (auto &[grad, binding] : zeroGrads) {
      newResults.push_back(
          FillOp::create(b, loc, grad.getType(), b.getF32FloatAttr(0)));
      newBindings.push_back(binding);
    }
    func::ReturnOp::create(b, ret.getLoc(), newResults);
    ret.erase();

    // Arguments: grads, then (iteration), then param [, m, v] per grad.
    SmallVector<DictionaryAttr> argAttrs, resultAttrs;
    for (unsigned i = 0; i < numGrads; ++i)
      argAttrs.push_back(step.getArgAttrDict(i));
    auto bind = [&](StringRef name) {
      return b.getDictionaryAttr(
          b.getNamedAttr(kBufferAttr, b.getStringAttr(name)));
    };
    for (const std::string &binding : argBindings)
      argAttrs.push_back(bind(binding));
    for (const std::string &binding : newBindings)
      resultAttrs.push_back(bind(binding));
    updateFunctionType(step);
    step.setAllArgAttrs(argAttrs);
    step.setAllResultAttrs(resultAttrs);

    return success();
  }

  void setOptimizerAttr(ModuleOp module) {
    Builder b(module.getContext());
    module->setAttr(
        kOptimizerAttr,
        b.getDictionaryAttr({
            b.getNamedAttr("kind", b.getStringAttr(optimizer)),
            b.getNamedAttr("lr", b.getF32FloatAttr(lr)),
            b.getNamedAttr("beta1", b.getF32FloatAttr(beta1)),
            b.getNamedAttr("beta2", b.getF32FloatAttr(beta2)),
            b.getNamedAttr("eps", b.getF32FloatAttr(eps)),
            b.getNamedAttr("weight_decay", b.getF32FloatAttr(weightDecay)),
            b.getNamedAttr("lr_warmup_iters", b.getI64IntegerAttr(lrWarmupIters)),
            b.getNamedAttr("lr_decay_iters", b.getI64IntegerAttr(lrDecayIters)),
            b.getNamedAttr("lr_decay_style", b.getStringAttr(lrDecayStyle)),
            b.getNamedAttr("min_lr", b.getF32FloatAttr(minLr)),
        }));
  }
};
} // namespace
