//===- Executor.cpp - Program interpreter ---------------------------------===//
//
// XLA-thunk-style interpreter: each function is decoded once per slot into
// thunks (Decoder.cpp), and execution calls each thunk's run function
// (executor/ops), which calls the backend or the communicator through the
// executor's RunContext. Also parameter initialisation, inputs, the
// microbatch loop, pipeline schedules with their p2p batches, the watchdog's
// view of what is in flight, and buffer access for checkpoints.
//
//===----------------------------------------------------------------------===//

#include "Decoder.h"
#include "ops/Ops.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/LrSchedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

namespace tessera::rt {

/// A function decoded once per microbatch slot (once without slots).
struct Executor::DecodedFunction {
  std::string name;
  int chunk = -1;
  bool forward = false;
  /// Slot region (numSlots = 0: none).
  int64_t slotBase = 0, slotBytes = 0;
  int numSlots = 0;
  /// Not a backward, and some instruction has the loss buffer as an operand.
  bool writesLoss = false;
  /// A split backward's weight-gradient phase ("backward_w_c<k>"): it has
  /// no Send/Recv and writes no p2p staging buffer, so sends still in
  /// flight stay in flight while it computes.
  bool weightGrad = false;
  /// A forward's inputs in its slot region: those its chunk's functions
  /// read (filled at the slot's copy before each of its schedule steps).
  std::vector<const fb::InputSpec *> slotInputs;
  std::vector<std::vector<Thunk>> slots;
  /// Per slot: the buffers every part of this function's phase (its
  /// "recv:" and "send:" parts and itself) sends from; a run of any part
  /// first completes the in-flight sends from them (the compute part
  /// writes the staging buffers its send part sends).
  std::vector<std::vector<const void *>> phaseSends;
};

//===----------------------------------------------------------------------===//
// What the run functions see
//===----------------------------------------------------------------------===//

class ExecutorRunContext final : public ops::RunContext {
public:
  explicit ExecutorRunContext(Executor &ex) : ex(ex) {}

  Backend &backend() override { return *ex.be; }
  double lrFactor() const override { return ex.lrFactor; }
  double lossScale() const override { return ex.lossScale; }
  bool updatesSkipped() const override { return ex.updatesSkipped; }
  void skipUpdates() override { ex.updatesSkipped = true; }
  Status syncForHostComm(const Thunk &t) override {
    return ex.syncForHostComm(t);
  }
  Status checkEventFree(int event) override {
    if (ex.pending.count(event))
      return failedPrecondition("event ", event, " is already in flight");
    return Status();
  }
  void recordEvent(int event, Communicator *comm,
                   CommRequest request) override {
    ex.pending[event] = {comm, request};
  }
  StatusOr<std::pair<Communicator *, CommRequest>>
  takeEvent(int event) override {
    auto it = ex.pending.find(event);
    if (it == ex.pending.end())
      return failedPrecondition("Wait on event ", event,
                                " which was not started");
    auto started = it->second;
    ex.pending.erase(it);
    return started;
  }
  bool gatherAtStart() const override { return ex.gatherAtStart; }
  Status startParamSync(const Thunk &t) override {
    if (ex.paramSyncs.count(t.event) || ex.heldParamSyncs.count(t.event))
      return failedPrecondition("parameter sync ", t.event,
                                " is started while still in flight");
    if (ex.holdParamSyncs) {
      ex.heldParamSyncs[t.event] = &t;
      return Status();
    }
    TESSERA_ASSIGN_OR_RETURN(CommRequest request, ops::startParamSyncGather(t));
    ex.paramSyncs[t.event] = {t.comm, request};
    return Status();
  }
  Status finishParamSync(int id) override { return ex.finishParamSync(id); }
  void joinP2pBatch(const Thunk &t, CommRequest request) override {
    if (ex.p2pBatch.empty()) {
      const Executor::DecodedFunction *fn = ex.currentFunction;
      ex.p2pBatchOpener = "function '" + (fn ? fn->name : "?") + "'";
      if (fn && fn->name != "step")
        ex.p2pBatchOpener +=
            " microbatch " + std::to_string(ex.currentMicrobatch);
      if (fn && fn->numSlots > 0)
        ex.p2pBatchOpener += " slot " + std::to_string(ex.currentSlot);
    }
    ex.p2pBatch.push_back({t.comm, request, &t});
  }
  Status selfSend(const Thunk &t) override {
    // A kept buffer large enough, else a new one.
    auto fits = std::find_if(ex.selfFree.begin(), ex.selfFree.end(),
                             [&](const Executor::SelfMessage &m) {
                               return m.capacity >= t.bytes;
                             });
    Executor::SelfMessage msg;
    if (fits != ex.selfFree.end()) {
      msg = *fits;
      ex.selfFree.erase(fits);
    } else {
      TESSERA_ASSIGN_OR_RETURN(void *mem, ex.be->allocate(t.bytes));
      msg = {mem, t.bytes, 0};
    }
    msg.bytes = t.bytes;
    Status st = ex.be->copy(t.ptr[0], msg.data, t.bytes);
    if (st.ok())
      ex.selfQueues[t.i[1]].push_back(msg);
    else
      ex.selfFree.push_back(msg);
    return st;
  }
  Status selfRecv(const Thunk &t) override {
    auto it = ex.selfQueues.find(t.i[1]);
    if (it == ex.selfQueues.end() || it->second.empty())
      return failedPrecondition(
          "receives from pp rank ", t.i[2], " itself on tag ", t.i[1],
          ", which sent nothing there (the schedule runs the receiving chunk "
          "first)");
    Executor::SelfMessage msg = it->second.front();
    if (msg.bytes != t.bytes)
      return failedPrecondition("receives ", t.bytes,
                                " bytes from pp rank ", t.i[2],
                                " itself on tag ", t.i[1], ", which sent ",
                                msg.bytes);
    it->second.pop_front();
    ex.selfFree.push_back(msg);
    return ex.be->copy(msg.data, t.ptr[0], t.bytes);
  }
  uint64_t seed() const override { return ex.options.seed; }
  int64_t firstSample() const override {
    return globalSampleIndex(ex.layout, ex.currentIteration,
                             ex.currentMicrobatch, 0);
  }
  StatusOr<uint8_t *> scratch(int64_t bytes) override {
    if (ex.scratchBytes < bytes) {
      if (ex.scratch)
        ex.be->deallocate(ex.scratch);
      ex.scratch = nullptr;
      ex.scratchBytes = 0;
      TESSERA_ASSIGN_OR_RETURN(void *mem, ex.be->allocate(bytes));
      ex.scratch = static_cast<uint8_t *>(mem);
      ex.scratchBytes = bytes;
    }
    return ex.scratch;
  }

private:
  Executor &ex;
};

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

Executor::Executor()
    : runContext(std::make_unique<ExecutorRunContext>(*this)) {}

Executor::~Executor() {
  resetSelfQueues();
  if (be)
    for (const SelfMessage &msg : selfFree)
      be->deallocate(msg.data);
  if (scratch && be)
    be->deallocate(scratch);
  if (transfer && be)
    be->deallocateHost(transfer);
  if (staging && be)
    be->deallocateHost(staging);
  if (lossSlots && be)
    be->deallocate(lossSlots);
  if (arena && be)
    be->deallocate(arena);
}

StatusOr<std::unique_ptr<Executor>>
Executor::create(std::shared_ptr<const LoadedArtifact> artifact,
                 std::unique_ptr<Backend> backend, CommunicatorSet comms,
                 int worldRank, const ExecutorOptions &options) {
  if (!artifact || !backend)
    return invalidArgument("Executor::create needs an artifact and a backend");
  std::unique_ptr<Executor> ex(new Executor());
  if (const char *hold = std::getenv("TESSERA_DEBUG_PARAM_SYNC_AT_WAIT"))
    ex->holdParamSyncs = std::string(hold) == "1";
  if (const char *early = std::getenv("TESSERA_DEBUG_GATHER_AT_START"))
    ex->gatherAtStart = std::string(early) == "1";
  const fb::Artifact &a = *artifact->root();
  if (worldRank < 0 || worldRank >= a.world_size())
    return invalidArgument(artifact->name(), ": rank ", worldRank,
                           " outside world_size ", a.world_size());
  ex->prog = artifact->programForWorldRank(worldRank);
  if (!ex->prog)
    return invalidArgument(artifact->name(), ": no program for rank ",
                           worldRank);
  ex->art = std::move(artifact);
  ex->be = std::move(backend);
  ex->comms = std::move(comms);
  ex->rank = worldRank;
  ex->options = options;

  GroupPosition dp = findGroupPosition(a, "dp", worldRank);
  GroupPosition pp = findGroupPosition(a, "pp", worldRank);
  ex->ppIndex = pp.group ? pp.index : 0;
  ex->ppSize = pp.group ? pp.size : 1;
  ex->layout.seed = options.seed;
  ex->layout.globalBatch = a.batch()->global_batch_size();
  ex->layout.microBatch = a.batch()->micro_batch_size();
  ex->layout.dpIndex = dp.index;
  ex->layout.dpSize = dp.size;
  GroupPosition cp = findGroupPosition(a, "cp", worldRank);
  ex->layout.cpIndex = cp.group ? cp.index : 0;
  ex->layout.cpSize = cp.group ? cp.size : 1;
  ex->layout.dataset = options.dataset;
  ex->layout.mockData = options.mockData && !options.dataset;
  if (options.dataset)
    TESSERA_RETURN_IF_ERROR(checkTokenInputs(
        *ex->prog, ex->layout.microBatch, *options.dataset, ex->art->name()));

  auto mem = ex->be->allocate(ex->prog->arena_bytes());
  if (!mem.ok()) {
    // Name what is too big: the arena holds every buffer of the memory
    // plan; its largest buffer is usually the answer.
    std::string largest;
    int64_t largestBytes = 0;
    if (ex->prog->buffers())
      for (const fb::Buffer *b : *ex->prog->buffers()) {
        int64_t bytes = numElements(b->shape()) * dtypeSize(b->dtype());
        if (bytes > largestBytes && b->name()) {
          largestBytes = bytes;
          largest = b->name()->str();
        }
      }
    return Status(mem.status().getCode(),
                  ex->art->name() + ": program " +
                      std::to_string(ex->prog->pp_rank()) +
                      ": cannot allocate its memory arena of " +
                      std::to_string(ex->prog->arena_bytes()) +
                      " bytes (largest buffer '" + largest + "', " +
                      std::to_string(largestBytes) +
                      " bytes; tessera-compile --emit=memory shows the "
                      "plan): " +
                      mem.status().message());
  }
  ex->arena = static_cast<uint8_t *>(*mem);
  // The V-shaped schedules (zbv, dualpipev) keep sends in flight.
  {
    const std::string kind =
        ex->prog->schedule_kind() ? ex->prog->schedule_kind()->str() : "";
    ex->sendsInFlight = (kind == "zbv" || kind == "dualpipev");
  }
  TESSERA_RETURN_IF_ERROR(ex->bindFunctions());
  if (ex->sendsInFlight)
    for (const DecodedFunction &fn : ex->functions)
      for (const auto &slot : fn.slots)
        for (const Thunk &t : slot)
          if (isPointToPoint(t.op) && t.comm && t.comm->streamOrdered() &&
              t.i[0] != t.i[2])
            return unimplemented(
                ex->art->name(), ": schedule '",
                ex->prog->schedule_kind()->str(),
                "' keeps sends in flight while later phases receive and "
                "compute, which this backend's communicator cannot do yet "
                "(NCCL orders every point-to-point call of a communicator on "
                "one stream); run it on the CPU backend, or compile with "
                "--schedule zb-h1 or interleaved");
  // One f32 per loss an iteration computes, gathered on the device and read
  // back once per iteration.
  TESSERA_ASSIGN_OR_RETURN(void *slots,
                           ex->be->allocate(4 * std::max<int64_t>(
                                                    1, ex->numLossSlots)));
  ex->lossSlots = static_cast<uint8_t *>(slots);
  // Staging for one iteration's inputs: every fill of every input (one per
  // microbatch, or per schedule step at most) and the iteration number.
  int64_t inputBytes = 0;
  if (ex->prog->inputs())
    for (const fb::InputSpec *spec : *ex->prog->inputs()) {
      const fb::Buffer *b = ex->prog->buffers()->Get(spec->buffer());
      inputBytes += (numElements(b->shape()) * dtypeSize(b->dtype()) + 63) /
                    64 * 64;
    }
  const int64_t fills =
      ex->prog->schedule() && ex->prog->schedule()->size()
          ? int64_t(ex->prog->schedule()->size())
          : a.batch()->num_microbatches();
  ex->stagingBytes = fills * inputBytes + 64;
  TESSERA_ASSIGN_OR_RETURN(void *host, ex->be->allocateHost(ex->stagingBytes));
  ex->staging = static_cast<uint8_t *>(host);
  return ex;
}

StatusOr<Communicator *> Executor::groupCommunicator(const std::string &kind) {
  auto it = comms.groups.find(kind);
  if (it != comms.groups.end() && it->second)
    return it->second.get();
  // Kinds with a one-rank instance here may run without MPI. The decoder
  // has already rejected kinds whose instances leave this rank out.
  GroupPosition pos = findGroupPosition(*art->root(), kind, rank);
  if (pos.size != 1)
    return failedPrecondition("no communicator for group kind '", kind, "' (",
                              pos.size, " ranks)");
  auto &self = selfComms[kind];
  // Its copies go through the backend, on the backend's stream.
  if (!self)
    self = createSelfCommunicator(
        [be = be.get()](const void *src, void *dst, int64_t bytes) {
          return be->copy(src, dst, bytes);
        });
  return self.get();
}

Status Executor::bindFunctions() {
  auto lookup = [this](const std::string &kind) -> StatusOr<Communicator *> {
    return groupCommunicator(kind);
  };
  Decoder decoder(*art, *prog, arena, rank, lookup);
  int64_t lossOffset = prog->loss_buffer() >= 0
                           ? prog->buffers()->Get(prog->loss_buffer())->offset()
                           : -1;
  if (prog->functions())
    for (const fb::Function *fn : *prog->functions()) {
      DecodedFunction f;
      f.name = fn->name() ? fn->name()->str() : "";
      f.chunk = fn->chunk();
      f.forward = isForwardFunction(f.name);
      f.weightGrad = isWeightGradFunction(f.name);
      f.numSlots = fn->num_slots();
      f.slotBase = f.numSlots > 0 ? fn->slot_base() : 0;
      f.slotBytes = f.numSlots > 0 ? fn->slot_bytes() : 0;
      f.slots.resize(size_t(std::max(1, f.numSlots)));
      for (int slot = 0; slot < int(f.slots.size()); ++slot)
        TESSERA_RETURN_IF_ERROR(
            decoder.decode(*fn, f.slots[size_t(slot)], slot));
      for (const Thunk &t : f.slots.front())
        if (Status st = be->supports(fb::EnumNameOpcode(t.op)); !st.ok())
          return Status(st.getCode(), art->name() + ": " + t.where + ": " +
                                          st.message());
      // A backward that reads (or recomputes) the loss does not add to it.
      if (lossOffset >= 0 && fn->instrs() && !isBackwardFunction(f.name))
        for (const fb::Instr *in : *fn->instrs())
          if (in->operands())
            for (const fb::TensorRef *r : *in->operands()) {
              // Decoding resolved every rank-relative ref already.
              StatusOr<int64_t> offset =
                  resolvedOffset(*art->root(), *r, rank);
              f.writesLoss |= offset.ok() && *offset == lossOffset;
            }
      functionIndex[f.name] = functions.size();
      functions.push_back(std::move(f));
    }
  for (const fb::Program *p : *art->root()->programs())
    artifactHasLoss |= p->loss_buffer() >= 0;
  // Inputs in no forward's slot region are filled in place by every forward;
  // one in a chunk's slot region by that chunk's forwards, at the slot's
  // copy, and by no other: the chunks of an interleaved schedule share one
  // pool of slots, and another chunk holding the slot may have a receive
  // pending into the same bytes.
  if (prog->inputs())
    for (const fb::InputSpec *spec : *prog->inputs()) {
      int64_t offset = prog->buffers()->Get(spec->buffer())->offset();
      bool slotted = false;
      for (DecodedFunction &f : functions)
        if (f.forward && f.numSlots > 0 && offset >= f.slotBase &&
            offset < f.slotBase + f.slotBytes) {
          slotted = true;
          if (spec->chunk() == f.chunk)
            f.slotInputs.push_back(spec);
        }
      if (!slotted)
        unslottedInputs.push_back(spec);
    }
  bool scheduled = prog->schedule() && prog->schedule()->size();
  if (scheduled) {
    for (const fb::ScheduleStep *step : *prog->schedule())
      if (functions[size_t(step->function())].writesLoss) {
        stageHasLoss = true;
        ++numLossSlots;
      }
  } else if (prog->loss_buffer() >= 0) {
    numLossSlots = art->root()->batch()->num_microbatches();
  }
  if (!scheduled && !functionIndex.count("microbatch"))
    return invalidArgument(art->name(), ": program ", prog->pp_rank(),
                           " has no 'microbatch' function (and no "
                           "schedule)");
  // The send buffers of each phase, over its parts (for the sends kept in
  // flight).
  if (!sendsInFlight)
    return Status();
  std::map<std::string, std::vector<size_t>> parts;
  auto baseName = [](const std::string &name) {
    return name.rfind("recv:", 0) == 0 || name.rfind("send:", 0) == 0
               ? name.substr(5)
               : name;
  };
  for (size_t i = 0; i < functions.size(); ++i)
    parts[baseName(functions[i].name)].push_back(i);
  for (DecodedFunction &f : functions) {
    f.phaseSends.resize(f.slots.size());
    for (size_t s = 0; s < f.slots.size(); ++s)
      for (size_t other : parts[baseName(f.name)]) {
        const DecodedFunction &g = functions[other];
        if (s < g.slots.size())
          for (const Thunk &t : g.slots[s])
            if (t.op == fb::Opcode::Send)
              f.phaseSends[s].push_back(t.ptr[0]);
      }
  }
  return Status();
}

const fb::Buffer *Executor::findBuffer(const std::string &name) const {
  if (prog->buffers())
    for (const fb::Buffer *b : *prog->buffers())
      if (b->name() && b->name()->str() == name)
        return b;
  return nullptr;
}

Status Executor::initializeParameters() {
  std::vector<float> host;
  std::vector<uint16_t> half;
  for (const fb::Buffer *b : *prog->buffers()) {
    int64_t n = numElements(b->shape());
    if (b->kind() == fb::BufferKind::MainParam) {
      // Zero until "init" (or a checkpoint) writes them, also when the
      // parameters are initialised a second time.
      std::vector<uint8_t> zeros(size_t(n * dtypeSize(b->dtype())), 0);
      TESSERA_RETURN_IF_ERROR(
          copyIn(arena + b->offset(), zeros.data(), int64_t(zeros.size())));
      continue;
    }
    if (b->kind() != fb::BufferKind::Param && b->init() == fb::InitKind::Zeros)
      continue;
    if (b->kind() != fb::BufferKind::Param && b->dtype() != fb::DType::F32)
      continue;
    host.assign(size_t(n), 0.0f);
    TESSERA_RETURN_IF_ERROR(initParameterBuffer(
        *art->root(), *b, rank, options.seed, art->name(), host.data()));
    if (b->staged()) {
      // ZeRO-3: this rank's part of it into its bucket's shard.
      if (b->dtype() == fb::DType::BF16 || b->dtype() == fb::DType::F16) {
        half.resize(size_t(n));
        floatsToHalf(floatFormatOf(b->dtype()), host.data(), half.data(), n);
        TESSERA_RETURN_IF_ERROR(scatterStaged(
            *b, reinterpret_cast<const uint8_t *>(half.data())));
      } else {
        TESSERA_RETURN_IF_ERROR(scatterStaged(
            *b, reinterpret_cast<const uint8_t *>(host.data())));
      }
      continue;
    }
    if (b->dtype() == fb::DType::BF16 || b->dtype() == fb::DType::F16) {
      // The f32 initial values rounded: a bf16 or fp16 run starts from the
      // f32 run's weights to 16-bit precision.
      half.resize(size_t(n));
      floatsToHalf(floatFormatOf(b->dtype()), host.data(), half.data(), n);
      TESSERA_RETURN_IF_ERROR(copyIn(arena + b->offset(), half.data(), n * 2));
    } else {
      TESSERA_RETURN_IF_ERROR(copyIn(arena + b->offset(), host.data(), n * 4));
    }
  }
  releaseStagedParameters();
  initDue = true;
  mainParamWritten.assign(prog->buffers()->size(), false);
  return Status();
}

StatusOr<bool> Executor::runInit() {
  if (!initDue)
    return false;
  initDue = false;
  auto it = functionIndex.find("init");
  if (it == functionIndex.end())
    return false;
  // Skipped when a checkpoint restored every main param: recomputing them
  // from the bf16 params would throw away their fp32 precision.
  int mainParams = 0, restored = 0;
  for (flatbuffers::uoffset_t i = 0; i < prog->buffers()->size(); ++i)
    if (prog->buffers()->Get(i)->kind() == fb::BufferKind::MainParam) {
      ++mainParams;
      restored += i < mainParamWritten.size() && mainParamWritten[i];
    }
  if (mainParams > 0 && restored == mainParams)
    return false;
  const DecodedFunction &fn = functions[it->second];
  TESSERA_RETURN_IF_ERROR(runThunks(fn, 0, "init", "", /*drainP2p=*/true));
  return true;
}

Status Executor::fillInputs(int64_t iteration, int64_t microbatch,
                            int64_t displacement, int64_t regionBegin,
                            int64_t regionEnd) {
  if (!prog->inputs())
    return Status();
  for (const fb::InputSpec *spec : *prog->inputs()) {
    int64_t offset = prog->buffers()->Get(spec->buffer())->offset();
    if (offset >= regionBegin && offset < regionEnd)
      TESSERA_RETURN_IF_ERROR(
          fillInput(*spec, iteration, microbatch, displacement));
  }
  return Status();
}

Status Executor::fillInput(const fb::InputSpec &spec, int64_t iteration,
                           int64_t microbatch, int64_t displacement) {
  TESSERA_RETURN_IF_ERROR(generateInput(*prog, spec, layout, iteration,
                                        microbatch, art->name(), hostInput));
  const fb::Buffer *b = prog->buffers()->Get(spec.buffer());
  int64_t offset = b->offset() + displacement;
  int64_t bytes = int64_t(hostInput.size());
  if (offset < 0 || offset + bytes > prog->arena_bytes())
    return outOfRange(art->name(), ": input '",
                      spec.name() ? spec.name()->str() : "", "' moved by ",
                      displacement, " bytes lies outside the arena of ",
                      prog->arena_bytes(), " bytes");
  return stageToDevice(arena + offset, hostInput.data(), bytes);
}

Status Executor::stageToDevice(void *dst, const void *src, int64_t bytes) {
  const int64_t size = (bytes + 63) / 64 * 64;
  if (stagingUsed + size > stagingBytes) {
    // More than an iteration's worth (a caller filling inputs outside
    // runIteration): wait until the earlier copies have read theirs.
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    stagingUsed = 0;
    if (size > stagingBytes)
      return be->copyToDevice(dst, src, bytes);
  }
  uint8_t *slot = staging + stagingUsed;
  std::memcpy(slot, src, size_t(bytes));
  stagingUsed += size;
  return be->copyToDevice(dst, slot, bytes);
}

Status Executor::syncForHostComm(const Thunk &t) {
  // A communicator ordered on the backend's stream (NCCL, or a group of one
  // copying through the backend) needs no host wait; one that reads the
  // memory from the host (MPI) needs the kernels before it done.
  if (t.comm && t.comm->streamOrdered())
    return Status();
  return be->synchronize();
}

Status Executor::execute(const Thunk &t) { return t.run(*runContext, t); }

static int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Executor::stalledInstruction(double seconds) const {
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    if (!waitDescription.empty()) {
      double stuck = double(steadyNowNs() - waitSinceNs) * 1e-9;
      if (stuck < seconds)
        return "";
      return art->name() + ": " + waitDescription + " made no progress for " +
             std::to_string(int64_t(stuck)) + " s";
    }
  }
  const Thunk *t = inFlight.load();
  if (!t)
    return "";
  double stuck = double(steadyNowNs() - inFlightSinceNs.load()) * 1e-9;
  if (stuck < seconds || inFlight.load() != t)
    return "";
  return art->name() + ": " + t->where + " made no progress for " +
         std::to_string(int64_t(stuck)) + " s";
}

Status Executor::completeP2pBatch() {
  // Everything: the open batch and the sends still in flight.
  std::vector<P2pOp> batch;
  batch.swap(p2pBatch);
  batch.insert(batch.end(), inflightSends.begin(), inflightSends.end());
  inflightSends.clear();
  return waitP2p(std::move(batch), "the p2p batch opened by " + p2pBatchOpener);
}

Status Executor::completeP2pReceives() {
  std::vector<P2pOp> receives;
  for (const P2pOp &op : p2pBatch)
    (op.thunk->op == fb::Opcode::Send ? inflightSends : receives).push_back(op);
  p2pBatch.clear();
  return waitP2p(std::move(receives),
                 "the receives of the p2p batch opened by " + p2pBatchOpener);
}

Status Executor::completeInflightSends(const std::vector<const void *> *buffers) {
  std::vector<P2pOp> done, kept;
  for (const P2pOp &op : inflightSends) {
    bool reused =
        !buffers || std::find(buffers->begin(), buffers->end(),
                              op.thunk->ptr[0]) != buffers->end();
    (reused ? done : kept).push_back(op);
  }
  inflightSends.swap(kept);
  return waitP2p(std::move(done),
                 "earlier sends from buffers this phase sends from again");
}

Status Executor::waitP2p(std::vector<P2pOp> batch, const std::string &opener) {
  if (batch.empty())
    return Status();
  std::string what =
      "pipeline stage " + std::to_string(ppIndex) + " (pp rank " +
      std::to_string(ppIndex) + " of " + std::to_string(ppSize) +
      "): waiting for " + opener + ": ";
  for (size_t i = 0; i < batch.size(); ++i)
    what += (i ? "; " : "") + batch[i].thunk->p2pDetail;
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription = what;
    waitSinceNs = steadyNowNs();
  }
  auto start = std::chrono::steady_clock::now();
  // Every request of one communicator is waited together (all Send/Recv run
  // over "pp", so this is one MPI_Waitall).
  Status st;
  std::vector<Communicator *> order;
  std::map<Communicator *, std::vector<CommRequest>> byComm;
  for (const P2pOp &op : batch) {
    if (!byComm.count(op.comm))
      order.push_back(op.comm);
    byComm[op.comm].push_back(op.request);
  }
  for (Communicator *comm : order) {
    Status s = comm->waitAll(byComm[comm]);
    if (st.ok())
      st = s;
  }
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription.clear();
  }
  auto end = std::chrono::steady_clock::now();
  if (options.profile)
    kernelTime["P2pWait"] += std::chrono::duration<double>(end - start).count();
  if (options.trace)
    trace.push_back({"p2p wait", "p2p", sinceEpochUs(start),
                     sinceEpochUs(end) - sinceEpochUs(start)});
  if (!st.ok())
    return Status(st.getCode(),
                  art->name() + ": " + what + ": " + st.message());
  return Status();
}

std::string Executor::phaseName(const DecodedFunction &fn,
                                int64_t microbatch) const {
  std::string mb = "mb" + std::to_string(microbatch);
  if (fn.name == "microbatch" || fn.name == "microbatch:last")
    return "microbatch " + std::to_string(microbatch);
  bool forward = fn.forward, backward = isBackwardFunction(fn.name);
  if (!forward && !backward)
    return fn.name;
  int chunk = fn.chunk;
  size_t c = fn.name.rfind("_c");
  if (chunk < 0 && c != std::string::npos && c + 2 < fn.name.size() &&
      std::all_of(fn.name.begin() + long(c) + 2, fn.name.end(),
                  [](char ch) { return std::isdigit((unsigned char)ch); }))
    chunk = std::atoi(fn.name.c_str() + c + 2);
  // A split backward's weight-gradient phase (backward_w_c<k>): W.
  return std::string(forward ? "F " : fn.weightGrad ? "W " : "B ") +
         (chunk >= 0 ? "c" + std::to_string(chunk) + " " : "") + mb;
}

Status Executor::runFunction(const std::string &name, int slot) {
  auto it = functionIndex.find(name);
  if (it == functionIndex.end())
    return notFound(art->name(), ": program ", prog->pp_rank(),
                    " has no function '", name, "'");
  const DecodedFunction &fn = functions[it->second];
  if (slot < 0 || slot >= int(fn.slots.size()))
    return outOfRange(art->name(), ": program ", prog->pp_rank(), " function '",
                      name, "' has no slot ", slot, " (", fn.numSlots,
                      " slots)");
  // (A function may update the ZeRO-3 shards: the step does.)
  paramStagingCurrent = false;
  return runThunks(fn, slot, phaseName(fn, currentMicrobatch), "",
                   /*drainP2p=*/false);
}

Status Executor::runThunks(const DecodedFunction &fn, int slot,
                           const std::string &phase, const std::string &context,
                           bool drainP2p) {
  const bool timed = options.profile || options.trace;
  currentFunction = &fn;
  currentSlot = slot;
  auto phaseStart = std::chrono::steady_clock::now();
  // Sends of the previous phase still in flight: a weight-gradient phase
  // computes under them (the zero-bubble schedules send B's input gradient
  // and run W while it travels); they join the next batch.
  // Sends in flight (zbv, dualpipev) from a buffer this run writes or
  // sends from again complete first.
  // (lower-to-rt gives every such send a staging buffer of its own, so
  // no send reads a slot that a later forward takes.)
  if (sendsInFlight) {
    // (The open batch's sends are in flight as well.)
    for (auto it = p2pBatch.begin(); it != p2pBatch.end();)
      if (it->thunk->op == fb::Opcode::Send) {
        inflightSends.push_back(*it);
        it = p2pBatch.erase(it);
      } else {
        ++it;
      }
    if (!inflightSends.empty())
      TESSERA_RETURN_IF_ERROR(
          completeInflightSends(&fn.phaseSends[size_t(slot)]));
  }
  const bool underSends =
      !sendsInFlight && fn.weightGrad && !p2pBatch.empty() &&
      std::all_of(p2pBatch.begin(), p2pBatch.end(), [](const P2pOp &op) {
        return op.thunk->op == fb::Opcode::Send;
      });
  // A backend that queues them until the wait (NCCL) starts them now, so
  // that they travel while W computes.
  if (underSends) {
    std::map<Communicator *, std::vector<CommRequest>> byComm;
    for (const P2pOp &op : p2pBatch)
      byComm[op.comm].push_back(op.request);
    for (auto &[comm, requests] : byComm)
      TESSERA_RETURN_IF_ERROR(comm->issue(requests).withContext(
          art->name() + ": starting the sends before '" + fn.name + "'"));
  }
  for (const Thunk &t : fn.slots[size_t(slot)]) {
    const bool p2p = isPointToPoint(t.op);
    // Anything but another Send/Recv needs the open batch completed first
    // (its receives alone when sends stay in flight).
    if (!p2p && !underSends)
      TESSERA_RETURN_IF_ERROR(sendsInFlight ? completeP2pReceives()
                                            : completeP2pBatch());
    Status st;
    auto start = timed ? std::chrono::steady_clock::now()
                       : std::chrono::steady_clock::time_point();
    inFlightSinceNs.store(steadyNowNs());
    inFlight.store(&t);
    try {
      st = execute(t);
    } catch (const std::exception &e) {
      st = internalError("exception: ", e.what());
    }
    inFlight.store(nullptr);
    if (timed) {
      // Kernels may run asynchronously on other backends: time to completion.
      if (st.ok())
        st = be->synchronize();
      auto end = std::chrono::steady_clock::now();
      if (options.profile)
        kernelTime[fb::EnumNameOpcode(t.op)] +=
            std::chrono::duration<double>(end - start).count();
      if (options.trace)
        trace.push_back({p2p ? t.p2pLabel : fb::EnumNameOpcode(t.op),
                         p2p ? "p2p"
                         : t.comm || opcodeInfo(t.op).cls == OpClass::Event
                             ? "communication" // (a Wait: its time is comm)
                             : "compute",
                         sinceEpochUs(start),
                         sinceEpochUs(end) - sinceEpochUs(start),
                         t.comm && !p2p ? t.group : std::string()});
    }
    if (!st.ok())
      return Status(st.getCode(), art->name() + ": " + t.where + context +
                                      ": " + st.message());
    // Started collectives advance between kernels (overlap with compute).
    if (!t.comm && !p2p) {
      for (auto &[event, request] : pending)
        if (request.first) // (null: completed at its start)
          TESSERA_RETURN_IF_ERROR(request.first->progress(request.second).withContext(
            art->name() + ": " + t.where + context + ": progressing event " +
            std::to_string(event)));
      for (auto &[id, request] : paramSyncs)
        TESSERA_RETURN_IF_ERROR(request.first->progress(request.second).withContext(
            art->name() + ": " + t.where + context +
            ": progressing parameter sync " + std::to_string(id)));
      if (underSends)
        for (const P2pOp &op : p2pBatch)
          TESSERA_RETURN_IF_ERROR(op.comm->progress(op.request).withContext(
              art->name() + ": " + t.where + context + ": progressing " +
              op.thunk->p2pDetail));
      for (const P2pOp &op : inflightSends)
        TESSERA_RETURN_IF_ERROR(op.comm->progress(op.request).withContext(
            art->name() + ": " + t.where + context + ": progressing " +
            op.thunk->p2pDetail));
    }
  }
  if (drainP2p)
    TESSERA_RETURN_IF_ERROR(completeP2pBatch());
  if (options.trace) {
    double begin = sinceEpochUs(phaseStart);
    trace.push_back({phase, "phase", begin,
                     sinceEpochUs(std::chrono::steady_clock::now()) - begin});
  }
  if (!pending.empty()) {
    int event = pending.begin()->first;
    // Complete the stray requests so MPI state stays consistent.
    for (auto &entry : pending)
      if (entry.second.first)
        entry.second.first->wait(entry.second.second).ignoreError();
    pending.clear();
    return failedPrecondition(
        art->name(), ": program ", prog->pp_rank(), " function '", fn.name,
        "' ended with async event ", event, " never waited for");
  }
  // No synchronisation: the backend's stream orders what follows (the
  // iteration synchronises once, in collectLosses).
  return Status();
}

Status Executor::stageLoss(int64_t offset, int64_t index) {
  if (index < 0 || index >= numLossSlots)
    return internalError(art->name(), ": loss ", index, " of an iteration with ",
                         numLossSlots, " loss slots");
  return be->copy(arena + offset, lossSlots + 4 * index, 4);
}

StatusOr<double> Executor::collectLosses(int64_t iteration, int64_t count) {
  // The one host synchronisation of an iteration; kernels that record
  // errors on the device (an out-of-range token id) report them here. The
  // watchdog sees the wait: with stream-ordered collectives a hung one
  // shows up here, not in its instruction.
  const std::string what = "program " + std::to_string(prog->pp_rank()) +
                           " iteration " + std::to_string(iteration);
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription = what + ": waiting for the " + be->name() +
                      " backend to finish the iteration's kernels and "
                      "collectives";
    waitSinceNs = steadyNowNs();
  }
  Status synced = be->synchronize();
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription.clear();
  }
  TESSERA_RETURN_IF_ERROR(synced.withContext(art->name() + ": " + what));
  // Every staged copy of the iteration has been read.
  stagingUsed = 0;
  if (count == 0)
    return 0.0;
  std::vector<float> losses(static_cast<size_t>(count));
  TESSERA_RETURN_IF_ERROR(
      be->copyToHost(losses.data(), lossSlots, 4 * count));
  // Summed in microbatch order in double, as when each was read at once.
  double sum = 0.0;
  for (float loss : losses)
    sum += double(loss);
  return sum;
}

double Executor::learningRate(int64_t iteration) const {
  const fb::Optimizer *opt = art->root()->optimizer();
  if (!opt)
    return 0.0;
  LrSchedule schedule;
  schedule.maxLr = opt->lr();
  schedule.minLr = opt->min_lr();
  schedule.warmupIters = opt->lr_warmup_iters();
  schedule.decayIters = opt->lr_decay_iters();
  if (opt->lr_decay_style() && opt->lr_decay_style()->size())
    schedule.style = opt->lr_decay_style()->str();
  return schedule.at(iteration);
}

Status Executor::finishParamSync(int id) const {
  if (auto held = heldParamSyncs.find(id); held != heldParamSyncs.end()) {
    const Thunk *t = held->second;
    heldParamSyncs.erase(held);
    TESSERA_ASSIGN_OR_RETURN(CommRequest request, ops::startParamSyncGather(*t));
    paramSyncs[id] = {t->comm, request};
  }
  auto it = paramSyncs.find(id);
  if (it == paramSyncs.end())
    return Status();
  auto started = it->second;
  paramSyncs.erase(it);
  return started.first->wait(started.second);
}

Status Executor::finishParamSync() const {
  if (paramSyncs.empty() && heldParamSyncs.empty())
    return Status();
  // A dead data-parallel peer shows as this wait in the watchdog's error.
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription = "pipeline stage " + std::to_string(ppIndex) +
                      ": finishing the parameter all-gathers "
                      "(--overlap-param-gather) of the last step";
    waitSinceNs = steadyNowNs();
  }
  std::set<int> ids;
  for (auto &entry : paramSyncs)
    ids.insert(entry.first);
  for (auto &entry : heldParamSyncs)
    ids.insert(entry.first);
  Status first;
  for (int id : ids) {
    Status st = finishParamSync(id);
    if (first.ok() && !st.ok())
      first = Status(st.getCode(), art->name() + ": finishing parameter sync " +
                                       std::to_string(id) + ": " +
                                       st.message());
  }
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription.clear();
  }
  return first;
}

Status Executor::runStep(int64_t iteration) {
  // Gradient sync and the optimizer run once, after every microbatch.
  TESSERA_RETURN_IF_ERROR(completeP2pBatch());
  // A bucket no forward read is still being gathered: the step updates
  // its shard.
  TESSERA_RETURN_IF_ERROR(finishParamSync());
  if (prog->iteration_buffer() >= 0) {
    // Adam's step count: the iterations that updated (Megatron's optimizer
    // steps only when it does not skip).
    const fb::Buffer *b = prog->buffers()->Get(prog->iteration_buffer());
    int64_t it = iteration - skippedIterations;
    TESSERA_RETURN_IF_ERROR(stageToDevice(arena + b->offset(), &it, 8));
  }
  if (functionIndex.count("step"))
    TESSERA_RETURN_IF_ERROR(runFunction("step"));
  return completeP2pBatch();
}

StatusOr<double> Executor::runIteration(int64_t iteration) {
  // The main params exist before the first step (callers that restore a
  // checkpoint run "init" themselves, after the load).
  if (initDue)
    TESSERA_RETURN_IF_ERROR(runInit().status());
  updatesSkipped = false;
  // ZeRO-3: the step updates the shards; the staging no longer matches.
  paramStagingCurrent = false;
  // The optimizer steps carry the peak rate; the schedule scales it, at
  // the count of iterations that updated (Megatron's scheduler steps only
  // then).
  if (const fb::Optimizer *opt = art->root()->optimizer())
    lrFactor = opt->lr() > 0 ? learningRate(iteration - skippedIterations) /
                                   double(opt->lr())
                             : 1.0;
  if (prog->schedule() && prog->schedule()->size())
    return runSchedule(iteration);
  const int64_t numMicro = art->root()->batch()->num_microbatches();
  bool hasLoss = prog->loss_buffer() >= 0;
  for (int64_t m = 0; m < numMicro; ++m) {
    TESSERA_RETURN_IF_ERROR(fillInputs(iteration, m));
    currentIteration = iteration;
    currentMicrobatch = m;
    // The last microbatch may have a variant that starts the gradient
    // buckets' reductions during its backward (overlap).
    const bool last = m + 1 == numMicro && functionIndex.count("microbatch:last");
    TESSERA_RETURN_IF_ERROR(runFunction(last ? "microbatch:last" : "microbatch"));
    if (hasLoss)
      TESSERA_RETURN_IF_ERROR(stageLoss(
          prog->buffers()->Get(prog->loss_buffer())->offset(), m));
  }
  TESSERA_RETURN_IF_ERROR(runStep(iteration));
  TESSERA_ASSIGN_OR_RETURN(double lossSum,
                           collectLosses(iteration, hasLoss ? numMicro : 0));
  return reduceLoss(lossSum, /*scheduled=*/false);
}

StatusOr<double> Executor::reduceLoss(double lossSum, bool scheduled) {
  const int64_t numMicro = art->root()->batch()->num_microbatches();
  if (!(scheduled ? artifactHasLoss : prog->loss_buffer() >= 0))
    return std::numeric_limits<double>::quiet_NaN();
  double loss = lossSum / double(numMicro);
  if (scheduled) {
    // The stage that computes the loss reports the microbatch mean, the
    // others 0; the sum over the stages is the pipeline's loss.
    if (!stageHasLoss)
      loss = 0.0;
    if (ppSize > 1) {
      if (!comms.lossReducePp)
        return failedPrecondition(
            art->name(), ": a pipeline of ", ppSize,
            " stages needs a loss channel over its pp group "
            "(CommunicatorSet::lossReducePp)");
      TESSERA_RETURN_IF_ERROR(
          comms.lossReducePp
              ->allReduce(&loss, 1, ElementType::F64, ReduceKind::Sum)
              .withContext(art->name() + ": summing the loss over pp"));
    }
  }
  if (comms.lossReduce && comms.lossReduce->size() > 1) {
    TESSERA_RETURN_IF_ERROR(
        comms.lossReduce->allReduce(&loss, 1, ElementType::F64, ReduceKind::Sum)
            .withContext(art->name() + ": averaging the loss over dp"));
    loss /= double(comms.lossReduce->size());
  }
  return loss;
}

bool Executor::hasEvalPhase() const {
  if (functionIndex.count("eval"))
    return true;
  for (const DecodedFunction &f : functions)
    if (f.name.rfind("eval_c", 0) == 0)
      return true;
  return false;
}

StatusOr<double> Executor::evaluate(int64_t iteration,
                                    std::shared_ptr<const IndexedDataset> data) {
  if (!hasEvalPhase())
    return failedPrecondition(
        art->name(), ": program ", prog->pp_rank(),
        " has no evaluation phase (compiled before tessera-compile emitted "
        "one): recompile the model to evaluate it");
  // The validation set's samples for this evaluation only.
  std::shared_ptr<const IndexedDataset> training = layout.dataset;
  if (data)
    layout.dataset = std::move(data);
  struct Restore {
    DataLayout &layout;
    std::shared_ptr<const IndexedDataset> dataset;
    ~Restore() { layout.dataset = std::move(dataset); }
  } restore{layout, std::move(training)};
  // The evaluation reads every parameter (its forwards also wait per
  // bucket; this covers a bucket none of them reads).
  TESSERA_RETURN_IF_ERROR(finishParamSync());
  const int64_t numMicro = art->root()->batch()->num_microbatches();
  currentIteration = iteration;
  int64_t losses = 0;
  if (prog->schedule() && prog->schedule()->size()) {
    resetSelfQueues();
    // Each chunk's evaluation phase (eval_c<k>, with its receive and send
    // parts) in the order of its forward's steps, on the forward's slot
    // (Megatron's forward-only pipeline schedule: the forwards alone keep
    // their order and their sends).
    struct EvalStep {
      const fb::ScheduleStep *step;
      size_t function;
    };
    std::vector<EvalStep> steps;
    for (const fb::ScheduleStep *step : *prog->schedule()) {
      const std::string &name = functions[size_t(step->function())].name;
      const bool part = name.rfind("recv:", 0) == 0 || name.rfind("send:", 0) == 0;
      const std::string prefix = part ? name.substr(0, 5) : std::string();
      const std::string phase = name.substr(prefix.size());
      if (!isForwardFunction(phase))
        continue;
      auto it = functionIndex.find(prefix + "eval" + phase.substr(7));
      if (it == functionIndex.end()) {
        if (part) // (this evaluation phase has no such part)
          continue;
        return failedPrecondition(art->name(), ": program ", prog->pp_rank(),
                                  " has no evaluation phase of '", phase, "'");
      }
      steps.push_back({step, it->second});
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const fb::ScheduleStep &step = *steps[i].step;
      const DecodedFunction &fn = functions[steps[i].function];
      TESSERA_RETURN_IF_ERROR(runScheduleStep(
          step, functions[size_t(step.function())], fn,
          "evaluation step " + std::to_string(i),
          "E " + fn.name + " mb" + std::to_string(step.microbatch()), iteration,
          /*last=*/i + 1 == steps.size(), losses));
    }
    TESSERA_RETURN_IF_ERROR(completeP2pBatch());
    TESSERA_ASSIGN_OR_RETURN(double lossSum, collectLosses(iteration, losses));
    return reduceLoss(lossSum, /*scheduled=*/true);
  }
  const bool hasLoss = prog->loss_buffer() >= 0;
  for (int64_t m = 0; m < numMicro; ++m) {
    TESSERA_RETURN_IF_ERROR(fillInputs(iteration, m));
    currentMicrobatch = m;
    TESSERA_RETURN_IF_ERROR(runFunction("eval"));
    if (hasLoss)
      TESSERA_RETURN_IF_ERROR(stageLoss(
          prog->buffers()->Get(prog->loss_buffer())->offset(), m));
  }
  TESSERA_RETURN_IF_ERROR(completeP2pBatch());
  TESSERA_ASSIGN_OR_RETURN(double lossSum,
                           collectLosses(iteration, hasLoss ? numMicro : 0));
  return reduceLoss(lossSum, /*scheduled=*/false);
}

Status Executor::runScheduleStep(const fb::ScheduleStep &step,
                                 const DecodedFunction &forward,
                                 const DecodedFunction &fn, const std::string &what,
                                 const std::string &phase, int64_t iteration,
                                 bool last, int64_t &losses) {
  const int slot = step.slot();
  const int64_t displacement = int64_t(slot) * fn.slotBytes;
  currentMicrobatch = step.microbatch();
  std::string context = " in " + what + " (microbatch " +
                        std::to_string(step.microbatch()) + ", slot " +
                        std::to_string(slot) + ")";
  if (forward.forward) {
    // A forward fills its chunk's inputs at the slot's copy, and those in
    // no forward's slot region in place.
    Status st;
    for (const fb::InputSpec *spec : forward.slotInputs)
      if (st.ok())
        st = fillInput(*spec, iteration, step.microbatch(), displacement);
    for (const fb::InputSpec *spec : unslottedInputs)
      if (st.ok())
        st = fillInput(*spec, iteration, step.microbatch(), 0);
    TESSERA_RETURN_IF_ERROR(st.withContext("function '" + fn.name + "'" + context +
                                           ": filling the inputs"));
  }
  TESSERA_RETURN_IF_ERROR(runThunks(fn, slot, phase, context, /*drainP2p=*/last));
  if (fn.writesLoss) {
    int64_t offset = prog->buffers()->Get(prog->loss_buffer())->offset();
    if (fn.slotBytes > 0 && offset >= fn.slotBase && offset < fn.slotBase + fn.slotBytes)
      offset += displacement;
    TESSERA_RETURN_IF_ERROR(stageLoss(offset, losses++));
  }
  return Status();
}

void Executor::resetSelfQueues() {
  // (Left over only by a run that failed part-way.)
  for (auto &[tag, queue] : selfQueues)
    selfFree.insert(selfFree.end(), queue.begin(), queue.end());
  selfQueues.clear();
}

StatusOr<double> Executor::runSchedule(int64_t iteration) {
  const auto &schedule = *prog->schedule();
  int64_t losses = 0;
  resetSelfQueues();
  currentIteration = iteration;
  for (flatbuffers::uoffset_t si = 0; si < schedule.size(); ++si) {
    const fb::ScheduleStep &step = *schedule.Get(si);
    const DecodedFunction &fn = functions[size_t(step.function())];
    // The end of the schedule completes the open batch (inside the last
    // step's phase on the timeline).
    TESSERA_RETURN_IF_ERROR(runScheduleStep(step, fn, fn,
                                            "schedule step " + std::to_string(si),
                                            phaseName(fn, step.microbatch()), iteration,
                                            /*last=*/si + 1 == schedule.size(), losses));
  }
  TESSERA_RETURN_IF_ERROR(runStep(iteration));
  TESSERA_ASSIGN_OR_RETURN(double lossSum, collectLosses(iteration, losses));
  return reduceLoss(lossSum, /*scheduled=*/true);
}

/// Whether a host read or write of `b` must wait for the parameter
/// all-gathers in flight (they write the parameters and their buckets).
static bool heldByParamSync(const fb::Buffer &b) {
  return b.kind() == fb::BufferKind::Param || b.kind() == fb::BufferKind::View;
}

StatusOr<std::vector<uint8_t>>
Executor::readBuffer(const std::string &name) const {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  if (b->staged()) {
    // ZeRO-3: the host staging, current after gatherStagedParameters.
    if (!paramStagingCurrent)
      return failedPrecondition(
          art->name(), ": parameter '", name,
          "' is kept as shards of its bucket (ZeRO-3); gather them "
          "(gatherStagedParameters) before reading it");
    const int64_t bytes = numElements(b->shape()) * dtypeSize(b->dtype());
    return std::vector<uint8_t>(paramStaging.begin() + b->offset(),
                                paramStaging.begin() + b->offset() + bytes);
  }
  if (heldByParamSync(*b))
    TESSERA_RETURN_IF_ERROR(finishParamSync());
  std::vector<uint8_t> out(
      size_t(numElements(b->shape()) * dtypeSize(b->dtype())));
  TESSERA_RETURN_IF_ERROR(
      copyOut(out.data(), arena + b->offset(), int64_t(out.size())));
  return out;
}

/// Chunk of the pinned staging for whole-buffer transfers (checkpoints).
constexpr int64_t kTransferChunkBytes = 64ll << 20;

StatusOr<uint8_t *> Executor::transferChunk() const {
  if (!transfer) {
    TESSERA_ASSIGN_OR_RETURN(void *p, be->allocateHost(kTransferChunkBytes));
    transfer = static_cast<uint8_t *>(p);
  }
  return transfer;
}

Status Executor::copyOut(void *dst, const void *src, int64_t bytes) const {
  if (be->hostMemory())
    return be->copyToHost(dst, src, bytes);
  // Through pinned chunks: device-to-pageable copies are slow and
  // synchronous anyway; these run at full bandwidth.
  TESSERA_ASSIGN_OR_RETURN(uint8_t * chunk, transferChunk());
  for (int64_t done = 0; done < bytes; done += kTransferChunkBytes) {
    int64_t n = std::min(kTransferChunkBytes, bytes - done);
    TESSERA_RETURN_IF_ERROR(
        be->copyToHost(chunk, static_cast<const uint8_t *>(src) + done, n));
    std::memcpy(static_cast<uint8_t *>(dst) + done, chunk, size_t(n));
  }
  return Status();
}

Status Executor::copyIn(void *dst, const void *src, int64_t bytes) {
  if (be->hostMemory())
    return be->copyToDevice(dst, src, bytes);
  TESSERA_ASSIGN_OR_RETURN(uint8_t * chunk, transferChunk());
  for (int64_t done = 0; done < bytes; done += kTransferChunkBytes) {
    int64_t n = std::min(kTransferChunkBytes, bytes - done);
    std::memcpy(chunk, static_cast<const uint8_t *>(src) + done, size_t(n));
    TESSERA_RETURN_IF_ERROR(
        be->copyToDevice(static_cast<uint8_t *>(dst) + done, chunk, n));
    // The asynchronous copy must have read the chunk before it is reused.
    TESSERA_RETURN_IF_ERROR(be->synchronize());
  }
  return Status();
}

StatusOr<std::vector<float>>
Executor::readFloatBuffer(const std::string &name) const {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  if (!isFloatDType(b->dtype()))
    return invalidArgument(art->name(), ": buffer '", name, "' is ",
                           fb::EnumNameDType(b->dtype()),
                           ", not F32, BF16 or F16");
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, readBuffer(name));
  std::vector<float> out(size_t(numElements(b->shape())));
  if (b->dtype() != fb::DType::F32) {
    std::vector<uint16_t> half(out.size());
    std::memcpy(half.data(), bytes.data(), bytes.size());
    halfToFloats(floatFormatOf(b->dtype()), half.data(), out.data(),
                 int64_t(out.size()));
  } else {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  }
  return out;
}

Status Executor::writeBuffer(const std::string &name, const void *data,
                             int64_t bytes) {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  int64_t size = numElements(b->shape()) * dtypeSize(b->dtype());
  if (bytes != size)
    return invalidArgument(art->name(), ": buffer '", name, "' holds ", size,
                           " bytes, got ", bytes);
  if (b->staged()) {
    // ZeRO-3: this rank's part of it into its bucket's shard; a gathered
    // staging no longer matches.
    paramStagingCurrent = false;
    return scatterStaged(*b, static_cast<const uint8_t *>(data));
  }
  if (heldByParamSync(*b))
    TESSERA_RETURN_IF_ERROR(finishParamSync());
  TESSERA_RETURN_IF_ERROR(copyIn(arena + b->offset(), data, bytes));
  // A shard written directly: the staging no longer matches it.
  if (b->kind() == fb::BufferKind::ParamShard)
    paramStagingCurrent = false;
  if (b->kind() == fb::BufferKind::MainParam) {
    // b points into the program's buffer vector: its index.
    for (flatbuffers::uoffset_t i = 0; i < prog->buffers()->size(); ++i)
      if (prog->buffers()->Get(i) == b) {
        if (mainParamWritten.size() != prog->buffers()->size())
          mainParamWritten.assign(prog->buffers()->size(), false);
        mainParamWritten[i] = true;
      }
  }
  return Status();
}

/// The part of its bucket a ParamShard `s` holds: [begin, end) bytes of
/// the staging space (its rank's block of the bucket's staged view).
static std::pair<int64_t, int64_t> shardRange(const fb::Artifact &a,
                                              const fb::Program &p,
                                              const fb::Buffer &s, int rank) {
  const fb::Buffer *view = p.buffers()->Get(flatbuffers::uoffset_t(s.of()));
  GroupPosition pos = findGroupPosition(a, s.rank_group()->str(), rank);
  const int64_t bytes = numElements(s.shape()) * dtypeSize(s.dtype());
  const int64_t begin = view->offset() + int64_t(pos.index) * bytes;
  return {begin, begin + bytes};
}

Status Executor::scatterStaged(const fb::Buffer &param, const uint8_t *data) {
  // Every shard's block of the staging space, once, by where it begins
  // (the blocks are disjoint): a parameter's shards are then found by
  // binary search, so initialising or loading every parameter is linear
  // in the parameters, not parameters times buckets.
  if (shardBlocks.empty()) {
    for (const fb::Buffer *s : *prog->buffers())
      if (s->kind() == fb::BufferKind::ParamShard) {
        auto [lo, hi] = shardRange(*art->root(), *prog, *s, rank);
        shardBlocks.push_back({lo, hi, s->offset()});
      }
    std::sort(shardBlocks.begin(), shardBlocks.end(),
              [](const ShardBlock &x, const ShardBlock &y) { return x.lo < y.lo; });
  }
  const int64_t begin = param.offset(),
                end = begin + numElements(param.shape()) * dtypeSize(param.dtype());
  auto it = std::upper_bound(
      shardBlocks.begin(), shardBlocks.end(), begin,
      [](int64_t at, const ShardBlock &b) { return at < b.lo; });
  if (it != shardBlocks.begin())
    --it;
  for (; it != shardBlocks.end() && it->lo < end; ++it) {
    const int64_t from = std::max(it->lo, begin), to = std::min(it->hi, end);
    if (from < to)
      TESSERA_RETURN_IF_ERROR(copyIn(arena + it->arenaOffset + (from - it->lo),
                                     data + (from - begin), to - from));
  }
  return Status();
}

void Executor::releaseStagedParameters() {
  std::vector<uint8_t>().swap(paramStaging);
  paramStagingCurrent = false;
}

Status Executor::gatherStagedParameters() {
  if (prog->staging_bytes() <= 0)
    return Status();
  paramStaging.resize(size_t(prog->staging_bytes()));
  TESSERA_RETURN_IF_ERROR(be->synchronize());
  // In buffer order, which every rank of a group shares (one program per
  // pipeline stage).
  for (const fb::Buffer *s : *prog->buffers()) {
    if (s->kind() != fb::BufferKind::ParamShard)
      continue;
    const std::string group = s->rank_group()->str();
    TESSERA_ASSIGN_OR_RETURN(Communicator * comm, groupCommunicator(group));
    TESSERA_ASSIGN_OR_RETURN(ElementType type, Decoder::elementType(s->dtype()));
    const int64_t n = numElements(s->shape());
    const int64_t bytes = n * dtypeSize(s->dtype()) * comm->size();
    const fb::Buffer *view = prog->buffers()->Get(flatbuffers::uoffset_t(s->of()));
    uint8_t *dst = paramStaging.data() + view->offset();
    if (be->hostMemory()) {
      TESSERA_RETURN_IF_ERROR(comm->allGather(arena + s->offset(), dst, n, type));
      continue;
    }
    // A device backend: through the arena's transient region, free between
    // iterations and at least a gathered bucket large (the phases gather
    // each bucket there), or a device buffer if it is not.
    const int64_t transient = prog->arena_bytes() - prog->persistent_bytes();
    void *gathered = arena + prog->persistent_bytes();
    if (transient < bytes) {
      TESSERA_ASSIGN_OR_RETURN(gathered, be->allocate(bytes));
    }
    Status st = comm->allGather(arena + s->offset(), gathered, n, type);
    // (Synchronised whatever the collective returned: it may still run.)
    Status synced = be->synchronize();
    if (st.ok())
      st = synced;
    if (st.ok())
      st = copyOut(dst, gathered, bytes);
    if (transient < bytes)
      be->deallocate(gathered);
    TESSERA_RETURN_IF_ERROR(st);
  }
  paramStagingCurrent = true;
  return Status();
}

std::map<std::string, CommCounters> Executor::commCounters() const {
  std::map<std::string, CommCounters> result;
  for (auto &[kind, comm] : comms.groups)
    if (comm)
      result[kind] += comm->counters();
  for (auto &[kind, comm] : selfComms)
    result[kind] += comm->counters();
  return result;
}

} // namespace tessera::rt
