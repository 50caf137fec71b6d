//===- MixedPrecision.cpp - 16-bit parameters, f32 computation ------------===//
//
// Megatron's --bf16 and --fp16 (Float16Module) for the model as IR:
// parameters are stored in bf16 or f16 (params-dtype). With 16-bit GEMMs
// (gemm-dtype=bf16, the default; under f16 the GEMMs are f16) every
// nn.linear, nn.matmul and nn.grouped_linear (the experts' GEMMs) that
// reads a parameter takes 16-bit operands, the parameter itself and its
// other operand cast to its dtype, and accumulates in f32, as Megatron's
// bf16 and fp16 linear layers do on tensor cores; every other reader of a
// parameter gets it cast to f32. With gemm-dtype=f32 all of them do
// (16-bit storage, f32 computation). Activations between the ops stay
// f32. Under f16 gradients accumulate and reduce in f32 (Megatron's
// --accumulate-allreduce-grads-in-fp32) and the backward is seeded with
// the loss scale (tessera-autodiff's nn.loss_seed). Gradients, main parameters and the optimizer follow from the
// recorded dtypes in the later passes (autodiff, dp-grad-allreduce,
// optimizer).
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

#include <optional>
#include <utility>

namespace tessera::nn {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {
struct MixedPrecisionPass
    : tessera::nn::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  using MixedPrecisionPassBase::MixedPrecisionPassBase;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    std::optional<FloatDtype> stored = symbolizeFloatDtype(paramsDtype);
    if (stored != FloatDtype::BF16 && stored != FloatDtype::F16) {
      emitError(root.getLoc()) << "unsupported params-dtype '"
                               << std::string(paramsDtype)
                               << "' (expected bf16 or f16)";
      return signalPassFailure();
    }
    if (*stored == FloatDtype::F16 && !gradReduceInFp32) {
      emitError(root.getLoc())
          << "params-dtype=f16 needs grad-reduce-in-fp32 (fp16 gradients "
             "accumulate and reduce in f32)";
      return signalPassFailure();
    }
    if (root->hasAttr(kMixedPrecisionAttr)) {
      emitError(root.getLoc()) << "the module is in mixed precision already";
      return signalPassFailure();
    }
    std::optional<FloatDtype> gemm = symbolizeFloatDtype(gemmDtype);
    if (!gemm || *gemm == FloatDtype::F16) {
      emitError(root.getLoc()) << "unsupported gemm-dtype '"
                               << std::string(gemmDtype)
                               << "' (expected f32 or bf16: bf16 means the "
                                  "GEMMs take the parameters' 16-bit dtype)";
      return signalPassFailure();
    }
    if (!moeRouterDtype.empty() && moeRouterDtype != "fp32") {
      emitError(root.getLoc())
          << "unsupported moe-router-dtype '" << std::string(moeRouterDtype)
          << "' (expected fp32; the router's GEMM is otherwise in the "
             "gemm-dtype)";
      return signalPassFailure();
    }
    Builder b(root.getContext());
    Type half = floatDtypeType(root.getContext(), *stored);
    for (ModuleOp program : getPrograms(root))
      for (auto f : program.getOps<func::FuncOp>()) {
        if (f->hasAttr(kPhaseAttr)) {
          f.emitOpError() << "is a training phase; tessera-mixed-precision "
                             "runs on the model, before tessera-autodiff";
          return signalPassFailure();
        }
        if (failed(convert(f, half)))
          return signalPassFailure();
        if (*gemm == FloatDtype::BF16)
          gemmsInHalf(f, half, /*routerInF32=*/moeRouterDtype == "fp32");
      }
    std::string params = paramsDtype;
    std::string grads =
        gradReduceInFp32 ? stringifyFloatDtype(FloatDtype::F32).str() : params;
    root->setAttr(kMixedPrecisionAttr,
                  b.getDictionaryAttr(
                      {b.getNamedAttr("params", b.getStringAttr(params)),
                       b.getNamedAttr("grads", b.getStringAttr(grads))}));
  }

  /// Makes every parameter of `f` a `stored` tensor read through one cast
  /// to f32, placed right before its first reader.
  LogicalResult convert(func::FuncOp f, Type stored) {
    if (f.isExternal())
      return success();
    Block &entry = f.getBody().front();
    OpBuilder b(f.getContext());
    for (BlockArgument arg : entry.getArguments()) {
      auto name = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kParamAttr);
      if (!name)
        continue;
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      if (!type || !type.getElementType().isF32())
        return f.emitOpError() << "parameter '" << name.getValue() << "' is "
                               << arg.getType()
                               << "; tessera-mixed-precision expects f32 parameters";
      arg.setType(RankedTensorType::get(type.getShape(), stored));
      if (arg.use_empty())
        continue;
      // Before the first reader: after a pipeline phase's leading receives.
      Operation *first = nullptr;
      for (Operation *user : arg.getUsers()) {
        Operation *op = entry.findAncestorOpInBlock(*user);
        if (!first || op->isBeforeInBlock(first))
          first = op;
      }
      b.setInsertionPoint(first);
      auto cast = CastOp::create(b, arg.getLoc(), type, arg);
      arg.replaceAllUsesExcept(cast.getResult(), cast);
    }
    updateFunctionType(f);
    return success();
  }

  /// The parameter `v` is the f32 cast of, if it is one.
  static BlockArgument castParam(Value v) {
    auto c = v.getDefiningOp<CastOp>();
    if (!c)
      return {};
    auto arg = dyn_cast<BlockArgument>(c.getInput());
    auto f = arg ? dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp())
                 : func::FuncOp();
    if (!f || !f.getArgAttr(arg.getArgNumber(), kParamAttr))
      return {};
    return arg;
  }

  /// The parameter behind a GEMM operand: the f32 cast of one, or that
  /// cast entering a tensor-parallel region (dist.copy_to_region, which
  /// tp-partition puts on a parameter that ops on sequence shards read:
  /// the MoE router's and the unsplit experts' weights, whose gradients
  /// then sum over tp).
  static BlockArgument paramOf(Value v) {
    if (auto copy = v.getDefiningOp<dist::CopyToRegionOp>())
      return castParam(copy.getInput());
    return castParam(v);
  }

  /// The 16-bit form of GEMM operand `v`, which paramOf says reads a
  /// parameter: the parameter itself, or (one per region entry) the 16-bit
  /// parameter entering the same region.
  static Value halfParam(OpBuilder &b, Value v,
                         DenseMap<Operation *, Value> &entries) {
    auto copy = v.getDefiningOp<dist::CopyToRegionOp>();
    if (!copy)
      return castParam(v);
    Value &entry = entries[copy];
    if (!entry) {
      b.setInsertionPoint(copy);
      BlockArgument param = castParam(copy.getInput());
      entry = dist::CopyToRegionOp::create(b, copy.getLoc(), param.getType(),
                                           param, copy.getMeshAttr(),
                                           copy.getGroupAttr());
    }
    return entry;
  }

  /// The operands of `op`'s product, if it is a GEMM (nn.linear,
  /// nn.matmul, the experts' nn.grouped_linear).
  static std::optional<std::pair<unsigned, unsigned>> gemmOperands(Operation &op) {
    if (isa<LinearOp, MatmulOp>(op))
      return std::make_pair(0u, 1u);
    if (isa<GroupedLinearOp>(op))
      return std::make_pair(0u, 2u);
    return std::nullopt;
  }

  /// Whether `op` is an MoE router's GEMM: a linear whose logits
  /// nn.moe_router reads.
  static bool isRouterGemm(Operation &op) {
    return isa<LinearOp>(op) &&
           llvm::any_of(op.getResult(0).getUsers(),
                        [](Operation *u) { return isa<MoERouterOp>(u); });
  }

  /// 16-bit GEMMs: a GEMM reading a parameter takes the 16-bit parameter
  /// itself and its other operand cast to `half` (one cast per value, right before
  /// its first such reader, in that reader's layer); casts of parameters
  /// left without readers go. With `routerInF32` the MoE routers' GEMMs
  /// stay as they are (Megatron's --moe-router-dtype fp32).
  static void gemmsInHalf(func::FuncOp f, Type half, bool routerInF32) {
    if (f.isExternal())
      return;
    Block &entry = f.getBody().front();
    OpBuilder b(f.getContext());
    DenseMap<Value, Value> narrowed;
    DenseMap<Operation *, Value> entries;
    SmallVector<CastOp> paramCasts;
    for (Operation &op : llvm::make_early_inc_range(entry)) {
      if (auto c = dyn_cast<CastOp>(op); c && castParam(c.getResult()))
        paramCasts.push_back(c);
      std::optional<std::pair<unsigned, unsigned>> gemm = gemmOperands(op);
      if (!gemm || (!paramOf(op.getOperand(gemm->first)) &&
                    !paramOf(op.getOperand(gemm->second))) ||
          (routerInF32 && isRouterGemm(op)))
        continue;
      for (unsigned i : {gemm->first, gemm->second}) {
        Value v = op.getOperand(i);
        if (paramOf(v)) {
          op.setOperand(i, halfParam(b, v, entries));
          continue;
        }
        Value &low = narrowed[v];
        if (!low) {
          b.setInsertionPoint(&op);
          low = castElements(b, op.getLoc(), v, half);
          if (Attribute layer = op.getAttr(kLayerAttr))
            low.getDefiningOp()->setAttr(kLayerAttr, layer);
        }
        op.setOperand(i, low);
      }
    }
    // The f32 region entries and casts left without readers go.
    for (auto &[copy, entry] : entries)
      if (copy->use_empty())
        copy->erase();
    for (CastOp c : paramCasts)
      if (c->use_empty())
        c.erase();
  }
};
} // namespace
