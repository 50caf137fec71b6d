//===- LowerToRT.cpp - Bufferize and lower to rt kernels ------------------===//
//
// Turns the tensor-level phase functions (microbatch, step) into rt entry
// functions over one per-rank arena:
//   1. persistent buffers (params, grads, optimizer state, inputs, loss,
//      iteration) from the functions' bindings, laid out 64-byte aligned;
//   2. a storage decision per tensor value in a forward walk: bound results
//      are written in place where safe (gradients accumulate with beta = 1),
//      in-place kernels (all-reduce, scale, optimizer steps) reuse their
//      operand's storage when no later op reads it, and everything else gets
//      a transient buffer;
//   3. a static memory plan for the transients: liveness intervals, then a
//      linear scan in program order with a coalescing first-fit free list;
//   4. one rt op per tensor op.
//
//===----------------------------------------------------------------------===//

#include "tessera/Conversion/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <functional>
#include <map>
#include <queue>

namespace tessera {
#define GEN_PASS_DEF_LOWERTORTPASS
#include "tessera/Conversion/Passes.h.inc"
} // namespace tessera

using namespace mlir;
using namespace tessera;

static constexpr int64_t kAlignment = 64;

static int64_t alignUp(int64_t v) {
  return (v + kAlignment - 1) / kAlignment * kAlignment;
}

static MemRefType toMemRef(Type t) {
  auto tensor = cast<RankedTensorType>(t);
  return MemRefType::get(tensor.getShape(), tensor.getElementType());
}

static int64_t byteSize(Type t) {
  auto shaped = cast<ShapedType>(t);
  return shaped.getNumElements() *
         (shaped.getElementType().getIntOrFloatBitWidth() / 8);
}

namespace {

/// A persistent buffer and its manifest attributes.
struct Persistent {
  std::string name, kind;
  MemRefType type;
  int64_t offset = 0;
  SmallVector<NamedAttribute> attrs;
};

/// Where a tensor value lives: a persistent buffer or a transient slot.
struct Storage {
  std::string persistent; // empty for transients
  Type type;
  SmallVector<Value> values; // values that share this storage
  int64_t start = INT64_MAX, end = -1;
  int64_t offset = -1;
  /// Scratch for a multi-kernel expansion: live only during one op.
  bool scratch = false;
};

/// Creates a persistent buffer for pipeline p2p staging (kind activation).
using MakeBuffer = std::function<void(StringRef name, Type type)>;

/// The buffer a phase argument or result is bound to ("" if none).
static std::string bindingOf(DictionaryAttr attrs, int64_t chunk) {
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
static std::string bucketView(StringRef data, StringRef buffer, int64_t bucket) {
  return ((data == "grad" ? "gbuf:" : "pbuf:") + buffer + ":" + Twine(bucket)).str();
}
/// The distributed optimizer's shard of a bucket view ("gbuf:B:k" ->
/// "gshard:B:k", "pbuf:B:k" -> "pshard:B:k"): this rank's 1/dp of the
/// bucket, a rank-relative view (empty if `view` is not a bucket view).
static std::string shardView(StringRef view) {
  if (view.starts_with("gbuf:"))
    return ("gshard:" + view.drop_front(5)).str();
  if (view.starts_with("pbuf:"))
    return ("pshard:" + view.drop_front(5)).str();
  return "";
}
static SmallVector<std::string> bucketParts(Operation *op, FlatSymbolRefAttr ref,
                                            int64_t bucket, StringRef data) {
  SmallVector<std::string> names;
  auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(op, ref);
  for (StringRef name : buf.getBucketParams(bucket))
    names.push_back(data == "grad" ? ("grad:" + name).str() : name.str());
  return names;
}

class PhaseLowering {
public:
  PhaseLowering(func::FuncOp func, bool isStep,
                llvm::StringMap<Persistent *> &persistent, MakeBuffer makeBuffer)
      : func(func), isStep(isStep), persistent(persistent),
        makeBuffer(std::move(makeBuffer)) {
    if (auto c = func->getAttrOfType<IntegerAttr>(kChunkAttr))
      chunk = c.getInt();
  }

  LogicalResult plan();
  int64_t planMemory(int64_t base);
  LogicalResult emit(OpBuilder &b, func::FuncOp target);

private:
  int newStorage(Type type, StringRef persistentName = "") {
    storages.push_back(Storage{persistentName.str(), type, {}, INT64_MAX, -1, -1});
    return storages.size() - 1;
  }
  void assign(Value v, int id) {
    storageOf[v] = id;
    storages[id].values.push_back(v);
  }
  /// True if no op after `op` reads the storage of `v`.
  bool clobberable(Value v, Operation *op);
  /// A use after `op` of a value that was stored in one of the persistent
  /// buffers `names` before it (null if none): what writing those buffers
  /// at `op` would clobber.
  OpOperand *readAfter(ArrayRef<std::string> names, Operation *op) {
    for (Storage &st : storages) {
      if (!llvm::is_contained(names, st.persistent))
        continue;
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
  /// The value bound to a persistent buffer that `v` is returned into.
  StringRef resultBinding(Value v);

  /// A p2p staging buffer of this phase.
  int newP2PStorage(Type type, StringRef what) {
    std::string name = ("p2p." + what + ":" + func.getSymName() + ":" +
                        Twine(numP2P++)).str();
    makeBuffer(name, type);
    return newStorage(type, name);
  }

  func::FuncOp func;
  bool isStep;
  llvm::StringMap<Persistent *> &persistent;
  MakeBuffer makeBuffer;
  int64_t chunk = -1;
  int numP2P = 0;
  /// Sends whose operand is first copied into a send buffer (storage id).
  DenseMap<Operation *, int> sendCopy;
  /// Copies into place before a pack (operand index, storage id) or an
  /// unpack (-1, storage id of the bucket view).
  DenseMap<Operation *, SmallVector<std::pair<int, int>>> placeCopies;
  /// The bucket view of a bucket_reduce_start (storage id), and for a
  /// reduce-scatter its shard buffer.
  DenseMap<Operation *, int> bucketStorage, shardStorage;
  /// scatter_to_region ops whose result is the rank's shard view of their
  /// input bucket: nothing to copy.
  DenseSet<Operation *> aliasedScatter;
  /// A storage on this rank's shard `name` of a bucket for a value of type
  /// `t`, or -1 if there is no such shard or it does not fit.
  int shardStorageFor(StringRef name, Type t) {
    auto it = persistent.find(name);
    if (name.empty() || it == persistent.end())
      return -1;
    auto tensor = cast<RankedTensorType>(t);
    MemRefType view = it->second->type;
    if (view.getNumElements() != tensor.getNumElements() ||
        view.getElementType() != tensor.getElementType())
      return -1;
    return newStorage(t, name);
  }
  SmallVector<Operation *> ops;
  DenseMap<Operation *, int64_t> position;
  DenseMap<Value, int> storageOf;
  SmallVector<Storage> storages;
  /// Results written directly into their bound buffer (with beta = 1 when
  /// accumulating).
  DenseSet<Value> direct;
  /// Ops whose operand 0 must be copied first (in-place op on a live value).
  DenseSet<Operation *> copyFirst;
  /// Scratch storages of ops that lower to several kernels.
  DenseMap<Operation *, SmallVector<int>> scratchOf;
};

} // namespace

StringRef PhaseLowering::resultBinding(Value v) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  for (OpOperand &use : v.getUses())
    if (use.getOwner() == ret) {
      std::string name =
          bindingOf(func.getResultAttrDict(use.getOperandNumber()), chunk);
      auto it = persistent.find(name);
      if (!name.empty() && it != persistent.end())
        return it->first();
    }
  return "";
}

bool PhaseLowering::clobberable(Value v, Operation *op) {
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

LogicalResult PhaseLowering::plan() {
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
    if (name.empty() || !persistent.count(name))
      return emitError(arg.getLoc())
             << "argument #" << i << " of '" << func.getSymName()
             << "' is bound to no buffer";
    assign(arg, newStorage(arg.getType(), name));
  }

  for (Operation *op : ops) {
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
      continue;
    }
    if (auto send = dyn_cast<dist::SendOp>(op)) {
      StringRef where = storages[storageOf.lookup(send.getInput())].persistent;
      if (!where.starts_with("stash:") && !where.starts_with("p2p.send:"))
        sendCopy[op] = newP2PStorage(send.getInput().getType(), "send");
      continue;
    }
    // Buckets: a pack is the bucket's view of its parameters' buffers, an
    // unpack hands out those buffers; whatever is not already in place is
    // copied there.
    if (auto pack = dyn_cast<dist::PackOp>(op)) {
      std::string view = bucketView(pack.getDataAttr().getValue(), pack.getBuffer(), pack.getBucket());
      SmallVector<std::string> parts =
          bucketParts(op, pack.getBufferAttr(), pack.getBucket(), pack.getDataAttr().getValue());
      for (auto [i, operand] : llvm::enumerate(pack.getInputs()))
        if (storages[storageOf.lookup(operand)].persistent != parts[i])
          placeCopies[op].push_back(
              {int(i), newStorage(operand.getType(), parts[i])});
      direct.insert(pack.getResult());
      assign(pack.getResult(), newStorage(pack.getType(), view));
      continue;
    }
    if (auto start = dyn_cast<dist::BucketReduceStartOp>(op)) {
      int64_t numel = 0;
      auto buf = SymbolTable::lookupNearestSymbolFrom<dist::GradBufferOp>(
          op, start.getBufferAttr());
      buckets::Buffer layout = buf.getLayout();
      const buckets::Bucket &k = layout.buckets[size_t(start.getBucket())];
      numel = k.end - k.start;
      Type element = buf.getGradDtype() == FloatDtype::BF16
                         ? Type(BFloat16Type::get(op->getContext()))
                         : Float32Type::get(op->getContext());
      bucketStorage[op] =
          newStorage(RankedTensorType::get({numel}, element),
                     bucketView("grad", start.getBuffer(), start.getBucket()));
      if (start.getKind() == dist::BucketReduceKind::ReduceScatter) {
        std::string shard = ("gshard:" + start.getBuffer() + ":" +
                             Twine(start.getBucket()))
                                .str();
        if (!persistent.count(shard))
          return start.emitOpError()
                 << "reduce-scatters bucket " << start.getBucket() << " of @"
                 << start.getBuffer()
                 << ", which is not a distributed-optimizer buffer";
        MemRefType t = persistent.lookup(shard)->type;
        shardStorage[op] = newStorage(
            RankedTensorType::get(t.getShape(), t.getElementType()), shard);
      }
      continue;
    }
    if (isa<dist::BucketReduceWaitOp>(op))
      continue;
    if (auto unpack = dyn_cast<dist::UnpackOp>(op)) {
      std::string view =
          bucketView(unpack.getDataAttr().getValue(), unpack.getBuffer(), unpack.getBucket());
      SmallVector<std::string> parts = bucketParts(
          op, unpack.getBufferAttr(), unpack.getBucket(), unpack.getDataAttr().getValue());
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
      continue;
    }
    // The distributed optimizer works in its buffers, as Megatron's does:
    // a bucket's reduce-scatter leaves this rank's shard in place in the
    // gradient bucket, and this rank's block of the parameter bucket is
    // the shard itself (Adam updates it there; the all-gather then fills
    // the other ranks' blocks around it).
    if (auto rs = dyn_cast<dist::ReduceScatterOp>(op)) {
      std::string shard =
          shardView(storages[storageOf.lookup(rs.getInput())].persistent);
      if (rs.getGroup() == "dp" && rs.getDim() == 0 &&
          clobberable(rs.getInput(), op)) {
        if (int id = shardStorageFor(shard, rs.getType()); id >= 0) {
          assign(rs.getResult(), id);
          continue;
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
      if (onlyPacked && sc.getGroup() == "dp" && sc.getDim().value_or(-1) == 0) {
        if (int id = shardStorageFor(shard, sc.getType()); id >= 0) {
          assign(sc.getResult(), id);
          aliasedScatter.insert(op);
          continue;
        }
      }
    }
    // In-place kernels reuse operand 0's storage.
    bool aliasOnly = isa<dist::CopyToRegionOp>(op);
    bool inPlace = isa<dist::ReduceFromRegionOp, dist::AllReduceOp,
                       dist::AllReduceStartOp, nn::ScaleOp>(op);
    if (aliasOnly || isa<dist::WaitOp>(op)) {
      assign(op->getResult(0), storageOf.lookup(op->getOperand(0)));
      continue;
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
      continue;
    }
    if (auto sgd = dyn_cast<nn::SgdOp>(op)) {
      if (!clobberable(sgd.getParam(), op))
        return op->emitOpError() << "updates a value that is read later";
      assign(sgd.getResult(), storageOf.lookup(sgd.getParam()));
      continue;
    }
    if (inPlace) {
      Value in = op->getOperand(0);
      if (resultBinding(op->getResult(0)).empty() && clobberable(in, op)) {
        assign(op->getResult(0), storageOf.lookup(in));
        continue;
      }
      if (!resultBinding(op->getResult(0)).empty() &&
          storages[storageOf.lookup(in)].persistent ==
              resultBinding(op->getResult(0)) &&
          clobberable(in, op)) {
        assign(op->getResult(0), storageOf.lookup(in));
        continue;
      }
      copyFirst.insert(op);
    }
    for (Value result : op->getResults()) {
      StringRef binding = resultBinding(result);
      bool accumulate = !isStep && binding.starts_with("grad:");
      bool canAccumulate =
          isa<nn::MatmulOp, nn::ReduceRowsOp, nn::EmbeddingGradOp,
              nn::PositionEmbeddingGradOp, nn::CastOp>(op) ||
          (isa<nn::LayerNormGradOp>(op) && result != op->getResult(0) &&
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
        for (Storage &s : storages)
          if (s.persistent == binding)
            for (Value v : s.values)
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
        if (auto unpack = dyn_cast<dist::UnpackOp>(*result.getUsers().begin())) {
          direct.insert(result);
          assign(result, newStorage(result.getType(),
                                    bucketView(unpack.getDataAttr().getValue(), unpack.getBuffer(),
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
            ag && ag.getGroup() == "dp" && ag.getDim() == 0 &&
            ag.getResult().hasOneUse())
          if (auto unpack =
                  dyn_cast<dist::UnpackOp>(*ag.getResult().getUsers().begin())) {
            std::string view = bucketView(unpack.getDataAttr().getValue(), unpack.getBuffer(),
                                          unpack.getBucket());
            SmallVector<std::string> held = bucketParts(
                op, unpack.getBufferAttr(), unpack.getBucket(), unpack.getDataAttr().getValue());
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
    if (statsPath) {
      auto z = cast<RankedTensorType>(op->getOperand(0).getType());
      auto rows = RankedTensorType::get(z.getShape().drop_back(),
                                        z.getElementType());
      for (int i = 0; i < 3; ++i) {
        int id = newStorage(rows);
        storages[id].scratch = true;
        storages[id].start = storages[id].end = position[op];
        scratchOf[op].push_back(id);
      }
    }
  }
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
    if (!st.persistent.empty() || st.scratch)
      continue;
    st.persistent = binding.str();
    taken.insert(binding);
  }
  return success();
}

int64_t PhaseLowering::planMemory(int64_t base) {
  // Live intervals of transient storages.
  int64_t retPos = position.size();
  for (Storage &s : storages) {
    if (!s.persistent.empty())
      continue;
    for (Value v : s.values) {
      int64_t def = isa<BlockArgument>(v) ? 0 : position[v.getDefiningOp()];
      s.start = std::min(s.start, def);
      s.end = std::max(s.end, def);
      for (Operation *user : v.getUsers())
        s.end = std::max(s.end, isa<func::ReturnOp>(user) ? retPos
                                                          : position[user]);
    }
  }
  SmallVector<Storage *> order;
  for (Storage &s : storages)
    if (s.persistent.empty() && (!s.values.empty() || s.scratch))
      order.push_back(&s);
  // Linear scan in program order with a first-fit free list, O(n log n):
  // transformers allocate saved activations in the forward and free them in
  // reverse in the backward, which first fit packs like a stack.
  llvm::stable_sort(order, [](Storage *a, Storage *b) {
    if (a->start != b->start)
      return a->start < b->start;
    return byteSize(a->type) > byteSize(b->type);
  });
  std::map<int64_t, int64_t> freeList; // offset -> size, coalesced
  auto release = [&](int64_t offset, int64_t size) {
    auto next = freeList.lower_bound(offset);
    if (next != freeList.end() && offset + size == next->first) {
      size += next->second;
      next = freeList.erase(next);
    }
    if (next != freeList.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += size;
        return;
      }
    }
    freeList[offset] = size;
  };
  using Live = std::pair<int64_t, Storage *>; // (end, storage)
  std::priority_queue<Live, std::vector<Live>, std::greater<Live>> live;
  int64_t top = 0;
  for (Storage *s : order) {
    while (!live.empty() && live.top().first < s->start) {
      Storage *dead = live.top().second;
      live.pop();
      release(dead->offset, alignUp(byteSize(dead->type)));
    }
    int64_t size = alignUp(byteSize(s->type));
    auto fit = llvm::find_if(freeList, [&](const std::pair<const int64_t, int64_t> &f) {
      return f.second >= size;
    });
    if (fit != freeList.end()) {
      s->offset = fit->first;
      int64_t rest = fit->second - size;
      int64_t restOffset = fit->first + size;
      freeList.erase(fit);
      if (rest > 0)
        freeList[restOffset] = rest;
    } else if (!freeList.empty() &&
               std::prev(freeList.end())->first +
                       std::prev(freeList.end())->second ==
                   top) {
      // Grow the free block at the top instead of leaving it as a hole.
      auto last = std::prev(freeList.end());
      s->offset = last->first;
      top = s->offset + size;
      freeList.erase(last);
    } else {
      s->offset = top;
      top += size;
    }
    live.push({s->end, s});
  }
  int64_t peak = top;
  for (Storage *s : order)
    s->offset += base;
  return peak;
}

LogicalResult PhaseLowering::emit(OpBuilder &b, func::FuncOp target) {
  Block *block = target.addEntryBlock();
  b.setInsertionPointToStart(block);
  Location loc = func.getLoc();

  // One memref per storage, created up front.
  DenseMap<int, Value> memrefs;
  llvm::StringMap<Value> gets;
  auto storageBuffer = [&](int id) -> Value {
    Storage &st = storages[id];
    if (!st.persistent.empty() && gets.count(st.persistent))
      return gets[st.persistent];
    auto [it, inserted] = memrefs.try_emplace(id, Value());
    if (inserted) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(block);
      Storage &s = storages[id];
      MemRefType type = toMemRef(s.type);
      if (!s.persistent.empty())
        it->second = rt::GetOp::create(b, loc, type,
                                       FlatSymbolRefAttr::get(b.getContext(),
                                                              s.persistent));
      else
        it->second = rt::AllocOp::create(b, loc, type,
                                         b.getI64IntegerAttr(s.offset));
      if (!s.persistent.empty())
        gets[s.persistent] = it->second;
    }
    return it->second;
  };
  auto bufferOf = [&](Value v) -> Value {
    return storageBuffer(storageOf.lookup(v));
  };
  auto scratchBuffer = [&](int id) -> Value {
    auto [it, inserted] = memrefs.try_emplace(id, Value());
    if (inserted) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(block);
      it->second = rt::AllocOp::create(b, loc, toMemRef(storages[id].type),
                                       b.getI64IntegerAttr(storages[id].offset));
    }
    return it->second;
  };
  auto f32 = [&](double v) { return b.getF32FloatAttr(v); };
  auto named = [&](StringRef n, Attribute a) { return b.getNamedAttr(n, a); };
  DenseMap<Value, Value> events;
  std::map<std::pair<StringRef, uint64_t>, Value> bucketEvents;
  DenseSet<Value> flushed;
  struct DeferredSend {
    Location loc;
    Value buffer;
    SmallVector<NamedAttribute> attrs;
  };
  SmallVector<DeferredSend> deferredSends;

  for (Operation *op : ops) {
    Location l = op->getLoc();
    auto acc = [&](Value r) { return direct.contains(r) && !isStep &&
                                     resultBinding(r).starts_with("grad:"); };
    if (copyFirst.contains(op))
      rt::CopyOp::create(b, l, TypeRange{},
                         ValueRange{bufferOf(op->getOperand(0)),
                                    bufferOf(op->getResult(0))},
                         ArrayRef<NamedAttribute>{});
    auto kernel = [&](auto tag, ValueRange operands,
                      ArrayRef<NamedAttribute> attrs = {}) {
      using OpTy = decltype(tag);
      SmallVector<Value> bufs;
      for (Value v : operands)
        bufs.push_back(bufferOf(v));
      OpTy::create(b, l, TypeRange{}, bufs, attrs);
    };
    // Kernels over explicit buffers (scratch included).
    auto kernelBufs = [&](auto tag, ValueRange bufs,
                          ArrayRef<NamedAttribute> attrs = {}) {
      using OpTy = decltype(tag);
      OpTy::create(b, l, TypeRange{}, bufs, attrs);
    };
    auto iattrs = [&](ArrayRef<int64_t> v) {
      return named("iattrs", b.getDenseI64ArrayAttr(v));
    };
    auto withGroup = [&](SmallVector<NamedAttribute> attrs, StringAttr group) {
      if (group)
        attrs.push_back(named("group", group));
      return attrs;
    };
    auto beta = [&](Value r) { return named("beta", f32(acc(r) ? 1 : 0)); };
    // A fused cross-entropy with ignore_index (operands 0 and 1: logits and
    // labels) runs as row max and statistics into its scratch first.
    auto statsPrologue = [&](int64_t ignore) {
      auto sc = scratchOf[op];
      Value z = bufferOf(op->getOperand(0)), t = bufferOf(op->getOperand(1));
      Value m = scratchBuffer(sc[0]), se = scratchBuffer(sc[1]),
            pl = scratchBuffer(sc[2]);
      kernelBufs(rt::LogitsMaxOp(), {z, m});
      kernelBufs(rt::CrossEntropyStatsOp(), {z, t, m, se, pl},
                 {iattrs({ignore})});
      return std::make_tuple(z, t, m, se, pl);
    };

    LogicalResult status =
        llvm::TypeSwitch<Operation *, LogicalResult>(op)
            .Case([&](nn::LinearOp o) {
              kernel(rt::GemmOp(), {o.getInput(), o.getWeight(), o.getResult()},
                     {named("trans_b", b.getUnitAttr())});
              if (o.getBias())
                kernel(rt::BiasAddOp(), {o.getResult(), o.getBias(), o.getResult()});
              return success();
            })
            .Case([&](nn::MatmulOp o) {
              SmallVector<NamedAttribute> attrs;
              if (o.getTransposeLhs())
                attrs.push_back(named("trans_a", b.getUnitAttr()));
              if (o.getTransposeRhs())
                attrs.push_back(named("trans_b", b.getUnitAttr()));
              attrs.push_back(named("beta", f32(acc(o.getResult()) ? 1 : 0)));
              kernel(rt::GemmOp(), {o.getLhs(), o.getRhs(), o.getResult()}, attrs);
              return success();
            })
            .Case([&](nn::GeluOp o) {
              kernel(rt::GeluOp(), {o.getInput(), o.getResult()});
              return success();
            })
            .Case([&](nn::ReluOp o) {
              kernel(rt::ReluOp(), {o.getInput(), o.getResult()});
              return success();
            })
            .Case([&](nn::GeluGradOp o) {
              kernel(rt::GeluGradOp(), {o.getInput(), o.getResultGrad(), o.getResult()});
              return success();
            })
            .Case([&](nn::ReluGradOp o) {
              kernel(rt::ReluGradOp(), {o.getInput(), o.getResultGrad(), o.getResult()});
              return success();
            })
            .Case([&](nn::AddOp o) {
              kernel(rt::AddOp(), {o.getLhs(), o.getRhs(), o.getResult()});
              return success();
            })
            .Case([&](nn::BiasAddOp o) {
              kernel(rt::BiasAddOp(), {o.getInput(), o.getBias(), o.getResult()});
              return success();
            })
            .Case([&](nn::ReduceRowsOp o) {
              kernel(rt::ReduceRowsOp(), {o.getInput(), o.getResult()},
                     {named("beta", f32(acc(o.getResult()) ? 1 : 0))});
              return success();
            })
            .Case([&](nn::SoftmaxCrossEntropyOp o) {
              if (auto ignore = o.getIgnoreIndex()) {
                auto [z, t, m, se, pl] = statsPrologue(*ignore);
                kernelBufs(rt::CrossEntropyFromStatsOp(),
                           {se, pl, m, t, bufferOf(o.getResult())},
                           {iattrs({int64_t(*ignore)})});
                return success();
              }
              kernel(rt::CrossEntropyOp(), {o.getLogits(), o.getLabels(), o.getResult()});
              return success();
            })
            .Case([&](nn::SoftmaxCrossEntropyGradOp o) {
              if (auto ignore = o.getIgnoreIndex()) {
                auto [z, t, m, se, pl] = statsPrologue(*ignore);
                kernelBufs(rt::CrossEntropyStatsGradOp(),
                           {z, t, m, se, bufferOf(o.getLossGrad()),
                            bufferOf(o.getResult())},
                           {iattrs({int64_t(*ignore)})});
                return success();
              }
              kernel(rt::CrossEntropyGradOp(),
                     {o.getLogits(), o.getLabels(), o.getLossGrad(), o.getResult()});
              return success();
            })
            .Case([&](nn::EmbeddingOp o) {
              kernel(rt::EmbeddingOp(), {o.getIds(), o.getTable(), o.getResult()},
                     withGroup({iattrs({int64_t(o.getVocabSize())})},
                               o.getVocabShardGroupAttr()));
              return success();
            })
            .Case([&](nn::EmbeddingGradOp o) {
              kernel(rt::EmbeddingGradOp(),
                     {o.getIds(), o.getResultGrad(), o.getResult()},
                     withGroup({beta(o.getResult())}, o.getVocabShardGroupAttr()));
              return success();
            })
            .Case([&](nn::AddPositionEmbeddingOp o) {
              kernel(rt::AddPositionEmbeddingOp(),
                     {o.getInput(), o.getTable(), o.getResult()});
              return success();
            })
            .Case([&](nn::PositionEmbeddingGradOp o) {
              kernel(rt::PositionEmbeddingGradOp(),
                     {o.getResultGrad(), o.getResult()}, {beta(o.getResult())});
              return success();
            })
            .Case([&](nn::LayerNormOp o) {
              kernel(rt::LayerNormOp(),
                     {o.getInput(), o.getWeight(), o.getBias(), o.getResult()},
                     {named("value", o.getEpsAttr())});
              return success();
            })
            .Case([&](nn::LayerNormGradOp o) {
              kernel(rt::LayerNormGradOp(),
                     {o.getInput(), o.getWeight(), o.getResultGrad(),
                      o.getInputGrad(), o.getWeightGrad(), o.getBiasGrad()},
                     {named("value", o.getEpsAttr()), beta(o.getWeightGrad())});
              return success();
            })
            .Case([&](nn::AttentionOp o) {
              kernel(rt::AttentionOp(), {o.getQkv(), o.getResult()},
                     {iattrs({int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0})});
              return success();
            })
            .Case([&](nn::AttentionGradOp o) {
              kernel(rt::AttentionGradOp(),
                     {o.getQkv(), o.getResultGrad(), o.getResult()},
                     {iattrs({int64_t(o.getNumHeads()), o.getCausal() ? 1 : 0})});
              return success();
            })
            .Case([&](nn::TokenMeanOp o) {
              kernel(rt::TokenMeanOp(), {o.getInput(), o.getLabels(), o.getResult()},
                     {iattrs({int64_t(o.getIgnoreIndex())})});
              return success();
            })
            .Case([&](nn::TokenMeanGradOp o) {
              kernel(rt::TokenMeanGradOp(),
                     {o.getResultGrad(), o.getLabels(), o.getResult()},
                     {iattrs({int64_t(o.getIgnoreIndex())})});
              return success();
            })
            .Case([&](nn::DropoutOp o) {
              kernel(rt::DropoutOp(), {o.getInput(), o.getResult()},
                     withGroup({named("value", o.getRateAttr()),
                                iattrs({int64_t(o.getStream())})},
                               o.getSequenceShardGroupAttr()));
              return success();
            })
            .Case([&](nn::LogitsMaxOp o) {
              kernel(rt::LogitsMaxOp(), {o.getLogits(), o.getResult()});
              return success();
            })
            .Case([&](nn::CrossEntropyStatsOp o) {
              kernel(rt::CrossEntropyStatsOp(),
                     {o.getLogits(), o.getLabels(), o.getMax(), o.getSumExp(),
                      o.getPredicted()},
                     withGroup({iattrs({int64_t(o.getIgnoreIndex())})},
                               o.getVocabShardGroupAttr()));
              return success();
            })
            .Case([&](nn::CrossEntropyFromStatsOp o) {
              kernel(rt::CrossEntropyFromStatsOp(),
                     {o.getSumExp(), o.getPredicted(), o.getMax(), o.getLabels(),
                      o.getResult()},
                     {iattrs({int64_t(o.getIgnoreIndex())})});
              return success();
            })
            .Case([&](nn::CrossEntropyStatsGradOp o) {
              kernel(rt::CrossEntropyStatsGradOp(),
                     {o.getLogits(), o.getLabels(), o.getMax(), o.getSumExp(),
                      o.getLossGrad(), o.getResult()},
                     withGroup({iattrs({int64_t(o.getIgnoreIndex())})},
                               o.getVocabShardGroupAttr()));
              return success();
            })
            .Case([&](nn::MeanOp o) {
              kernel(rt::MeanOp(), {o.getInput(), o.getResult()});
              return success();
            })
            .Case([&](nn::MeanGradOp o) {
              kernel(rt::MeanGradOp(), {o.getResultGrad(), o.getResult()});
              return success();
            })
            .Case([&](nn::FillOp o) {
              kernel(rt::FillOp(), {o.getResult()},
                     {named("value", o.getValueAttr())});
              return success();
            })
            .Case([&](nn::CastOp o) {
              kernel(rt::CastOp(), {o.getInput(), o.getResult()},
                     {beta(o.getResult())});
              return success();
            })
            .Case([&](nn::ScaleOp o) {
              kernel(rt::ScaleOp(), {o.getInput(), o.getResult()},
                     {named("alpha", o.getFactorAttr())});
              return success();
            })
            .Case([&](nn::AdamOp o) {
              rt::AdamOp::create(b, l, bufferOf(o.getParam()), bufferOf(o.getGrad()),
                                 bufferOf(o.getExpAvg()), bufferOf(o.getExpAvgSq()),
                                 bufferOf(o.getIteration()), o.getLrAttr(),
                                 o.getBeta1Attr(), o.getBeta2Attr(), o.getEpsAttr(),
                                 o.getWeightDecayAttr());
              return success();
            })
            .Case([&](nn::SgdOp o) {
              rt::SgdOp::create(b, l, bufferOf(o.getParam()), bufferOf(o.getGrad()),
                                o.getLrAttr(), o.getWeightDecayAttr());
              return success();
            })
            .Case([&](dist::CopyToRegionOp) { return success(); })
            .Case([&](dist::BucketReduceStartOp o) {
              // This microbatch's contributions must be in the buffer first.
              for (Value g : o.getGrads()) {
                StringRef binding = resultBinding(g);
                if (binding.empty() || direct.contains(g) ||
                    storages[storageOf.lookup(g)].persistent == binding ||
                    !flushed.insert(g).second)
                  continue;
                Value dst = gets.lookup(binding);
                if (!dst) {
                  OpBuilder::InsertionGuard guard(b);
                  b.setInsertionPointToStart(block);
                  dst = rt::GetOp::create(
                      b, loc, persistent.lookup(binding)->type,
                      FlatSymbolRefAttr::get(b.getContext(), binding));
                  gets[binding] = dst;
                }
                rt::AxpyOp::create(b, l, TypeRange{}, ValueRange{bufferOf(g), dst},
                                   ArrayRef<NamedAttribute>{});
              }
              Value view = storageBuffer(bucketStorage.lookup(op));
              kernelBufs(rt::ScaleOp(), {view, view},
                         {named("alpha", o.getScaleAttr())});
              if (o.getKind() == dist::BucketReduceKind::ReduceScatter)
                bucketEvents[{o.getBuffer(), o.getBucket()}] =
                    rt::ReduceScatterStartOp::create(
                        b, l, rt::EventType::get(b.getContext()), view,
                        storageBuffer(shardStorage.lookup(op)), o.getGroupAttr());
              else
                bucketEvents[{o.getBuffer(), o.getBucket()}] =
                    rt::AllReduceStartOp::create(b, l, rt::EventType::get(b.getContext()),
                                                 view, o.getGroupAttr(),
                                                 b.getStringAttr("sum"));
              return success();
            })
            .Case([&](dist::BucketReduceWaitOp o) -> LogicalResult {
              auto it = bucketEvents.find({o.getBuffer(), o.getBucket()});
              Value e = it == bucketEvents.end() ? Value() : it->second;
              if (!e)
                return o.emitOpError() << "waits for a bucket reduction that "
                                          "was not started";
              rt::WaitOp::create(b, l, e);
              return success();
            })
            .Case([&](dist::PackOp o) {
              for (auto [index, id] : placeCopies.lookup(op))
                kernelBufs(rt::CopyOp(),
                           {bufferOf(o.getInputs()[index]), storageBuffer(id)});
              return success();
            })
            .Case([&](dist::UnpackOp o) {
              for (auto [index, id] : placeCopies.lookup(op))
                kernelBufs(rt::CopyOp(), {bufferOf(o.getInput()), storageBuffer(id)});
              return success();
            })
            .Case([&](dist::SendOp o) {
              Value buf = bufferOf(o.getInput());
              if (auto it = sendCopy.find(op); it != sendCopy.end()) {
                Value staging = storageBuffer(it->second);
                rt::CopyOp::create(b, l, TypeRange{}, ValueRange{buf, staging},
                                   ArrayRef<NamedAttribute>{});
                buf = staging;
              }
              // Sends go last (the phase's send part): their buffers are
              // not written again in this phase.
              deferredSends.push_back(
                  {l, buf,
                   {iattrs({o.getPeer() == dist::Peer::Next ? 1 : -1, int64_t(o.getTag())}),
                    named("group", b.getStringAttr("pp"))}});
              return success();
            })
            .Case([&](dist::RecvOp o) {
              kernel(rt::RecvOp(), {o.getResult()},
                     {iattrs({o.getPeer() == dist::Peer::Next ? 1 : -1, int64_t(o.getTag())}),
                      named("group", b.getStringAttr("pp"))});
              return success();
            })
            .Case([&](dist::ReduceFromRegionOp o) {
              rt::AllReduceOp::create(b, l, bufferOf(o.getResult()), o.getGroupAttr(),
                                      b.getStringAttr("sum"));
              return success();
            })
            .Case([&](dist::AllReduceOp o) {
              rt::AllReduceOp::create(b, l, bufferOf(o.getResult()), o.getGroupAttr(),
                                      o.getReductionAttr());
              return success();
            })
            .Case([&](dist::AllReduceStartOp o) {
              Value buf = bufferOf(o.getInput());
              events[o.getResult()] = rt::AllReduceStartOp::create(
                  b, l, rt::EventType::get(b.getContext()), buf, o.getGroupAttr(),
                  o.getReductionAttr());
              return success();
            })
            .Case([&](dist::WaitOp o) -> LogicalResult {
              Value e = events.lookup(o.getFuture());
              if (!e)
                return o.emitOpError() << "waits on a collective lower-to-rt "
                                          "cannot lower";
              rt::WaitOp::create(b, l, e);
              return success();
            })
            .Case([&](dist::ScatterToRegionOp o) -> LogicalResult {
              if (aliasedScatter.contains(op)) // the shard view itself
                return success();
              // Keep this rank's block: a copy from a group-indexed offset.
              if (o.getDim().value_or(o.getInput().getType().getRank() - 1) != 0)
                return o.emitOpError() << "lower-to-rt supports dim 0 only";
              kernel(rt::CopyOp(), {o.getInput(), o.getResult()},
                     {named("group", o.getGroupAttr())});
              return success();
            })
            .Case([&](dist::GatherFromRegionOp o) -> LogicalResult {
              if (o.getDim().value_or(o.getInput().getType().getRank() - 1) != 0)
                return o.emitOpError() << "lower-to-rt supports dim 0 only";
              rt::AllGatherOp::create(b, l, bufferOf(o.getInput()),
                                      bufferOf(o.getResult()), o.getGroupAttr());
              return success();
            })
            .Case([&](dist::AllGatherOp o) -> LogicalResult {
              if (o.getDim() != 0)
                return o.emitOpError() << "lower-to-rt supports dim 0 only";
              rt::AllGatherOp::create(b, l, bufferOf(o.getInput()),
                                      bufferOf(o.getResult()), o.getGroupAttr());
              return success();
            })
            .Case([&](dist::ReduceScatterOp o) -> LogicalResult {
              if (o.getDim() != 0)
                return o.emitOpError() << "lower-to-rt supports dim 0 only";
              rt::ReduceScatterOp::create(b, l, bufferOf(o.getInput()),
                                          bufferOf(o.getResult()), o.getGroupAttr());
              return success();
            })
            .Default([&](Operation *o) -> LogicalResult {
              return o->emitOpError() << "cannot be lowered to rt";
            });
    if (failed(status))
      return failure();
  }

  // Bound results that were not written in place.
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  for (OpOperand &operand : ret->getOpOperands()) {
    Value v = operand.get();
    StringRef binding = resultBinding(v);
    if (binding.empty() || direct.contains(v) || flushed.contains(v) ||
        storages[storageOf.lookup(v)].persistent == binding)
      continue;
    Persistent *p = persistent.lookup(binding);
    Value dst = gets.lookup(binding);
    if (!dst) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(block);
      dst = rt::GetOp::create(b, loc, p->type,
                              FlatSymbolRefAttr::get(b.getContext(), binding));
    }
    bool accumulate = !isStep && binding.starts_with("grad:");
    if (accumulate)
      rt::AxpyOp::create(b, loc, TypeRange{}, ValueRange{bufferOf(v), dst},
                         ArrayRef<NamedAttribute>{});
    else
      rt::CopyOp::create(b, loc, TypeRange{}, ValueRange{bufferOf(v), dst},
                         ArrayRef<NamedAttribute>{});
  }
  for (DeferredSend &send : deferredSends)
    rt::SendOp::create(b, send.loc, TypeRange{}, ValueRange{send.buffer},
                       send.attrs);
  func::ReturnOp::create(b, loc);
  return success();
}

/// Moves a phase's leading receives into `recv:<name>` and its trailing
/// sends into `send:<name>`, so a schedule can run them on their own
/// (`dist.run ... part`).
static LogicalResult splitP2PParts(func::FuncOp entry) {
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

namespace {
struct LowerToRTPass : tessera::impl::LowerToRTPassBase<LowerToRTPass> {
  void runOnOperation() override;
  LogicalResult lowerProgram(ModuleOp program);
};
} // namespace

void LowerToRTPass::runOnOperation() {
  ModuleOp root = getOperation();
  SmallVector<ModuleOp> programs = getPrograms(root);
  int64_t flops = 0;
  arenaBytes = 0;
  transientBytes = 0;
  for (ModuleOp program : programs) {
    if (failed(lowerProgram(program)))
      return signalPassFailure();
    flops += program->getAttrOfType<IntegerAttr>("rt.flops_per_step").getInt();
  }
  // Megatron reports model FLOPs per GPU: the pipeline ranks' average.
  root->setAttr("rt.flops_per_step",
                IntegerAttr::get(IntegerType::get(root.getContext(), 64),
                                 flops / int64_t(programs.size())));
}

LogicalResult LowerToRTPass::lowerProgram(ModuleOp module) {
  // The phases: the microbatch phase, or per pipeline chunk a forward and
  // a backward phase (in chunk order); then the step.
  SmallVector<func::FuncOp> phases;
  func::FuncOp step = getPhaseFunc(module, kStepPhase);
  for (auto f : module.getOps<func::FuncOp>())
    if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
        p && p.getValue() == kMicrobatchPhase)
      phases.push_back(f);
  for (StringRef phase : {kForwardPhase, kBackwardPhase})
    for (auto f : module.getOps<func::FuncOp>())
      if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr); p && p.getValue() == phase)
        phases.push_back(f);
  llvm::stable_sort(phases, [](func::FuncOp a, func::FuncOp b) {
    auto chunk = [](func::FuncOp f) {
      auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
      return c ? c.getInt() : -1;
    };
    return chunk(a) < chunk(b);
  });
  if (phases.empty() || !step)
    return emitError(module.getLoc())
           << "tessera-lower-to-rt needs the microbatch (or forward and "
              "backward) and step phases";
  bool pipeline = !getPhaseFunc(module, kMicrobatchPhase);
  // Mixed precision: the phase that creates the main parameters (run once).
  func::FuncOp init = getPhaseFunc(module, kInitPhase);

  // Slots per chunk, from the schedule: how many microbatches are in flight
  // (`slot`: the rank's pool shared by its chunks; `dist.chunk_slot`: a
  // region per chunk).
  std::map<int64_t, int64_t> numSlots, chunkSlots;
  SmallVector<dist::RunOp> scheduleRuns;
  if (pipeline) {
    auto schedules = module.getOps<dist::ScheduleOp>();
    if (schedules.empty())
      return emitError(module.getLoc())
             << "tessera-lower-to-rt needs the pipeline schedule (run "
                "tessera-pp-schedule)";
    for (auto run : (*schedules.begin()).getBody().front().getOps<dist::RunOp>()) {
      auto f = module.lookupSymbol<func::FuncOp>(run.getCallee());
      int64_t c = f->getAttrOfType<IntegerAttr>(kChunkAttr).getInt();
      numSlots[c] = std::max<int64_t>(numSlots[c], int64_t(run.getSlot()) + 1);
      int64_t own = int64_t(run.getSlot());
      if (auto a = run->getAttrOfType<IntegerAttr>(kChunkSlotAttr))
        own = a.getInt();
      chunkSlots[c] = std::max<int64_t>(chunkSlots[c], own + 1);
      scheduleRuns.push_back(run);
    }
  }
  auto chunkOf = [](func::FuncOp f) -> int64_t {
    auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
    return c ? c.getInt() : -1;
  };

  dist::MeshOp mesh = dist::lookupMesh(module);
  Builder b(module.getContext());

  // 1. Persistent buffers; those of a chunk (`chunk` >= 0) live in its slot
  //    region: its inputs and saved activations, one copy per slot.
  std::vector<std::unique_ptr<Persistent>> buffers;
  llvm::StringMap<Persistent *> byName;
  std::map<Persistent *, int64_t> slotChunk;
  auto add = [&](StringRef name, StringRef kind, Type tensorType,
                 SmallVector<NamedAttribute> attrs = {}) -> Persistent * {
    if (Persistent *p = byName.lookup(name))
      return p;
    buffers.push_back(std::make_unique<Persistent>(
        Persistent{name.str(), kind.str(), toMemRef(tensorType), 0, attrs}));
    byName[name] = buffers.back().get();
    return buffers.back().get();
  };

  // The distributed optimizer's shards: per bucket, this rank's 1/dp of
  // the gradients and of the parameters, as rank-relative views (placed
  // with the grad buffers below).
  for (auto gb : module.getOps<dist::GradBufferOp>()) {
    if (!gb.getDistributed())
      continue;
    buckets::Buffer layout = gb.getLayout();
    for (StringRef data : {"grad", "param"}) {
      StringRef dtype = data == "grad" ? gb.getGradDtypeAttr().getValue() : gb.getParamDtypeAttr().getValue();
      Type element = dtype == "bf16" ? Type(b.getBF16Type()) : b.getF32Type();
      for (auto [k, bucket] : llvm::enumerate(layout.buckets)) {
        int64_t numel = (bucket.end - bucket.start) / gb.getDp();
        add(shardView(bucketView(data, gb.getSymName(), k)), "view",
            RankedTensorType::get({numel}, element),
            {b.getNamedAttr("rank_group", b.getStringAttr("dp")),
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
      SmallVector<int64_t> global(tensor.getShape());
      SmallVector<NamedAttribute> attrs;
      if (auto sh = micro.getArgAttrOfType<DictionaryAttr>(i, kShardingAttr)) {
        int64_t dim = sh.getAs<IntegerAttr>("dim").getInt();
        auto axis = sh.getAs<StringAttr>("axis");
        std::string error;
        FailureOr<int64_t> size =
            mesh ? mesh.getGroupSize(axis.getValue(), error)
                 : FailureOr<int64_t>(1);
        global[dim] *= succeeded(size) ? *size : 1;
        attrs.push_back(b.getNamedAttr("shard_dim", b.getI64IntegerAttr(dim)));
        attrs.push_back(b.getNamedAttr("shard_axis", axis));
      }
      attrs.push_back(b.getNamedAttr("global_shape", b.getDenseI64ArrayAttr(global)));
      StringAttr init = micro.getArgAttrOfType<StringAttr>(i, kInitAttr);
      if (!init)
        init = b.getStringAttr(tensor.getRank() >= 2 ? "normal:0.02" : "zeros");
      attrs.push_back(b.getNamedAttr("init", init));
      add(name.getValue(), "param", type, attrs);
    }
  }
  for (func::FuncOp micro : phases)
    for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
      if (auto of = micro.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
        add(("grad:" + of.getValue()).str(), "grad", micro.getResultTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(of))});
  for (unsigned i = 0, e = step.getNumArguments(); i < e; ++i)
    if (auto bnd = step.getArgAttrOfType<StringAttr>(i, kBufferAttr)) {
      StringRef name = bnd.getValue();
      if (name == "iteration")
        add(name, "iteration", step.getArgumentTypes()[i]);
      else if (name.starts_with("gshard:")) // a shard view (above)
        continue;
      else if (name.starts_with("main:pbuf:")) // a distributed-optimizer shard
        add(name, "main_param", step.getArgumentTypes()[i]);
      else if (name.starts_with("main:")) // the fp32 copy of a bf16 parameter
        add(name, "main_param", step.getArgumentTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(
                                      b.getStringAttr(name.drop_front(5))))});
      else if (name.contains(':') && !name.starts_with("grad:"))
        add(name, "opt_state", step.getArgumentTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(
                                      b.getStringAttr(name.split(':').second)))});
    }
  // The vocabulary of token inputs, from the embedding (any chunk).
  std::optional<int64_t> vocab;
  for (func::FuncOp f : phases)
    f.walk([&](nn::EmbeddingOp e) { vocab = e.getVocabSize(); });
  if (auto v = getRootModule(module)->getAttrOfType<DictionaryAttr>("tessera.vocab"))
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
        for (Operation *user : micro.getArgument(i).getUsers())
          if (auto ce = dyn_cast<nn::SoftmaxCrossEntropyOp>(user)) {
            auto z = ce.getLogits().getType();
            attrs.push_back(b.getNamedAttr(
                "num_classes",
                b.getI64IntegerAttr(z.getDimSize(z.getRank() - 1))));
          }
      }
      Persistent *p = add(name.getValue(), "input", micro.getArgumentTypes()[i], attrs);
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
        add(bnd.getValue(), "loss", micro.getResultTypes()[i]);
  for (func::FuncOp f : phases)
    if (f->getAttrOfType<StringAttr>(kPhaseAttr).getValue() == kForwardPhase)
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        if (f.getResultAttr(i, kStashAttr)) {
          std::string name = bindingOf(f.getResultAttrDict(i), chunkOf(f));
          slotChunk[add(name, "activation", f.getResultTypes()[i])] = chunkOf(f);
        }

  // 2. Storage decisions (p2p staging buffers are created on the way).
  MakeBuffer makeBuffer = [&](StringRef name, Type type) {
    add(name, "activation", type);
  };
  std::vector<std::unique_ptr<PhaseLowering>> lowerings;
  for (func::FuncOp f : phases)
    lowerings.push_back(
        std::make_unique<PhaseLowering>(f, /*isStep=*/false, byName, makeBuffer));
  lowerings.push_back(
      std::make_unique<PhaseLowering>(step, /*isStep=*/true, byName, makeBuffer));
  if (init)
    lowerings.push_back(
        std::make_unique<PhaseLowering>(init, /*isStep=*/true, byName, makeBuffer));
  for (auto &l : lowerings)
    if (failed(l->plan()))
      return failure();

  // Layout: the grad buffers (Megatron's _ParamAndGradBuffer), then the
  // other shared persistent buffers, then each chunk's slot region. A grad
  // buffer is one flat region per (chunk, dtype) holding its parameters'
  // gradients at their layout offsets (with the distributed optimizer a
  // second one holds the parameters), with a view buffer per bucket on top
  // for the collectives.
  int64_t offset = 0;
  std::map<Persistent *, int64_t> fixed;
  for (auto gb : module.getOps<dist::GradBufferOp>()) {
    buckets::Buffer layout = gb.getLayout();
    for (StringRef data : {"grad", "param"}) {
      if (data == "param" && !gb.getDistributed())
        continue;
      StringRef dtype = data == "grad" ? gb.getGradDtypeAttr().getValue() : gb.getParamDtypeAttr().getValue();
      Type element = dtype == "bf16" ? Type(b.getBF16Type()) : b.getF32Type();
      int64_t elementBytes = element.getIntOrFloatBitWidth() / 8;
      int64_t base = offset;
      for (const buckets::ParamRange &p : layout.params) {
        std::string name = data == "grad" ? "grad:" + p.name : p.name;
        Persistent *q = byName.lookup(name);
        if (!q)
          return gb.emitOpError() << "lays out '" << p.name
                                  << "', which no phase of this program has";
        if (q->type.getElementType() != element ||
            q->type.getNumElements() != p.end - p.start)
          return gb.emitOpError() << "gives '" << p.name << "' " << p.end - p.start
                                  << " " << dtype << " elements, its buffer is "
                                  << q->type;
        fixed[q] = base + p.start * elementBytes;
      }
      for (auto [k, bucket] : llvm::enumerate(layout.buckets)) {
        std::string name = bucketView(data, gb.getSymName(), k);
        Persistent *view = add(name, "view",
                               RankedTensorType::get({bucket.end - bucket.start},
                                                     element));
        fixed[view] = base + bucket.start * elementBytes;
        if (Persistent *shard = byName.lookup(shardView(name)))
          fixed[shard] = fixed[view];
      }
      offset = alignUp(base + layout.numel * elementBytes);
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
  struct SlotRegion {
    int64_t base = 0, bytes = 0, slots = 0;
  };
  std::map<int64_t, SlotRegion> regions;
  // Each chunk's slot layout (offsets from its region's base).
  std::map<int64_t, int64_t> chunkBytes;
  for (auto &[c, slots] : numSlots)
    for (auto &p : buffers)
      if (auto it = slotChunk.find(p.get()); it != slotChunk.end() && it->second == c) {
        p->offset = chunkBytes[c];
        chunkBytes[c] = alignUp(chunkBytes[c] + byteSize(p->type));
      }
  // One pool sized by the largest chunk, or a region per chunk, whichever
  // is smaller: chunks of very different sizes (the last one holds the
  // logits) are better apart.
  SlotRegion pool;
  int64_t separate = 0;
  for (auto &[c, slots] : numSlots) {
    pool.bytes = std::max(pool.bytes, chunkBytes[c]);
    pool.slots = std::max(pool.slots, slots);
    separate += chunkBytes[c] * chunkSlots[c];
  }
  bool pooled = pool.bytes * pool.slots <= separate;
  for (auto &[c, slots] : numSlots) {
    SlotRegion r = pool;
    r.base = offset;
    if (!pooled) {
      r.bytes = chunkBytes[c];
      r.slots = chunkSlots[c];
      offset += r.bytes * r.slots;
    }
    regions[c] = r;
  }
  if (pooled)
    offset += pool.bytes * pool.slots;
  for (auto &p : buffers)
    if (auto it = slotChunk.find(p.get()); it != slotChunk.end())
      p->offset += regions[it->second].base;
  if (!pooled)
    for (dist::RunOp run : scheduleRuns)
      if (auto a = run->getAttrOfType<IntegerAttr>(kChunkSlotAttr))
        run.setSlot(a.getInt());
  for (auto &[p, c] : slotChunk)
    if (!regions.count(c))
      return emitError(module.getLoc())
             << "chunk " << c << " has buffers but no step in the schedule";
  int64_t persistentBytes = offset;

  // The model FLOPs of one step on this rank, from each op's cost.
  auto phaseFlops = [](func::FuncOp f) {
    int64_t flops = 0;
    f.walk([&](CostOpInterface op) { flops += op.getFlops(); });
    return flops;
  };
  int64_t flopsPerStep = phaseFlops(step);
  for (func::FuncOp f : phases)
    if (!f->hasAttr(kLastMicrobatchAttr)) // a variant of another phase
      flopsPerStep += phaseFlops(f) * getNumMicrobatches(module);

  // 3. Memory plans: all phases share the transient region (they never run
  //    at once).
  int64_t transient = 0;
  for (auto &l : lowerings)
    transient = std::max(transient, l->planMemory(persistentBytes));

  // 4. Emit.
  OpBuilder builder(module.getContext());
  builder.setInsertionPoint(phases.front());
  for (auto &p : buffers) {
    SmallVector<NamedAttribute> attrs{
        builder.getNamedAttr("sym_name", builder.getStringAttr(p->name)),
        builder.getNamedAttr("type", TypeAttr::get(p->type)),
        builder.getNamedAttr("kind", builder.getStringAttr(p->kind)),
        builder.getNamedAttr("offset", builder.getI64IntegerAttr(p->offset))};
    auto op = rt::BufferOp::create(builder, phases.front().getLoc(), TypeRange{},
                                   ValueRange{}, attrs);
    for (NamedAttribute attr : p->attrs)
      op->setAttr(attr.getName(), attr.getValue());
  }
  builder.setInsertionPointAfter(step);
  SmallVector<func::FuncOp> sources(phases);
  sources.push_back(step);
  if (init)
    sources.push_back(init);
  for (auto [source, lowering] : llvm::zip(sources, lowerings)) {
    // The runtime runs "microbatch" and "step" by name; pipeline phases keep
    // theirs (forward_c<k>, backward_c<k>).
    std::string name = source.getSymName().str();
    if (StringRef phase = source->getAttrOfType<StringAttr>(kPhaseAttr).getValue();
        phase == kMicrobatchPhase || phase == kStepPhase || phase == kInitPhase)
      name = phase.str();
    // The last microbatch's variant (overlapped gradient reductions); a
    // backward variant is already named "<phase>:last".
    if (source->hasAttr(kLastMicrobatchAttr) && name == kMicrobatchPhase)
      name += ":last";
    auto entry = func::FuncOp::create(builder, source.getLoc(), name,
                                      builder.getFunctionType({}, {}));
    entry->setAttr("rt.entry", builder.getUnitAttr());
    entry->setAttr(kPhaseAttr, source->getAttr(kPhaseAttr));
    if (int64_t c = chunkOf(source); c >= 0) {
      entry->setAttr("rt.chunk", builder.getI64IntegerAttr(c));
      SlotRegion r = regions[c];
      entry->setAttr("rt.slot_base", builder.getI64IntegerAttr(r.base));
      entry->setAttr("rt.slot_bytes", builder.getI64IntegerAttr(r.bytes));
      entry->setAttr("rt.num_slots", builder.getI64IntegerAttr(r.slots));
    }
    if (failed(lowering->emit(builder, entry)) || failed(splitP2PParts(entry)))
      return failure();
    builder.setInsertionPointToEnd(module.getBody());
  }
  for (func::FuncOp f : sources)
    f.erase();

  module->setAttr("rt.arena_bytes",
                  builder.getI64IntegerAttr(persistentBytes + transient));
  module->setAttr("rt.persistent_bytes", builder.getI64IntegerAttr(persistentBytes));
  module->setAttr("rt.flops_per_step", builder.getI64IntegerAttr(flopsPerStep));
  arenaBytes = std::max<uint64_t>(arenaBytes.getValue(), persistentBytes + transient);
  transientBytes = std::max<uint64_t>(transientBytes.getValue(), transient);
  return success();
}
