//===- Launcher.cpp - tessera-run driver ----------------------------------===//
//
// Command-line handling, pre-launch validation, re-execution under mpirun and
// the per-rank training loop with Megatron-style reporting.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Launcher.h"
#include "tessera/rt/Artifact.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/CommandLine.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/MpiCommunicator.h"
#include "tessera/rt/WaitMonitor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <thread>

namespace tessera::rt {

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

std::string launchUsage(const char *argv0) {
  return std::string("usage: ") + argv0 +
         " -n N FILE.tsr --steps S [--seed S] [--metrics FILE]\n"
         "       [--backend cpu] [--threads T] [--data PREFIX]\n"
         "       [--save DIR [--save-interval K]] [--load DIR "
         "[--no-load-optim]]\n"
         "       " +
         argv0 +
         " FILE.tsr --print-summary\n"
         "\n"
         "  -n N             number of MPI ranks (must equal the artifact's "
         "world size;\n"
         "                   default: the artifact's world size)\n"
         "  --steps S        train up to iteration S: the total iteration "
         "count, so a\n"
         "                   run resumed with --load at iteration K trains "
         "K+1..S\n"
         "                   (Megatron's --train-iters)\n"
         "  --seed S         seed of weight init and synthetic data "
         "(default 1234)\n"
         "  --data PREFIX    Megatron indexed dataset (PREFIX.bin/.idx or\n"
         "                   PREFIX_text_document.bin/.idx, e.g. from\n"
         "                   tessera-preprocess) for models with token "
         "inputs\n"
         "  --metrics FILE   write one JSON line per step\n"
         "  --save DIR       write checkpoints to DIR every --save-interval\n"
         "                   iterations and after the last one: one shard per "
         "rank in\n"
         "                   DIR/iter_NNNNNNN/rank_RRRRR.bin, then "
         "manifest.json,"
         "\n"
         "                   then DIR/latest; atomic (a crash leaves the "
         "previous"
         "\n"
         "                   checkpoint loadable)\n"
         "  --save-interval K  save every K iterations (default: only at the "
         "end)\n"
         "  --load DIR       resume from the checkpoint DIR/latest names (or "
         "the"
         "\n"
         "                   iter_NNNNNNN directory DIR): parameters, "
         "optimizer "
         "state\n"
         "                   and iteration; resharded when tp/pp/dp differ. "
         "With"
         "\n"
         "                   --save DIR, the same DIR without a checkpoint yet "
         "starts\n"
         "                   from scratch\n"
         "  --no-load-optim  with --load: restore parameters and iteration "
         "only\n"
         "  --timeout S      seconds one instruction or checkpoint step may "
         "take\n"
         "                   before every rank stops with an error naming it\n"
         "                   (default 300, 0: off)\n"
         "  --trace FILE     write a Chrome/Perfetto trace of every rank's\n"
         "                   instructions (phases, compute, communication,\n"
         "                   pipeline p2p)\n"
         "  --profile        time every instruction; adds per-opcode seconds\n"
         "                   (kernel_time_s) to the metrics lines\n"
         "  --backend NAME   compute backend (default cpu)\n"
         "  --threads T      BLAS threads per rank (default: cores / N)\n"
         "  --print-summary  print the artifact manifest and exit\n";
}

static StatusOr<int64_t> parseInt(const std::string &flag,
                                  const std::string &text, int64_t min) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < min)
    return invalidArgument("invalid value '", text, "' for ", flag,
                           " (expected an integer >= ", min, ")");
  return int64_t(v);
}

StatusOr<LaunchOptions> parseLaunchOptions(int argc, char **argv) {
  LaunchOptions o;
  ArgReader args(argc, argv);
  while (args.next()) {
    const std::string &arg = args.arg();
    auto next = [&] { return args.value(); };
    bool hasInline = args.hasInlineValue();
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "-n" || arg == "--np") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t n, parseInt("-n", v, 1));
      if (n > INT_MAX)
        return invalidArgument("-n is too large");
      o.numRanks = int(n);
    } else if (arg == "--steps") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.steps, parseInt(arg, v, 0));
    } else if (arg == "--seed") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t s, parseInt(arg, v, 0));
      o.seed = uint64_t(s);
    } else if (arg == "--metrics") {
      TESSERA_ASSIGN_OR_RETURN(o.metricsPath, next());
      if (o.metricsPath.empty())
        return invalidArgument("empty --metrics path");
    } else if (arg == "--data") {
      TESSERA_ASSIGN_OR_RETURN(o.dataPrefix, next());
      if (o.dataPrefix.empty())
        return invalidArgument("empty --data prefix");
    } else if (arg == "--save") {
      TESSERA_ASSIGN_OR_RETURN(o.saveDir, next());
      if (o.saveDir.empty())
        return invalidArgument("empty --save directory");
    } else if (arg == "--save-interval") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.saveInterval, parseInt(arg, v, 1));
    } else if (arg == "--load") {
      TESSERA_ASSIGN_OR_RETURN(o.loadDir, next());
      if (o.loadDir.empty())
        return invalidArgument("empty --load directory");
    } else if (arg == "--no-load-optim") {
      if (hasInline)
        return invalidArgument("--no-load-optim takes no value");
      o.noLoadOptim = true;
    } else if (arg == "--backend") {
      TESSERA_ASSIGN_OR_RETURN(o.backend, next());
    } else if (arg == "--threads") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t t, parseInt(arg, v, 1));
      o.threads = int(std::min<int64_t>(t, 1024));
    } else if (arg == "--timeout") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      char *end = nullptr;
      o.timeout = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || o.timeout < 0)
        return invalidArgument("--timeout needs a number of seconds >= 0, got '",
                               v, "'");
    } else if (arg == "--trace") {
      TESSERA_ASSIGN_OR_RETURN(o.tracePath, next());
      if (o.tracePath.empty())
        return invalidArgument("empty --trace path");
    } else if (arg == "--profile") {
      if (hasInline)
        return invalidArgument("--profile takes no value");
      o.profile = true;
    } else if (arg == "--print-summary") {
      if (hasInline)
        return invalidArgument("--print-summary takes no value");
      o.printSummary = true;
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      return invalidArgument("unknown option '", args.raw(), "'");
    } else {
      if (!o.artifactPath.empty())
        return invalidArgument("more than one artifact file given ('",
                               o.artifactPath, "' and '", arg, "')");
      o.artifactPath = arg;
    }
  }
  if (o.help)
    return o;
  if (o.artifactPath.empty())
    return invalidArgument("no artifact file given");
  if (!o.printSummary && o.steps < 0)
    return invalidArgument("--steps is required");
  if (o.saveInterval > 0 && o.saveDir.empty())
    return invalidArgument("--save-interval needs --save DIR");
  if (o.noLoadOptim && o.loadDir.empty())
    return invalidArgument("--no-load-optim needs --load DIR");
  return o;
}

bool insideMpiJob() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static int errorExit(const std::string &message) {
  std::fprintf(stderr, "tessera-run: error: %s\n", message.c_str());
  return 1;
}

static std::string selfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return "";
  return std::string(buf, size_t(n));
}

static int defaultThreads(int numRanks) {
  unsigned cores = std::thread::hardware_concurrency();
  return std::max(1, int(cores ? cores : 1) / std::max(1, numRanks));
}

static std::string meshString(const fb::Artifact &a) {
  std::string s;
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      s += (s.empty() ? "" : " x ") +
           (axis->name() ? axis->name()->str() : std::string("?")) + "=" +
           std::to_string(axis->size());
  return s.empty() ? "(none)" : s;
}

static std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

/// Opens the --data dataset (null if none was given) and checks it against
/// every program's token inputs. A program with token inputs but no --data
/// is a FailedPrecondition (a usage error).
static StatusOr<std::shared_ptr<const IndexedDataset>>
openDataset(const LaunchOptions &o, const LoadedArtifact &artifact) {
  const fb::Artifact &a = *artifact.root();
  if (o.dataPrefix.empty()) {
    if (artifactNeedsTokenData(a))
      return failedPrecondition(
          artifact.name(), " has token inputs (a language model): "
                           "--data PREFIX is required (make the dataset with "
                           "tessera-preprocess)");
    return std::shared_ptr<const IndexedDataset>();
  }
  TESSERA_ASSIGN_OR_RETURN(std::string prefix,
                           IndexedDataset::resolvePrefix(o.dataPrefix));
  TESSERA_ASSIGN_OR_RETURN(auto dataset, IndexedDataset::open(prefix));
  for (const fb::Program *p : *a.programs())
    TESSERA_RETURN_IF_ERROR(checkTokenInputs(*p, a.batch()->micro_batch_size(),
                                             *dataset, artifact.name()));
  return dataset;
}

static Status checkDataOption(const LaunchOptions &o,
                              const LoadedArtifact &artifact) {
  auto dataset = openDataset(o, artifact);
  if (!dataset.ok())
    return dataset.status();
  if (*dataset && !artifactNeedsTokenData(*artifact.root()))
    std::fprintf(stderr,
                 "tessera-run: warning: %s has no token inputs; --data %s is "
                 "not used\n",
                 artifact.name().c_str(), o.dataPrefix.c_str());
  return Status();
}

static std::string withoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

/// True if --load and --save name the same directory (the auto-resume
/// pattern: a first run finds no checkpoint there and starts from scratch).
static bool sameDirectory(const std::string &a, const std::string &b) {
  if (a.empty() || b.empty())
    return false;
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return withoutTrailingSlashes(a) == withoutTrailingSlashes(b);
}

static CheckpointLoadOptions loadOptionsOf(const LaunchOptions &o,
                                           const IndexedDataset *dataset) {
  CheckpointLoadOptions lo;
  lo.seed = o.seed;
  lo.loadOptimizer = !o.noLoadOptim;
  if (dataset) {
    lo.datasetPrefix = dataset->prefix();
    lo.datasetTokens = dataset->numTokens();
  }
  return lo;
}

/// --load DIR with no checkpoint in it: fine (start from scratch) only when
/// DIR is also the --save directory.
static bool startsFromScratch(const LaunchOptions &o, const Status &st) {
  return st.getCode() == StatusCode::NotFound &&
         sameDirectory(o.loadDir, o.saveDir);
}

//===----------------------------------------------------------------------===//
// Outside MPI: validate and re-execute under mpirun
//===----------------------------------------------------------------------===//

static int launchUnderMpirun(const LaunchOptions &o, int argc, char **argv) {
  auto loaded = LoadedArtifact::loadFromFile(o.artifactPath);
  if (!loaded.ok())
    return errorExit(loaded.status().message());
  const LoadedArtifact &artifact = **loaded;
  Status st = Executor::validate(artifact);
  if (!st.ok())
    return errorExit(st.message());
  st = checkDataOption(o, artifact);
  if (!st.ok()) {
    if (st.getCode() == StatusCode::FailedPrecondition) {
      // A missing --data is a usage error.
      std::fprintf(stderr, "tessera-run: error: %s\n%s", st.message().c_str(),
                   launchUsage(argc > 0 ? argv[0] : "tessera-run").c_str());
      return 1;
    }
    return errorExit(st.message());
  }
  if (!o.saveDir.empty()) {
    st = makeDirectories(o.saveDir);
    if (!st.ok())
      return errorExit("--save: " + st.message());
  }
  if (!o.loadDir.empty()) {
    auto dataset = openDataset(o, artifact);
    st = checkCheckpointForLaunch(
        artifact, o.loadDir,
        loadOptionsOf(o, dataset.ok() ? dataset->get() : nullptr));
    if (!st.ok() && !startsFromScratch(o, st))
      return errorExit(st.message());
  }
  int world = artifact.root()->world_size();
  int n = o.numRanks ? o.numRanks : world;
  if (n != world)
    return errorExit("-n " + std::to_string(n) +
                     " does not match the world "
                     "size " +
                     std::to_string(world) + " of " + o.artifactPath +
                     " (mesh " + meshString(*artifact.root()) + ")");
  {
    auto backend = BackendRegistry::global().create(o.backend, {});
    if (!backend.ok())
      return errorExit(backend.status().message());
  }
  int threads = o.threads ? o.threads : defaultThreads(n);
  if (o.threads || !std::getenv("OPENBLAS_NUM_THREADS"))
    setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);
  // Idle OpenMP workers must not spin on the cores the BLAS threads use.
  if (!std::getenv("OMP_WAIT_POLICY"))
    setenv("OMP_WAIT_POLICY", "passive", 1);

  std::string self = selfExecutable();
  if (self.empty())
    return errorExit("cannot determine the path of tessera-run");
  std::vector<std::string> args = {"mpirun",          "-n",
                                   std::to_string(n), "--oversubscribe",
                                   "--bind-to",       "none"};
  if (geteuid() == 0)
    args.push_back("--allow-run-as-root");
  args.insert(args.end(),
              {"-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_WAIT_POLICY", self});
  for (int i = 1; i < argc; ++i)
    args.push_back(argv[i]);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp("mpirun", cargs.data());
  return errorExit(std::string("cannot execute mpirun: ") +
                   std::strerror(errno));
}

//===----------------------------------------------------------------------===//
// Inside MPI: one rank
//===----------------------------------------------------------------------===//

namespace {

/// The per-kind byte counters in the metrics' comm_bytes.
const char *const kCollectiveNames[] = {"all_reduce", "all_gather",
                                        "reduce_scatter", "p2p"};
constexpr int kNumCollectiveNames = 4;

uint64_t counterOf(const CommCounters &c, int kind) {
  switch (kind) {
  case 0:
    return c.allReduce;
  case 1:
    return c.allGather;
  case 2:
    return c.reduceScatter;
  default:
    return c.p2p;
  }
}

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

/// Gathers every rank's timeline to rank 0, which writes one Chrome/Perfetto
/// trace (a process per rank, a thread per track) atomically.
Status writeTrace(const std::string &path, const Executor &executor,
                         int rank) {
  static const char *tracks[] = {"phase", "compute", "communication", "p2p"};
  constexpr int numTracks = 4;
  std::string mine;
  for (const TraceEvent &e : executor.traceEvents()) {
    int tid = 0;
    for (int i = 0; i < numTracks; ++i)
      if (e.track == tracks[i])
        tid = i;
    mine += "{\"name\": " + jsonString(e.name) + ", \"cat\": " +
            jsonString(e.track) + ", \"ph\": \"X\", \"pid\": " +
            std::to_string(rank) + ", \"tid\": " + std::to_string(tid) +
            ", \"ts\": " + jsonNumber(e.startUs) +
            ", \"dur\": " + jsonNumber(e.durationUs) + "},\n";
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int length = int(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size));
  std::vector<int> offsets(static_cast<size_t>(size));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Gather(&length, 1, MPI_INT, lengths.data(),
                                         1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[size_t(r)] = total;
      total += lengths[size_t(r)];
    }
    all.resize(size_t(total));
  }
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Gatherv(mine.data(), length, MPI_CHAR,
                                          all.data(), lengths.data(),
                                          offsets.data(), MPI_CHAR, 0,
                                          MPI_COMM_WORLD));
  if (rank != 0)
    return Status();
  std::string json = "{\"traceEvents\": [\n";
  for (int r = 0; r < size; ++r) {
    json += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " +
            std::to_string(r) + ", \"args\": {\"name\": \"rank " +
            std::to_string(r) + "\"}},\n";
    for (int t = 0; t < numTracks; ++t)
      json += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " +
              std::to_string(r) + ", \"tid\": " + std::to_string(t) +
              ", \"args\": {\"name\": \"" + tracks[t] + "\"}},\n";
  }
  json += all;
  json.resize(json.size() - 2); // the last ",\n"
  json += "\n]}\n";
  std::string tmp = path + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "w");
  if (!f)
    return notFound(path, ": cannot write the trace: ", std::strerror(errno));
  bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    return dataLoss(path, ": writing the trace failed");
  return Status();
}


Status runRank(const LaunchOptions &o, int rank, int size) {
  TESSERA_ASSIGN_OR_RETURN(auto artifact,
                           LoadedArtifact::loadFromFile(o.artifactPath));
  const fb::Artifact &a = *artifact->root();
  if (size != a.world_size())
    return failedPrecondition("MPI world size ", size,
                              " does not match the world size ", a.world_size(),
                              " of ", artifact->name(), " (mesh ",
                              meshString(a), "); run with -n ", a.world_size());
  if (o.numRanks && o.numRanks != size)
    return failedPrecondition("-n ", o.numRanks, " but the MPI job has ", size,
                              " ranks");

  TESSERA_ASSIGN_OR_RETURN(CommunicatorSet comms, createMpiCommunicators(a));
  std::unique_ptr<Communicator> world = std::move(comms.world);

  BackendOptions bo;
  if (o.threads)
    bo.numThreads = o.threads;
  else if (const char *env = std::getenv("OPENBLAS_NUM_THREADS"))
    bo.numThreads = std::max(1, std::atoi(env));
  else
    bo.numThreads = defaultThreads(size);
  TESSERA_ASSIGN_OR_RETURN(auto backend,
                           BackendRegistry::global().create(o.backend, bo));
  ExecutorOptions eo;
  eo.seed = o.seed;
  eo.profile = o.profile;
  eo.trace = !o.tracePath.empty();
  // Every rank maps the dataset (cheap) and reads its own samples.
  TESSERA_ASSIGN_OR_RETURN(eo.dataset, openDataset(o, *artifact));
  if (eo.dataset && !artifactNeedsTokenData(a))
    eo.dataset.reset();
  TESSERA_ASSIGN_OR_RETURN(auto executor,
                           Executor::create(artifact, std::move(backend),
                                            std::move(comms), rank, eo));
  // The watchdog: a collective whose peer died or stalled would block
  // forever; after --timeout seconds in one instruction, or in one step of a
  // checkpoint save or load, the rank reports it and exits, and mpirun then
  // ends every other rank.
  WaitMonitor checkpointSteps;
  std::atomic<bool> finished{false};
  std::thread watchdog;
  if (o.timeout > 0)
    watchdog = std::thread([&, rank] {
      while (!finished.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        WaitMonitor::On on = WaitMonitor::On::Peers;
        std::string stuck = executor->stalledInstruction(o.timeout);
        if (stuck.empty())
          stuck = checkpointSteps.stalled(o.timeout, &on);
        if (!stuck.empty()) {
          std::fflush(stdout);
          std::fprintf(
              stderr, "tessera-run: error: rank %d: %s (timeout %g s): %s\n",
              rank, stuck.c_str(), o.timeout, WaitMonitor::likelyCause(on));
          std::fflush(stderr);
          std::_Exit(1);
        }
      }
    });
  struct StopWatchdog {
    std::atomic<bool> &finished;
    std::thread &thread;
    ~StopWatchdog() {
      finished.store(true);
      if (thread.joinable())
        thread.join();
    }
  } stopWatchdog{finished, watchdog};
  TESSERA_RETURN_IF_ERROR(executor->initializeParameters());
  // --load: the checkpoint's parameters, optimizer state and iteration.
  int64_t startIteration = 0;
  std::string loadMessage;
  if (!o.loadDir.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    CheckpointLoadOptions lo = loadOptionsOf(o, eo.dataset.get());
    lo.monitor = &checkpointSteps;
    if (const char *env = std::getenv("TESSERA_DEBUG_STALL_IN_LOAD"))
      lo.debugStallRank = std::atoi(env);
    auto loaded = loadCheckpoint(*executor, o.loadDir, lo, world.get());
    if (loaded.ok()) {
      startIteration = loaded->iteration;
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
  }

  const fb::Batch &batch = *a.batch();
  const fb::Optimizer *opt = a.optimizer();
  FILE *metrics = nullptr;
  if (rank == 0) {
    std::printf("tessera-run: %s | model %s | producer %s\n",
                artifact->name().c_str(), a.model() ? a.model()->c_str() : "?",
                a.producer() ? a.producer()->c_str() : "?");
    std::printf("tessera-run: world size %d | mesh %s | programs %u | "
                "backend %s | seed %llu | BLAS threads/rank %d\n",
                a.world_size(), meshString(a).c_str(), a.programs()->size(),
                o.backend.c_str(), (unsigned long long)o.seed, bo.numThreads);
    std::printf("tessera-run: batch: micro %lld x %lld microbatches x dp %d "
                "= global %lld\n",
                (long long)batch.micro_batch_size(),
                (long long)batch.num_microbatches(),
                executor->dataLayout().dpSize,
                (long long)batch.global_batch_size());
    if (eo.dataset)
      std::printf("tessera-run: data %s: %lld documents, %lld sequences, "
                  "%lld tokens (%s)\n",
                  eo.dataset->prefix().c_str(),
                  (long long)eo.dataset->numDocuments(),
                  (long long)eo.dataset->numSequences(),
                  (long long)eo.dataset->numTokens(),
                  tokenDTypeName(eo.dataset->dtype()));
    if (opt)
      std::printf("tessera-run: optimizer %s lr=%g beta1=%g beta2=%g eps=%g "
                  "weight_decay=%g\n",
                  opt->kind() ? opt->kind()->c_str() : "?", opt->lr(),
                  opt->beta1(), opt->beta2(), opt->eps(), opt->weight_decay());
    if (opt && (opt->lr_warmup_iters() > 0 ||
                (opt->lr_decay_style() && opt->lr_decay_style()->str() != "constant")))
      std::printf("tessera-run: lr schedule: warmup %lld iterations, %s decay "
                  "to %g at iteration %lld\n",
                  (long long)opt->lr_warmup_iters(),
                  opt->lr_decay_style() ? opt->lr_decay_style()->c_str()
                                        : "constant",
                  opt->min_lr(), (long long)opt->lr_decay_iters());
    std::printf("%s", loadMessage.c_str());
    if (startIteration >= o.steps)
      std::printf("tessera-run: the checkpoint's iteration %lld reaches "
                  "--steps %lld: nothing to train\n",
                  (long long)startIteration, (long long)o.steps);
    std::fflush(stdout);
    if (!o.metricsPath.empty()) {
      metrics = std::fopen(o.metricsPath.c_str(), "w");
      if (!metrics)
        return notFound(o.metricsPath,
                        ": cannot open metrics file: ", std::strerror(errno));
    }
  }
  struct Closer {
    FILE *&f;
    ~Closer() {
      if (f)
        std::fclose(f);
    }
  } closer{metrics};

  // Tokens per sample: the sequence length for language-model inputs
  // ([S, b] token buffers), else one per sample.
  int64_t tokensPerSample = 1;
  const fb::Program &program = executor->program();
  if (program.inputs())
    for (const fb::InputSpec *spec : *program.inputs())
      if (isTokenInput(*spec)) {
        const fb::Buffer *buf = program.buffers()->Get(spec->buffer());
        if (buf->shape() && buf->shape()->size() == 2)
          tokensPerSample = buf->shape()->Get(0);
      }

  std::set<std::string> kinds;
  for (auto &entry : executor->commCounters())
    kinds.insert(entry.first);
  std::map<std::string, CommCounters> before = executor->commCounters();
  std::map<std::string, double> kernelsBefore = executor->kernelSeconds();
  if (!o.tracePath.empty()) {
    // Line the ranks' clocks up: start every timeline after one barrier.
    if (world)
      TESSERA_RETURN_IF_ERROR(world->barrier());
    executor->startTrace();
  }
  // Fault injection for tests: this rank stalls before its first step.
  if (const char *stall = std::getenv("TESSERA_DEBUG_STALL_RANK"))
    if (std::atoi(stall) == rank)
      std::this_thread::sleep_for(std::chrono::hours(1));
  int64_t exitAfterStep = -1, exitInSave = -1;
  int stallInSave = -1;
  if (const char *env = std::getenv("TESSERA_DEBUG_EXIT_AFTER_STEP"))
    exitAfterStep = std::atoll(env);
  if (const char *env = std::getenv("TESSERA_DEBUG_EXIT_IN_SAVE"))
    exitInSave = std::atoll(env);
  if (const char *env = std::getenv("TESSERA_DEBUG_STALL_IN_SAVE"))
    stallInSave = std::atoi(env);
  // Mixed precision: the fp32 main params from the (initialised or loaded)
  // parameters, unless the checkpoint restored every one of them; here
  // rather than inside iteration 1, so that it is traced but not timed as
  // part of an iteration.
  TESSERA_RETURN_IF_ERROR(executor->runInit().status());
  for (int64_t it = startIteration + 1; it <= o.steps; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    TESSERA_ASSIGN_OR_RETURN(double loss, executor->runIteration(it));
    auto t1 = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(t1 - t0).count();
    std::map<std::string, CommCounters> after = executor->commCounters();
    if (rank == 0) {
      double tokensPerSecond =
          seconds > 0 ? double(batch.global_batch_size() * tokensPerSample) /
                            seconds
                      : 0.0;
      double tflops = seconds > 0 ? a.flops_per_step() / seconds / 1e12 : 0.0;
      std::printf(" [%s] iteration %8lld/%8lld | consumed samples: %12lld | "
                  "elapsed time per iteration (ms): %.1f | throughput per "
                  "rank (TFLOP/s): %.3f | learning rate: "
                  "%.3E | global batch size: %5lld | loss: %.6E | tokens per "
                  "second: %.1f |\n",
                  timestamp().c_str(), (long long)it, (long long)o.steps,
                  (long long)(it * batch.global_batch_size()), seconds * 1000.0,
                  tflops,
                  executor->learningRate(it), (long long)batch.global_batch_size(), loss,
                  tokensPerSecond);
      std::fflush(stdout);
      if (metrics) {
        std::string line =
            "{\"step\": " + std::to_string(it) +
            ", \"loss\": " + jsonNumber(loss) +
            ", \"tokens_per_s\": " + jsonNumber(tokensPerSecond) +
            ", \"lr\": " + jsonNumber(executor->learningRate(it)) +
            ", \"step_time_s\": " + jsonNumber(seconds) +
            ", \"tflops_per_rank\": " + jsonNumber(tflops) +
            ", \"comm_bytes\": {";
        for (int c = 0; c < kNumCollectiveNames; ++c) {
          line +=
              std::string(c ? ", " : "") + "\"" + kCollectiveNames[c] + "\": {";
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
        if (std::fputs(line.c_str(), metrics) < 0 || std::fflush(metrics))
          return dataLoss(o.metricsPath, ": write failed");
      }
    }
    before = std::move(after);
    kernelsBefore = executor->kernelSeconds();
    if (!o.saveDir.empty() &&
        ((o.saveInterval > 0 && it % o.saveInterval == 0) || it == o.steps)) {
      auto s0 = std::chrono::steady_clock::now();
      CheckpointSaveOptions so;
      so.dir = o.saveDir;
      so.info.iteration = it;
      so.info.seed = o.seed;
      if (eo.dataset) {
        so.info.datasetPrefix = eo.dataset->prefix();
        so.info.datasetTokens = eo.dataset->numTokens();
      }
      so.debugExitAfterShard = exitInSave;
      so.debugStallRank = stallInSave;
      so.monitor = &checkpointSteps;
      TESSERA_ASSIGN_OR_RETURN(CheckpointSaveResult saved,
                               saveCheckpoint(*executor, so, world.get()));
      if (rank == 0) {
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s0)
                .count();
        std::printf("tessera-run: saved checkpoint iteration %lld to %s (%d "
                    "shards, %.2f MB) in %.2f s\n",
                    (long long)it, saved.dir.c_str(), a.world_size(),
                    double(saved.bytes) / 1e6, secs);
        std::fflush(stdout);
      }
    }
    if (it == exitAfterStep) {
      // Test hook: the whole job dies right after this iteration.
      if (world)
        TESSERA_RETURN_IF_ERROR(world->barrier());
      std::fflush(stdout);
      std::fflush(stderr);
      if (metrics)
        std::fflush(metrics);
      ::_exit(9);
    }
  }
  if (!o.tracePath.empty())
    TESSERA_RETURN_IF_ERROR(writeTrace(o.tracePath, *executor, rank));
  if (world)
    TESSERA_RETURN_IF_ERROR(world->barrier());
  return Status();
}

} // namespace

static int runInsideMpi(const LaunchOptions &o) {
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

int runLauncher(int argc, char **argv) {
  const char *argv0 = argc > 0 ? argv[0] : "tessera-run";
  auto parsed = parseLaunchOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "tessera-run: error: %s\n%s",
                 parsed.status().message().c_str(), launchUsage(argv0).c_str());
    return 1;
  }
  const LaunchOptions &o = *parsed;
  if (o.help) {
    std::printf("%s", launchUsage(argv0).c_str());
    return 0;
  }
  if (o.printSummary) {
    auto loaded = LoadedArtifact::loadFromFile(o.artifactPath);
    if (!loaded.ok())
      return errorExit(loaded.status().message());
    Status st = Executor::validate(**loaded);
    std::printf("%s", summarizeArtifact(**loaded).c_str());
    if (!st.ok())
      return errorExit(st.message());
    return 0;
  }
  if (!insideMpiJob())
    return launchUnderMpirun(o, argc, argv);
  return runInsideMpi(o);
}

} // namespace tessera::rt
