//===- StoragePlan.cpp - lower-to-rt stages 2 and 3: storage and memory ---===//
//
// Stage 2 decides, in a forward walk of a phase, where each tensor value
// lives: bound results are written in place into their persistent buffer
// where safe (gradients accumulate with beta = 1), in-place kernels
// (all-reduce, scale, optimizer steps) reuse their operand's storage when no
// later op reads it, bucket packs and unpacks are views of the grad
// buffers, the distributed optimizer works in this rank's shard of its
// buckets (as Megatron's DistributedOptimizer does), pipeline sends and
// receives get staging buffers, and everything else gets a transient.
// Stage 3 gives the transients their offsets (tessera/Memory/MemoryPlan.h).
//
//===----------------------------------------------------------------------===//

#include "LowerToRT.h"

#include "tessera/Memory/MemoryPlan.h"
#include "tessera/rt/math/SequenceLayout.h"

#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace tessera;

namespace tessera::lowering {

int64_t alignUp(int64_t bytes) { return memory::alignTo(bytes, kAlignment); }

MemRefType toMemRef(Type t) {
  auto tensor = cast<RankedTensorType>(t);
  return MemRefType::get(tensor.getShape(), tensor.getElementType());
}

int64_t byteSize(Type t) {
  auto shaped = cast<ShapedType>(t);
  return shaped.getNumElements() *
         (shaped.getElementType().getIntOrFloatBitWidth() / 8);
}

using MakeBuffer = std::function<void(StringRef name, Type type)>;

/// The buffer a phase argument or result is bound to ("" if none).
std::string bindingOf(DictionaryAttr attrs, int64_t chunk) {
  if (!attrs)
    return "";
  for (StringRef key : {kParamAttr, kInputAttr, kBufferAttr})
    if (auto a = attrs.getAs<StringAttr>(key))
      return a.getValue().str();
  if (auto g = attrs.getAs<StringAttr>(kGradOfAttr))
    return ("grad:" + g.getValue()).str();
  if (auto i = attrs.getAs<IntegerAttr>(kStashAttr))
    return ("stash:c" + Twine(chunk) + ":" + Twine(i.getInt())).str();
  return "";
}

/// The persistent buffer that holds the flat bucket `bucket` of a grad
/// buffer (a view of the gradients, or with the distributed optimizer of
/// the parameters), and the buffers of its parameters in buffer order.
std::string bucketView(dist::BucketData data, StringRef buffer,
                       int64_t bucket) {
  return ((data == dist::BucketData::Grad ? "gbuf:" : "pbuf:") + buffer + ":" +
          Twine(bucket))
      .str();
}
/// The distributed optimizer's shard of a bucket view ("gbuf:B:k" ->
/// "gshard:B:k", "pbuf:B:k" -> "pshard:B:k"): this rank's 1/dp of the
/// bucket, a rank-relative view (empty if `view` is not a bucket view).
std::string shardView(StringRef view) {
  if (view.starts_with("gbuf:"))
    return ("gshard:" + view.drop_front(5)).str();
  if (view.starts_with("pbuf:"))
    return ("pshard:" + view.drop_front(5)).str();
  return "";
}
SmallVector<std::string> bucketParts(Operation *op, FlatSymbolRefAttr ref,
                                     int64_t bucket, dist::BucketData data) {
  SmallVector<std::string> names;
  auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(op, ref);
  for (StringRef name : buf.getBucketParams(bucket))
    names.push_back(data == dist::BucketData::Grad ? ("grad:" + name).str()
                                                   : name.str());
  return names;
}

int64_t paramSyncId(Operation *from, StringRef buffer, int64_t bucket) {
  auto module = from->getParentOfType<ModuleOp>();
  int64_t id = 0;
  for (auto gb : module.getOps<dist::GradBufferOp>()) {
    if (gb.getSymName() == buffer)
      return id + bucket;
    id += int64_t(gb.getLayout().buckets.size());
  }
  return -1;
}

/// Whether `unpack` hands out the parameters of a ZeRO-3 bucket (a
/// `shard_params` grad buffer's).
bool shardsParams(dist::UnpackOp unpack) {
  if (unpack.getData() != dist::BucketData::Param)
    return false;
  auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
      unpack, unpack.getBufferAttr());
  return buf && buf.getShardParams();
}

Type bucketElementType(dist::GradBufferOp buffer, dist::BucketData data) {
  FloatDtype dtype = data == dist::BucketData::Grad ? buffer.getGradDtype()
                                                    : buffer.getParamDtype();
  Builder b(buffer.getContext());
  return floatDtypeType(b.getContext(), dtype);
}
//===----------------------------------------------------------------------===//
// PhasePlan
//===----------------------------------------------------------------------===//

StringRef PhasePlan::resultBinding(Value v) const {
  auto cached = bindings.find(v);
  return cached == bindings.end() ? StringRef() : StringRef(cached->second);
}

/// The first buffer among the persistent ones that `v` is returned into.
/// A distributed optimizer's group (a grad buffer's): "dp", "dp-cp" under
/// context parallelism, "edp" for the experts' buffer.
static bool isGradReduceGroup(StringRef group) {
  return group == "dp" || group == "dp-cp" || group == "edp";
}

static std::string findResultBinding(func::FuncOp func, int64_t chunk,
                                     const PersistentBuffers &buffers,
                                     Value v) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  for (OpOperand &use : v.getUses())
    if (use.getOwner() == ret) {
      std::string name =
          bindingOf(func.getResultAttrDict(use.getOperandNumber()), chunk);
      if (!name.empty() && buffers.lookup(name))
        return name;
    }
  return "";
}

bool PhasePlan::clobberable(Value v, Operation *op) {
  auto it = storageOf.find(v);
  if (it == storageOf.end())
    return false;
  Storage &s = storages[it->second];
  // Persistent inputs of the microbatch phase (params, data) are read-only.
  if (!s.persistent.empty() && !isStep)
    return false;
  for (Value shared : s.values)
    for (Operation *user : shared.getUsers())
      if (user != op && (isa<func::ReturnOp>(user) ||
                         op->isBeforeInBlock(user)))
        return false;
  return true;
}


PhasePlan::PhasePlan(func::FuncOp func, bool isStep, PersistentBuffers &buffers,
                     MakeBuffer makeBuffer, bool foldCasts)
    : func(func), isStep(isStep), buffers(buffers),
      foldCastsEnabled(foldCasts), makeBuffer(std::move(makeBuffer)) {
  chunk = chunkOf(func);
  if (auto program = func->getParentOfType<ModuleOp>())
    for (auto sched : program.getOps<dist::ScheduleOp>())
      sendsInFlight = sched.getKind() == dist::ScheduleKind::Zbv ||
                      sched.getKind() == dist::ScheduleKind::DualPipeV;
  // Bindings, read before emission rewrites the uses.
  Operation *ret = func.getBody().front().getTerminator();
  for (Value v : ret->getOperands())
    if (!bindings.count(v)) {
      std::string name = findResultBinding(func, chunk, buffers, v);
      if (!name.empty())
        bindings[v] = name;
    }
}

int PhasePlan::newStorage(Type type, StringRef persistentName) {
  storages.push_back(Storage{persistentName.str(), type, {}, INT64_MAX, -1, -1});
  int id = int(storages.size()) - 1;
  if (!persistentName.empty())
    storagesOfBuffer[persistentName].push_back(id);
  return id;
}

void PhasePlan::addScratch(Operation *op, Type type) {
  int id = newStorage(type);
  storages[id].scratch = true;
  storages[id].start = storages[id].end = position[op];
  scratchOf[op].push_back(id);
}

void PhasePlan::assign(Value v, int id) {
  storageOf[v] = id;
  storages[id].values.push_back(v);
  // A folded narrowing cast's result: the kernel's f32 result is stored
  // there too (the kernel writes it in the 16-bit format).
  if (auto c = v.getDefiningOp<nn::CastOp>(); c && narrowingFoldOf(c.getInput())) {
    storageOf[c.getInput()] = id;
    storages[id].values.push_back(c.getInput());
  }
}

/// The operands (bit i: operand i) and results a kernel loads or stores in
/// any float format (Opcodes.def's `h` operands of the activation kernels,
/// in the same order: the generic kernel lowering passes the operands then
/// the results).
static std::pair<unsigned, unsigned> anyFormatOperands(Operation *op) {
  if (isa<nn::AddOp>(op))
    return {0b11, 1};
  // The fused residual add + norm: the norm's result (the sum stays f32).
  if (isa<nn::AddLayerNormOp, nn::AddRMSNormOp>(op))
    return {0, 0b10};
  if (isa<nn::BiasAddOp, nn::BiasGeluOp, nn::LayerNormOp, nn::RMSNormOp,
          nn::SwiGLUOp>(op))
    return {1, 1};
  if (isa<nn::BiasGeluGradOp, nn::LayerNormGradOp, nn::RMSNormGradOp>(op))
    return {1, 0};
  // SwiGLU's backward stores dX in any format too; grouped-query
  // attention's repeat copies, and its backward sums in f32 and stores
  // once; dropout scales the kept values in f32 and stores once; RoPE
  // rotates in place (PhasePlan::foldCasts folds it only between a
  // widening and a narrowing cast of one format).
  if (isa<nn::SwiGLUGradOp, nn::RepeatKVOp, nn::RepeatKVGradOp, nn::DropoutOp,
          nn::RotaryEmbeddingOp>(op))
    return {1, 1};
  // The fused loss reads only its statistics: its logits operand orders it
  // for autodiff and reaches no kernel, in any format. The statistics load
  // the logits in any format, and their gradient stores dZ in any.
  if (isa<nn::CrossEntropyFromStatsOp, nn::LogitsStatsOp, nn::LogitsMaxOp,
          nn::CrossEntropyStatsOp>(op))
    return {1, 0};
  if (isa<nn::CrossEntropyStatsGradOp>(op))
    return {1, 1};
  // The lookup copies a row of the table in any format (a bf16 parameter
  // with no f32 copy of the table), and the position add adds any.
  if (isa<nn::EmbeddingOp>(op))
    return {0b10, 1};
  if (isa<nn::AddPositionEmbeddingOp>(op))
    return {0b11, 1};
  // A 16-bit GEMM rounds its f32 result into its operands' format (Gemm's
  // `r` result; a biased linear adds the bias to the f32 product first).
  if (isa<nn::LinearOp, nn::MatmulOp>(op))
    return {0, 1};
  return {0, 0};
}

/// The ops whose kernel writes its result over operand 0 (planOp copies
/// the operand first when it is read later).
static bool runsInPlace(Operation *op) {
  return isa<dist::ReduceFromRegionOp, dist::AllReduceOp,
             dist::AllReduceStartOp, nn::ScaleOp, nn::ScaleByOp,
             nn::RotaryEmbeddingOp, nn::MaskColumnsOp>(op);
}

static Type elementTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getElementType();
}
static bool isF32(Value v) { return elementTypeOf(v).isF32(); }

/// Whether `op`'s result `r` may be stored as `format` by the kernel itself:
/// an any-format result, and a GEMM's only in its operands' format.
static bool storesFormat(OpResult r, Type format) {
  Operation *op = r.getOwner();
  if (r.getResultNumber() >= 32 ||
      !(anyFormatOperands(op).second >> r.getResultNumber() & 1))
    return false;
  if (isa<nn::LinearOp, nn::MatmulOp>(op))
    return elementTypeOf(op->getOperand(0)) == format &&
           elementTypeOf(op->getOperand(1)) == format;
  return true;
}

int64_t PhasePlan::storedBytes(Operation *op) const {
  if (foldedCasts.contains(op))
    return 0;
  int64_t bytes = 0;
  auto add = [&](Value v) {
    auto shaped = dyn_cast<ShapedType>(v.getType());
    if (!shaped || !shaped.hasStaticShape())
      return;
    Type element = shaped.getElementType();
    if (auto it = storageOf.find(v); it != storageOf.end())
      if (auto stored = dyn_cast<ShapedType>(storages[size_t(it->second)].type))
        element = stored.getElementType();
    bytes += shaped.getNumElements() * (element.getIntOrFloatBitWidth() / 8);
  };
  for (Value v : op->getOperands())
    add(v);
  for (Value v : op->getResults())
    add(v);
  return bytes;
}

void PhasePlan::foldCasts() {
  auto foldable = [&](nn::CastOp c) {
    return !bucketPart.count(c.getResult());
  };
  // A narrowing cast may take the kernel's result: not into a gradient
  // buffer, where the cast would accumulate.
  auto narrowingBinding = [&](Value out) {
    StringRef binding = resultBinding(out);
    return binding.empty() || binding.starts_with("stash:");
  };
  // An in-place kernel (of the any-format ones, RoPE) loads and stores one
  // storage, so it takes a
  // 16-bit one only as a round trip: its input widened from a format by a
  // cast that it alone reads, its result narrowed back to that format by
  // its only reader into a transient; both casts fold, or neither.
  auto roundTrip = [&](Operation *kernel) {
    auto widen = kernel->getOperand(0).getDefiningOp<nn::CastOp>();
    Value r = kernel->getResult(0);
    if (!widen || !foldable(widen) || isF32(widen.getInput()) ||
        !widen.getResult().hasOneUse() ||
        !resultBinding(widen.getResult()).empty() || !r.hasOneUse())
      return false;
    auto narrow = dyn_cast<nn::CastOp>(*r.getUsers().begin());
    return narrow && foldable(narrow) &&
           elementTypeOf(narrow.getResult()) ==
               elementTypeOf(widen.getInput()) &&
           resultBinding(narrow.getResult()).empty();
  };
  for (Operation *op : ops) {
    auto c = dyn_cast<nn::CastOp>(op);
    if (!c || !foldable(c))
      continue;
    Value in = c.getInput(), out = c.getResult();
    // Widening: every reader of the f32 copy loads the 16-bit value
    // itself (not a value bound to a buffer: a gradient, a saved copy).
    if (!isF32(in) && isF32(out) && resultBinding(out).empty() &&
        !out.use_empty() && llvm::all_of(out.getUses(), [&](OpOperand &use) {
          unsigned n = use.getOperandNumber();
          return n < 32 &&
                 (anyFormatOperands(use.getOwner()).first >> n & 1) &&
                 (!runsInPlace(use.getOwner()) || roundTrip(use.getOwner()));
        })) {
      foldedCasts.insert(op);
      continue;
    }
    // Narrowing: the kernel's f32 result is read by this cast alone, which
    // rounds it as the kernel's store would.
    auto produced = dyn_cast<OpResult>(in);
    if (isF32(in) && !isF32(out) && produced && in.hasOneUse() &&
        narrowingBinding(out) && storesFormat(produced, elementTypeOf(out)) &&
        (!runsInPlace(produced.getOwner()) ||
         roundTrip(produced.getOwner()))) {
      foldedCasts.insert(op);
    }
  }
}

Operation *PhasePlan::narrowingFoldOf(Value v) const {
  if (!v.hasOneUse())
    return nullptr;
  Operation *user = *v.getUsers().begin();
  // (A folded cast of an f32 value is a narrowing one.)
  return isa<nn::CastOp>(user) && foldedCasts.contains(user) && isF32(v)
             ? user
             : nullptr;
}

OpOperand *PhasePlan::readAfter(ArrayRef<std::string> names, Operation *op) {
  SmallVector<int> ids;
  for (const std::string &name : names)
    if (auto it = storagesOfBuffer.find(name); it != storagesOfBuffer.end())
      ids.append(it->second.begin(), it->second.end());
  llvm::sort(ids); // in creation order, as a scan of every storage
  for (int id : ids) {
    Storage &st = storages[size_t(id)];
    for (Value v : st.values) {
      if (Operation *def = v.getDefiningOp(); def && !def->isBeforeInBlock(op))
        continue;
      for (OpOperand &use : v.getUses())
        if (use.getOwner() != op && op->isBeforeInBlock(use.getOwner()))
          return &use;
    }
  }
  return nullptr;
}

int PhasePlan::newP2PStorage(Type type, StringRef what) {
  std::string name = ("p2p." + what + ":" + func.getSymName() + ":" +
                      Twine(numP2P++)).str();
  makeBuffer(name, type);
  return newStorage(type, name);
}

int PhasePlan::shardStorageFor(StringRef name, Type t) {
  Persistent *shard = name.empty() ? nullptr : buffers.lookup(name);
  if (!shard)
    return -1;
  auto tensor = cast<RankedTensorType>(t);
  MemRefType view = shard->type;
  if (view.getNumElements() != tensor.getNumElements() ||
      view.getElementType() != tensor.getElementType())
    return -1;
  return newStorage(t, name);
}

bool PhasePlan::accumulates(Value result) const {
  return direct.contains(result) && !isStep &&
         resultBinding(result).starts_with("grad:");
}

LogicalResult PhasePlan::plan() {
  Block &body = func.getBody().front();
  int64_t index = 0;
  for (Operation &op : body) {
    position[&op] = index++;
    if (!isa<func::ReturnOp>(op))
      ops.push_back(&op);
  }

  // Arguments live in their persistent buffers.
  for (BlockArgument arg : body.getArguments()) {
    unsigned i = arg.getArgNumber();
    std::string name = bindingOf(func.getArgAttrDict(i), chunk);
    if (name.empty() || !buffers.lookup(name))
      return emitError(arg.getLoc())
             << "argument #" << i << " of '" << func.getSymName()
             << "' is bound to no buffer";
    assign(arg, newStorage(arg.getType(), name));
  }

  // ZeRO-2: each accumulating reduction's transient bucket, live from its
  // first gradient to its wait (a gradient its op writes nowhere else goes
  // straight into the bucket, at its layout offset: no copy), the
  // transient shard it is reduce-scattered into, live from the start to
  // the wait, and the persistent shard the wait adds that into.
  for (Operation *op : ops) {
    auto start = dyn_cast<dist::BucketReduceStartOp>(op);
    if (!start || !start.getAccumulate())
      continue;
    Operation *wait = nullptr;
    for (Operation *later = op->getNextNode(); later && !wait;
         later = later->getNextNode())
      if (auto w = dyn_cast<dist::BucketReduceWaitOp>(later);
          w && w.getBuffer() == start.getBuffer() &&
          w.getBucket() == start.getBucket())
        wait = later;
    if (!wait)
      return start.emitOpError() << "has no dist.bucket_reduce_wait";
    auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
        op, start.getBufferAttr());
    // (The bucket's own ranges: building the whole layout per bucket would
    // be quadratic in the buckets.)
    const buckets::Bucket k = buf.getBucket(start.getBucket());
    Type element = bucketElementType(buf, dist::BucketData::Grad);
    const int64_t elementBytes = element.getIntOrFloatBitWidth() / 8;
    llvm::StringMap<int64_t> startOf;
    SmallVector<std::string> names;
    for (const buckets::ParamRange &r : buf.getBucketParamRanges(start.getBucket())) {
      startOf[r.name] = r.start;
      names.push_back(r.name);
    }
    std::string shard =
        ("gshard:" + start.getBuffer() + ":" + Twine(start.getBucket())).str();
    Persistent *shardBuffer = buffers.lookup(shard);
    if (!shardBuffer)
      return start.emitOpError() << "accumulates into '" << shard
                                 << "', which is not a buffer of this program";
    auto transient = [&](int64_t numel) {
      int id = newStorage(RankedTensorType::get({numel}, element));
      storages[id].scratch = true;
      storages[id].start = position[op];
      storages[id].end = position[wait];
      return id;
    };
    int id = transient(k.end - k.start);
    bucketStorage[op] = id;
    shardStorage[op] = transient((k.end - k.start) / buf.getDp());
    MemRefType t = shardBuffer->type;
    accumulateStorage[op] = newStorage(
        RankedTensorType::get(t.getShape(), t.getElementType()), shard);
    for (auto [name, g] : llvm::zip(names, start.getGrads())) {
      Operation *def = g.getDefiningOp();
      if (!def || !g.hasOneUse() || def->getBlock() != op->getBlock() ||
          cast<RankedTensorType>(g.getType()).getElementType() != element)
        continue;
      storages[id].start = std::min(storages[id].start, position[def]);
      bucketPart[g] = {id, (startOf.lookup(name) - k.start) * elementBytes};
    }
  }
  if (foldCastsEnabled)
    foldCasts();
  for (Operation *op : ops)
    if (failed(planOp(op)))
      return failure();
  // Saved activations that alias a transient (an in-place or aliasing op's
  // result): the transient becomes the slot buffer, so no copy is needed.
  auto ret = func.getBody().front().getTerminator();
  llvm::StringSet<> taken;
  for (Storage &st : storages)
    if (!st.persistent.empty())
      taken.insert(st.persistent);
  for (Value v : ret->getOperands()) {
    StringRef binding = resultBinding(v);
    if (!binding.starts_with("stash:") || taken.contains(binding))
      continue;
    Storage &st = storages[storageOf.lookup(v)];
    // (A part of another transient, e.g. a view of a ZeRO-3 gathered
    // bucket, is copied into the slot at the return instead.)
    if (!st.persistent.empty() || st.scratch || st.parent >= 0)
      continue;
    st.persistent = binding.str();
    storagesOfBuffer[binding].push_back(storageOf.lookup(v));
    taken.insert(binding);
  }
  return success();
}

/// (The views it hands out are transients: an in-place kernel may write
/// one after its last reader. That is safe as long as every run of readers
/// gathers its bucket anew, as tessera-gather-params makes them: a
/// prefetched bucket shared by two runs would need its views kept.)
int PhasePlan::gatheredBucket(dist::UnpackOp unpack) {
  if (!shardsParams(unpack))
    return -1;
  auto it = storageOf.find(unpack.getInput());
  if (it == storageOf.end())
    return -1;
  const Storage &s = storages[size_t(it->second)];
  return s.persistent.empty() && !s.scratch && s.parent < 0 ? it->second : -1;
}

LogicalResult PhasePlan::planOp(Operation *op) {
  // A folded cast: a widening one's result is its input, read in the
  // 16-bit format; a narrowing one's was stored with its kernel's result.
  if (foldedCasts.contains(op)) {
    auto c = cast<nn::CastOp>(op);
    if (!narrowingFoldOf(c.getInput()))
      assign(c.getResult(), storageOf.lookup(c.getInput()));
    return success();
  }
  // Pipeline p2p: a received value goes straight to the slot of saved
  // activations when the backward needs it, else to a staging buffer of
  // its own; a send reads a staging buffer or a saved activation (never a
  // transient, which the next function may reuse while the send is in
  // flight; nor a receive buffer, which the next receive may overwrite).
  if (auto recv = dyn_cast<dist::RecvOp>(op)) {
    StringRef binding = resultBinding(recv.getResult());
    if (binding.starts_with("stash:")) {
      direct.insert(recv.getResult());
      assign(recv.getResult(), newStorage(recv.getType(), binding));
    } else {
      assign(recv.getResult(), newP2PStorage(recv.getType(), "recv"));
    }
    return success();
  }
  if (auto send = dyn_cast<dist::SendOp>(op)) {
    StringRef where = storages[storageOf.lookup(send.getInput())].persistent;
    // Under the V-shaped schedules a send stays in flight while later
    // phases run, which may take its slot: it always sends from a staging
    // buffer of its own (a saved activation is copied there too). A send
    // to the rank itself is copied into the executor's queue at once.
    bool inFlight = sendsInFlight && send.getPeer() != dist::Peer::Self;
    if ((!where.starts_with("stash:") || inFlight) &&
        !where.starts_with("p2p.send:"))
      sendCopy[op] = newP2PStorage(send.getInput().getType(), "send");
    return success();
  }
  // Buckets: a pack is the bucket's view of its parameters' buffers, an
  // unpack hands out those buffers; whatever is not already in place is
  // copied there.
  if (auto pack = dyn_cast<dist::PackOp>(op)) {
    std::string view = bucketView(pack.getData(), pack.getBuffer(), pack.getBucket());
    SmallVector<std::string> parts =
        bucketParts(op, pack.getBufferAttr(), pack.getBucket(), pack.getData());
    for (auto [i, operand] : llvm::enumerate(pack.getInputs()))
      if (storages[storageOf.lookup(operand)].persistent != parts[i])
        placeCopies[op].push_back(
            {int(i), newStorage(operand.getType(), parts[i])});
    direct.insert(pack.getResult());
    assign(pack.getResult(), newStorage(pack.getType(), view));
    return success();
  }
  if (auto start = dyn_cast<dist::BucketReduceStartOp>(op)) {
    int64_t numel = 0;
    auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
        op, start.getBufferAttr());
    const buckets::Bucket k = buf.getBucket(start.getBucket());
    numel = k.end - k.start;
    Type element = bucketElementType(buf, dist::BucketData::Grad);
    if (start.getAccumulate())
      return success(); // (ZeRO-2: its storages were planned in plan())
    bucketStorage[op] =
        newStorage(RankedTensorType::get({numel}, element),
                   bucketView(dist::BucketData::Grad, start.getBuffer(),
                              start.getBucket()));
    if (start.getKind() == dist::BucketReduceKind::ReduceScatter) {
      std::string shard = ("gshard:" + start.getBuffer() + ":" +
                           Twine(start.getBucket()))
                              .str();
      if (!buffers.lookup(shard))
        return start.emitOpError()
               << "reduce-scatters bucket " << start.getBucket() << " of @"
               << start.getBuffer()
               << ", which is not a distributed-optimizer buffer";
      MemRefType t = buffers.lookup(shard)->type;
      shardStorage[op] = newStorage(
          RankedTensorType::get(t.getShape(), t.getElementType()), shard);
    }
    return success();
  }
  if (isa<dist::BucketReduceWaitOp, dist::ParamSyncWaitOp>(op))
    return success();
  if (auto unpack = dyn_cast<dist::UnpackOp>(op)) {
    // ZeRO-3: a bucket a phase gathered (tessera-gather-params) unpacks
    // into views of the gathered transient, which then lives until the
    // last reader of any of them.
    if (shardsParams(unpack) && gatheredBucket(unpack) < 0)
      return unpack.emitOpError()
             << "unpacks the parameters of a ZeRO-3 bucket (shard_params) "
                "from a value that is not a gathered transient; only "
                "tessera-gather-params' all-gathers of the bucket's shard "
                "are";
    if (int parent = gatheredBucket(unpack); parent >= 0) {
      auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
          op, unpack.getBufferAttr());
      const buckets::Bucket k = buf.getBucket(unpack.getBucket());
      llvm::StringMap<int64_t> startOf;
      for (const buckets::ParamRange &r :
           buf.getBucketParamRanges(unpack.getBucket()))
        startOf[r.name] = r.start;
      const int64_t elementBytes =
          bucketElementType(buf, dist::BucketData::Param)
              .getIntOrFloatBitWidth() /
          8;
      for (auto [name, result] :
           llvm::zip(buf.getBucketParams(unpack.getBucket()),
                     unpack.getResults())) {
        int id = newStorage(result.getType());
        storages[id].parent = parent;
        storages[id].parentOffset = (startOf.lookup(name) - k.start) * elementBytes;
        assign(result, id);
      }
      return success();
    }
    std::string view =
        bucketView(unpack.getData(), unpack.getBuffer(), unpack.getBucket());
    SmallVector<std::string> parts = bucketParts(
        op, unpack.getBufferAttr(), unpack.getBucket(), unpack.getData());
    // The unpack overwrites the bucket's buffers: no value held there
    // before may be read after it.
    parts.push_back(view);
    if (OpOperand *use = readAfter(parts, op))
      return use->getOwner()->emitOpError()
             << "reads '" << storages[storageOf.lookup(use->get())].persistent
             << "' after a dist.unpack overwrote it; lower-to-rt keeps one "
                "copy of each parameter and gradient";
    parts.pop_back();
    if (storages[storageOf.lookup(unpack.getInput())].persistent != view)
      placeCopies[op].push_back(
          {-1, newStorage(unpack.getInput().getType(), view)});
    for (auto [i, result] : llvm::enumerate(unpack.getResults())) {
      direct.insert(result);
      assign(result, newStorage(result.getType(), parts[i]));
    }
    return success();
  }
  // The distributed optimizer works in its buffers, as Megatron's does:
  // a bucket's reduce-scatter leaves this rank's shard in place in the
  // gradient bucket, and this rank's block of the parameter bucket is
  // the shard itself (Adam updates it there; the all-gather then fills
  // the other ranks' blocks around it).
  if (auto rs = dyn_cast<dist::ReduceScatterOp>(op)) {
    std::string shard =
        shardView(storages[storageOf.lookup(rs.getInput())].persistent);
    if (isGradReduceGroup(rs.getGroup()) && rs.getDim() == 0 &&
        clobberable(rs.getInput(), op)) {
      if (int id = shardStorageFor(shard, rs.getType()); id >= 0) {
        assign(rs.getResult(), id);
        return success();
      }
    }
  }
  if (auto sc = dyn_cast<dist::ScatterToRegionOp>(op)) {
    std::string shard =
        shardView(storages[storageOf.lookup(sc.getInput())].persistent);
    auto pack = sc.getInput().getDefiningOp<dist::PackOp>();
    // Only when nothing else reads the parameters: the shard is updated
    // in place.
    bool onlyPacked =
        pack && sc.getInput().hasOneUse() &&
        llvm::all_of(pack.getInputs(), [&](Value v) {
          return llvm::all_of(v.getUsers(),
                              [&](Operation *u) { return u == pack; });
        });
    if (onlyPacked && isGradReduceGroup(sc.getGroup()) && sc.getDim().value_or(-1) == 0) {
      if (int id = shardStorageFor(shard, sc.getType()); id >= 0) {
        assign(sc.getResult(), id);
        aliasedScatter.insert(op);
        return success();
      }
    }
  }
  // ZeRO-3's prefetch: the gathered bucket is a transient from the start
  // on, which the wait's result then is.
  if (auto start = dyn_cast<dist::AllGatherStartOp>(op)) {
    assign(start.getResult(),
           newStorage(cast<dist::AsyncType>(start.getType()).getValueType()));
    return success();
  }
  // In-place kernels reuse operand 0's storage.
  bool aliasOnly = isa<dist::CopyToRegionOp, nn::AddAuxLossOp>(op);
  bool inPlace = runsInPlace(op);
  if (aliasOnly || isa<dist::WaitOp>(op)) {
    // ZeRO-3: a saved alias of a gathered parameter (sequence parallelism's
    // copy_to_region of a norm weight, kept for the backward) is copied
    // into its slot here; the gathered bucket does not live to the return.
    Value result = op->getResult(0);
    if (isa<dist::CopyToRegionOp>(op) &&
        storages[storageOf.lookup(op->getOperand(0))].parent >= 0 &&
        resultBinding(result).starts_with("stash:")) {
      direct.insert(result);
      assign(result, newStorage(result.getType(), resultBinding(result)));
      return success();
    }
    assign(result, storageOf.lookup(op->getOperand(0)));
    return success();
  }
  if (auto adam = dyn_cast<nn::AdamOp>(op)) {
    for (auto [operand, result] :
         llvm::zip(ValueRange{adam.getParam(), adam.getExpAvg(),
                              adam.getExpAvgSq()},
                   adam.getResults())) {
      if (!clobberable(operand, op))
        return op->emitOpError() << "updates a value that is read later; "
                                    "the optimizer must be its last reader";
      assign(result, storageOf.lookup(operand));
    }
    return success();
  }
  if (auto sgd = dyn_cast<nn::SgdMomentumOp>(op)) {
    for (auto [operand, result] :
         llvm::zip(ValueRange{sgd.getParam(), sgd.getMomentumBuffer()},
                   sgd.getResults())) {
      if (!clobberable(operand, op))
        return op->emitOpError() << "updates a value that is read later; "
                                    "the optimizer must be its last reader";
      assign(result, storageOf.lookup(operand));
    }
    return success();
  }
  if (auto sgd = dyn_cast<nn::SgdOp>(op)) {
    if (!clobberable(sgd.getParam(), op))
      return op->emitOpError() << "updates a value that is read later";
    assign(sgd.getResult(), storageOf.lookup(sgd.getParam()));
    return success();
  }
  if (inPlace) {
    Value in = op->getOperand(0);
    // Folded around (RoPE between a widening and a narrowing cast): the
    // kernel rounds into the 16-bit storage it read, which holds the
    // narrowing cast's result (or into a copy of it, below).
    if (Operation *c = narrowingFoldOf(op->getResult(0))) {
      if (clobberable(in, op)) {
        assign(c->getResult(0), storageOf.lookup(in));
        return success();
      }
    } else if (resultBinding(op->getResult(0)).empty() &&
               clobberable(in, op)) {
      assign(op->getResult(0), storageOf.lookup(in));
      return success();
    } else if (!resultBinding(op->getResult(0)).empty() &&
               storages[storageOf.lookup(in)].persistent ==
                   resultBinding(op->getResult(0)) &&
               clobberable(in, op)) {
      assign(op->getResult(0), storageOf.lookup(in));
      return success();
    }
    copyFirst.insert(op);
  }
  for (Value produced : op->getResults()) {
    // A result that a folded cast narrows is stored as the cast's result.
    Value result = produced;
    if (Operation *c = narrowingFoldOf(produced))
      result = c->getResult(0);
    if (auto part = bucketPart.find(result);
        part != bucketPart.end() && !inPlace && !aliasOnly &&
        !copyFirst.contains(op)) {
      int id = newStorage(result.getType());
      storages[id].parent = part->second.first;
      storages[id].parentOffset = part->second.second;
      assign(result, id);
      continue;
    }
    bucketPart.erase(result);
    StringRef binding = resultBinding(result);
    bool accumulate = !isStep && binding.starts_with("grad:");
    bool canAccumulate =
        isa<nn::MatmulOp, nn::ReduceRowsOp, nn::EmbeddingGradOp,
            nn::PositionEmbeddingGradOp, nn::CastOp>(op) ||
        (isa<nn::BiasGeluGradOp, nn::GroupedLinearGradOp>(op) &&
         result == op->getResult(1)) ||
        (isa<nn::LayerNormGradOp, nn::AddLayerNormGradOp, nn::RMSNormGradOp,
             nn::AddRMSNormGradOp, nn::QKNormGradOp>(op) &&
         result != op->getResult(0) &&
         llvm::all_of(op->getResults().drop_front(), [&](Value r) {
           return llvm::count_if(r.getUsers(), [](Operation *u) {
                    return !isa<dist::BucketReduceStartOp>(u);
                  }) == 1 &&
                  resultBinding(r).starts_with("grad:");
         }));
    // A bucket_reduce_start only orders itself after the gradient; it
    // reads the buffer, not the value.
    bool singleUse = llvm::count_if(result.getUsers(), [](Operation *u) {
                       return !isa<dist::BucketReduceStartOp>(u);
                     }) == 1;
    bool canWriteDirect =
        !binding.empty() && singleUse && !copyFirst.contains(op) &&
        (accumulate ? canAccumulate : !inPlace);
    if (canWriteDirect && !accumulate) {
      // Overwrite: only once nothing later reads the buffer's old value.
      for (int id : storagesOfBuffer.lookup(binding))
        for (Value v : storages[size_t(id)].values)
          for (Operation *user : v.getUsers())
            if (user != op && !user->isBeforeInBlock(op))
              canWriteDirect = false;
    }
    // A saved activation is written once, into its slot.
    if (binding.starts_with("stash:") && !copyFirst.contains(op))
      canWriteDirect = true;
    if (canWriteDirect) {
      direct.insert(result);
      assign(result, newStorage(result.getType(), binding));
      continue;
    }
    if (isa<dist::AsyncType>(result.getType()))
      continue;
    if (binding.empty() && !inPlace && result.hasOneUse())
      if (auto unpack = dyn_cast<dist::UnpackOp>(*result.getUsers().begin());
          unpack && !shardsParams(unpack)) {
        direct.insert(result);
        assign(result, newStorage(result.getType(),
                                  bucketView(unpack.getData(), unpack.getBuffer(),
                                             unpack.getBucket())));
        continue;
      }
    // The updated shard an all-gather puts into a parameter bucket is
    // written straight into this rank's block of it (bf16 parameters:
    // the cast of the fp32 main shard).
    // (Unless the bucket's old values are still read: the write
    // clobbers this rank's block of them.)
    if (binding.empty() && !inPlace && result.hasOneUse())
      if (auto ag = dyn_cast<dist::AllGatherOp>(*result.getUsers().begin());
          ag && isGradReduceGroup(ag.getGroup()) && ag.getDim() == 0 &&
          ag.getResult().hasOneUse())
        if (auto unpack =
                dyn_cast<dist::UnpackOp>(*ag.getResult().getUsers().begin())) {
          std::string view = bucketView(unpack.getData(), unpack.getBuffer(),
                                        unpack.getBucket());
          SmallVector<std::string> held = bucketParts(
              op, unpack.getBufferAttr(), unpack.getBucket(), unpack.getData());
          held.push_back(view);
          if (!readAfter(held, op))
            if (int id = shardStorageFor(shardView(view), result.getType());
                id >= 0) {
              assign(result, id);
              continue;
            }
        }
    if (binding.empty() && !inPlace && llvm::any_of(result.getUsers(), [](Operation *u) {
          return isa<dist::SendOp>(u);
        })) {
      assign(result, newP2PStorage(result.getType(), "send"));
      continue;
    }
    assign(result, newStorage(result.getType()));
  }
  // A cross-entropy with ignore_index runs as max, statistics and loss
  // kernels: three row vectors of scratch.
  bool statsPath = false;
  if (auto ce = dyn_cast<nn::SoftmaxCrossEntropyOp>(op))
    statsPath = ce.getIgnoreIndex().has_value();
  if (auto ce = dyn_cast<nn::SoftmaxCrossEntropyGradOp>(op))
    statsPath = ce.getIgnoreIndex().has_value();
  // A biased linear whose result a folded cast narrows: the f32 product in
  // scratch, which the bias add rounds into the 16-bit result (Megatron's
  // bf16 linear adds the bias before its one rounding too).
  if (auto linear = dyn_cast<nn::LinearOp>(op);
      linear && linear.getBias() && narrowingFoldOf(linear.getResult()))
    addScratch(op, linear.getResult().getType());
  if (statsPath) {
    auto z = cast<RankedTensorType>(op->getOperand(0).getType());
    auto rows = RankedTensorType::get(z.getShape().drop_back(),
                                      z.getElementType());
    for (int i = 0; i < 3; ++i)
      addScratch(op, rows);
  }

  // Ring attention's workspace: the K/V blocks in flight (and their
  // gradients, the running softmax statistics), live during the op only.
  int64_t ringFloats = 0;
  auto ringDims = [](RankedTensorType qkv, int64_t heads) {
    tessera::rt::math::RingAttentionDims d;
    d.seq = qkv.getDimSize(0);
    d.batch = qkv.getDimSize(1);
    d.heads = heads;
    d.headDim = qkv.getDimSize(2) / (3 * heads);
    return d;
  };
  if (auto ring = dyn_cast<dist::RingAttentionOp>(op))
    ringFloats = ringDims(ring.getQkv().getType(), ring.getNumHeads())
                     .forwardWorkspace();
  if (auto ring = dyn_cast<dist::RingAttentionGradOp>(op))
    ringFloats = ringDims(ring.getQkv().getType(), ring.getNumHeads())
                     .backwardWorkspace();
  // Expert parallelism's exchange stages the rows in a workspace as large
  // as the experts' side; with etp the combine receives etp partial rows
  // per row behind them.
  // (In the rows' dtype: bf16 under bf16 activations.)
  Type scratchElement = Float32Type::get(op->getContext());
  if (auto d = dyn_cast<dist::ExpertDispatchOp>(op)) {
    ringFloats = d.getResult().getType().getNumElements();
    scratchElement = d.getResult().getType().getElementType();
  }
  if (auto c = dyn_cast<dist::ExpertCombineOp>(op)) {
    ringFloats = c.getInput().getType().getNumElements() +
                 (c.getEtp() > 1
                      ? c.getEtp() * c.getResult().getType().getNumElements()
                      : 0);
    scratchElement = c.getInput().getType().getElementType();
  }
  // --tp-comm-overlap's reduce-scatter: two blocks of partial sums (one
  // computed while the other travels) and the block that arrives.
  if (auto f = dyn_cast<dist::MatmulReduceScatterOp>(op))
    ringFloats = 3 * f.getResult().getType().getNumElements();
  if (ringFloats > 0)
    addScratch(op, RankedTensorType::get({ringFloats}, scratchElement));

  return success();
}

//===----------------------------------------------------------------------===//
// Stage 3: the memory plan
//===----------------------------------------------------------------------===//

int64_t PhasePlan::planMemory(int64_t base) {
  // Live intervals of transient storages (scratch ones were set when
  // planned: the one op that uses them); a parent lives while any of its
  // parts does (ZeRO-3's gathered bucket, read through its parameters).
  int64_t retPos = position.size();
  for (Storage &s : storages) {
    if (s.parent < 0)
      continue;
    Storage &parent = storages[size_t(s.parent)];
    for (Value v : s.values)
      for (Operation *user : v.getUsers())
        parent.end = std::max(parent.end, isa<func::ReturnOp>(user)
                                              ? retPos
                                              : position[user]);
  }
  SmallVector<Storage *> transients;
  std::vector<memory::Interval> intervals;
  for (Storage &s : storages) {
    if (!s.persistent.empty() || (s.values.empty() && !s.scratch) ||
        s.parent >= 0)
      continue;
    for (Value v : s.values) {
      int64_t def = isa<BlockArgument>(v) ? 0 : position[v.getDefiningOp()];
      s.start = std::min(s.start, def);
      s.end = std::max(s.end, def);
      for (Operation *user : v.getUsers())
        s.end = std::max(s.end, isa<func::ReturnOp>(user) ? retPos
                                                          : position[user]);
    }
    transients.push_back(&s);
    intervals.push_back({s.start, s.end, byteSize(s.type)});
  }
  memory::Plan plan = memory::planTransients(intervals, kAlignment);
  for (auto [s, offset] : llvm::zip(transients, plan.offsets))
    s->offset = base + offset;
  for (Storage &s : storages)
    if (s.parent >= 0)
      s.offset = storages[size_t(s.parent)].offset + s.parentOffset;
  return plan.arenaBytes;
}

} // namespace tessera::lowering
