//===- Recompute.cpp - Activation recompute groups ------------------------===//
//
// Megatron's full activation recompute (TransformerBlock's
// `_checkpointed_forward`): a group of transformer layers keeps only its
// input for the backward, which runs the group's forward again before
// differentiating it. This pass decides the groups and marks their ops
// (`nn.recompute = <group>`); tessera-autodiff, which builds the backward,
// does the recomputing (Autodiff.cpp, recomputeGroups).
//
//   uniform, N: layers [0, N), [N, 2N), ... of each model function (a
//               pipeline chunk's own layers), the last group possibly
//               shorter;
//   block, N:   each of the first N layers of each model function alone;
//               the others are not recomputed.
//
// Selective recompute (attention's core) needs no marks: nn.attention and
// dist.ring_attention keep no s x s activations and recompute their
// scores inside their backward (nn.attention_grad takes only the QKV
// projection), which is what Megatron's selective recompute achieves. It
// marks sequence parallelism's all-gathers `nn.recompute_in_backward` (and
// the bf16 casts of their results that bf16 GEMMs read), so that only
// their shards are kept, as Megatron's linear layers do.
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

#include <map>
#include <set>

namespace tessera::nn {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "dialects/nn/Transforms/Passes.h.inc"
} // namespace tessera::nn

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

namespace {

struct RecomputePass : tessera::nn::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    ModuleOp root = getOperation();
    if (failed(checkOptions(root)))
      return signalPassFailure();
    if (granularity == "selective") {
      markSelective(root);
      return;
    }
    if (granularity != "full")
      return;
    for (ModuleOp program : getPrograms(root)) {
      SmallVector<func::FuncOp> funcs;
      for (auto f : program.getOps<func::FuncOp>()) {
        if (f->hasAttr(kPhaseAttr)) {
          f.emitOpError() << "is a training phase; tessera-recompute runs on "
                             "the model, before tessera-autodiff";
          return signalPassFailure();
        }
        if (!f.isExternal())
          funcs.push_back(f);
      }
      // Megatron bounds the layers per group by the layers of a pipeline
      // rank.
      std::set<int64_t> rankLayers;
      for (func::FuncOp f : funcs)
        f.walk([&](Operation *op) {
          if (auto l = op->getAttrOfType<IntegerAttr>(kLayerAttr))
            rankLayers.insert(l.getInt());
        });
      if (rankLayers.empty()) {
        emitError(program.getLoc())
            << "--recompute-granularity full needs transformer layers: no op "
               "is marked nn.layer";
        return signalPassFailure();
      }
      if (numLayers > int64_t(rankLayers.size())) {
        emitError(program.getLoc())
            << "--recompute-num-layers " << int64_t(numLayers)
            << " exceeds the " << rankLayers.size()
            << " layers of a pipeline rank";
        return signalPassFailure();
      }
      for (func::FuncOp f : funcs)
        if (failed(markGroups(f)))
          return signalPassFailure();
    }
  }

  /// Selective recompute: attention's core needs nothing (its kernels keep
  /// no s x s scores); under sequence parallelism the all-gathered inputs of
  /// the column-parallel GEMMs are gathered again in the backward, for the
  /// weight gradients, instead of being kept whole (Megatron keeps the
  /// shard: LinearWithGradAccumulationAndAsyncCommunication).
  /// (Before autodiff, tp-partition's sequence-parallel gathers are the
  /// model's only all-gathers.)
  void markSelective(ModuleOp root) {
    Builder b(root.getContext());
    for (ModuleOp program : getPrograms(root))
      program.walk([&](dist::AllGatherOp gather) {
        gather->setAttr(kRecomputeInBackwardAttr, b.getUnitAttr());
        // Its bf16 copy for the GEMMs (bf16 GEMMs under mixed precision)
        // is gathered data too: cast again from the gathered shard.
        for (Operation *user : gather->getUsers())
          if (auto c = dyn_cast<CastOp>(user);
              c && !c.getType().getElementType().isF32())
            c->setAttr(kRecomputeInBackwardAttr, b.getUnitAttr());
      });
  }

  /// Megatron's checks of the three options (TransformerConfig).
  LogicalResult checkOptions(ModuleOp root) {
    auto error = [&]() { return emitError(root.getLoc()); };
    if (granularity.empty()) {
      if (!method.empty() || numLayers != 0)
        return error() << "--recompute-method and --recompute-num-layers "
                          "need --recompute-granularity full";
      return success();
    }
    if (granularity == "selective") {
      if (!method.empty() || numLayers != 0)
        return error() << "--recompute-granularity selective takes no "
                          "--recompute-method or --recompute-num-layers "
                          "(they choose layers for full recompute)";
      return success();
    }
    if (granularity != "full")
      return error() << "unknown --recompute-granularity '" << granularity
                     << "' (full or selective)";
    if (method != "uniform" && method != "block")
      return error() << (method.empty() ? "--recompute-granularity full needs "
                                          "--recompute-method uniform or block"
                                        : "unknown --recompute-method '" +
                                              method + "' (uniform or block)");
    if (numLayers < 1)
      return error() << "--recompute-granularity full needs "
                        "--recompute-num-layers of at least 1";
    return success();
  }

  /// Marks every op from the first to the last op of each group's layers.
  LogicalResult markGroups(func::FuncOp f) {
    Block &body = f.getBody().front();
    // This function's layers by number, with their first and last op.
    std::map<int64_t, std::pair<Operation *, Operation *>> span;
    for (Operation &op : body.without_terminator())
      if (auto l = op.getAttrOfType<IntegerAttr>(kLayerAttr)) {
        auto it = span.try_emplace(l.getInt(), &op, &op).first;
        it->second.second = &op;
      }
    SmallVector<SmallVector<int64_t>> groups;
    int64_t local = 0;
    for (const auto &entry : span) {
      int64_t layer = entry.first;
      if (method == "block") {
        if (local < numLayers)
          groups.push_back({layer});
      } else if (local % numLayers == 0) {
        groups.push_back({layer});
      } else {
        groups.back().push_back(layer);
      }
      ++local;
    }
    Builder b(f.getContext());
    for (auto [g, layers] : llvm::enumerate(groups)) {
      std::set<int64_t> members(layers.begin(), layers.end());
      // The group's ops span from its earliest to its latest layer op.
      Operation *first = span[layers.front()].first;
      Operation *last = span[layers.front()].second;
      for (int64_t layer : layers) {
        auto [begin, end] = span[layer];
        if (begin->isBeforeInBlock(first))
          first = begin;
        if (last->isBeforeInBlock(end))
          last = end;
      }
      for (Operation *op = first;; op = op->getNextNode()) {
        auto l = op->getAttrOfType<IntegerAttr>(kLayerAttr);
        if (l && !members.count(l.getInt()))
          return op->emitOpError()
                 << "of layer " << l.getInt()
                 << " lies between ops of layer " << layers.front()
                 << "; a recomputed layer's ops must be contiguous";
        if (isa<dist::SendOp, dist::RecvOp>(op))
          return op->emitOpError()
                 << "lies inside recomputed layer " << layers.front()
                 << "; a pipeline transfer cannot be recomputed";
        op->setAttr(kRecomputeAttr, b.getI64IntegerAttr(int64_t(g)));
        if (op == last)
          break;
      }
    }
    return success();
  }
};

} // namespace
