//===- LowerToRT.cpp - Bufferize and lower to rt kernels ------------------===//
//
// The pass tessera-lower-to-rt: per program (pipeline rank), the four stages
// of LowerToRT.h: persistent buffers and their layout, a storage plan per
// phase, the phases' memory plans (sharing the transient region, since
// phases never run at once), and the nn/dist -> rt conversion of each
// phase into an rt entry function (with its p2p parts split off); then the
// rt.buffer declarations and the arena size.
//
//===----------------------------------------------------------------------===//

#include "LowerToRT.h"

namespace tessera {
#define GEN_PASS_DEF_LOWERTORTPASS
#include "tessera/Conversion/Passes.h.inc"
} // namespace tessera

using namespace mlir;
using namespace tessera;
using namespace tessera::lowering;

namespace {
struct LowerToRTPass : tessera::impl::LowerToRTPassBase<LowerToRTPass> {
  using LowerToRTPassBase::LowerToRTPassBase;
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
  // a backward phase (and a weight-gradient phase when the backward is
  // split; in chunk order); then the step.
  SmallVector<func::FuncOp> phases;
  func::FuncOp step = getPhaseFunc(module, kStepPhase);
  for (auto f : module.getOps<func::FuncOp>())
    if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
        p && p.getValue() == kMicrobatchPhase)
      phases.push_back(f);
  for (StringRef phase :
       {kForwardPhase, kBackwardPhase, kBackwardWPhase, kEvalPhase})
    for (auto f : module.getOps<func::FuncOp>())
      if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr); p && p.getValue() == phase)
        phases.push_back(f);
  llvm::stable_sort(phases, [](func::FuncOp a, func::FuncOp b) {
    return chunkOf(a) < chunkOf(b);
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
  SmallVector<Operation *> scheduleRuns;
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

  // 1. Persistent buffers; those of a chunk (`chunk` >= 0) live in its slot
  //    region: its inputs and saved activations, one copy per slot.
  PersistentBuffers buffers;
  if (failed(buffers.collect(module, phases, step, pipeline)))
    return failure();

  // 2. Storage decisions (p2p staging buffers are created on the way).
  PhasePlan::MakeBuffer makeBuffer = [&](StringRef name, Type type) {
    buffers.add(name, rt::BufferKind::Activation, type);
  };
  std::vector<std::unique_ptr<PhasePlan>> lowerings;
  for (func::FuncOp f : phases)
    lowerings.push_back(
        std::make_unique<PhasePlan>(f, /*isStep=*/false, buffers, makeBuffer,
                                    foldCasts));
  lowerings.push_back(
      std::make_unique<PhasePlan>(step, /*isStep=*/true, buffers, makeBuffer,
                                  foldCasts));
  if (init)
    lowerings.push_back(
        std::make_unique<PhasePlan>(init, /*isStep=*/true, buffers, makeBuffer,
                                    foldCasts));
  for (auto &l : lowerings)
    if (failed(l->plan()))
      return failure();

  // Layout (after the storage decisions, which add p2p staging buffers).
  if (failed(buffers.layout(module, numSlots, chunkSlots, scheduleRuns)))
    return failure();
  int64_t persistentBytes = buffers.bytes;

  // The model FLOPs of one step on this rank, from each op's cost (a
  // folded cast runs no kernel).
  auto phaseFlops = [](func::FuncOp f, const PhasePlan &plan) {
    int64_t flops = 0;
    f.walk([&](CostOpInterface op) {
      if (!plan.foldedCasts.contains(op))
        flops += op.getFlops();
    });
    return flops;
  };
  // (lowerings: the phases', then the step's.)
  int64_t flopsPerStep = phaseFlops(step, *lowerings[phases.size()]);
  for (auto [f, plan] : llvm::zip(phases, lowerings))
    if (!f->hasAttr(kLastMicrobatchAttr) && // a variant of another phase
        f->getAttrOfType<StringAttr>(kPhaseAttr).getValue() != kEvalPhase)
      flopsPerStep += phaseFlops(f, *plan) * getNumMicrobatches(module);

  // 3. Memory plans: all phases share the transient region (they never run
  //    at once).
  int64_t transient = 0;
  for (auto &l : lowerings)
    transient = std::max(transient, l->planMemory(persistentBytes));

  // 4. Emit.
  OpBuilder builder(module.getContext());
  builder.setInsertionPoint(phases.front());
  for (auto &p : buffers.buffers) {
    SmallVector<NamedAttribute> attrs{
        builder.getNamedAttr("sym_name", builder.getStringAttr(p->name)),
        builder.getNamedAttr("type", TypeAttr::get(p->type)),
        builder.getNamedAttr("kind", enumAttr(builder, p->kind)),
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
    // The cost of one run of the phase (CostOpInterface), for tessera-plan:
    // all FLOPs, those of the compute-bound ops (GEMMs, attention: at least
    // 16 FLOPs a byte), and the bytes the other ops move, in the formats
    // they are stored in (a folded cast is no kernel; bf16 activations move
    // 2 bytes an element).
    int64_t denseFlops = 0, lightBytes = 0;
    source.walk([&](CostOpInterface op) {
      if (lowering->foldedCasts.contains(op))
        return;
      int64_t flops = op.getFlops(), bytes = lowering->storedBytes(op);
      if (flops >= 16 * bytes)
        denseFlops += flops;
      else
        lightBytes += bytes;
    });
    entry->setAttr("rt.flops",
                   builder.getI64IntegerAttr(phaseFlops(source, *lowering)));
    entry->setAttr("rt.dense_flops", builder.getI64IntegerAttr(denseFlops));
    entry->setAttr("rt.light_bytes", builder.getI64IntegerAttr(lightBytes));
    if (int64_t c = chunkOf(source); c >= 0) {
      entry->setAttr("rt.chunk", builder.getI64IntegerAttr(c));
      SlotRegion r = buffers.regions[c];
      entry->setAttr("rt.slot_base", builder.getI64IntegerAttr(r.base));
      entry->setAttr("rt.slot_bytes", builder.getI64IntegerAttr(r.bytes));
      entry->setAttr("rt.num_slots", builder.getI64IntegerAttr(r.slots));
    }
    if (failed(emitPhase(*lowering, entry)) || failed(splitP2PParts(entry)))
      return failure();
    builder.setInsertionPointToEnd(module.getBody());
  }
  for (func::FuncOp f : sources)
    f.erase();

  module->setAttr("rt.arena_bytes",
                  builder.getI64IntegerAttr(persistentBytes + transient));
  module->setAttr("rt.persistent_bytes", builder.getI64IntegerAttr(persistentBytes));
  if (buffers.stagingBytes > 0)
    module->setAttr("rt.staging_bytes",
                    builder.getI64IntegerAttr(buffers.stagingBytes));
  module->setAttr("rt.flops_per_step", builder.getI64IntegerAttr(flopsPerStep));
  arenaBytes = std::max<uint64_t>(arenaBytes.getValue(), persistentBytes + transient);
  transientBytes = std::max<uint64_t>(transientBytes.getValue(), transient);
  return success();
}

