//===- Executor.h - Program interpreter -------------------------*- C++ -*-===//
//
// Runs one rank's program of a loaded artifact: allocates the arena,
// initialises parameters, decodes every function into a list of thunks
// (opcode + resolved pointers + sizes, checked once up front) and executes
// training iterations: for each microbatch fill the inputs, run
// "microbatch" and read the loss; then set the iteration buffer and run
// "step".
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
#include <map>
#include <memory>
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
  /// Record a timeline of every instruction (for tessera-run --trace).
  bool trace = false;
};

/// One slice of the execution timeline, in microseconds since the epoch
/// set by Executor::startTrace.
struct TraceEvent {
  std::string name;  ///< opcode, or "microbatch 3" / "step" for phases
  std::string track; ///< "phase", "compute" or "communication"
  double startUs, durationUs;
};

struct Thunk;

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
  /// running or allocating anything, and checks that every rank is in a
  /// group of each kind its program's collectives and vocabulary-sharded
  /// kernels use (used by tessera-run before launch).
  static Status validate(const LoadedArtifact &artifact);

  ~Executor();

  /// Writes initial values of all Param buffers (and zeros elsewhere).
  Status initializeParameters();

  /// One training iteration (1-based). Returns the loss averaged over the
  /// microbatches and the dp group (NaN if the program has no loss buffer).
  StatusOr<double> runIteration(int64_t iteration);

  /// The learning rate of `iteration` (1-based) under the artifact's
  /// schedule (Megatron's warmup and decay); 0 without an optimizer.
  double learningRate(int64_t iteration) const;

  /// Fills the program's inputs for microbatch `m` of `iteration`.
  Status fillInputs(int64_t iteration, int64_t microbatch);
  /// Runs function `name` ("microbatch" or "step").
  Status runFunction(const std::string &name);

  /// Host copy of buffer `name` (raw bytes).
  StatusOr<std::vector<uint8_t>> readBuffer(const std::string &name) const;
  /// Host copy of an f32 buffer.
  StatusOr<std::vector<float>> readFloatBuffer(const std::string &name) const;
  Status writeBuffer(const std::string &name, const void *data, int64_t bytes);

  /// For a watchdog thread: when an instruction has been running for more
  /// than `seconds`, describes it (function, instruction, opcode, loc);
  /// otherwise returns an empty string. Safe to call from another thread.
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

private:
  Executor();
  Status bindFunctions();
  const fb::Buffer *findBuffer(const std::string &name) const;
  Status execute(const Thunk &thunk);

  std::shared_ptr<const LoadedArtifact> art;
  const fb::Program *prog = nullptr;
  std::unique_ptr<Backend> be;
  CommunicatorSet comms;
  std::map<std::string, std::unique_ptr<Communicator>> selfComms;
  int rank = 0;
  ExecutorOptions options;
  DataLayout layout;
  uint8_t *arena = nullptr;
  std::map<std::string, std::vector<Thunk>> functions;
  std::map<int, std::pair<Communicator *, CommRequest>> pending;
  std::map<std::string, double> kernelTime;
  /// The microbatch being run, for kernels keyed by global sample (dropout).
  int64_t currentIteration = 1, currentMicrobatch = 0;
  /// Scale of the compiled learning rate for the current iteration.
  double lrFactor = 1.0;
  std::chrono::steady_clock::time_point traceEpoch =
      std::chrono::steady_clock::now();
  std::vector<TraceEvent> trace;
  /// The instruction being executed (null between instructions) and when it
  /// started, for stalledInstruction().
  std::atomic<const Thunk *> inFlight{nullptr};
  std::atomic<int64_t> inFlightSinceNs{0};
  double sinceEpochUs(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - traceEpoch).count();
  }
};

} // namespace tessera::rt

#endif // TESSERA_RT_EXECUTOR_H
