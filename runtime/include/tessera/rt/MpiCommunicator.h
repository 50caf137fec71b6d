//===- MpiCommunicator.h - MPI implementation of Communicator ---*- C++ -*-===//

#ifndef TESSERA_RT_MPICOMMUNICATOR_H
#define TESSERA_RT_MPICOMMUNICATOR_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Communicator.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

namespace tessera::rt {

/// Converts an MPI return code to a Status ("<what>: <MPI error string>").
Status mpiStatus(int code, const char *what);

/// The MPI datatype that carries `type` (bf16 travels as MPI_UINT16_T, so
/// byte counts are the bf16 ones).
StatusOr<MPI_Datatype> mpiDatatype(ElementType type);

/// The MPI op of reduction `op` on `type`: MPI_SUM or MPI_MAX, or for bf16
/// sums a user-defined op adding each pair in f32 and rounding to bf16
/// (created on first use, freed at MPI_Finalize); bf16 max is
/// Unimplemented.
StatusOr<MPI_Op> mpiReduceOp(ReduceKind op, ElementType type);

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

/// Creates this rank's communicator for rank-group `kind` of `artifact`:
/// splits MPI_COMM_WORLD (colour = index of the instance holding the rank,
/// key = its position there; MPI_UNDEFINED when no instance holds it), then
/// all-gathers the members' world ranks over the new communicator and checks
/// them, in order, against the artifact's instance (a mismatch is a
/// FailedPrecondition naming the kind and both rank lists). Returns null when
/// no instance of `kind` holds this rank (embedding kinds). Collective: every
/// rank of MPI_COMM_WORLD must call it.
StatusOr<std::unique_ptr<Communicator>>
createMpiGroupCommunicator(const fb::Artifact &artifact,
                           const std::string &kind);

/// Calls createMpiGroupCommunicator for each of `kinds`, in order (every rank
/// must pass the same list). Kinds that leave this rank out get no entry. A
/// failed membership check is returned only after all kinds are split, so
/// that the ranks never disagree about the collectives they enter.
StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
createMpiGroupCommunicators(const fb::Artifact &artifact,
                            const std::vector<std::string> &kinds);

/// The communicators tessera-run uses: `groups` from
/// createMpiGroupCommunicators(artifact, collectiveGroupKinds(artifact)),
/// `lossReduce` (a second dp communicator, if the artifact has dp groups),
/// `lossReducePp` (a second pp communicator, if its pp groups have more than
/// one rank) and `world` (a duplicate of MPI_COMM_WORLD). Collective.
StatusOr<CommunicatorSet> createMpiCommunicators(const fb::Artifact &artifact);

} // namespace tessera::rt

#endif // TESSERA_RT_MPICOMMUNICATOR_H
