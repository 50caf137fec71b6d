//===- Autodiff.cpp - Reverse-mode differentiation ------------------------===//
//
// Without pipeline stages, the model function becomes the microbatch phase:
// forward, then a reverse sweep that asks each op for its adjoints
// (DifferentiableOpInterface), then a return of the loss and one gradient
// per parameter. Only values that depend on a parameter (or arrive from an
// earlier pipeline stage) are differentiated.
//
// Each pipeline chunk (`dist.stage`, from tessera-pp-split) becomes two
// phases, because the schedule runs a microbatch's backward long after its
// forward: `forward_c<k>` returns the loss (last stage) and the values the
// backward needs (`tessera.stash`), and `backward_c<k>` takes them and
// returns the gradients. A value sent to the next stage gets its adjoint
// from that stage (dist.recv from "next", tag + 1); the adjoint of a value
// received from the previous stage is sent back to it (dist.send to "prev",
// tag + 1), zeros if nothing here depends on it, so both sides agree.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"

namespace tessera::nn {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {

/// Appends the reverse sweep of `func`'s body before its terminator and
/// returns the gradients of `params` in `grads` (zeros for unused ones).
/// `loss`, if set, is seeded with 1/M; values sent to the next stage are
/// seeded from it; adjoints of values received from the previous stage are
/// sent back.
/// The type of a parameter's gradient: under mixed precision (bf16
/// parameters) the recorded grad dtype, else the parameter's own type.
static RankedTensorType gradTypeOf(BlockArgument p) {
  auto type = cast<RankedTensorType>(p.getType());
  auto mp = getRootModule(p.getOwner()->getParentOp())
                ->getAttrOfType<DictionaryAttr>(kMixedPrecisionAttr);
  auto grads = mp ? mp.getAs<StringAttr>("grads") : StringAttr();
  if (!grads || type.getElementType().isF32())
    return type;
  Builder b(p.getContext());
  Type element = floatDtypeType(
      b.getContext(),
      symbolizeFloatDtype(grads.getValue()).value_or(FloatDtype::F32));
  return RankedTensorType::get(type.getShape(), element);
}

/// Activation recompute (groups marked by tessera-recompute, Megatron's
/// full recompute): for each group, the values its ops produce that the
/// rest of the forward does not read but the backward does are computed
/// again right before the backward first reads one of them, by clones of
/// the group's ops that lead to them (in order, from the group's inputs and
/// the parameters), and the backward reads the clones. The forward's copies
/// then die inside the forward, so a pipeline chunk no longer stashes them
/// and the memory plan no longer keeps them across the backward: the group
/// keeps only its inputs. The clones compute the same values (dropout's
/// masks are keyed by position, not drawn), so training is bit-identical.
static void recomputeGroups(ArrayRef<Operation *> forward) {
  DenseSet<Operation *> isForward(forward.begin(), forward.end());
  llvm::MapVector<int64_t, SmallVector<Operation *>> groups;
  for (Operation *op : forward)
    if (auto g = op->getAttrOfType<IntegerAttr>(kRecomputeAttr))
      groups[g.getInt()].push_back(op);
  for (auto &[id, ops] : groups) {
    DenseSet<Operation *> inGroup(ops.begin(), ops.end());
    // A value is internal when only the group's ops read it in the forward.
    auto internal = [&](Value v) {
      Operation *def = v.getDefiningOp();
      return def && inGroup.contains(def) &&
             llvm::all_of(v.getUsers(), [&](Operation *u) {
               return !isForward.contains(u) || inGroup.contains(u);
             });
    };
    SmallVector<Value> needed;
    Operation *first = nullptr; // the backward's first reader of one
    for (Operation *op : ops)
      for (Value r : op->getResults()) {
        if (!internal(r))
          continue;
        bool read = false;
        for (Operation *u : r.getUsers())
          if (!isForward.contains(u)) {
            read = true;
            if (!first || u->isBeforeInBlock(first))
              first = u;
          }
        if (read)
          needed.push_back(r);
      }
    if (needed.empty())
      continue;
    // The group's ops those values depend on through internal values.
    DenseSet<Operation *> slice;
    SmallVector<Operation *> work;
    for (Value v : needed)
      if (slice.insert(v.getDefiningOp()).second)
        work.push_back(v.getDefiningOp());
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      for (Value operand : op->getOperands())
        if (internal(operand) && slice.insert(operand.getDefiningOp()).second)
          work.push_back(operand.getDefiningOp());
    }
    OpBuilder b(first);
    IRMapping map;
    DenseSet<Operation *> clones;
    for (Operation *op : ops) {
      if (!slice.contains(op))
        continue;
      // Operands the group does not recompute are read as they are.
      Operation *clone = b.clone(*op, map);
      clone->removeAttr(kRecomputeAttr);
      clones.insert(clone);
    }
    for (Value v : needed)
      v.replaceUsesWithIf(map.lookup(v), [&](OpOperand &use) {
        return !isForward.contains(use.getOwner()) &&
               !clones.contains(use.getOwner());
      });
  }
}

/// The first op (in block order) outside `forward` that reads one of
/// `values`: where the backward first needs them; null if it never does.
static Operation *firstUserOutside(ValueRange values,
                                   const DenseSet<Operation *> &forward) {
  Operation *first = nullptr;
  for (Value v : values)
    for (Operation *user : v.getUsers())
      if (!forward.contains(user) && (!first || user->isBeforeInBlock(first)))
        first = user;
  return first;
}

LogicalResult buildReverseSweep(func::FuncOp func, Value loss,
                                ArrayRef<BlockArgument> params,
                                int64_t numMicrobatches,
                                SmallVectorImpl<Value> &grads) {
  Block &body = func.getBody().front();
  Operation *ret = body.getTerminator();

  // Forward: which values depend on a parameter or on an earlier stage.
  DenseSet<Value> active(params.begin(), params.end());
  for (Operation &op : body.without_terminator()) {
    if (isa<dist::RecvOp>(op)) {
      active.insert(op.getResult(0));
      continue;
    }
    if (!op.hasTrait<NonDifferentiable>() &&
        llvm::any_of(op.getOperands(),
                     [&](Value v) { return active.contains(v); }))
      for (Value r : op.getResults())
        active.insert(r);
  }

  OpBuilder b(ret);
  DenseMap<Value, Value> adjoint;
  // tessera-bf16-activations ran: its bf16 transfers' adjoints travel in
  // bf16 (below).
  auto mp = getRootModule(func)->getAttrOfType<DictionaryAttr>(
      kMixedPrecisionAttr);
  const bool halfActivations = mp && mp.get("activations");
  auto accumulate = [&](Value v, Value adj) {
    auto [it, inserted] = adjoint.try_emplace(v, adj);
    if (!inserted)
      it->second = AddOp::create(b, adj.getLoc(), it->second, adj);
  };
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);

  // Gradients from the next stage first: the backward starts by receiving.
  for (Operation *op : llvm::reverse(forward))
    if (auto send = dyn_cast<dist::SendOp>(op)) {
      Value v = send.getInput();
      // From the rank the value went to.
      // In the value's dtype (bf16 for bf16 activations), accumulated in
      // f32 as every adjoint.
      Value g = dist::RecvOp::create(b, send.getLoc(), v.getType(),
                                     send.getPeerAttr(),
                                     b.getI64IntegerAttr(send.getTag() + 1));
      if (active.contains(v))
        accumulate(v, castElements(b, send.getLoc(), g, b.getF32Type()));
    }
  // fp16 (f16 parameters): the seed carries the loss scale (Megatron's
  // scale_loss before the backward), which the optimizer unscales.
  if (loss)
    accumulate(loss, createLossSeed(b, loss.getLoc(), loss.getType(),
                                    1.0f / float(numMicrobatches), func));

  for (Operation *op : llvm::reverse(forward)) {
    if (isa<dist::SendOp, dist::RecvOp>(op))
      continue;
    SmallVector<Value> resultAdj;
    bool any = false;
    for (Value r : op->getResults()) {
      Value a = adjoint.lookup(r);
      any |= bool(a);
      resultAdj.push_back(a);
    }
    if (!any)
      continue;
    SmallVector<bool> needed;
    bool anyNeeded = false;
    for (Value operand : op->getOperands()) {
      needed.push_back(active.contains(operand));
      anyNeeded |= needed.back();
    }
    if (!anyNeeded)
      continue;
    // Mixed precision: adjoints are f32 whatever the value's dtype
    // (nn.cast's rule passes them through), so a bf16 parameter's gradient
    // is accumulated in f32 (Megatron's fp32 main_grad) and rounded to the
    // grad dtype once, below. Where a bf16 activation travels (a dist op
    // tessera-bf16-activations made carry it), its adjoint travels in bf16
    // too, as Megatron's bf16 gradients do, and is f32 again after.
    auto diff = dyn_cast<DifferentiableOpInterface>(op);
    if (!diff)
      return op->emitOpError() << "has no gradient rule (DifferentiableOpInterface)";
    bool halfTransfer = halfActivations &&
                        isa<dist::DistDialect>(op->getDialect()) &&
                        op->getNumOperands() &&
                        !isa<BlockArgument>(op->getOperand(0)) &&
                        llvm::any_of(op->getResultTypes(), [](Type t) {
                          auto r = dyn_cast<RankedTensorType>(t);
                          return r && r.getElementType().isBF16();
                        });
    if (halfTransfer)
      for (unsigned i = 0; i < resultAdj.size(); ++i)
        if (resultAdj[i])
          resultAdj[i] = castElements(
              b, op->getLoc(), resultAdj[i],
              cast<RankedTensorType>(op->getResult(i).getType())
                  .getElementType());
    // Results nothing depends on have a null adjoint; each op's rule
    // treats that as zero (nn.add_layer_norm's sum, when only the layer
    // norm reads it).
    SmallVector<Value> operandAdj;
    if (failed(diff.buildAdjoint(b, resultAdj, needed, operandAdj)))
      return failure();
    if (halfTransfer)
      for (Value &a : operandAdj)
        if (a)
          a = castElements(b, op->getLoc(), a, b.getF32Type());
    for (auto [operand, adj] : llvm::zip(op->getOperands(), operandAdj))
      if (adj && active.contains(operand))
        accumulate(operand, adj);
  }

  for (BlockArgument p : params) {
    Value g = adjoint.lookup(p);
    RankedTensorType type = gradTypeOf(p);
    if (!g) // unused parameter: zero gradient
      g = FillOp::create(b, p.getLoc(), type, b.getF32FloatAttr(0));
    else
      g = castElements(b, p.getLoc(), g, type.getElementType());
    grads.push_back(g);
  }
  // Gradients of received values go back to the previous stage last.
  for (Operation *op : forward)
    if (auto recv = dyn_cast<dist::RecvOp>(op)) {
      Value g = adjoint.lookup(recv.getResult());
      if (!g)
        g = FillOp::create(b, recv.getLoc(), recv.getType(), b.getF32FloatAttr(0));
      else // in the value's dtype
        g = castElements(b, recv.getLoc(), g, recv.getType().getElementType());
      // To the rank the value came from.
      dist::SendOp::create(b, recv.getLoc(), g, recv.getPeerAttr(),
                           b.getI64IntegerAttr(recv.getTag() + 1));
    }

  // bf16 activations: where the backward reads an activation (an op's own
  // result, as nn.add_layer_norm's rule reads its sum), it reads the
  // stored bf16 form cast to f32, so the f32 value dies in the forward.
  // Before the recompute groups, so that a recomputed group's backward
  // reads the same rounded values (its clones include the casts).
  DenseSet<Operation *> isForward(forward.begin(), forward.end());
  SmallVector<Operation *> unread; // stored forms nothing reads
  for (Operation *op : forward) {
    auto c = dyn_cast<CastOp>(op);
    if (!c || !c->hasAttr(kStoredActivationAttr))
      continue;
    Value wide = c.getInput();
    Operation *first = firstUserOutside(wide, isForward);
    if (!first) {
      // (Not the forward's last op: differentiateChunk splits the phases
      // after it.)
      if (c->use_empty() && op != forward.back())
        unread.push_back(c);
      continue;
    }
    b.setInsertionPoint(first);
    Value again = CastOp::create(b, c.getLoc(), wide.getType(), c.getResult());
    wide.replaceUsesWithIf(again, [&](OpOperand &use) {
      return !isForward.contains(use.getOwner()) &&
             use.getOwner() != again.getDefiningOp();
    });
  }

  recomputeGroups(forward);

  // Ops the backward computes again where it first needs them instead of
  // keeping their results, so the forward's copy dies with its last forward
  // reader (and a pipeline chunk's backward does not take it as a saved
  // activation):
  // - mixed precision: the f32 cast of a bf16 parameter (otherwise one f32
  //   copy of the weights per microbatch in flight);
  // - ops marked nn.recompute_in_backward (selective recompute: sequence
  //   parallelism's all-gathers, of which the backward keeps the shard,
  //   and the bf16 casts of their results for the GEMMs; under bf16
  //   activations, each reader's cast of a stored activation to f32).
  // Last to first, so that a chain of them (an all-gather and its cast) is
  // cloned whole: the clone of the later one reads the earlier one, which
  // is then cloned before it.
  for (Operation *op : llvm::reverse(forward)) {
    auto c = dyn_cast<CastOp>(op);
    auto arg = c ? dyn_cast<BlockArgument>(c.getInput()) : BlockArgument();
    bool paramCast = arg && llvm::is_contained(params, arg);
    if (!paramCast && !op->hasAttr(kRecomputeInBackwardAttr))
      continue;
    Operation *first = firstUserOutside(op->getResults(), isForward);
    if (!first)
      continue;
    b.setInsertionPoint(first);
    Operation *again = b.clone(*op);
    again->removeAttr(kRecomputeInBackwardAttr);
    op->replaceUsesWithIf(again->getResults(), [&](OpOperand &use) {
      return !isForward.contains(use.getOwner()) && use.getOwner() != again;
    });
  }

  // A 16-bit value cast to f32 and back (a bf16 transfer's adjoint read by
  // a bf16 GEMM) is the value itself: the round trip is exact.
  // (Not a gradient the caller returns: `grads` holds its value.)
  DenseSet<Value> returned(grads.begin(), grads.end());
  SmallVector<CastOp> casts;
  body.walk([&](CastOp c) { casts.push_back(c); });
  for (CastOp c : casts) {
    auto widen = c.getInput().getDefiningOp<CastOp>();
    if (!widen || widen.getInput().getType() != c.getType() ||
        returned.contains(c.getResult()) ||
        returned.contains(widen.getResult()) ||
        !cast<RankedTensorType>(widen.getType()).getElementType().isF32())
      continue;
    c.getResult().replaceAllUsesWith(widen.getInput());
    c.erase();
    if (widen->use_empty())
      widen.erase();
  }
  for (Operation *op : unread)
    op->erase();
  return success();
}

DictionaryAttr binding(Builder &b, StringRef attr, Attribute value) {
  return b.getDictionaryAttr(b.getNamedAttr(attr, value));
}

struct AutodiffPass : tessera::nn::impl::AutodiffPassBase<AutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<ModuleOp> programs = getPrograms(module);
    if (programs.front() == module) {
      if (failed(differentiateModel(module)))
        signalPassFailure();
      return;
    }
    for (ModuleOp program : programs) {
      SmallVector<func::FuncOp> chunks;
      for (auto f : program.getOps<func::FuncOp>()) {
        if (f->hasAttr(kPhaseAttr)) {
          emitError(f.getLoc()) << "the module is already differentiated";
          return signalPassFailure();
        }
        if (f->hasAttr(kStageAttr))
          chunks.push_back(f);
      }
      if (chunks.empty()) {
        emitError(program.getLoc()) << "pipeline rank module has no stage "
                                       "functions (dist.stage)";
        return signalPassFailure();
      }
      for (func::FuncOp chunk : chunks)
        if (failed(differentiateChunk(chunk)))
          return signalPassFailure();
    }
  }

  static LogicalResult checkLoss(func::FuncOp f, Value &loss) {
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    if (ret.getNumOperands() == 0)
      return success();
    if (ret.getNumOperands() != 1 ||
        !isa<RankedTensorType>(ret.getOperand(0).getType()) ||
        cast<RankedTensorType>(ret.getOperand(0).getType()).getRank() != 0)
      return f.emitOpError() << "must return exactly one 0-d loss tensor to be "
                                "differentiated";
    loss = ret.getOperand(0);
    return success();
  }

  LogicalResult differentiateModel(ModuleOp module) {
    if (getPhaseFunc(module, kMicrobatchPhase))
      return emitError(module.getLoc()) << "the module is already differentiated";
    func::FuncOp model = getModelFunc(module);
    if (!model)
      return failure();
    Value loss;
    if (failed(checkLoss(model, loss)))
      return failure();
    if (!loss)
      return model.emitOpError() << "must return exactly one 0-d loss tensor "
                                    "to be differentiated";
    Block &body = model.getBody().front();
    SmallVector<BlockArgument> params;
    for (BlockArgument arg : body.getArguments())
      if (model.getArgAttr(arg.getArgNumber(), kParamAttr))
        params.push_back(arg);
    SmallVector<Value> grads;
    if (failed(buildReverseSweep(model, loss, params,
                                 getNumMicrobatches(module), grads)))
      return failure();

    // Return the loss and one gradient per parameter.
    auto ret = body.getTerminator();
    OpBuilder b(ret);
    SmallVector<Value> results{loss};
    results.append(grads);
    func::ReturnOp::create(b, ret->getLoc(), results);
    ret->erase();
    updateFunctionType(model);
    SmallVector<DictionaryAttr> resultAttrs{
        binding(b, kBufferAttr, b.getStringAttr("loss"))};
    for (BlockArgument p : params)
      resultAttrs.push_back(binding(
          b, kGradOfAttr, model.getArgAttr(p.getArgNumber(), kParamAttr)));
    model.setAllResultAttrs(resultAttrs);
    model->setAttr(kPhaseAttr, b.getStringAttr(kMicrobatchPhase));
    return success();
  }

  /// Differentiates a chunk in place, then splits it into its forward and
  /// backward phases at the first op the sweep created.
  LogicalResult differentiateChunk(func::FuncOp chunk) {
    auto stageInfo = chunk->getAttrOfType<DictionaryAttr>(kStageAttr);
    int64_t c = stageInfo.getAs<IntegerAttr>("chunk").getInt();
    Value loss;
    if (failed(checkLoss(chunk, loss)))
      return failure();
    Block &body = chunk.getBody().front();
    SmallVector<BlockArgument> params;
    for (BlockArgument arg : body.getArguments())
      if (chunk.getArgAttr(arg.getArgNumber(), kParamAttr))
        params.push_back(arg);
    Operation *lastForward = body.getTerminator()->getPrevNode();
    SmallVector<Value> grads;
    if (failed(buildReverseSweep(chunk, loss, params,
                                 getNumMicrobatches(getRootModule(chunk)),
                                 grads)))
      return failure();
    Operation *ret = body.getTerminator();
    SmallVector<Operation *> backwardOps;
    for (Operation *op = lastForward ? lastForward->getNextNode() : &body.front();
         op != ret; op = op->getNextNode())
      backwardOps.push_back(op);
    DenseSet<Operation *> isBackward(backwardOps.begin(), backwardOps.end());

    // Forward values and arguments the backward reads.
    llvm::SetVector<Value> stash;
    llvm::SetVector<BlockArgument> backwardArgs;
    for (Operation *op : backwardOps)
      for (Value v : op->getOperands()) {
        if (auto arg = dyn_cast<BlockArgument>(v))
          backwardArgs.insert(arg);
        else if (!isBackward.contains(v.getDefiningOp()))
          stash.insert(v);
      }

    OpBuilder b(chunk);
    b.setInsertionPointAfter(chunk);
    MLIRContext *ctx = chunk.getContext();
    // The backward phase.
    SmallVector<Type> bwdArgTypes;
    SmallVector<DictionaryAttr> bwdArgAttrs;
    for (BlockArgument arg : backwardArgs) {
      bwdArgTypes.push_back(arg.getType());
      bwdArgAttrs.push_back(chunk.getArgAttrDict(arg.getArgNumber()));
    }
    for (auto [i, v] : llvm::enumerate(stash)) {
      bwdArgTypes.push_back(v.getType());
      bwdArgAttrs.push_back(binding(b, kStashAttr, b.getI64IntegerAttr(i)));
    }
    SmallVector<Type> gradTypes;
    SmallVector<DictionaryAttr> gradAttrs;
    for (auto [p, g] : llvm::zip(params, grads)) {
      gradTypes.push_back(g.getType());
      gradAttrs.push_back(
          binding(b, kGradOfAttr, chunk.getArgAttr(p.getArgNumber(), kParamAttr)));
    }
    auto bwd = func::FuncOp::create(b, chunk.getLoc(),
                                    ("backward_c" + Twine(c)).str(),
                                    FunctionType::get(ctx, bwdArgTypes, gradTypes));
    bwd.setAllArgAttrs(bwdArgAttrs);
    bwd.setAllResultAttrs(gradAttrs);
    bwd->setAttr(kPhaseAttr, b.getStringAttr(kBackwardPhase));
    bwd->setAttr(kChunkAttr, b.getI64IntegerAttr(c));
    bwd->setAttr(kStageAttr, stageInfo);
    Block *bwdBody = bwd.addEntryBlock();
    IRMapping map;
    unsigned n = 0;
    for (BlockArgument arg : backwardArgs)
      map.map(arg, bwdBody->getArgument(n++));
    for (Value v : stash)
      map.map(v, bwdBody->getArgument(n++));
    b.setInsertionPointToStart(bwdBody);
    for (Operation *op : backwardOps)
      b.clone(*op, map);
    SmallVector<Value> gradResults;
    for (Value g : grads)
      gradResults.push_back(map.lookupOrDefault(g));
    func::ReturnOp::create(b, chunk.getLoc(), gradResults);

    // The forward phase: the chunk itself without the sweep.
    for (Operation *op : llvm::reverse(backwardOps))
      op->erase();
    b.setInsertionPoint(ret);
    SmallVector<Value> fwdResults;
    SmallVector<DictionaryAttr> fwdAttrs;
    if (loss) {
      fwdResults.push_back(loss);
      fwdAttrs.push_back(binding(b, kBufferAttr, b.getStringAttr("loss")));
    }
    for (auto [i, v] : llvm::enumerate(stash)) {
      fwdResults.push_back(v);
      fwdAttrs.push_back(binding(b, kStashAttr, b.getI64IntegerAttr(i)));
    }
    func::ReturnOp::create(b, ret->getLoc(), fwdResults);
    ret->erase();
    updateFunctionType(chunk);
    chunk.setAllResultAttrs(fwdAttrs);
    chunk.setSymName(("forward_c" + Twine(c)).str());
    chunk->setAttr(kPhaseAttr, b.getStringAttr(kForwardPhase));
    chunk->setAttr(kChunkAttr, b.getI64IntegerAttr(c));
    return success();
  }
};
} // namespace
