//===- PadVocab.cpp - Megatron vocabulary padding -------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"

#include <limits>

namespace tessera::dist {
#define GEN_PASS_DEF_PADVOCABPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct PadVocabPass : tessera::dist::impl::PadVocabPassBase<PadVocabPass> {
  using PadVocabPassBase::PadVocabPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp model = getModelFunc(module);
    if (!model)
      return signalPassFailure();
    if (divisibleBy < 1) {
      emitError(module.getLoc())
          << "make-vocab-size-divisible-by must be positive, got "
          << int64_t(divisibleBy);
      return signalPassFailure();
    }
    if (maskPadding != "auto" && maskPadding != "true" &&
        maskPadding != "false") {
      emitError(module.getLoc())
          << "mask-padded-vocab must be auto, true or false, got '"
          << std::string(maskPadding) << "'";
      return signalPassFailure();
    }
    SmallVector<nn::EmbeddingOp> embeddings;
    model.walk([&](nn::EmbeddingOp e) { embeddings.push_back(e); });
    if (embeddings.empty())
      return;
    MeshOp mesh = lookupMesh(module);
    int64_t tp = mesh ? mesh.getTp() : 1;
    int64_t vocab = embeddings.front().getVocabSize();
    int64_t multiple = divisibleBy * tp;
    int64_t padded = (vocab + multiple - 1) / multiple * multiple;

    // The vocabulary-indexed parameters: embedding tables and LM heads.
    SetVector<BlockArgument> params;
    auto addParam = [&](Operation *user, Value v) -> LogicalResult {
      auto arg = dyn_cast<BlockArgument>(v);
      if (!arg || !model.getArgAttr(arg.getArgNumber(), kParamAttr))
        return user->emitOpError()
               << "vocabulary-indexed operand must be a model parameter";
      auto type = cast<RankedTensorType>(arg.getType());
      if (type.getDimSize(0) != vocab && type.getDimSize(0) != padded)
        return user->emitOpError()
               << "has " << type.getDimSize(0) << " vocabulary rows, expected "
               << vocab;
      params.insert(arg);
      return success();
    };
    for (nn::EmbeddingOp e : embeddings) {
      if (int64_t(e.getVocabSize()) != int64_t(vocab)) {
        e.emitOpError() << "vocab_size " << e.getVocabSize()
                        << " differs from another embedding's " << vocab;
        return signalPassFailure();
      }
      if (failed(addParam(e, e.getTable())))
        return signalPassFailure();
    }
    WalkResult walk = model.walk([&](nn::SoftmaxCrossEntropyOp ce) {
      if (auto head = ce.getLogits().getDefiningOp<nn::LinearOp>()) {
        if (failed(addParam(head, head.getWeight())) ||
            (head.getBias() && failed(addParam(head, head.getBias()))))
          return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    // Masking: asked for, or (auto) when the vocabulary's weights came
    // with the model.
    bool imported = llvm::any_of(params, [&](BlockArgument arg) {
      auto init = model.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kInitAttr);
      return init && init.getValue() == "data";
    });
    const bool mask = padded != vocab &&
                      (maskPadding == "true" ||
                       (maskPadding == "auto" && imported));
    for (BlockArgument arg : params) {
      auto type = cast<RankedTensorType>(arg.getType());
      // Padding weights that came with the model (an import) adds rows of
      // zeros whose logits enter the softmax unless masked: the loss is no
      // longer the exported model's (Megatron pads the same way, from its
      // own init).
      auto init = model.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kInitAttr);
      if (!mask && padded != type.getDimSize(0) && init &&
          init.getValue() == "data")
        emitWarning(arg.getLoc())
            << "padding the vocabulary of '"
            << model.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kParamAttr)
                   .getValue()
            << "' (initialised from data) from " << type.getDimSize(0)
            << " to " << padded
            << " rows adds zero rows whose logits change the loss "
               "(mask-padded-vocab=false); "
            << (vocab % tp == 0
                    ? std::string("make-vocab-size-divisible-by 1 keeps the "
                                  "model's vocabulary")
                    : "tp = " + std::to_string(tp) +
                          " needs a multiple of " + std::to_string(tp) +
                          " rows, so export a vocabulary it divides");
      SmallVector<int64_t> shape(type.getShape());
      shape[0] = padded;
      arg.setType(RankedTensorType::get(shape, type.getElementType()));
    }
    for (Operation &op : model.getBody().front().without_terminator())
      if (failed(reinferResultTypes(&op))) {
        op.emitOpError() << "cannot re-infer its types after vocabulary padding";
        return signalPassFailure();
      }
    updateFunctionType(model);
    OpBuilder b(module.getContext());
    if (mask) {
      // The padded rows' logits: the lowest f32 before every loss, so
      // that they add exp(lowest - max) = 0 to the softmax's sum.
      SmallVector<nn::SoftmaxCrossEntropyOp> losses;
      model.walk([&](nn::SoftmaxCrossEntropyOp ce) { losses.push_back(ce); });
      for (nn::SoftmaxCrossEntropyOp ce : losses) {
        b.setInsertionPoint(ce);
        Value z = ce.getLogits();
        auto masked = nn::MaskColumnsOp::create(
            b, ce.getLoc(), z.getType(), z, b.getI64IntegerAttr(vocab),
            b.getF32FloatAttr(std::numeric_limits<float>::lowest()),
            StringAttr());
        if (Attribute layer = ce->getAttr(kLayerAttr))
          masked->setAttr(kLayerAttr, layer);
        ce.setOperand(0, masked);
      }
    }
    SmallVector<NamedAttribute> vocabAttrs = {
        b.getNamedAttr("size", b.getI64IntegerAttr(vocab)),
        b.getNamedAttr("padded", b.getI64IntegerAttr(padded))};
    if (mask)
      vocabAttrs.push_back(b.getNamedAttr("masked", b.getUnitAttr()));
    module->setAttr(kVocabAttr, b.getDictionaryAttr(vocabAttrs));
  }
};
} // namespace
