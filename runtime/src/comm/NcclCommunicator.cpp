//===- NcclCommunicator.cpp - NCCL implementation of Communicator ---------===//
//
// Plain C++: NCCL and CUDA are reached only through the NcclApi table, so
// this file needs neither header. MPI is used only to bootstrap (the unique
// id) and to check the rank groups against the artifact.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/NcclCommunicator.h"
#include "tessera/rt/MpiCommunicator.h"

#include <algorithm>
#include <cstring>
#include <mpi.h>

namespace tessera::rt {

namespace {

Status checkCount(int64_t count, const char *what) {
  if (count < 0)
    return invalidArgument(what, " of ", count, " elements");
  return Status();
}

/// Block `block` of `buffer`, whose blocks are `count` elements of `type`.
void *blockAt(void *buffer, int64_t block, int64_t count, ElementType type) {
  return static_cast<char *>(buffer) + block * count * elementSize(type);
}

} // namespace

//===----------------------------------------------------------------------===//
// Lifetime
//===----------------------------------------------------------------------===//

NcclCommunicator::NcclCommunicator(const NcclApi &api, void *comm, int rank,
                                   int size, void *computeStream)
    : api(api), comm(comm), myRank(rank), mySize(size), compute(computeStream) {
}

StatusOr<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::create(const NcclApi &api, void *comm, int rank, int size,
                         void *computeStream) {
  // Owns `comm` from here on, so that a failure below destroys it.
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(api, comm, rank, size, computeStream));
  if (!comm)
    return invalidArgument("NCCL communicator is null");
  if (size < 1 || rank < 0 || rank >= size)
    return invalidArgument("NCCL communicator rank ", rank, " of ", size);
  // Non-blocking: the legacy default stream must not serialise the
  // communication with the backend's work.
  TESSERA_ASSIGN_OR_RETURN(c->stream, c->api.streamCreate());
  TESSERA_ASSIGN_OR_RETURN(c->computeReady, c->api.eventCreate());
  TESSERA_ASSIGN_OR_RETURN(c->commDone, c->api.eventCreate());
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  // After an abort the NCCL kernels are gone but the communicator is freed
  // too; waiting on a stream that may still hold a hung operation could
  // block forever, so skip the synchronisation and the destroy.
  const bool wasAborted = aborted.load();
  if (stream && !wasAborted)
    api.streamSynchronize(stream).ignoreError();
  for (void *event : {computeReady, commDone})
    if (event)
      api.eventDestroy(event).ignoreError();
  for (void *event : requestEvents)
    api.eventDestroy(event).ignoreError();
  if (stream)
    api.streamDestroy(stream).ignoreError();
  if (scratch)
    api.memFree(scratch).ignoreError();
  if (comm && !wasAborted)
    api.commDestroy(comm).ignoreError();
}

Status NcclCommunicator::abort() {
  if (aborted.exchange(true))
    return Status();
  return api.commAbort(comm);
}

Status NcclCommunicator::asyncError() const {
  if (aborted.load())
    return makeError(StatusCode::Aborted, "NCCL communicator was aborted");
  return api.commGetAsyncError(comm);
}

Status NcclCommunicator::checkUsable() const {
  if (aborted.load())
    return makeError(StatusCode::Aborted,
                     "NCCL communicator was aborted (rank ", myRank, " of ",
                     mySize, ")");
  return Status();
}

//===----------------------------------------------------------------------===//
// Stream ordering
//===----------------------------------------------------------------------===//

Status NcclCommunicator::orderAfterCompute() {
  TESSERA_RETURN_IF_ERROR(api.eventRecord(computeReady, compute));
  return api.streamWaitEvent(stream, computeReady);
}

Status NcclCommunicator::orderBeforeCompute() {
  TESSERA_RETURN_IF_ERROR(api.eventRecord(commDone, stream));
  return api.streamWaitEvent(compute, commDone);
}

StatusOr<void *> NcclCommunicator::recordCompletion() {
  void *event = nullptr;
  if (!freeEvents.empty()) {
    event = freeEvents.back();
    freeEvents.pop_back();
  } else {
    TESSERA_ASSIGN_OR_RETURN(event, api.eventCreate());
    requestEvents.push_back(event);
  }
  Status st = api.eventRecord(event, stream);
  if (!st.ok()) {
    releaseEvent(event);
    return st;
  }
  return event;
}

CommRequest NcclCommunicator::track(Pending p) {
  int64_t id = nextId++;
  pending.emplace(id, p);
  return CommRequest{id};
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

Status NcclCommunicator::issueAllReduce(void *buffer, int64_t count,
                                        ElementType type, ReduceKind op) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  TESSERA_RETURN_IF_ERROR(checkCount(count, "all-reduce"));
  TESSERA_RETURN_IF_ERROR(orderAfterCompute());
  TESSERA_RETURN_IF_ERROR(
      api.allReduce(buffer, buffer, size_t(count), type, op, comm, stream));
  stats.allReduce += ringAllReduceBytes(count * elementSize(type), mySize);
  ++stats.calls;
  return Status();
}

Status NcclCommunicator::issueAllGather(const void *send, void *recv,
                                        int64_t sendCount, ElementType type,
                                        bool inPlace) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  TESSERA_RETURN_IF_ERROR(
      checkCount(sendCount, inPlace ? "in-place all-gather" : "all-gather"));
  TESSERA_RETURN_IF_ERROR(orderAfterCompute());
  // NCCL's in-place layout: the input is the rank's block of the output.
  if (inPlace)
    send = blockAt(recv, myRank, sendCount, type);
  TESSERA_RETURN_IF_ERROR(
      api.allGather(send, recv, size_t(sendCount), type, comm, stream));
  stats.allGather +=
      ringAllGatherBytes(sendCount * elementSize(type) * mySize, mySize);
  ++stats.calls;
  return Status();
}

Status NcclCommunicator::issueReduceScatter(const void *send, void *recv,
                                            int64_t recvCount, ElementType type,
                                            ReduceKind op, bool inPlace) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  TESSERA_RETURN_IF_ERROR(checkCount(
      recvCount, inPlace ? "in-place reduce-scatter" : "reduce-scatter"));
  TESSERA_RETURN_IF_ERROR(orderAfterCompute());
  // NCCL's in-place layout: the output is the rank's block of the input.
  if (inPlace)
    recv = blockAt(const_cast<void *>(send), myRank, recvCount, type);
  TESSERA_RETURN_IF_ERROR(
      api.reduceScatter(send, recv, size_t(recvCount), type, op, comm, stream));
  stats.reduceScatter +=
      ringReduceScatterBytes(recvCount * elementSize(type) * mySize, mySize);
  ++stats.calls;
  return Status();
}

StatusOr<CommRequest> NcclCommunicator::started(Status issued) {
  TESSERA_RETURN_IF_ERROR(issued);
  Pending p;
  TESSERA_ASSIGN_OR_RETURN(p.event, recordCompletion());
  return track(p);
}

Status NcclCommunicator::allReduce(void *buffer, int64_t count,
                                   ElementType type, ReduceKind op) {
  TESSERA_RETURN_IF_ERROR(issueAllReduce(buffer, count, type, op));
  return orderBeforeCompute();
}

Status NcclCommunicator::allGather(const void *send, void *recv,
                                   int64_t sendCount, ElementType type) {
  TESSERA_RETURN_IF_ERROR(
      issueAllGather(send, recv, sendCount, type, /*inPlace=*/false));
  return orderBeforeCompute();
}

Status NcclCommunicator::reduceScatter(const void *send, void *recv,
                                       int64_t recvCount, ElementType type,
                                       ReduceKind op) {
  TESSERA_RETURN_IF_ERROR(
      issueReduceScatter(send, recv, recvCount, type, op, /*inPlace=*/false));
  return orderBeforeCompute();
}

Status NcclCommunicator::allToAll(const void *send, void *recv, int64_t count,
                                  ElementType type) {
  const size_t n = static_cast<size_t>(mySize);
  std::vector<int64_t> counts(n, count), offsets(n);
  for (int i = 0; i < mySize; ++i)
    offsets[size_t(i)] = int64_t(i) * count;
  return allToAllV(send, counts.data(), offsets.data(), recv, counts.data(),
                   offsets.data(), type);
}

Status NcclCommunicator::allToAllV(const void *send, const int64_t *sendCounts,
                                   const int64_t *sendOffsets, void *recv,
                                   const int64_t *recvCounts,
                                   const int64_t *recvOffsets,
                                   ElementType type) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  for (int i = 0; i < mySize; ++i) {
    TESSERA_RETURN_IF_ERROR(checkCount(sendCounts[i], "all-to-all"));
    TESSERA_RETURN_IF_ERROR(checkCount(recvCounts[i], "all-to-all"));
  }
  TESSERA_RETURN_IF_ERROR(orderAfterCompute());
  TESSERA_RETURN_IF_ERROR(api.groupStart());
  Status first;
  uint64_t sent = 0;
  for (int peer = 0; peer < mySize && first.ok(); ++peer) {
    first = api.send(blockAt(const_cast<void *>(send), 1, sendOffsets[peer],
                             type),
                     size_t(sendCounts[peer]), type, peer, comm, stream);
    if (first.ok())
      first = api.recv(blockAt(recv, 1, recvOffsets[peer], type),
                       size_t(recvCounts[peer]), type, peer, comm, stream);
    if (peer != myRank)
      sent += uint64_t(sendCounts[peer] * elementSize(type));
  }
  // A started group is always ended; the first error is the one reported.
  Status end = api.groupEnd();
  TESSERA_RETURN_IF_ERROR(first);
  TESSERA_RETURN_IF_ERROR(end);
  stats.allToAll += sent;
  ++stats.calls;
  return orderBeforeCompute();
}

Status NcclCommunicator::allGatherInPlace(void *buffer, int64_t count,
                                          ElementType type) {
  TESSERA_RETURN_IF_ERROR(
      issueAllGather(nullptr, buffer, count, type, /*inPlace=*/true));
  return orderBeforeCompute();
}

Status NcclCommunicator::reduceScatterInPlace(void *buffer, int64_t count,
                                              ElementType type, ReduceKind op) {
  TESSERA_RETURN_IF_ERROR(
      issueReduceScatter(buffer, nullptr, count, type, op, /*inPlace=*/true));
  return orderBeforeCompute();
}

StatusOr<CommRequest> NcclCommunicator::allReduceStart(void *buffer,
                                                       int64_t count,
                                                       ElementType type,
                                                       ReduceKind op) {
  return started(issueAllReduce(buffer, count, type, op));
}

StatusOr<CommRequest> NcclCommunicator::reduceScatterStart(const void *send,
                                                           void *recv,
                                                           int64_t recvCount,
                                                           ElementType type,
                                                           ReduceKind op) {
  return started(
      issueReduceScatter(send, recv, recvCount, type, op, /*inPlace=*/false));
}

StatusOr<CommRequest>
NcclCommunicator::reduceScatterInPlaceStart(void *buffer, int64_t count,
                                            ElementType type, ReduceKind op) {
  return started(
      issueReduceScatter(buffer, nullptr, count, type, op, /*inPlace=*/true));
}

StatusOr<CommRequest> NcclCommunicator::allGatherStart(const void *send,
                                                       void *recv,
                                                       int64_t sendCount,
                                                       ElementType type) {
  return started(
      issueAllGather(send, recv, sendCount, type, /*inPlace=*/false));
}

StatusOr<CommRequest> NcclCommunicator::allGatherInPlaceStart(void *buffer,
                                                              int64_t count,
                                                              ElementType type) {
  return started(
      issueAllGather(nullptr, buffer, count, type, /*inPlace=*/true));
}

//===----------------------------------------------------------------------===//
// Requests and point-to-point
//===----------------------------------------------------------------------===//

StatusOr<CommRequest> NcclCommunicator::queue(Pending::Kind kind, void *buffer,
                                              int64_t count, ElementType type,
                                              int peer, int tag) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  TESSERA_RETURN_IF_ERROR(checkCount(count, "point-to-point transfer"));
  if (peer < 0 || peer >= mySize)
    return invalidArgument("point-to-point peer ", peer,
                           " outside the group of ", mySize, " ranks");
  if (tag < 0)
    return invalidArgument("point-to-point tag ", tag, " is negative");
  Pending p;
  p.kind = kind;
  p.buffer = buffer;
  p.count = size_t(count);
  p.type = type;
  p.peer = peer;
  p.tag = tag;
  if (kind == Pending::Kind::Send)
    stats.p2p += uint64_t(count * elementSize(type));
  ++stats.calls;
  return track(p);
}

StatusOr<CommRequest> NcclCommunicator::isend(const void *buffer, int64_t count,
                                              ElementType type, int peer,
                                              int tag) {
  // NCCL's send takes a const buffer; Pending keeps one pointer for both.
  return queue(Pending::Kind::Send, const_cast<void *>(buffer), count, type,
               peer, tag);
}

StatusOr<CommRequest> NcclCommunicator::irecv(void *buffer, int64_t count,
                                              ElementType type, int peer,
                                              int tag) {
  return queue(Pending::Kind::Recv, buffer, count, type, peer, tag);
}

Status NcclCommunicator::issuePointToPoint(std::vector<Pending> ops,
                                           bool orderCompute) {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  // NCCL matches the operations between two ranks in issue order; ordering
  // each batch by tag makes that the tag matching the interface promises.
  std::stable_sort(
      ops.begin(), ops.end(),
      [](const Pending &a, const Pending &b) { return a.tag < b.tag; });
  TESSERA_RETURN_IF_ERROR(orderAfterCompute());
  TESSERA_RETURN_IF_ERROR(api.groupStart());
  Status first;
  for (const Pending &op : ops) {
    first = op.kind == Pending::Kind::Send
                ? api.send(op.buffer, op.count, op.type, op.peer, comm, stream)
                : api.recv(op.buffer, op.count, op.type, op.peer, comm, stream);
    if (!first.ok())
      break;
  }
  // A group once started is always ended, so that NCCL's group state stays
  // balanced; the first error is the one reported.
  Status end = api.groupEnd();
  TESSERA_RETURN_IF_ERROR(first);
  TESSERA_RETURN_IF_ERROR(end);
  return orderCompute ? orderBeforeCompute() : Status();
}

Status NcclCommunicator::issue(const std::vector<CommRequest> &requests) {
  std::vector<Pending> ops;
  std::vector<int64_t> ids;
  for (const CommRequest &r : requests)
    if (auto it = pending.find(r.id);
        it != pending.end() && it->second.kind != Pending::Kind::Collective) {
      ops.push_back(it->second);
      ids.push_back(r.id);
    }
  if (ops.empty())
    return Status();
  TESSERA_RETURN_IF_ERROR(issuePointToPoint(std::move(ops),
                                            /*orderCompute=*/false));
  // One completion event for the group, kept by its first request; the
  // others wait for nothing more (an event-less entry).
  TESSERA_ASSIGN_OR_RETURN(void *event, recordCompletion());
  for (size_t i = 0; i < ids.size(); ++i) {
    Pending done;
    done.kind = Pending::Kind::Collective;
    done.event = i == 0 ? event : nullptr;
    pending[ids[i]] = done;
  }
  return Status();
}

Status NcclCommunicator::wait(CommRequest request) {
  auto it = pending.find(request.id);
  if (it == pending.end())
    return invalidArgument("wait on unknown or completed request ", request.id);
  Pending p = it->second;
  pending.erase(it);
  if (p.kind != Pending::Kind::Collective)
    return issuePointToPoint({p});
  Status st = checkUsable();
  if (st.ok() && p.event)
    st = api.streamWaitEvent(compute, p.event);
  // The wait is enqueued (or failed): the event may be recorded again.
  if (p.event)
    releaseEvent(p.event);
  return st;
}

Status NcclCommunicator::waitAll(const std::vector<CommRequest> &requests) {
  std::vector<Pending> ops;
  std::vector<void *> events;
  int64_t unknown = -1;
  bool anyUnknown = false;
  for (const CommRequest &r : requests) {
    auto it = pending.find(r.id);
    if (it == pending.end()) {
      anyUnknown = true;
      unknown = r.id;
      continue;
    }
    if (it->second.kind == Pending::Kind::Collective) {
      if (it->second.event) // (none: issued with another request's event)
        events.push_back(it->second.event);
    } else
      ops.push_back(it->second);
    pending.erase(it);
  }
  // Every known request is consumed and issued (or waited on) even if one is
  // unknown, so that none is left behind. The batch goes first: ordered
  // after the compute stream's work so far, it need not wait for the
  // started collectives, which the compute stream waits for afterwards.
  Status first = checkUsable();
  if (first.ok() && !ops.empty())
    first = issuePointToPoint(std::move(ops));
  for (void *event : events) {
    if (first.ok())
      first = api.streamWaitEvent(compute, event);
    releaseEvent(event);
  }
  TESSERA_RETURN_IF_ERROR(first);
  if (anyUnknown)
    return invalidArgument("waitAll on unknown or completed request ", unknown);
  return Status();
}

Status NcclCommunicator::barrier() {
  TESSERA_RETURN_IF_ERROR(checkUsable());
  if (!scratch) {
    TESSERA_ASSIGN_OR_RETURN(scratch, api.memAlloc(sizeof(float)));
  }
  // The value is irrelevant: the all-reduce completes only once every rank
  // entered it, and the host waits for it.
  TESSERA_RETURN_IF_ERROR(api.allReduce(scratch, scratch, 1, ElementType::F32,
                                        ReduceKind::Sum, comm, stream));
  return api.streamSynchronize(stream);
}

//===----------------------------------------------------------------------===//
// Creation over MPI_COMM_WORLD
//===----------------------------------------------------------------------===//

namespace {

/// Whether every rank succeeded: `local` if it failed, else an Unavailable
/// error when another rank failed `what`. Collective over MPI_COMM_WORLD,
/// so that no rank goes on into an NCCL collective that another one will
/// never enter.
Status agree(const Status &local, const char *what) {
  int mine = local.ok() ? 1 : 0, all = 0;
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!local.ok())
    return local;
  if (!all)
    return unavailable(what, " failed on another rank");
  return Status();
}

/// The communicator over split `comm` (null: no colour), with the rank and
/// size NCCL reports.
StatusOr<std::unique_ptr<NcclCommunicator>>
wrapSplit(const NcclApi &api, void *comm, void *computeStream) {
  if (!comm)
    return std::unique_ptr<NcclCommunicator>();
  auto size = api.commCount(comm);
  auto rank = size.ok() ? api.commUserRank(comm) : size;
  if (!rank.ok()) {
    api.commDestroy(comm).ignoreError();
    return rank.status();
  }
  return NcclCommunicator::create(api, comm, *rank, *size, computeStream);
}

} // namespace

StatusOr<std::unique_ptr<NcclCommunicator>>
createNcclWorldCommunicator(const NcclApi &api, void *computeStream) {
  int worldRank = 0, worldSize = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &worldSize));

  // Rank 0's id, with a flag so that the others learn of its failure.
  struct {
    int32_t ok = 1;
    NcclUniqueId id;
  } boot;
  std::memset(&boot.id, 0, sizeof(boot.id));
  Status idStatus;
  if (worldRank == 0) {
    auto id = api.getUniqueId();
    if (id.ok())
      boot.id = *id;
    else
      idStatus = id.status();
    boot.ok = idStatus.ok();
  }
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Bcast(&boot, int(sizeof(boot)), MPI_BYTE, 0, MPI_COMM_WORLD));
  if (!boot.ok)
    return worldRank == 0 ? idStatus
                          : unavailable("rank 0 could not create the NCCL "
                                        "unique id");

  std::unique_ptr<NcclCommunicator> world;
  auto comm = api.commInitRank(worldSize, boot.id, worldRank);
  Status local = comm.status();
  if (comm.ok()) {
    auto created = NcclCommunicator::create(api, *comm, worldRank, worldSize,
                                            computeStream);
    if (created.ok())
      world = std::move(*created);
    else
      local = created.status();
  }
  TESSERA_RETURN_IF_ERROR(agree(local, "NCCL initialisation"));
  return world;
}

StatusOr<NcclCommunicators>
createNcclCommunicators(const NcclApi &api, void *computeStream,
                        const fb::Artifact &artifact,
                        const std::vector<std::string> &kinds,
                        bool atOneRank) {
  // Every rank passes the same list, so they all return here alike.
  for (size_t i = 0; i < kinds.size(); ++i)
    if (std::find(kinds.begin(), kinds.begin() + long(i), kinds[i]) !=
        kinds.begin() + long(i))
      return invalidArgument("group kind '", kinds[i], "' is listed twice");
  int worldRank = 0, worldSize = 0;
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &worldSize));

  NcclCommunicators set;
  if (worldSize == 1 && !atOneRank)
    return set;
  TESSERA_ASSIGN_OR_RETURN(set.world,
                           createNcclWorldCommunicator(api, computeStream));
  Status firstMismatch;
  for (const std::string &kind : kinds) {
    GroupPosition pos = findGroupPosition(artifact, kind, worldRank);
    // The membership check: an MPI split along the same colours and keys,
    // checked against the artifact; NCCL orders a colour's ranks by key as
    // MPI does, so the NCCL split holds the same members in the same order.
    // MPI failures (Internal) abort at once, as createMpiGroupCommunicators
    // does; only the check itself reports FailedPrecondition.
    auto check = createMpiGroupCommunicator(artifact, kind);
    if (!check.ok()) {
      if (check.status().getCode() != StatusCode::FailedPrecondition)
        return check.status();
      if (firstMismatch.ok())
        firstMismatch = check.status();
    }
    std::optional<int> color;
    if (pos.group)
      color = pos.instance;
    auto split = api.commSplit(set.world->ncclComm(), color, pos.index);
    StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        split.ok() ? wrapSplit(api, *split, computeStream) : split.status();
    TESSERA_RETURN_IF_ERROR(
        agree(comm.status(), "splitting the NCCL communicator")
            .withContext("group kind '" + kind + "'"));
    if (*comm)
      set.groups[kind] = std::move(*comm);
  }
  if (!firstMismatch.ok())
    return firstMismatch;
  return set;
}

} // namespace tessera::rt
