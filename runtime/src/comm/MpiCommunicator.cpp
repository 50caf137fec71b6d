//===- MpiCommunicator.cpp - MPI implementation of Communicator -----------===//

#include "tessera/rt/MpiCommunicator.h"
#include "tessera/rt/BF16.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace tessera::rt {

Status mpiStatus(int code, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    len = std::snprintf(text, sizeof(text), "MPI error code %d", code);
  return internalError(what, ": ", std::string(text, size_t(len)));
}

namespace {

//===----------------------------------------------------------------------===//
// bf16 and f16 sums
//===----------------------------------------------------------------------===//

// MPI has no bf16 type (and MPI-4's f16 is optional). 16-bit float buffers
// travel as MPI_UINT16_T (2 bytes per element, so the byte counts are the
// 16-bit ones) and are summed by a user-defined commutative op per format:
// each pair added in f32 and rounded to nearest even (BF16.h), so every
// partial sum is a value of the format, whichever algorithm MPI picks. The
// ops are created on first use and freed at MPI_Finalize through a delete
// callback on MPI_COMM_SELF, whose attributes MPI deletes first thing in
// MPI_Finalize (MPI-3.1 8.7.1).

template <FloatFormat H>
void halfSum(void *in, void *inout, int *len, MPI_Datatype *) {
  const auto *a = static_cast<const uint16_t *>(in);
  auto *b = static_cast<uint16_t *>(inout);
  const int n = *len;
#pragma omp simd
  for (int i = 0; i < n; ++i)
    storeFloat<H>(b, i, loadFloat<H>(a, i) + loadFloat<H>(b, i));
}

/// The sum ops, [0] bf16 and [1] f16.
MPI_Op halfSumOps[2] = {MPI_OP_NULL, MPI_OP_NULL};

int freeHalfSumOps(MPI_Comm, int, void *, void *) {
  for (MPI_Op &op : halfSumOps)
    if (op != MPI_OP_NULL)
      MPI_Op_free(&op);
  return MPI_SUCCESS;
}

/// The sum op of a 16-bit format, created on first use (MPI is funnelled
/// through one thread, so no lock is needed).
StatusOr<MPI_Op> halfSumOpOnce(FloatFormat half) {
  const bool f16 = half == FloatFormat::F16;
  MPI_Op &slot = halfSumOps[f16 ? 1 : 0];
  if (slot != MPI_OP_NULL)
    return slot;
  MPI_Op op = MPI_OP_NULL;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Op_create(
      f16 ? halfSum<FloatFormat::F16> : halfSum<FloatFormat::BF16>,
      /*commute=*/1, &op));
  // One cleanup callback frees both ops; registered with the first.
  if (halfSumOps[0] == MPI_OP_NULL && halfSumOps[1] == MPI_OP_NULL) {
    int key = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, freeHalfSumOps,
                                    &key, nullptr);
    if (rc == MPI_SUCCESS)
      rc = MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
    if (rc != MPI_SUCCESS) {
      MPI_Op_free(&op);
      return mpiStatus(rc, "registering the 16-bit sum ops' cleanup");
    }
    // The attribute keeps the callback; the key itself is no longer needed.
    MPI_Comm_free_keyval(&key);
  }
  slot = op;
  return slot;
}

} // namespace

StatusOr<MPI_Datatype> mpiDatatype(ElementType type) {
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
  case ElementType::F16:
    return MPI_UINT16_T;
  }
  return invalidArgument("unknown element type");
}

StatusOr<MPI_Op> mpiReduceOp(ReduceKind op, ElementType type) {
  if (type == ElementType::BF16 || type == ElementType::F16) {
    if (op != ReduceKind::Sum)
      return unimplemented("16-bit float max reductions are not supported "
                           "(bf16 and f16 reductions are sums)");
    return halfSumOpOnce(type == ElementType::F16 ? FloatFormat::F16
                                                  : FloatFormat::BF16);
  }
  return op == ReduceKind::Max ? MPI_MAX : MPI_SUM;
}

namespace {

Status checkCount(int64_t count) {
  if (count < 0 || count > INT_MAX)
    return unimplemented("collective of ", count,
                         " elements exceeds MPI's int count");
  return Status();
}

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, int tagUpperBound)
      : comm(comm), myRank(rank), mySize(size), tagUb(tagUpperBound) {}
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
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, buffer, int(count), dt, mop, comm));
    stats.allReduce += ringAllReduceBytes(count * elementSize(type), mySize);
    ++stats.calls;
    return Status();
  }

  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(sendCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Allgather(send, int(sendCount), dt, recv,
                                              int(sendCount), dt, comm));
    stats.allGather +=
        ringAllGatherBytes(sendCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return Status();
  }

  Status allToAll(const void *send, void *recv, int64_t count,
                  ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Alltoall(send, int(count), dt, recv, int(count), dt, comm));
    stats.allToAll += uint64_t(mySize - 1) * uint64_t(count * elementSize(type));
    ++stats.calls;
    return Status();
  }

  Status allToAllV(const void *send, const int64_t *sendCounts,
                   const int64_t *sendOffsets, void *recv,
                   const int64_t *recvCounts, const int64_t *recvOffsets,
                   ElementType type) override {
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    const size_t n = static_cast<size_t>(mySize);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    uint64_t sent = 0;
    for (int i = 0; i < mySize; ++i) {
      for (int64_t v : {sendCounts[i], sendOffsets[i], recvCounts[i],
                        recvOffsets[i]})
        TESSERA_RETURN_IF_ERROR(checkCount(v));
      sc[size_t(i)] = int(sendCounts[i]);
      sd[size_t(i)] = int(sendOffsets[i]);
      rc[size_t(i)] = int(recvCounts[i]);
      rd[size_t(i)] = int(recvOffsets[i]);
      if (i != myRank)
        sent += uint64_t(sendCounts[i] * elementSize(type));
    }
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Alltoallv(send, sc.data(), sd.data(), dt,
                                              recv, rc.data(), rd.data(), dt,
                                              comm));
    stats.allToAll += sent;
    ++stats.calls;
    return Status();
  }

  Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                       ElementType type, ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(recvCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Reduce_scatter_block(send, recv, int(recvCount), dt, mop, comm));
    stats.reduceScatter +=
        ringReduceScatterBytes(recvCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return Status();
  }

  StatusOr<CommRequest> reduceScatterStart(const void *send, void *recv,
                                           int64_t recvCount, ElementType type,
                                           ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(recvCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Ireduce_scatter_block(
        send, recv, int(recvCount), dt, mop, comm, &request));
    stats.reduceScatter +=
        ringReduceScatterBytes(recvCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    int64_t id = nextId++;
    pending.emplace(id, request);
    return CommRequest{id};
  }

  // In place: MPI_IN_PLACE takes an all-gather's input from the rank's
  // block of the receive buffer, and leaves a reduce-scatter's result at the
  // start of the buffer, whence it moves to the rank's block (after the
  // wait, for the started form). The user-defined bf16 sum works the same
  // way in place (MPI hands it the same in/inout pairs).
  Status allGatherInPlace(void *buffer, int64_t count,
                          ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                              buffer, int(count), dt, comm));
    stats.allGather +=
        ringAllGatherBytes(count * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return Status();
  }

  Status reduceScatterInPlace(void *buffer, int64_t count, ElementType type,
                              ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Reduce_scatter_block(
        MPI_IN_PLACE, buffer, int(count), dt, mop, comm));
    stats.reduceScatter +=
        ringReduceScatterBytes(count * elementSize(type) * mySize, mySize);
    ++stats.calls;
    moveToBlock(blockMove(buffer, count, type));
    return Status();
  }

  StatusOr<CommRequest> reduceScatterInPlaceStart(void *buffer, int64_t count,
                                                  ElementType type,
                                                  ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Ireduce_scatter_block(
        MPI_IN_PLACE, buffer, int(count), dt, mop, comm, &request));
    stats.reduceScatter +=
        ringReduceScatterBytes(count * elementSize(type) * mySize, mySize);
    ++stats.calls;
    CommRequest handle = track(request);
    BlockMove move = blockMove(buffer, count, type);
    if (move.bytes > 0)
      afterWait.emplace(handle.id, move);
    return handle;
  }

  StatusOr<CommRequest> allGatherStart(const void *send, void *recv,
                                       int64_t sendCount,
                                       ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(sendCount));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Iallgather(send, int(sendCount), dt, recv,
                                               int(sendCount), dt, comm,
                                               &request));
    stats.allGather +=
        ringAllGatherBytes(sendCount * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return track(request);
  }

  StatusOr<CommRequest> allGatherInPlaceStart(void *buffer, int64_t count,
                                              ElementType type) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Iallgather(MPI_IN_PLACE, 0,
                                               MPI_DATATYPE_NULL, buffer,
                                               int(count), dt, comm, &request));
    stats.allGather +=
        ringAllGatherBytes(count * elementSize(type) * mySize, mySize);
    ++stats.calls;
    return track(request);
  }

  StatusOr<CommRequest> allReduceStart(void *buffer, int64_t count,
                                       ElementType type,
                                       ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, mpiReduceOp(op, type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Iallreduce(MPI_IN_PLACE, buffer, int(count),
                                               dt, mop, comm, &request));
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
    int rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
    finish(request.id, rc == MPI_SUCCESS);
    if (rc != MPI_SUCCESS)
      return mpiStatus(rc, "MPI_Wait(&r, MPI_STATUS_IGNORE)");
    return Status();
  }

  Status progress(CommRequest request) override {
    auto it = pending.find(request.id);
    if (it == pending.end())
      return Status();
    int done = 0;
    // MPI_Test frees a completed request (MPI_REQUEST_NULL); the later
    // MPI_Wait on it returns at once.
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Test(&it->second, &done, MPI_STATUS_IGNORE));
    return Status();
  }

  StatusOr<CommRequest> isend(const void *buffer, int64_t count,
                              ElementType type, int peer, int tag) override {
    TESSERA_RETURN_IF_ERROR(checkPointToPoint(count, peer, tag));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Isend(buffer, int(count), dt, peer, tag, comm, &request));
    stats.p2p += uint64_t(count * elementSize(type));
    ++stats.calls;
    return track(request);
  }

  StatusOr<CommRequest> irecv(void *buffer, int64_t count, ElementType type,
                              int peer, int tag) override {
    TESSERA_RETURN_IF_ERROR(checkPointToPoint(count, peer, tag));
    TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
    MPI_Request request;
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Irecv(buffer, int(count), dt, peer, tag, comm, &request));
    ++stats.calls;
    return track(request);
  }

  Status waitAll(const std::vector<CommRequest> &requests) override {
    std::vector<MPI_Request> list;
    list.reserve(requests.size());
    bool anyUnknown = false;
    int64_t unknown = -1;
    for (const CommRequest &r : requests) {
      auto it = pending.find(r.id);
      if (it == pending.end()) {
        anyUnknown = true;
        unknown = r.id;
        continue;
      }
      list.push_back(it->second);
      pending.erase(it);
    }
    // Moves of started in-place reductions, done once all have completed.
    auto finishAll = [&](bool completed) {
      for (const CommRequest &r : requests)
        finish(r.id, completed);
    };
    // Wait for the known requests even if one is unknown, so that none is
    // left in flight.
    if (!list.empty()) {
      std::vector<MPI_Status> statuses(list.size());
      int rc = MPI_Waitall(int(list.size()), list.data(), statuses.data());
      finishAll(rc == MPI_SUCCESS);
      if (rc == MPI_ERR_IN_STATUS)
        for (const MPI_Status &st : statuses)
          if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING)
            return mpiStatus(st.MPI_ERROR, "MPI_Waitall");
      if (rc != MPI_SUCCESS)
        return mpiStatus(rc, "MPI_Waitall");
    }
    if (anyUnknown)
      return invalidArgument("waitAll on unknown or completed request ",
                             unknown);
    return Status();
  }

  Status barrier() override {
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Barrier(comm));
    return Status();
  }

private:
  Status checkPointToPoint(int64_t count, int peer, int tag) const {
    TESSERA_RETURN_IF_ERROR(checkCount(count));
    if (peer < 0 || peer >= mySize)
      return invalidArgument("point-to-point peer ", peer,
                             " outside the group of ", mySize, " ranks");
    if (tag < 0 || tag > tagUb)
      return invalidArgument("point-to-point tag ", tag, " outside [0, ", tagUb,
                             "] (MPI_TAG_UB)");
    return Status();
  }
  /// Where an in-place reduce-scatter's result goes: from the start of the
  /// buffer (MPI_IN_PLACE) to this rank's block.
  struct BlockMove {
    uint8_t *buffer = nullptr;
    size_t bytes = 0, to = 0;
  };
  BlockMove blockMove(void *buffer, int64_t count, ElementType type) const {
    BlockMove move;
    move.buffer = static_cast<uint8_t *>(buffer);
    move.bytes = myRank > 0 ? size_t(count * elementSize(type)) : 0;
    move.to = size_t(myRank) * move.bytes;
    return move;
  }
  static void moveToBlock(const BlockMove &move) {
    if (move.bytes > 0)
      std::memmove(move.buffer + move.to, move.buffer, move.bytes);
  }
  /// Completes request `id`'s in-place move (if any) once MPI finished it;
  /// a failed request leaves the buffer as it is (undefined anyway).
  void finish(int64_t id, bool completed) {
    auto it = afterWait.find(id);
    if (it == afterWait.end())
      return;
    if (completed)
      moveToBlock(it->second);
    afterWait.erase(it);
  }
  CommRequest track(MPI_Request request) {
    int64_t id = nextId++;
    pending.emplace(id, request);
    return CommRequest{id};
  }

  MPI_Comm comm;
  int myRank, mySize;
  int tagUb;
  int64_t nextId = 0;
  std::unordered_map<int64_t, MPI_Request> pending;
  /// Started in-place reduce-scatters whose result still has to move.
  std::unordered_map<int64_t, BlockMove> afterWait;
};

} // namespace

StatusOr<std::unique_ptr<Communicator>> createMpiCommunicator(MPI_Comm comm) {
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(comm, &rank));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(comm, &size));
  // MPI guarantees MPI_TAG_UB >= 32767.
  int tagUb = 32767, found = 0;
  void *attr = nullptr;
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &found));
  if (found && attr)
    tagUb = *static_cast<int *>(attr);
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(comm, rank, size, tagUb));
}

//===----------------------------------------------------------------------===//
// Rank-group communicators
//===----------------------------------------------------------------------===//

/// Splits MPI_COMM_WORLD by the instances of `kind`: colour = index of the
/// instance holding this rank, key = its position there. A rank that no
/// instance holds passes MPI_UNDEFINED and gets MPI_COMM_NULL.
static StatusOr<MPI_Comm> splitWorld(const GroupPosition &pos) {
  int color = pos.group ? pos.instance : MPI_UNDEFINED;
  MPI_Comm comm = MPI_COMM_NULL;
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Comm_split(MPI_COMM_WORLD, color, pos.index, &comm));
  return comm;
}

/// All-gathers the world rank of every member of `comm` (one int each) and
/// compares the list, in order, with the artifact's instance `expected`. A
/// mismatch means that the ranks disagree about the groups (e.g. they loaded
/// different artifacts). Collective over `comm`.
static Status checkMembers(MPI_Comm comm, const std::string &kind,
                           const fb::RankGroup &expected, int worldRank) {
  int size = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(comm, &size));
  std::vector<int32_t> members(size_t(size), -1);
  int32_t me = worldRank;
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Allgather(&me, 1, MPI_INT32_T, members.data(), 1, MPI_INT32_T, comm));
  const flatbuffers::Vector<int32_t> *ranks = expected.ranks();
  bool same = ranks && ranks->size() == members.size() &&
              std::equal(members.begin(), members.end(), ranks->begin());
  if (same)
    return Status();
  std::string got = "[";
  for (size_t i = 0; i < members.size(); ++i)
    got += (i ? ", " : "") + std::to_string(members[i]);
  got += "]";
  return failedPrecondition(
      "rank-group membership check failed for kind '", kind, "' on rank ",
      worldRank, ": the communicator holds world ranks ", got,
      " but the artifact's instance is ", ranksToString(ranks),
      " (do all ranks load the same artifact?)");
}

StatusOr<std::unique_ptr<Communicator>>
createMpiGroupCommunicator(const fb::Artifact &artifact,
                           const std::string &kind) {
  int worldRank = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  GroupPosition pos = findGroupPosition(artifact, kind, worldRank);
  TESSERA_ASSIGN_OR_RETURN(MPI_Comm comm, splitWorld(pos));
  if (comm == MPI_COMM_NULL)
    return std::unique_ptr<Communicator>();
  Status members = checkMembers(comm, kind, *pos.group, worldRank);
  if (!members.ok()) {
    MPI_Comm_free(&comm);
    return members;
  }
  return createMpiCommunicator(comm);
}

StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
createMpiGroupCommunicators(const fb::Artifact &artifact,
                            const std::vector<std::string> &kinds) {
  std::map<std::string, std::unique_ptr<Communicator>> result;
  // A failed membership check is reported after every kind is split, so
  // that all ranks take part in the same sequence of collectives.
  Status firstError;
  for (const std::string &kind : kinds) {
    if (result.count(kind))
      return invalidArgument("group kind '", kind, "' is listed twice");
    auto comm = createMpiGroupCommunicator(artifact, kind);
    if (!comm.ok()) {
      // MPI failures (Internal) abort at once; only checkMembers reports
      // FailedPrecondition.
      if (comm.status().getCode() != StatusCode::FailedPrecondition)
        return comm.status();
      if (firstError.ok())
        firstError = comm.status();
      continue;
    }
    if (*comm)
      result[kind] = std::move(*comm);
  }
  if (!firstError.ok())
    return firstError;
  return result;
}

/// True if the artifact's "pp" groups have more than one rank.
static bool hasPipelineStages(const fb::Artifact &artifact) {
  if (artifact.groups())
    for (const fb::RankGroup *g : *artifact.groups())
      if (g->kind() && g->kind()->string_view() == "pp" && g->ranks() &&
          g->ranks()->size() > 1)
        return true;
  return false;
}

StatusOr<CommunicatorSet> createMpiCommunicators(const fb::Artifact &artifact) {
  CommunicatorSet set;
  MPI_Comm world = MPI_COMM_NULL;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  TESSERA_ASSIGN_OR_RETURN(set.world, createMpiCommunicator(world));
  auto groups =
      createMpiGroupCommunicators(artifact, collectiveGroupKinds(artifact));
  if (groups.ok())
    set.groups = std::move(*groups);
  // Split dp even after a failed membership check (see above).
  if (hasGroupKind(artifact, "dp")) {
    auto loss = createMpiGroupCommunicator(artifact, "dp");
    if (!groups.ok())
      return groups.status();
    TESSERA_ASSIGN_OR_RETURN(set.lossReduce, std::move(loss));
  }
  // Pipelines: a separate channel to sum the loss over the stages.
  if (hasPipelineStages(artifact)) {
    auto loss = createMpiGroupCommunicator(artifact, "pp");
    if (!groups.ok())
      return groups.status();
    TESSERA_ASSIGN_OR_RETURN(set.lossReducePp, std::move(loss));
  }
  if (!groups.ok())
    return groups.status();
  return set;
}

} // namespace tessera::rt
