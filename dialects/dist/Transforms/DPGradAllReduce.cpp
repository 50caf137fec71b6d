//===- DPGradAllReduce.cpp - Data-parallel gradient averaging -------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"

#include <map>
#include <set>

namespace tessera::dist {
#define GEN_PASS_DEF_DPGRADALLREDUCEPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct DPGradAllReducePass
    : tessera::dist::impl::DPGradAllReducePassBase<DPGradAllReducePass> {
  using DPGradAllReducePassBase::DPGradAllReducePassBase;
  void runOnOperation() override {
    if (bucketSize < 0) {
      emitError(getOperation().getLoc())
          << "bucket-size must be positive, or 0 for Megatron's default "
             "max(40000000, 1000000 x dp); got "
          << int64_t(bucketSize);
      return signalPassFailure();
    }
    for (ModuleOp program : getPrograms(getOperation()))
      if (failed(runOnProgram(program)))
        return signalPassFailure();
  }

  LogicalResult runOnProgram(ModuleOp module) {
    // The functions that produce gradients: the microbatch phase, or the
    // backward phase of every pipeline chunk.
    SmallVector<func::FuncOp> producers;
    for (auto f : module.getOps<func::FuncOp>())
      if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr))
        if (p.getValue() == kMicrobatchPhase || p.getValue() == kBackwardPhase)
          producers.push_back(f);
    if (producers.empty())
      return emitError(module.getLoc())
             << "tessera-dp-grad-allreduce needs the microbatch or backward "
                "phases (run tessera-autodiff)";
    if (getPhaseFunc(module, kStepPhase))
      return emitError(module.getLoc()) << "the module already has a step phase";
    MeshOp mesh = lookupMesh(module);
    // The reduction group (dp, or dp-cp under context parallelism) and its
    // size. The scale stays 1/dp: under context parallelism each cp rank's
    // loss is its tokens' share of the whole sequence's mean (a sum over cp,
    // see tessera-cp-partition), so the cp ranks' gradients add up to the
    // gradient; Megatron multiplies the loss by cp and scales by 1/(dp cp),
    // which is the same.
    int64_t dp = mesh ? mesh.getGradReduceSize() : 1;
    StringRef dpGroup = mesh ? mesh.getGradReduceGroup() : "dp";
    const float gradScale = mesh ? 1.0f / float(mesh.getDp()) : 1.0f;

    // Parameters shared with another pipeline rank (dist.tied).
    llvm::StringMap<StringAttr> tiedGroup;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          if (auto group = f.getArgAttrOfType<StringAttr>(i, kTiedAttr))
            tiedGroup[name.getValue()] = group;

    // ZeRO-2 (shard-grads): every backward reduce-scatters its buckets and
    // adds its shard in. The tied embedding's embedding-group all-reduce
    // then sums the two stages' shards in the step: the embedding has a
    // bucket of its own on both (Megatron's shared_embedding rule), of the
    // same padded size, so their dp shards cover the same elements.
    if (shardGrads && !distributedOptimizer)
      return emitError(module.getLoc())
             << "shard-grads (ZeRO-2) needs the distributed optimizer "
                "(distributed-optimizer=true)";
    if (shardParams && !shardGrads)
      return emitError(module.getLoc())
             << "shard-params (ZeRO-3) needs shard-grads (ZeRO-2)";
    // The gradients the phases accumulate, in order of first appearance. A
    // gradient that ends in a sum all-reduce (a parameter entering a
    // tensor-parallel region through copy_to_region, e.g. layer norms under
    // sequence parallelism) is accumulated unreduced and reduced once per
    // step: the sum of the reductions is the reduction of the sum, and it
    // moves 1/M the bytes (Megatron all-reduces these gradients once, after
    // the last microbatch).
    llvm::StringMap<unsigned> producerCount;
    for (func::FuncOp f : producers)
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        if (auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
          ++producerCount[of.getValue()];
    SmallVector<Type> types;
    SmallVector<StringAttr> names;
    SmallVector<StringAttr> deferredGroups;
    llvm::StringSet<> seen;
    for (func::FuncOp f : producers) {
      auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i) {
        auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr);
        if (!of || !seen.insert(of.getValue()).second)
          continue;
        types.push_back(f.getResultTypes()[i]);
        names.push_back(of);
        StringAttr group;
        auto reduce = ret.getOperand(i).getDefiningOp<AllReduceOp>();
        if (!shardGrads && producerCount[of.getValue()] == 1 && reduce &&
            reduce.getReduction() == Reduction::Sum &&
            reduce.getResult().hasOneUse()) {
          group = reduce.getGroupAttr();
          ret.setOperand(i, reduce.getInput());
          reduce.erase();
        }
        deferredGroups.push_back(group);
      }
    }

    llvm::StringMap<Type> gradType;
    for (auto [name, type] : llvm::zip(names, types))
      gradType[name.getValue()] = type;

    // Chunk of every gradient (its producer's chunk; -1 without pipelines).
    llvm::StringMap<int64_t> chunkOf;
    for (func::FuncOp f : producers) {
      int64_t c = -1;
      if (auto a = f->getAttrOfType<IntegerAttr>(kChunkAttr))
        c = a.getInt();
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        if (auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
          chunkOf.try_emplace(of.getValue(), c);
    }

    // Param-and-grad buffers (Megatron's _ParamAndGradBuffer): per model
    // chunk (Megatron gives each virtual-pipeline chunk its own DDP
    // buffers), then per dtype.
    OpBuilder b(module.getContext());
    b.setInsertionPointAfter(producers.back());
    int64_t ppRank = 0;
    if (auto r = module->getAttrOfType<IntegerAttr>(kPpRankAttr))
      ppRank = r.getInt();
    buckets::LayoutOptions layoutOptions;
    layoutOptions.dp = dp;
    layoutOptions.bucketSize = bucketSize;
    layoutOptions.distributedOptimizer = distributedOptimizer;
    layoutOptions.padForHighNcclBusbw = padBucketsForHighNcclBusbw;
    layoutOptions.firstPipelineStage = ppRank == 0;
    // Stored parameter dtypes (bf16 under mixed precision), from the
    // phases that take the parameters.
    llvm::StringMap<Type> paramElement;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          paramElement[name.getValue()] =
              cast<RankedTensorType>(f.getArgumentTypes()[i]).getElementType();
    auto dtypeName = [](Type element) -> std::string {
      std::optional<FloatDtype> dtype =
          element ? floatDtypeOf(element) : std::nullopt;
      return stringifyFloatDtype(dtype.value_or(FloatDtype::F32)).str();
    };
    // Expert parallelism: the experts' parameters (sharded over "ep" or
    // "etp") get
    // buffers of their own, reduced over the expert data-parallel group
    // (Megatron's expert_data_parallel buffers); the scale stays 1/dp, as
    // Megatron's expert_gradient_scaling_factor.
    llvm::StringSet<> expertParams;
    for (auto f : module.getOps<func::FuncOp>())
      for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i)
        if (auto name = f.getArgAttrOfType<StringAttr>(i, kParamAttr))
          for (ShardSplit split : getShardSplits(
                   f.getArgAttrOfType<DictionaryAttr>(i, kShardingAttr)))
            if (split.axis == "ep" || split.axis == "etp")
              expertParams.insert(name.getValue());
    int64_t edp = 1;
    if (mesh && !expertParams.empty()) {
      std::string error;
      FailureOr<int64_t> size = mesh.getGroupSize("edp", error);
      if (failed(size))
        return emitError(module.getLoc()) << error;
      edp = *size;
    }
    // (chunk, expert buffer) -> its parameters.
    std::map<std::pair<int64_t, bool>, std::vector<buckets::ParamInfo>>
        chunkParams;
    for (auto [name, type] : llvm::zip(names, types)) {
      auto t = cast<RankedTensorType>(type);
      buckets::ParamInfo info;
      info.name = name.getValue().str();
      info.numel = t.getNumElements();
      info.gradDtype = dtypeName(t.getElementType());
      info.paramDtype = dtypeName(paramElement.lookup(name.getValue()));
      info.sharedEmbedding = tiedGroup.count(name.getValue()) > 0;
      chunkParams[{chunkOf.lookup(name.getValue()),
                   expertParams.contains(name.getValue())}]
          .push_back(info);
    }
    struct Placed {
      GradBufferOp op;
      buckets::Buffer layout;
      /// The group it is reduced over and its size.
      StringRef group;
      int64_t size;
      /// The chunk whose phases reduce it.
      int64_t chunk;
    };
    SmallVector<Placed> placed;
    // A bucket of gradients holds the buffer's grad dtype.
    auto gradElement = [&](const Placed &p) -> Type {
      return floatDtypeType(
          b.getContext(),
          symbolizeFloatDtype(p.layout.gradDtype).value_or(FloatDtype::F32));
    };
    for (auto &[key, params] : chunkParams) {
      auto [chunk, expert] = key;
      StringRef group = expert ? StringRef("edp") : dpGroup;
      const int64_t size = expert ? edp : dp;
      layoutOptions.dp = size;
      std::vector<buckets::Buffer> bufs = buckets::layoutBuffers(params, layoutOptions);
      for (auto [i, layout] : llvm::enumerate(bufs)) {
        std::string sym = expert ? "gbuf_experts" : "gbuf";
        if (chunk >= 0)
          sym += "_c" + std::to_string(chunk);
        if (bufs.size() > 1)
          sym += "_" + std::to_string(i);
        SmallVector<Attribute> paramAttrs, bucketAttrs;
        for (const buckets::ParamRange &p : layout.params)
          paramAttrs.push_back(b.getDictionaryAttr(
              {b.getNamedAttr("name", b.getStringAttr(p.name)),
               b.getNamedAttr("start", b.getI64IntegerAttr(p.start)),
               b.getNamedAttr("end", b.getI64IntegerAttr(p.end)),
               b.getNamedAttr("bucket", b.getI64IntegerAttr(p.bucket))}));
        for (const buckets::Bucket &k : layout.buckets)
          bucketAttrs.push_back(
              b.getDenseI64ArrayAttr({k.start, k.end, k.numelUnpadded}));
        auto op = GradBufferOp::create(
            b, module.getLoc(), b.getStringAttr(sym),
            b.getStringAttr(layout.paramDtype), b.getStringAttr(layout.gradDtype),
            b.getI64IntegerAttr(size), b.getBoolAttr(distributedOptimizer),
            b.getBoolAttr(padBucketsForHighNcclBusbw),
            b.getI64IntegerAttr(layout.numel),
            b.getI64IntegerAttr(layout.numelUnpadded), b.getArrayAttr(paramAttrs),
            b.getArrayAttr(bucketAttrs), b.getStringAttr(group),
            b.getBoolAttr(shardGrads), b.getBoolAttr(shardParams));
        placed.push_back({op, layout, group, size, chunk});
      }
    }
    if (singleBucketGroup)
      module->setAttr(kSingleBucketGroupAttr, b.getUnitAttr());

    // Megatron's overlap_grad_reduce: a variant of the microbatch phase for
    // the last microbatch starts each bucket's reduction right after the
    // bucket's last gradient is produced and waits for all at its end, so
    // the reductions overlap the rest of the backward.
    // ZeRO-2 (shard-grads): the phases themselves reduce, every microbatch,
    // accumulating into the shards (no variant).
    std::set<std::pair<Operation *, int64_t>> overlapped;
    if (shardGrads ||
        (overlapGradReduce &&
         llvm::any_of(placed, [](const Placed &p) { return p.size > 1; }))) {
      // One variant per gradient-producing phase: the microbatch phase, or
      // each chunk's backward (the schedule runs it for the last
      // microbatch), reducing the buckets of that phase's chunk.
      for (func::FuncOp producer : producers) {
        int64_t chunk = -1;
        if (auto c = producer->getAttrOfType<IntegerAttr>(kChunkAttr))
          chunk = c.getInt();
        OpBuilder ob(producer);
        ob.setInsertionPointAfter(producer);
        func::FuncOp last = producer;
        if (!shardGrads) {
          last = cast<func::FuncOp>(ob.clone(*producer));
          last.setSymName((producer.getSymName() + ":last").str());
          last->setAttr(kLastMicrobatchAttr, ob.getUnitAttr());
        }
        auto ret = cast<func::ReturnOp>(last.getBody().front().getTerminator());
        llvm::StringMap<Value> produced;
        for (unsigned i = 0, e = last.getNumResults(); i < e; ++i)
          if (auto of = last.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
            produced[of.getValue()] = ret.getOperand(i);
        // Waits go before the phase's trailing sends (a phase sends last).
        Operation *waitPoint = ret;
        while (waitPoint->getPrevNode() && isa<SendOp>(waitPoint->getPrevNode()))
          waitPoint = waitPoint->getPrevNode();
        auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
        // A bucket group's reductions start together, once all of its
        // buckets are complete: with one group, after the last gradient.
        auto lastProducer = [&](ArrayRef<std::string> params) {
          Operation *after = nullptr;
          for (const std::string &name : params)
            if (Value v = produced.lookup(name))
              if (Operation *def = v.getDefiningOp())
                if (!after || after->isBeforeInBlock(def))
                  after = def;
          return after;
        };
        // The distributed optimizer reads the reduce-scattered shard, so a
        // bucket whose gradient the step still all-reduces over another
        // group (the tied embedding) is reduced in the step instead; under
        // ZeRO-2 the step sums its shard over that group.
        auto overlappable = [&](const buckets::Bucket &bucket) {
          if (!distributedOptimizer || shardGrads)
            return true;
          return llvm::none_of(bucket.params, [&](const std::string &name) {
            return tiedGroup.count(name) > 0;
          });
        };
        // This chunk's buffers. A gradient two chunks of the rank produce
        // (the tied embedding under a V-shaped placement, whose first and
        // last stage are rank 0's chunks) is in the buffer of the chunk
        // that produces it first. Its last-microbatch variant reduces it,
        // which the schedule runs after the other chunk's last phase
        // (tessera-pp-schedule checks that); under ZeRO-2/3, which reduce
        // every microbatch's gradients into the shards, the other chunk's
        // phases reduce-scatter the buckets they add to as well, with
        // zeros for the bucket's other parameters (the sum is the same).
        SmallVector<Placed *> mine;
        auto producesAny = [&](const Placed &p) {
          return llvm::any_of(p.layout.params, [&](const buckets::ParamRange &r) {
            return produced.count(r.name) > 0;
          });
        };
        for (Placed &p : placed)
          if ((p.chunk == chunk || shardGrads) && producesAny(p))
            mine.push_back(&p);
        auto producesInBucket = [&](const buckets::Bucket &bucket) {
          return llvm::any_of(bucket.params, [&](const std::string &name) {
            return produced.count(name) > 0;
          });
        };
        Operation *groupEnd = nullptr;
        if (singleBucketGroup)
          for (Placed *p : mine)
            for (const buckets::Bucket &bucket : p->layout.buckets)
              if (overlappable(bucket))
                if (Operation *op = lastProducer(bucket.params))
                  if (!groupEnd || groupEnd->isBeforeInBlock(op))
                    groupEnd = op;
        for (Placed *p : mine)
          for (auto [k, bucket] : llvm::enumerate(p->layout.buckets)) {
            if (!overlappable(bucket) ||
                (p->chunk != chunk && !producesInBucket(bucket)))
              continue;
            Operation *after =
                singleBucketGroup ? groupEnd : lastProducer(bucket.params);
            if (after)
              ob.setInsertionPointAfter(after);
            else
              ob.setInsertionPointToStart(&last.getBody().front());
            // Not after the leading receives' ops: a phase receives first.
            while (isa<RecvOp>(*ob.getInsertionPoint()))
              ob.setInsertionPointAfter(&*ob.getInsertionPoint());
            SmallVector<Value> grads;
            for (const std::string &name : bucket.params) {
              Value g = produced.lookup(name);
              if (!g) // (another chunk's parameter: zeros)
                g = nn::FillOp::create(ob, last.getLoc(), gradType.lookup(name),
                                       ob.getF32FloatAttr(0));
              grads.push_back(g);
            }
            auto ref = FlatSymbolRefAttr::get(p->op.getSymNameAttr());
            auto start = BucketReduceStartOp::create(
                ob, last.getLoc(), ref, ob.getI64IntegerAttr(k), meshRef,
                ob.getStringAttr(p->group), ob.getF32FloatAttr(gradScale),
                enumAttr(ob, distributedOptimizer
                                 ? BucketReduceKind::ReduceScatter
                                 : BucketReduceKind::AllReduce),
                shardGrads ? ob.getUnitAttr() : UnitAttr(), grads);
            // The group's next start goes after this one (bucket order).
            if (singleBucketGroup)
              groupEnd = start;
            if (!shardGrads) {
              ob.setInsertionPoint(waitPoint);
              BucketReduceWaitOp::create(ob, last.getLoc(), ref,
                                         ob.getI64IntegerAttr(k));
            }
            overlapped.insert({p->op.getOperation(), int64_t(k)});
          }
        // ZeRO-2: a bucket's whole gradients live only until its
        // reduce-scatter is done, so each reduction is waited for right
        // before the next one starts (one bucket in flight, as
        // Megatron-FSDP frees a bucket after its reduce-scatter), the last
        // before the phase's trailing sends.
        if (shardGrads) {
          SmallVector<BucketReduceStartOp> starts;
          last.walk([&](BucketReduceStartOp s) { starts.push_back(s); });
          for (auto [i, s] : llvm::enumerate(starts)) {
            if (i + 1 < starts.size())
              ob.setInsertionPoint(starts[i + 1]);
            else
              ob.setInsertionPoint(waitPoint);
            BucketReduceWaitOp::create(ob, last.getLoc(), s.getBufferAttr(),
                                       s.getBucketAttr());
          }
        }
        // The phase keeps no whole gradient: its shards took them.
        if (shardGrads) {
          llvm::BitVector drop(last.getNumResults());
          for (unsigned i = 0, e = last.getNumResults(); i < e; ++i)
            if (last.getResultAttr(i, kGradOfAttr))
              drop.set(i);
          ret.getOperation()->eraseOperands(drop);
          (void)last.eraseResults(drop);
        }
      }
    }

    // Without the distributed optimizer the step returns every averaged
    // gradient; with it, each bucket's reduce-scattered shard, for the
    // optimizer to update this rank's part of the parameters.
    SmallVector<Type> resultTypes;
    SmallVector<DictionaryAttr> resultAttrs;
    if (!distributedOptimizer)
      resultTypes = types;
    for (Placed &p : placed)
      for (auto [k, bucket] : llvm::enumerate(p.layout.buckets))
        if (distributedOptimizer) {
          resultTypes.push_back(RankedTensorType::get(
              {(bucket.end - bucket.start) / p.size}, gradElement(p)));
          resultAttrs.push_back(b.getDictionaryAttr(b.getNamedAttr(
              kGradShardAttr,
              b.getDictionaryAttr(
                  {b.getNamedAttr("buffer", FlatSymbolRefAttr::get(p.op.getSymNameAttr())),
                   b.getNamedAttr("bucket", b.getI64IntegerAttr(k))}))));
        }
    // (ZeRO-2: the step takes the shards only.)
    auto step = func::FuncOp::create(
        b, producers.back().getLoc(), "step",
        b.getFunctionType(shardGrads ? TypeRange() : TypeRange(types),
                          resultTypes));
    step->setAttr(kPhaseAttr, b.getStringAttr(kStepPhase));
    Block *body = step.addEntryBlock();
    b.setInsertionPointToStart(body);
    SmallVector<Value> results;
    // Bindings set in one go: per-argument updates rebuild the whole
    // attribute array each time (quadratic in the number of parameters).
    SmallVector<DictionaryAttr> bindings;
    auto meshRef = [&] { return FlatSymbolRefAttr::get(mesh.getSymNameAttr()); };
    llvm::StringMap<Value> grad;
    for (auto [i, name] : llvm::enumerate(names)) {
      if (shardGrads)
        break;
      bindings.push_back(b.getDictionaryAttr(b.getNamedAttr(
          kBufferAttr, b.getStringAttr("grad:" + name.getValue()))));
      Value g = body->getArgument(i);
      if (StringAttr group = deferredGroups[i])
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g, meshRef(),
                                group, enumAttr(b, Reduction::Sum));
      // The tied embedding: both pipeline ranks' parts of the gradient
      // (Megatron's embedding-group all-reduce).
      if (StringAttr group = tiedGroup.lookup(name.getValue()))
        g = AllReduceOp::create(b, step.getLoc(), g.getType(), g, meshRef(),
                                group, enumAttr(b, Reduction::Sum));
      grad[name.getValue()] = g;
    }
    // Bucket by bucket (in bucket-group order: one bucket each, or all of
    // them together): Megatron scales by 1/dp (gradient_scaling_factor)
    // and all-reduces, or reduce-scatters with the distributed optimizer.
    SmallVector<Value> shards;
    for (Placed &p : placed) {
      if (p.size == 1 && !distributedOptimizer && gradScale == 1.0f)
        continue;
      for (auto [k, bucket] : llvm::enumerate(p.layout.buckets)) {
          // Reduced during the last microbatch's backward already; with the
          // distributed optimizer its shard waits in the bucket's shard
          // buffer.
          if (overlapped.count({p.op.getOperation(), int64_t(k)})) {
            if (distributedOptimizer) {
              shards.push_back(body->addArgument(
                  RankedTensorType::get({(bucket.end - bucket.start) / p.size},
                                        gradElement(p)),
                  step.getLoc()));
              // ZeRO-2's tied embedding: its bucket's shard summed over the
              // embedding group (the other stage's shard of the same
              // elements).
              if (shardGrads)
                for (const std::string &name : bucket.params)
                  if (StringAttr group = tiedGroup.lookup(name)) {
                    if (bucket.params.size() != 1)
                      return p.op.emitOpError()
                             << "bucket " << k << " holds '" << name
                             << "', shared across pipeline stages, with "
                                "other parameters: its shard cannot be "
                                "summed over '"
                             << group.getValue() << "'";
                    shards.back() = AllReduceOp::create(
                        b, step.getLoc(), shards.back().getType(),
                        shards.back(), meshRef(), group,
                        enumAttr(b, Reduction::Sum));
                  }
              bindings.push_back(b.getDictionaryAttr(b.getNamedAttr(
                  kBufferAttr, b.getStringAttr(("gshard:" + p.op.getSymName() +
                                                ":" + Twine(k))
                                                   .str()))));
            }
            continue;
          }
          auto ref = FlatSymbolRefAttr::get(p.op.getSymNameAttr());
          SmallVector<Value> parts;
          SmallVector<Type> partTypes;
          for (const std::string &name : bucket.params) {
            parts.push_back(grad[name]);
            partTypes.push_back(parts.back().getType());
          }
          auto flatType = RankedTensorType::get({bucket.end - bucket.start},
                                                gradElement(p));
          Value flat = PackOp::create(b, step.getLoc(), flatType, ref,
                                      b.getI64IntegerAttr(k),
                                      enumAttr(b, BucketData::Grad), parts);
          if (gradScale != 1.0f)
            flat = nn::ScaleOp::create(b, step.getLoc(), flat,
                                       b.getF32FloatAttr(gradScale));
          if (distributedOptimizer) {
            auto shardType = RankedTensorType::get(
                {(bucket.end - bucket.start) / p.size}, gradElement(p));
            shards.push_back(ReduceScatterOp::create(
                b, step.getLoc(), shardType, flat, meshRef(),
                b.getStringAttr(p.group), b.getI64IntegerAttr(0)));
            continue;
          }
          if (p.size > 1)
            flat = AllReduceOp::create(b, step.getLoc(), flatType, flat,
                                       meshRef(), b.getStringAttr(p.group),
                                       enumAttr(b, Reduction::Sum));
          auto unpack = UnpackOp::create(b, step.getLoc(), partTypes, ref,
                                         b.getI64IntegerAttr(k),
                                         enumAttr(b, BucketData::Grad), flat);
          for (auto [name, v] : llvm::zip(bucket.params, unpack.getResults()))
            grad[name] = v;
        }
    }
    if (distributedOptimizer)
      results = shards;
    else
      for (StringAttr name : names)
        results.push_back(grad[name.getValue()]);
    func::ReturnOp::create(b, step.getLoc(), results);
    updateFunctionType(step);
    step.setAllArgAttrs(bindings);
    step.setAllResultAttrs(distributedOptimizer ? resultAttrs : bindings);
    return success();
  }
};
} // namespace
