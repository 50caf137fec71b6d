//===- PersistentBuffers.cpp - lower-to-rt stage 1: the persistent arena --===//
//
// The buffers that outlive a phase and their place in the arena: parameters
// with their global shape, sharding and init; gradients, main parameters and
// optimizer state naming their parameter; inputs (with their vocabulary or
// class count); the loss and iteration; the distributed optimizer's shard
// views; saved activations and p2p staging buffers of pipeline chunks. The
// layout puts Megatron's _ParamAndGradBuffer regions first (one flat region
// per grad buffer and dtype, with a view per bucket), then every other
// shared buffer, then the chunks' microbatch slot regions (one pool shared by
// the chunks, or a region per chunk, whichever is smaller).
//
//===----------------------------------------------------------------------===//

#include "LowerToRT.h"

using namespace mlir;
using namespace tessera;

/// The manifest attributes of a buffer sharded as `sharding` says
/// (`dist.sharding`, or null): shard_dim and shard_axis (and shard2_dim and
/// shard2_axis for a second split), and always the global shape, the local
/// one times each axis's group size.
static void addShardAttrs(Builder &b, dist::MeshOp mesh, RankedTensorType local,
                          DictionaryAttr sharding,
                          SmallVectorImpl<NamedAttribute> &attrs) {
  SmallVector<int64_t> global(local.getShape());
  for (auto [i, split] : llvm::enumerate(getShardSplits(sharding))) {
    std::string error;
    FailureOr<int64_t> size = mesh ? mesh.getGroupSize(split.axis, error)
                                   : FailureOr<int64_t>(1);
    global[split.dim] *= succeeded(size) ? *size : 1;
    std::string prefix = i ? "shard2_" : "shard_";
    attrs.push_back(
        b.getNamedAttr(prefix + "dim", b.getI64IntegerAttr(split.dim)));
    attrs.push_back(
        b.getNamedAttr(prefix + "axis", b.getStringAttr(split.axis)));
  }
  attrs.push_back(b.getNamedAttr("global_shape", b.getDenseI64ArrayAttr(global)));
}

namespace tessera::lowering {

int64_t chunkOf(func::FuncOp f) {
  auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
  return c ? c.getInt() : -1;
}

Persistent *PersistentBuffers::add(StringRef name, rt::BufferKind kind,
                                   Type tensorType,
                                   SmallVector<NamedAttribute> attrs) {
  if (Persistent *p = byName.lookup(name))
    return p;
  buffers.push_back(std::make_unique<Persistent>(
      Persistent{name.str(), kind, toMemRef(tensorType), 0, attrs}));
  byName[name] = buffers.back().get();
  return buffers.back().get();
}

LogicalResult PersistentBuffers::collect(ModuleOp module,
                                         ArrayRef<func::FuncOp> phases,
                                         func::FuncOp step, bool pipeline) {
  dist::MeshOp mesh = dist::lookupMesh(module);
  Builder b(module.getContext());
  // The distributed optimizer's shards: per bucket, this rank's 1/dp of
  // the gradients and of the parameters, as rank-relative views (placed
  // with the grad buffers below).
  for (auto gb : module.getOps<dist::GradBufferOp>()) {
    if (!gb.getDistributed())
      continue;
    buckets::Buffer layout = gb.getLayout();
    for (dist::BucketData data :
         {dist::BucketData::Grad, dist::BucketData::Param}) {
      Type element = bucketElementType(gb, data);
      for (auto [k, bucket] : llvm::enumerate(layout.buckets)) {
        int64_t numel = (bucket.end - bucket.start) / gb.getDp();
        // ZeRO-3: the shard is the parameters' only device copy, a buffer
        // of its own (the bucket's view is staged, see layout()).
        if (data == dist::BucketData::Param && gb.getShardParams()) {
          add(shardView(bucketView(data, gb.getSymName(), k)),
              rt::BufferKind::ParamShard,
              RankedTensorType::get({numel}, element),
              {b.getNamedAttr("rank_group", gb.getGroupAttr()),
               b.getNamedAttr("of", FlatSymbolRefAttr::get(b.getStringAttr(
                                        bucketView(data, gb.getSymName(), k))))});
          continue;
        }
        // ZeRO-2: the shard is the gradients' own buffer, of the bucket.
        if (data == dist::BucketData::Grad && gb.getShardGrads()) {
          add(shardView(bucketView(data, gb.getSymName(), k)),
              rt::BufferKind::Grad, RankedTensorType::get({numel}, element),
              {b.getNamedAttr("of", FlatSymbolRefAttr::get(b.getStringAttr(
                                        bucketView(dist::BucketData::Param,
                                                   gb.getSymName(), k))))});
          continue;
        }
        add(shardView(bucketView(data, gb.getSymName(), k)), rt::BufferKind::View,
            RankedTensorType::get({numel}, element),
            {b.getNamedAttr("rank_group", gb.getGroupAttr()),
             b.getNamedAttr("rank_stride",
                            b.getI64IntegerAttr(
                                numel * (element.getIntOrFloatBitWidth() / 8)))});
      }
    }
  }
  for (func::FuncOp micro : phases)
  for (unsigned i = 0, e = micro.getNumArguments(); i < e; ++i) {
    Type type = micro.getArgumentTypes()[i];
    if (auto name = micro.getArgAttrOfType<StringAttr>(i, kParamAttr)) {
      auto tensor = cast<RankedTensorType>(type);
      SmallVector<NamedAttribute> attrs;
      addShardAttrs(b, mesh, tensor,
                    micro.getArgAttrOfType<DictionaryAttr>(i, kShardingAttr),
                    attrs);
      StringAttr init = micro.getArgAttrOfType<StringAttr>(i, kInitAttr);
      if (!init)
        init = b.getStringAttr(tensor.getRank() >= 2 ? "normal:0.02" : "zeros");
      attrs.push_back(b.getNamedAttr("init", init));
      add(name.getValue(), rt::BufferKind::Param, type, attrs);
    }
  }
  for (func::FuncOp micro : phases)
    for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
      if (auto of = micro.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
        add(("grad:" + of.getValue()).str(), rt::BufferKind::Grad, micro.getResultTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(of))});
  for (unsigned i = 0, e = step.getNumArguments(); i < e; ++i)
    if (auto bnd = step.getArgAttrOfType<StringAttr>(i, kBufferAttr)) {
      StringRef name = bnd.getValue();
      if (name == "iteration")
        add(name, rt::BufferKind::Iteration, step.getArgumentTypes()[i]);
      else if (name.starts_with("gshard:")) // a shard view (above)
        continue;
      else if (name.starts_with("main:pbuf:")) // a distributed-optimizer shard
        add(name, rt::BufferKind::MainParam, step.getArgumentTypes()[i]);
      else if (name.starts_with("main:")) // the fp32 copy of a bf16 parameter
        add(name, rt::BufferKind::MainParam, step.getArgumentTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(
                                      b.getStringAttr(name.drop_front(5))))});
      else if (name.contains(':') && !name.starts_with("grad:"))
        add(name, rt::BufferKind::OptState, step.getArgumentTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(
                                      b.getStringAttr(name.split(':').second)))});
    }
  // The vocabulary of token inputs, from the embedding (any chunk).
  std::optional<int64_t> vocab;
  for (func::FuncOp f : phases)
    f.walk([&](nn::EmbeddingOp e) { vocab = e.getVocabSize(); });
  if (auto v = getRootModule(module)->getAttrOfType<DictionaryAttr>(kVocabAttr))
    if (auto size = v.getAs<IntegerAttr>("size"))
      vocab = size.getInt();
  for (func::FuncOp micro : phases)
  for (unsigned i = 0, e = micro.getNumArguments(); i < e; ++i)
    if (auto name = micro.getArgAttrOfType<StringAttr>(i, kInputAttr)) {
      SmallVector<NamedAttribute> attrs;
      // Token inputs and their labels: the model's vocabulary, from the
      // embedding. Classification labels: the number of classes.
      if (vocab && (name.getValue() == "tokens" || name.getValue() == "labels")) {
        attrs.push_back(b.getNamedAttr("vocab_size", b.getI64IntegerAttr(*vocab)));
      } else {
        // The loss that reads the labels (fused or not) gives the classes.
        for (Operation *user : micro.getArgument(i).getUsers()) {
          Value logits;
          if (auto ce = dyn_cast<nn::SoftmaxCrossEntropyOp>(user))
            logits = ce.getLogits();
          else if (auto stats = dyn_cast<nn::LogitsStatsOp>(user))
            logits = stats.getLogits();
          if (!logits)
            continue;
          auto z = cast<RankedTensorType>(logits.getType());
          attrs.push_back(b.getNamedAttr(
              "num_classes", b.getI64IntegerAttr(z.getDimSize(z.getRank() - 1))));
          break;
        }
      }
      // A context-parallel share of the sequence (tessera-cp-partition):
      // the runtime loads this rank's positions.
      if (auto sh = micro.getArgAttrOfType<DictionaryAttr>(i, kShardingAttr))
        addShardAttrs(b, mesh,
                      cast<RankedTensorType>(micro.getArgumentTypes()[i]), sh,
                      attrs);
      Persistent *p = add(name.getValue(), rt::BufferKind::Input, micro.getArgumentTypes()[i], attrs);
      if (p->attrs.empty())
        p->attrs = attrs;
      if (pipeline) {
        auto it = slotChunk.find(p);
        if (it != slotChunk.end() && it->second != chunkOf(micro))
          return micro.emitOpError()
                 << "reads input '" << name.getValue()
                 << "', which another chunk of this pipeline rank reads too";
        slotChunk[p] = chunkOf(micro);
      }
    }
  for (func::FuncOp micro : phases)
    for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
      if (auto bnd = micro.getResultAttrOfType<StringAttr>(i, kBufferAttr))
        add(bnd.getValue(), rt::BufferKind::Loss, micro.getResultTypes()[i]);
  // What the step reports to the host: the gradient norm, the parameters'.
  for (unsigned i = 0, e = step.getNumResults(); i < e; ++i)
    if (auto bnd = step.getResultAttrOfType<StringAttr>(i, kBufferAttr);
        bnd && (bnd.getValue() == "grad_norm" ||
                bnd.getValue() == "params_norm"))
      add(bnd.getValue(), rt::BufferKind::Metric, step.getResultTypes()[i]);
  // Saved activations: what a forward saves for its backward, and what a
  // split backward's input-gradient phase saves for its weight gradients.
  for (func::FuncOp f : phases)
    if (StringRef phase = f->getAttrOfType<StringAttr>(kPhaseAttr).getValue();
        phase == kForwardPhase || phase == kBackwardPhase)
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        if (f.getResultAttr(i, kStashAttr)) {
          std::string name = bindingOf(f.getResultAttrDict(i), chunkOf(f));
          SmallVector<NamedAttribute> attrs;
          if (phase == kBackwardPhase)
            attrs.push_back(b.getNamedAttr("for_weight_grad", b.getUnitAttr()));
          slotChunk[add(name, rt::BufferKind::Activation, f.getResultTypes()[i],
                        attrs)] = chunkOf(f);
        }

  return success();
}

LogicalResult
PersistentBuffers::layout(ModuleOp module,
                          const std::map<int64_t, int64_t> &numSlots,
                          const std::map<int64_t, int64_t> &chunkSlots,
                          ArrayRef<Operation *> scheduleRuns) {
  // Layout: the grad buffers (Megatron's _ParamAndGradBuffer), then the
  // other shared persistent buffers, then each chunk's slot region. A grad
  // buffer is one flat region per (chunk, dtype) holding its parameters'
  // gradients at their layout offsets (with the distributed optimizer a
  // second one holds the parameters), with a view buffer per bucket on top
  // for the collectives.
  int64_t offset = 0;
  Builder b(module.getContext());
  std::map<Persistent *, int64_t> fixed;
  stagingBytes = 0;
  for (auto gb : module.getOps<dist::GradBufferOp>()) {
    buckets::Buffer layout = gb.getLayout();
    for (dist::BucketData data :
         {dist::BucketData::Grad, dist::BucketData::Param}) {
      if (data == dist::BucketData::Param && !gb.getDistributed())
        continue;
      // ZeRO-2: no region of whole gradients (each backward gathers a
      // bucket's in a transient of its own).
      if (data == dist::BucketData::Grad && gb.getShardGrads())
        continue;
      Type element = bucketElementType(gb, data);
      int64_t elementBytes = element.getIntOrFloatBitWidth() / 8;
      // ZeRO-3: the parameters' region is staged (host memory for
      // initialisation and checkpoints), not in the arena.
      const bool staged =
          data == dist::BucketData::Param && gb.getShardParams();
      int64_t base = staged ? stagingBytes : offset;
      for (const buckets::ParamRange &p : layout.params) {
        std::string name =
            data == dist::BucketData::Grad ? "grad:" + p.name : p.name;
        Persistent *q = byName.lookup(name);
        if (!q)
          return gb.emitOpError() << "lays out '" << p.name
                                  << "', which no phase of this program has";
        if (q->type.getElementType() != element ||
            q->type.getNumElements() != p.end - p.start)
          return gb.emitOpError() << "gives '" << p.name << "' " << p.end - p.start
                                  << " "
                                  << stringifyEnum(
                                         data == dist::BucketData::Grad
                                             ? gb.getGradDtype()
                                             : gb.getParamDtype())
                                  << " elements, its buffer is "
                                  << q->type;
        fixed[q] = base + p.start * elementBytes;
        if (staged)
          q->attrs.push_back(b.getNamedAttr("staged", b.getUnitAttr()));
      }
      for (auto [k, bucket] : llvm::enumerate(layout.buckets)) {
        std::string name = bucketView(data, gb.getSymName(), k);
        Persistent *view = add(name, rt::BufferKind::View,
                               RankedTensorType::get({bucket.end - bucket.start},
                                                     element));
        fixed[view] = base + bucket.start * elementBytes;
        if (staged) {
          view->attrs = {b.getNamedAttr("staged", b.getUnitAttr())};
          continue;
        }
        if (Persistent *shard = byName.lookup(shardView(name)))
          fixed[shard] = fixed[view];
      }
      if (staged)
        stagingBytes = alignUp(base + layout.numel * elementBytes);
      else
        offset = alignUp(base + layout.numel * elementBytes);
    }
    // Without the distributed optimizer, the fp32 tensors the optimizer
    // updates (the parameters, or the main parameters of bf16 ones) and
    // their Adam state get the gradients' layout too, each in a region of
    // its own: a bucket is then one range in every region, which
    // tessera-fuse-bucket-optimizer updates with one kernel. A region is
    // laid out only if every parameter of the buffer has that tensor.
    if (!gb.getDistributed()) {
      for (StringRef prefix : {"main:", "", "adam.exp_avg:", "adam.exp_avg_sq:",
                               "sgd.momentum_buffer:"}) {
        SmallVector<std::pair<Persistent *, int64_t>> members;
        for (const buckets::ParamRange &p : layout.params) {
          Persistent *q = byName.lookup((prefix + p.name).str());
          if (!q || fixed.count(q) || !q->type.getElementType().isF32() ||
              q->type.getNumElements() != p.end - p.start)
            break;
          members.push_back({q, p.start});
        }
        if (members.size() != layout.params.size() || members.empty())
          continue;
        int64_t base = offset;
        for (auto [q, start] : members)
          fixed[q] = base + start * 4;
        offset = alignUp(base + layout.numel * 4);
      }
    }
  }
  for (auto &[p, at] : fixed)
    p->offset = at;
  for (auto &p : buffers)
    if (!slotChunk.count(p.get()) && !fixed.count(p.get())) {
      p->offset = offset;
      offset = alignUp(offset + byteSize(p->type));
    }
  // The slot pool: every chunk lays its inputs and saved activations out
  // from the same base; a slot is as large as the largest chunk's, and the
  // schedule's slots are shared by the chunks.
  // Each chunk's slot layout (offsets from its region's base).
  std::map<int64_t, int64_t> chunkBytes;
  for (auto &[c, slots] : numSlots)
    for (auto &p : buffers)
      if (auto it = slotChunk.find(p.get()); it != slotChunk.end() && it->second == c) {
        p->offset = chunkBytes[c];
        chunkBytes[c] = alignUp(chunkBytes[c] + byteSize(p->type));
      }
  std::map<int64_t, memory::ChunkSlots> chunks;
  for (auto &[c, slots] : numSlots)
    chunks[c] = {chunkBytes[c], slots, chunkSlots.at(c)};
  memory::SlotLayout slotLayout = memory::planSlotRegions(chunks, offset);
  regions = slotLayout.regions;
  offset = slotLayout.end;
  bool pooled = slotLayout.pooled;
  // (Before the lookups below, which would create an empty region.)
  for (auto &[p, c] : slotChunk)
    if (!regions.count(c))
      return emitError(module.getLoc())
             << "chunk " << c << " has buffers but no step in the schedule";
  for (auto &p : buffers)
    if (auto it = slotChunk.find(p.get()); it != slotChunk.end()) {
      p->offset += regions[it->second].base;
      if (p->kind == rt::BufferKind::Input)
        p->attrs.push_back(Builder(module.getContext())
                               .getNamedAttr("chunk", Builder(module.getContext())
                                                          .getI64IntegerAttr(it->second)));
    }
  if (!pooled)
    for (Operation *op : scheduleRuns)
      if (auto run = cast<dist::RunOp>(op);
          auto a = run->getAttrOfType<IntegerAttr>(kChunkSlotAttr))
        run.setSlot(a.getInt());
  bytes = offset;
  return success();
}

} // namespace tessera::lowering
