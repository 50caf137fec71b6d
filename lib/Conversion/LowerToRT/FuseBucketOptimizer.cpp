//===- FuseBucketOptimizer.cpp - One optimizer kernel per bucket ----------===//
//
// After lower-to-rt: the per-parameter rt.adam / rt.sgd(_momentum) of a gradient
// bucket become one instruction over the bucket, on views of the regions
// that lower-to-rt laid out in the grad buffer's layout (PersistentBuffers:
// gradients, the tensors the optimizer updates and their state). Every
// condition is checked on the program itself (offsets, attributes, what runs
// between the updates), so a bucket that does not qualify keeps its
// per-parameter updates.
//
//===----------------------------------------------------------------------===//

#include "LowerToRT.h"

namespace tessera {
#define GEN_PASS_DEF_FUSEBUCKETOPTIMIZERPASS
#include "tessera/Conversion/Passes.h.inc"
} // namespace tessera

using namespace mlir;
using namespace tessera;

namespace {

struct FuseBucketOptimizerPass
    : tessera::impl::FuseBucketOptimizerPassBase<FuseBucketOptimizerPass> {
  void runOnOperation() override {
    for (ModuleOp program : getPrograms(getOperation()))
      fuseProgram(program);
  }

  /// The buffer an rt.get reads, or null.
  rt::BufferOp bufferOf(Value v) const {
    auto get = v.getDefiningOp<rt::GetOp>();
    return get ? byName.lookup(get.getBuffer()) : rt::BufferOp();
  }

  /// The program being rewritten: its buffers by name, the last of them
  /// (where new views go) and the step's rt.gets by buffer.
  llvm::StringMap<rt::BufferOp> byName;
  rt::BufferOp lastBuffer;
  llvm::StringMap<rt::GetOp> stepGets;
  /// The position of each op of the step as it was before the rewrites
  /// (isBeforeInBlock would renumber the block after every insertion).
  DenseMap<Operation *, int64_t> position;

  void fuseProgram(ModuleOp program) {
    byName.clear();
    stepGets.clear();
    for (auto buf : program.getOps<rt::BufferOp>()) {
      byName[buf.getSymName()] = buf;
      lastBuffer = buf;
    }
    func::FuncOp step;
    for (auto f : program.getOps<func::FuncOp>())
      if (auto phase = f->getAttrOfType<StringAttr>(kPhaseAttr);
          phase && phase.getValue() == "step")
        step = f;
    if (!step)
      return;
    for (auto get : step.getOps<rt::GetOp>())
      stepGets.try_emplace(get.getBuffer(), get);
    position.clear();
    int64_t n = 0;
    for (Operation &op : step.getBody().front())
      position[&op] = n++;
    // The update of each gradient buffer (a parameter's, by its grad).
    llvm::StringMap<SmallVector<Operation *>> updateOf;
    step.walk([&](Operation *op) {
      if (isa<rt::AdamOp, rt::SgdOp, rt::SgdMomentumOp>(op))
        if (rt::BufferOp g = bufferOf(op->getOperand(1)))
          updateOf[g.getSymName()].push_back(op);
    });
    for (auto gb : program.getOps<dist::GradBufferOp>()) {
      if (gb.getDistributed())
        continue;
      buckets::Buffer layout = gb.getLayout();
      llvm::StringMap<int64_t> startOf;
      for (const buckets::ParamRange &p : layout.params)
        startOf[p.name] = p.start;
      for (auto [k, bucket] : llvm::enumerate(layout.buckets))
        fuseBucket(program, gb, int64_t(k), bucket, startOf, updateOf);
    }
  }

  void fuseBucket(ModuleOp program, dist::GradBufferOp gb, int64_t k,
                  const buckets::Bucket &bucket,
                  const llvm::StringMap<int64_t> &startOf,
                  llvm::StringMap<SmallVector<Operation *>> &updateOf) {
    if (bucket.params.size() < 2)
      return;
    // The parameters must fill the bucket: a view over padding could cover
    // bytes of other buffers in the regions (a non-distributed buffer has
    // no padding; this checks it rather than assumes it).
    int64_t covered = 0;
    for (const std::string &name : bucket.params)
      if (auto it = updateOf.find("grad:" + name); it != updateOf.end())
        if (rt::BufferOp g = bufferOf(it->second.front()->getOperand(1)))
          if (auto type = dyn_cast<MemRefType>(g.getType()))
            covered += type.getNumElements();
    if (covered != bucket.end - bucket.start)
      return;
    SmallVector<Operation *> group;
    for (const std::string &name : bucket.params) {
      auto it = updateOf.find("grad:" + name);
      if (it == updateOf.end() || it->second.size() != 1)
        return;
      group.push_back(it->second.front());
    }
    if (group.size() != bucket.params.size() || group.empty())
      return;
    // One kind of update with the same hyper-parameters and iteration; the
    // weight decay is one value, or 0 (biases and norm weights: the fused
    // update's runs).
    Operation *first = group.front();
    auto decayOf = [](Operation *op) {
      if (auto a = dyn_cast<rt::AdamOp>(op))
        return a.getWeightDecay().convertToFloat();
      if (auto m = dyn_cast<rt::SgdMomentumOp>(op))
        return m.getWeightDecay().convertToFloat();
      return cast<rt::SgdOp>(op).getWeightDecay().convertToFloat();
    };
    float decay = 0.0f;
    for (Operation *op : group)
      decay = std::max(decay, decayOf(op));
    auto sameUpdate = [&](Operation *op) {
      if (op->getName() != first->getName() ||
          !op->getDiscardableAttrs().empty())
        return false;
      if (decayOf(op) != 0.0f && decayOf(op) != decay)
        return false;
      if (auto a = dyn_cast<rt::AdamOp>(op)) {
        auto f = cast<rt::AdamOp>(first);
        return !a.getRunsAttr() && !a.getGroupAttr() &&
               a.getIteration() == f.getIteration() &&
               a.getLrAttr() == f.getLrAttr() &&
               a.getBeta1Attr() == f.getBeta1Attr() &&
               a.getBeta2Attr() == f.getBeta2Attr() &&
               a.getEpsAttr() == f.getEpsAttr();
      }
      if (auto m = dyn_cast<rt::SgdMomentumOp>(op)) {
        auto f = cast<rt::SgdMomentumOp>(first);
        return !m.getRunsAttr() && !m.getGroupAttr() &&
               m.getLrAttr() == f.getLrAttr() &&
               m.getMomentumAttr() == f.getMomentumAttr();
      }
      auto g = cast<rt::SgdOp>(op), f = cast<rt::SgdOp>(first);
      return !g.getRunsAttr() && !g.getGroupAttr() &&
             g.getLrAttr() == f.getLrAttr();
    };
    if (!llvm::all_of(group, sameUpdate))
      return;
    // The parameters without weight decay, as runs of the bucket (one
    // shard: the whole bucket).
    SmallVector<std::pair<int64_t, int64_t>> noDecay;
    if (decay != 0.0f)
      for (auto [op, name] : llvm::zip(group, bucket.params))
        if (decayOf(op) == 0.0f) {
          auto type = cast<MemRefType>(bufferOf(op->getOperand(0)).getType());
          int64_t start = startOf.lookup(name) - bucket.start;
          noDecay.push_back({start, start + type.getNumElements()});
        }
    llvm::sort(noDecay);
    SmallVector<int64_t> runs;
    if (!noDecay.empty())
      runs.push_back(bucket.end - bucket.start);
    for (auto [b, e] : noDecay) {
      if (runs.size() > 1 && runs.back() == b)
        runs.back() = e;
      else
        runs.append({b, e});
    }
    // Each tensor operand (parameter, gradient, Adam state) of every
    // parameter at the same offset from its region's base: the bucket is
    // one range [base + start, base + end) of each region.
    unsigned numTensors = isa<rt::AdamOp>(first)           ? 4
                          : isa<rt::SgdMomentumOp>(first) ? 3
                                                          : 2;
    SmallVector<std::optional<int64_t>> bases(numTensors);
    llvm::DenseSet<Operation *> members(group.begin(), group.end());
    for (auto [op, name] : llvm::zip(group, bucket.params))
      for (unsigned t = 0; t < numTensors; ++t) {
        rt::BufferOp buf = bufferOf(op->getOperand(t));
        auto type = buf ? dyn_cast<MemRefType>(buf.getType()) : MemRefType();
        if (!type || !type.getElementType().isF32() || buf.getRankGroup())
          return;
        int64_t base = int64_t(buf.getOffset()) - startOf.lookup(name) * 4;
        if (bases[t] && *bases[t] != base)
          return;
        bases[t] = base;
      }
    // Nothing between the first and the last update may touch the
    // bucket's tensors: in the step, only other updates of the bucket, the
    // rt.gets and bf16 casts of the updated main parameters run there.
    for (Operation *op : group)
      if (!position.count(op)) // not at the top level of the step
        return;
    llvm::sort(group, [&](Operation *a, Operation *b) {
      return position.lookup(a) < position.lookup(b);
    });
    first = group.front();
    llvm::DenseSet<Value> updated;
    for (Operation *op : group)
      updated.insert(op->getOperand(0));
    for (Operation *op = first->getNextNode(); op != group.back();
         op = op->getNextNode()) {
      if (members.contains(op) || isa<rt::GetOp>(op))
        continue;
      if (isa<rt::CastOp>(op) && updated.contains(op->getOperand(0)) &&
          !updated.contains(op->getOperand(1)))
        continue;
      return;
    }
    // The views, declared with the other buffers.
    const bool momentum = isa<rt::SgdMomentumOp>(first);
    const char *const kRoles[] = {"param", "grad",
                                  momentum ? "momentum_buffer" : "exp_avg",
                                  "exp_avg_sq"};
    OpBuilder b(program.getContext());
    b.setInsertionPointAfter(lastBuffer);
    int64_t numel = bucket.end - bucket.start;
    auto viewType = MemRefType::get({numel}, b.getF32Type());
    SmallVector<Value> operands;
    OpBuilder at(first);
    for (unsigned t = 0; t < numTensors; ++t) {
      std::string name = ("bucket." + Twine(kRoles[t]) + ":" + gb.getSymName() +
                          ":" + Twine(k))
                             .str();
      int64_t offset = *bases[t] + bucket.start * 4;
      // The gradient bucket's own view (the collectives') when it is there.
      if (t == 1)
        if (rt::BufferOp g = byName.lookup(
                ("gbuf:" + gb.getSymName() + ":" + Twine(k)).str());
            g && int64_t(g.getOffset()) == offset && g.getType() == viewType)
          name = g.getSymName().str();
      rt::BufferOp view = byName.lookup(name);
      if (!view) {
        view = rt::BufferOp::create(
            b, gb.getLoc(), TypeRange{}, ValueRange{},
            ArrayRef<NamedAttribute>{
                b.getNamedAttr("sym_name", b.getStringAttr(name)),
                b.getNamedAttr("type", TypeAttr::get(viewType)),
                b.getNamedAttr("kind", enumAttr(b, rt::BufferKind::View)),
                b.getNamedAttr("offset", b.getI64IntegerAttr(offset))});
        byName[name] = view;
        lastBuffer = view;
        b.setInsertionPointAfter(view);
      }
      // The step's rt.get of the view if it comes before the first update,
      // or a new one.
      rt::GetOp get = stepGets.lookup(name);
      if (!get || !position.count(get) ||
          position.lookup(get) > position.lookup(first)) {
        get = rt::GetOp::create(at, first->getLoc(), viewType,
                                FlatSymbolRefAttr::get(b.getContext(), name));
        stepGets[name] = get;
      }
      operands.push_back(get.getResult());
    }
    DenseI64ArrayAttr runsAttr =
        runs.empty() ? DenseI64ArrayAttr() : at.getDenseI64ArrayAttr(runs);
    FloatAttr decayAttr = at.getF32FloatAttr(decay);
    if (auto adam = dyn_cast<rt::AdamOp>(first)) {
      rt::AdamOp::create(at, first->getLoc(), operands[0], operands[1],
                         operands[2], operands[3], adam.getIteration(),
                         adam.getLrAttr(), adam.getBeta1Attr(),
                         adam.getBeta2Attr(), adam.getEpsAttr(), decayAttr,
                         runsAttr, StringAttr());
    } else if (auto mom = dyn_cast<rt::SgdMomentumOp>(first)) {
      rt::SgdMomentumOp::create(at, first->getLoc(), operands[0], operands[1],
                                operands[2], mom.getLrAttr(), decayAttr,
                                mom.getMomentumAttr(), runsAttr, StringAttr());
    } else {
      auto sgd = cast<rt::SgdOp>(first);
      rt::SgdOp::create(at, first->getLoc(), operands[0], operands[1],
                        sgd.getLrAttr(), decayAttr, runsAttr, StringAttr());
    }
    SmallVector<Operation *> gets;
    for (Operation *op : group) {
      for (Value v : op->getOperands())
        if (Operation *get = v.getDefiningOp<rt::GetOp>())
          gets.push_back(get);
      op->erase();
    }
    for (Operation *get : gets)
      if (get->use_empty())
        get->erase();
    ++numFusedBuckets;
  }
};

} // namespace
