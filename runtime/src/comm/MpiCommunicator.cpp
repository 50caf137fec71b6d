//===- MpiCommunicator.cpp - MPI implementation of Communicator -----------===//

#include "tessera/rt/MpiCommunicator.h"

#include <climits>
#include <cstdio>
#include <unordered_map>

namespace tessera::rt {

Status mpiStatus(int code, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    len = std::snprintf(text, sizeof(text), "MPI error code %d", code);
  return internalError(what, ": ", std::string(text, size_t(len)));
}

namespace {

StatusOr<MPI_Datatype> mpiType(ElementType type, bool reducing) {
  switch (type) {
  case ElementType::F32:
    return MPI_FLOAT;
  case ElementType::I32:
    return MPI_INT32_T;
  case ElementType::I64:
    return MPI_INT64_T;
  case ElementType::F64:
    return MPI_DOUBLE;
  case ElementType::BF16:
    if (reducing)
      return unimplemented("bf16 reductions are not supported over MPI");
    return MPI_UINT16_T;
  }
  return invalidArgument("unknown element type");
}

MPI_Op mpiOp(ReduceKind op) {
  return op == ReduceKind::Max ? MPI_MAX : MPI_SUM;
}

Status checkCount(int64_t count) {
  if (count < 0 || count > INT_MAX)
    return unimplemented("collective of ", count,
                         " elements exceeds MPI's int count");
  return Status();
}

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator(MPI_Comm comm, int rank, int size)
      : comm(comm), myRank(rank), mySize(size) {}
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      return;
    for (auto &entry : pending)
      MPI_Request_free(&entry.second);
    if (comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF &&
        comm != MPI_COMM_NULL)
      MPI_Comm_free(&comm);
  }

  int rank() const override { return myRank; }
  int size() const override { return mySize; }

  Status allReduce(void *buffer, int64_t count, ElementType type,
                   ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiType(type, true));
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, buffer, int(count), dt, mpiOp(op), comm));
    stats.allReduce += ringAllReduceBytes(count * elementSize(type), mySize);
    ++stats.calls;
    return Status();
  }

  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(sendCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiType(type, false));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Allgather(send, int(sendCount), dt, recv,
                                              int(sendCount), dt, comm));
    stats.allGather +=
        ringAllGatherBytes(sendCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return Status();
  }

  Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                       ElementType type, ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(recvCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiType(type, true));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Reduce_scatter_block(
        send, recv, int(recvCount), dt, mpiOp(op), comm));
    stats.reduceScatter +=
        ringReduceScatterBytes(recvCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return Status();
  }

  StatusOr<CommRequest> allReduceStart(void *buffer, int64_t count,
                                       ElementType type,
                                       ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiType(type, true));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Iallreduce(MPI_IN_PLACE, buffer, int(count),
                                               dt, mpiOp(op), comm, &request));
    stats.allReduce += ringAllReduceBytes(count * elementSize(type), mySize);
    ++stats.calls;
    int64_t id = nextId++;
    pending.emplace(id, request);
    return CommRequest{id};
  }

  Status wait(CommRequest request) override {
    auto it = pending.find(request.id);
    if (it == pending.end())
      return invalidArgument("wait on unknown or completed request ",
                             request.id);
    MPI_Request r = it->second;
    pending.erase(it);
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Wait(&r, MPI_STATUS_IGNORE));
    return Status();
  }

  Status barrier() override {
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Barrier(comm));
    return Status();
  }

private:
  MPI_Comm comm;
  int myRank, mySize;
  int64_t nextId = 0;
  std::unordered_map<int64_t, MPI_Request> pending;
};

} // namespace

StatusOr<std::unique_ptr<Communicator>> createMpiCommunicator(MPI_Comm comm) {
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(comm, &rank));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(comm, &size));
  return std::unique_ptr<Communicator>(new MpiCommunicator(comm, rank, size));
}

static StatusOr<MPI_Comm> splitWorld(const fb::Artifact &artifact,
                                     const std::string &kind) {
  int worldRank = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  GroupPosition pos = findGroupPosition(artifact, kind, worldRank);
  // Ranks not in any group of this kind form singleton groups.
  int color = pos.group ? pos.instance : MPI_UNDEFINED;
  MPI_Comm comm = MPI_COMM_NULL;
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Comm_split(MPI_COMM_WORLD, color, pos.index, &comm));
  if (comm == MPI_COMM_NULL)
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_dup(MPI_COMM_SELF, &comm));
  return comm;
}

StatusOr<std::unique_ptr<Communicator>>
createMpiGroupCommunicator(const fb::Artifact &artifact,
                           const std::string &kind) {
  TESSERA_ASSIGN_OR_RETURN(MPI_Comm comm, splitWorld(artifact, kind));
  int worldRank = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  GroupPosition pos = findGroupPosition(artifact, kind, worldRank);
  TESSERA_ASSIGN_OR_RETURN(auto result, createMpiCommunicator(comm));
  if (result->size() != pos.size || result->rank() != pos.index)
    return internalError("communicator for group kind '", kind, "' has rank ",
                         result->rank(), " of ", result->size(), ", expected ",
                         pos.index, " of ", pos.size);
  return result;
}

StatusOr<CommunicatorSet> createMpiCommunicators(const fb::Artifact &artifact) {
  CommunicatorSet set;
  MPI_Comm world = MPI_COMM_NULL;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  TESSERA_ASSIGN_OR_RETURN(set.world, createMpiCommunicator(world));
  for (const std::string &kind : collectiveGroupKinds(artifact)) {
    TESSERA_ASSIGN_OR_RETURN(set.groups[kind],
                             createMpiGroupCommunicator(artifact, kind));
  }
  GroupPosition dp = findGroupPosition(artifact, "dp", 0);
  if (dp.group) {
    TESSERA_ASSIGN_OR_RETURN(set.lossReduce,
                             createMpiGroupCommunicator(artifact, "dp"));
  }
  return set;
}

} // namespace tessera::rt
