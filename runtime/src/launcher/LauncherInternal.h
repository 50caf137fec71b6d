//===- LauncherInternal.h - Shared pieces of tessera-run --------*- C++ -*-===//
//
// Internal to runtime/src/launcher/, the implementation of
// tessera/rt/Launcher.h in four parts:
//   Options.cpp       the command line, and what the options imply once the
//                     artifact is known (--data, --load, --threads)
//   Mpirun.cpp        outside an MPI job: the checks before launch and the
//                     re-exec under mpirun
//   TrainingLoop.cpp  inside the job: one rank's setup, --load, iterations
//                     with Megatron-style reporting, --save, the watchdog
//   Trace.cpp         the --trace file (Chrome/Perfetto JSON) of all ranks
// and Launcher.cpp, the entry point that picks one of them.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_LAUNCHER_LAUNCHERINTERNAL_H
#define TESSERA_RT_LAUNCHER_LAUNCHERINTERNAL_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/Launcher.h"
#include "tessera/rt/Status.h"

#include <memory>
#include <string>
#include <vector>

namespace tessera::rt {

class Executor;

namespace launcher {

//===----------------------------------------------------------------------===//
// Launcher.cpp
//===----------------------------------------------------------------------===//

/// Prints "tessera-run: error: MESSAGE" to stderr; returns the exit code 1.
int errorExit(const std::string &message);
/// "tp=2 x dp=2" (the artifact's mesh), or "(none)".
std::string meshString(const fb::Artifact &a);

//===----------------------------------------------------------------------===//
// Options.cpp
//===----------------------------------------------------------------------===//

/// BLAS threads per rank without --threads: max(1, cores / numRanks),
/// numRanks being the ranks that share this node.
int defaultThreads(int numRanks);

/// A rank's place among the ranks of its node: its index (which picks its
/// GPU) and their count (which shares the node's cores).
struct NodePlace {
  int index = 0;
  int count = 1;
};
/// The place of world rank `rank` given every rank's node name (MPI's
/// processor name): the index among the ranks of the same name, in world
/// order.
NodePlace nodePlaceAmong(const std::vector<std::string> &names, int rank);

/// The launcher environment tessera-run gives the ranks it starts
/// (Mpirun.cpp) and, inside an MPI job it did not start, gives itself:
/// OMP_WAIT_POLICY=passive and OPENBLAS_THREAD_TIMEOUT=4 unless set, and
/// OPENBLAS_CORETYPE for --blas-core (checked against the CPU; the flag
/// wins over the environment). Returns the names it set; an error for a
/// bad --blas-core.
StatusOr<std::vector<std::string>> exportRankEnvironment(const LaunchOptions &o);
/// Opens the --data dataset (null if none was given) and checks it against
/// every program's token inputs. A program with token inputs but no --data
/// is a FailedPrecondition (a usage error).
StatusOr<std::shared_ptr<const IndexedDataset>>
openDataset(const LaunchOptions &o, const LoadedArtifact &artifact);
/// openDataset, warning on stderr when --data is given to an artifact
/// without token inputs.
Status checkDataOption(const LaunchOptions &o, const LoadedArtifact &artifact);
/// The checkpoint load options of --seed, --no-load-optim and the dataset.
CheckpointLoadOptions loadOptionsOf(const LaunchOptions &o,
                                    const IndexedDataset *dataset);
/// --load DIR with no checkpoint in it: fine (start from scratch) only when
/// DIR is also the --save directory.
bool startsFromScratch(const LaunchOptions &o, const Status &st);

//===----------------------------------------------------------------------===//
// Mpirun.cpp
//===----------------------------------------------------------------------===//

/// The path of the running executable ("" if unknown).
std::string selfExecutable();

/// Outside MPI: validates the artifact, --data, --save, --load and -n, then
/// replaces the process with `mpirun -n N` of itself; returns only on error.
int launchUnderMpirun(const LaunchOptions &o, int argc, char **argv);

//===----------------------------------------------------------------------===//
// TrainingLoop.cpp
//===----------------------------------------------------------------------===//

/// Inside MPI: runs this rank; on any error prints it and aborts the job
/// (MPI_Abort, so every rank exits with code 1). In a job tessera-run did
/// not start, the rank first sets the environment the launcher would have
/// (exportRankEnvironment) and re-executes itself, before MPI_Init, since
/// OpenBLAS and OpenMP read it only when they load.
int runInsideMpi(const LaunchOptions &o, int argc, char **argv);

//===----------------------------------------------------------------------===//
// Trace.cpp
//===----------------------------------------------------------------------===//

/// `s` as a JSON string literal.
std::string jsonString(const std::string &s);
/// `v` as a JSON number ("%.9g"), or null when not finite.
std::string jsonNumber(double v);
/// Gathers every rank's timeline to rank 0, which writes one Chrome/Perfetto
/// trace (a process per rank, a thread per track) atomically. Collective
/// over MPI_COMM_WORLD.
Status writeTrace(const std::string &path, const Executor &executor, int rank);

} // namespace launcher
} // namespace tessera::rt

#endif // TESSERA_RT_LAUNCHER_LAUNCHERINTERNAL_H
