//===- MixedPrecision.cpp - bf16 parameters, f32 computation --------------===//
//
// Megatron's --bf16 (Float16Module) for the model as IR: parameters are
// stored in bf16 and cast to f32 where the model reads them. Gradients,
// main parameters and the optimizer follow from the recorded dtypes in the
// later passes (autodiff, dp-grad-allreduce, optimizer).
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::nn {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {
struct MixedPrecisionPass
    : tessera::nn::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  using MixedPrecisionPassBase::MixedPrecisionPassBase;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    if (symbolizeFloatDtype(paramsDtype) != FloatDtype::BF16) {
      emitError(root.getLoc()) << "unsupported params-dtype '"
                               << std::string(paramsDtype) << "' (expected bf16)";
      return signalPassFailure();
    }
    if (root->hasAttr(kMixedPrecisionAttr)) {
      emitError(root.getLoc()) << "the module is in mixed precision already";
      return signalPassFailure();
    }
    Builder b(root.getContext());
    Type bf16 = b.getBF16Type();
    for (ModuleOp program : getPrograms(root))
      for (auto f : program.getOps<func::FuncOp>()) {
        if (f->hasAttr(kPhaseAttr)) {
          f.emitOpError() << "is a training phase; tessera-mixed-precision "
                             "runs on the model, before tessera-autodiff";
          return signalPassFailure();
        }
        if (failed(convert(f, bf16)))
          return signalPassFailure();
      }
    std::string params = paramsDtype;
    std::string grads =
        gradReduceInFp32 ? stringifyFloatDtype(FloatDtype::F32).str() : params;
    root->setAttr(kMixedPrecisionAttr,
                  b.getDictionaryAttr(
                      {b.getNamedAttr("params", b.getStringAttr(params)),
                       b.getNamedAttr("grads", b.getStringAttr(grads))}));
  }

  /// Makes every parameter of `f` a `stored` tensor read through one cast
  /// to f32, placed right before its first reader.
  LogicalResult convert(func::FuncOp f, Type stored) {
    if (f.isExternal())
      return success();
    Block &entry = f.getBody().front();
    OpBuilder b(f.getContext());
    for (BlockArgument arg : entry.getArguments()) {
      auto name = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kParamAttr);
      if (!name)
        continue;
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      if (!type || !type.getElementType().isF32())
        return f.emitOpError() << "parameter '" << name.getValue() << "' is "
                               << arg.getType()
                               << "; tessera-mixed-precision expects f32 parameters";
      arg.setType(RankedTensorType::get(type.getShape(), stored));
      if (arg.use_empty())
        continue;
      // Before the first reader: after a pipeline phase's leading receives.
      Operation *first = nullptr;
      for (Operation *user : arg.getUsers()) {
        Operation *op = entry.findAncestorOpInBlock(*user);
        if (!first || op->isBeforeInBlock(first))
          first = op;
      }
      b.setInsertionPoint(first);
      auto cast = CastOp::create(b, arg.getLoc(), type, arg);
      arg.replaceAllUsesExcept(cast.getResult(), cast);
    }
    updateFunctionType(f);
    return success();
  }
};
} // namespace
