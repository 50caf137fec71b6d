//===- Executor.h - Program interpreter -------------------------*- C++ -*-===//
//
// Runs one rank's program of a loaded artifact: allocates the arena,
// initialises parameters, decodes every function into a list of thunks
// (opcode + resolved pointers + sizes, checked once up front) and executes
// training iterations: for each microbatch fill the inputs, run
// "microbatch" and stage its loss on the device; then set the iteration
// buffer, run "step", and synchronise the backend once to read the losses.
// Nothing else in an iteration waits for the device (with a backend whose
// communicators are stream-ordered, not even the collectives).
//
// Pipelines (a program with a `schedule`): the schedule's steps replace the
// microbatch loop. A function with microbatch slots is decoded once per slot
// (operands in its slot region moved by slot * slot_bytes); each step runs
// its function on its slot, a forward after filling the inputs in its slot
// region for its microbatch (and, in place, the inputs in no forward's slot
// region), and one that writes the loss buffer (a function other than a
// backward with the loss buffer as an operand) adds the loss to the
// iteration's sum. Send/Recv post non-blocking point-to-point operations
// over the "pp" group that join the rank's open p2p batch; the batch is
// completed (all requests waited together) right before the next
// instruction that is not a Send/Recv, before "step" and at the end of the
// schedule.
//
// Mixed precision (Megatron's --bf16): parameters may be bf16 (initialised
// with the same Philox values as f32 ones, rounded to nearest even), with
// fp32 "main params" (buffers of kind MainParam) that the optimizer steps.
// The optional function "init" writes the main params from the params; it
// runs once, before the first iteration (runInit), unless a checkpoint
// restored every main param.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXECUTOR_H
#define TESSERA_RT_EXECUTOR_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Backend.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/Data.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::rt {

struct ExecutorOptions {
  uint64_t seed = 1234;
  /// Time every instruction and accumulate seconds per opcode.
  bool profile = false;
  /// Token dataset for the "tokens"/"labels" inputs with vocab_size > 0
  /// (checked against the program in create; see Data.h).
  std::shared_ptr<const IndexedDataset> dataset;
  /// Without a dataset, synthetic tokens for the token inputs
  /// (DataLayout::mockData).
  bool mockData = false;
  /// Record a timeline of every instruction (for tessera-run --trace).
  bool trace = false;
};

/// One slice of the execution timeline, in microseconds since the epoch
/// set by Executor::startTrace.
struct TraceEvent {
  /// Opcode; "microbatch 3", "step", or for schedule steps "F c0 mb3" /
  /// "B c1 mb0" for phases; "send→pp1", "recv←pp0" and "p2p wait" for
  /// pipeline point-to-point.
  std::string name;
  std::string track; ///< "phase", "compute", "communication" or "p2p"
  double startUs, durationUs;
  /// A collective's rank-group kind ("dp", "tp-pp"), shown as its args.
  std::string group = {};
};

struct Thunk;
/// What the opcodes' run functions see of the executor (Executor.cpp).
class ExecutorRunContext;

/// The interpreter for one rank.
class Executor {
public:
  /// Creates the executor of world rank `worldRank`: picks the program whose
  /// pp_rank equals the rank's index in its "pp" group (else pp_rank 0),
  /// binds collectives to `comms` (group kinds missing from `comms` whose
  /// instance for this rank has one member get a self communicator; a
  /// collective over a kind that no instance holding this rank has, e.g.
  /// "embedding" on a middle pipeline stage, is an error naming the rank,
  /// the kind and the instruction's loc),
  /// allocates the arena and decodes all functions. Does not initialise.
  static StatusOr<std::unique_ptr<Executor>>
  create(std::shared_ptr<const LoadedArtifact> artifact,
         std::unique_ptr<Backend> backend, CommunicatorSet comms, int worldRank,
         const ExecutorOptions &options = {});

  /// Decodes and shape-checks every function of every program without
  /// running or allocating anything, at the group positions of every rank
  /// that runs it (rank-relative operands and in-place collectives checked
  /// at every index, with the per-rank decode's messages), and checks that
  /// every rank is in a group of each kind its program's collectives and
  /// vocabulary-sharded kernels use (used by tessera-run before launch).
  static Status validate(const LoadedArtifact &artifact);

  ~Executor();

  /// Writes initial values of all Param buffers (f32, or bf16 rounded to
  /// nearest even from the same f32 values) and zeros the MainParam
  /// buffers; "init" becomes due again (see runInit).
  Status initializeParameters();

  /// Runs the program's "init" function (mixed precision: it writes the
  /// fp32 main params from the bf16 params) if it is due: once after
  /// initializeParameters (or create), and not at all when the program has
  /// MainParam buffers and every one of them has been written through
  /// writeBuffer since (a checkpoint restored them). Not an iteration: it
  /// touches neither the loss nor the learning rate. runIteration calls it
  /// first when it is still due. Returns whether "init" ran (false for a
  /// program without one).
  StatusOr<bool> runInit();

  /// One training iteration (1-based). Returns the loss averaged over the
  /// microbatches and the dp group (NaN if the program has no loss buffer).
  /// With a schedule, the stage whose functions write the loss reports the
  /// microbatch mean and the others 0; the sum over the pp group (through
  /// CommunicatorSet::lossReducePp) is then averaged over dp, so every rank
  /// returns the same loss (NaN if no program has a loss buffer).
  StatusOr<double> runIteration(int64_t iteration);

  /// Megatron's evaluate() of one batch: the loss of the samples training
  /// iteration `iteration` (1-based) reads, with the current parameters,
  /// through the forward-only evaluation phases (tessera-eval-phase: no
  /// gradients, no update, dropout off); a pipeline runs its chunks'
  /// evaluation phases in the order of the schedule's forwards. Reduced
  /// over pp and dp as runIteration's loss. Changes no parameter, state or
  /// counter. With `data`, the samples are that dataset's (a validation
  /// set) instead of the training data's.
  StatusOr<double> evaluate(int64_t iteration,
                            std::shared_ptr<const IndexedDataset> data = nullptr);
  /// Whether the program has its evaluation phases (artifacts compiled
  /// before tessera-eval-phase have none).
  bool hasEvalPhase() const;

  /// The learning rate of `iteration` (1-based) under the artifact's
  /// schedule (Megatron's warmup and decay); 0 without an optimizer.
  double learningRate(int64_t iteration) const;

  /// fp16's loss scaling (the launcher's GradScaler drives it): the scale
  /// the next iterations seed their backward with (LossSeed) and unscale
  /// by (ClipGradNorm); 1 by default.
  void setLossScale(double scale) { lossScale = scale; }
  /// Whether the last iteration skipped its optimizer updates (inf or NaN
  /// gradients under fp16); it then changed no parameter or state.
  bool lastIterationSkipped() const { return updatesSkipped; }
  /// How many iterations before the next were skipped: the learning-rate
  /// schedule and Adam's step count advance only on the others (as
  /// Megatron's scheduler and optimizer step). The launcher sets it after
  /// each iteration and on resume.
  void setSkippedIterations(int64_t n) { skippedIterations = n; }

  /// Fills the program's inputs for microbatch `m` of `iteration`: those
  /// whose buffer offset lies in [regionBegin, regionEnd) (by default all),
  /// each written `displacement` bytes past its buffer's offset (a slot's
  /// copy: slot * slot_bytes).
  Status fillInputs(int64_t iteration, int64_t microbatch,
                    int64_t displacement = 0, int64_t regionBegin = 0,
                    int64_t regionEnd = INT64_MAX);
  /// Runs function `name` ("microbatch", "step", "forward_c0", ...) on
  /// microbatch slot `slot`. A p2p batch it leaves open stays open (see
  /// completeP2pBatch).
  Status runFunction(const std::string &name, int slot = 0);
  /// Waits for every Send/Recv of the open p2p batch and every send still
  /// in flight (no-op if none).
  Status completeP2pBatch();

  /// Megatron's overlap_param_gather: the step leaves each parameter
  /// bucket's all-gather in flight (ParamSyncStart) and the next forward
  /// finishes it before the bucket's first reader (ParamSyncWait). This
  /// finishes every one still in flight. The step, an evaluation and a
  /// host read or write of a parameter buffer call it themselves; call it
  /// before the process ends (the launcher does, after the last
  /// iteration).
  Status finishParamSync() const;
  /// Finishes the one of sync id `id`, if in flight (ParamSyncWait).
  Status finishParamSync(int id) const;
  /// Whether some parameter all-gather is in flight.
  bool paramSyncInFlight() const {
    return !paramSyncs.empty() || !heldParamSyncs.empty();
  }

  /// Host copy of buffer `name` (raw bytes; a parameter buffer's after
  /// finishParamSync).
  StatusOr<std::vector<uint8_t>> readBuffer(const std::string &name) const;
  /// Host copy of an f32 or bf16 buffer as floats (bf16 widened exactly).
  StatusOr<std::vector<float>> readFloatBuffer(const std::string &name) const;
  /// Whether this rank's program has a buffer of that name ("grad_norm").
  bool hasBuffer(const std::string &name) const {
    return findBuffer(name) != nullptr;
  }
  /// Overwrites buffer `name` with `bytes` raw bytes (its exact size). A
  /// MainParam buffer written here counts as restored for runInit. A
  /// staged parameter (ZeRO-3) is written to the host staging and this
  /// rank's part of it into its bucket's ParamShard.
  Status writeBuffer(const std::string &name, const void *data, int64_t bytes);

  /// ZeRO-3: all-gathers every ParamShard over its group into the host
  /// staging, so that readBuffer can read the staged parameters (a
  /// checkpoint's) until the next iteration. Collective: every rank of each
  /// shard's group calls it, between iterations. A no-op for a program
  /// without staged buffers.
  Status gatherStagedParameters();
  /// Frees that host staging (one pipeline stage's whole parameters).
  void releaseStagedParameters();

  /// For a watchdog thread: when an instruction has been running for more
  /// than `seconds`, describes it (function, instruction, opcode, loc), or
  /// when a p2p batch has been waited for that long, describes the batch
  /// (pipeline stage, the function and microbatch that opened it, and each
  /// pending send and receive with peer, tag, shape and dtype); otherwise
  /// returns an empty string. Safe to call from another thread.
  std::string stalledInstruction(double seconds) const;

  /// Starts the timeline clock (call on every rank right after a barrier,
  /// so the ranks' timelines line up).
  void startTrace() { traceEpoch = std::chrono::steady_clock::now(); }
  /// The recorded timeline; empty unless ExecutorOptions::trace.
  const std::vector<TraceEvent> &traceEvents() const { return trace; }

  /// Seconds spent per opcode name ("Gemm", "AllReduce", ...) so far; empty
  /// unless ExecutorOptions::profile.
  const std::map<std::string, double> &kernelSeconds() const {
    return kernelTime;
  }

  /// Bytes sent by this rank's collectives so far, per group kind.
  std::map<std::string, CommCounters> commCounters() const;

  const fb::Program &program() const { return *prog; }
  const LoadedArtifact &artifact() const { return *art; }
  const DataLayout &dataLayout() const { return layout; }
  int worldRank() const { return rank; }
  Backend &backend() { return *be; }

  /// This rank's pipeline stage (index in its "pp" group) and the number of
  /// stages (1 without pp groups).
  int pipelineStage() const { return ppIndex; }
  int pipelineStages() const { return ppSize; }

private:
  struct DecodedFunction;
  /// A Send or Recv in flight.
  struct P2pOp {
    Communicator *comm;
    CommRequest request;
    const Thunk *thunk;
  };

  Executor();
  Status bindFunctions();
  const fb::Buffer *findBuffer(const std::string &name) const;
  /// Runs one thunk: its opcode's run function (executor/ops).
  Status execute(const Thunk &thunk);
  /// Synchronises the backend before a collective or p2p thunk unless its
  /// communicator is stream-ordered.
  Status syncForHostComm(const Thunk &thunk);
  /// Runs the thunks of `fn` on `slot`, recording phase `phase` when
  /// tracing; `context` is appended to an instruction's location in errors.
  /// With `drainP2p`, completes the open p2p batch before returning.
  Status runThunks(const DecodedFunction &fn, int slot,
                   const std::string &phase, const std::string &context,
                   bool drainP2p);
  /// Sets the iteration buffer and runs "step" (open p2p batches completed).
  Status runStep(int64_t iteration);
  StatusOr<double> runSchedule(int64_t iteration);
  /// One schedule step: `fn` on the step's slot, after the inputs of
  /// `forward` (the step's own function, or the forward an evaluation phase
  /// stands in for) when it is a forward's compute part; its loss staged
  /// into slot `losses++`. `what` and `phase` name it in errors and on the
  /// timeline; `last` completes the open p2p batch.
  Status runScheduleStep(const fb::ScheduleStep &step, const DecodedFunction &forward,
                         const DecodedFunction &fn, const std::string &what,
                         const std::string &phase, int64_t iteration, bool last,
                         int64_t &losses);
  /// The pipeline's (and dp's) loss from this rank's sum of its microbatch
  /// losses (runIteration, runSchedule, evaluate).
  StatusOr<double> reduceLoss(double lossSum, bool scheduled);
  /// Copies the f32 loss at arena `offset` into loss slot `index` (on the
  /// device, in stream order).
  Status stageLoss(int64_t offset, int64_t index);
  /// Synchronises the backend (the iteration's one host wait) and returns
  /// the sum of the first `count` loss slots.
  StatusOr<double> collectLosses(int64_t iteration, int64_t count);
  /// Fills one input for `microbatch`, `displacement` bytes past its offset.
  Status fillInput(const fb::InputSpec &spec, int64_t iteration,
                   int64_t microbatch, int64_t displacement);
  /// The phase name of `fn` on microbatch `microbatch` (trace).
  std::string phaseName(const DecodedFunction &fn, int64_t microbatch) const;

  std::shared_ptr<const LoadedArtifact> art;
  const fb::Program *prog = nullptr;
  std::unique_ptr<Backend> be;
  CommunicatorSet comms;
  std::map<std::string, std::unique_ptr<Communicator>> selfComms;
  int rank = 0;
  ExecutorOptions options;
  DataLayout layout;
  uint8_t *arena = nullptr;
  /// Device memory for the losses of one iteration (numLossSlots f32s):
  /// each is copied there in stream order and read back once, after "step".
  uint8_t *lossSlots = nullptr;
  int64_t numLossSlots = 0;
  /// Decoded functions, in the program's order (schedule steps index them).
  std::vector<DecodedFunction> functions;
  std::map<std::string, size_t> functionIndex;
  std::map<int, std::pair<Communicator *, CommRequest>> pending;
  /// The parameter all-gathers in flight, by program-wide sync id; they
  /// outlive the function that started them (finishParamSync, which host
  /// reads of the parameters call, hence mutable).
  mutable std::map<int, std::pair<Communicator *, CommRequest>> paramSyncs;
  /// TESSERA_DEBUG_PARAM_SYNC_AT_WAIT=1 (a test hook): a ParamSyncStart only
  /// records its instruction and the gather runs when it is finished, so a
  /// forward that read a bucket before its wait would read the previous
  /// step's parameters (the overlap tests' proof that every reader waits).
  bool holdParamSyncs = false;
  /// TESSERA_DEBUG_GATHER_AT_START=1 (a test hook): an AllGatherStart
  /// (ZeRO-3's prefetch) completes at its start, so a kernel between it
  /// and its Wait that wrote into the gathered bucket's bytes would corrupt
  /// it for certain (the prefetch tests' proof that the memory plan keeps
  /// it apart; by default MPI moves the data in the MPI_Test calls between
  /// kernels or at the Wait, which exposes the converse only by chance).
  bool gatherAtStart = false;
  mutable std::map<int, const Thunk *> heldParamSyncs;
  /// Pipeline stage of this rank and number of stages.
  int ppIndex = 0, ppSize = 1;
  /// Some schedule step's function writes the loss buffer (this stage
  /// computes the loss); some program of the artifact has a loss buffer.
  bool stageHasLoss = false, artifactHasLoss = false;
  /// Schedules: the inputs in no forward's slot region (filled in place by
  /// every forward).
  std::vector<const fb::InputSpec *> unslottedInputs;
  /// Host staging of one input.
  std::vector<uint8_t> hostInput;
  /// The iteration's inputs (and iteration number) on their way to the
  /// device, in the backend's host staging memory (pinned on a GPU, so the
  /// copies do not wait): each copy takes the next free bytes, and the
  /// area is reused after the iteration's synchronisation.
  uint8_t *staging = nullptr;
  int64_t stagingBytes = 0, stagingUsed = 0;
  /// Copies `bytes` from `src` to device `dst` through the staging area.
  Status stageToDevice(void *dst, const void *src, int64_t bytes);
  /// Whole-buffer transfers (parameter init, checkpoints): direct on a
  /// host-memory backend, else through a pinned chunk (allocated on first
  /// use), 64 MiB at a time.
  Status copyOut(void *dst, const void *src, int64_t bytes) const;
  Status copyIn(void *dst, const void *src, int64_t bytes);
  StatusOr<uint8_t *> transferChunk() const;
  mutable uint8_t *transfer = nullptr;
  /// The run functions' device scratch (ExecutorRunContext::scratch: the
  /// counts ExpertDispatch exchanges on a backend whose memory is not host
  /// memory, as NCCL reads device memory only), grown on first use.
  uint8_t *scratch = nullptr;
  int64_t scratchBytes = 0;
  friend class ExecutorRunContext;
  std::unique_ptr<ExecutorRunContext> runContext;
  /// The open p2p batch and what opened it ("function 'forward_c0'
  /// microbatch 3").
  std::vector<P2pOp> p2pBatch;
  std::string p2pBatchOpener;
  /// The V-shaped schedules (zbv, dualpipev; Program.schedule_kind): a
  /// batch's sends stay in flight while the rank computes on, as PyTorch's
  /// pipeline runtime keeps its isend's; only its receives complete before
  /// the next kernel. A send completes when a later phase sends from its
  /// buffer again (a staging buffer of the sending phase's own: lower-to-rt
  /// gives every send one under these schedules), at the end of the
  /// schedule, or with completeP2pBatch; tessera-verify-schedule proves
  /// this order free of deadlock.
  bool sendsInFlight = false;
  std::vector<P2pOp> inflightSends;
  /// Waits for the receives of the open batch; its sends join
  /// inflightSends.
  Status completeP2pReceives();
  /// Waits for the in-flight sends from one of `buffers` (every one when
  /// null).
  Status completeInflightSends(const std::vector<const void *> *buffers);
  /// Waits for `batch` (one waitAll per communicator), for the watchdog
  /// "waiting for <opener>".
  Status waitP2p(std::vector<P2pOp> batch, const std::string &opener);
  /// Send/Recv to the rank itself (a V-shaped pipeline's turn): values
  /// queued per tag, oldest first, in device buffers kept for reuse (as
  /// many as the schedule ever has queued at once: one per microbatch the
  /// turn's two chunks are apart).
  /// A buffer (owned; freed with the executor) of `capacity` bytes,
  /// holding a queued value of `bytes` bytes.
  struct SelfMessage {
    void *data;
    int64_t capacity, bytes;
  };
  /// Every buffer is queued (under its tag) or free.
  std::map<int64_t, std::deque<SelfMessage>> selfQueues;
  std::vector<SelfMessage> selfFree;
  /// Returns the queued values of a run that failed part-way to the free
  /// buffers (a schedule starts with empty queues).
  void resetSelfQueues();
  /// The function being run and its slot, for p2pBatchOpener.
  const DecodedFunction *currentFunction = nullptr;
  int currentSlot = 0;
  std::map<std::string, double> kernelTime;
  /// The microbatch being run, for kernels keyed by global sample (dropout).
  int64_t currentIteration = 1, currentMicrobatch = 0;
  /// Scale of the compiled learning rate for the current iteration.
  double lrFactor = 1.0;
  /// fp16: the loss scale of the current iteration; whether its updates
  /// were skipped; iterations skipped before it.
  double lossScale = 1.0;
  bool updatesSkipped = false;
  int64_t skippedIterations = 0;
  /// "init" has not run (nor been skipped) since initializeParameters.
  bool initDue = true;
  /// ZeRO-3: the host copy of the staged buffers (Program.staging_bytes),
  /// filled by gatherStagedParameters, and whether it still holds what the
  /// shards hold (until a function runs or a parameter is written).
  std::vector<uint8_t> paramStaging;
  bool paramStagingCurrent = false;
  /// Copies this rank's part of staged parameter `param`, whose whole
  /// value is `data`, into the ParamShard buffers whose block of their
  /// bucket covers it.
  Status scatterStaged(const fb::Buffer &param, const uint8_t *data);
  /// Each ParamShard's block [lo, hi) of the staging space and its arena
  /// offset, sorted by lo (filled on first use).
  struct ShardBlock {
    int64_t lo, hi, arenaOffset;
  };
  std::vector<ShardBlock> shardBlocks;
  /// The communicator of rank group `kind` (a self communicator for a
  /// group of one).
  StatusOr<Communicator *> groupCommunicator(const std::string &kind);
  /// Per buffer index: a MainParam buffer written by writeBuffer since
  /// initializeParameters (restored from a checkpoint).
  std::vector<bool> mainParamWritten;
  std::chrono::steady_clock::time_point traceEpoch =
      std::chrono::steady_clock::now();
  std::vector<TraceEvent> trace;
  /// The instruction being executed (null between instructions) and when it
  /// started, for stalledInstruction().
  std::atomic<const Thunk *> inFlight{nullptr};
  std::atomic<int64_t> inFlightSinceNs{0};
  /// The p2p batch being waited for (empty when none) and since when.
  mutable std::mutex waitMutex;
  mutable std::string waitDescription;
  mutable int64_t waitSinceNs = 0;
  double sinceEpochUs(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - traceEpoch).count();
  }
};

} // namespace tessera::rt

#endif // TESSERA_RT_EXECUTOR_H
