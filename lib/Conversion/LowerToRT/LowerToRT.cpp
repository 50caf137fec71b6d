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
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/TypeSwitch.h"

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

class PhaseLowering {
public:
  PhaseLowering(func::FuncOp func, bool isStep,
                llvm::StringMap<Persistent *> &persistent)
      : func(func), isStep(isStep), persistent(persistent) {}

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
  /// The value bound to a persistent buffer that `v` is returned into.
  StringRef resultBinding(Value v);

  func::FuncOp func;
  bool isStep;
  llvm::StringMap<Persistent *> &persistent;
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
      unsigned i = use.getOperandNumber();
      if (auto b = func.getResultAttrOfType<StringAttr>(i, kBufferAttr))
        return b.getValue();
      if (auto g = func.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
        return persistent.find(("grad:" + g.getValue()).str())->first();
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
    std::string name;
    unsigned i = arg.getArgNumber();
    if (auto p = func.getArgAttrOfType<StringAttr>(i, kParamAttr))
      name = p.getValue().str();
    else if (auto in = func.getArgAttrOfType<StringAttr>(i, kInputAttr))
      name = in.getValue().str();
    else if (auto bnd = func.getArgAttrOfType<StringAttr>(i, kBufferAttr))
      name = bnd.getValue().str();
    if (name.empty() || !persistent.count(name))
      return emitError(arg.getLoc())
             << "argument #" << i << " of '" << func.getSymName()
             << "' is bound to no buffer";
    assign(arg, newStorage(arg.getType(), name));
  }

  for (Operation *op : ops) {
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
              nn::PositionEmbeddingGradOp>(op) ||
          (isa<nn::LayerNormGradOp>(op) && result != op->getResult(0) &&
           llvm::all_of(op->getResults().drop_front(), [&](Value r) {
             return r.hasOneUse() &&
                    resultBinding(r).starts_with("grad:");
           }));
      bool canWriteDirect =
          !binding.empty() && result.hasOneUse() && !copyFirst.contains(op) &&
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
      if (canWriteDirect) {
        direct.insert(result);
        assign(result, newStorage(result.getType(), binding));
        continue;
      }
      if (isa<dist::AsyncType>(result.getType()))
        continue;
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
  auto bufferOf = [&](Value v) -> Value {
    int id = storageOf.lookup(v);
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
                           {iattrs({*ignore})});
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
                           {iattrs({*ignore})});
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
                     {iattrs({o.getIgnoreIndex()})});
              return success();
            })
            .Case([&](nn::TokenMeanGradOp o) {
              kernel(rt::TokenMeanGradOp(),
                     {o.getResultGrad(), o.getLabels(), o.getResult()},
                     {iattrs({o.getIgnoreIndex()})});
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
                     withGroup({iattrs({o.getIgnoreIndex()})},
                               o.getVocabShardGroupAttr()));
              return success();
            })
            .Case([&](nn::CrossEntropyFromStatsOp o) {
              kernel(rt::CrossEntropyFromStatsOp(),
                     {o.getSumExp(), o.getPredicted(), o.getMax(), o.getLabels(),
                      o.getResult()},
                     {iattrs({o.getIgnoreIndex()})});
              return success();
            })
            .Case([&](nn::CrossEntropyStatsGradOp o) {
              kernel(rt::CrossEntropyStatsGradOp(),
                     {o.getLogits(), o.getLabels(), o.getMax(), o.getSumExp(),
                      o.getLossGrad(), o.getResult()},
                     withGroup({iattrs({o.getIgnoreIndex()})},
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
    if (binding.empty() || direct.contains(v) ||
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
  func::ReturnOp::create(b, loc);
  return success();
}

namespace {
struct LowerToRTPass : tessera::impl::LowerToRTPassBase<LowerToRTPass> {
  void runOnOperation() override;
};
} // namespace

void LowerToRTPass::runOnOperation() {
  ModuleOp module = getOperation();
  func::FuncOp micro = getPhaseFunc(module, kMicrobatchPhase);
  func::FuncOp step = getPhaseFunc(module, kStepPhase);
  if (!micro || !step) {
    emitError(module.getLoc()) << "tessera-lower-to-rt needs the microbatch "
                                  "and step phases";
    return signalPassFailure();
  }
  dist::MeshOp mesh = dist::lookupMesh(module);
  Builder b(module.getContext());

  // 1. Persistent buffers.
  std::vector<std::unique_ptr<Persistent>> buffers;
  llvm::StringMap<Persistent *> byName;
  auto add = [&](StringRef name, StringRef kind, Type tensorType,
                 SmallVector<NamedAttribute> attrs = {}) -> Persistent * {
    if (Persistent *p = byName.lookup(name))
      return p;
    buffers.push_back(std::make_unique<Persistent>(
        Persistent{name.str(), kind.str(), toMemRef(tensorType), 0, attrs}));
    byName[name] = buffers.back().get();
    return buffers.back().get();
  };

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
  for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
    if (auto of = micro.getResultAttrOfType<StringAttr>(i, kGradOfAttr))
      add(("grad:" + of.getValue()).str(), "grad", micro.getResultTypes()[i],
          {b.getNamedAttr("of", FlatSymbolRefAttr::get(of))});
  for (unsigned i = 0, e = step.getNumArguments(); i < e; ++i)
    if (auto bnd = step.getArgAttrOfType<StringAttr>(i, kBufferAttr)) {
      StringRef name = bnd.getValue();
      if (name == "iteration")
        add(name, "iteration", step.getArgumentTypes()[i]);
      else if (name.contains(':') && !name.starts_with("grad:"))
        add(name, "opt_state", step.getArgumentTypes()[i],
            {b.getNamedAttr("of", FlatSymbolRefAttr::get(
                                      b.getStringAttr(name.split(':').second)))});
    }
  for (unsigned i = 0, e = micro.getNumArguments(); i < e; ++i)
    if (auto name = micro.getArgAttrOfType<StringAttr>(i, kInputAttr)) {
      SmallVector<NamedAttribute> attrs;
      // Token inputs and their labels: the model's vocabulary, from the
      // embedding. Classification labels: the number of classes.
      std::optional<int64_t> vocab;
      micro.walk([&](nn::EmbeddingOp e) { vocab = e.getVocabSize(); });
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
      add(name.getValue(), "input", micro.getArgumentTypes()[i], attrs);
    }
  for (unsigned i = 0, e = micro.getNumResults(); i < e; ++i)
    if (auto bnd = micro.getResultAttrOfType<StringAttr>(i, kBufferAttr))
      add(bnd.getValue(), "loss", micro.getResultTypes()[i]);

  int64_t offset = 0;
  for (auto &p : buffers) {
    p->offset = offset;
    offset = alignUp(offset + byteSize(p->type));
  }
  int64_t persistentBytes = offset;

  // The model FLOPs of one step on this rank, from each op's cost.
  auto phaseFlops = [](func::FuncOp f) {
    int64_t flops = 0;
    f.walk([&](CostOpInterface op) { flops += op.getFlops(); });
    return flops;
  };
  int64_t flopsPerStep =
      phaseFlops(micro) * getNumMicrobatches(module) + phaseFlops(step);

  // 2-3. Storage decisions and memory plans for both phases.
  PhaseLowering microLowering(micro, /*isStep=*/false, byName);
  PhaseLowering stepLowering(step, /*isStep=*/true, byName);
  if (failed(microLowering.plan()) || failed(stepLowering.plan()))
    return signalPassFailure();
  int64_t transient = std::max(microLowering.planMemory(persistentBytes),
                               stepLowering.planMemory(persistentBytes));

  // 4. Emit.
  OpBuilder builder(module.getContext());
  builder.setInsertionPoint(micro);
  for (auto &p : buffers) {
    SmallVector<NamedAttribute> attrs{
        builder.getNamedAttr("sym_name", builder.getStringAttr(p->name)),
        builder.getNamedAttr("type", TypeAttr::get(p->type)),
        builder.getNamedAttr("kind", builder.getStringAttr(p->kind)),
        builder.getNamedAttr("offset", builder.getI64IntegerAttr(p->offset))};
    auto op = rt::BufferOp::create(builder, micro.getLoc(), TypeRange{},
                                   ValueRange{}, attrs);
    for (NamedAttribute attr : p->attrs)
      op->setAttr(attr.getName(), attr.getValue());
  }
  auto makeEntry = [&](StringRef name) {
    auto f = func::FuncOp::create(builder, micro.getLoc(), name,
                                  builder.getFunctionType({}, {}));
    f->setAttr("rt.entry", builder.getUnitAttr());
    return f;
  };
  builder.setInsertionPointAfter(step);
  func::FuncOp microEntry = makeEntry("microbatch");
  func::FuncOp stepEntry = makeEntry("step");
  if (failed(microLowering.emit(builder, microEntry)) ||
      failed(stepLowering.emit(builder, stepEntry)))
    return signalPassFailure();
  micro.erase();
  step.erase();

  module->setAttr("rt.arena_bytes",
                  builder.getI64IntegerAttr(persistentBytes + transient));
  module->setAttr("rt.persistent_bytes", builder.getI64IntegerAttr(persistentBytes));
  module->setAttr("rt.flops_per_step", builder.getI64IntegerAttr(flopsPerStep));
  arenaBytes = persistentBytes + transient;
  transientBytes = transient;
}
