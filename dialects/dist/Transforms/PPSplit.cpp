//===- PPSplit.cpp - Split the model into pipeline stages -----------------===//
//
// Megatron's layer placement (get_transformer_layer_offset) as a rewrite.
// Every op goes to a virtual stage s (on pipeline rank s mod pp as chunk
// s / pp, or, with `v-shape`, placed as a V: lib/Schedule's stageRank and
// stageChunk): ops marked
// `nn.layer = l` to the stage holding layer l (lib/Schedule's placement:
// contiguous blocks, virtual chunks, or an explicit uneven split), unmarked
// ops before the first layer to the first stage (embedding), unmarked ops
// after the last layer to the last stage (final norm, LM head, loss), and any
// other unmarked op to the latest stage of its operands. Each stage becomes a
// function in the module of its pipeline rank; a value used by a later stage
// is sent to the next stage (dist.send / dist.recv, passed on through stages
// in between). With `v-shape` (the zbv and dualpipev schedules) the two
// chunks of a rank are placed as a V: the second chunk's hops travel back
// towards rank 0 and the hop at the turn stays on the last rank
// (peer "self"). A parameter that stages on several pipeline ranks use (the
// tied word embedding on the first and last rank) is marked `dist.tied =
// "embedding"` so that its gradient is all-reduced over the embedding group.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace tessera::dist {
#define GEN_PASS_DEF_PPSPLITPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct PPSplitPass : tessera::dist::impl::PPSplitPassBase<PPSplitPass> {
  using PPSplitPassBase::PPSplitPassBase;
  void runOnOperation() override;
  schedule::SplitOptions splitOptions() const {
    schedule::SplitOptions s;
    s.layout = layout;
    s.firstStageLayers = firstStageLayers;
    s.lastStageLayers = lastStageLayers;
    s.accountForEmbedding = accountForEmbedding;
    s.accountForLoss = accountForLoss;
    return s;
  }
};
} // namespace

void PPSplitPass::runOnOperation() {
  ModuleOp module = getOperation();
  MeshOp mesh = lookupMesh(module);
  if (!mesh) {
    emitError(module.getLoc()) << "tessera-pp-split needs a dist.mesh "
                                  "(run tessera-attach-mesh)";
    return signalPassFailure();
  }
  const int64_t pp = mesh.getPp(), vpp = mesh.getVpp();
  if (pp == 1) {
    if (vpp != 1) {
      mesh.emitOpError() << "vpp " << vpp << " needs pp > 1";
      return signalPassFailure();
    }
    if (!stageLayers.empty()) {
      emitError(module.getLoc()) << "pp-layers given, but pp is 1";
      return signalPassFailure();
    }
    if (splitOptions().any()) {
      emitError(module.getLoc())
          << "an uneven pipeline split (Megatron's split options) needs pp "
             "> 1";
      return signalPassFailure();
    }
    return; // one stage: nothing to split
  }
  if (getPrograms(module).front() != module) {
    emitError(module.getLoc()) << "the module is already split into stages";
    return signalPassFailure();
  }
  func::FuncOp model = getModelFunc(module);
  if (!model)
    return signalPassFailure();
  Block &body = model.getBody().front();

  // Layers, from the marks.
  FailureOr<int64_t> layers = getNumLayers(model);
  if (failed(layers))
    return signalPassFailure();
  const int64_t numLayers = *layers;
  if (numLayers == 0) {
    model.emitOpError() << "has no layer marks (nn.layer) to split into "
                           "pipeline stages";
    return signalPassFailure();
  }
  schedule::PipelineConfig config;
  config.pp = pp;
  config.vpp = vpp;
  config.layers = numLayers;
  config.microbatches = pp;
  config.kind = vShape ? schedule::Kind::Zbv
                : vpp > 1 ? schedule::Kind::Interleaved
                          : schedule::Kind::OneFOneB;
  config.stageLayers.assign(stageLayers.begin(), stageLayers.end());
  if (std::string error = schedule::resolveSplit(splitOptions(), config);
      !error.empty()) {
    model.emitOpError() << "cannot be split into pipeline stages: " << error;
    return signalPassFailure();
  }
  if (std::string error = schedule::validate(config); !error.empty()) {
    model.emitOpError() << "cannot be split into pipeline stages: " << error;
    return signalPassFailure();
  }
  const int64_t numStages = pp * vpp;
  SmallVector<int64_t> stageOfLayer(numLayers);
  SmallVector<SmallVector<int64_t>> layersOfStage(numStages);
  for (const schedule::LayerPlacement &p : schedule::placeLayers(config)) {
    int64_t s = schedule::stageOf(config, p.ppRank, p.chunk);
    stageOfLayer[p.layer] = s;
    layersOfStage[s].push_back(p.layer);
  }
  auto rankOf = [&](int64_t s) { return schedule::stageRank(config, s); };
  auto chunkOf = [&](int64_t s) { return schedule::stageChunk(config, s); };
  // The direction of the hop from stage s to s + 1: the next rank (round
  // robin, and a V's first leg), the previous one (a V's second leg), or
  // the same rank (the V's turn).
  auto hopPeer = [&](int64_t s) {
    if (rankOf(s + 1) == rankOf(s))
      return Peer::Self;
    return vShape && chunkOf(s) == 1 ? Peer::Prev : Peer::Next;
  };
  auto reversePeer = [](Peer p) {
    return p == Peer::Next ? Peer::Prev : p == Peer::Prev ? Peer::Next : p;
  };

  // Stage of every op.
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  int64_t firstMarked = -1, lastMarked = -1;
  for (auto [i, op] : llvm::enumerate(ops))
    if (op->hasAttr(kLayerAttr)) {
      if (firstMarked < 0)
        firstMarked = i;
      lastMarked = i;
    }
  DenseMap<Operation *, int64_t> stage;
  SmallVector<Operation *> floating;
  for (auto [i, op] : llvm::enumerate(ops)) {
    if (auto l = op->getAttrOfType<IntegerAttr>(kLayerAttr)) {
      stage[op] = stageOfLayer[l.getInt()];
    } else if (int64_t(i) < firstMarked) {
      stage[op] = 0;
    } else if (int64_t(i) > lastMarked) {
      stage[op] = numStages - 1;
    } else {
      int64_t s = -1;
      for (Value v : op->getOperands())
        if (Operation *def = v.getDefiningOp())
          s = std::max(s, stage.lookup(def));
      if (s < 0)
        floating.push_back(op);
      stage[op] = s;
    }
  }
  // Ops of parameters and inputs only: the earliest stage that uses them.
  for (Operation *op : llvm::reverse(floating)) {
    int64_t s = numStages - 1;
    for (Operation *user : op->getUsers())
      if (!isa<func::ReturnOp>(user))
        s = std::min(s, stage.lookup(user));
    stage[op] = s;
  }
  for (Operation *op : ops)
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && stage[def] > stage[op]) {
        InFlightDiagnostic diag =
            op->emitOpError() << "in pipeline stage " << stage[op]
                              << " uses a value of stage " << stage[def]
                              << "; values may only flow to later stages";
        diag.attachNote(def->getLoc()) << "defined here";
        return signalPassFailure();
      }

  // Values that leave their stage: each hop s -> s + 1 is one channel,
  // tag 2n forward and 2n + 1 for its gradient.
  struct Hop {
    Value value;
    int64_t from;
    int64_t tag;
  };
  SmallVector<Hop> hops;
  DenseMap<Value, int64_t> lastUse;
  for (Operation *op : ops)
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && stage[def] < stage[op])
        lastUse[v] = std::max(lastUse.lookup(v), stage[op]);
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (Value v : ret.getOperands())
    if (Operation *def = v.getDefiningOp(); def && stage[def] < numStages - 1)
      lastUse[v] = numStages - 1;
  for (Operation *op : ops)
    for (Value v : op->getResults())
      if (lastUse.count(v)) {
        for (int64_t s = stage[op]; s < lastUse[v]; ++s)
          hops.push_back({v, s, 2 * int64_t(hops.size())});
      }

  // Parameters used on several pipeline ranks.
  DenseMap<BlockArgument, SmallVector<int64_t>> argRanks;
  for (BlockArgument arg : body.getArguments())
    for (Operation *user : arg.getUsers()) {
      if (isa<func::ReturnOp>(user))
        continue;
      auto &ranks = argRanks[arg];
      if (!llvm::is_contained(ranks, rankOf(stage[user])))
        ranks.push_back(rankOf(stage[user]));
    }
  DenseSet<BlockArgument> tied;
  for (auto &[arg, ranks] : argRanks) {
    if (ranks.size() < 2)
      continue;
    llvm::sort(ranks);
    auto name = model.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kParamAttr);
    if (!name) {
      continue; // inputs are read on every rank that uses them
    }
    if (ranks.size() != 2 || ranks[0] != 0 || ranks[1] != pp - 1) {
      InFlightDiagnostic diag = model.emitOpError()
                                << "parameter '" << name.getValue()
                                << "' is used on pipeline ranks";
      for (int64_t r : ranks)
        diag << " " << r;
      diag << "; only the first and last rank may share a parameter (the "
              "tied embedding, reduced over the embedding group)";
      return signalPassFailure();
    }
    tied.insert(arg);
  }

  // Build the stage functions, one module per pipeline rank.
  OpBuilder b(module.getContext());
  b.setInsertionPointAfter(model);
  SmallVector<ModuleOp> rankModules;
  for (int64_t r = 0; r < pp; ++r) {
    auto m = ModuleOp::create(b, model.getLoc(), ("pp" + Twine(r)).str());
    m->setAttr(kPpRankAttr, b.getI64IntegerAttr(r));
    rankModules.push_back(m);
    b.setInsertionPointAfter(m);
  }
  for (int64_t s = 0; s < numStages; ++s) {
    // Arguments: the model's arguments this stage uses, in order.
    SmallVector<BlockArgument> args;
    for (BlockArgument arg : body.getArguments())
      if (llvm::any_of(arg.getUsers(), [&](Operation *u) {
            return !isa<func::ReturnOp>(u) && stage.lookup(u) == s;
          }))
        args.push_back(arg);
    SmallVector<Type> argTypes;
    SmallVector<DictionaryAttr> argAttrs;
    for (BlockArgument arg : args) {
      argTypes.push_back(arg.getType());
      NamedAttrList attrs(model.getArgAttrDict(arg.getArgNumber()));
      if (tied.contains(arg))
        attrs.set(kTiedAttr, b.getStringAttr("embedding"));
      argAttrs.push_back(attrs.getDictionary(b.getContext()));
    }
    bool last = s == numStages - 1;
    ModuleOp m = rankModules[rankOf(s)];
    b.setInsertionPointToEnd(m.getBody());
    auto func = func::FuncOp::create(
        b, model.getLoc(), ("chunk" + Twine(chunkOf(s))).str(),
        b.getFunctionType(argTypes, last ? model.getResultTypes()
                                         : TypeRange{}));
    func.setAllArgAttrs(argAttrs);
    SmallVector<int64_t> layers = layersOfStage[s];
    func->setAttr(kStageAttr,
                  b.getDictionaryAttr(
                      {b.getNamedAttr("stage", b.getI64IntegerAttr(s)),
                       b.getNamedAttr("chunk", b.getI64IntegerAttr(chunkOf(s))),
                       b.getNamedAttr("layers", b.getDenseI64ArrayAttr(layers))}));
    Block *entry = func.addEntryBlock();
    b.setInsertionPointToStart(entry);
    IRMapping map;
    for (auto [arg, newArg] : llvm::zip(args, entry->getArguments()))
      map.map(arg, newArg);
    for (const Hop &h : hops)
      if (h.from == s - 1)
        map.map(h.value, RecvOp::create(b, h.value.getLoc(), h.value.getType(),
                                        enumAttr(b, reversePeer(hopPeer(s - 1))),
                                        b.getI64IntegerAttr(h.tag)));
    for (Operation *op : ops)
      if (stage[op] == s)
        b.clone(*op, map);
    for (const Hop &h : hops)
      if (h.from == s)
        SendOp::create(b, h.value.getLoc(), map.lookup(h.value),
                       enumAttr(b, hopPeer(s)), b.getI64IntegerAttr(h.tag));
    SmallVector<Value> results;
    if (last)
      for (Value v : ret.getOperands())
        results.push_back(map.lookupOrDefault(v));
    func::ReturnOp::create(b, ret.getLoc(), results);
  }
  if (!module->hasAttr(kModelNameAttr))
    module->setAttr(kModelNameAttr, b.getStringAttr(model.getSymName()));
  model.erase();
}
