//===- EmitRT.cpp - lower-to-rt stage 4: nn/dist -> rt patterns -----------===//
//
// Conversion patterns that replace each nn and dist op of a phase with rt
// kernels, collectives and p2p ops over the buffers of the storage plan
// (stage 2): a tensor value becomes the memref of its storage (an rt.get of
// a persistent buffer or an rt.alloc at its planned offset, declared at the
// top of the function the first time it is used), an async collective's
// future becomes an !rt.event. A ConversionTarget makes nn and dist illegal,
// so a phase lowers completely or not at all; what cannot lower is reported
// before the conversion runs, naming the op.
//
// The patterns read each op's operands as they were before the conversion
// (the plan is keyed by the original values); results are replaced by their
// storage's memref, so the framework's bookkeeping stays consistent.
//
//===----------------------------------------------------------------------===//

#include "LowerToRT.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/DialectConversion.h"

#include <map>

using namespace mlir;
using namespace tessera;

namespace tessera::lowering {
namespace {

//===----------------------------------------------------------------------===//
// What the patterns of one phase share
//===----------------------------------------------------------------------===//

struct EmitState {
  EmitState(PhasePlan &plan, Block *block)
      : plan(plan), block(block), loc(plan.func.getLoc()) {}

  /// The memref of storage `id`, declared at the top of the body the first
  /// time (a persistent buffer's rt.get is shared by its storages).
  Value storageBuffer(OpBuilder &b, int id) {
    Storage &st = plan.storages[id];
    if (!st.persistent.empty())
      if (Value get = gets.lookup(st.persistent))
        return get;
    auto [it, inserted] = memrefs.try_emplace(id, Value());
    if (inserted) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(block);
      MemRefType type = toMemRef(st.type);
      if (!st.persistent.empty()) {
        it->second = rt::GetOp::create(
            b, loc, type, FlatSymbolRefAttr::get(b.getContext(), st.persistent));
        gets[st.persistent] = it->second;
      } else {
        it->second =
            rt::AllocOp::create(b, loc, type, b.getI64IntegerAttr(st.offset));
      }
    }
    return it->second;
  }
  /// The memref of a value of the source phase.
  Value bufferOf(OpBuilder &b, Value v) {
    return storageBuffer(b, plan.storageId(v));
  }
  /// The memref of operand `i` of `op` as it was before the conversion.
  Value operand(OpBuilder &b, Operation *op, unsigned i) {
    return bufferOf(b, operandsOf.lookup(op)[i]);
  }
  /// What a tensor result is replaced with: its storage's memref if it is
  /// declared already, else a placeholder of that type (erased after the
  /// conversion; nothing reads a replaced value, the patterns read the
  /// plan), so that the memrefs are declared in the order kernels use them.
  Value replacement(OpBuilder &b, Value result) {
    int id = plan.storageId(result);
    const Storage &st = plan.storages[id];
    if (!st.persistent.empty())
      if (Value get = gets.lookup(st.persistent))
        return get;
    if (Value m = memrefs.lookup(id))
      return m;
    auto placeholder = UnrealizedConversionCastOp::create(
        b, loc, TypeRange{toMemRef(result.getType())}, ValueRange{});
    placeholders.push_back(placeholder);
    return placeholder.getResult(0);
  }
  /// The original operands of `op`.
  ArrayRef<Value> operands(Operation *op) { return operandsOf[op]; }
  /// A scratch storage's memref (an rt.alloc of its own).
  Value scratchBuffer(OpBuilder &b, int id) {
    auto [it, inserted] = memrefs.try_emplace(id, Value());
    if (inserted) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(block);
      it->second =
          rt::AllocOp::create(b, loc, toMemRef(plan.storages[id].type),
                              b.getI64IntegerAttr(plan.storages[id].offset));
    }
    return it->second;
  }
  /// The rt.get of persistent buffer `name`, shared when `cache`.
  Value persistentBuffer(OpBuilder &b, StringRef name, bool cache) {
    if (Value get = gets.lookup(name))
      return get;
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(block);
    Value get = rt::GetOp::create(b, loc, plan.buffers.lookup(name)->type,
                                  FlatSymbolRefAttr::get(b.getContext(), name));
    if (cache)
      gets[name] = get;
    return get;
  }

  PhasePlan &plan;
  Block *block;
  Location loc;
  DenseMap<int, Value> memrefs;
  llvm::StringMap<Value> gets;
  /// Every op's operands before the conversion.
  DenseMap<Operation *, SmallVector<Value>> operandsOf;
  /// Stand-ins for results whose memref is not declared yet.
  SmallVector<UnrealizedConversionCastOp> placeholders;
  /// The event of each started bucket reduction.
  std::map<std::pair<std::string, uint64_t>, Value> bucketEvents;
  /// ZeRO-2's accumulating reductions in flight: the transient shard the
  /// reduce-scatter fills and the persistent shard the wait adds it into.
  std::map<std::pair<std::string, uint64_t>, std::pair<Value, Value>>
      bucketAccumulates;
  /// Gradients already added to their buffer (before a bucket reduction).
  DenseSet<Value> flushed;
  /// Sends go last, after the bound results are flushed: a phase's send
  /// part (`send:<phase>`) must follow all its computation.
  struct DeferredSend {
    Location loc;
    Value buffer;
    SmallVector<NamedAttribute> attrs;
  };
  SmallVector<DeferredSend> deferredSends;
};

//===----------------------------------------------------------------------===//
// Pattern bases
//===----------------------------------------------------------------------===//

/// Lowers one op of the phase: an in-place op on a value that stays live
/// copies its operand first; the results become their storage's memrefs
/// (an async future becomes the event `lower` returns).
template <typename SourceOp>
struct PhasePattern : OpConversionPattern<SourceOp> {
  using OpAdaptor = typename OpConversionPattern<SourceOp>::OpAdaptor;
  PhasePattern(const TypeConverter &converter, MLIRContext *ctx,
               EmitState &state)
      : OpConversionPattern<SourceOp>(ctx), state(state) {}

  /// Emits the rt ops of `op`; returns the event of an async result.
  virtual FailureOr<Value> lower(SourceOp op, OpAdaptor adaptor,
                                 ConversionPatternRewriter &b) const = 0;

  LogicalResult
  matchAndRewrite(SourceOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &b) const final {
    Operation *o = op.getOperation();
    if (state.plan.copyFirst.contains(o))
      rt::CopyOp::create(b, op.getLoc(), TypeRange{},
                         ValueRange{state.operand(b, o, 0),
                                    state.bufferOf(b, o->getResult(0))},
                         ArrayRef<NamedAttribute>{});
    FailureOr<Value> event = lower(op, adaptor, b);
    if (failed(event))
      return failure();
    SmallVector<Value> replacements;
    for (Value r : o->getResults())
      replacements.push_back(isa<dist::AsyncType>(r.getType())
                                 ? *event
                                 : state.replacement(b, r));
    b.replaceOp(o, replacements);
    return success();
  }

  /// The memrefs of `op`'s tensor operands, then of its results.
  SmallVector<Value> operandsThenResults(OpBuilder &b, Operation *op) const {
    SmallVector<Value> bufs;
    for (Value v : state.operands(op))
      if (isa<RankedTensorType>(v.getType()))
        bufs.push_back(state.bufferOf(b, v));
    for (Value r : op->getResults())
      bufs.push_back(state.bufferOf(b, r));
    return bufs;
  }
  NamedAttribute beta(OpBuilder &b, Value result) const {
    return b.getNamedAttr("beta",
                          b.getF32FloatAttr(state.plan.accumulates(result)));
  }
  static NamedAttribute iattrs(OpBuilder &b, ArrayRef<int64_t> values) {
    return b.getNamedAttr("iattrs", b.getDenseI64ArrayAttr(values));
  }
  static SmallVector<NamedAttribute>
  withGroup(OpBuilder &b, SmallVector<NamedAttribute> attrs, StringAttr group) {
    if (group)
      attrs.push_back(b.getNamedAttr("group", group));
    return attrs;
  }

  EmitState &state;
};

/// The attributes of the generic kernel form for `op` (none by default).
template <typename Pattern, typename SourceOp>
SmallVector<NamedAttribute> kernelAttrs(const Pattern &, OpBuilder &,
                                        SourceOp) {
  return {};
}

/// One rt kernel over the op's tensor operands then its results, with the
/// attributes of kernelAttrs.
template <typename SourceOp, typename KernelOp>
struct KernelPattern : PhasePattern<SourceOp> {
  using Base = PhasePattern<SourceOp>;
  using Base::Base;
  FailureOr<Value> lower(SourceOp op, typename Base::OpAdaptor,
                         ConversionPatternRewriter &b) const override {
    KernelOp::create(b, op.getLoc(), TypeRange{},
                     this->operandsThenResults(b, op), kernelAttrs(*this, b, op));
    return Value();
  }
};

/// nn.cast: the Cast kernel, or nothing where the storage plan folded the
/// cast into the kernel beside it (which loads or stores the 16-bit value
/// itself; its input and result then share one storage).
struct CastPattern : PhasePattern<nn::CastOp> {
  using PhasePattern::PhasePattern;
  FailureOr<Value> lower(nn::CastOp op, OpAdaptor,
                         ConversionPatternRewriter &b) const override {
    if (!state.plan.foldedCasts.contains(op))
      rt::CastOp::create(b, op.getLoc(), TypeRange{},
                         operandsThenResults(b, op),
                         SmallVector<NamedAttribute>{beta(b, op.getResult())});
    return Value();
  }
};

//===----------------------------------------------------------------------===//
// Attributes of the generic kernels
//===----------------------------------------------------------------------===//

#define KERNEL_ATTRS(SourceOp)                                                 \
  template <typename Pattern>                                                  \
  SmallVector<NamedAttribute> kernelAttrs(const Pattern &p, OpBuilder &b,      \
                                          SourceOp o)

KERNEL_ATTRS(nn::ReduceRowsOp) { return {p.beta(b, o.getResult())}; }
KERNEL_ATTRS(nn::SumSquaresOp) {
  SmallVector<NamedAttribute> attrs;
  if (o.getRunsAttr())
    attrs.push_back(b.getNamedAttr("iattrs", o.getRunsAttr()));
  return p.withGroup(b, attrs, o.getGroupAttr());
}
KERNEL_ATTRS(nn::ClipGradNormOp) {
  return {b.getNamedAttr("value", o.getMaxNormAttr()),
          p.iattrs(b, {o.getUnscale() ? 1 : 0})};
}
KERNEL_ATTRS(nn::LossSeedOp) {
  return {b.getNamedAttr("value", o.getValueAttr())};
}
KERNEL_ATTRS(nn::MaskColumnsOp) {
  return p.withGroup(b,
                     {b.getNamedAttr("value", o.getFillAttr()),
                      p.iattrs(b, {int64_t(o.getValid())})},
                     o.getGroupAttr());
}
KERNEL_ATTRS(nn::GeluOp) {
  return {p.iattrs(b, {o.getApproximate() == "tanh" ? 1 : 0})};
}
KERNEL_ATTRS(nn::GeluGradOp) {
  return {p.iattrs(b, {o.getApproximate() == "tanh" ? 1 : 0})};
}
KERNEL_ATTRS(nn::BiasGeluOp) {
  return {p.iattrs(b, {o.getApproximate() == "tanh" ? 1 : 0})};
}
KERNEL_ATTRS(nn::BiasGeluGradOp) {
  return {p.iattrs(b, {o.getApproximate() == "tanh" ? 1 : 0}),
          p.beta(b, o.getBiasGrad())};
}
KERNEL_ATTRS(nn::PositionEmbeddingGradOp) {
  return p.withGroup(b, {p.beta(b, o.getResult())},
                     o.getSequenceShardGroupAttr());
}
KERNEL_ATTRS(nn::AddPositionEmbeddingOp) {
  return p.withGroup(b, {}, o.getSequenceShardGroupAttr());
}
KERNEL_ATTRS(nn::MoECapacityDropOp) {
  return {b.getNamedAttr("value", o.getCapacityFactorAttr()),
          p.iattrs(b, {int64_t(o.getNumExperts()),
                       o.getDropPolicy() == "position" ? 1 : 0})};
}
KERNEL_ATTRS(nn::MoEDispatchGradOp) {
  return {p.iattrs(b, {int64_t(o.getNumExperts())})};
}
KERNEL_ATTRS(nn::MoECombineOp) {
  return {p.iattrs(b, {int64_t(o.getNumExperts())})};
}
KERNEL_ATTRS(nn::MoECombineGradOp) {
  return {p.iattrs(b, {int64_t(o.getNumExperts())})};
}
KERNEL_ATTRS(nn::GroupedLinearGradOp) {
  return {p.beta(b, o.getWeightGrad())};
}
KERNEL_ATTRS(nn::TokenCountOp) {
  return {p.iattrs(b, {int64_t(o.getIgnoreIndex())})};
}
KERNEL_ATTRS(nn::FillOp) {
  return {b.getNamedAttr("value", o.getValueAttr())};
}
KERNEL_ATTRS(nn::ScaleOp) {
  return {b.getNamedAttr("alpha", o.getFactorAttr())};
}
KERNEL_ATTRS(nn::LayerNormOp) {
  return {b.getNamedAttr("value", o.getEpsAttr())};
}
KERNEL_ATTRS(nn::LayerNormGradOp) {
  return {b.getNamedAttr("value", o.getEpsAttr()),
          p.beta(b, o.getWeightGrad())};
}
KERNEL_ATTRS(nn::AddLayerNormOp) {
  return {b.getNamedAttr("value", o.getEpsAttr())};
}
KERNEL_ATTRS(nn::AddLayerNormGradOp) {
  return {b.getNamedAttr("value", o.getEpsAttr()),
          p.beta(b, o.getWeightGrad())};
}
KERNEL_ATTRS(nn::RMSNormOp) {
  return {b.getNamedAttr("value", o.getEpsAttr())};
}
KERNEL_ATTRS(nn::RMSNormGradOp) {
  return {b.getNamedAttr("value", o.getEpsAttr()),
          p.beta(b, o.getWeightGrad())};
}
KERNEL_ATTRS(nn::AddRMSNormOp) {
  return {b.getNamedAttr("value", o.getEpsAttr())};
}
KERNEL_ATTRS(nn::AddRMSNormGradOp) {
  return {b.getNamedAttr("value", o.getEpsAttr()),
          p.beta(b, o.getWeightGrad())};
}
KERNEL_ATTRS(nn::EmbeddingOp) {
  return p.withGroup(b, {p.iattrs(b, {int64_t(o.getVocabSize())})},
                     o.getVocabShardGroupAttr());
}
KERNEL_ATTRS(nn::EmbeddingGradOp) {
  return p.withGroup(b, {p.beta(b, o.getResult())},
                     o.getVocabShardGroupAttr());
}
KERNEL_ATTRS(nn::AttentionOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0})};
}
KERNEL_ATTRS(nn::AttentionGradOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0})};
}
KERNEL_ATTRS(nn::RepeatKVOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), int64_t(o.getNumQueryGroups())})};
}
KERNEL_ATTRS(nn::RepeatKVGradOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), int64_t(o.getNumQueryGroups())})};
}
KERNEL_ATTRS(nn::QKNormOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), int64_t(o.getNumQueryGroups())}),
          b.getNamedAttr("value", o.getEpsAttr())};
}
KERNEL_ATTRS(nn::QKNormGradOp) {
  return {p.iattrs(b, {int64_t(o.getNumHeads()), int64_t(o.getNumQueryGroups())}),
          b.getNamedAttr("value", o.getEpsAttr()),
          p.beta(b, o.getQWeightGrad())};
}
KERNEL_ATTRS(nn::DropoutOp) {
  return p.withGroup(b,
                     {b.getNamedAttr("value", o.getRateAttr()),
                      p.iattrs(b, {int64_t(o.getStream())})},
                     o.getSequenceShardGroupAttr());
}
KERNEL_ATTRS(nn::RotaryEmbeddingOp) {
  SmallVector<NamedAttribute> attrs = {
      b.getNamedAttr("num_heads", o.getNumHeadsAttr()),
      b.getNamedAttr("rotary_dim", o.getRotaryDimAttr()),
      b.getNamedAttr("inverse", b.getBoolAttr(o.getInverse())),
      b.getNamedAttr("base", o.getBaseAttr())};
  if (auto factor = o.getScalingFactorAttr())
    attrs.push_back(b.getNamedAttr("scaling_factor", factor));
  return p.withGroup(b, attrs, o.getSequenceShardGroupAttr());
}
KERNEL_ATTRS(nn::LogitsStatsOp) {
  return {p.iattrs(b, {int64_t(o.getIgnoreIndex())})};
}
KERNEL_ATTRS(nn::CrossEntropyStatsOp) {
  return p.withGroup(b, {p.iattrs(b, {int64_t(o.getIgnoreIndex())})},
                     o.getVocabShardGroupAttr());
}
KERNEL_ATTRS(nn::CrossEntropyStatsGradOp) {
  return p.withGroup(b, {p.iattrs(b, {int64_t(o.getIgnoreIndex())})},
                     o.getVocabShardGroupAttr());
}
#undef KERNEL_ATTRS

//===----------------------------------------------------------------------===//
// nn ops with their own expansion
//===----------------------------------------------------------------------===//

#define PATTERN(Name, SourceOp)                                                \
  struct Name : PhasePattern<SourceOp> {                                       \
    using PhasePattern::PhasePattern;                                          \
    FailureOr<Value> lower(SourceOp o, OpAdaptor adaptor,                      \
                           ConversionPatternRewriter &b) const override;       \
  };                                                                           \
  FailureOr<Value> Name::lower(SourceOp o, OpAdaptor adaptor,                  \
                               ConversionPatternRewriter &b) const

/// x @ W^T (+ bias). A result stored 16-bit (a folded cast): without a
/// bias the GEMM rounds into it; with one the GEMM writes the f32 product
/// to the op's scratch and the bias add rounds the sum into it.
PATTERN(LinearPattern, nn::LinearOp) {
  Value y = state.bufferOf(b, o.getResult());
  auto scratch = state.plan.scratchOf.lookup(o);
  Value product = scratch.empty() ? y : state.scratchBuffer(b, scratch[0]);
  rt::GemmOp::create(b, o.getLoc(), TypeRange{},
                     ValueRange{state.operand(b, o, 0), state.operand(b, o, 1),
                                product},
                     ArrayRef<NamedAttribute>{
                         b.getNamedAttr("trans_b", b.getUnitAttr())});
  if (o.getBias())
    rt::BiasAddOp::create(b, o.getLoc(), TypeRange{},
                          ValueRange{product, state.operand(b, o, 2), y},
                          ArrayRef<NamedAttribute>{});
  return Value();
}

PATTERN(MatmulPattern, nn::MatmulOp) {
  SmallVector<NamedAttribute> attrs;
  if (o.getTransposeLhs())
    attrs.push_back(b.getNamedAttr("trans_a", b.getUnitAttr()));
  if (o.getTransposeRhs())
    attrs.push_back(b.getNamedAttr("trans_b", b.getUnitAttr()));
  attrs.push_back(beta(b, o.getResult()));
  rt::GemmOp::create(b, o.getLoc(), TypeRange{}, operandsThenResults(b, o),
                     attrs);
  return Value();
}

/// A fused cross-entropy with ignore_index (operands 0 and 1: logits and
/// labels) runs as row max and statistics into its scratch first; returns
/// the buffers z, t, m, se.
static SmallVector<Value> crossEntropyStats(EmitState &state, OpBuilder &b,
                                            Operation *op, int64_t ignore) {
  auto scratch = state.plan.scratchOf.lookup(op);
  Value z = state.operand(b, op, 0), t = state.operand(b, op, 1);
  Value m = state.scratchBuffer(b, scratch[0]),
        se = state.scratchBuffer(b, scratch[1]),
        pl = state.scratchBuffer(b, scratch[2]);
  rt::LogitsMaxOp::create(b, op->getLoc(), TypeRange{}, ValueRange{z, m},
                          ArrayRef<NamedAttribute>{});
  rt::CrossEntropyStatsOp::create(
      b, op->getLoc(), TypeRange{}, ValueRange{z, t, m, se, pl},
      ArrayRef<NamedAttribute>{
          b.getNamedAttr("iattrs", b.getDenseI64ArrayAttr({ignore}))});
  return {z, t, m, se, pl};
}

/// An op that takes an optional all-ranks operand (the whole sequence's
/// token count of a token mean, all ranks' counts of a load-balancing
/// loss) becomes the Over opcode with it, the plain one without; operands
/// then results either way.
template <typename OverOp, typename PlainOp, typename SourceOp, typename Pattern>
static void lowerOverOrPlain(const Pattern &p, ConversionPatternRewriter &b,
                             SourceOp o, bool over, NamedAttribute attr) {
  SmallVector<Value> operands = p.operandsThenResults(b, o);
  if (over)
    OverOp::create(b, o.getLoc(), TypeRange{}, operands, attr);
  else
    PlainOp::create(b, o.getLoc(), TypeRange{}, operands, attr);
}

template <typename OverOp, typename PlainOp, typename SourceOp, typename Pattern>
static void lowerTokenMean(const Pattern &p, ConversionPatternRewriter &b,
                           SourceOp o) {
  lowerOverOrPlain<OverOp, PlainOp>(p, b, o, bool(o.getCount()),
                                    p.iattrs(b, {int64_t(o.getIgnoreIndex())}));
}

template <typename OverOp, typename PlainOp, typename SourceOp, typename Pattern>
static void lowerAuxLoss(const Pattern &p, ConversionPatternRewriter &b,
                         SourceOp o) {
  lowerOverOrPlain<OverOp, PlainOp>(p, b, o, bool(o.getCounts()),
                                    b.getNamedAttr("value", o.getCoeffAttr()));
}

PATTERN(MoEAuxLossPattern, nn::MoEAuxLossOp) {
  lowerAuxLoss<rt::MoEAuxLossOverOp, rt::MoEAuxLossOp>(*this, b, o);
  return Value();
}

PATTERN(MoEAuxLossGradPattern, nn::MoEAuxLossGradOp) {
  lowerAuxLoss<rt::MoEAuxLossOverGradOp, rt::MoEAuxLossGradOp>(*this, b, o);
  return Value();
}

PATTERN(TokenMeanPattern, nn::TokenMeanOp) {
  lowerTokenMean<rt::TokenMeanOverOp, rt::TokenMeanOp>(*this, b, o);
  return Value();
}

PATTERN(TokenMeanGradPattern, nn::TokenMeanGradOp) {
  lowerTokenMean<rt::TokenMeanOverGradOp, rt::TokenMeanGradOp>(*this, b, o);
  return Value();
}

/// The format ring attention's K/V blocks travel in (its kv_format iattr, a
/// FloatFormat): that of the 16-bit value its f32 QKV was widened from
/// (bf16 activations), whose values a 16-bit block holds exactly (not a
/// cast accumulated into its result); else F32.
static int64_t ringKvFormat(const PhasePlan &plan, Value qkv) {
  auto widen = qkv.getDefiningOp<nn::CastOp>();
  if (!widen || plan.accumulates(widen.getResult()))
    return 0;
  Type from = getElementTypeOrSelf(widen->getOperand(0).getType());
  return from.isBF16() ? 1 : from.isF16() ? 2 : 0;
}

/// Ring attention with its workspace (a scratch of the storage plan).
PATTERN(RingAttentionPattern, dist::RingAttentionOp) {
  Value w = state.scratchBuffer(b, state.plan.scratchOf.lookup(o)[0]);
  rt::RingAttentionOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), w, state.bufferOf(b, o.getResult()),
                 state.bufferOf(b, o.getLse())},
      withGroup(b,
                {iattrs(b, {int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0,
                            ringKvFormat(state.plan, o.getQkv())})},
                o.getGroupAttr()));
  return Value();
}

PATTERN(RingAttentionGradPattern, dist::RingAttentionGradOp) {
  Value w = state.scratchBuffer(b, state.plan.scratchOf.lookup(o)[0]);
  rt::RingAttentionGradOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.operand(b, o, 1),
                 state.operand(b, o, 2), state.operand(b, o, 3), w,
                 state.bufferOf(b, o.getResult())},
      withGroup(b,
                {iattrs(b, {int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0,
                            ringKvFormat(state.plan, o.getQkv())})},
                o.getGroupAttr()));
  return Value();
}

PATTERN(SoftmaxCrossEntropyPattern, nn::SoftmaxCrossEntropyOp) {
  if (auto ignore = o.getIgnoreIndex()) {
    SmallVector<Value> s = crossEntropyStats(state, b, o, *ignore);
    rt::CrossEntropyFromStatsOp::create(
        b, o.getLoc(), TypeRange{},
        ValueRange{s[3], s[4], s[2], s[1], state.bufferOf(b, o.getResult())},
        ArrayRef<NamedAttribute>{iattrs(b, {int64_t(*ignore)})});
    return Value();
  }
  rt::CrossEntropyOp::create(b, o.getLoc(), TypeRange{},
                             operandsThenResults(b, o),
                             ArrayRef<NamedAttribute>{});
  return Value();
}

PATTERN(SoftmaxCrossEntropyGradPattern, nn::SoftmaxCrossEntropyGradOp) {
  if (auto ignore = o.getIgnoreIndex()) {
    SmallVector<Value> s = crossEntropyStats(state, b, o, *ignore);
    rt::CrossEntropyStatsGradOp::create(
        b, o.getLoc(), TypeRange{},
        ValueRange{s[0], s[1], s[2], s[3], state.operand(b, o, 2),
                   state.bufferOf(b, o.getResult())},
        ArrayRef<NamedAttribute>{iattrs(b, {int64_t(*ignore)})});
    return Value();
  }
  rt::CrossEntropyGradOp::create(b, o.getLoc(), TypeRange{},
                                 operandsThenResults(b, o),
                                 ArrayRef<NamedAttribute>{});
  return Value();
}

/// rt's operand order: se, pl, M, t, L.
PATTERN(CrossEntropyFromStatsPattern, nn::CrossEntropyFromStatsOp) {
  rt::CrossEntropyFromStatsOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 3), state.operand(b, o, 4),
                 state.operand(b, o, 2), state.operand(b, o, 1),
                 state.bufferOf(b, o.getResult())},
      ArrayRef<NamedAttribute>{iattrs(b, {int64_t(o.getIgnoreIndex())})});
  return Value();
}

PATTERN(AdamPattern, nn::AdamOp) {
  rt::AdamOp::create(b, o.getLoc(), state.operand(b, o, 0),
                     state.operand(b, o, 1), state.operand(b, o, 2),
                     state.operand(b, o, 3), state.operand(b, o, 4),
                     o.getLrAttr(), o.getBeta1Attr(), o.getBeta2Attr(),
                     o.getEpsAttr(), o.getWeightDecayAttr(), o.getRunsAttr(),
                     o.getGroupAttr());
  return Value();
}

PATTERN(SgdPattern, nn::SgdOp) {
  rt::SgdOp::create(b, o.getLoc(), state.operand(b, o, 0),
                    state.operand(b, o, 1), o.getLrAttr(),
                    o.getWeightDecayAttr(), o.getRunsAttr(), o.getGroupAttr());
  return Value();
}

PATTERN(SgdMomentumPattern, nn::SgdMomentumOp) {
  rt::SgdMomentumOp::create(b, o.getLoc(), state.operand(b, o, 0),
                            state.operand(b, o, 1), state.operand(b, o, 2),
                            o.getLrAttr(), o.getWeightDecayAttr(),
                            o.getMomentumAttr(), o.getRunsAttr(),
                            o.getGroupAttr());
  return Value();
}

//===----------------------------------------------------------------------===//
// dist ops
//===----------------------------------------------------------------------===//

/// f: an identity in the forward (the result shares the input's storage).
PATTERN(CopyToRegionPattern, dist::CopyToRegionOp) {
  // An alias, unless planned into a storage of its own (ZeRO-3: a saved
  // alias of a gathered parameter goes to its slot).
  if (state.plan.storageId(o.getResult()) !=
      state.plan.storageId(state.operandsOf.lookup(o)[0]))
    rt::CopyOp::create(b, o.getLoc(), TypeRange{},
                       ValueRange{state.operand(b, o, 0),
                                  state.bufferOf(b, o.getResult())},
                       ArrayRef<NamedAttribute>{});
  return Value();
}

/// Megatron's MoEAuxLossAutoScaler: an identity in the forward.
PATTERN(AddAuxLossPattern, nn::AddAuxLossOp) { return Value(); }

/// g: an all-reduce in place.
PATTERN(ReduceFromRegionPattern, dist::ReduceFromRegionOp) {
  rt::AllReduceOp::create(b, o.getLoc(), state.bufferOf(b, o.getResult()),
                          o.getGroupAttr(), enumAttr(b, rt::Reduction::Sum));
  return Value();
}

PATTERN(AllReducePattern, dist::AllReduceOp) {
  rt::AllReduceOp::create(b, o.getLoc(), state.bufferOf(b, o.getResult()),
                          o.getGroupAttr(), o.getReductionAttr());
  return Value();
}

PATTERN(AllReduceStartPattern, dist::AllReduceStartOp) {
  return Value(rt::AllReduceStartOp::create(
      b, o.getLoc(), rt::EventType::get(b.getContext()),
      state.operand(b, o, 0), o.getGroupAttr(), o.getReductionAttr()));
}

PATTERN(AllGatherStartPattern, dist::AllGatherStartOp) {
  return Value(rt::AllGatherStartOp::create(
      b, o.getLoc(), rt::EventType::get(b.getContext()), state.operand(b, o, 0),
      state.bufferOf(b, o.getResult()), o.getGroupAttr()));
}

PATTERN(WaitPattern, dist::WaitOp) {
  rt::WaitOp::create(b, o.getLoc(), adaptor.getFuture());
  return Value();
}

/// Keeps this rank's block: a copy from a group-indexed offset, or nothing
/// when the result is the rank's shard view of its input bucket.
PATTERN(ScatterToRegionPattern, dist::ScatterToRegionOp) {
  if (state.plan.aliasedScatter.contains(o))
    return Value();
  rt::CopyOp::create(b, o.getLoc(), TypeRange{}, operandsThenResults(b, o),
                     ArrayRef<NamedAttribute>{
                         b.getNamedAttr("group", o.getGroupAttr())});
  return Value();
}

PATTERN(GatherFromRegionPattern, dist::GatherFromRegionOp) {
  rt::AllGatherOp::create(b, o.getLoc(), state.operand(b, o, 0),
                          state.bufferOf(b, o.getResult()), o.getGroupAttr());
  return Value();
}

PATTERN(AllGatherPattern, dist::AllGatherOp) {
  if (o.getParamSync()) {
    dist::UnpackOp unpack = o.getParamSyncUnpack();
    // In place only: the gather outlives the step, so its input must be
    // this rank's block of the bucket, not a transient the next function
    // reuses (nor may the unpack copy out of the bucket while it fills).
    const std::string view = bucketView(dist::BucketData::Param,
                                        unpack.getBuffer(), unpack.getBucket());
    PhasePlan &plan = state.plan;
    if (plan.storages[plan.storageId(o.getInput())].persistent !=
            shardView(view) ||
        plan.storages[plan.storageId(o.getResult())].persistent != view ||
        plan.placeCopies.count(unpack))
      return o.emitOpError()
             << "with param_sync must gather in place into '" << view
             << "' from its shard '" << shardView(view)
             << "' (overlap-param-gather leaves it in flight after the step)";
    rt::ParamSyncStartOp::create(
        b, o.getLoc(), state.operand(b, o, 0), state.bufferOf(b, o.getResult()),
        o.getGroupAttr(),
        b.getI64IntegerAttr(
            paramSyncId(o, unpack.getBuffer(), unpack.getBucket())));
    return Value();
  }
  rt::AllGatherOp::create(b, o.getLoc(), state.operand(b, o, 0),
                          state.bufferOf(b, o.getResult()), o.getGroupAttr());
  return Value();
}

/// overlap_param_gather's wait, before the bucket's first reader.
PATTERN(ParamSyncWaitPattern, dist::ParamSyncWaitOp) {
  rt::ParamSyncWaitOp::create(
      b, o.getLoc(),
      b.getI64IntegerAttr(paramSyncId(o, o.getBuffer(), o.getBucket())));
  return Value();
}

PATTERN(AllToAllPattern, dist::AllToAllOp) {
  rt::AllToAllOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.bufferOf(b, o.getResult())},
      withGroup(b, {}, o.getGroupAttr()));
  return Value();
}

/// The number of experts of an exchange: one count per expert.
static int64_t expertsOf(Value counts) {
  return cast<RankedTensorType>(counts.getType()).getDimSize(0);
}

PATTERN(ExpertDispatchPattern, dist::ExpertDispatchOp) {
  Value w = state.scratchBuffer(b, state.plan.scratchOf.lookup(o)[0]);
  rt::ExpertDispatchOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.operand(b, o, 1),
                 state.bufferOf(b, o.getResult()),
                 state.bufferOf(b, o.getLocalCounts()),
                 state.bufferOf(b, o.getSplits()), w},
      withGroup(b, {iattrs(b, {expertsOf(o.getCounts()), int64_t(o.getEtp())})},
                o.getGroupAttr()));
  return Value();
}

PATTERN(ExpertCombinePattern, dist::ExpertCombineOp) {
  Value w = state.scratchBuffer(b, state.plan.scratchOf.lookup(o)[0]);
  rt::ExpertCombineOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.operand(b, o, 1),
                 state.operand(b, o, 2), state.bufferOf(b, o.getResult()), w},
      withGroup(b, {iattrs(b, {expertsOf(o.getCounts()), int64_t(o.getEtp())})},
                o.getGroupAttr()));
  return Value();
}

PATTERN(ReduceScatterPattern, dist::ReduceScatterOp) {
  rt::ReduceScatterOp::create(b, o.getLoc(), state.operand(b, o, 0),
                              state.bufferOf(b, o.getResult()),
                              o.getGroupAttr());
  return Value();
}

/// --tp-comm-overlap: the gather's ring under the GEMM of its blocks, then
/// the bias (as LinearPattern).
/// (Neither result is ever accumulated into: the storage plan accumulates
/// only weight gradients, which these ops do not produce.)
PATTERN(AllGatherMatmulPattern, dist::AllGatherMatmulOp) {
  Value y = state.bufferOf(b, o.getResult());
  SmallVector<NamedAttribute> attrs{b.getNamedAttr("group", o.getGroupAttr())};
  if (o.getTransposeRhs())
    attrs.push_back(b.getNamedAttr("trans_b", b.getUnitAttr()));
  rt::AllGatherGemmOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.operand(b, o, 1),
                 state.bufferOf(b, o.getGathered()), y},
      attrs);
  if (o.getBias())
    rt::BiasAddOp::create(b, o.getLoc(), TypeRange{},
                          ValueRange{y, state.operand(b, o, 2), y},
                          ArrayRef<NamedAttribute>{});
  return Value();
}

PATTERN(MatmulReduceScatterPattern, dist::MatmulReduceScatterOp) {
  Value w = state.scratchBuffer(b, state.plan.scratchOf.lookup(o)[0]);
  SmallVector<NamedAttribute> attrs{b.getNamedAttr("group", o.getGroupAttr())};
  if (o.getTransposeRhs())
    attrs.push_back(b.getNamedAttr("trans_b", b.getUnitAttr()));
  rt::GemmReduceScatterOp::create(
      b, o.getLoc(), TypeRange{},
      ValueRange{state.operand(b, o, 0), state.operand(b, o, 1), w,
                 state.bufferOf(b, o.getResult())},
      attrs);
  return Value();
}

/// Adds this microbatch's contributions to the bucket's gradients, scales
/// the bucket view and starts its all-reduce or reduce-scatter.
PATTERN(BucketReduceStartPattern, dist::BucketReduceStartOp) {
  PhasePlan &plan = state.plan;
  if (o.getAccumulate()) {
    // ZeRO-2: this microbatch's gradients in a transient bucket at their
    // layout offsets (written there by their ops, or copied in now), the
    // padding between them zeroed; scale, reduce-scatter into a transient
    // shard, which the wait adds into the persistent one.
    auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
        o, o.getBufferAttr());
    // (This bucket's ranges only: linear in the buckets overall.)
    const buckets::Bucket k = buf.getBucket(o.getBucket());
    const SmallVector<buckets::ParamRange> ranges =
        buf.getBucketParamRanges(o.getBucket());
    int bucketId = plan.bucketStorage.lookup(o);
    Value bucket = state.scratchBuffer(b, bucketId);
    const Storage &bucketSt = plan.storages[bucketId];
    Type element = cast<RankedTensorType>(bucketSt.type).getElementType();
    const int64_t elementBytes = element.getIntOrFloatBitWidth() / 8;
    // A view of elements [from, to) of the bucket.
    auto part = [&](int64_t from, Type type) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(state.block);
      return rt::AllocOp::create(
          b, o.getLoc(), toMemRef(type),
          b.getI64IntegerAttr(bucketSt.offset + from * elementBytes));
    };
    SmallVector<std::pair<int64_t, int64_t>> used;
    for (const buckets::ParamRange &r : ranges)
      used.push_back({r.start - k.start, r.end - k.start});
    llvm::sort(used);
    int64_t at = 0;
    used.push_back({k.end - k.start, k.end - k.start});
    for (auto [from, to] : used) {
      if (from > at)
        rt::FillOp::create(
            b, o.getLoc(), TypeRange{},
            ValueRange{part(at, RankedTensorType::get({from - at}, element))},
            ArrayRef<NamedAttribute>{
                b.getNamedAttr("value", b.getF32FloatAttr(0))});
      at = std::max(at, to);
    }
    llvm::StringMap<int64_t> startOf;
    SmallVector<std::string> names;
    for (const buckets::ParamRange &r : ranges) {
      startOf[r.name] = r.start;
      names.push_back(r.name);
    }
    for (auto [name, g] : llvm::zip(names, state.operands(o))) {
      if (plan.storages[plan.storageId(g)].parent == bucketId)
        continue; // (written in place by its op)
      rt::CopyOp::create(
          b, o.getLoc(), TypeRange{},
          ValueRange{state.bufferOf(b, g),
                     part(startOf.lookup(name) - k.start, g.getType())},
          ArrayRef<NamedAttribute>{});
    }
    rt::ScaleOp::create(b, o.getLoc(), TypeRange{}, ValueRange{bucket, bucket},
                        ArrayRef<NamedAttribute>{
                            b.getNamedAttr("alpha", o.getScaleAttr())});
    Value shard = state.scratchBuffer(b, plan.shardStorage.lookup(o));
    Value event = rt::ReduceScatterStartOp::create(
        b, o.getLoc(), rt::EventType::get(b.getContext()), bucket, shard,
        o.getGroupAttr());
    std::pair<std::string, uint64_t> key{o.getBuffer().str(), o.getBucket()};
    state.bucketEvents[key] = event;
    state.bucketAccumulates[key] = {
        shard, state.storageBuffer(b, plan.accumulateStorage.lookup(o))};
    return Value();
  }
  for (Value g : state.operands(o)) {
    StringRef binding = plan.resultBinding(g);
    if (binding.empty() || plan.direct.contains(g) ||
        plan.storages[plan.storageId(g)].persistent == binding ||
        !state.flushed.insert(g).second)
      continue;
    rt::AxpyOp::create(b, o.getLoc(), TypeRange{},
                       ValueRange{state.bufferOf(b, g),
                                  state.persistentBuffer(b, binding, true)},
                       ArrayRef<NamedAttribute>{});
  }
  Value view = state.storageBuffer(b, plan.bucketStorage.lookup(o));
  rt::ScaleOp::create(b, o.getLoc(), TypeRange{}, ValueRange{view, view},
                      ArrayRef<NamedAttribute>{
                          b.getNamedAttr("alpha", o.getScaleAttr())});
  Value event;
  if (o.getKind() == dist::BucketReduceKind::ReduceScatter)
    event = rt::ReduceScatterStartOp::create(
        b, o.getLoc(), rt::EventType::get(b.getContext()), view,
        state.storageBuffer(b, plan.shardStorage.lookup(o)), o.getGroupAttr());
  else
    event = rt::AllReduceStartOp::create(
        b, o.getLoc(), rt::EventType::get(b.getContext()), view,
        o.getGroupAttr(), enumAttr(b, rt::Reduction::Sum));
  state.bucketEvents[{o.getBuffer().str(), o.getBucket()}] = event;
  return Value();
}

PATTERN(BucketReduceWaitPattern, dist::BucketReduceWaitOp) {
  std::pair<std::string, uint64_t> key{o.getBuffer().str(), o.getBucket()};
  rt::WaitOp::create(b, o.getLoc(), state.bucketEvents.at(key));
  // ZeRO-2: this microbatch's shard of the sum joins the step's.
  if (auto it = state.bucketAccumulates.find(key);
      it != state.bucketAccumulates.end())
    rt::AxpyOp::create(b, o.getLoc(), TypeRange{},
                       ValueRange{it->second.first, it->second.second},
                       ArrayRef<NamedAttribute>{});
  return Value();
}

/// A bucket is a view of its parameters' buffers: copy in what is not
/// already in place.
PATTERN(PackPattern, dist::PackOp) {
  for (auto [index, id] : state.plan.placeCopies.lookup(o))
    rt::CopyOp::create(
        b, o.getLoc(), TypeRange{},
        ValueRange{state.operand(b, o, index), state.storageBuffer(b, id)},
        ArrayRef<NamedAttribute>{});
  return Value();
}

PATTERN(UnpackPattern, dist::UnpackOp) {
  for (auto [index, id] : state.plan.placeCopies.lookup(o))
    rt::CopyOp::create(b, o.getLoc(), TypeRange{},
                       ValueRange{state.operand(b, o, 0),
                                  state.storageBuffer(b, id)},
                       ArrayRef<NamedAttribute>{});
  return Value();
}

static SmallVector<NamedAttribute> p2pAttrs(OpBuilder &b, dist::Peer peer,
                                            int64_t tag) {
  // +1 the next pp rank, -1 the previous, 0 the rank itself (a V's turn).
  int64_t offset = peer == dist::Peer::Next   ? 1
                   : peer == dist::Peer::Prev ? -1
                                              : 0;
  return {b.getNamedAttr("iattrs", b.getDenseI64ArrayAttr({offset, tag})),
          b.getNamedAttr("group", b.getStringAttr("pp"))};
}

/// Copies into its staging buffer where needed; the rt.send itself goes
/// last (see EmitState::deferredSends).
PATTERN(SendPattern, dist::SendOp) {
  Value buf = state.operand(b, o, 0);
  if (auto it = state.plan.sendCopy.find(o); it != state.plan.sendCopy.end()) {
    Value staging = state.storageBuffer(b, it->second);
    rt::CopyOp::create(b, o.getLoc(), TypeRange{}, ValueRange{buf, staging},
                       ArrayRef<NamedAttribute>{});
    buf = staging;
  }
  state.deferredSends.push_back(
      {o.getLoc(), buf, p2pAttrs(b, o.getPeer(), int64_t(o.getTag()))});
  return Value();
}

PATTERN(RecvPattern, dist::RecvOp) {
  rt::RecvOp::create(b, o.getLoc(), TypeRange{},
                     ValueRange{state.bufferOf(b, o.getResult())},
                     p2pAttrs(b, o.getPeer(), int64_t(o.getTag())));
  return Value();
}

#undef PATTERN

/// The phase's end: bound results not written in place are copied (or,
/// for gradients, added) into their buffers, then the deferred sends.
struct ReturnPattern : OpConversionPattern<func::ReturnOp> {
  ReturnPattern(const TypeConverter &converter, MLIRContext *ctx,
                EmitState &state)
      : OpConversionPattern(ctx), state(state) {}
  LogicalResult
  matchAndRewrite(func::ReturnOp ret, OpAdaptor,
                  ConversionPatternRewriter &b) const override {
    PhasePlan &plan = state.plan;
    Location loc = state.loc;
    for (Value v : state.operands(ret)) {
      StringRef binding = plan.resultBinding(v);
      if (binding.empty() || plan.direct.contains(v) ||
          state.flushed.contains(v) ||
          plan.storages[plan.storageId(v)].persistent == binding)
        continue;
      Value dst = state.persistentBuffer(b, binding, /*cache=*/false);
      SmallVector<Value, 2> copy{state.bufferOf(b, v), dst};
      if (!plan.isStep && binding.starts_with("grad:"))
        rt::AxpyOp::create(b, loc, TypeRange{}, copy, ArrayRef<NamedAttribute>{});
      else
        rt::CopyOp::create(b, loc, TypeRange{}, copy, ArrayRef<NamedAttribute>{});
    }
    for (EmitState::DeferredSend &send : state.deferredSends)
      rt::SendOp::create(b, send.loc, TypeRange{}, ValueRange{send.buffer},
                         send.attrs);
    state.deferredSends.clear();
    b.replaceOpWithNewOp<func::ReturnOp>(ret, ValueRange{});
    return success();
  }
  EmitState &state;
};

//===----------------------------------------------------------------------===//
// Before the conversion: what cannot lower
//===----------------------------------------------------------------------===//

/// Reports, naming the op, what the patterns cannot lower: an op without a
/// pattern (a dist.wait waits only for what a lowered op started), a
/// collective along a dim other than 0, a wait for a bucket reduction that
/// was not started.
LogicalResult checkLowerable(PhasePlan &plan,
                             const llvm::DenseSet<OperationName> &lowerable) {
  std::set<std::pair<std::string, uint64_t>> started;
  for (Operation *op : plan.ops) {
    if (!lowerable.contains(op->getName()))
      return op->emitOpError() << "cannot be lowered to rt";
    auto dimZero = [&](std::optional<uint64_t> dim, int64_t rank) {
      return dim.value_or(uint64_t(rank - 1)) == 0;
    };
    auto onlyDimZero = [&]() {
      return op->emitOpError() << "lower-to-rt supports dim 0 only";
    };
    if (auto sc = dyn_cast<dist::ScatterToRegionOp>(op);
        sc && !plan.aliasedScatter.contains(op) &&
        !dimZero(sc.getDim(), sc.getInput().getType().getRank()))
      return onlyDimZero();
    if (auto g = dyn_cast<dist::GatherFromRegionOp>(op);
        g && !dimZero(g.getDim(), g.getInput().getType().getRank()))
      return onlyDimZero();
    if (auto ag = dyn_cast<dist::AllGatherOp>(op); ag && ag.getDim() != 0)
      return onlyDimZero();
    if (auto rs = dyn_cast<dist::ReduceScatterOp>(op); rs && rs.getDim() != 0)
      return onlyDimZero();
    if (auto ag = dyn_cast<dist::AllGatherStartOp>(op); ag && ag.getDim() != 0)
      return onlyDimZero();
    if (auto s = dyn_cast<dist::BucketReduceStartOp>(op))
      started.insert({s.getBuffer().str(), s.getBucket()});
    if (auto w = dyn_cast<dist::BucketReduceWaitOp>(op);
        w && !started.count({w.getBuffer().str(), w.getBucket()}))
      return w.emitOpError()
             << "waits for a bucket reduction that was not started";
  }
  return success();
}

template <typename... Patterns>
void addPatterns(RewritePatternSet &set, const TypeConverter &converter,
                 EmitState &state) {
  (set.add<Patterns>(converter, set.getContext(), state), ...);
}

} // namespace

LogicalResult emitPhase(PhasePlan &plan, func::FuncOp entry) {
  func::FuncOp func = plan.func;
  MLIRContext *ctx = func.getContext();
  Block &body = func.getBody().front();
  EmitState state(plan, &body);
  for (Operation &op : body)
    state.operandsOf[&op] = SmallVector<Value>(op.getOperands());

  TypeConverter converter;
  converter.addConversion([](Type t) { return t; });
  converter.addConversion(
      [](RankedTensorType t) -> Type { return toMemRef(t); });
  converter.addConversion([ctx](dist::AsyncType) -> Type {
    return rt::EventType::get(ctx);
  });

  RewritePatternSet patterns(ctx);
  addPatterns<
      // nn kernels over operands then results.
      KernelPattern<nn::GeluOp, rt::GeluOp>,
      KernelPattern<nn::SumSquaresOp, rt::SumSquaresOp>,
      KernelPattern<nn::ClipGradNormOp, rt::ClipGradNormOp>,
      KernelPattern<nn::LossSeedOp, rt::LossSeedOp>,
      KernelPattern<nn::MaskColumnsOp, rt::MaskColumnsOp>,
      KernelPattern<nn::ScaleByOp, rt::ScaleByOp>,
      KernelPattern<nn::ReluOp, rt::ReluOp>,
      KernelPattern<nn::SwiGLUOp, rt::SwiGLUOp>,
      KernelPattern<nn::SwiGLUGradOp, rt::SwiGLUGradOp>,
      KernelPattern<nn::RepeatKVOp, rt::RepeatKVOp>,
      KernelPattern<nn::RepeatKVGradOp, rt::RepeatKVGradOp>,
      KernelPattern<nn::QKNormOp, rt::QKNormOp>,
      KernelPattern<nn::QKNormGradOp, rt::QKNormGradOp>,
      KernelPattern<nn::GeluGradOp, rt::GeluGradOp>,
      KernelPattern<nn::BiasGeluOp, rt::BiasGeluOp>,
      KernelPattern<nn::BiasGeluGradOp, rt::BiasGeluGradOp>,
      KernelPattern<nn::LogitsStatsOp, rt::LogitsStatsOp>,
      KernelPattern<nn::AddLayerNormOp, rt::AddLayerNormOp>,
      KernelPattern<nn::AddLayerNormGradOp, rt::AddLayerNormGradOp>,
      KernelPattern<nn::ReluGradOp, rt::ReluGradOp>,
      KernelPattern<nn::AddOp, rt::AddOp>,
      KernelPattern<nn::BiasAddOp, rt::BiasAddOp>,
      KernelPattern<nn::ReduceRowsOp, rt::ReduceRowsOp>,
      KernelPattern<nn::EmbeddingOp, rt::EmbeddingOp>,
      KernelPattern<nn::EmbeddingGradOp, rt::EmbeddingGradOp>,
      KernelPattern<nn::AddPositionEmbeddingOp, rt::AddPositionEmbeddingOp>,
      KernelPattern<nn::PositionEmbeddingGradOp, rt::PositionEmbeddingGradOp>,
      KernelPattern<nn::LayerNormOp, rt::LayerNormOp>,
      KernelPattern<nn::LayerNormGradOp, rt::LayerNormGradOp>,
      KernelPattern<nn::RotaryEmbeddingOp, rt::RotaryEmbeddingOp>,
      KernelPattern<nn::RMSNormOp, rt::RMSNormOp>,
      KernelPattern<nn::RMSNormGradOp, rt::RMSNormGradOp>,
      KernelPattern<nn::AddRMSNormOp, rt::AddRMSNormOp>,
      KernelPattern<nn::AddRMSNormGradOp, rt::AddRMSNormGradOp>,
      KernelPattern<nn::AttentionOp, rt::AttentionOp>,
      KernelPattern<nn::AttentionGradOp, rt::AttentionGradOp>,
      KernelPattern<nn::TokenCountOp, rt::TokenCountOp>,
      KernelPattern<nn::MoERouterOp, rt::MoERouterOp>,
      KernelPattern<nn::MoERouterGradOp, rt::MoERouterGradOp>,
      KernelPattern<nn::MoETokenCountsOp, rt::MoETokenCountsOp>,
      KernelPattern<nn::MoECapacityDropOp, rt::MoECapacityDropOp>,
      KernelPattern<nn::MoECapacityDropGradOp, rt::MoECapacityDropGradOp>,
      KernelPattern<nn::MoEDispatchOp, rt::MoEDispatchOp>,
      KernelPattern<nn::MoEDispatchGradOp, rt::MoEDispatchGradOp>,
      KernelPattern<nn::GroupedLinearOp, rt::GroupedLinearOp>,
      KernelPattern<nn::GroupedLinearGradOp, rt::GroupedLinearGradOp>,
      KernelPattern<nn::MoECombineOp, rt::MoECombineOp>,
      KernelPattern<nn::MoECombineGradOp, rt::MoECombineGradOp>,
      KernelPattern<nn::DropoutOp, rt::DropoutOp>,
      KernelPattern<nn::LogitsMaxOp, rt::LogitsMaxOp>,
      KernelPattern<nn::CrossEntropyStatsOp, rt::CrossEntropyStatsOp>,
      KernelPattern<nn::CrossEntropyStatsGradOp, rt::CrossEntropyStatsGradOp>,
      KernelPattern<nn::MeanOp, rt::MeanOp>,
      KernelPattern<nn::MeanGradOp, rt::MeanGradOp>,
      KernelPattern<nn::FillOp, rt::FillOp>,
      CastPattern,
      KernelPattern<nn::ScaleOp, rt::ScaleOp>,
      // nn ops with their own expansion.
      LinearPattern, MatmulPattern, SoftmaxCrossEntropyPattern,
      TokenMeanPattern, TokenMeanGradPattern, MoEAuxLossPattern,
      MoEAuxLossGradPattern, RingAttentionPattern,
      RingAttentionGradPattern,
      SoftmaxCrossEntropyGradPattern, CrossEntropyFromStatsPattern,
      AdamPattern, SgdPattern, SgdMomentumPattern,
      // dist ops.
      CopyToRegionPattern, AddAuxLossPattern, ReduceFromRegionPattern,
      AllReducePattern,
      AllReduceStartPattern, AllGatherStartPattern, WaitPattern,
      ScatterToRegionPattern,
      GatherFromRegionPattern, AllGatherPattern, AllToAllPattern,
      ExpertDispatchPattern, ExpertCombinePattern,
      ReduceScatterPattern, AllGatherMatmulPattern, MatmulReduceScatterPattern,
      BucketReduceStartPattern, BucketReduceWaitPattern, ParamSyncWaitPattern,
      PackPattern,
      UnpackPattern, SendPattern, RecvPattern, ReturnPattern>(patterns,
                                                              converter, state);

  llvm::DenseSet<OperationName> lowerable;
  for (const std::unique_ptr<RewritePattern> &p : patterns.getNativePatterns())
    if (std::optional<OperationName> root = p->getRootKind())
      lowerable.insert(*root);
  if (failed(checkLowerable(plan, lowerable)))
    return failure();

  ConversionTarget target(*ctx);
  target.addLegalDialect<rt::RTDialect>();
  // The placeholders of replaced values (erased below).
  target.addLegalOp<UnrealizedConversionCastOp>();
  target.addIllegalDialect<nn::NNDialect, dist::DistDialect>();
  // A return is lowered when it has results to write back or sends to
  // issue after them (a phase may send without returning anything: a
  // pipeline chunk's evaluation).
  target.addDynamicallyLegalOp<func::ReturnOp>([&state](func::ReturnOp ret) {
    return ret.getNumOperands() == 0 && state.deferredSends.empty();
  });
  if (failed(applyPartialConversion(func, target, std::move(patterns))))
    return failure();

  for (UnrealizedConversionCastOp placeholder : state.placeholders) {
    if (!placeholder->use_empty())
      return placeholder.emitError()
             << "internal error: a lowered value is read through its "
                "placeholder";
    placeholder.erase();
  }
  // The lowered body, without the phase's arguments, becomes the entry.
  entry.getBody().takeBody(func.getBody());
  Block &block = entry.getBody().front();
  block.eraseArguments(0, block.getNumArguments());
  return success();
}

//===----------------------------------------------------------------------===//
// p2p parts
//===----------------------------------------------------------------------===//

LogicalResult splitP2PParts(func::FuncOp entry) {
  Block &body = entry.getBody().front();
  SmallVector<Operation *> recvs, sends;
  bool computed = false;
  for (Operation &op : body) {
    if (isa<rt::GetOp, rt::AllocOp, func::ReturnOp>(op))
      continue;
    if (isa<rt::RecvOp>(op)) {
      if (computed)
        return op.emitOpError() << "receives after computation in '"
                                << entry.getSymName()
                                << "'; a phase must receive first and send last";
      recvs.push_back(&op);
    } else if (isa<rt::SendOp>(op)) {
      sends.push_back(&op);
    } else {
      if (!sends.empty())
        return sends.front()->emitOpError()
               << "sends before computation ends in '" << entry.getSymName() << "'";
      computed = true;
    }
  }
  OpBuilder b(entry.getContext());
  b.setInsertionPointAfter(entry);
  for (auto [prefix, moved] : {std::pair<StringRef, SmallVector<Operation *> &>{"recv:", recvs},
                               {"send:", sends}}) {
    if (moved.empty())
      continue;
    auto part = func::FuncOp::create(b, entry.getLoc(),
                                     (prefix + entry.getSymName()).str(),
                                     entry.getFunctionType());
    part->setAttrs(entry->getAttrs());
    part.setSymName((prefix + entry.getSymName()).str());
    part->setAttr("rt.part", b.getStringAttr(prefix.drop_back()));
    Block *block = part.addEntryBlock();
    OpBuilder pb = OpBuilder::atBlockBegin(block);
    IRMapping map;
    for (Operation *op : moved) {
      for (Value v : op->getOperands())
        if (!map.contains(v))
          map.map(v, pb.clone(*v.getDefiningOp())->getResult(0));
      pb.clone(*op, map);
      op->erase();
    }
    func::ReturnOp::create(pb, entry.getLoc());
    b.setInsertionPointAfter(part);
  }
  return success();
}

} // namespace tessera::lowering
