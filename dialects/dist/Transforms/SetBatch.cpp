//===- SetBatch.cpp - Micro/global batch semantics ------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_SETBATCHPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct SetBatchPass : tessera::dist::impl::SetBatchPassBase<SetBatchPass> {
  using SetBatchPassBase::SetBatchPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp model = getModelFunc(module);
    if (!model)
      return signalPassFailure();
    MeshOp mesh = lookupMesh(module);
    int64_t dp = mesh ? mesh.getDp() : 1;
    if (globalBatchSize < 0) {
      emitError(module.getLoc())
          << "global-batch-size must be positive, or 0 for micro-batch-size x "
             "dp; got "
          << int64_t(globalBatchSize);
      return signalPassFailure();
    }

    // The model's batch: dim `nn.batch_dim` (default 0) of its inputs.
    int64_t modelBatch = ShapedType::kDynamic;
    Block &body = model.getBody().front();
    auto batchDim = [&](BlockArgument arg) -> int64_t {
      if (auto d = model.getArgAttrOfType<IntegerAttr>(arg.getArgNumber(),
                                                       kBatchDimAttr))
        return d.getInt();
      return 0;
    };
    for (BlockArgument arg : body.getArguments()) {
      if (!model.getArgAttr(arg.getArgNumber(), kInputAttr))
        continue;
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      if (!type || batchDim(arg) < 0 || batchDim(arg) >= type.getRank()) {
        emitError(arg.getLoc()) << "model input #" << arg.getArgNumber()
                                << " must be a ranked tensor with a batch dim";
        return signalPassFailure();
      }
      int64_t b = type.getDimSize(batchDim(arg));
      if (!ShapedType::isDynamic(b)) {
        if (!ShapedType::isDynamic(modelBatch) && modelBatch != b) {
          emitError(arg.getLoc()) << "model inputs disagree on the batch size ("
                                  << modelBatch << " vs " << b << ")";
          return signalPassFailure();
        }
        modelBatch = b;
      }
    }

    int64_t micro = microBatchSize;
    if (micro == 0) {
      if (ShapedType::isDynamic(modelBatch)) {
        emitError(model.getLoc())
            << "the model's batch dimension is dynamic: give "
               "micro-batch-size";
        return signalPassFailure();
      }
      micro = modelBatch;
    }
    if (micro < 1) {
      emitError(module.getLoc()) << "micro-batch-size must be positive, got "
                                 << micro;
      return signalPassFailure();
    }
    if (!ShapedType::isDynamic(modelBatch) && modelBatch != micro) {
      emitError(model.getLoc())
          << "the model's static batch size " << modelBatch
          << " differs from micro-batch-size " << micro
          << " (write the batch dimension as '?')";
      return signalPassFailure();
    }
    // Batch sizes are bounded so that every product of them (samples per
    // step, tokens per microbatch, element counts) stays far from overflow.
    constexpr int64_t kMaxBatch = int64_t(1) << 31;
    if (micro > kMaxBatch || globalBatchSize > kMaxBatch ||
        micro * dp > kMaxBatch) {
      emitError(module.getLoc())
          << "batch sizes above " << kMaxBatch
          << " samples are not supported (micro-batch-size " << micro
          << ", global-batch-size " << int64_t(globalBatchSize) << ", dp "
          << dp << ")";
      return signalPassFailure();
    }
    int64_t global = globalBatchSize == 0 ? micro * dp : globalBatchSize;
    if (global < 1 || global % (micro * dp) != 0) {
      emitError(module.getLoc())
          << "global batch size " << global
          << " is not divisible by micro-batch-size " << micro << " x dp "
          << dp << " = " << micro * dp;
      return signalPassFailure();
    }

    // Fix the batch dim and re-infer every type downstream.
    for (BlockArgument arg : body.getArguments()) {
      if (!model.getArgAttr(arg.getArgNumber(), kInputAttr))
        continue;
      auto type = cast<RankedTensorType>(arg.getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[batchDim(arg)] = micro;
      arg.setType(RankedTensorType::get(shape, type.getElementType()));
    }
    for (Operation &op : body.without_terminator()) {
      if (failed(reinferResultTypes(&op))) {
        op.emitOpError() << "cannot re-infer its result types for the batch size";
        return signalPassFailure();
      }
    }
    updateFunctionType(model);

    Builder b(module.getContext());
    module->setAttr(kBatchAttr,
                    b.getDictionaryAttr({
                        b.getNamedAttr("micro_batch_size", b.getI64IntegerAttr(micro)),
                        b.getNamedAttr("global_batch_size", b.getI64IntegerAttr(global)),
                        b.getNamedAttr("num_microbatches",
                                       b.getI64IntegerAttr(global / (micro * dp))),
                    }));
  }
};
} // namespace
