//===- PPSchedule.cpp - Order each pipeline rank's forwards and backwards -===//
//
// Megatron's pipeline schedules (forward_backward_no_pipelining,
// forward_backward_pipelining_without_interleaving and
// forward_backward_pipelining_with_interleaving in
// megatron/core/pipeline_parallel/schedules.py; computed by lib/Schedule)
// as IR: one `dist.schedule` per pipeline-rank module, listing
// `dist.run @forward_c<k>` / `@backward_c<k>` per microbatch in execution
// order. Each forward takes the lowest free slot of its chunk (a copy of
// the chunk's inputs and saved activations) and its backward frees it. The slots form one pool per rank shared by its chunks,
// so the pool is as large as the most microbatch-chunks the rank has in
// flight at once: pp - rank for 1F1B on rank `rank` (pp on the first), and
// Megatron's warmup + 1 for the interleaved schedule.
// The zero-bubble schedule ZB-H1 runs each backward as two phases
// (tessera-split-backward): `@backward_c<k>` (B, the input gradient) and
// `@backward_w_c<k>` (W, the weight gradients); the slot is held until W.
// The V-shaped schedules ZBV and DualPipeV (PyTorch's ScheduleZBVZeroBubble
// and ScheduleDualPipeV) run two chunks per rank, placed as a V by
// tessera-pp-split's `v-shape`, with B and W apart too.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringSet.h"

#include <map>
#include <set>

namespace tessera::dist {
#define GEN_PASS_DEF_PPSCHEDULEPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {
struct PPSchedulePass : tessera::dist::impl::PPSchedulePassBase<PPSchedulePass> {
  using PPSchedulePassBase::PPSchedulePassBase;
  void runOnOperation() override;
};
} // namespace

void PPSchedulePass::runOnOperation() {
  ModuleOp module = getOperation();
  SmallVector<ModuleOp> programs = getPrograms(module);
  if (programs.front() == module)
    return; // no pipeline: the microbatch loop needs no schedule
  MeshOp mesh = lookupMesh(module);
  if (!mesh) {
    emitError(module.getLoc())
        << "tessera-pp-schedule needs the module's dist.mesh (run "
           "tessera-attach-mesh)";
    return signalPassFailure();
  }
  schedule::PipelineConfig config;
  config.pp = mesh.getPp();
  config.vpp = mesh.getVpp();
  config.microbatches = getNumMicrobatches(module);
  config.layers = config.pp * config.vpp;
  std::string kindName = schedule;
  if (kindName == "auto")
    kindName = config.vpp > 1 ? "interleaved" : "1f1b";
  if (!schedule::parseKind(kindName, config.kind)) {
    emitError(module.getLoc()) << "unknown schedule '" << kindName
                               << "' (expected none, 1f1b, interleaved, "
                                  "zb-h1, zbv or dualpipev)";
    return signalPassFailure();
  }
  if (config.kind == schedule::Kind::Interleaved && config.vpp == 1) {
    emitError(module.getLoc()) << "the interleaved schedule needs virtual "
                                  "pipeline stages (vpp > 1)";
    return signalPassFailure();
  }
  if (std::string error = schedule::validate(config); !error.empty()) {
    emitError(module.getLoc()) << "cannot schedule the pipeline: " << error;
    return signalPassFailure();
  }
  std::vector<schedule::RankSchedule> ranks = schedule::buildSchedule(config);

  OpBuilder b(module.getContext());
  for (ModuleOp program : programs) {
    int64_t r = program->getAttrOfType<IntegerAttr>(kPpRankAttr).getInt();
    if (!program.getOps<ScheduleOp>().empty()) {
      emitError(program.getLoc()) << "pipeline rank " << r
                                  << " already has a schedule";
      return signalPassFailure();
    }
    // (chunk, kind): kind 0 forward, 1 backward (B under a split
    // backward), 2 weight gradients (W).
    std::map<std::pair<int64_t, int>, func::FuncOp> phase;
    // Variants for the last microbatch (overlapped gradient reductions,
    // from tessera-dp-grad-allreduce) of the phase that returns the
    // gradients: the backward, or W.
    std::map<int64_t, func::FuncOp> lastBackward;
    const bool split = schedule::splitsBackward(config.kind);
    for (auto f : program.getOps<func::FuncOp>()) {
      auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
      auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
      if (!p || !c ||
          (p.getValue() != kForwardPhase && p.getValue() != kBackwardPhase &&
           p.getValue() != kBackwardWPhase))
        continue; // (an evaluation phase is not scheduled)
      int kind = p.getValue() == kForwardPhase    ? 0
                 : p.getValue() == kBackwardPhase ? 1
                                                  : 2;
      if (kind == 2 && !split) {
        emitError(f.getLoc())
            << "pipeline rank " << r << " has a weight-gradient phase ('"
            << f.getSymName() << "'), which only the zero-bubble schedules "
            << "(zb-h1, zbv, dualpipev) run; schedule '" << kindName
            << "' runs whole backwards";
        return signalPassFailure();
      }
      // The placement the split made must be the schedule's: a V for zbv
      // and dualpipev, round robin for the others.
      if (auto info = f->getAttrOfType<DictionaryAttr>(kStageAttr))
        if (auto stage = info.getAs<IntegerAttr>("stage");
            stage && c.getInt() < config.vpp &&
            stage.getInt() != schedule::stageOf(config, r, c.getInt())) {
          emitError(f.getLoc())
              << "schedule '" << kindName << "' runs virtual stage "
              << schedule::stageOf(config, r, c.getInt())
              << " as chunk " << c.getInt() << " of pipeline rank " << r
              << ", but the split put stage " << stage.getInt() << " there ("
              << (schedule::vShaped(config.kind)
                      ? "split with tessera-pp-split v-shape=true"
                      : "split without tessera-pp-split's v-shape")
              << ")";
          return signalPassFailure();
        }
      if (f->hasAttr(kLastMicrobatchAttr))
        lastBackward[c.getInt()] = f;
      else
        phase[{c.getInt(), kind}] = f;
    }
    for (int64_t c = 0; c < config.vpp; ++c)
      for (int kind : {0, 1, 2})
        if ((kind < 2 || split) && !phase.count({c, kind})) {
          InFlightDiagnostic diag = emitError(program.getLoc())
              << "pipeline rank " << r << " has no "
              << (kind == 0 ? "forward" : kind == 1 ? "backward" : "weight-gradient")
              << " phase for chunk " << c;
          if (kind == 2)
            diag << " (schedule '" << kindName
                 << "' runs B and W apart: run tessera-split-backward)";
          else
            diag << " (run tessera-pp-split and tessera-autodiff)";
          return signalPassFailure();
        }
    b.setInsertionPointToEnd(program.getBody());
    const schedule::RankSchedule &rs = ranks[size_t(r)];
    auto sched = ScheduleOp::create(b, program.getLoc(), b.getStringAttr(kindName),
                                    b.getI64IntegerAttr(rs.warmup));
    Block *body = new Block();
    sched.getBody().push_back(body);
    b.setInsertionPointToStart(body);
    int64_t stepIndex = 0;
    // One pool of slots per rank, shared by its chunks: it holds at most
    // as many microbatch-chunks as the schedule ever has in flight at once.
    std::set<int64_t> freeSlots;
    int64_t numSlots = 0;
    std::map<int64_t, std::set<int64_t>> chunkFree;
    std::map<int64_t, int64_t> chunkSlots;
    std::map<std::pair<int64_t, int64_t>, int64_t> chunkSlotOf;
    std::map<std::pair<int64_t, int64_t>, int64_t> slotOf; // (chunk, mb)
    // A forward takes a slot at its first part, a backward frees it after
    // its last.
    // `part`: none for the whole phase.
    auto emitRun = [&](const schedule::Step &s, std::optional<RunPart> part) {
      std::pair<int64_t, int64_t> key{s.chunk, s.microbatch};
      const int kind = s.forward ? 0 : s.weight ? 2 : 1;
      func::FuncOp callee = phase[{s.chunk, kind}];
      // A part without ops (no receive on the first stage, no send on the
      // last) is left out.
      if ((part == RunPart::Recv && callee.getOps<RecvOp>().empty()) ||
          (part == RunPart::Send && callee.getOps<SendOp>().empty()))
        return;
      bool first =
          !part || part == RunPart::Recv ||
          (part == RunPart::Compute && callee.getOps<RecvOp>().empty());
      bool last = !part || part == RunPart::Send ||
                  (part == RunPart::Compute && callee.getOps<SendOp>().empty());
      if (s.forward && first) {
        if (freeSlots.empty())
          freeSlots.insert(numSlots++);
        slotOf[key] = *freeSlots.begin();
        freeSlots.erase(freeSlots.begin());
        // The same assignment per chunk, for when separate regions per
        // chunk are smaller than the shared pool (lower-to-rt decides).
        auto &free = chunkFree[s.chunk];
        if (free.empty())
          free.insert(chunkSlots[s.chunk]++);
        chunkSlotOf[key] = *free.begin();
        free.erase(free.begin());
      }
      int64_t slot = slotOf[key];
      // The last microbatch's run of the phase returning the gradients.
      if (kind == (split ? 2 : 1) && s.microbatch == config.microbatches - 1 &&
          lastBackward.count(s.chunk))
        callee = lastBackward[s.chunk];
      RunOp::create(
          b,
          NameLoc::get(b.getStringAttr("pp" + Twine(r) + " schedule step " +
                                       Twine(stepIndex++))),
          FlatSymbolRefAttr::get(callee.getSymNameAttr()),
          b.getI64IntegerAttr(s.microbatch), b.getI64IntegerAttr(slot),
          part ? enumAttr(b, *part) : StringAttr())
          ->setAttr(kChunkSlotAttr, b.getI64IntegerAttr(chunkSlotOf[key]));
      // The slot is free after the last phase reading it: the backward,
      // or W.
      if (kind == (split ? 2 : 1) && last) {
        freeSlots.insert(slot);
        chunkFree[s.chunk].insert(chunkSlotOf[key]);
      }
    };
    // A last-microbatch variant reduces its chunk's buckets, and a bucket
    // may hold a gradient another chunk of this rank adds to too (the tied
    // embedding on a V's first rank): that chunk's last gradient phase
    // must run first.
    {
      const int gradKind = split ? 2 : 1;
      std::map<int64_t, size_t> lastRun; // chunk -> index in the order
      for (auto [i, st] : llvm::enumerate(rs.order))
        if ((st.forward ? 0 : st.weight ? 2 : 1) == gradKind &&
            st.microbatch == config.microbatches - 1)
          lastRun[st.chunk] = i;
      for (auto &[c, variant] : lastBackward) {
        llvm::StringSet<> reduced;
        variant.walk([&](BucketReduceStartOp start) {
          if (auto buf = SymbolTable::lookupNearestSymbolFrom<GradBufferOp>(
                  start, start.getBufferAttr()))
            for (const buckets::ParamRange &p : buf.getLayout().params)
              reduced.insert(p.name);
        });
        for (auto &[other, f] : phase) {
          if (other.first == c || other.second != gradKind ||
              !lastRun.count(other.first) || !lastRun.count(c) ||
              lastRun[other.first] < lastRun[c])
            continue;
          for (unsigned i = 0, e = f.getNumResults(); i < e; ++i)
            if (auto of = f.getResultAttrOfType<StringAttr>(i, kGradOfAttr);
                of && reduced.contains(of.getValue())) {
              emitError(variant.getLoc())
                  << "pipeline rank " << r << ": schedule '" << kindName
                  << "' runs the last microbatch of chunk " << other.first
                  << ", which adds to the gradient of '" << of.getValue()
                  << "', after '" << variant.getSymName()
                  << "' starts reducing it";
              return signalPassFailure();
            }
        }
      }
    }
    if (config.kind != schedule::Kind::Interleaved) {
      // Each phase whole: its sends and the next phase's receives form one
      // batch, as in Megatron's send_forward_recv_backward and
      // send_backward_recv_forward (under the V-shaped schedules the sends
      // stay in flight; see tessera-verify-schedule).
      for (const schedule::Step &s : rs.order)
        emitRun(s, std::nullopt);
      continue;
    }
    // Megatron's interleaved schedule: after the warmup forwards, each
    // forward-backward pair is followed by one batch with both sends and
    // the receives of the next forward and backward.
    std::vector<schedule::Step> fwd, bwd;
    for (const schedule::Step &s : rs.order)
      (s.forward ? fwd : bwd).push_back(s);
    const int64_t total = fwd.size();
    const int64_t warmup = std::min<int64_t>(rs.warmup, total);
    const int64_t remaining = total - warmup;
    emitRun(fwd[0], RunPart::Recv);
    for (int64_t k = 0; k < warmup; ++k) {
      emitRun(fwd[k], RunPart::Compute);
      emitRun(fwd[k], RunPart::Send);
      if (k + 1 < total)
        emitRun(fwd[k + 1], RunPart::Recv);
      if (k == warmup - 1 && remaining > 0)
        emitRun(bwd[0], RunPart::Recv);
    }
    for (int64_t k = 0; k < remaining; ++k) {
      emitRun(fwd[k + warmup], RunPart::Compute);
      emitRun(bwd[k], RunPart::Compute);
      emitRun(fwd[k + warmup], RunPart::Send);
      emitRun(bwd[k], RunPart::Send);
      if (k + warmup + 1 < total)
        emitRun(fwd[k + warmup + 1], RunPart::Recv);
      if (k + 1 < total)
        emitRun(bwd[k + 1], RunPart::Recv);
    }
    if (remaining == 0)
      emitRun(bwd[0], RunPart::Recv);
    for (int64_t k = remaining; k < total; ++k) {
      emitRun(bwd[k], RunPart::Compute);
      emitRun(bwd[k], RunPart::Send);
      if (k + 1 < total)
        emitRun(bwd[k + 1], RunPart::Recv);
    }
  }
}
