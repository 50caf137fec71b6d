//===- FakeNccl.h - An NcclApi over MPI and host memory ---------*- C++ -*-===//
//
// Lets NcclCommunicator run without a GPU: "device" memory is host memory,
// streams and events are host objects, and the NCCL calls are MPI calls on
// communicators duplicated from MPI_COMM_WORLD. Work "enqueued" on a stream
// runs at once, in call order, so every event is complete once recorded;
// the stream and event calls are only checked (known handles) and logged.
//
//   commInitRank   MPI_Comm_dup(MPI_COMM_WORLD); only over the whole world
//                  (Unimplemented otherwise), with an id from getUniqueId
//   commSplit      MPI_Comm_split (no colour: MPI_UNDEFINED, null comm)
//   collectives    the MPI ones, with the MPI communicator's datatypes and
//                  reduction ops (bf16 sums in f32 rounded per partial sum,
//                  mpiReduceOp); bf16 max is an exact max. NCCL's in-place
//                  layouts map to MPI_IN_PLACE; any other overlap of the
//                  send and receive buffers is an InvalidArgument
//   send / recv    inside groupStart/groupEnd, queued and run at groupEnd
//                  as MPI_Isend/MPI_Irecv plus one MPI_Waitall (so a batch
//                  that sends to and receives from a peer cannot deadlock);
//                  like NCCL, no tags: messages between two ranks match in
//                  order (MPI's non-overtaking rule, tag 0)
//   memAlloc       zeroed, 256-byte aligned host memory
//
// Every call is appended to a log (FakeNcclCall) that the tests inspect,
// and any entry can be made to fail once (failNext).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_UNITTESTS_FAKENCCL_H
#define TESSERA_RT_UNITTESTS_FAKENCCL_H

#include "tessera/rt/NcclApi.h"

#include <mpi.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tessera::rt::test {

/// One call of the fake table.
struct FakeNcclCall {
  /// The NcclApi entry: "allReduce", "eventRecord", "groupStart", ...
  std::string name;
  /// Fake ids (-1: none) of the comm, stream and event the call names.
  int comm = -1, stream = -1, event = -1;
  /// Buffers: send and recv of collectives; the buffer of send (in `send`)
  /// and recv (in `recv`); memAlloc's and memFree's pointer in `recv`.
  const void *send = nullptr;
  void *recv = nullptr;
  /// Elements (bytes for memAlloc).
  size_t count = 0;
  std::optional<ElementType> type;
  std::optional<ReduceKind> op;
  int peer = -1;
  /// commSplit's colour and key, commInitRank's nranks (key) and rank.
  std::optional<int> color;
  int key = -1, rank = -1;
  /// Issued between groupStart and groupEnd.
  bool inGroup = false;
  /// The call returned an error.
  bool failed = false;
};

class FakeNccl {
public:
  FakeNccl();
  /// Frees the communicators and MPI ops still alive (unless MPI is
  /// finalized).
  ~FakeNccl();
  FakeNccl(const FakeNccl &) = delete;
  FakeNccl &operator=(const FakeNccl &) = delete;

  /// The table; its entries refer to this object.
  const NcclApi &api() const { return table; }

  const std::vector<FakeNcclCall> &log() const { return calls; }
  void clearLog() { calls.clear(); }

  /// The fake id of a handle (-1 if unknown or freed).
  int streamId(void *stream) const;
  int eventId(void *event) const;
  int commId(void *comm) const;

  /// Objects not yet freed, for leak checks.
  size_t liveStreams() const { return streams.size(); }
  size_t liveEvents() const { return events.size(); }
  size_t liveComms() const { return comms.size(); }
  size_t liveAllocations() const { return allocations.size(); }

  /// The next call of entry `name` fails (Internal, "fake failure of
  /// <name>") without doing anything.
  void failNext(const std::string &name) { failures.insert(name); }
  /// commGetAsyncError returns `error` from now on (ok: healthy).
  void setAsyncError(Status error) { asyncError = std::move(error); }

private:
  struct Comm;
  struct Stream {
    int id;
  };
  struct Event {
    int id;
  };
  struct PointToPoint {
    bool isSend;
    const void *send;
    void *recv;
    size_t count;
    ElementType type;
    int peer;
    Comm *comm;
  };

  FakeNcclCall &record(FakeNcclCall call);
  /// The injected failure of `name`, if any (consumed).
  Status injected(const std::string &name);
  StatusOr<Comm *> findComm(void *comm) const;
  Status checkStream(void *stream) const;
  Status checkEvent(void *event) const;
  StatusOr<int> mpiCount(size_t count) const;
  Status runPointToPoint(const std::vector<PointToPoint> &ops);

  Status allReduce(const void *send, void *recv, size_t count, ElementType type,
                   ReduceKind op, Comm *comm);
  Status allGather(const void *send, void *recv, size_t count, ElementType type,
                   Comm *comm);
  Status reduceScatter(const void *send, void *recv, size_t count,
                       ElementType type, ReduceKind op, Comm *comm);
  /// The MPI op of `op` on `type`: the MPI communicator's, or the fake's
  /// bf16 max.
  StatusOr<MPI_Op> reduceOp(ReduceKind op, ElementType type);

  NcclApi table;
  std::vector<FakeNcclCall> calls;
  std::map<void *, std::unique_ptr<Comm>> comms;
  std::map<void *, std::unique_ptr<Stream>> streams;
  std::map<void *, std::unique_ptr<Event>> events;
  std::map<void *, size_t> allocations;
  int nextComm = 0, nextStream = 0, nextEvent = 0, nextUniqueId = 0;
  int groupDepth = 0;
  std::vector<PointToPoint> queued;
  std::set<std::string> failures;
  Status asyncError;
  /// The bf16 max, created on first use.
  MPI_Op bf16Max = MPI_OP_NULL;
};

} // namespace tessera::rt::test

#endif // TESSERA_RT_UNITTESTS_FAKENCCL_H
