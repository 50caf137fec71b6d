//===- SplitBackward.cpp - Split each backward into B and W ---------------===//
//
// The zero-bubble schedules (Qi et al., "Zero Bubble Pipeline
// Parallelism") run a chunk's backward as two phases: B, the gradient with
// respect to the chunk's input (on the critical path: the previous stage
// waits for it), and W, the gradients of the parameters (deferrable).
// Autodiff already emits them as separate ops; this pass partitions each
// backward phase's ops:
//   - B (`backward_c<k>`, phase "backward") is every receive and send and
//     every op a send depends on: the backward slice of the input gradient;
//   - W (`backward_w_c<k>`, phase "backward_w") is everything else, in the
//     original order: the weight-gradient GEMMs, the norms' and biases'
//     reductions, and what tessera-dp-grad-allreduce added (bucket
//     reductions), returning the backward's results (the gradients).
// A value B computes that W reads is saved: B returns it as a saved
// activation (`tessera.stash`, numbered after the forward's, so it lives
// in the same microbatch slot) and W takes it as an argument. The slot
// therefore stays held until W, not B, and lower-to-rt counts the extra
// bytes in it. The last microbatch's backward variant ("<name>:last", with
// the overlapped bucket reductions) becomes W's variant; its B part must
// be the plain B part, which it is since the variant only adds ops that
// read gradients.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <map>

namespace tessera::dist {
#define GEN_PASS_DEF_SPLITBACKWARDPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct SplitBackwardPass
    : tessera::dist::impl::SplitBackwardPassBase<SplitBackwardPass> {
  void runOnOperation() override;
};

/// One backward phase partitioned: the B ops, and the values B defines
/// that W (or the results) read, in order of definition.
struct Partition {
  llvm::SetVector<Operation *> input; ///< B, in block order
  SmallVector<Value> carried;
};

/// The ops of B: receives, sends and everything a send reads.
FailureOr<Partition> partition(func::FuncOp f) {
  Partition p;
  if (!f.getBody().hasOneBlock())
    return f.emitOpError() << "cannot be split into input- and weight-gradient "
                              "phases: it has more than one block";
  Block &body = f.getBody().front();
  SmallVector<Operation *> work;
  for (Operation &op : body.without_terminator()) {
    if (op.getNumRegions() != 0)
      return f.emitOpError()
             << "cannot be split into input- and weight-gradient phases: "
             << op.getName() << " has regions";
    if (isa<SendOp, RecvOp>(op))
      work.push_back(&op);
  }
  llvm::DenseSet<Operation *> inB;
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    if (!inB.insert(op).second)
      continue;
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp())
        work.push_back(def);
  }
  for (Operation &op : body.without_terminator())
    if (inB.contains(&op))
      p.input.insert(&op);
  // Values B defines that W or the return reads.
  llvm::SetVector<Value> carried;
  for (Operation &op : body) {
    if (inB.contains(&op))
      continue;
    for (Value v : op.getOperands())
      if (Operation *def = v.getDefiningOp(); def && inB.contains(def))
        carried.insert(v);
  }
  // In definition order (B's ops in block order, their results in order).
  for (Operation *op : p.input)
    for (Value r : op->getResults())
      if (carried.contains(r))
        p.carried.push_back(r);
  return p;
}

/// Whether the B part `q` of `g` computes what the B part `p` of `f` does:
/// the same ops (names, attributes, types) on corresponding operands (the
/// same argument, or the same result of the corresponding op), saving
/// corresponding values. A last-microbatch variant is a copy of its
/// backward with ops added that only read gradients, so its B part is the
/// same; anything else could not share the plain backward's B phase.
bool sameInputGradient(func::FuncOp f, const Partition &p, func::FuncOp g,
                       const Partition &q) {
  if (p.input.size() != q.input.size() || p.carried.size() != q.carried.size() ||
      f.getNumArguments() != g.getNumArguments())
    return false;
  llvm::DenseMap<Value, Value> to; // g's value -> f's
  for (unsigned i = 0, e = f.getNumArguments(); i < e; ++i) {
    if (f.getArgument(i).getType() != g.getArgument(i).getType() ||
        f.getArgAttrDict(i) != g.getArgAttrDict(i))
      return false;
    to[g.getArgument(i)] = f.getArgument(i);
  }
  for (auto [a, b] : llvm::zip(p.input, q.input)) {
    if (a->getName() != b->getName() ||
        a->getAttrDictionary() != b->getAttrDictionary() ||
        a->getResultTypes() != b->getResultTypes() ||
        a->getNumOperands() != b->getNumOperands())
      return false;
    for (auto [x, y] : llvm::zip(a->getOperands(), b->getOperands()))
      if (to.lookup(y) != x)
        return false;
    for (auto [x, y] : llvm::zip(a->getResults(), b->getResults()))
      to[y] = x;
  }
  for (auto [x, y] : llvm::zip(p.carried, q.carried))
    if (to.lookup(y) != x)
      return false;
  return true;
}

/// The largest saved-activation index a chunk's forward returns, plus one.
int64_t firstFreeStash(ModuleOp program, int64_t chunk) {
  int64_t next = 0;
  for (auto f : program.getOps<func::FuncOp>()) {
    auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
    auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
    if (!p || !c || c.getInt() != chunk || p.getValue() != kForwardPhase)
      continue;
    for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
      if (auto s = f.getResultAttrOfType<IntegerAttr>(i, kStashAttr))
        next = std::max(next, s.getInt() + 1);
  }
  return next;
}

/// A function named `name` holding `ops` of `f` (in order), taking the
/// arguments of `f` they read (with their attributes) plus `extraArgs`
/// (typed, with a stash index from `stashBase`), and returning `results`
/// (with `resultAttrs`).
func::FuncOp buildPhase(OpBuilder &b, func::FuncOp f, StringRef name,
                        ArrayRef<Operation *> ops, ArrayRef<Value> extraArgs,
                        int64_t stashBase, ArrayRef<Value> results,
                        ArrayRef<DictionaryAttr> resultAttrs) {
  llvm::DenseSet<Value> read;
  for (Operation *op : ops)
    for (Value v : op->getOperands())
      read.insert(v);
  for (Value v : results)
    read.insert(v);
  SmallVector<Type> argTypes, resultTypes;
  SmallVector<DictionaryAttr> argAttrs;
  SmallVector<BlockArgument> args;
  for (BlockArgument a : f.getArguments())
    if (read.contains(a)) {
      args.push_back(a);
      argTypes.push_back(a.getType());
      argAttrs.push_back(f.getArgAttrDict(a.getArgNumber()));
    }
  for (auto [i, v] : llvm::enumerate(extraArgs)) {
    argTypes.push_back(v.getType());
    argAttrs.push_back(b.getDictionaryAttr(b.getNamedAttr(
        kStashAttr, b.getI64IntegerAttr(stashBase + int64_t(i)))));
  }
  for (Value v : results)
    resultTypes.push_back(v.getType());
  auto g = func::FuncOp::create(b, f.getLoc(), name,
                                b.getFunctionType(argTypes, resultTypes));
  for (NamedAttribute a : f->getAttrs())
    if (a.getName() != g.getSymNameAttrName() &&
        a.getName() != g.getFunctionTypeAttrName() &&
        a.getName() != g.getArgAttrsAttrName() &&
        a.getName() != g.getResAttrsAttrName())
      g->setAttr(a.getName(), a.getValue());
  for (auto [i, attrs] : llvm::enumerate(argAttrs))
    if (attrs)
      g.setArgAttrs(unsigned(i), attrs);
  for (auto [i, attrs] : llvm::enumerate(resultAttrs))
    if (attrs)
      g.setResultAttrs(unsigned(i), attrs);
  Block *block = g.addEntryBlock();
  IRMapping map;
  for (auto [i, a] : llvm::enumerate(args))
    map.map(a, block->getArgument(unsigned(i)));
  for (auto [i, v] : llvm::enumerate(extraArgs))
    map.map(v, block->getArgument(unsigned(args.size() + i)));
  OpBuilder body = OpBuilder::atBlockEnd(block);
  for (Operation *op : ops)
    body.clone(*op, map);
  SmallVector<Value> mapped;
  for (Value v : results)
    mapped.push_back(map.lookup(v));
  func::ReturnOp::create(body, f.getLoc(), mapped);
  return g;
}

} // namespace

void SplitBackwardPass::runOnOperation() {
  ModuleOp module = getOperation();
  SmallVector<ModuleOp> programs = getPrograms(module);
  if (programs.front() == module)
    return; // no pipeline: nothing is scheduled separately
  for (ModuleOp program : programs) {
    SmallVector<func::FuncOp> backwards;
    for (auto f : program.getOps<func::FuncOp>())
      if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr)) {
        if (p.getValue() == kBackwardWPhase) {
          auto rank = program->getAttrOfType<IntegerAttr>(kPpRankAttr);
          emitError(f.getLoc())
              << "the backward of pipeline rank "
              << (rank ? rank.getInt() : int64_t(-1)) << " is already split ('"
              << f.getSymName() << "')";
          return signalPassFailure();
        }
        if (p.getValue() == kBackwardPhase && f->hasAttr(kChunkAttr))
          backwards.push_back(f);
      }
    // The plain backwards first: a "<name>:last" variant's B part is
    // checked against its plain backward's.
    std::stable_partition(backwards.begin(), backwards.end(), [](func::FuncOp f) {
      return !f->hasAttr(kLastMicrobatchAttr);
    });
    // Per chunk, the plain backward's partition (kept until the variants
    // are checked against it).
    std::map<int64_t, std::pair<func::FuncOp, Partition>> plain;
    SmallVector<func::FuncOp> done;
    for (func::FuncOp f : backwards) {
      int64_t chunk = f->getAttrOfType<IntegerAttr>(kChunkAttr).getInt();
      // (The runtime knows a chunk's phases by these names.)
      if (!f.getSymName().starts_with("backward_c")) {
        f.emitOpError() << "is a backward phase not named backward_c<k>";
        return signalPassFailure();
      }
      FailureOr<Partition> p = partition(f);
      if (failed(p))
        return signalPassFailure();
      auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
      SmallVector<Operation *> weightOps;
      for (Operation &op : f.getBody().front().without_terminator())
        if (!p->input.contains(&op))
          weightOps.push_back(&op);
      const bool last = f->hasAttr(kLastMicrobatchAttr);
      StringRef name = f.getSymName();
      if (last && !name.ends_with(":last")) {
        f.emitOpError() << "is a last-microbatch variant ("
                        << kLastMicrobatchAttr
                        << ") not named <backward>:last";
        return signalPassFailure();
      }
      if (last) {
        auto it = plain.find(chunk);
        if (it == plain.end() ||
            !sameInputGradient(it->second.first, it->second.second, f, *p)) {
          f.emitOpError()
              << "(the last microbatch's backward) computes its input "
                 "gradient differently from the chunk's backward; the two "
                 "cannot share one input-gradient phase";
          return signalPassFailure();
        }
        name = name.drop_back(5); // ":last"
      } else {
        plain[chunk] = {f, *p};
      }
      done.push_back(f);
      int64_t base = firstFreeStash(program, chunk);
      SmallVector<DictionaryAttr> resultAttrs;
      for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
        resultAttrs.push_back(f.getResultAttrDict(i));
      OpBuilder b(f);
      // W: "backward_c<k>" -> "backward_w_c<k>" (and its ":last").
      std::string wName = ("backward_w" + name.drop_front(8)).str();
      if (last)
        wName += ":last";
      SmallVector<Value> results(ret.getOperands());
      func::FuncOp w = buildPhase(b, f, wName, weightOps, p->carried, base,
                                  results, resultAttrs);
      w->setAttr(kPhaseAttr, b.getStringAttr(kBackwardWPhase));
      if (!last) {
        SmallVector<DictionaryAttr> stashAttrs;
        for (unsigned i = 0, e = p->carried.size(); i < e; ++i)
          stashAttrs.push_back(b.getDictionaryAttr(b.getNamedAttr(
              kStashAttr, b.getI64IntegerAttr(base + int64_t(i)))));
        b.setInsertionPoint(w);
        buildPhase(b, f, name, p->input.getArrayRef(), {}, 0, p->carried,
                   stashAttrs);
      }
    }
    for (func::FuncOp f : done)
      f.erase();
  }
}
