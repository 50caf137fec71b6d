//===- Bf16Activations.cpp - bf16 activations between ops -----------------===//
//
// Megatron's --bf16 stores every activation in bf16: each layer's output,
// the residual stream (fp32_residual_connection off, Megatron's default),
// the attention's and the MLP's intermediates, the logits, and so every
// tensor-, context- and pipeline-parallel transfer of them. Its kernels
// compute in f32 where it matters (norm statistics, softmax, the loss) and
// round what they store.
//
// Here the kernels compute in f32 and this pass makes what they store
// bf16, as explicit casts the rest of the compiler sees:
//   - every f32 result of an activation-producing op (the list in
//     producesActivation) is cast to bf16 right after the op; that bf16
//     value is what is kept;
//   - each reader gets its own cast back to f32 right before it (so the
//     f32 copy lives only across that reader), marked
//     nn.recompute_in_backward: tessera-autodiff computes it again in the
//     backward from the bf16 value instead of keeping it, so saved
//     activations (a pipeline chunk's stash) are bf16;
//   - a reader that is itself a cast to bf16 (tessera-mixed-precision's
//     GEMM operand) reads the bf16 value directly;
//   - a reader that only moves or sums the value (the tensor-parallel
//     regions' ops, the collectives, dist.send) carries it in bf16: its
//     result becomes bf16 and the same rules apply to its readers, so the
//     transfer is bf16 (Megatron's bf16 all-reduce, all-gather,
//     reduce-scatter and pipeline p2p). The receive of a bf16 send on the
//     next stage becomes bf16 as well.
// A fused add + norm is split again: the norm reads the rounded sum, as
// Megatron's norm reads the bf16 residual stream.
// Values that stay f32: the loss and everything of the cross entropy
// (statistics, per-token losses), the MoE router's logits, probabilities
// and auxiliary loss (Megatron's router keeps its softmax in f32; Tessera
// keeps the [tokens, experts] logits too), the expert exchange's rows
// under etp > 1 (its partial sums are added in f32), and ring attention's
// dK/dV blocks (its K/V blocks travel in bf16: tessera-lower-to-rt's
// kv_format). Gradients (adjoints) are f32
// inside tessera-autodiff and bf16 wherever they travel: the transfers'
// adjoints and the pipeline's gradient sends take the value's dtype.
//
// The module records `activations = "bf16"` in tessera.mixed_precision,
// for the reports and the planner.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallSet.h"

namespace tessera::nn {
#define GEN_PASS_DEF_BF16ACTIVATIONSPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {

/// The ops whose f32 results are activations: stored in bf16.
bool producesActivation(Operation *op) {
  if (isa<LinearOp>(op))
    // An MoE router's GEMM: its logits stay f32 with the router.
    return !llvm::any_of(op->getResult(0).getUsers(), [](Operation *u) {
      return isa<MoERouterOp, MoEAuxLossOp>(u);
    });
  return isa<MatmulOp, GeluOp, BiasGeluOp, SwiGLUOp, ReluOp, AddOp, BiasAddOp,
             EmbeddingOp, AddPositionEmbeddingOp, LayerNormOp, RMSNormOp,
             AttentionOp, RepeatKVOp, QKNormOp,
             RotaryEmbeddingOp, DropoutOp, MoEDispatchOp, GroupedLinearOp,
             MoECombineOp, AddAuxLossOp, MaskColumnsOp>(op);
}

/// The ops that carry a bf16 value as it is (move it, or sum it in bf16 as
/// Megatron's bf16 collectives do): their result takes its dtype.
bool carriesHalf(Operation *op) {
  if (auto r = dyn_cast<dist::AllReduceOp>(op))
    return r.getReduction() == dist::Reduction::Sum;
  // The expert exchange moves rows (etp > 1 also sums partial rows: f32).
  if (auto d = dyn_cast<dist::ExpertDispatchOp>(op))
    return d.getEtp() == 1;
  if (auto c = dyn_cast<dist::ExpertCombineOp>(op))
    return c.getEtp() == 1;
  return isa<dist::CopyToRegionOp, dist::ReduceFromRegionOp,
             dist::ScatterToRegionOp, dist::GatherFromRegionOp,
             dist::AllGatherOp, dist::ReduceScatterOp, dist::AllToAllOp,
             dist::SendOp>(op);
}

bool isF32Activation(Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  return type && type.getRank() > 0 && type.getElementType().isF32();
}

RankedTensorType withElement(Type type, Type element) {
  auto ranked = cast<RankedTensorType>(type);
  return RankedTensorType::get(ranked.getShape(), element);
}

void copyPlacement(Operation *from, Operation *to) {
  for (StringRef name : {StringRef(kLayerAttr), StringRef(kRecomputeAttr)})
    if (Attribute a = from->getAttr(name))
      to->setAttr(name, a);
}

struct Bf16ActivationsPass
    : tessera::nn::impl::Bf16ActivationsPassBase<Bf16ActivationsPass> {
  Type half;
  /// Tags of the pipeline sends that now carry bf16.
  llvm::SmallSet<int64_t, 16> halfTags;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    auto mp = root->getAttrOfType<DictionaryAttr>(kMixedPrecisionAttr);
    auto params = mp ? mp.getAs<StringAttr>("params") : StringAttr();
    if (!params || params.getValue() != "bf16") {
      emitError(root.getLoc())
          << "bf16 activations need bf16 parameters (run "
             "tessera-mixed-precision with params-dtype=bf16 first)";
      return signalPassFailure();
    }
    if (mp.get("activations")) {
      emitError(root.getLoc()) << "the module has bf16 activations already";
      return signalPassFailure();
    }
    half = BFloat16Type::get(root.getContext());
    SmallVector<func::FuncOp> funcs;
    for (ModuleOp program : getPrograms(root))
      for (auto f : program.getOps<func::FuncOp>()) {
        if (f->hasAttr(kPhaseAttr)) {
          f.emitOpError() << "is a training phase; tessera-bf16-activations "
                             "runs on the model, before tessera-autodiff";
          return signalPassFailure();
        }
        if (!f.isExternal())
          funcs.push_back(f);
      }
    for (func::FuncOp f : funcs)
      narrow(f);
    // The receives of bf16 sends, until none is left (a value may be
    // relayed through a stage: received, then sent on).
    for (bool changed = true; changed;) {
      changed = false;
      SmallVector<dist::RecvOp> recvs;
      for (func::FuncOp f : funcs)
        f.walk([&](dist::RecvOp recv) {
          if (halfTags.contains(recv.getTag()) &&
              isF32Activation(recv.getResult()))
            recvs.push_back(recv);
        });
      for (dist::RecvOp recv : recvs) {
        recv.getResult().setType(withElement(recv.getType(), half));
        rewire(recv.getResult());
        changed = true;
      }
    }
    // (Signatures stay: a return reads what any other f32 reader does.)
    Builder b(root.getContext());
    SmallVector<NamedAttribute> entries(mp.getValue());
    entries.push_back(b.getNamedAttr("activations", b.getStringAttr("bf16")));
    root->setAttr(kMixedPrecisionAttr, b.getDictionaryAttr(entries));
  }

  /// Megatron's residual stream is stored in bf16 and the next norm reads
  /// it rounded: a fused add + norm (tessera-fuse-add-layer-norm) would
  /// normalise the unrounded sum, so it is split into its add and its
  /// norm again, each of which stores its result.
  static void unfuseAddNorms(func::FuncOp f) {
    SmallVector<Operation *> fused;
    f.walk([&](Operation *op) {
      if (isa<AddLayerNormOp, AddRMSNormOp>(op))
        fused.push_back(op);
    });
    for (Operation *op : fused) {
      OpBuilder b(op);
      auto sum = AddOp::create(b, op->getLoc(), op->getOperand(0),
                               op->getOperand(1));
      Operation *norm;
      if (auto ln = dyn_cast<AddLayerNormOp>(op))
        norm = LayerNormOp::create(b, op->getLoc(), sum.getResult(),
                                   ln.getWeight(), ln.getBias(),
                                   ln.getEpsAttr());
      else
        norm = RMSNormOp::create(b, op->getLoc(), sum.getResult(),
                                 op->getOperand(2),
                                 cast<AddRMSNormOp>(op).getEpsAttr());
      for (Operation *part : {sum.getOperation(), norm})
        part->setDiscardableAttrs(op->getDiscardableAttrDictionary());
      op->getResult(0).replaceAllUsesWith(sum.getResult());
      op->getResult(1).replaceAllUsesWith(norm->getResult(0));
      op->erase();
    }
  }

  void narrow(func::FuncOp f) {
    unfuseAddNorms(f);
    OpBuilder b(f.getContext());
    SmallVector<Operation *> producers;
    f.walk([&](Operation *op) {
      if (producesActivation(op))
        producers.push_back(op);
    });
    for (Operation *op : producers)
      for (Value r : op->getResults()) {
        // (Also a result only the backward will read: nn.add_layer_norm's
        // sum in the last layer. tessera-autodiff drops the cast if nothing
        // reads it.)
        if (!isF32Activation(r))
          continue;
        b.setInsertionPointAfter(op);
        auto low = CastOp::create(b, op->getLoc(), withElement(r.getType(), half), r);
        copyPlacement(op, low);
        low->setAttr(kStoredActivationAttr, b.getUnitAttr());
        r.replaceAllUsesExcept(low.getResult(), low);
        rewire(low.getResult());
      }
  }

  /// `low` is a bf16 activation whose readers may still expect f32 (they
  /// read its f32 form until now): each reads it as the rules above say.
  void rewire(Value low) {
    SmallVector<OpOperand *> uses;
    for (OpOperand &use : low.getUses())
      uses.push_back(&use);
    OpBuilder b(low.getContext());
    DenseMap<Operation *, Value> widened; // one cast per reader
    Type wide = withElement(low.getType(), Float32Type::get(low.getContext()));
    for (OpOperand *use : uses) {
      Operation *user = use->getOwner();
      if (auto c = dyn_cast<CastOp>(user)) {
        if (c.getType() == low.getType()) {
          // Already the 16-bit operand of a GEMM.
          c.getResult().replaceAllUsesWith(low);
          c.erase();
          continue;
        }
        if (c.getInput() == low && c.getType() == wide)
          continue; // one of ours
      }
      if (carriesHalf(user)) {
        if (auto send = dyn_cast<dist::SendOp>(user)) {
          halfTags.insert(send.getTag());
          continue;
        }
        Value result = user->getResult(0);
        if (!isF32Activation(result))
          continue;
        result.setType(withElement(result.getType(), half));
        rewire(result);
        continue;
      }
      Value &w = widened[user];
      if (!w) {
        b.setInsertionPoint(user);
        auto cast = CastOp::create(b, user->getLoc(), wide, low);
        copyPlacement(user, cast);
        // A recompute group's ops are computed again whole; otherwise the
        // backward casts again from the bf16 value.
        if (!user->hasAttr(kRecomputeAttr))
          cast->setAttr(kRecomputeInBackwardAttr, b.getUnitAttr());
        w = cast.getResult();
      }
      use->set(w);
    }
  }
};
} // namespace
