//===- TrainingLoop.cpp - One rank of tessera-run -------------------------===//
//
// tessera-run inside the MPI job, on every rank: the artifact (checked
// against the job), the communicators of the rank's groups, the backend and
// the executor; the watchdog that ends a rank stuck in an instruction or a
// checkpoint step; --load; then iterations startIteration+1..--steps, with
// rank 0 printing Megatron's training_log progress line ("iteration N/S |
// consumed samples: ... | elapsed time per iteration (ms): ...") and the
// --metrics JSON lines; --save every --save-interval iterations and after
// the last one; --trace at the end. A rank's error aborts the whole job.
//
//===----------------------------------------------------------------------===//

#include "LauncherInternal.h"
#include "backends/cpu/BlasCore.h"

#include "tessera/rt/Executor.h"
#include "tessera/rt/GradScaler.h"
#include "tessera/rt/MpiCommunicator.h"
#include "tessera/rt/WaitMonitor.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

namespace tessera::rt::launcher {

namespace {

/// The per-kind byte counters in the metrics' comm_bytes.
const char *const kCollectiveNames[] = {"all_reduce", "all_gather",
                                        "reduce_scatter", "all_to_all", "p2p"};
constexpr int kNumCollectiveNames = 5;

uint64_t counterOf(const CommCounters &c, int kind) {
  switch (kind) {
  case 0:
    return c.allReduce;
  case 1:
    return c.allGather;
  case 2:
    return c.reduceScatter;
  case 3:
    return c.allToAll;
  default:
    return c.p2p;
  }
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

/// The fault-injection hooks of the tests (environment; see Launcher.h).
struct DebugHooks {
  /// TESSERA_DEBUG_STALL_RANK: this world rank sleeps before its first step.
  int stallRank = -1;
  /// TESSERA_DEBUG_STALL_IN_SETUP: this world rank sleeps in set-up, where
  /// the backend's communicators start.
  int stallInSetUp = -1;
  /// TESSERA_DEBUG_EXIT_AFTER_STEP: every rank _exit(9)s after iteration N.
  int64_t exitAfterStep = -1;
  /// TESSERA_DEBUG_EXIT_IN_SAVE (CheckpointSaveOptions::debugExitAfterShard).
  int64_t exitInSave = -1;
  /// TESSERA_DEBUG_STALL_IN_SAVE / _IN_LOAD (the debugStallRank of
  /// CheckpointSaveOptions / CheckpointLoadOptions).
  int stallInSave = -1, stallInLoad = -1;

  static DebugHooks fromEnvironment() {
    DebugHooks h;
    if (const char *env = std::getenv("TESSERA_DEBUG_STALL_RANK"))
      h.stallRank = std::atoi(env);
    if (const char *env = std::getenv("TESSERA_DEBUG_STALL_IN_SETUP"))
      h.stallInSetUp = std::atoi(env);
    if (const char *env = std::getenv("TESSERA_DEBUG_EXIT_AFTER_STEP"))
      h.exitAfterStep = std::atoll(env);
    if (const char *env = std::getenv("TESSERA_DEBUG_EXIT_IN_SAVE"))
      h.exitInSave = std::atoll(env);
    if (const char *env = std::getenv("TESSERA_DEBUG_STALL_IN_SAVE"))
      h.stallInSave = std::atoi(env);
    if (const char *env = std::getenv("TESSERA_DEBUG_STALL_IN_LOAD"))
      h.stallInLoad = std::atoi(env);
    return h;
  }
};

/// A thread that calls `check` every `period` until destroyed (joined).
class PeriodicCheck {
public:
  PeriodicCheck(std::chrono::milliseconds period, std::function<void()> check)
      : thread([this, period, check = std::move(check)] {
          while (!finished.load()) {
            std::this_thread::sleep_for(period);
            check();
          }
        }) {}
  PeriodicCheck(const PeriodicCheck &) = delete;
  PeriodicCheck &operator=(const PeriodicCheck &) = delete;
  ~PeriodicCheck() {
    finished.store(true);
    if (thread.joinable())
      thread.join();
  }

private:
  std::atomic<bool> finished{false};
  std::thread thread;
};

/// Reports why rank `rank` stops and ends the process (mpirun then ends
/// every other rank).
[[noreturn]] void stopRank(int rank, const std::string &why) {
  std::fflush(stdout);
  std::fprintf(stderr, "tessera-run: error: rank %d: %s\n", rank, why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

/// An integer environment variable, or -1 when unset or not a number >= 0.
int envInt(const char *name) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return -1;
  char *end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n <= INT_MAX ? int(n) : -1;
}

/// This rank's place on its node. Every rank all-gathers its node name
/// (MPI_Get_processor_name; a collective every rank takes part in alike);
/// where the launcher exports its own count of the node's ranks (Open MPI's
/// OMPI_COMM_WORLD_LOCAL_RANK/_SIZE, MPICH Hydra's MPI_LOCALRANKID and
/// MPI_LOCALNRANKS, Slurm's SLURM_LOCALID) that wins: it knows the nodes as
/// the job placed them, where names can repeat (containers or network
/// namespaces of one machine). Not MPI_Comm_split_type(MPI_COMM_TYPE_SHARED):
/// Open MPI 4.1 hangs or crashes in it when two of the job's hosts share a
/// kernel (a plain MPI program does too), which stopped every multi-host
/// run on network namespaces at its first collective.
StatusOr<NodePlace> findNodePlace(int rank, int size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Get_processor_name(name, &length));
  std::vector<char> all(size_t(size) * MPI_MAX_PROCESSOR_NAME);
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME,
                                            MPI_CHAR, all.data(),
                                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                                            MPI_COMM_WORLD));
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) {
    const char *n = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    names.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
  }
  NodePlace place = nodePlaceAmong(names, rank);
  for (auto [index, count] :
       {std::pair{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        std::pair{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        std::pair{"SLURM_LOCALID", ""}}) {
    int i = envInt(index);
    if (i < 0)
      continue;
    place.index = i;
    if (int c = *count ? envInt(count) : -1; c > i)
      place.count = c;
    break;
  }
  return place;
}

/// The watchdog: a collective whose peer died or stalled would block
/// forever; after `timeout` seconds in one instruction, in the iteration's
/// wait for a device backend (where stream-ordered NCCL collectives hang),
/// or in one step of a checkpoint save or load, the rank reports it, aborts
/// the backend's communicators (`abort`, e.g. ncclCommAbort) and exits.
/// Stopped when destroyed.
std::unique_ptr<PeriodicCheck> startWatchdog(const Executor &executor,
                                             const WaitMonitor &checkpointSteps,
                                             double timeout, int rank,
                                             std::function<void()> abort) {
  return std::make_unique<PeriodicCheck>(
      std::chrono::milliseconds(200),
      [&executor, &checkpointSteps, timeout, rank, abort = std::move(abort)] {
        WaitMonitor::On on = WaitMonitor::On::Peers;
        std::string stuck = executor.stalledInstruction(timeout);
        if (stuck.empty())
          stuck = checkpointSteps.stalled(timeout, &on);
        if (stuck.empty())
          return;
        std::ostringstream why;
        why << stuck << " (timeout " << timeout
            << " s): " << WaitMonitor::likelyCause(on);
        if (abort)
          abort();
        stopRank(rank, why.str());
      });
}

/// The watchdog of set-up, which runs before the executor exists: after
/// `timeout` seconds in one phase (`phase`, which setUp moves along), the
/// rank reports that phase and exits. A device backend's communicators
/// start here: ncclCommInitRank waits for every rank and for NCCL's
/// bootstrap network, and a rank that never arrives, or a network NCCL
/// cannot use, would otherwise block forever. Stopped when destroyed.
std::unique_ptr<PeriodicCheck>
startSetUpWatchdog(const std::atomic<const char *> &phase, double timeout,
                   int rank) {
  return std::make_unique<PeriodicCheck>(
      std::chrono::milliseconds(100),
      [&phase, timeout, rank, current = phase.load(),
       since = std::chrono::steady_clock::now()]() mutable {
        const char *now = phase.load();
        if (now != current) {
          current = now;
          since = std::chrono::steady_clock::now();
          return;
        }
        double waited = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - since)
                            .count();
        if (waited > timeout) {
          std::ostringstream why;
          why << current << " made no progress for " << waited
              << " s (timeout " << timeout << " s)";
          stopRank(rank, why.str());
        }
      });
}

struct FileCloser {
  void operator()(FILE *f) const { std::fclose(f); }
};

/// One rank of the job: set up, resumed from --load, trained to --steps.
/// Members are destroyed in reverse order: the metrics file closes and the
/// watchdog stops before the executor, dataset and communicators go.
class RankRun {
public:
  RankRun(const LaunchOptions &o, int rank, int size)
      : o(o), rank(rank), size(size),
        hooks(DebugHooks::fromEnvironment()) {}

  Status run();

private:
  Status setUp();
  Status checkBlasCore();
  Status resume();
  Status cleanSaveDirectory();
  void printHeader() const;
  Status openMetrics();
  Status startTraining();
  Status trainIteration(int64_t it);
  Status report(int64_t it, double loss, double seconds,
                std::map<std::string, CommCounters> &after);
  std::string metricsLine(int64_t it, double loss, double tokensPerSecond,
                          double seconds, double tflops,
                          std::map<std::string, CommCounters> &after);
  Status saveIfDue(int64_t it);
  Status exitIfHooked(int64_t it);
  Status evaluate(int64_t it);

  const LaunchOptions &o;
  const int rank, size;
  const DebugHooks hooks;

  std::shared_ptr<const LoadedArtifact> artifact;
  /// Some program computes a loss (else iterations report NaN by design).
  bool hasLoss = false;
  /// The step computes the global gradient norm (clipping on): the
  /// "grad_norm" buffer, read back after each iteration.
  bool hasGradNorm = false;
  /// This iteration's gradient norm (NaN without one).
  double gradNorm = std::nan("");
  /// --log-params-norm compiled in: the "params_norm" buffer, the
  /// parameters' global norm after the update.
  bool hasParamsNorm = false;
  double paramsNorm = std::nan("");
  /// Megatron's "number of nan iterations" since the previous log line
  /// (every iteration logs): 1 when this one's loss or gradient norm was
  /// NaN or inf (they train on only with --no-check-for-nan-in-loss; under
  /// fp16 a gradient norm that is not finite is a skipped iteration
  /// instead).
  int64_t nanIterations = 0;
  /// fp16 (the artifact's optimizer has a loss scaler): Megatron's grad
  /// scaler, whether this iteration skipped its updates ("number of
  /// skipped iterations"), and how many did so far (the learning-rate
  /// schedule and Adam's step count leave them out).
  std::optional<GradScaler> scaler;
  bool skippedThis = false;
  int64_t skippedTotal = 0;
  /// The learning rate this iteration updated with.
  double lrThis = 0.0;
  std::unique_ptr<Communicator> world;
  /// The --data dataset when the artifact has token inputs, else null.
  std::shared_ptr<const IndexedDataset> dataset;
  /// --eval-data: the validation set (null: evaluate on --data).
  std::shared_ptr<const IndexedDataset> evalDataset;
  std::unique_ptr<Executor> executor;
  /// Aborts a device backend's communicators (the watchdog's last act).
  std::function<void()> abortCommunicators;
  int blasThreads = 0;
  /// The backend's kernel libraries, for the banner.
  std::string kernelLibraries;
  /// The steps of a checkpoint save or load, for the watchdog.
  WaitMonitor checkpointSteps;
  std::unique_ptr<PeriodicCheck> watchdog;
  /// What setUp is doing, for the set-up watchdog.
  std::atomic<const char *> setUpPhase{"loading the artifact"};

  /// The iteration the run continues after (0, or --load's).
  int64_t startIteration = 0;
  /// Rank 0's report of --load.
  std::string loadMessage;
  /// Rank 0's --metrics file.
  std::unique_ptr<FILE, FileCloser> metrics;
  /// Tokens per sample: the sequence length for language-model inputs
  /// ([S, b] token buffers), else one per sample.
  int64_t tokensPerSample = 1;
  /// The communicator kinds and the counters after the previous iteration
  /// (the metrics report each iteration's bytes and kernel seconds).
  std::set<std::string> kinds;
  std::map<std::string, CommCounters> before;
  std::map<std::string, double> kernelsBefore;
};

Status RankRun::run() {
  {
    std::unique_ptr<PeriodicCheck> guard;
    if (o.timeout > 0)
      guard = startSetUpWatchdog(setUpPhase, o.timeout, rank);
    TESSERA_RETURN_IF_ERROR(setUp());
  }
  if (o.timeout > 0)
    watchdog = startWatchdog(*executor, checkpointSteps, o.timeout, rank,
                             abortCommunicators);
  TESSERA_RETURN_IF_ERROR(executor->initializeParameters());
  TESSERA_RETURN_IF_ERROR(resume());
  if (rank == 0) {
    printHeader();
    TESSERA_RETURN_IF_ERROR(openMetrics());
    TESSERA_RETURN_IF_ERROR(cleanSaveDirectory());
  }
  // No rank saves before rank 0 has cleaned the --save directory.
  if (!o.saveDir.empty() && world)
    TESSERA_RETURN_IF_ERROR(world->barrier());
  TESSERA_RETURN_IF_ERROR(startTraining());
  if (o.evalOnly) {
    TESSERA_RETURN_IF_ERROR(evaluate(startIteration));
  } else {
    // --steps 0 --save DIR: the initial state as iteration 0 (to export
    // the initialisation with tessera-export, or to start elsewhere from
    // it).
    if (startIteration == 0 && o.steps == 0)
      TESSERA_RETURN_IF_ERROR(saveIfDue(0));
    int64_t evaluated = -1;
    for (int64_t it = startIteration + 1; it <= o.steps; ++it) {
      TESSERA_RETURN_IF_ERROR(trainIteration(it));
      TESSERA_RETURN_IF_ERROR(saveIfDue(it));
      if (o.evalInterval > 0 && it % o.evalInterval == 0) {
        TESSERA_RETURN_IF_ERROR(evaluate(it));
        evaluated = it;
      }
      TESSERA_RETURN_IF_ERROR(exitIfHooked(it));
    }
    // After training, as Megatron's evaluate_and_print_results (also when
    // there was nothing to train).
    const int64_t last = std::max(startIteration, o.steps);
    if (o.evalIters > 0 && evaluated != last)
      TESSERA_RETURN_IF_ERROR(evaluate(last));
  }
  // --overlap-param-gather: the last step's parameter all-gathers.
  TESSERA_RETURN_IF_ERROR(executor->finishParamSync());
  if (!o.tracePath.empty())
    TESSERA_RETURN_IF_ERROR(writeTrace(o.tracePath, *executor, rank));
  if (world)
    TESSERA_RETURN_IF_ERROR(world->barrier());
  return Status();
}

/// The artifact (its world size against the job's), the communicators of
/// this rank's groups, the backend, the dataset and the executor.
Status RankRun::setUp() {
  TESSERA_ASSIGN_OR_RETURN(artifact,
                           LoadedArtifact::loadFromFile(o.artifactPath));
  const fb::Artifact &a = *artifact->root();
  for (const fb::Program *p : *a.programs())
    hasLoss |= p->loss_buffer() >= 0;
  if (size != a.world_size())
    return failedPrecondition("MPI world size ", size,
                              " does not match the world size ", a.world_size(),
                              " of ", artifact->name(), " (mesh ",
                              meshString(a), "); run with -n ", a.world_size());
  if (o.numRanks && o.numRanks != size)
    return failedPrecondition("-n ", o.numRanks, " but the MPI job has ", size,
                              " ranks");

  setUpPhase = "creating the MPI communicators (MPI_Comm_split)";
  TESSERA_ASSIGN_OR_RETURN(CommunicatorSet comms, createMpiCommunicators(a));
  world = std::move(comms.world);

  // The rank's place on its node: its index picks its GPU, the count
  // shares the node's cores.
  setUpPhase = "finding the rank's node (MPI_Allgather of node names)";
  TESSERA_ASSIGN_OR_RETURN(NodePlace place, findNodePlace(rank, size));
  BackendOptions bo;
  bo.localRank = place.index;
  if (o.threads)
    bo.numThreads = o.threads;
  else if (const char *env = std::getenv("OPENBLAS_NUM_THREADS"))
    bo.numThreads = std::max(1, std::atoi(env));
  else
    bo.numThreads = defaultThreads(place.count);
  blasThreads = bo.numThreads;
  if (o.backend == "cpu")
    TESSERA_RETURN_IF_ERROR(checkBlasCore());
  bo.allowTf32 = o.allowTf32;
  setUpPhase = "creating the backend";
  TESSERA_ASSIGN_OR_RETURN(auto backend,
                           BackendRegistry::global().create(o.backend, bo));
  kernelLibraries = backend->kernelLibraries();
  // A device backend's collectives run on its own communicators (NCCL);
  // the MPI ones keep the host-side loss reductions and barriers.
  setUpPhase = backend->hostMemory()
                   ? "creating the backend's communicators"
                   : "creating the device communicators (NCCL: "
                     "ncclGetUniqueId, ncclCommInitRank, ncclCommSplit; "
                     "NCCL_DEBUG=INFO says where it waits)";
  if (hooks.stallInSetUp == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  TESSERA_ASSIGN_OR_RETURN(
      auto deviceComms,
      backend->createCommunicators(a, collectiveGroupKinds(a)));
  if (!backend->hostMemory()) {
    useDeviceCommunicators(comms, std::move(deviceComms));
    abortCommunicators = [be = backend.get()] { be->abortCommunicators(); };
  }
  setUpPhase = "opening the dataset and creating the executor";
  ExecutorOptions eo;
  eo.seed = o.seed;
  eo.profile = o.profile;
  eo.trace = !o.tracePath.empty();
  eo.mockData = o.mockData;
  // Every rank maps the dataset (cheap) and reads its own samples.
  TESSERA_ASSIGN_OR_RETURN(eo.dataset, openDataset(o, *artifact));
  if (eo.dataset && !artifactNeedsTokenData(a))
    eo.dataset.reset();
  dataset = eo.dataset;
  if (!o.evalDataPrefix.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string prefix,
                             IndexedDataset::resolvePrefix(o.evalDataPrefix));
    TESSERA_ASSIGN_OR_RETURN(evalDataset, IndexedDataset::open(prefix));
    for (const fb::Program *p : *a.programs())
      TESSERA_RETURN_IF_ERROR(checkTokenInputs(*p, a.batch()->micro_batch_size(),
                                               *evalDataset, artifact->name())
                                  .withContext("--eval-data"));
  }
  TESSERA_ASSIGN_OR_RETURN(executor,
                           Executor::create(artifact, std::move(backend),
                                            std::move(comms), rank, eo));
  hasGradNorm = executor->hasBuffer("grad_norm");
  hasParamsNorm = executor->hasBuffer("params_norm");
  if (const fb::Optimizer *opt = a.optimizer();
      opt && opt->initial_loss_scale() > 0) {
    GradScalerConfig c;
    c.constantScale = opt->loss_scale();
    c.initialScale = opt->initial_loss_scale();
    c.minScale = opt->min_loss_scale();
    c.window = opt->loss_scale_window();
    c.hysteresis = opt->hysteresis();
    scaler.emplace(c);
  }
  return Status();
}

/// --blas-core NAME: OpenBLAS runs that core's kernels here. The launcher
/// exports OPENBLAS_CORETYPE; under an mpirun of the user's own it must be
/// exported, and an OpenBLAS without that core runs another one.
Status RankRun::checkBlasCore() {
  if (o.blasCore.empty())
    return Status();
  TESSERA_RETURN_IF_ERROR(
      cpu::checkBlasCore(o.blasCore, cpu::hostCpuFeatures()));
  std::string running = cpu::runningBlasCore();
  if (!cpu::sameBlasCore(running, o.blasCore))
    return failedPrecondition(
        "--blas-core ", o.blasCore, ": OpenBLAS runs its ", running,
        " kernels (this OpenBLAS has no ", o.blasCore,
        " kernels, or an mpirun started without tessera-run did not export "
        "OPENBLAS_CORETYPE=",
        o.blasCore, ")");
  return Status();
}

/// --save DIR: what interrupted saves left there (iter_ directories
/// without a manifest, temporary files) goes, with a note.
Status RankRun::cleanSaveDirectory() {
  if (o.saveDir.empty())
    return Status();
  TESSERA_ASSIGN_OR_RETURN(CleanedSaves cleaned,
                           cleanInterruptedSaves(o.saveDir));
  for (const std::string &dir : cleaned.iterDirs)
    std::printf("tessera-run: removed %s, an interrupted save (no "
                "manifest.json)\n",
                dir.c_str());
  if (cleaned.tempFiles)
    std::printf("tessera-run: removed %lld temporary file(s) of interrupted "
                "writes in %s\n",
                (long long)cleaned.tempFiles, o.saveDir.c_str());
  std::fflush(stdout);
  return Status();
}

/// --load: the checkpoint's parameters, optimizer state and iteration.
Status RankRun::resume() {
  if (o.loadDir.empty())
    return Status();
  auto t0 = std::chrono::steady_clock::now();
  CheckpointLoadOptions lo = loadOptionsOf(o, dataset.get());
  lo.monitor = &checkpointSteps;
  lo.debugStallRank = hooks.stallInLoad;
  auto loaded = loadCheckpoint(*executor, o.loadDir, lo, world.get());
  if (loaded.ok()) {
    startIteration = loaded->iteration;
    // The iterations an fp16 run skipped stay out of the learning-rate
    // schedule and Adam's step whatever this run's precision (Megatron's
    // scheduler state). A dynamic scaler continues from its saved state
    // with the optimizer's (Megatron's grad scaler is optimizer state: not
    // with --no-load-optim); a constant one keeps --loss-scale, and a
    // checkpoint of a run without loss scaling starts it afresh.
    skippedTotal = loaded->skippedIterations;
    executor->setSkippedIterations(skippedTotal);
    if (scaler && scaler->dynamic() && loaded->gradScaler && !o.noLoadOptim)
      scaler->restore(*loaded->gradScaler);
    else if (scaler && scaler->dynamic())
      loaded->notes.push_back(
          loaded->gradScaler
              ? "--no-load-optim: the loss scale starts afresh"
              : "the checkpoint has no loss scaler state (saved without "
                "--fp16): the loss scale starts afresh");
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.2f", secs);
    loadMessage =
        "tessera-run: loaded checkpoint " + loaded->dir + " at iteration " +
        std::to_string(loaded->iteration) + " (saved at " +
        loaded->savedConfig +
        (loaded->resharded ? "; resharded to " + loaded->targetConfig
                           : std::string()) +
        (o.noLoadOptim ? "; parameters only" : "") + ") in " + buf + " s\n";
    for (const std::string &note : loaded->notes)
      loadMessage += "tessera-run: note: " + note + "\n";
  } else if (startsFromScratch(o, loaded.status())) {
    loadMessage = "tessera-run: no checkpoint in " + o.loadDir +
                  " yet; starting from iteration 1\n";
  } else {
    return loaded.status();
  }
  return Status();
}

/// Rank 0: what runs (artifact, mesh, batch, data, optimizer, learning-rate
/// schedule) and where it starts.
void RankRun::printHeader() const {
  const fb::Artifact &a = *artifact->root();
  const fb::Batch &batch = *a.batch();
  const fb::Optimizer *opt = a.optimizer();
  std::printf("tessera-run: %s | model %s | producer %s\n",
              artifact->name().c_str(), a.model() ? a.model()->c_str() : "?",
              a.producer() ? a.producer()->c_str() : "?");
  std::printf("tessera-run: world size %d | mesh %s | programs %u | "
              "backend %s | seed %llu | BLAS threads/rank %d%s%s\n",
              a.world_size(), meshString(a).c_str(), a.programs()->size(),
              o.backend.c_str(), (unsigned long long)o.seed, blasThreads,
              kernelLibraries.empty() ? "" : " | ", kernelLibraries.c_str());
  // OpenBLAS chose the kernels itself (no --blas-core, no
  // OPENBLAS_CORETYPE): say when it chose older ones than the CPU runs.
  if (o.backend == "cpu" && o.blasCore.empty() &&
      !std::getenv("OPENBLAS_CORETYPE")) {
    std::string running = cpu::runningBlasCore();
    std::string faster =
        cpu::suggestedBlasCore(cpu::hostCpuFeatures(), running);
    if (!faster.empty())
      std::printf("tessera-run: note: this CPU has AVX-512, OpenBLAS runs its "
                  "%s kernels, without AVX-512; --blas-core %s runs its "
                  "AVX-512 GEMMs\n",
                  running.c_str(), faster.c_str());
  }
  std::printf("tessera-run: batch: micro %lld x %lld microbatches x dp %d "
              "= global %lld\n",
              (long long)batch.micro_batch_size(),
              (long long)batch.num_microbatches(),
              executor->dataLayout().dpSize,
              (long long)batch.global_batch_size());
  if (!dataset && o.mockData && artifactNeedsTokenData(*artifact->root()))
    std::printf("tessera-run: data: mock (uniform synthetic tokens, seed "
                "%llu)\n",
                (unsigned long long)o.seed);
  if (dataset)
    std::printf("tessera-run: data %s: %lld documents, %lld sequences, "
                "%lld tokens (%s)\n",
                dataset->prefix().c_str(), (long long)dataset->numDocuments(),
                (long long)dataset->numSequences(),
                (long long)dataset->numTokens(),
                tokenDTypeName(dataset->dtype()));
  if (opt && opt->kind() && opt->kind()->str() == "sgd")
    std::printf("tessera-run: optimizer sgd lr=%g momentum=%g "
                "weight_decay=%g clip_grad=%g\n",
                opt->lr(), opt->momentum(), opt->weight_decay(),
                opt->clip_grad());
  else if (opt)
    std::printf("tessera-run: optimizer %s lr=%g beta1=%g beta2=%g eps=%g "
                "weight_decay=%g clip_grad=%g\n",
                opt->kind() ? opt->kind()->c_str() : "?", opt->lr(),
                opt->beta1(), opt->beta2(), opt->eps(), opt->weight_decay(),
                opt->clip_grad());
  if (opt && opt->initial_loss_scale() > 0) {
    if (opt->loss_scale() > 0)
      std::printf("tessera-run: fp16 loss scale %g (constant)\n",
                  opt->loss_scale());
    else
      std::printf("tessera-run: fp16 dynamic loss scale: initial %g, min %g, "
                  "window %lld, hysteresis %d\n",
                  opt->initial_loss_scale(), opt->min_loss_scale(),
                  (long long)opt->loss_scale_window(), opt->hysteresis());
  }
  if (opt && (opt->lr_warmup_iters() > 0 ||
              (opt->lr_decay_style() &&
               opt->lr_decay_style()->str() != "constant")))
    std::printf("tessera-run: lr schedule: warmup %lld iterations, %s decay "
                "to %g at iteration %lld\n",
                (long long)opt->lr_warmup_iters(),
                opt->lr_decay_style() ? opt->lr_decay_style()->c_str()
                                      : "constant",
                opt->min_lr(), (long long)opt->lr_decay_iters());
  std::printf("%s", loadMessage.c_str());
  if (o.evalOnly)
    std::printf("tessera-run: evaluating %lld batch(es) of %s (--eval-only)\n",
                (long long)o.evalIters,
                evalDataset ? evalDataset->prefix().c_str()
                : dataset   ? "the training data"
                            : "mock data");
  else if (startIteration >= o.steps)
    std::printf("tessera-run: the checkpoint's iteration %lld reaches "
                "--steps %lld: nothing to train\n",
                (long long)startIteration, (long long)o.steps);
  std::fflush(stdout);
}

/// Rank 0: opens --metrics.
Status RankRun::openMetrics() {
  if (o.metricsPath.empty())
    return Status();
  FILE *f = std::fopen(o.metricsPath.c_str(), "w");
  if (!f)
    return notFound(o.metricsPath,
                    ": cannot open metrics file: ", std::strerror(errno));
  metrics.reset(f);
  return Status();
}

/// Before the first iteration: the metrics' baselines, the start of the
/// trace, the stall hook and "init".
Status RankRun::startTraining() {
  const fb::Program &program = executor->program();
  if (program.inputs())
    for (const fb::InputSpec *spec : *program.inputs())
      if (isTokenInput(*spec)) {
        const fb::Buffer *buf = program.buffers()->Get(spec->buffer());
        // The whole sample (a context-parallel input holds a share).
        const auto *shape =
            buf->global_shape() && buf->global_shape()->size() == 2
                ? buf->global_shape()
                : buf->shape();
        if (shape && shape->size() == 2)
          tokensPerSample = shape->Get(0);
      }

  for (auto &entry : executor->commCounters())
    kinds.insert(entry.first);
  before = executor->commCounters();
  kernelsBefore = executor->kernelSeconds();
  if (!o.tracePath.empty()) {
    // Line the ranks' clocks up: start every timeline after one barrier.
    if (world)
      TESSERA_RETURN_IF_ERROR(world->barrier());
    executor->startTrace();
  }
  // Fault injection for tests: this rank stalls before its first step.
  if (hooks.stallRank == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  // Mixed precision: the fp32 main params from the (initialised or loaded)
  // parameters, unless the checkpoint restored every one of them; here
  // rather than inside iteration 1, so that it is traced but not timed as
  // part of an iteration.
  return executor->runInit().status();
}

/// Iteration `it`, timed, and rank 0's report of it.
Status RankRun::trainIteration(int64_t it) {
  if (scaler)
    executor->setLossScale(scaler->scale());
  lrThis = executor->learningRate(it - skippedTotal);
  auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(double loss, executor->runIteration(it));
  auto t1 = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(t1 - t0).count();
  // fp16: an iteration whose gradients held an inf or NaN (on any rank:
  // the norm is global) updated nothing; the scale moves either way.
  skippedThis = scaler && executor->lastIterationSkipped();
  if (scaler) {
    scaler->update(skippedThis);
    skippedTotal += skippedThis;
    executor->setSkippedIterations(skippedTotal);
  }
  if (hasGradNorm) {
    // One f32, the same on every rank (the norm's reductions span them).
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> norm,
                             executor->readFloatBuffer("grad_norm"));
    gradNorm = norm.empty() ? std::nan("") : double(norm[0]);
  }
  if (hasParamsNorm) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> norm,
                             executor->readFloatBuffer("params_norm"));
    paramsNorm = norm.empty() ? std::nan("") : double(norm[0]);
  }
  nanIterations = (hasLoss && !std::isfinite(loss)) ||
                  (hasGradNorm && !std::isfinite(gradNorm) && !skippedThis);
  std::map<std::string, CommCounters> after = executor->commCounters();
  if (rank == 0)
    TESSERA_RETURN_IF_ERROR(report(it, loss, seconds, after));
  before = std::move(after);
  kernelsBefore = executor->kernelSeconds();
  // Every rank holds the same reduced loss, so every rank stops here, before
  // saveIfDue could write a checkpoint of the poisoned state.
  if (o.checkForNanInLoss && hasLoss && !std::isfinite(loss))
    return failedPrecondition(
        artifact->name(), ": iteration ", it, ": the loss is ",
        std::isnan(loss) ? "NaN" : "inf",
        "; stopping before any checkpoint of this state is saved (Megatron's "
        "check for NaN in the loss; --no-check-for-nan-in-loss trains on)");
  // Megatron's check_for_nan_in_loss_and_grad: the gradients too (under
  // fp16 their overflow is the loss scaler's to handle: a skipped step).
  if (o.checkForNanInLoss && hasGradNorm && !std::isfinite(gradNorm) &&
      !scaler)
    return failedPrecondition(
        artifact->name(), ": iteration ", it, ": the gradient norm is ",
        std::isnan(gradNorm) ? "NaN" : "inf",
        "; stopping before any checkpoint of this state is saved (Megatron's "
        "check for NaN in the gradients; --no-check-for-nan-in-loss trains "
        "on)");
  return Status();
}

/// Rank 0: Megatron's progress line of iteration `it` and its --metrics
/// line.
Status RankRun::report(int64_t it, double loss, double seconds,
                       std::map<std::string, CommCounters> &after) {
  const fb::Artifact &a = *artifact->root();
  const fb::Batch &batch = *a.batch();
  double tokensPerSecond =
      seconds > 0
          ? double(batch.global_batch_size() * tokensPerSample) / seconds
          : 0.0;
  double tflops = seconds > 0 ? a.flops_per_step() / seconds / 1e12 : 0.0;
  // Megatron's training_log fields after the loss: grad norm, params norm,
  // the skipped and NaN iterations.
  // NaN printed as "nan", not "-nan".
  auto unsignedNan = [](double v) { return std::isnan(v) ? std::nan("") : v; };
  // fp16: the loss scale after the iteration's update, and no grad norm
  // for a skipped iteration (Megatron's).
  char norm[256] = "";
  int at = 0;
  if (scaler)
    at += std::snprintf(norm + at, sizeof(norm) - at, " loss scale: %.1f |",
                        scaler->scale());
  if (hasGradNorm && !skippedThis)
    at += std::snprintf(norm + at, sizeof(norm) - at, " grad norm: %.3f |",
                        unsignedNan(gradNorm));
  if (hasParamsNorm)
    at += std::snprintf(norm + at, sizeof(norm) - at, " params norm: %.3f |",
                        unsignedNan(paramsNorm));
  std::snprintf(norm + at, sizeof(norm) - at,
                " number of skipped iterations: %3lld | number of nan "
                "iterations: %3lld |",
                (long long)skippedThis, (long long)nanIterations);
  std::printf(" [%s] iteration %8lld/%8lld | consumed samples: %12lld | "
              "elapsed time per iteration (ms): %.1f | throughput per "
              "rank (TFLOP/s): %.3f | learning rate: "
              "%.3E | global batch size: %5lld | loss: %.6E |%s tokens per "
              "second: %.1f |\n",
              timestamp().c_str(), (long long)it, (long long)o.steps,
              (long long)(it * batch.global_batch_size()), seconds * 1000.0,
              tflops, lrThis,
              (long long)batch.global_batch_size(), loss, norm,
              tokensPerSecond);
  std::fflush(stdout);
  if (!metrics)
    return Status();
  std::string line =
      metricsLine(it, loss, tokensPerSecond, seconds, tflops, after);
  if (std::fputs(line.c_str(), metrics.get()) < 0 ||
      std::fflush(metrics.get()))
    return dataLoss(o.metricsPath, ": write failed");
  return Status();
}

/// One JSON line of --metrics: the loss, throughput, learning rate and step
/// time of iteration `it`, its communication bytes per collective and group
/// kind, and with --profile its kernel seconds per opcode (rank 0's).
/// A double in full (fp16's loss scale: 4294967296, not 4.2949673e+09).
static std::string exactNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string RankRun::metricsLine(int64_t it, double loss,
                                 double tokensPerSecond, double seconds,
                                 double tflops,
                                 std::map<std::string, CommCounters> &after) {
  std::string line = "{\"step\": " + std::to_string(it) +
                     ", \"loss\": " + jsonNumber(loss) +
                     ", \"tokens_per_s\": " + jsonNumber(tokensPerSecond) +
                     ", \"lr\": " + jsonNumber(lrThis) +
                     ", \"step_time_s\": " + jsonNumber(seconds) +
                     ", \"tflops_per_rank\": " + jsonNumber(tflops) +
                     (hasGradNorm
                          ? ", \"grad_norm\": " +
                                (skippedThis ? std::string("null")
                                             : jsonNumber(gradNorm))
                          : std::string()) +
                     (scaler ? ", \"loss_scale\": " + exactNumber(scaler->scale())
                             : std::string()) +
                     (hasParamsNorm
                          ? ", \"params_norm\": " + jsonNumber(paramsNorm)
                          : std::string()) +
                     ", \"skipped_iterations\": " +
                     std::to_string(int(skippedThis)) +
                     ", \"nan_iterations\": " +
                     std::to_string(nanIterations) +
                     ", \"comm_bytes\": {";
  for (int c = 0; c < kNumCollectiveNames; ++c) {
    line += std::string(c ? ", " : "") + "\"" + kCollectiveNames[c] + "\": {";
    bool first = true;
    for (const std::string &kind : kinds) {
      uint64_t bytes = counterOf(after[kind] - before[kind], c);
      line += std::string(first ? "" : ", ") + jsonString(kind) + ": " +
              std::to_string(bytes);
      first = false;
    }
    line += "}";
  }
  line += "}";
  if (o.profile) {
    // Per-opcode seconds of this step on rank 0.
    line += ", \"kernel_time_s\": {";
    bool first = true;
    for (auto &[name, secs] : executor->kernelSeconds()) {
      line += std::string(first ? "" : ", ") + jsonString(name) + ": " +
              jsonNumber(secs - kernelsBefore[name]);
      first = false;
    }
    line += "}";
  }
  line += "}\n";
  return line;
}

/// --save: a checkpoint after every --save-interval iterations and after
/// the last one.
Status RankRun::saveIfDue(int64_t it) {
  if (o.saveDir.empty() ||
      !((o.saveInterval > 0 && it % o.saveInterval == 0) || it == o.steps))
    return Status();
  auto s0 = std::chrono::steady_clock::now();
  CheckpointSaveOptions so;
  so.dir = o.saveDir;
  so.info.iteration = it;
  so.info.seed = o.seed;
  if (scaler) {
    so.info.gradScaler = scaler->saved();
    so.info.skippedIterations = skippedTotal;
  }
  if (dataset) {
    so.info.datasetPrefix = dataset->prefix();
    so.info.datasetTokens = dataset->numTokens();
  }
  so.debugExitAfterShard = hooks.exitInSave;
  so.debugStallRank = hooks.stallInSave;
  so.monitor = &checkpointSteps;
  {
    // ZeRO-3: the parameters are saved whole, gathered from their shards.
    WaitMonitor::Step step(&checkpointSteps,
                           "saving checkpoint iteration " + std::to_string(it) +
                               ": all-gathering the sharded parameters "
                               "(ZeRO-3)",
                           WaitMonitor::On::Peers);
    TESSERA_RETURN_IF_ERROR(executor->gatherStagedParameters());
    // (Its bytes are the save's, not the next iteration's.)
    before = executor->commCounters();
  }
  StatusOr<CheckpointSaveResult> done =
      saveCheckpoint(*executor, so, world.get());
  executor->releaseStagedParameters(); // (whether or not the save worked)
  TESSERA_ASSIGN_OR_RETURN(CheckpointSaveResult saved, std::move(done));
  if (rank == 0) {
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s0)
            .count();
    std::printf("tessera-run: saved checkpoint iteration %lld to %s (%d "
                "shards, %.2f MB) in %.2f s\n",
                (long long)it, saved.dir.c_str(),
                artifact->root()->world_size(), double(saved.bytes) / 1e6,
                secs);
    std::fflush(stdout);
  }
  return Status();
}

/// Megatron's evaluate_and_print_results after iteration `it`: the mean
/// loss of --eval-iters batches with the forward alone (the validation
/// set's batches 1..N, or the --data batches it + 1..it + N), its
/// perplexity, and a metrics line.
Status RankRun::evaluate(int64_t it) {
  std::vector<double> losses;
  for (int64_t k = 1; k <= o.evalIters; ++k) {
    const int64_t batch = evalDataset ? k : it + k;
    TESSERA_ASSIGN_OR_RETURN(double loss, executor->evaluate(batch, evalDataset));
    losses.push_back(loss);
  }
  // The next iteration's report counts its own bytes and kernel time only.
  before = executor->commCounters();
  kernelsBefore = executor->kernelSeconds();
  double mean = 0;
  for (double l : losses)
    mean += l;
  mean /= double(losses.size());
  if (o.checkForNanInLoss && hasLoss && !std::isfinite(mean))
    return failedPrecondition(artifact->name(), ": the validation loss after iteration ",
                              it, " is ", std::isnan(mean) ? "NaN" : "inf");
  if (rank != 0)
    return Status();
  const double ppl = std::exp(std::min(20.0, mean));
  std::string text = " validation loss at iteration " + std::to_string(it) +
                     " | lm loss value: ";
  char num[64];
  std::snprintf(num, sizeof(num), "%.6E", mean);
  text += num;
  std::snprintf(num, sizeof(num), "%.6E", ppl);
  text += std::string(" | lm loss PPL: ") + num + " | ";
  std::string rule(text.size() + 1, '-');
  std::printf("%s\n%s\n%s\n", rule.c_str(), text.c_str(), rule.c_str());
  std::fflush(stdout);
  if (metrics) {
    std::string line = "{\"eval_iteration\": " + std::to_string(it) +
                       ", \"eval_loss\": " + exactNumber(mean) +
                       ", \"eval_ppl\": " + exactNumber(ppl) + ", \"eval_batches\": [";
    for (size_t k = 0; k < losses.size(); ++k) {
      const int64_t batch = evalDataset ? int64_t(k) + 1 : it + int64_t(k) + 1;
      line += std::string(k ? ", " : "") + "{\"batch\": " + std::to_string(batch) +
              ", \"loss\": " + exactNumber(losses[k]) + "}";
    }
    line += "]}\n";
    std::fputs(line.c_str(), metrics.get());
    std::fflush(metrics.get());
  }
  return Status();
}

/// Test hook (TESSERA_DEBUG_EXIT_AFTER_STEP): the whole job dies right
/// after iteration `it` (and its checkpoint).
Status RankRun::exitIfHooked(int64_t it) {
  if (it != hooks.exitAfterStep)
    return Status();
  if (world)
    TESSERA_RETURN_IF_ERROR(world->barrier());
  std::fflush(stdout);
  std::fflush(stderr);
  if (metrics)
    std::fflush(metrics.get());
  ::_exit(9);
}

Status runRank(const LaunchOptions &o, int rank, int size) {
  RankRun run(o, rank, size);
  return run.run();
}

} // namespace

int runInsideMpi(const LaunchOptions &o, int argc, char **argv) {
  // In a job tessera-run did not start (the user's mpirun or srun), the
  // ranks lack the environment its launcher exports: set it and start this
  // process again, before MPI_Init (OpenBLAS and OpenMP read it only when
  // they load). TESSERA_RUN_RANK_ENV marks the second start.
  if (!std::getenv("TESSERA_RUN_RANK_ENV")) {
    auto exported = exportRankEnvironment(o);
    if (!exported.ok())
      return errorExit(exported.status().message());
    if (!exported->empty()) {
      setenv("TESSERA_RUN_RANK_ENV", "1", 1);
      std::string self = selfExecutable();
      std::fflush(stdout);
      std::fflush(stderr);
      if (!self.empty() && argc > 0)
        execv(self.c_str(), argv);
      return errorExit("cannot restart tessera-run with " +
                       exported->front() + " set: " +
                       (self.empty() ? std::string("no path to itself")
                                     : std::strerror(errno)));
    }
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) !=
      MPI_SUCCESS)
    return errorExit("MPI_Init failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Status st;
  try {
    st = runRank(o, rank, size);
  } catch (const std::exception &e) {
    st = internalError("uncaught exception: ", e.what());
  }
  if (!st.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera-run: error: rank %d: %s\n", rank,
                 st.message().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}

} // namespace tessera::rt::launcher
