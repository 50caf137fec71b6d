//===- MpiCommunicator.h - MPI implementation of Communicator ---*- C++ -*-===//

#ifndef TESSERA_RT_MPICOMMUNICATOR_H
#define TESSERA_RT_MPICOMMUNICATOR_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Communicator.h"

#include <mpi.h>

namespace tessera::rt {

/// Converts an MPI return code to a Status ("<what>: <MPI error string>").
Status mpiStatus(int code, const char *what);

} // namespace tessera::rt

/// Evaluates an MPI call and returns an error Status from the enclosing
/// function if it did not return MPI_SUCCESS.
#define TESSERA_RETURN_IF_MPI_ERROR(expr)                                      \
  do {                                                                         \
    int tesseraMpiRc_ = (expr);                                                \
    if (tesseraMpiRc_ != MPI_SUCCESS)                                          \
      return ::tessera::rt::mpiStatus(tesseraMpiRc_, #expr);                   \
  } while (false)

namespace tessera::rt {

/// Wraps `comm` (takes ownership: MPI_Comm_free on destruction unless it is
/// MPI_COMM_WORLD/MPI_COMM_SELF). Sets MPI_ERRORS_RETURN on it.
StatusOr<std::unique_ptr<Communicator>> createMpiCommunicator(MPI_Comm comm);

/// Splits MPI_COMM_WORLD once per kind in collectiveGroupKinds(artifact)
/// (color = index of the instance containing this rank, key = position in
/// it). Collective: every rank of MPI_COMM_WORLD must call it. Also fills
/// `lossReduce` (a duplicate of dp, if present) and `world`.
StatusOr<CommunicatorSet> createMpiCommunicators(const fb::Artifact &artifact);

/// Splits MPI_COMM_WORLD by the rank groups of `kind` in `artifact`.
StatusOr<std::unique_ptr<Communicator>>
createMpiGroupCommunicator(const fb::Artifact &artifact,
                           const std::string &kind);

} // namespace tessera::rt

#endif // TESSERA_RT_MPICOMMUNICATOR_H
