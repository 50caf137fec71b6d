//===- TPPartition.cpp - Column/row tensor-parallel split -----------------===//
//
// Megatron's MLP pattern (ColumnParallelLinear, then RowParallelLinear)
// found and rewritten through TPSplitOpInterface: a column-parallel op, the
// elementwise ops it feeds, and a row-parallel op that closes the region.
// f (copy_to_region, Megatron's copy_to_tensor_model_parallel_region)
// enters it, g (reduce_from_region, reduce_from_tensor_model_parallel_region)
// leaves it.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

namespace tessera::dist {
#define GEN_PASS_DEF_TPPARTITIONPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

static bool supports(Operation *op, TPSplitKind kind) {
  auto split = dyn_cast<TPSplitOpInterface>(op);
  if (!split)
    return false;
  SmallVector<int64_t> dims;
  bool partial = false;
  return succeeded(split.getSplitDims(kind, dims, partial));
}

SmallVector<TPRegion> tessera::dist::findTPRegions(func::FuncOp func) {
  SmallVector<TPRegion> regions;
  DenseSet<Operation *> claimed;
  func.walk([&](Operation *op) {
    if (claimed.contains(op) || op->getNumResults() != 1 ||
        !supports(op, TPSplitKind::Column))
      return;
    TPRegion region{op, {}, nullptr};
    Value v = op->getResult(0);
    int64_t dim = cast<RankedTensorType>(v.getType()).getRank() - 1;
    // Follow single-use elementwise ops that keep the shard on `dim`.
    while (v.hasOneUse()) {
      OpOperand &use = *v.use_begin();
      Operation *user = use.getOwner();
      if (use.getOperandNumber() == 0 && !claimed.contains(user) &&
          supports(user, TPSplitKind::Row)) {
        region.row = user;
        break;
      }
      // Ops of one activation; further operands may only be parameters,
      // which stay whole (QK-norm's weights).
      auto split = dyn_cast<TPSplitOpInterface>(user);
      if (!split || use.getOperandNumber() != 0 ||
          user->getNumResults() != 1 ||
          !llvm::all_of(user->getOperands().drop_front(), [&](Value v) {
            auto arg = dyn_cast<BlockArgument>(v);
            return arg && func.getArgAttr(arg.getArgNumber(), kParamAttr);
          }))
        break;
      FailureOr<int64_t> next = split.propagateShardedDim(0, dim);
      if (failed(next) || *next != dim)
        break;
      region.chain.push_back(user);
      v = user->getResult(0);
    }
    if (!region.row)
      return;
    // A stacked linear's shard is [proj0 shard | proj1 shard ...]: only an
    // op that takes the projections apart (SwiGLU) may read it; the row op
    // would contract the blocks with contiguous rows of its weight.
    if (auto linear = dyn_cast<nn::LinearOp>(op);
        linear && linear.getWeight().getType().getRank() == 3 &&
        (region.chain.empty() || !isa<nn::SwiGLUOp>(region.chain.front())))
      return;
    claimed.insert(region.column);
    claimed.insert(region.row);
    regions.push_back(region);
  });
  return regions;
}

namespace {
struct TPPartitionPass : tessera::dist::impl::TPPartitionPassBase<TPPartitionPass> {
  using TPPartitionPassBase::TPPartitionPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = lookupMesh(module);
    if (!mesh) {
      emitError(module.getLoc())
          << "tessera-tp-partition needs a dist.mesh (run tessera-attach-mesh)";
      return signalPassFailure();
    }
    func::FuncOp model = getModelFunc(module);
    if (!model)
      return signalPassFailure();
    int64_t tp = mesh.getTp();
    if (tp == 1)
      return;
    if (sequenceParallel) {
      // Check the configuration before rewriting anything.
      for (Value h : embeddingOutputs(model)) {
        int64_t seq = cast<RankedTensorType>(h.getType()).getDimSize(0);
        if (!ShapedType::isDynamic(seq) && seq % tp == 0)
          continue;
        h.getDefiningOp()->emitOpError()
            << "sequence length " << seq << " is not divisible by tp = " << tp
            << " (sequence parallelism)";
        return signalPassFailure();
      }
    }

    for (TPRegion &region : findTPRegions(model)) {
      if (failed(splitOp(model, region.column, TPSplitKind::Column, tp, mesh)))
        return signalPassFailure();
      int64_t dim = cast<RankedTensorType>(region.column->getResult(0).getType())
                        .getRank() - 1;
      for (Operation *op : region.chain) {
        if (failed(cast<TPSplitOpInterface>(op).adjustForShard(dim, tp)))
          return signalPassFailure();
        (void)reinferResultTypes(op);
        // Whole parameters used on the rank's heads (QK-norm's weights)
        // get partial gradients: they enter through copy_to_region (f),
        // whose backward all-reduces them over tp, as Megatron all-reduces
        // its q_layernorm and k_layernorm gradients.
        OpBuilder b(op);
        auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
        for (OpOperand &param : op->getOpOperands().drop_front())
          param.set(CopyToRegionOp::create(b, op->getLoc(),
                                           param.get().getType(), param.get(),
                                           meshRef, b.getStringAttr("tp")));
      }
      if (failed(splitOp(model, region.row, TPSplitKind::Row, tp, mesh)))
        return signalPassFailure();
      ++numColumn;
      ++numRow;
    }
    if (failed(partitionVocab(model, tp, mesh)))
      return signalPassFailure();
    if (sequenceParallel && failed(applySequenceParallel(model, tp, mesh)))
      return signalPassFailure();
    applyShardings(model);
    updateFunctionType(model);
  }

  /// The values that enter the decoder layers: the position embeddings'
  /// sums, or, for a model without learned positions (RoPE, none), the
  /// word embeddings (after their vocabulary-parallel reduction).
  static SmallVector<Value> embeddingOutputs(func::FuncOp model) {
    SmallVector<Value> outs;
    model.walk([&](nn::AddPositionEmbeddingOp p) {
      outs.push_back(p.getResult());
    });
    if (!outs.empty())
      return outs;
    model.walk([&](nn::EmbeddingOp e) {
      Value v = e.getResult();
      if (v.hasOneUse() && isa<ReduceFromRegionOp>(*v.getUsers().begin()))
        v = v.getUsers().begin()->getResult(0);
      outs.push_back(v);
    });
    return outs;
  }

  /// Megatron's sequence parallelism on top of the tensor-parallel regions:
  /// f (copy_to_region) becomes an all-gather along the sequence and g
  /// (reduce_from_region) a reduce-scatter, so the same bytes move while
  /// layer norms and residuals work on 1/tp of the sequence.
  LogicalResult applySequenceParallel(func::FuncOp model, int64_t tp,
                                      MeshOp mesh) {
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    OpBuilder b(model.getContext());
    auto group = b.getStringAttr("tp");
    auto dim0 = b.getI64IntegerAttr(0);
    auto shardType = [&](Type t) {
      auto r = cast<RankedTensorType>(t);
      SmallVector<int64_t> shape(r.getShape());
      shape[0] /= tp;
      return RankedTensorType::get(shape, r.getElementType());
    };

    // The embeddings enter the layers on sequence shards (Megatron computes
    // them in full, then scatters).
    SmallVector<Value> positions = embeddingOutputs(model);
    if (positions.empty())
      return model.emitOpError()
             << "sequence parallelism needs a transformer with embeddings";
    for (Value p : positions) {
      Operation *def = p.getDefiningOp();
      int64_t seq = cast<RankedTensorType>(p.getType()).getDimSize(0);
      if (ShapedType::isDynamic(seq) || seq % tp != 0)
        return def->emitOpError() << "sequence length " << seq
                                  << " is not divisible by tp = " << tp
                                  << " (sequence parallelism)";
      b.setInsertionPointAfter(def);
      auto scatter = ScatterToRegionOp::create(b, def->getLoc(),
                                               shardType(p.getType()), p,
                                               meshRef, group, dim0);
      p.replaceAllUsesExcept(scatter, scatter);
    }

    // Region entries and exits.
    SmallVector<Operation *> entries, exits;
    auto isParam = [&](Value v) {
      auto arg = dyn_cast<BlockArgument>(v);
      return arg && model.getArgAttr(arg.getArgNumber(), kParamAttr);
    };
    model.walk([&](Operation *op) {
      // (A whole parameter entering a region, QK-norm's weights, stays
      // a copy: it is not an activation on sequence shards.)
      if (isa<CopyToRegionOp>(op) && !isParam(op->getOperand(0)))
        entries.push_back(op);
      else if (isa<ReduceFromRegionOp>(op) &&
               !isa_and_nonnull<nn::EmbeddingOp>(
                   op->getOperand(0).getDefiningOp()) &&
               !isa_and_nonnull<nn::CrossEntropyStatsOp>(
                   op->getOperand(0).getDefiningOp()))
        exits.push_back(op);
    });
    for (Operation *op : entries) {
      b.setInsertionPoint(op);
      auto gather = AllGatherOp::create(b, op->getLoc(), op->getResultTypes()[0],
                                        op->getOperand(0), meshRef, group, dim0);
      op->replaceAllUsesWith(gather);
      op->erase();
    }
    for (Operation *op : exits) {
      b.setInsertionPoint(op);
      auto scatter = ReduceScatterOp::create(
          b, op->getLoc(), shardType(op->getResultTypes()[0]), op->getOperand(0),
          meshRef, group, dim0);
      if (Attribute layer = op->getAttr(kLayerAttr))
        scatter->setAttr(kLayerAttr, layer);
      op->replaceAllUsesWith(scatter);
      op->erase();
    }

    // Shapes on shards downstream.
    for (Operation &op : model.getBody().front().without_terminator())
      if (!isa<AllGatherOp, ReduceScatterOp, ScatterToRegionOp>(op) &&
          failed(reinferResultTypes(&op)))
        return op.emitOpError() << "cannot re-infer its types on sequence shards";

    // Parameters used on shards get partial gradients: all-reduce them.
    auto onShard = [&](Value v) {
      auto t = cast<RankedTensorType>(v.getType());
      return llvm::any_of(positions, [&](Value p) {
        return t.getDimSize(0) * tp ==
               cast<RankedTensorType>(p.getType()).getDimSize(0);
      });
    };
    // Dropout on shards offsets its mask by the shard's sequence position.
    model.walk([&](nn::DropoutOp d) {
      if (onShard(d.getInput()))
        d.setSequenceShardGroupAttr(group);
    });

    SmallVector<OpOperand *> shardedParamUses;
    auto addParamUses = [&](Operation *op) {
      for (OpOperand &use : op->getOpOperands().drop_front())
        if (auto arg = dyn_cast<BlockArgument>(use.get()))
          if (model.getArgAttr(arg.getArgNumber(), kParamAttr))
            shardedParamUses.push_back(&use);
    };
    model.walk([&](Operation *op) {
      if (isa<nn::LayerNormOp, nn::RMSNormOp, nn::BiasAddOp>(op) &&
          onShard(op->getOperand(0)))
        addParamUses(op);
    });
    // Mixture of experts on sequence shards: the router (and, while the
    // experts are not split over ep or etp, the experts) see this rank's
    // tokens only, so their weights get partial gradients too; the
    // load-balancing loss counts the choices of all tp ranks' tokens
    // (Megatron's sequence_partition_group).
    const bool expertsWhole = mesh.getEp() == 1 && mesh.getEtp() == 1;
    SmallVector<nn::MoEAuxLossOp> auxLosses;
    model.walk([&](Operation *op) {
      if (auto router = dyn_cast<nn::MoERouterOp>(op)) {
        if (Operation *logits = router.getLogits().getDefiningOp();
            logits && onShard(router.getLogits()))
          addParamUses(logits);
      } else if (auto dispatch = dyn_cast<nn::MoEDispatchOp>(op)) {
        if (expertsWhole && onShard(dispatch.getInput()))
          for (Operation *user : dispatch.getCounts().getUsers())
            if (isa<nn::GroupedLinearOp>(user))
              addParamUses(user);
      } else if (auto aux = dyn_cast<nn::MoEAuxLossOp>(op)) {
        if (!aux.getCounts() && onShard(aux.getLogits()))
          auxLosses.push_back(aux);
      }
    });
    for (nn::MoEAuxLossOp aux : auxLosses)
      sumAuxLossCounts(b, aux, meshRef, group);
    for (OpOperand *use : shardedParamUses) {
      b.setInsertionPoint(use->getOwner());
      Value p = use->get();
      use->set(CopyToRegionOp::create(b, use->getOwner()->getLoc(), p.getType(),
                                      p, meshRef, group));
    }
    return success();
  }

  /// Shards parameter `arg` along `dim` over tp (once, even if used twice).
  LogicalResult shardParam(func::FuncOp model, BlockArgument arg, int64_t dim,
                           int64_t tp, Operation *user) {
    OpBuilder b(user);
    if (DictionaryAttr sh = shardings.lookup(arg.getArgNumber())) {
      if (sh.getAs<IntegerAttr>("dim").getInt() != dim)
        return user->emitOpError()
               << "needs parameter "
               << model.getArgAttr(arg.getArgNumber(), kParamAttr)
               << " split along dim " << dim
               << ", but another use split it along dim "
               << sh.getAs<IntegerAttr>("dim").getInt();
      return success();
    }
    auto type = cast<RankedTensorType>(arg.getType());
    if (type.getDimSize(dim) % tp != 0)
      return user->emitOpError()
             << "dimension " << dim << " of size " << type.getDimSize(dim)
             << " is not divisible by tp = " << tp;
    SmallVector<int64_t> shape(type.getShape());
    shape[dim] /= tp;
    arg.setType(RankedTensorType::get(shape, type.getElementType()));
    shardings[arg.getArgNumber()] =
        makeSharding(model.getContext(), {{"tp", dim}});
    return success();
  }

  /// The `dist.sharding` of each split parameter, written to the function
  /// once at the end (one update per argument would rebuild the attribute
  /// array every time: quadratic in the number of parameters).
  DenseMap<unsigned, DictionaryAttr> shardings;

  void applyShardings(func::FuncOp model) {
    SmallVector<DictionaryAttr> attrs;
    for (unsigned i = 0, e = model.getNumArguments(); i < e; ++i) {
      NamedAttrList list(model.getArgAttrDict(i));
      if (DictionaryAttr sh = shardings.lookup(i))
        list.set(kShardingAttr, sh);
      attrs.push_back(list.getDictionary(model.getContext()));
    }
    model.setAllArgAttrs(attrs);
  }

  /// Megatron's vocabulary parallelism (VocabParallelEmbedding, the output
  /// layer as a ColumnParallelLinear, vocab_parallel_cross_entropy): the
  /// word embedding split along the vocabulary (ids outside a rank's shard
  /// give zeros, then an all-reduce), the LM head column-parallel over the
  /// vocabulary (tied or not), and the cross-entropy computed on vocabulary
  /// shards with three all-reduces (row max, sum of exponentials, target
  /// logit) and no gather of logits.
  LogicalResult partitionVocab(func::FuncOp model, int64_t tp, MeshOp mesh) {
    SmallVector<nn::EmbeddingOp> embeddings;
    model.walk([&](nn::EmbeddingOp e) { embeddings.push_back(e); });
    if (embeddings.empty())
      return success();
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    OpBuilder b(model.getContext());
    auto group = b.getStringAttr("tp");
    auto paramArg = [&](Value v) -> BlockArgument {
      auto arg = dyn_cast<BlockArgument>(v);
      if (arg && model.getArgAttr(arg.getArgNumber(), kParamAttr))
        return arg;
      return nullptr;
    };

    for (nn::EmbeddingOp e : embeddings) {
      BlockArgument table = paramArg(e.getTable());
      if (!table)
        return e.emitOpError() << "table must be a model parameter to be split "
                                  "over the vocabulary";
      int64_t rows = cast<RankedTensorType>(table.getType()).getDimSize(0);
      if (rows % tp != 0)
        return e.emitOpError() << "vocabulary of " << rows
                               << " rows is not divisible by tp = " << tp
                               << " (run tessera-pad-vocab first)";
      if (failed(shardParam(model, table, 0, tp, e)))
        return failure();
      e.setVocabShardGroupAttr(group);
      (void)reinferResultTypes(e);
      b.setInsertionPointAfter(e);
      auto reduce = ReduceFromRegionOp::create(b, e.getLoc(), e.getType(),
                                               e.getResult(), meshRef, group);
      e.getResult().replaceAllUsesExcept(reduce, reduce);
    }

    SmallVector<nn::SoftmaxCrossEntropyOp> losses;
    model.walk([&](nn::SoftmaxCrossEntropyOp ce) { losses.push_back(ce); });
    for (nn::SoftmaxCrossEntropyOp ce : losses) {
      // A masked padded vocabulary (tessera-pad-vocab): the mask sits
      // between the head and the loss and works on the shards too.
      auto mask = ce.getLogits().getDefiningOp<nn::MaskColumnsOp>();
      auto head = (mask ? mask.getInput() : ce.getLogits())
                      .getDefiningOp<nn::LinearOp>();
      BlockArgument weight = head ? paramArg(head.getWeight()) : nullptr;
      if (!weight)
        return ce.emitOpError() << "logits must come from an nn.linear with a "
                                   "parameter weight (the LM head) to be "
                                   "split over the vocabulary";
      if (!head.getResult().hasOneUse())
        return head.emitOpError() << "LM head logits feed more than the loss";
      // The LM head: column-parallel over the vocabulary.
      b.setInsertionPoint(head);
      Value x = head.getInput();
      head.setOperand(0, CopyToRegionOp::create(b, head.getLoc(), x.getType(),
                                                x, meshRef, group));
      if (failed(shardParam(model, weight, 0, tp, head)))
        return failure();
      if (Value bias = head.getBias()) {
        BlockArgument biasArg = paramArg(bias);
        if (!biasArg || failed(shardParam(model, biasArg, 0, tp, head)))
          return head.emitOpError() << "LM head bias must be a parameter";
      }
      (void)reinferResultTypes(head);
      if (mask) {
        if (!mask.getResult().hasOneUse())
          return mask.emitOpError() << "masked logits feed more than the loss";
        mask.setGroupAttr(group);
        mask.getResult().setType(head.getResult().getType());
      }

      // The loss on vocabulary shards.
      b.setInsertionPoint(ce);
      Location loc = ce.getLoc();
      Value z = ce.getLogits(), t = ce.getLabels();
      auto ignore = b.getI64IntegerAttr(ce.getIgnoreIndex().value_or(-100));
      Value m = nn::LogitsMaxOp::create(b, loc, z);
      Value globalMax = AllReduceOp::create(b, loc, m.getType(), m, meshRef,
                                            group, enumAttr(b, Reduction::Max));
      auto stats = nn::CrossEntropyStatsOp::create(b, loc, z, t, globalMax,
                                                   ignore, group);
      Value sumExp = ReduceFromRegionOp::create(
          b, loc, stats.getSumExp().getType(), stats.getSumExp(), meshRef, group);
      Value predicted = ReduceFromRegionOp::create(
          b, loc, stats.getPredicted().getType(), stats.getPredicted(), meshRef,
          group);
      Value loss = nn::CrossEntropyFromStatsOp::create(
          b, loc, z, t, globalMax, sumExp, predicted, ignore, group);
      ce.getResult().replaceAllUsesWith(loss);
      ce.erase();
    }
    return success();
  }

  /// Shards the parameters of `op` for `kind`, enters the region before a
  /// column op and leaves it after a row op.
  LogicalResult splitOp(func::FuncOp model, Operation *op, TPSplitKind kind,
                        int64_t tp, MeshOp mesh) {
    OpBuilder b(op);
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    auto group = b.getStringAttr("tp");

    // A row op's bias is added once, after the reduction.
    Value rowBias;
    if (kind == TPSplitKind::Row) {
      if (auto linear = dyn_cast<nn::LinearOp>(op); linear && linear.getBias()) {
        rowBias = linear.getBias();
        auto replacement = nn::LinearOp::create(b, linear.getLoc(),
                                                linear.getInput(),
                                                linear.getWeight(), Value());
        replacement->setDiscardableAttrs(linear->getDiscardableAttrDictionary());
        linear.getResult().replaceAllUsesWith(replacement.getResult());
        linear.erase();
        op = replacement;
      }
    }

    SmallVector<int64_t> dims;
    bool partial = false;
    auto split = cast<TPSplitOpInterface>(op);
    if (failed(split.getSplitDims(kind, dims, partial)))
      return op->emitOpError() << "does not support this tensor-parallel split";

    for (auto [index, dim] : llvm::enumerate(dims)) {
      Value operand = op->getOperand(index);
      if (dim < 0) {
        // A replicated input entering a column region: Megatron's f
        // (copy_to_tensor_model_parallel_region).
        if (kind == TPSplitKind::Column) {
          b.setInsertionPoint(op);
          auto copy = CopyToRegionOp::create(b, op->getLoc(), operand.getType(),
                                             operand, meshRef, group);
          op->setOperand(index, copy);
        }
        continue;
      }
      if (kind == TPSplitKind::Row && index == 0)
        continue; // the activation, already sharded by the column op
      auto arg = dyn_cast<BlockArgument>(operand);
      if (!arg || !model.getArgAttr(arg.getArgNumber(), kParamAttr))
        return op->emitOpError()
               << "operand #" << index
               << " must be a model parameter to be split over tp";
      if (!arg.hasOneUse())
        return op->emitOpError()
               << "parameter "
               << model.getArgAttr(arg.getArgNumber(), kParamAttr)
               << " is used more than once and cannot be split here";
      if (failed(shardParam(model, arg, dim, tp, op)))
        return failure();
    }
    if (failed(reinferResultTypes(op)))
      return op->emitOpError() << "cannot infer its sharded result type";

    if (partial || rowBias) {
      b.setInsertionPointAfter(op);
      Value result = op->getResult(0);
      Value out = result;
      Operation *firstUser = nullptr;
      if (partial) {
        out = ReduceFromRegionOp::create(b, op->getLoc(), result.getType(),
                                         result, meshRef, group);
        firstUser = out.getDefiningOp();
      }
      if (rowBias) {
        out = nn::BiasAddOp::create(b, op->getLoc(), out, rowBias);
        if (!firstUser)
          firstUser = out.getDefiningOp();
      }
      result.replaceAllUsesExcept(out, firstUser);
      // New ops belong to the same transformer layer.
      if (Attribute layer = op->getAttr(kLayerAttr))
        for (Operation *created = firstUser; created;
             created = created == out.getDefiningOp() ? nullptr
                                                      : created->getNextNode())
          created->setAttr(kLayerAttr, layer);
    }
    return success();
  }
};
} // namespace
