//===- Launcher.h - tessera-run driver --------------------------*- C++ -*-===//
//
// The logic behind the `tessera-run` tool:
//
//   tessera-run -n N FILE.tsr --steps S [--seed S] [--metrics FILE]
//               [--backend cpu] [--threads T] [--blas-core NAME]
//               [--print-summary]
//               [--data PREFIX] [--save DIR [--save-interval K]]
//               [--load DIR [--no-load-optim]]
//
// Outside an MPI job it validates the artifact (and a --load checkpoint
// against it) and re-executes itself under `mpirun -n N`; inside the job
// every rank runs the executor and rank 0 reports Megatron-style progress
// lines and optional JSON-lines metrics. Checkpoints: see Checkpoint.h;
// --steps is the total iteration count, so a run resumed at iteration K
// trains K+1..S.
//
// Fault-injection hooks for tests (environment):
//   TESSERA_DEBUG_STALL_RANK=R      rank R sleeps before its first step
//   TESSERA_DEBUG_STALL_IN_SETUP=R  rank R sleeps in set-up, where the
//                                   backend's communicators (NCCL) start
//   TESSERA_DEBUG_EXIT_AFTER_STEP=N every rank _exit(9)s right after
//                                   iteration N (and its checkpoint, if
//                                   one is due), after a barrier
//   TESSERA_DEBUG_EXIT_IN_SAVE=N    every rank _exit(9)s while saving
//                                   iteration N, after writing its shard
//                                   and before the manifest and `latest`
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_LAUNCHER_H
#define TESSERA_RT_LAUNCHER_H

#include "tessera/rt/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::rt {

/// Parsed command line of tessera-run.
struct LaunchOptions {
  int numRanks = 0; ///< -n; 0 means "the artifact's world size"
  std::string artifactPath;
  int64_t steps = -1;
  uint64_t seed = 1234;
  std::string metricsPath;
  std::string tracePath; ///< --trace: Chrome/Perfetto timeline of all ranks
  /// --timeout: seconds one instruction, p2p batch or checkpoint step may
  /// run before the rank gives up (a peer died or stalled); 0 disables the
  /// watchdog.
  double timeout = 300;
  std::string backend = "cpu";
  /// --tf32: fp32 GEMMs of a GPU backend may use TF32 (BackendOptions).
  bool allowTf32 = false;
  int threads = 0; ///< 0: $OPENBLAS_NUM_THREADS or max(1, cores / N)
  /// --blas-core: the OpenBLAS kernel set of the cpu backend's ranks
  /// (OPENBLAS_CORETYPE; backends/cpu/BlasCore.h); empty: OpenBLAS's choice.
  std::string blasCore;
  bool printSummary = false;
  bool profile = false; ///< --profile: per-opcode kernel time in the metrics
  /// Stop with an error when an iteration's loss is NaN or inf, before a
  /// checkpoint could save the poisoned state (Megatron's
  /// --check-for-nan-in-loss-and-grad, on by default);
  /// --no-check-for-nan-in-loss turns it off.
  bool checkForNanInLoss = true;
  /// --mock-data: synthetic tokens for a language model instead of --data
  /// (seeded by --seed, the same samples in every layout).
  bool mockData = false;
  /// --data: Megatron indexed dataset prefix (PREFIX or
  /// PREFIX_text_document) for programs with token inputs.
  std::string dataPrefix;
  /// --save DIR: checkpoint directory; --save-interval K: save every K
  /// iterations (0: only after the last iteration).
  std::string saveDir;
  int64_t saveInterval = 0;
  /// --load DIR: resume from DIR/latest (or the iter_ directory DIR).
  std::string loadDir;
  /// --no-load-optim: restore parameters and iteration only.
  bool noLoadOptim = false;
  /// Evaluation (Megatron's evaluate): --eval-iters N batches scored with
  /// the forward-only phases every --eval-interval K iterations and after
  /// the last one; --eval-only (Megatron's --skip-train) evaluates the
  /// loaded (or initial) model and trains nothing. The batches are those of
  /// --eval-data (the validation set, its batches 1..N) or, without it,
  /// the --data batches that follow the current iteration (not yet trained
  /// on).
  int64_t evalIters = -1; ///< -1: not given (1 under --eval-only, else 0)
  int64_t evalInterval = 0;
  bool evalOnly = false;
  std::string evalDataPrefix;
  bool help = false;
};

/// Parses argv[1..argc). Errors are usage errors.
StatusOr<LaunchOptions> parseLaunchOptions(int argc, char **argv);

/// The usage text.
std::string launchUsage(const char *argv0);

/// True if the process runs under an MPI launcher (OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE or PMIX_RANK in the environment).
bool insideMpiJob();

/// Entry point of tessera-run; returns the process exit code.
int runLauncher(int argc, char **argv);

} // namespace tessera::rt

#endif // TESSERA_RT_LAUNCHER_H
