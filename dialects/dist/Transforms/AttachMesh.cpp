//===- AttachMesh.cpp - Attach the mesh and check the config --------------===//

#include "dialects/dist/IR/RankGroups.h"
#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_ATTACHMESHPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct AttachMeshPass : tessera::dist::impl::AttachMeshPassBase<AttachMeshPass> {
  using AttachMeshPassBase::AttachMeshPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (MeshOp existing = lookupMesh(module)) {
      existing.emitOpError() << "the module already has a mesh; "
                                "tessera-attach-mesh adds one";
      return signalPassFailure();
    }
    MeshShape shape;
    shape.tp = tp;
    shape.dp = dp;
    shape.order = order;
    std::string error = validateMesh(shape);
    if (!error.empty()) {
      emitError(module.getLoc()) << "invalid mesh: " << error;
      return signalPassFailure();
    }

    func::FuncOp model = getModelFunc(module);
    if (!model)
      return signalPassFailure();

    // Every dimension tp-partition will split must divide by tp.
    bool ok = true;
    for (TPRegion &region : findTPRegions(model)) {
      auto weight = cast<RankedTensorType>(region.column->getOperand(1).getType());
      int64_t features = weight.getDimSize(0);
      if (features % int64_t(tp) != 0) {
        region.column->emitOpError()
            << "cannot be split column-parallel over tp = " << int64_t(tp) << ": "
            << features << " output features are not divisible by " << int64_t(tp);
        ok = false;
      }
    }
    if (!ok)
      return signalPassFailure();

    OpBuilder b(module.getBodyRegion());
    b.setInsertionPointToStart(module.getBody());
    auto mesh = MeshOp::create(b, module.getLoc(), kMeshName);
    mesh.setTp(tp);
    mesh.setDp(dp);
    mesh.setOrder(order);
  }
};
} // namespace
