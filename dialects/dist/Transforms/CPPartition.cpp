//===- CPPartition.cpp - Context parallelism: the sequence over cp --------===//
//
// Megatron's context parallelism as an IR rewrite (see Passes.td): the
// inputs become this cp rank's load-balanced share of each sequence, the
// activations follow by type re-inference, attention becomes ring
// attention over "cp", the position-dependent ops learn the rows' global
// positions and the token mean divides by the whole sequence's count.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "dialects/nn/IR/NNOps.h"
#include "dialects/tessera/IR/TesseraDialect.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_CPPARTITIONPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct CPPartitionPass
    : tessera::dist::impl::CPPartitionPassBase<CPPartitionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = lookupMesh(module);
    if (!mesh || mesh.getCp() == 1)
      return;
    func::FuncOp model = getModelFunc(module);
    if (!model || failed(partition(model, mesh)))
      return signalPassFailure();
  }

  LogicalResult partition(func::FuncOp model, MeshOp mesh) {
    const int64_t cp = mesh.getCp();
    Builder b(model.getContext());
    auto cpGroup = b.getStringAttr("cp");
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    Block &body = model.getBody().front();

    // The sequence inputs: tokens and labels [seq, batch].
    int64_t seq = ShapedType::kDynamic;
    for (BlockArgument arg : body.getArguments()) {
      auto kind = model.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                     kInputAttr);
      if (!kind || (kind.getValue() != "tokens" && kind.getValue() != "labels"))
        continue;
      auto type = cast<RankedTensorType>(arg.getType());
      if (type.getRank() != 2 || !isa<IntegerType>(type.getElementType()))
        continue;
      int64_t s = type.getDimSize(0);
      if (ShapedType::isDynamic(s) || s % (2 * cp) != 0)
        return model.emitError()
               << "context parallelism: the sequence length of input '"
               << kind.getValue() << "' (" << s
               << ") is not divisible by 2 x cp = " << 2 * cp
               << " (Megatron's load-balanced layout cuts it into 2 x cp "
                  "chunks)";
      seq = s;
      SmallVector<int64_t> shape(type.getShape());
      shape[0] = s / cp;
      arg.setType(RankedTensorType::get(shape, type.getElementType()));
      model.setArgAttr(arg.getArgNumber(), kShardingAttr,
                       makeSharding(model.getContext(), {{"cp", 0}}));
    }
    if (ShapedType::isDynamic(seq))
      return model.emitError()
             << "context parallelism splits the sequence of a language model: "
                "the model has no token or label input [seq, batch]";
    bool hasAttention = false;
    for (Operation &op : body.without_terminator()) {
      hasAttention |= isa<nn::AttentionOp>(op);
      if (isa<nn::MeanOp, nn::SoftmaxCrossEntropyGradOp>(op))
        return op.emitOpError()
               << "is not supported under context parallelism: the loss must "
                  "be a per-token mean (nn.token_mean), whose count is summed "
                  "over the cp group";
    }
    if (!hasAttention)
      return model.emitError()
             << "context parallelism needs attention to split: the model has "
                "no nn.attention";

    // Activations on the share: re-infer every type. The sequence
    // collectives of sequence parallelism state their result type; along
    // the sequence (dim 0) it shrinks by cp like their operand.
    for (Operation &op : body.without_terminator()) {
      if (isa<AllGatherOp, ReduceScatterOp, ScatterToRegionOp,
              GatherFromRegionOp>(op)) {
        auto type = cast<RankedTensorType>(op.getResult(0).getType());
        SmallVector<int64_t> shape(type.getShape());
        if (shape.empty() || shape[0] % cp != 0 ||
            (shape[0] / cp) % mesh.getTp() != 0)
          return op.emitOpError()
                 << "context parallelism: the sequence-parallel shards of "
                 << seq << " positions over cp = " << cp << " and tp = "
                 << mesh.getTp()
                 << " are not whole (seq must be divisible by cp x tp)";
        shape[0] /= cp;
        op.getResult(0).setType(
            RankedTensorType::get(shape, type.getElementType()));
        continue;
      }
      if (failed(reinferResultTypes(&op)))
        return op.emitOpError()
               << "cannot re-infer its types on a context-parallel share of "
                  "the sequence";
    }

    OpBuilder ob(model.getContext());
    // Position-dependent ops take the rows' global positions.
    for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
      if (auto pos = dyn_cast<nn::AddPositionEmbeddingOp>(op)) {
        if (pos.getSequenceShardGroupAttr())
          return pos.emitOpError()
                 << "runs on a sequence shard already; context parallelism "
                    "expects the position embedding on the whole sequence";
        pos.setSequenceShardGroupAttr(cpGroup);
      } else if (auto rope = dyn_cast<nn::RotaryEmbeddingOp>(op)) {
        // Each row rotates by its global position (Megatron's
        // get_pos_emb_on_this_cp_rank).
        StringAttr group = rope.getSequenceShardGroupAttr();
        rope.setSequenceShardGroupAttr(
            group && group.getValue() == "tp" ? b.getStringAttr("tp-cp")
                                              : cpGroup);
      } else if (auto drop = dyn_cast<nn::DropoutOp>(op)) {
        StringAttr group = drop.getSequenceShardGroupAttr();
        drop.setSequenceShardGroupAttr(
            group && group.getValue() == "tp" ? b.getStringAttr("tp-cp")
                                              : cpGroup);
      } else if (auto attn = dyn_cast<nn::AttentionOp>(op)) {
        // Ring attention over cp: the context and the log-sum-exp rows.
        ob.setInsertionPoint(attn);
        auto qkv = attn.getQkv().getType();
        auto lseType = RankedTensorType::get(
            {qkv.getDimSize(0), qkv.getDimSize(1), int64_t(attn.getNumHeads())},
            b.getF32Type());
        auto ring = RingAttentionOp::create(
            ob, attn.getLoc(), TypeRange{attn.getType(), lseType},
            attn.getQkv(), meshRef, cpGroup, attn.getNumHeadsAttr(),
            attn.getCausalAttr());
        if (auto layer = attn->getAttr(kLayerAttr))
          ring->setAttr(kLayerAttr, layer);
        attn.replaceAllUsesWith(ring.getResult());
        attn.erase();
      } else if (auto aux = dyn_cast<nn::MoEAuxLossOp>(op)) {
        // The load-balancing loss counts the choices of the whole
        // sequence: summed over cp, or over tp-cp where sequence
        // parallelism already sums them over tp (Megatron's
        // sequence_partition_group).
        if (Value counts = aux.getCounts()) {
          auto sum = counts.getDefiningOp<AllReduceOp>();
          if (!sum || sum.getGroup() != "tp")
            return aux.emitOpError()
                   << "context parallelism expects the load-balancing "
                      "loss's counts summed over tp (sequence parallelism) "
                      "or not given";
          sum.setGroupAttr(b.getStringAttr("tp-cp"));
          continue;
        }
        sumAuxLossCounts(ob, aux, meshRef, cpGroup);
      } else if (auto mean = dyn_cast<nn::TokenMeanOp>(op)) {
        if (mean.getCount())
          continue;
        // sum(loss of this share) / count(whole sequence), summed over cp.
        ob.setInsertionPoint(mean);
        Location loc = mean.getLoc();
        Value n = nn::TokenCountOp::create(ob, loc, mean.getLabels(),
                                           mean.getIgnoreIndexAttr());
        Value total = AllReduceOp::create(ob, loc, n.getType(), n, meshRef,
                                          cpGroup, enumAttr(ob, Reduction::Sum));
        Value share = nn::TokenMeanOp::create(ob, loc, mean.getInput(),
                                              mean.getLabels(), total,
                                              mean.getIgnoreIndexAttr());
        Value loss = ReduceFromRegionOp::create(ob, loc, share.getType(),
                                                share, meshRef, cpGroup);
        mean.replaceAllUsesWith(loss);
        mean.erase();
      }
    }
    updateFunctionType(model);
    return success();
  }
};
} // namespace

void tessera::dist::sumAuxLossCounts(OpBuilder &b, nn::MoEAuxLossOp aux,
                                     FlatSymbolRefAttr mesh, StringAttr group) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(aux);
  auto logits = cast<RankedTensorType>(aux.getLogits().getType());
  Value counts = nn::MoETokenCountsOp::create(
      b, aux.getLoc(), aux.getIndices(),
      b.getI64IntegerAttr(logits.getShape().back()));
  Value all = AllReduceOp::create(b, aux.getLoc(), counts.getType(), counts,
                                  mesh, group, enumAttr(b, Reduction::Sum));
  aux.getCountsMutable().assign(all);
}
