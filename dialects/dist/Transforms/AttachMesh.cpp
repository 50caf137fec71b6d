//===- AttachMesh.cpp - Attach the mesh and check the config --------------===//

#include "tessera/Mesh/RankGroups.h"
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
    tessera::mesh::MeshConfig config;
    config.tp = tp;
    config.cp = cp;
    config.ep = ep;
    // Megatron's default: each expert split like the dense layers.
    config.etp = etp > 0 ? int64_t(etp) : int64_t(tp);
    config.dp = dp;
    config.pp = pp;
    config.vpp = vpp;
    config.order = order;
    std::string error = tessera::mesh::completeOrder(config);
    if (error.empty())
      error = tessera::mesh::validateMesh(config);
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
      // The weight's out-features (of each projection of a stacked one).
      auto weight = cast<RankedTensorType>(region.column->getOperand(1).getType());
      int64_t features = weight.getDimSize(weight.getRank() - 2);
      if (features % int64_t(tp) != 0) {
        region.column->emitOpError()
            << "cannot be split column-parallel over tp = " << int64_t(tp) << ": "
            << features << " output features are not divisible by " << int64_t(tp);
        ok = false;
      }
      // Ops inside the region (attention: whole heads per rank).
      int64_t dim = cast<RankedTensorType>(region.column->getResult(0).getType())
                        .getRank() - 1;
      for (Operation *op : region.chain)
        if (failed(cast<TPSplitOpInterface>(op).checkShard(dim, tp)))
          ok = false;
    }
    if (!ok)
      return signalPassFailure();

    OpBuilder b(module.getBodyRegion());
    b.setInsertionPointToStart(module.getBody());
    auto mesh = MeshOp::create(b, module.getLoc(), kMeshName);
    // Only sizes other than the defaults are written out.
    auto set = [&](StringRef name, int64_t value) {
      if (value != 1)
        mesh->setAttr(name, b.getI64IntegerAttr(value));
    };
    set("tp", tp);
    set("cp", cp);
    set("ep", ep);
    set("etp", config.etp);
    set("dp", dp);
    set("pp", pp);
    set("vpp", vpp);
    if (config.order != "tp-cp-ep-dp-pp")
      mesh.setOrder(config.order);
  }
};
} // namespace
