//===- FakeNccl.cpp - An NcclApi over MPI and host memory -----------------===//

#include "FakeNccl.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/MpiCommunicator.h"

#include <climits>
#include <cstdlib>
#include <cstring>

namespace tessera::rt::test {

namespace {

/// The prefix of the fake's unique ids; commInitRank rejects others, so a
/// rank that did not receive rank 0's id fails clearly.
constexpr char kIdMagic[] = "tessera-fake-nccl-id";

/// Exact max of bf16 values (compared as floats; no rounding involved).
void bf16MaxFn(void *in, void *inout, int *len, MPI_Datatype *) {
  const auto *a = static_cast<const uint16_t *>(in);
  auto *b = static_cast<uint16_t *>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16ToFloat(a[i]) > bf16ToFloat(b[i]))
      b[i] = a[i];
}

bool overlaps(const void *a, size_t aBytes, const void *b, size_t bBytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bBytes && pb < pa + aBytes;
}

} // namespace

struct FakeNccl::Comm {
  int id;
  MPI_Comm mpi;
  int rank, size;
};

//===----------------------------------------------------------------------===//
// Bookkeeping
//===----------------------------------------------------------------------===//

FakeNcclCall &FakeNccl::record(FakeNcclCall call) {
  call.inGroup = groupDepth > 0;
  calls.push_back(std::move(call));
  return calls.back();
}

Status FakeNccl::injected(const std::string &name) {
  if (!failures.erase(name))
    return Status();
  return internalError("fake failure of ", name);
}

StatusOr<FakeNccl::Comm *> FakeNccl::findComm(void *comm) const {
  auto it = comms.find(comm);
  if (it == comms.end())
    return invalidArgument("fake NCCL: unknown communicator ", comm);
  return it->second.get();
}

Status FakeNccl::checkStream(void *stream) const {
  if (!streams.count(stream))
    return invalidArgument("fake NCCL: unknown stream ", stream);
  return Status();
}

Status FakeNccl::checkEvent(void *event) const {
  if (!events.count(event))
    return invalidArgument("fake NCCL: unknown event ", event);
  return Status();
}

StatusOr<int> FakeNccl::mpiCount(size_t count) const {
  if (count > size_t(INT_MAX))
    return unimplemented("fake NCCL: ", count,
                         " elements exceed MPI's int count");
  return int(count);
}

int FakeNccl::streamId(void *stream) const {
  auto it = streams.find(stream);
  return it == streams.end() ? -1 : it->second->id;
}
int FakeNccl::eventId(void *event) const {
  auto it = events.find(event);
  return it == events.end() ? -1 : it->second->id;
}
int FakeNccl::commId(void *comm) const {
  auto it = comms.find(comm);
  return it == comms.end() ? -1 : it->second->id;
}

StatusOr<MPI_Op> FakeNccl::reduceOp(ReduceKind op, ElementType type) {
  if (type != ElementType::BF16 || op != ReduceKind::Max)
    return mpiReduceOp(op, type);
  if (bf16Max == MPI_OP_NULL)
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Op_create(bf16MaxFn, /*commute=*/1, &bf16Max));
  return bf16Max;
}

//===----------------------------------------------------------------------===//
// Collectives and point-to-point over MPI
//===----------------------------------------------------------------------===//

Status FakeNccl::allReduce(const void *send, void *recv, size_t count,
                           ElementType type, ReduceKind op, Comm *comm) {
  TESSERA_ASSIGN_OR_RETURN(int n, mpiCount(count));
  TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
  TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, reduceOp(op, type));
  const size_t bytes = count * size_t(elementSize(type));
  if (send != recv && overlaps(send, bytes, recv, bytes))
    return invalidArgument("fake NCCL: all-reduce buffers overlap but are "
                           "not the same");
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send,
                                            recv, n, dt, mop, comm->mpi));
  return Status();
}

Status FakeNccl::allGather(const void *send, void *recv, size_t count,
                           ElementType type, Comm *comm) {
  TESSERA_ASSIGN_OR_RETURN(int n, mpiCount(count));
  TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
  const size_t bytes = count * size_t(elementSize(type));
  // NCCL's in-place all-gather: the input is the rank's block of recv.
  const bool inPlace = send == static_cast<char *>(recv) + comm->rank * bytes;
  if (!inPlace && overlaps(send, bytes, recv, bytes * size_t(comm->size)))
    return invalidArgument("fake NCCL: all-gather buffers overlap but the "
                           "send buffer is not the rank's block of recv");
  if (inPlace)
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Allgather(
        MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, dt, comm->mpi));
  else
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Allgather(send, n, dt, recv, n, dt, comm->mpi));
  return Status();
}

Status FakeNccl::reduceScatter(const void *send, void *recv, size_t count,
                               ElementType type, ReduceKind op, Comm *comm) {
  TESSERA_ASSIGN_OR_RETURN(int n, mpiCount(count));
  TESSERA_ASSIGN_OR_RETURN(MPI_Datatype dt, mpiDatatype(type));
  TESSERA_ASSIGN_OR_RETURN(MPI_Op mop, reduceOp(op, type));
  const size_t bytes = count * size_t(elementSize(type));
  // NCCL's in-place reduce-scatter: the output is the rank's block of send.
  const bool inPlace =
      recv == static_cast<const char *>(send) + comm->rank * bytes;
  if (!inPlace && overlaps(send, bytes * size_t(comm->size), recv, bytes))
    return invalidArgument("fake NCCL: reduce-scatter buffers overlap but the "
                           "recv buffer is not the rank's block of send");
  if (!inPlace) {
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Reduce_scatter_block(send, recv, n, dt, mop, comm->mpi));
    return Status();
  }
  // MPI_IN_PLACE leaves the result at the start of the buffer.
  void *buffer = const_cast<void *>(send);
  TESSERA_RETURN_IF_MPI_ERROR(
      MPI_Reduce_scatter_block(MPI_IN_PLACE, buffer, n, dt, mop, comm->mpi));
  if (comm->rank > 0)
    std::memmove(recv, buffer, bytes);
  return Status();
}

Status FakeNccl::runPointToPoint(const std::vector<PointToPoint> &ops) {
  std::vector<MPI_Request> requests;
  requests.reserve(ops.size());
  Status posted;
  for (const PointToPoint &op : ops) {
    auto n = mpiCount(op.count);
    auto dt = n.ok() ? mpiDatatype(op.type) : n.status();
    if (!dt.ok()) {
      posted = dt.status();
      break;
    }
    MPI_Request request;
    int rc = op.isSend ? MPI_Isend(op.send, *n, *dt, op.peer, /*tag=*/0,
                                   op.comm->mpi, &request)
                       : MPI_Irecv(op.recv, *n, *dt, op.peer, /*tag=*/0,
                                   op.comm->mpi, &request);
    if (rc != MPI_SUCCESS) {
      posted = mpiStatus(rc, op.isSend ? "MPI_Isend" : "MPI_Irecv");
      break;
    }
    requests.push_back(request);
  }
  // Whatever was posted completes (or fails) before returning.
  if (!requests.empty()) {
    int rc =
        MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    if (posted.ok() && rc != MPI_SUCCESS)
      posted = mpiStatus(rc, "MPI_Waitall");
  }
  return posted;
}

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

FakeNccl::FakeNccl() {
  NcclApi &t = table;

  t.getUniqueId = [this]() -> StatusOr<NcclUniqueId> {
    record({"getUniqueId"});
    TESSERA_RETURN_IF_ERROR(injected("getUniqueId"));
    NcclUniqueId id;
    std::memset(id.internal, 0, sizeof(id.internal));
    std::memcpy(id.internal, kIdMagic, sizeof(kIdMagic));
    int serial = nextUniqueId++;
    std::memcpy(id.internal + sizeof(kIdMagic), &serial, sizeof(serial));
    return id;
  };
  t.commInitRank = [this](int nranks, const NcclUniqueId &id,
                          int rank) -> StatusOr<void *> {
    FakeNcclCall call{"commInitRank"};
    call.key = nranks;
    call.rank = rank;
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("commInitRank"));
    if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0)
      return invalidArgument("fake NCCL: commInitRank with an id that "
                             "getUniqueId did not make");
    int worldRank = 0, worldSize = 0;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &worldSize));
    if (nranks != worldSize || rank != worldRank)
      return unimplemented("fake NCCL: commInitRank only over the whole "
                           "world (rank ",
                           rank, " of ", nranks, " asked, world rank ",
                           worldRank, " of ", worldSize, ")");
    MPI_Comm mpi = MPI_COMM_NULL;
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &mpi));
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    auto comm = std::make_unique<Comm>(Comm{nextComm++, mpi, rank, nranks});
    void *handle = comm.get();
    calls.back().comm = comm->id;
    comms.emplace(handle, std::move(comm));
    return handle;
  };
  t.commSplit = [this](void *parent, std::optional<int> color,
                       int key) -> StatusOr<void *> {
    FakeNcclCall call{"commSplit"};
    call.comm = commId(parent);
    call.color = color;
    call.key = key;
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("commSplit"));
    TESSERA_ASSIGN_OR_RETURN(Comm * p, findComm(parent));
    if (color && *color < 0)
      return invalidArgument("fake NCCL: negative colour ", *color);
    MPI_Comm mpi = MPI_COMM_NULL;
    TESSERA_RETURN_IF_MPI_ERROR(
        MPI_Comm_split(p->mpi, color ? *color : MPI_UNDEFINED, key, &mpi));
    if (mpi == MPI_COMM_NULL)
      return static_cast<void *>(nullptr);
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    auto comm = std::make_unique<Comm>(Comm{nextComm++, mpi, 0, 0});
    MPI_Comm_rank(mpi, &comm->rank);
    MPI_Comm_size(mpi, &comm->size);
    void *handle = comm.get();
    comms.emplace(handle, std::move(comm));
    return handle;
  };
  t.commCount = [this](void *comm) -> StatusOr<int> {
    FakeNcclCall call{"commCount"};
    call.comm = commId(comm);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("commCount"));
    TESSERA_ASSIGN_OR_RETURN(Comm * c, findComm(comm));
    return c->size;
  };
  t.commUserRank = [this](void *comm) -> StatusOr<int> {
    FakeNcclCall call{"commUserRank"};
    call.comm = commId(comm);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("commUserRank"));
    TESSERA_ASSIGN_OR_RETURN(Comm * c, findComm(comm));
    return c->rank;
  };
  // Destroy and abort both free the communicator (as NCCL's do).
  auto freeComm = [this](const char *name, void *comm) -> Status {
    FakeNcclCall call{name};
    call.comm = commId(comm);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected(name));
    TESSERA_ASSIGN_OR_RETURN(Comm * c, findComm(comm));
    MPI_Comm mpi = c->mpi;
    comms.erase(comm);
    TESSERA_RETURN_IF_MPI_ERROR(MPI_Comm_free(&mpi));
    return Status();
  };
  t.commDestroy = [freeComm](void *comm) {
    return freeComm("commDestroy", comm);
  };
  t.commAbort = [freeComm](void *comm) { return freeComm("commAbort", comm); };
  t.commGetAsyncError = [this](void *comm) -> Status {
    FakeNcclCall call{"commGetAsyncError"};
    call.comm = commId(comm);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("commGetAsyncError"));
    TESSERA_RETURN_IF_ERROR(findComm(comm).status());
    return asyncError;
  };

  t.groupStart = [this]() -> Status {
    record({"groupStart"});
    TESSERA_RETURN_IF_ERROR(injected("groupStart"));
    ++groupDepth;
    return Status();
  };
  t.groupEnd = [this]() -> Status {
    if (groupDepth == 0) {
      record({"groupEnd"}).failed = true;
      return invalidArgument("fake NCCL: groupEnd without groupStart");
    }
    // Recorded after the group closes (inGroup false), like NCCL's issue.
    --groupDepth;
    FakeNcclCall &call = record({"groupEnd"});
    if (groupDepth > 0)
      return Status();
    std::vector<PointToPoint> ops = std::move(queued);
    queued.clear();
    Status st = injected("groupEnd");
    if (st.ok())
      st = runPointToPoint(ops);
    // Nothing was logged since, so `call` still refers to the entry.
    call.failed = !st.ok();
    return st;
  };

  // The shared prologue of the operations: log, injected failure, handles,
  // and no collectives inside a group (the communicator never does that).
  auto operation = [this](FakeNcclCall call, void *comm, void *stream,
                          bool collective) -> StatusOr<Comm *> {
    call.comm = commId(comm);
    call.stream = streamId(stream);
    FakeNcclCall &logged = record(std::move(call));
    Status st = injected(logged.name);
    if (st.ok())
      st = checkStream(stream);
    if (st.ok() && collective && groupDepth > 0)
      st = unimplemented("fake NCCL: collectives inside a group");
    StatusOr<Comm *> c = st.ok() ? findComm(comm) : StatusOr<Comm *>(st);
    logged.failed = !c.ok();
    return c;
  };
  t.allReduce = [this, operation](const void *send, void *recv, size_t count,
                                  ElementType type, ReduceKind op, void *comm,
                                  void *stream) -> Status {
    FakeNcclCall call{"allReduce"};
    call.send = send;
    call.recv = recv;
    call.count = count;
    call.type = type;
    call.op = op;
    TESSERA_ASSIGN_OR_RETURN(Comm * c, operation(call, comm, stream, true));
    return allReduce(send, recv, count, type, op, c);
  };
  t.allGather = [this, operation](const void *send, void *recv,
                                  size_t sendCount, ElementType type,
                                  void *comm, void *stream) -> Status {
    FakeNcclCall call{"allGather"};
    call.send = send;
    call.recv = recv;
    call.count = sendCount;
    call.type = type;
    TESSERA_ASSIGN_OR_RETURN(Comm * c, operation(call, comm, stream, true));
    return allGather(send, recv, sendCount, type, c);
  };
  t.reduceScatter = [this, operation](const void *send, void *recv,
                                      size_t recvCount, ElementType type,
                                      ReduceKind op, void *comm,
                                      void *stream) -> Status {
    FakeNcclCall call{"reduceScatter"};
    call.send = send;
    call.recv = recv;
    call.count = recvCount;
    call.type = type;
    call.op = op;
    TESSERA_ASSIGN_OR_RETURN(Comm * c, operation(call, comm, stream, true));
    return reduceScatter(send, recv, recvCount, type, op, c);
  };
  auto pointToPoint = [this, operation](bool isSend, const void *send,
                                        void *recv, size_t count,
                                        ElementType type, int peer, void *comm,
                                        void *stream) -> Status {
    FakeNcclCall call{isSend ? "send" : "recv"};
    call.send = send;
    call.recv = recv;
    call.count = count;
    call.type = type;
    call.peer = peer;
    TESSERA_ASSIGN_OR_RETURN(Comm * c, operation(call, comm, stream, false));
    if (peer < 0 || peer >= c->size)
      return invalidArgument("fake NCCL: peer ", peer, " of ", c->size);
    PointToPoint op{isSend, send, recv, count, type, peer, c};
    if (groupDepth > 0) {
      queued.push_back(op);
      return Status();
    }
    return runPointToPoint({op});
  };
  t.send = [pointToPoint](const void *buffer, size_t count, ElementType type,
                          int peer, void *comm, void *stream) {
    return pointToPoint(true, buffer, nullptr, count, type, peer, comm, stream);
  };
  t.recv = [pointToPoint](void *buffer, size_t count, ElementType type,
                          int peer, void *comm, void *stream) {
    return pointToPoint(false, nullptr, buffer, count, type, peer, comm,
                        stream);
  };

  t.streamCreate = [this]() -> StatusOr<void *> {
    FakeNcclCall &call = record({"streamCreate"});
    TESSERA_RETURN_IF_ERROR(injected("streamCreate"));
    auto stream = std::make_unique<Stream>(Stream{nextStream++});
    void *handle = stream.get();
    call.stream = stream->id;
    streams.emplace(handle, std::move(stream));
    return handle;
  };
  t.streamDestroy = [this](void *stream) -> Status {
    FakeNcclCall call{"streamDestroy"};
    call.stream = streamId(stream);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("streamDestroy"));
    TESSERA_RETURN_IF_ERROR(checkStream(stream));
    streams.erase(stream);
    return Status();
  };
  t.streamSynchronize = [this](void *stream) -> Status {
    FakeNcclCall call{"streamSynchronize"};
    call.stream = streamId(stream);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("streamSynchronize"));
    return checkStream(stream);
  };
  t.eventCreate = [this]() -> StatusOr<void *> {
    FakeNcclCall &call = record({"eventCreate"});
    TESSERA_RETURN_IF_ERROR(injected("eventCreate"));
    auto event = std::make_unique<Event>(Event{nextEvent++});
    void *handle = event.get();
    call.event = event->id;
    events.emplace(handle, std::move(event));
    return handle;
  };
  t.eventDestroy = [this](void *event) -> Status {
    FakeNcclCall call{"eventDestroy"};
    call.event = eventId(event);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("eventDestroy"));
    TESSERA_RETURN_IF_ERROR(checkEvent(event));
    events.erase(event);
    return Status();
  };
  t.eventRecord = [this](void *event, void *stream) -> Status {
    FakeNcclCall call{"eventRecord"};
    call.event = eventId(event);
    call.stream = streamId(stream);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("eventRecord"));
    TESSERA_RETURN_IF_ERROR(checkEvent(event));
    return checkStream(stream);
  };
  t.streamWaitEvent = [this](void *stream, void *event) -> Status {
    FakeNcclCall call{"streamWaitEvent"};
    call.event = eventId(event);
    call.stream = streamId(stream);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("streamWaitEvent"));
    TESSERA_RETURN_IF_ERROR(checkEvent(event));
    return checkStream(stream);
  };
  t.eventQuery = [this](void *event) -> StatusOr<bool> {
    FakeNcclCall call{"eventQuery"};
    call.event = eventId(event);
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("eventQuery"));
    TESSERA_RETURN_IF_ERROR(checkEvent(event));
    return true; // the work ran at issue
  };
  t.memAlloc = [this](size_t bytes) -> StatusOr<void *> {
    FakeNcclCall &call = record({"memAlloc"});
    call.count = bytes;
    TESSERA_RETURN_IF_ERROR(injected("memAlloc"));
    size_t rounded = (bytes + 255) / 256 * 256;
    void *ptr = std::aligned_alloc(256, rounded ? rounded : 256);
    if (!ptr)
      return internalError("fake NCCL: out of host memory for ", bytes,
                           " bytes");
    std::memset(ptr, 0, rounded ? rounded : 256);
    call.recv = ptr;
    allocations.emplace(ptr, bytes);
    return ptr;
  };
  t.memFree = [this](void *ptr) -> Status {
    FakeNcclCall call{"memFree"};
    call.recv = ptr;
    record(call);
    TESSERA_RETURN_IF_ERROR(injected("memFree"));
    if (!allocations.erase(ptr))
      return invalidArgument("fake NCCL: memFree of ", ptr,
                             ", which memAlloc did not return");
    std::free(ptr);
    return Status();
  };
}

FakeNccl::~FakeNccl() {
  for (auto &entry : allocations)
    std::free(entry.first);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    return;
  for (auto &entry : comms)
    MPI_Comm_free(&entry.second->mpi);
  if (bf16Max != MPI_OP_NULL)
    MPI_Op_free(&bf16Max);
}

} // namespace tessera::rt::test
