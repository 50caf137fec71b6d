//===- EPPartition.cpp - Expert parallelism: the experts over ep ----------===//
//
// Megatron's expert parallelism as an IR rewrite (see Passes.td): each MoE
// layer's experts are split evenly over the ep group, and the rows between
// the token permutation and the weighted unpermutation travel to the
// experts' ranks and back. With expert tensor parallelism each expert's FFN
// is split over etp as well (the first GEMM by columns, the second by rows,
// Megatron's TEColumnParallelGroupedLinear / TERowParallelGroupedLinear
// over the expert tensor-parallel group), and the exchange runs over
// "etp-ep": every etp rank of an expert gets its rows, and the partial
// outputs are summed on the way back.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_EPPARTITIONPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct EPPartitionPass
    : tessera::dist::impl::EPPartitionPassBase<EPPartitionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = lookupMesh(module);
    if (!mesh || (mesh.getEp() == 1 && mesh.getEtp() == 1))
      return;
    func::FuncOp model = getModelFunc(module);
    if (!model || failed(partition(model, mesh)))
      return signalPassFailure();
  }

  LogicalResult partition(func::FuncOp model, MeshOp mesh) {
    const int64_t ep = mesh.getEp(), etp = mesh.getEtp();
    SmallVector<nn::MoEDispatchOp> dispatches;
    model.walk([&](nn::MoEDispatchOp d) { dispatches.push_back(d); });
    // etp alone (by default tp, as Megatron's) concerns only experts: a
    // dense model has none to split.
    if (dispatches.empty() && ep == 1)
      return success();
    // Under tp the experts must see each token once: the tp ranks hold
    // different tokens only with sequence parallelism (Megatron requires
    // it for MoE with tp as well).
    bool sequenceShards = false;
    model.walk([&](ScatterToRegionOp s) {
      sequenceShards |= s.getGroup() == "tp";
    });
    if (mesh.getTp() > 1 && !sequenceShards)
      return model.emitError()
             << "expert parallelism (ep " << ep << ", etp " << etp
             << ") with tensor parallelism (tp " << mesh.getTp()
             << ") needs sequence parallelism (--sequence-parallel, as "
                "Megatron's MoELayer): without it every tp rank would send "
                "the same tokens to the experts; or --ep 1 --etp 1 to "
                "replicate the experts over tp";
    if (dispatches.empty())
      return model.emitError()
             << "expert parallelism (ep " << ep << ", etp " << etp
             << ") needs mixture-of-experts layers (tessera-gen gpt "
                "--num-experts)";
    Builder b(model.getContext());
    // The exchange's group: the ep ranks, or with etp the etp-ep block
    // (etp consecutive ranks per set of experts).
    auto group = b.getStringAttr(etp > 1 ? "etp-ep" : "ep");
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    DenseSet<BlockArgument> sharded;
    for (nn::MoEDispatchOp d : dispatches)
      if (failed(partitionLayer(model, d, ep, etp, meshRef, group, sharded)))
        return failure();
    for (Operation &op : model.getBody().front().without_terminator())
      // Only the nn ops between the exchanges change; the dist ops (the
      // exchanges, the sequence collectives, ring attention) state their
      // types.
      if (isa<nn::NNDialect>(op.getDialect()) &&
          failed(reinferResultTypes(&op)))
        return op.emitOpError()
               << "cannot re-infer its types with the experts split over ep";
    updateFunctionType(model);
    return success();
  }

  /// One MoE layer: the expert MLP between `d` and its nn.moe_combine.
  LogicalResult partitionLayer(func::FuncOp model, nn::MoEDispatchOp d,
                               int64_t ep, int64_t etp,
                               FlatSymbolRefAttr meshRef,
                               StringAttr group,
                               DenseSet<BlockArgument> &sharded) {
    const int64_t experts = d.getNumExperts();
    if (experts % ep != 0)
      return d.emitOpError() << experts << " experts do not split evenly over "
                             << "ep = " << ep;
    auto structure = [&]() {
      return d.emitOpError()
             << "expert parallelism expects the experts' grouped linears "
                "between nn.moe_dispatch and nn.moe_combine (as tessera-gen "
                "builds them)";
    };
    // The grouped GEMMs reading the counts, and the last one's combine.
    SmallVector<nn::GroupedLinearOp> gemms;
    for (OpOperand &use : d.getCounts().getUses()) {
      auto g = dyn_cast<nn::GroupedLinearOp>(use.getOwner());
      if (!g || use.getOperandNumber() != 1)
        return structure();
      gemms.push_back(g);
    }
    if (!d.getResult().hasOneUse() || gemms.empty())
      return structure();
    auto first = dyn_cast<nn::GroupedLinearOp>(*d.getResult().user_begin());
    nn::MoECombineOp combine;
    nn::GroupedLinearOp last;
    for (nn::GroupedLinearOp g : gemms)
      for (Operation *user : g.getResult().getUsers())
        if (auto c = dyn_cast<nn::MoECombineOp>(user)) {
          combine = c;
          last = g;
        }
    if (!first || !combine || !last.getResult().hasOneUse())
      return structure();

    // Expert tensor parallelism splits the FFN dimension: the first GEMM's
    // outputs (weight dim 1) and the last one's inputs (weight dim 2), with
    // only elementwise ops between them.
    if (etp > 1) {
      if (gemms.size() != 2 || first == last)
        return d.emitOpError()
               << "expert tensor parallelism (etp " << etp
               << ") expects two grouped linears per expert (the FFN's two "
                  "GEMMs), found "
               << gemms.size();
      // The FFN features of the first GEMM (of each projection of a
      // stacked one: SwiGLU's [experts, 2, ffn, hidden]).
      auto firstType = cast<RankedTensorType>(first.getWeight().getType());
      const int64_t ffn = firstType.getDimSize(firstType.getRank() - 2);
      // A stacked GEMM's slice is [gate slice | up slice]: only SwiGLU
      // may read it (the second GEMM would contract the blocks).
      if (firstType.getRank() == 4 &&
          (!first.getResult().hasOneUse() ||
           !isa<nn::SwiGLUOp>(*first.getResult().getUsers().begin())))
        return first.emitOpError()
               << "expert tensor parallelism splits a stacked [experts, k, "
                  "ffn, hidden] weight only before nn.swiglu";
      if (ffn % etp != 0)
        return first.emitOpError() << "etp " << etp
                                   << " does not divide the experts' FFN "
                                      "hidden size "
                                   << ffn;
    }

    // The experts' weights: this rank's E / ep of them, and with etp its
    // 1/etp slice of each.
    for (nn::GroupedLinearOp g : gemms) {
      auto arg = dyn_cast<BlockArgument>(g.getWeight());
      if (!arg || !model.getArgAttr(arg.getArgNumber(), kParamAttr))
        return g.emitOpError() << "expects the experts' weights as a parameter";
      if (!sharded.insert(arg).second)
        continue;
      if (!arg.hasOneUse())
        return g.emitOpError()
               << "expects the experts' weights to have no other use";
      auto type = cast<RankedTensorType>(arg.getType());
      SmallVector<int64_t> shape(type.getShape());
      SmallVector<ShardSplit, 2> splits;
      if (ep > 1) {
        shape[0] /= ep;
        splits.push_back({"ep", 0});
      }
      if (etp > 1) {
        const int64_t dim = g == first ? type.getRank() - 2 : 2;
        shape[dim] /= etp;
        splits.push_back({"etp", dim});
      }
      arg.setType(RankedTensorType::get(shape, type.getElementType()));
      model.setArgAttr(arg.getArgNumber(), kShardingAttr,
                       makeSharding(model.getContext(), splits));
    }

    OpBuilder ob(d);
    ob.setInsertionPointAfter(d);
    auto rows = d.getResult().getType();
    auto i32 = ob.getI32Type();
    const int64_t local = d.getNumExperts() / ep;
    auto exchange = ExpertDispatchOp::create(
        ob, d.getLoc(),
        TypeRange{RankedTensorType::get({ep * etp * rows.getDimSize(0),
                                         rows.getDimSize(1)},
                                        rows.getElementType()),
                  RankedTensorType::get({local}, i32),
                  RankedTensorType::get({ep * etp, local}, i32)},
        d.getResult(), d.getCounts(), meshRef, group, ob.getI64IntegerAttr(etp));
    if (auto layer = d->getAttr(kLayerAttr))
      exchange->setAttr(kLayerAttr, layer);
    first.setOperand(0, exchange.getResult());
    // The received rows have room for every rank's; balanced routing
    // fills 1/ep of it (each rank's rows for this run's experts, from all
    // ep x etp ranks): the rows the FLOPs count.
    auto expected = ob.getI64IntegerAttr(etp * rows.getDimSize(0));
    for (nn::GroupedLinearOp g : gemms) {
      g.setOperand(1, exchange.getLocalCounts());
      g.setExpectedRowsAttr(expected);
    }

    ob.setInsertionPoint(combine);
    auto lastType = cast<RankedTensorType>(last.getType());
    auto back = ExpertCombineOp::create(
        ob, combine.getLoc(),
        RankedTensorType::get({rows.getDimSize(0), lastType.getDimSize(1)},
                              lastType.getElementType()),
        last.getResult(), exchange.getSplits(), d.getCounts(), meshRef, group,
        exchange.getEtpAttr());
    if (auto layer = combine->getAttr(kLayerAttr))
      back->setAttr(kLayerAttr, layer);
    combine.setOperand(0, back.getResult());
    return success();
  }
};
} // namespace
