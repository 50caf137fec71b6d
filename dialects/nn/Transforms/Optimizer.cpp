//===- Optimizer.cpp - SGD / Adam update in the step phase ----------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "dialects/dist/IR/DistOps.h"
#include "tessera/Mesh/RankGroups.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <set>
#include <sstream>

namespace tessera::nn {
#define GEN_PASS_DEF_OPTIMIZERPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {
/// A main parameter the init phase creates: from one parameter, or for a
/// distributed-optimizer shard from the parameters of bucket `bucket` of
/// grad buffer `buffer`.
struct MainInit {
  SmallVector<std::string> params;
  std::string binding;
  FlatSymbolRefAttr buffer;
  int64_t bucket = -1;
  /// ZeRO-3: the parameters' shard buffer ("pshard:<buffer>:<k>") and type,
  /// which the main shard is made from.
  std::string shard;
  Type shardType;
};

/// What the optimizer needs to know of a parameter.
struct ParamInfo {
  Type type;
  SmallVector<ShardSplit, 2> splits;
  /// Held by several pipeline ranks (the tied embedding).
  bool tied = false;
};

/// Megatron's get_param_groups: no weight decay on biases and 1-D
/// parameters (norm weights).
bool decays(StringRef name, const ParamInfo &p) {
  auto type = dyn_cast<RankedTensorType>(p.type);
  return !name.ends_with(".bias") && type && type.getRank() > 1;
}

/// One piece of the global gradient norm: the sum of squares of step
/// result `result` (a gradient, or a bucket shard's `runs`), to be summed
/// over the ranks of `kind` ("" when no other rank holds a distinct part).
struct NormTerm {
  unsigned result;
  std::string kind;
  SmallVector<int64_t> runs;
  StringAttr group;
};

struct OptimizerPass : tessera::nn::impl::OptimizerPassBase<OptimizerPass> {
  using OptimizerPassBase::OptimizerPassBase;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    if (failed(checkOptions(root)))
      return signalPassFailure();
    // The norm's reductions, the same in every pipeline program (they
    // cross the stages): every kind any program needs, in one order.
    normKinds.clear();
    fp16 = false;
    if (auto mp = root->getAttrOfType<DictionaryAttr>(kMixedPrecisionAttr))
      if (auto params = mp.getAs<StringAttr>("params"))
        fp16 = symbolizeFloatDtype(params.getValue()) == FloatDtype::F16;
    if (clipGrad > 0 || logParamsNorm || fp16) {
      std::set<std::string> kinds;
      for (ModuleOp program : getPrograms(root)) {
        FailureOr<SmallVector<NormTerm>> terms = normTerms(program);
        if (failed(terms))
          return signalPassFailure();
        for (const NormTerm &t : *terms)
          kinds.insert(t.kind);
      }
      normKinds.assign(kinds.begin(), kinds.end());
    }
    anySynced = false;
    for (ModuleOp program : getPrograms(root))
      if (failed(runOnProgram(program)))
        return signalPassFailure();
    // (A pipeline rank without parameters has nothing to gather.)
    if (overlapParamGather && !anySynced) {
      emitError(root.getLoc())
          << "overlap-param-gather needs the distributed optimizer "
             "(tessera-dp-grad-allreduce distributed-optimizer=true): "
             "without it the step gathers no parameters";
      return signalPassFailure();
    }
    setOptimizerAttr(root);
  }

  /// The kinds of normKinds' reductions, in order.
  SmallVector<std::string> normKinds;
  /// f16 parameters: the gradients are of the scaled loss (nn.loss_seed).
  bool fp16 = false;

  /// Every parameter of `program` by name: its type and sharding, from the
  /// functions that take parameters.
  static llvm::StringMap<ParamInfo> paramInfos(ModuleOp program) {
    llvm::StringMap<ParamInfo> infos;
    for (auto f : program.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr)) {
          ParamInfo &p = infos[name.getValue()];
          if (!p.type)
            p.type = f.getArgumentTypes()[i];
          if (auto sharding = f.getArgAttrOfType<DictionaryAttr>(i, kShardingAttr))
            p.splits = getShardSplits(sharding);
          p.tied |= bool(f.getArgAttr(i, kTiedAttr));
        }
    return infos;
  }

  /// The rank group over which a gradient's sum of squares adds up: the
  /// axes along which ranks hold distinct parts of it (tp when split over
  /// tp, ep and etp for experts, the axes of `shardGroup` for a
  /// distributed-optimizer shard, and pp), dropping axes of size 1 but pp:
  /// the kinds then end in "pp" ("tp-pp", "dp-pp", "pp"), so that the
  /// norm's few bytes are counted apart from the tensor- and data-parallel
  /// traffic in the metrics (over "pp" itself they join the pipeline's).
  static FailureOr<std::string> reduceKind(dist::MeshOp mesh,
                                           const ParamInfo &p,
                                           StringRef shardGroup,
                                           Operation *where) {
    if (!mesh) // one rank
      return std::string();
    mesh::MeshConfig config = mesh.getConfig();
    std::set<std::string> axes;
    bool expert = false;
    for (const ShardSplit &s : p.splits) {
      axes.insert(s.axis.str());
      expert |= s.axis == "ep" || s.axis == "etp";
    }
    SmallVector<StringRef> shardAxes;
    shardGroup.split(shardAxes, '-');
    for (StringRef a : shardAxes)
      if (!a.empty())
        axes.insert(a.str());
    axes.insert("pp");
    auto sizeOf = [&](const std::string &axis) -> int64_t {
      if (axis == "tp") return config.tp;
      if (axis == "cp") return config.cp;
      if (axis == "dp") return config.dp;
      if (axis == "pp") return config.pp;
      if (axis == "ep") return config.ep;
      if (axis == "etp") return config.etp;
      if (axis == "edp") return config.edp();
      return 1;
    };
    // Expert parameters use the expert layout's axes, dense ones the
    // dense layout's (tp of a dense param split over "tp" only).
    SmallVector<std::string> kept;
    for (const std::string &a : axes) {
      if (expert && (a == "tp" || a == "cp" || a == "dp"))
        continue;
      if (sizeOf(a) > 1 || a == "pp")
        kept.push_back(a);
    }
    std::string error;
    std::string kind =
        mesh::canonicalKind(config, llvm::join(kept, "-"), error);
    if (!error.empty())
      return where->emitOpError()
             << "no rank group sums the gradient norm over "
             << llvm::join(kept, "-") << ": " << error;
    return kind;
  }

  /// The pieces of `program`'s gradient norm, one per gradient, or per
  /// class of parameters in a bucket shard (runs in the bucket's
  /// coordinates); the tied embedding counts only on pipeline rank 0.
  FailureOr<SmallVector<NormTerm>> normTerms(ModuleOp program) {
    SmallVector<NormTerm> terms;
    func::FuncOp step = getPhaseFunc(program, kStepPhase);
    auto mesh = dist::lookupMesh(program);
    if (!step)
      return terms; // runOnProgram reports a missing step phase
    llvm::StringMap<ParamInfo> infos = paramInfos(program);
    auto ppRank = program->getAttrOfType<IntegerAttr>(kPpRankAttr);
    const bool firstStage = !ppRank || ppRank.getInt() == 0;
    auto counted = [&](StringRef name) {
      auto it = infos.find(name);
      return it != infos.end() && (!it->second.tied || firstStage);
    };
    auto ret = cast<func::ReturnOp>(step.getBody().front().getTerminator());
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      if (auto shard =
              step.getResultAttrOfType<DictionaryAttr>(i, kGradShardAttr)) {
        auto ref = shard.getAs<FlatSymbolRefAttr>("buffer");
        int64_t k = shard.getAs<IntegerAttr>("bucket").getInt();
        auto gb = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
            step, ref);
        if (!gb)
          return step.emitOpError()
                 << "result #" << i << " is a shard of an unknown grad buffer";
        // (This bucket's ranges only: linear in the buckets overall.)
        const buckets::Bucket bucket = gb.getBucket(k);
        const int64_t shardElements =
            (bucket.end - bucket.start) / gb.getDp();
        // Each class's runs, in bucket coordinates.
        std::map<std::string, SmallVector<std::pair<int64_t, int64_t>>> runs;
        for (const buckets::ParamRange &r : gb.getBucketParamRanges(k)) {
          if (!counted(r.name))
            continue;
          FailureOr<std::string> kind =
              reduceKind(mesh, infos.lookup(r.name), gb.getGroup(), step);
          if (failed(kind))
            return failure();
          runs[*kind].push_back({r.start - bucket.start, r.end - bucket.start});
        }
        for (auto &[kind, ranges] : runs) {
          llvm::sort(ranges);
          NormTerm t{i, kind, {shardElements}, gb.getGroupAttr()};
          for (auto [b, e] : ranges) {
            if (t.runs.size() > 1 && t.runs.back() == b)
              t.runs.back() = e; // adjacent: one run
            else
              t.runs.append({b, e});
          }
          terms.push_back(std::move(t));
        }
        continue;
      }
      auto binding = step.getResultAttrOfType<StringAttr>(i, kBufferAttr);
      if (!binding || !binding.getValue().starts_with("grad:"))
        continue; // runOnProgram reports it
      StringRef name = binding.getValue().drop_front(5);
      if (!counted(name))
        continue;
      FailureOr<std::string> kind =
          reduceKind(mesh, infos.lookup(name), "", step);
      if (failed(kind))
        return failure();
      terms.push_back({i, *kind, {}, StringAttr()});
    }
    return terms;
  }

  /// The global L2 norm of `of(t.result)` over `terms`: the sums of squares
  /// (over each term's runs), reduced in normKinds' order (none over a
  /// group of one rank), then nn.clip_grad_norm with `maxNorm` (0: the norm
  /// alone, its coefficient 1).
  ClipGradNormOp globalNorm(ModuleOp program, OpBuilder &b, Location loc,
                            ArrayRef<NormTerm> terms,
                            llvm::function_ref<Value(unsigned)> of,
                            double maxNorm, bool unscale = false) {
    auto scalar = RankedTensorType::get({}, b.getF32Type());
    std::map<std::string, Value> byKind;
    for (const NormTerm &t : terms) {
      Value s = SumSquaresOp::create(
          b, loc, scalar, of(t.result),
          t.runs.empty() ? DenseI64ArrayAttr() : b.getDenseI64ArrayAttr(t.runs),
          t.runs.empty() ? StringAttr() : t.group);
      Value &sum = byKind[t.kind];
      sum = sum ? AddOp::create(b, loc, sum, s).getResult() : s;
    }
    auto mesh = dist::lookupMesh(program);
    Value total;
    for (const std::string &kind : normKinds) {
      Value sum = byKind[kind];
      if (!sum) // this program has none of these: it still takes part
        sum = FillOp::create(b, loc, scalar, b.getF32FloatAttr(0));
      std::string error;
      if (!kind.empty() &&
          mesh::groupSize(mesh.getConfig(), kind, error) > 1)
        sum = dist::AllReduceOp::create(
            b, loc, scalar, sum, FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
            b.getStringAttr(kind), enumAttr(b, dist::Reduction::Sum));
      total = total ? AddOp::create(b, loc, total, sum).getResult() : sum;
    }
    if (!total)
      total = FillOp::create(b, loc, scalar, b.getF32FloatAttr(0));
    return ClipGradNormOp::create(b, loc, scalar, scalar, total,
                                  b.getF32FloatAttr(maxNorm),
                                  unscale ? b.getUnitAttr() : UnitAttr());
  }

  LogicalResult checkOptions(ModuleOp module) {
    if (!symbolizeOptimizerKind(optimizer)) {
      emitError(module.getLoc()) << "unknown optimizer '" << std::string(optimizer)
                                 << "' (expected sgd or adam)";
      return failure();
    }
    // Hyper-parameters: finite, and in the ranges the updates are defined
    // for (a NaN would train to NaN losses from the first step).
    struct Hyper {
      const char *name;
      double value;
      bool belowOne; // [0, 1) rather than [0, inf)
    };
    const Hyper hypers[] = {{"lr", lr, false},
                            {"min-lr", minLr, false},
                            {"weight-decay", weightDecay, false},
                            {"clip-grad", clipGrad, false},
                            {"adam-beta1", beta1, true},
                            {"adam-beta2", beta2, true},
                            {"adam-eps", eps, false},
                            {"sgd-momentum", sgdMomentum, true}};
    for (const Hyper &h : hypers)
      if (!std::isfinite(h.value) || h.value < 0 ||
          (h.belowOne && h.value >= 1)) {
        std::ostringstream value;
        value << h.value;
        emitError(module.getLoc())
            << "invalid --" << h.name << " " << value.str()
            << " (expected a finite value in "
            << (h.belowOne ? "[0, 1))" : "[0, inf))");
        return failure();
      }
    // The loss scaler (used under fp16 only; tessera-compile rejects the
    // flags without --fp16).
    struct Scale {
      const char *name;
      double value;
      bool zeroIsDynamic; // --loss-scale 0: no constant scale
    };
    const Scale scales[] = {{"loss-scale", lossScale, true},
                            {"initial-loss-scale", initialLossScale, false},
                            {"min-loss-scale", minLossScale, false}};
    for (const Scale &h : scales)
      if (!std::isfinite(h.value) || h.value < 0 ||
          (h.value == 0 && !h.zeroIsDynamic)) {
        std::ostringstream value;
        value << h.value;
        emitError(module.getLoc())
            << "invalid --" << h.name << " " << value.str()
            << " (expected a finite value > 0"
            << (h.zeroIsDynamic ? "; 0 is dynamic" : "") << ")";
        return failure();
      }
    if (minLossScale > initialLossScale || lossScaleWindow < 1 ||
        hysteresis < 1) {
      std::ostringstream text;
      text << "invalid loss scaler: --min-loss-scale " << double(minLossScale)
           << " above --initial-loss-scale " << double(initialLossScale)
           << ", or --loss-scale-window " << int64_t(lossScaleWindow)
           << " or --hysteresis " << int64_t(hysteresis)
           << " below 1 (expected min <= initial, window >= 1, hysteresis "
              ">= 1)";
      emitError(module.getLoc()) << text.str();
      return failure();
    }
    std::optional<LrDecayStyle> style = symbolizeLrDecayStyle(lrDecayStyle);
    if (!style) {
      emitError(module.getLoc()) << "unknown lr-decay-style '"
                                 << std::string(lrDecayStyle)
                                 << "' (expected constant, linear or cosine)";
      return failure();
    }
    if (lrWarmupIters < 0 || minLr < 0 || minLr > lr ||
        (*style != LrDecayStyle::Constant && lrDecayIters <= lrWarmupIters)) {
      emitError(module.getLoc())
          << "invalid learning-rate schedule: warmup " << int64_t(lrWarmupIters)
          << ", decay to iteration " << int64_t(lrDecayIters) << ", lr "
          << double(lr) << ", min-lr " << double(minLr)
          << " (a decay needs lr-decay-iters > lr-warmup-iters and 0 <= "
             "min-lr <= lr)";
      return failure();
    }
    return success();
  }

  LogicalResult runOnProgram(ModuleOp module) {
    func::FuncOp step = getPhaseFunc(module, kStepPhase);
    if (!step)
      return emitError(module.getLoc())
             << "tessera-optimizer needs the microbatch (or forward) and step "
                "phases (run tessera-autodiff and tessera-dp-grad-allreduce)";

    // Parameter types by name, from the phases that take parameters.
    llvm::StringMap<Type> paramTypes;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          paramTypes[name.getValue()] = f.getArgumentTypes()[i];

    Block &body = step.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    OpBuilder b(ret);
    Location loc = step.getLoc();
    bool adam = symbolizeOptimizerKind(optimizer) == OptimizerKind::Adam;

    SmallVector<Value> newResults;
    SmallVector<std::string> newBindings;
    SmallVector<std::pair<Value, std::string>> zeroGrads;
    SmallVector<Type> zeroGradTypes;
    Value iteration;
    if (adam)
      iteration = body.addArgument(
          RankedTensorType::get({}, b.getI64Type()), loc);

    unsigned numArgs = step.getNumArguments();
    unsigned numResults = ret.getNumOperands();
    SmallVector<std::string> argBindings;
    // One update of `param` by `grad`; the optimizer state is bound under
    // `stateKey` and returned after the new parameters.
    SmallVector<Value> stateResults;
    SmallVector<std::string> stateBindings;
    auto flushState = [&] {
      newResults.append(stateResults.begin(), stateResults.end());
      newBindings.append(stateBindings.begin(), stateBindings.end());
      stateResults.clear();
      stateBindings.clear();
    };
    // `wd` the weight decay; `runs` (with `group`) the elements of a bucket
    // shard that take none.
    auto update = [&](Value param, Value grad, StringRef stateKey, double wd,
                      DenseI64ArrayAttr runs = {},
                      StringAttr group = {}) -> Value {
      Type type = param.getType();
      if (!adam && sgdMomentum == 0)
        return SgdOp::create(b, loc, param, grad, b.getF32FloatAttr(lr),
                             b.getF32FloatAttr(wd), runs, group);
      if (!adam) {
        Value buf = body.addArgument(type, loc);
        argBindings.push_back(("sgd.momentum_buffer:" + stateKey).str());
        auto op = SgdMomentumOp::create(
            b, loc, type, type, param, grad, buf, b.getF32FloatAttr(lr),
            b.getF32FloatAttr(wd), b.getF32FloatAttr(sgdMomentum), runs, group);
        stateResults.push_back(op.getNewMomentumBuffer());
        stateBindings.push_back(("sgd.momentum_buffer:" + stateKey).str());
        return op.getNewParam();
      }
      Value m = body.addArgument(type, loc);
      Value v = body.addArgument(type, loc);
      argBindings.push_back(("adam.exp_avg:" + stateKey).str());
      argBindings.push_back(("adam.exp_avg_sq:" + stateKey).str());
      auto op = AdamOp::create(b, loc, type, type, type, param, grad, m, v,
                               iteration, b.getF32FloatAttr(lr),
                               b.getF32FloatAttr(beta1), b.getF32FloatAttr(beta2),
                               b.getF32FloatAttr(eps), b.getF32FloatAttr(wd),
                               runs, group);
      stateResults.append({op.getNewExpAvg(), op.getNewExpAvgSq()});
      stateBindings.append({("adam.exp_avg:" + stateKey).str(),
                            ("adam.exp_avg_sq:" + stateKey).str()});
      return op.getNewParam();
    };
    auto mesh = dist::lookupMesh(module);
    // Mixed precision: a bf16 parameter is updated through its fp32 main
    // parameter (Megatron's main params): the optimizer steps the main
    // parameter with an f32 gradient, and the parameter is the main
    // parameter rounded to bf16. The init phase creates the main parameters
    // from the parameters once, before the first iteration.
    Type f32 = b.getF32Type();
    auto withElement = [](Type t, Type element) -> RankedTensorType {
      return RankedTensorType::get(cast<RankedTensorType>(t).getShape(), element);
    };
    auto isMixed = [](Type t) {
      return !cast<RankedTensorType>(t).getElementType().isF32();
    };
    auto toF32 = [&](Value v) { return castElements(b, loc, v, b.getF32Type()); };
    llvm::StringMap<ParamInfo> infos = paramInfos(module);
    // The pieces of the global norms (of the gradients, and of the updated
    // parameters with log-params-norm), by step result.
    SmallVector<NormTerm> terms;
    if (clipGrad > 0 || logParamsNorm || fp16) {
      FailureOr<SmallVector<NormTerm>> t = normTerms(module);
      if (failed(t))
        return failure();
      terms = std::move(*t);
    }
    // Clipping (Megatron's clip_grad_norm_fp32): every gradient scaled by
    // the coefficient before any update (in f32, as the updates take it);
    // the norm before clipping is the step's "grad_norm". Under fp16 the
    // norm is always taken: its coefficient unscales the gradients, and a
    // norm that is not finite skips the updates.
    Value coeff;
    if (clipGrad > 0 || fp16) {
      ClipGradNormOp clip = globalNorm(
          module, b, loc, terms,
          [&](unsigned i) { return ret.getOperand(i); }, clipGrad, fp16);
      newResults.push_back(clip.getNorm());
      newBindings.push_back("grad_norm");
      coeff = clip.getCoeff();
    }
    // What the update made of each result's parameters (f32: the
    // parameter, its main parameter, or this rank's shard of the bucket).
    SmallVector<Value> updatedOf(numResults);
    SmallVector<Value> updateGrads(numResults);
    for (unsigned i = 0; i < numResults; ++i) {
      Value g = ret.getOperand(i);
      auto binding = step.getResultAttrOfType<StringAttr>(i, kBufferAttr);
      bool shard = bool(step.getResultAttrOfType<DictionaryAttr>(i, kGradShardAttr));
      bool f32Update = shard;
      if (!shard && binding && binding.getValue().starts_with("grad:"))
        if (Type type = paramTypes.lookup(binding.getValue().drop_front(5)))
          f32Update = isMixed(type);
      if (f32Update)
        g = toF32(g);
      if (coeff)
        g = ScaleByOp::create(b, loc, g.getType(), g, coeff);
      updateGrads[i] = g;
    }
    SmallVector<MainInit> mainInits;
    for (unsigned i = 0; i < numResults; ++i) {
      Value grad = ret.getOperand(i);
      // The distributed optimizer (ZeRO-1): this rank updates its shard of
      // the bucket (a fp32 param is its own main param), then the updated
      // shards are all-gathered into the bucket's parameters.
      if (auto shard = step.getResultAttrOfType<DictionaryAttr>(i, kGradShardAttr)) {
        auto ref = shard.getAs<FlatSymbolRefAttr>("buffer");
        int64_t k = shard.getAs<IntegerAttr>("bucket").getInt();
        auto gb = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(step, ref);
        if (!gb || !mesh)
          return step.emitOpError() << "result #" << i
                                    << " is a shard of an unknown grad buffer";
        auto shardType = cast<RankedTensorType>(grad.getType());
        bool mixed = gb.getParamDtype() != FloatDtype::F32;
        SmallVector<Value> params;
        SmallVector<Type> partTypes;
        MainInit init;
        for (StringRef name : gb.getBucketParams(k)) {
          Type type = paramTypes.lookup(name);
          if (!type)
            return step.emitOpError() << "gradient of unknown parameter '"
                                      << name << "'";
          // fp32 parameters are their own main parameters: the step takes
          // them to keep this rank's shard (ZeRO-3: it takes the shard).
          if (!mixed && !gb.getShardParams()) {
            params.push_back(body.addArgument(type, loc));
            argBindings.push_back(name.str());
          }
          init.params.push_back(name.str());
          partTypes.push_back(type);
          if (!gb.getShardGrads()) {
            zeroGrads.push_back({Value(), ("grad:" + name).str()});
            zeroGradTypes.push_back(
                withElement(type, shardType.getElementType()));
          }
        }
        // ZeRO-2: the shard is the gradients' only copy; it restarts from
        // zero for the next step's accumulation.
        if (gb.getShardGrads()) {
          zeroGrads.push_back(
              {Value(), ("gshard:" + ref.getValue() + ":" + Twine(k)).str()});
          zeroGradTypes.push_back(shardType);
        }
        int64_t dp = gb.getDp();
        Type paramElement = cast<RankedTensorType>(partTypes.front()).getElementType();
        auto flatType =
            RankedTensorType::get({shardType.getDimSize(0) * dp}, paramElement);
        auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
        std::string key = ("pbuf:" + ref.getValue() + ":" + Twine(k)).str();
        Value mine;
        // ZeRO-3: the parameters' only copy is this rank's shard of the
        // bucket; the step updates it (fp32) or its fp32 main shard, and
        // gathers nothing (the phases gather before they read).
        std::string pshard = ("pshard:" + ref.getValue() + ":" + Twine(k)).str();
        if (gb.getShardParams()) {
          init.shard = pshard;
          init.shardType =
              RankedTensorType::get(shardType.getShape(), paramElement);
        }
        if (mixed) {
          // This rank's fp32 main shard of the bucket, kept between steps.
          mine = body.addArgument(withElement(shardType, f32), loc);
          init.binding = "main:" + key;
          init.buffer = ref;
          init.bucket = k;
          argBindings.push_back(init.binding);
          mainInits.push_back(init);
        } else if (gb.getShardParams()) {
          mine = body.addArgument(init.shardType, loc);
          argBindings.push_back(pshard);
        } else {
          Value flat = dist::PackOp::create(
              b, loc, flatType, ref, b.getI64IntegerAttr(k),
              enumAttr(b, dist::BucketData::Param), params);
          mine = dist::ScatterToRegionOp::create(b, loc, shardType, flat, meshRef,
                                                 gb.getGroupAttr(),
                                                 b.getI64IntegerAttr(0));
        }
        // No weight decay on the bucket's biases and 1-D parameters.
        SmallVector<int64_t> noDecay;
        {
          const buckets::Bucket bucket = gb.getBucket(k);
          SmallVector<std::pair<int64_t, int64_t>> ranges;
          for (const buckets::ParamRange &r : gb.getBucketParamRanges(k))
            if (!decays(r.name, infos.lookup(r.name)))
              ranges.push_back({r.start - bucket.start, r.end - bucket.start});
          llvm::sort(ranges);
          if (!ranges.empty())
            noDecay.push_back(shardType.getDimSize(0));
          for (auto [rb, re] : ranges) {
            if (noDecay.size() > 1 && noDecay.back() == rb)
              noDecay.back() = re;
            else
              noDecay.append({rb, re});
          }
        }
        Value updated = update(
            mine, updateGrads[i], key, weightDecay,
            noDecay.empty() ? DenseI64ArrayAttr()
                            : b.getDenseI64ArrayAttr(noDecay),
            noDecay.empty() ? StringAttr() : gb.getGroupAttr());
        updatedOf[i] = updated;
        Value stored = updated;
        if (mixed)
          stored = CastOp::create(
              b, loc, RankedTensorType::get(shardType.getShape(), paramElement),
              updated);
        if (gb.getShardParams()) {
          newResults.push_back(stored);
          newBindings.push_back(pshard);
          if (mixed) {
            newResults.push_back(updated);
            newBindings.push_back("main:" + key);
          }
          flushState();
          continue;
        }
        auto gather = dist::AllGatherOp::create(
            b, loc, flatType, stored, meshRef, gb.getGroupAttr(),
            b.getI64IntegerAttr(0));
        if (overlapParamGather) {
          gather.setParamSync(true);
          for (StringRef name : gb.getBucketParams(k))
            syncedBucket[name] = {FlatSymbolRefAttr::get(gb.getSymNameAttr()),
                                  k};
        }
        Value gathered = gather;
        auto unpack = dist::UnpackOp::create(
            b, loc, partTypes, ref, b.getI64IntegerAttr(k),
            enumAttr(b, dist::BucketData::Param), gathered);
        for (auto [name, v] : llvm::zip(gb.getBucketParams(k), unpack.getResults())) {
          newResults.push_back(v);
          newBindings.push_back(name.str());
        }
        if (mixed) {
          newResults.push_back(updated);
          newBindings.push_back("main:" + key);
        }
        flushState();
        continue;
      }
      auto binding = step.getResultAttrOfType<StringAttr>(i, kBufferAttr);
      if (!binding || !binding.getValue().starts_with("grad:"))
        return step.emitOpError() << "result #" << i << " is not a gradient";
      std::string name = binding.getValue().drop_front(5).str();
      Type type = paramTypes.lookup(name);
      if (!type)
        return step.emitOpError() << "gradient of unknown parameter '" << name
                                  << "'";
      const double wd = decays(name, infos.lookup(name)) ? weightDecay : 0.0;
      if (isMixed(type)) {
        Value main = body.addArgument(withElement(type, f32), loc);
        argBindings.push_back("main:" + name);
        Value updated = update(main, updateGrads[i], name, wd);
        updatedOf[i] = updated;
        newResults.push_back(CastOp::create(b, loc, type, updated));
        newBindings.push_back(name);
        newResults.push_back(updated);
        newBindings.push_back("main:" + name);
        mainInits.push_back({{name}, "main:" + name, nullptr, -1});
      } else {
        Value param = body.addArgument(type, loc);
        argBindings.push_back(name);
        updatedOf[i] = update(param, updateGrads[i], name, wd);
        newResults.push_back(updatedOf[i]);
        newBindings.push_back(name);
      }
      flushState();
      zeroGrads.push_back({grad, binding.getValue().str()});
      zeroGradTypes.push_back(grad.getType());
    }
    if (adam)
      argBindings.insert(argBindings.begin(), "iteration");
    // Megatron's --log-params-norm (calc_params_l2_norm, after the update):
    // the parameters counted as their gradients are, in f32.
    if (logParamsNorm) {
      ClipGradNormOp norm = globalNorm(
          module, b, loc, terms, [&](unsigned i) { return updatedOf[i]; }, 0.0);
      newResults.push_back(norm.getNorm());
      newBindings.push_back("params_norm");
    }
    // Gradients start from zero in the next step: one fill per bucket of
    // a grad buffer (unpacked into its parameters' gradients, which lower
    // to views of the bucket), one per gradient otherwise.
    llvm::StringMap<Type> zeroType;
    for (auto [zero, type] : llvm::zip(zeroGrads, zeroGradTypes))
      zeroType[zero.second] = type;
    llvm::StringSet<> zeroed;
    for (auto gb : module.getOps<dist::GradBufferOp>()) {
      buckets::Buffer layout = gb.getLayout();
      for (auto [k, bucket] : llvm::enumerate(layout.buckets)) {
        SmallVector<Type> types;
        for (const std::string &name : bucket.params)
          if (Type t = zeroType.lookup("grad:" + name))
            types.push_back(t);
        if (types.size() != bucket.params.size() || types.empty())
          continue;
        Value flat = FillOp::create(
            b, loc,
            RankedTensorType::get({bucket.end - bucket.start},
                                  cast<RankedTensorType>(types.front()).getElementType()),
            b.getF32FloatAttr(0));
        auto unpack = dist::UnpackOp::create(
            b, loc, types, FlatSymbolRefAttr::get(gb.getSymNameAttr()),
            b.getI64IntegerAttr(k), enumAttr(b, dist::BucketData::Grad), flat);
        for (auto [name, v] : llvm::zip(bucket.params, unpack.getResults())) {
          newResults.push_back(v);
          newBindings.push_back("grad:" + name);
          zeroed.insert("grad:" + name);
        }
      }
    }
    for (auto [zero, type] : llvm::zip(zeroGrads, zeroGradTypes))
      if (!zeroed.contains(zero.second)) {
        newResults.push_back(FillOp::create(b, loc, type, b.getF32FloatAttr(0)));
        newBindings.push_back(zero.second);
      }
    func::ReturnOp::create(b, ret.getLoc(), newResults);
    ret.erase();

    // Arguments: grads, then (iteration), then param [, m, v] per grad, or
    // per bucket shard the bucket's params [, m, v].
    SmallVector<DictionaryAttr> argAttrs, resultAttrs;
    for (unsigned i = 0; i < numArgs; ++i)
      argAttrs.push_back(step.getArgAttrDict(i));
    auto bind = [&](StringRef name) {
      return b.getDictionaryAttr(
          b.getNamedAttr(kBufferAttr, b.getStringAttr(name)));
    };
    for (const std::string &binding : argBindings)
      argAttrs.push_back(bind(binding));
    for (const std::string &binding : newBindings)
      resultAttrs.push_back(bind(binding));
    updateFunctionType(step);
    step.setAllArgAttrs(argAttrs);
    step.setAllResultAttrs(resultAttrs);
    if (!mainInits.empty())
      buildInitPhase(module, step, mainInits, paramTypes);
    if (overlapParamGather && !syncedBucket.empty()) {
      anySynced = true;
      placeParamSyncWaits(module, step);
    }
    return success();
  }

  /// overlap-param-gather: whether some program's step gathers a bucket.
  bool anySynced = false;
  /// overlap-param-gather: the bucket of every parameter whose gather the
  /// step leaves in flight (this program's).
  llvm::StringMap<std::pair<FlatSymbolRefAttr, int64_t>> syncedBucket;

  /// Megatron's forward pre-hooks (finish_param_sync): in each forward
  /// phase, a bucket's gather is finished right before the first op that
  /// reads one of its parameters, so the forward of the buckets read
  /// earlier runs while the later ones are still gathered.
  void placeParamSyncWaits(ModuleOp module, func::FuncOp step) {
    // Only a gather whose parameters nothing but the step's results reads
    // can stay in flight past the step (and start after every update):
    // the others stay synchronous.
    std::map<std::pair<std::string, int64_t>, dist::AllGatherOp> gathers;
    Operation *ret = step.getBody().front().getTerminator();
    step.walk([&](dist::AllGatherOp g) {
      dist::UnpackOp unpack = g.getParamSync() ? g.getParamSyncUnpack()
                                               : dist::UnpackOp();
      if (!unpack)
        return;
      if (llvm::any_of(unpack->getUsers(),
                       [&](Operation *u) { return u != ret; })) {
        g.setParamSync(false);
        auto gb = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
            unpack, unpack.getBufferAttr());
        for (StringRef name : gb.getBucketParams(unpack.getBucket()))
          syncedBucket.erase(name);
        return;
      }
      gathers[{unpack.getBuffer().str(), unpack.getBucket()}] = g;
    });
    // The buckets in the order the forwards first read them: by chunk (a
    // pipeline rank runs chunk 0's forward first), then by position.
    std::vector<std::tuple<int64_t, int64_t, std::pair<std::string, int64_t>>>
        readOrder;
    for (auto f : module.getOps<func::FuncOp>()) {
      auto phase = f->getAttrOfType<StringAttr>(kPhaseAttr);
      if (!phase || f.isExternal() ||
          (phase.getValue() != kMicrobatchPhase &&
           phase.getValue() != kForwardPhase))
        continue;
      Block &entry = f.getBody().front();
      // The first reader of each bucket, in the entry block.
      std::map<std::pair<std::string, int64_t>, Operation *> first;
      for (BlockArgument arg : entry.getArguments()) {
        auto name = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kParamAttr);
        if (!name)
          continue;
        auto it = syncedBucket.find(name.getValue());
        if (it == syncedBucket.end())
          continue;
        for (Operation *user : arg.getUsers()) {
          Operation *op = entry.findAncestorOpInBlock(*user);
          if (!op)
            continue;
          Operation *&at = first[{it->second.first.getValue().str(),
                                  it->second.second}];
          if (!at || op->isBeforeInBlock(at))
            at = op;
        }
      }
      int64_t chunk = -1;
      if (auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr))
        chunk = c.getInt();
      for (auto &[bucket, at] : first) {
        OpBuilder b(at);
        auto wait = dist::ParamSyncWaitOp::create(
            b, at->getLoc(), FlatSymbolRefAttr::get(f.getContext(), bucket.first),
            b.getI64IntegerAttr(bucket.second));
        int64_t position = 0;
        for (Operation *op = wait; op; op = op->getPrevNode())
          ++position;
        readOrder.push_back({chunk, position, bucket});
      }
    }
    syncedBucket.clear();
    // The step starts the gathers after every update, in that order, so
    // the first bucket the forward needs arrives first (Megatron dispatches
    // the first bucket group's all-gather first; the others follow in
    // forward order).
    llvm::sort(readOrder);
    std::set<std::pair<std::string, int64_t>> moved;
    for (auto &[chunk, position, bucket] : readOrder) {
      auto it = gathers.find(bucket);
      if (it == gathers.end() || !moved.insert(bucket).second)
        continue;
      dist::UnpackOp unpack = it->second.getParamSyncUnpack();
      it->second->moveBefore(ret);
      unpack->moveBefore(ret);
    }
    // A bucket no forward reads: its gather still starts after every
    // update (the next step finishes it first).
    for (auto &[bucket, gather] : gathers)
      if (!moved.count(bucket)) {
        dist::UnpackOp unpack = gather.getParamSyncUnpack();
        gather->moveBefore(ret);
        unpack->moveBefore(ret);
      }
  }

  /// The init phase: each main parameter is its bf16 parameter in f32, or
  /// with the distributed optimizer this rank's 1/dp of the bucket's
  /// parameters (the same shard the reduce-scatter gives it) in f32.
  void buildInitPhase(ModuleOp module, func::FuncOp step,
                      ArrayRef<MainInit> inits,
                      const llvm::StringMap<Type> &paramTypes) {
    OpBuilder b(step);
    b.setInsertionPointAfter(step);
    Location loc = step.getLoc();
    auto init = func::FuncOp::create(b, loc, kInitPhase, b.getFunctionType({}, {}));
    init->setAttr(kPhaseAttr, b.getStringAttr(kInitPhase));
    Block *body = init.addEntryBlock();
    b.setInsertionPointToStart(body);
    SmallVector<DictionaryAttr> argAttrs, resultAttrs;
    SmallVector<Value> results;
    auto bind = [&](StringRef name) {
      return b.getDictionaryAttr(b.getNamedAttr(kBufferAttr, b.getStringAttr(name)));
    };
    auto mesh = dist::lookupMesh(module);
    for (const MainInit &m : inits) {
      if (!m.shard.empty()) {
        Value shard = body->addArgument(m.shardType, loc);
        argAttrs.push_back(bind(m.shard));
        results.push_back(CastOp::create(
            b, loc,
            RankedTensorType::get(cast<RankedTensorType>(m.shardType).getShape(),
                                  b.getF32Type()),
            shard));
        resultAttrs.push_back(bind(m.binding));
        continue;
      }
      SmallVector<Value> params;
      for (const std::string &name : m.params) {
        params.push_back(body->addArgument(paramTypes.lookup(name), loc));
        argAttrs.push_back(bind(name));
      }
      auto first = cast<RankedTensorType>(params.front().getType());
      Value stored = params.front();
      if (m.buffer) {
        auto gb = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
            step, m.buffer);
        buckets::Bucket bucket = gb.getBucket(m.bucket);
        int64_t dp = gb.getDp();
        auto flatType = RankedTensorType::get({bucket.end - bucket.start},
                                              first.getElementType());
        Value flat = dist::PackOp::create(
            b, loc, flatType, m.buffer, b.getI64IntegerAttr(m.bucket),
            enumAttr(b, dist::BucketData::Param), params);
        stored = dist::ScatterToRegionOp::create(
            b, loc,
            RankedTensorType::get({(bucket.end - bucket.start) / dp},
                                  first.getElementType()),
            flat, FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
            gb.getGroupAttr(), b.getI64IntegerAttr(0));
      }
      auto storedType = cast<RankedTensorType>(stored.getType());
      results.push_back(CastOp::create(
          b, loc, RankedTensorType::get(storedType.getShape(), b.getF32Type()),
          stored));
      resultAttrs.push_back(bind(m.binding));
    }
    func::ReturnOp::create(b, loc, results);
    updateFunctionType(init);
    init.setAllArgAttrs(argAttrs);
    init.setAllResultAttrs(resultAttrs);
  }

  bool isAdam() const {
    return symbolizeOptimizerKind(optimizer) == OptimizerKind::Adam;
  }

  void setOptimizerAttr(ModuleOp module) {
    Builder b(module.getContext());
    SmallVector<NamedAttribute> scaler;
    if (fp16) // Megatron's grad scaler, run by the launcher
      scaler = {
          b.getNamedAttr("loss_scale", b.getF64FloatAttr(lossScale)),
          b.getNamedAttr("initial_loss_scale",
                         b.getF64FloatAttr(initialLossScale)),
          b.getNamedAttr("min_loss_scale", b.getF64FloatAttr(minLossScale)),
          b.getNamedAttr("loss_scale_window",
                         b.getI64IntegerAttr(lossScaleWindow)),
          b.getNamedAttr("hysteresis", b.getI64IntegerAttr(hysteresis))};
    SmallVector<NamedAttribute> attrs = {
            b.getNamedAttr("kind", b.getStringAttr(optimizer)),
            b.getNamedAttr("lr", b.getF32FloatAttr(lr)),
            b.getNamedAttr("beta1", b.getF32FloatAttr(beta1)),
            b.getNamedAttr("beta2", b.getF32FloatAttr(beta2)),
            b.getNamedAttr("eps", b.getF32FloatAttr(eps)),
            b.getNamedAttr("weight_decay", b.getF32FloatAttr(weightDecay)),
            b.getNamedAttr("clip_grad", b.getF32FloatAttr(clipGrad)),
            b.getNamedAttr("momentum",
                           b.getF32FloatAttr(isAdam() ? 0.0 : sgdMomentum)),
            b.getNamedAttr("lr_warmup_iters", b.getI64IntegerAttr(lrWarmupIters)),
            b.getNamedAttr("lr_decay_iters", b.getI64IntegerAttr(lrDecayIters)),
            b.getNamedAttr("lr_decay_style", b.getStringAttr(lrDecayStyle)),
            b.getNamedAttr("min_lr", b.getF32FloatAttr(minLr))};
    attrs.append(scaler.begin(), scaler.end());
    module->setAttr(kOptimizerAttr, b.getDictionaryAttr(attrs));
  }
};
} // namespace
