//===- VerifySchedule.cpp - Prove a pipeline schedule cannot hang ---------===//
//
// Symbolic execution of every pipeline rank's instruction stream: the
// phases in `dist.schedule` order, then the step phase. Runs of consecutive
// dist.send / dist.recv form one batch (the runtime posts them together and
// completes them before the next other instruction; sends alone stay in
// flight over a weight-gradient phase, which is modelled by posting them
// after it). Under rendezvous
// semantics a batch completes only when each of its ops has met the
// matching op of a batch the peer has posted, the strictest model: a
// schedule that completes here completes under any buffering. Collectives
// over groups that span pipeline ranks are rendezvous of those ranks and
// must agree in kind and type. A send to the rank itself (the turn of a
// V-shaped placement) does not wait: the runtime copies the value into a
// queue of its tag, from which the matching receive, later on the same
// rank, copies it out; a receive finding its queue empty (or another
// microbatch first) is an error. Under the V-shaped schedules (zbv,
// dualpipev) sends do not block at all: a batch completes when its
// receives have met their sends, its sends stay in flight (the runtime's
// semantics for them, PyTorch's pipeline runtime's isend), and a phase
// waits for the earlier sends of its own chunk and phase before it runs
// (each send has a staging buffer of its phase's own; the runtime waits
// for fewer: those from the buffers the run sends from again), the step
// for all of them. Every failure
// names the op that would hang and the schedule step that runs it.
//
//===----------------------------------------------------------------------===//

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Mesh/RankGroups.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

#include <deque>
#include <map>
#include <set>
#include <tuple>

namespace tessera::dist {
#define GEN_PASS_DEF_VERIFYSCHEDULEPASS
#include "dialects/dist/Transforms/Passes.h.inc"
} // namespace tessera::dist

using namespace mlir;
using namespace tessera;
using namespace tessera::dist;

namespace {

/// One instruction of a rank's stream that synchronises with other ranks.
struct Event {
  enum Kind { Send, Recv, Collective, Local, SelfSend, SelfRecv, Fence } kind;
  Operation *op;
  RunOp run;          ///< schedule step that runs it (null for the step phase)
  int64_t peer = -1;  ///< pipeline rank of the peer (p2p)
  int64_t tag = -1;
  Type type;
  std::string group;  ///< collectives: the group kind
  std::vector<int64_t> members; ///< collectives: pipeline ranks of the group
  bool matched = false;
  /// Sends and fences (non-blocking sends): the run's chunk and phase (0
  /// forward, 1 backward, 2 W, 3 evaluation); a fence with `all` (the
  /// step) waits for every earlier send.
  int64_t chunk = -1;
  int phase = -1;
  bool all = false;
};

struct VerifySchedulePass
    : tessera::dist::impl::VerifySchedulePassBase<VerifySchedulePass> {
  void runOnOperation() override;
  LogicalResult checkSlots(ModuleOp program, ScheduleOp sched, int64_t M);
};

void noteStep(InFlightDiagnostic &diag, Event e) {
  if (e.run)
    diag.attachNote(e.run.getLoc())
        << "run by this schedule step (" << e.run.getCallee() << ", microbatch "
        << e.run.getMicrobatch() << ")";
  else
    diag.attachNote(e.op->getLoc()) << "in the step phase";
}

std::string describe(const Event &e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (e.kind == Event::Send || e.kind == Event::Recv)
    os << (e.kind == Event::Send ? "send to" : "receive from")
       << " pipeline rank " << e.peer << " (tag " << e.tag << ", " << e.type
       << ")";
  else
    os << e.op->getName() << " over \"" << e.group << "\"";
  return s;
}

} // namespace

LogicalResult VerifySchedulePass::checkSlots(ModuleOp program, ScheduleOp sched,
                                             int64_t M) {
  // A forward holds its slot from its first part to its backward's last,
  // or, when the chunk's backward is split (tessera-split-backward), to its
  // weight-gradient phase's.
  struct PhaseState {
    unsigned parts = 0; // bit per part done: recv 1, compute 2, send 4
    unsigned ran = 0;   // parts run explicitly
    int64_t slot = -1;
  };
  // (chunk, microbatch, kind): kind 0 forward, 1 backward, 2 W.
  std::map<std::tuple<int64_t, int64_t, int>, PhaseState> phases;
  // The rank's slot pool: slot -> (chunk, microbatch) holding it.
  std::map<int64_t, std::pair<int64_t, int64_t>> busy;
  std::set<int64_t> chunks, split;
  for (auto f : program.getOps<func::FuncOp>())
    if (auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
        p && p.getValue() == kBackwardWPhase)
      if (auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr))
        split.insert(c.getInt());
  static const char *const kNames[] = {"forward", "backward",
                                       "weight-gradient phase"};
  for (RunOp run : sched.getBody().front().getOps<RunOp>()) {
    auto f = program.lookupSymbol<func::FuncOp>(run.getCallee());
    auto c = f ? f->getAttrOfType<IntegerAttr>(kChunkAttr) : IntegerAttr();
    if (!c)
      return run.emitOpError() << "runs a function that is no chunk phase";
    int64_t chunk = c.getInt(), m = run.getMicrobatch(), slot = run.getSlot();
    chunks.insert(chunk);
    if (m >= M)
      return run.emitOpError() << "runs microbatch " << m << ", but there are "
                               << M << " microbatches";
    StringRef phase = f->getAttrOfType<StringAttr>(kPhaseAttr).getValue();
    const int kind = phase == kForwardPhase ? 0 : phase == kBackwardPhase ? 1 : 2;
    const int lastKind = split.count(chunk) ? 2 : 1;
    unsigned bits = 7;
    if (auto part = run.getPart())
      bits = *part == RunPart::Recv ? 1 : *part == RunPart::Compute ? 2 : 4;
    PhaseState &st = phases[{chunk, m, kind}];
    // Parts without ops count as done.
    if (f.getOps<RecvOp>().empty())
      st.parts |= 1;
    if (f.getOps<SendOp>().empty())
      st.parts |= 4;
    if (st.ran & bits)
      return run.emitOpError() << "runs the " << kNames[kind] << " of chunk "
                               << chunk << " microbatch " << m << " twice";
    PhaseState &fwd = phases[{chunk, m, 0}];
    if (kind == 0 && st.slot < 0) {
      auto [it, fresh] = busy.try_emplace(slot, chunk, m);
      if (!fresh)
        return run.emitOpError() << "puts microbatch " << m << " of chunk "
                                 << chunk << " in slot " << slot
                                 << ", which microbatch " << it->second.second
                                 << " of chunk " << it->second.first
                                 << " still uses";
      st.slot = slot;
    }
    if (kind > 0 && phases[{chunk, m, kind - 1}].parts != 7)
      return run.emitOpError() << "runs the " << kNames[kind] << " of chunk "
                               << chunk << " microbatch " << m
                               << " before its " << kNames[kind - 1]
                               << " completed";
    if (slot != fwd.slot)
      return run.emitOpError() << "runs microbatch " << m << " of chunk " << chunk
                               << " on slot " << slot << ", but its forward used slot "
                               << fwd.slot;
    st.ran |= bits;
    st.parts |= bits;
    if (kind == lastKind && st.parts == 7)
      busy.erase(slot);
  }
  for (int64_t chunk : chunks)
    for (int64_t m = 0; m < M; ++m)
      if (phases[{chunk, m, split.count(chunk) ? 2 : 1}].parts != 7)
        return sched.emitOpError() << "never completes chunk " << chunk
                                   << " microbatch " << m;
  return success();
}

/// Leading receives, computation, trailing sends: the parts a schedule can
/// run separately. Returns the op that breaks the shape, if any.
static Operation *checkPhaseShape(func::FuncOp f) {
  int state = 0; // 0 receives, 1 computation, 2 sends
  for (Operation &op : f.getBody().front().without_terminator()) {
    int kind = isa<RecvOp>(op) ? 0 : isa<SendOp>(op) ? 2 : 1;
    if (kind < state)
      return &op;
    state = std::max(state, kind);
  }
  return nullptr;
}

/// Runs every rank's stream with rendezvous semantics; a deadlock or a
/// mismatched message is an error (`what` names the order).
static LogicalResult simulate(std::vector<std::vector<Event>> &streams, int64_t pp,
                              StringRef what, bool nonBlocking) {
  // Run. pc[r]: first event not completed; batchEnd[r]: end of the posted
  // p2p batch starting at pc[r].
  std::vector<size_t> pc(pp, 0), batchEnd(pp, 0);
  auto isP2P = [](const Event &e) {
    return e.kind == Event::Send || e.kind == Event::Recv ||
           e.kind == Event::SelfSend || e.kind == Event::SelfRecv;
  };
  // Self sends and receives run as the batch is posted, in order: a send
  // queues its value on (rank, tag), a receive takes the oldest.
  std::map<std::pair<int64_t, int64_t>, std::vector<Event *>> selfQueue;
  std::map<std::pair<int64_t, int64_t>, size_t> selfTaken;
  bool selfFailed = false;
  auto post = [&](int64_t r) {
    size_t end = pc[r];
    while (end < streams[r].size() && isP2P(streams[r][end]))
      ++end;
    batchEnd[r] = end;
    for (size_t i = pc[r]; i < end && !selfFailed; ++i) {
      Event &e = streams[r][i];
      if (e.matched ||
          (e.kind != Event::SelfSend && e.kind != Event::SelfRecv))
        continue;
      e.matched = true;
      auto &queue = selfQueue[{r, e.tag}];
      if (e.kind == Event::SelfSend) {
        queue.push_back(&e);
        continue;
      }
      size_t &taken = selfTaken[{r, e.tag}];
      if (taken == queue.size()) {
        InFlightDiagnostic diag =
            e.op->emitOpError()
            << "receives from pipeline rank " << r << " itself on tag "
            << e.tag << " before that rank sent anything there (" << what
            << " runs the receiving chunk first)";
        noteStep(diag, e);
        selfFailed = true;
        return;
      }
      Event &send = *queue[taken++];
      if (send.type != e.type ||
          (send.run && e.run &&
           send.run.getMicrobatch() != e.run.getMicrobatch())) {
        InFlightDiagnostic diag = e.op->emitOpError() << "receives ";
        if (send.type != e.type)
          diag << e.type << " on tag " << e.tag << ", but pipeline rank " << r
               << " sent itself " << send.type << " there";
        else
          diag << "microbatch " << e.run.getMicrobatch() << " on tag " << e.tag
               << ", but pipeline rank " << r << " sent itself microbatch "
               << send.run.getMicrobatch() << " there first";
        diag.attachNote(send.op->getLoc()) << "the send";
        noteStep(diag, e);
        selfFailed = true;
        return;
      }
    }
  };
  for (int64_t r = 0; r < pp; ++r)
    post(r);
  if (selfFailed)
    return failure();
  // A send and the receive it meets agree in type and microbatch (the
  // k-th message on a channel must be the one the receiver expects).
  auto checkPair = [&](Event &send, Event &recv) -> LogicalResult {
    if (send.type != recv.type) {
      InFlightDiagnostic diag =
          send.op->emitOpError()
          << "sends " << send.type << " on tag " << send.tag
          << ", but the matching receive on pipeline rank " << send.peer
          << " expects " << recv.type;
      diag.attachNote(recv.op->getLoc()) << "the receive";
      noteStep(diag, send);
      return failure();
    }
    if (send.run && recv.run &&
        send.run.getMicrobatch() != recv.run.getMicrobatch()) {
      InFlightDiagnostic diag =
          recv.op->emitOpError()
          << "receives on tag " << recv.tag << " for microbatch "
          << recv.run.getMicrobatch() << ", but pipeline rank " << recv.peer
          << " sends microbatch " << send.run.getMicrobatch()
          << " there first (the schedules disagree on the order)";
      diag.attachNote(send.op->getLoc()) << "the send";
      noteStep(diag, recv);
      return failure();
    }
    return success();
  };
  // The first earlier send on rank r a fence at `at` waits for, if any
  // is still unmatched.
  // Sends in stream order, per (rank, chunk, phase) for the fences and
  // per (sender, receiver, tag) channel for the receives; matched ones are
  // dropped from the front as they are found (each list is matched oldest
  // first), so the simulation stays linear in the streams.
  std::map<std::tuple<int64_t, int64_t, int>, std::deque<size_t>> byPhase;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::deque<size_t>> byChannel;
  if (nonBlocking)
    for (int64_t r = 0; r < pp; ++r)
      for (auto [i, e] : llvm::enumerate(streams[r]))
        if (e.kind == Event::Send) {
          byPhase[{r, e.chunk, e.phase}].push_back(i);
          byChannel[{r, e.peer, e.tag}].push_back(i);
        }
  auto oldestUnmatched = [&](int64_t r, std::deque<size_t> &q) -> size_t {
    while (!q.empty() && streams[r][q.front()].matched)
      q.pop_front();
    return q.empty() ? SIZE_MAX : q.front();
  };
  auto unmatchedFencedSend = [&](int64_t r, size_t at) -> Event * {
    const Event &fence = streams[r][at];
    size_t first = SIZE_MAX;
    if (fence.all) {
      for (auto &[key, q] : byPhase)
        if (std::get<0>(key) == r)
          first = std::min(first, oldestUnmatched(r, q));
    } else if (auto it = byPhase.find({r, fence.chunk, fence.phase});
               it != byPhase.end()) {
      first = oldestUnmatched(r, it->second);
    }
    return first < at ? &streams[r][first] : nullptr;
  };
  bool progress = true;
  auto finished = [&] {
    for (int64_t r = 0; r < pp; ++r)
      if (pc[r] < streams[r].size())
        return false;
    return true;
  };
  while (progress && !finished()) {
    if (selfFailed)
      return failure();
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      auto &s = streams[r];
      if (pc[r] >= s.size())
        continue;
      Event &e = s[pc[r]];
      if (e.kind == Event::Local) {
        ++pc[r];
        post(r);
        progress = true;
        continue;
      }
      if (e.kind == Event::Fence) {
        if (!unmatchedFencedSend(r, pc[r])) {
          ++pc[r];
          post(r);
          progress = true;
        }
        continue;
      }
      if (isP2P(e) && nonBlocking) {
        // Each receive meets the oldest unmatched send on its channel the
        // peer has posted (in flight or in its open batch).
        for (size_t i = pc[r]; i < batchEnd[r]; ++i) {
          Event &mine = s[i];
          if (mine.matched || mine.kind != Event::Recv)
            continue;
          int64_t q = mine.peer;
          auto channel = byChannel.find({q, r, mine.tag});
          if (channel == byChannel.end())
            continue;
          size_t j = oldestUnmatched(q, channel->second);
          if (j >= batchEnd[q])
            continue; // (not posted yet)
          Event &theirs = streams[q][j];
          if (failed(checkPair(theirs, mine)))
            return failure();
          mine.matched = theirs.matched = true;
          progress = true;
        }
        bool complete = true;
        for (size_t i = pc[r]; i < batchEnd[r]; ++i)
          complete &= s[i].matched || s[i].kind == Event::Send;
        if (complete) {
          pc[r] = batchEnd[r];
          post(r);
          progress = true;
        }
        continue;
      }
      if (isP2P(e)) {
        // Match this batch's ops against the peers' posted batches, in
        // order on each channel.
        for (size_t i = pc[r]; i < batchEnd[r]; ++i) {
          Event &mine = s[i];
          if (mine.matched)
            continue;
          int64_t q = mine.peer;
          for (size_t j = pc[q]; j < batchEnd[q]; ++j) {
            Event &theirs = streams[q][j];
            if (theirs.matched || theirs.peer != r || theirs.tag != mine.tag ||
                theirs.kind == mine.kind || (q == r && &theirs == &mine))
              continue;
            if (failed(checkPair(mine.kind == Event::Send ? mine : theirs,
                                 mine.kind == Event::Send ? theirs : mine)))
              return failure();
            mine.matched = theirs.matched = true;
            progress = true;
            break;
          }
        }
        bool complete = true;
        for (size_t i = pc[r]; i < batchEnd[r]; ++i)
          complete &= s[i].matched;
        if (complete) {
          pc[r] = batchEnd[r];
          post(r);
          progress = true;
        }
        continue;
      }
      // A collective: every member must be at one over the same group.
      bool all = true;
      for (int64_t q : e.members) {
        if (pc[q] >= streams[q].size()) {
          all = false;
          break;
        }
        Event &other = streams[q][pc[q]];
        if (other.kind != Event::Collective || other.group != e.group) {
          all = false;
          break;
        }
        if (other.op->getName() != e.op->getName() || other.type != e.type) {
          InFlightDiagnostic diag =
              e.op->emitOpError()
              << "is the next collective over \"" << e.group
              << "\" on pipeline rank " << r << ", but pipeline rank " << q
              << " runs " << describe(other) << " with " << other.type
              << " there; the group's members must agree on the order";
          diag.attachNote(other.op->getLoc()) << "the other collective";
          noteStep(diag, e);
          return failure();
        }
      }
      if (all) {
        for (int64_t q : e.members) {
          ++pc[q];
          post(q);
        }
        progress = true;
      }
    }
  }
  if (selfFailed)
    return failure();
  if (finished()) {
    // A send nothing receives would hang the runtime at the end.
    for (int64_t r = 0; r < pp; ++r)
      for (Event &e : streams[r])
        if (e.kind == Event::Send && !e.matched) {
          InFlightDiagnostic diag =
              e.op->emitOpError()
              << "would hang: pipeline rank " << r << " waits to "
              << describe(e) << ", which no rank ever receives (" << what
              << " deadlocks)";
          noteStep(diag, e);
          return failure();
        }
    return success();
  }

  // Deadlock: report every stuck rank's first waiting op.
  SmallVector<std::pair<int64_t, Event>> stuck;
  for (int64_t r = 0; r < pp; ++r) {
    if (pc[r] >= streams[r].size())
      continue;
    Event *waiting = &streams[r][pc[r]];
    if (waiting->kind == Event::Fence) {
      if (Event *send = unmatchedFencedSend(r, pc[r]))
        waiting = send;
    } else {
      for (size_t i = pc[r]; i < batchEnd[r]; ++i)
        if (!streams[r][i].matched &&
            !(nonBlocking && streams[r][i].kind == Event::Send)) {
          waiting = &streams[r][i];
          break;
        }
    }
    stuck.push_back({r, *waiting});
  }
  auto &[r0, e0] = stuck.front();
  InFlightDiagnostic diag = e0.op->emitOpError()
                            << "would hang: pipeline rank " << r0 << " waits to "
                            << describe(e0)
                            << ", which no rank ever matches (" << what
                            << " deadlocks)";
  noteStep(diag, e0);
  for (auto &[r, e] : llvm::drop_begin(stuck)) {
    RunOp run = e.run;
    diag.attachNote(e.op->getLoc())
        << "pipeline rank " << r << " waits here to " << describe(e)
        << (run ? (" (" + run.getCallee().str() + ", microbatch " +
                   std::to_string(run.getMicrobatch()) + ")")
                : std::string(" (step phase)"));
  }
  return failure();
}

void VerifySchedulePass::runOnOperation() {
  ModuleOp module = getOperation();
  SmallVector<ModuleOp> programs = getPrograms(module);
  if (programs.front() == module)
    return;
  MeshOp mesh = lookupMesh(module);
  if (!mesh) {
    emitError(module.getLoc())
        << "tessera-verify-schedule needs the module's dist.mesh (run "
           "tessera-attach-mesh)";
    return signalPassFailure();
  }
  mesh::MeshConfig config = mesh.getConfig();
  const int64_t pp = mesh.getPp();
  const int64_t M = getNumMicrobatches(module);

  // Pipeline rank of every world rank, and the pipeline ranks a collective
  // over `kind` spans (from any world rank of pipeline rank `r`).
  std::string error;
  auto ppGroups = mesh::rankGroups(config, "pp", error);
  std::map<int64_t, int64_t> ppIndex;
  for (auto &g : ppGroups)
    for (auto [i, w] : llvm::enumerate(g))
      ppIndex[w] = i;
  // Memoised per (kind, pipeline rank): every collective of every
  // microbatch asks, and the answer materialises the kind's groups.
  std::map<std::pair<std::string, int64_t>, std::vector<int64_t>> spans;
  auto spanOf = [&](StringRef kind, int64_t r) -> const std::vector<int64_t> & {
    auto [it, inserted] = spans.try_emplace({kind.str(), r});
    if (!inserted)
      return it->second;
    std::string err;
    int64_t world = ppGroups.front()[size_t(r)];
    it->second = {r};
    for (auto &g : mesh::rankGroups(config, kind.str(), err))
      if (llvm::is_contained(g, world)) {
        std::set<int64_t> ranks;
        for (int64_t w : g)
          ranks.insert(ppIndex[w]);
        it->second.assign(ranks.begin(), ranks.end());
        break;
      }
    return it->second;
  };

  // Sends that stay in flight: the V-shaped schedules'.
  bool nonBlocking = false;
  for (ModuleOp program : programs)
    for (ScheduleOp sched : program.getOps<ScheduleOp>())
      nonBlocking |= sched.getKind() == ScheduleKind::Zbv ||
                     sched.getKind() == ScheduleKind::DualPipeV;

  // Each rank's stream.
  std::vector<std::vector<Event>> streams(pp);
  // The evaluation order (tessera-eval-phase): each forward step through
  // its chunk's eval_c<k>, no backward, no step.
  std::vector<std::vector<Event>> evalStreams(pp);
  std::vector<ModuleOp> programOf(pp);
  for (ModuleOp program : programs) {
    int64_t r = program->getAttrOfType<IntegerAttr>(kPpRankAttr).getInt();
    programOf[r] = program;
    auto scheds = program.getOps<ScheduleOp>();
    if (scheds.empty()) {
      emitError(program.getLoc()) << "pipeline rank " << r
                                  << " has no schedule (run tessera-pp-schedule)";
      return signalPassFailure();
    }
    ScheduleOp sched = *scheds.begin();
    if (failed(checkSlots(program, sched, M)))
      return signalPassFailure();
    for (auto f : program.getOps<func::FuncOp>())
      if (f->hasAttr(kChunkAttr))
        if (Operation *bad = checkPhaseShape(f)) {
          bad->emitOpError() << "comes " << (isa<RecvOp>(bad) ? "after" : "before")
                             << " computation in phase '" << f.getSymName()
                             << "'; a phase must receive first and send last";
          return signalPassFailure();
        }
    auto append = [&](std::vector<Event> &out, func::FuncOp f, RunOp run) {
      std::optional<RunPart> part = run ? run.getPart() : std::nullopt;
      // The run's identity, for its sends and its fence.
      Event self{Event::Fence, f, run};
      if (run) {
        auto c = f->getAttrOfType<IntegerAttr>(kChunkAttr);
        auto p = f->getAttrOfType<StringAttr>(kPhaseAttr);
        self.chunk = c ? c.getInt() : -1;
        self.phase = !p                              ? -1
                     : p.getValue() == kForwardPhase  ? 0
                     : p.getValue() == kBackwardPhase ? 1
                     : p.getValue() == kBackwardWPhase ? 2
                                                       : 3;
      } else {
        self.all = true;
      }
      if (nonBlocking)
        out.push_back(self);
      f.walk([&](Operation *op) {
        if (part) {
          RunPart mine = isa<RecvOp>(op)   ? RunPart::Recv
                         : isa<SendOp>(op) ? RunPart::Send
                                           : RunPart::Compute;
          if (mine != *part)
            return;
        }
        Event e{Event::Local, op, run};
        auto peerOf = [&](Peer p) {
          return p == Peer::Self   ? r
                 : p == Peer::Next ? (r + 1) % pp
                                   : (r + pp - 1) % pp;
        };
        if (auto s = dyn_cast<SendOp>(op)) {
          e.kind = s.getPeer() == Peer::Self ? Event::SelfSend : Event::Send;
          e.peer = peerOf(s.getPeer());
          e.chunk = self.chunk;
          e.phase = self.phase;
          e.tag = s.getTag();
          e.type = s.getInput().getType();
        } else if (auto rv = dyn_cast<RecvOp>(op)) {
          e.kind = rv.getPeer() == Peer::Self ? Event::SelfRecv : Event::Recv;
          e.peer = peerOf(rv.getPeer());
          e.tag = rv.getTag();
          e.type = rv.getType();
        } else if (auto group = op->getAttrOfType<StringAttr>("group");
                   group && op->getName().getDialectNamespace() == "dist") {
          std::vector<int64_t> span = spanOf(group.getValue(), r);
          if (span.size() > 1) {
            e.kind = Event::Collective;
            e.group = group.getValue().str();
            e.members = span;
            e.type = op->getNumOperands() ? op->getOperand(0).getType() : Type();
          }
        } else if (isa<func::ReturnOp, func::FuncOp>(op)) {
          return;
        }
        out.push_back(e);
      });
    };
    for (RunOp run : sched.getBody().front().getOps<RunOp>()) {
      auto f = program.lookupSymbol<func::FuncOp>(run.getCallee());
      auto phase = f->getAttrOfType<StringAttr>(kPhaseAttr);
      // A weight-gradient phase computes while the sends posted before it
      // are in flight (the runtime completes them with the next batch):
      // as if posted after it, which can only wait longer than the run.
      std::vector<Event> &out = streams[r];
      size_t sends = out.size();
      while (sends > 0 && out[sends - 1].kind == Event::Send)
        --sends;
      if (!nonBlocking && phase && phase.getValue() == kBackwardWPhase &&
          sends < out.size() &&
          (sends == 0 || out[sends - 1].kind != Event::Recv)) {
        std::vector<Event> pendingSends(out.begin() + long(sends), out.end());
        out.resize(sends);
        append(out, f, run);
        out.insert(out.end(), pendingSends.begin(), pendingSends.end());
      } else {
        append(out, f, run);
      }
      if (phase && phase.getValue() == kForwardPhase)
        if (auto eval = program.lookupSymbol<func::FuncOp>(
                (kEvalPhase + run.getCallee().drop_front(7)).str()))
          append(evalStreams[r], eval, run);
    }
    // The step phase follows the schedule (the runtime completes the open
    // batch first).
    if (func::FuncOp step = getPhaseFunc(program, kStepPhase)) {
      streams[r].push_back(Event{Event::Local, step, nullptr});
      append(streams[r], step, nullptr);
    }
  }
  for (int64_t r = 0; r < pp; ++r)
    if (!programOf[r]) {
      emitError(module.getLoc()) << "pipeline rank " << r << " has no program";
      return signalPassFailure();
    }

  if (failed(simulate(streams, pp, "the schedule", nonBlocking)) ||
      failed(simulate(evalStreams, pp,
                      "the evaluation order (the schedule's forwards alone)",
                      nonBlocking)))
    return signalPassFailure();
}
