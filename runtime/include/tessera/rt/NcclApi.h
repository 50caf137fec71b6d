//===- NcclApi.h - NCCL and CUDA calls of the NCCL communicator -*- C++ -*-===//
//
// NcclCommunicator reaches NCCL and the CUDA runtime only through this table,
// so that the runtime library needs neither their headers nor a GPU: the CUDA
// backend plugin fills it with the real calls (src/backends/cuda/
// NcclApiCuda.cpp, cudaNcclApi()), and the tests with a fake over MPI and
// host memory (unittests/FakeNccl.h) that also logs every call.
//
// Handles are opaque: a `void *` stands for an ncclComm_t, a cudaStream_t or
// a cudaEvent_t, and device memory is a plain pointer. Element types and
// reductions are Tessera's (ElementType, ReduceKind); counts are elements.
// Every entry returns a Status; an error's message names the NCCL or CUDA
// call and its error string (for NCCL also ncclGetLastError's detail).
//
// The entries are std::function so that a fake can capture its state; they
// are called a few times per collective, which costs nothing next to a
// kernel launch. Every entry must be set.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_NCCLAPI_H
#define TESSERA_RT_NCCLAPI_H

#include "tessera/rt/Communicator.h"
#include "tessera/rt/Status.h"

#include <cstddef>
#include <functional>
#include <optional>

namespace tessera::rt {

/// ncclUniqueId: the bootstrap address rank 0 creates and every rank of the
/// new communicator passes to commInitRank (NCCL_UNIQUE_ID_BYTES bytes).
struct NcclUniqueId {
  char internal[128];
};

struct NcclApi {
  //--- Communicators --------------------------------------------------------//

  /// ncclGetUniqueId.
  std::function<StatusOr<NcclUniqueId>()> getUniqueId;
  /// ncclCommInitRank(&comm, nranks, id, rank); collective over the nranks
  /// ranks that pass the same id. Returns the new communicator.
  std::function<StatusOr<void *>(int nranks, const NcclUniqueId &id, int rank)>
      commInitRank;
  /// ncclCommSplit(parent, color, key, &comm, nullptr); collective over
  /// `parent`. No colour (NCCL_SPLIT_NOCOLOR) leaves the rank out and
  /// returns null. Ranks of one colour are ordered by key.
  std::function<StatusOr<void *>(void *parent, std::optional<int> color,
                                 int key)>
      commSplit;
  /// ncclCommCount and ncclCommUserRank.
  std::function<StatusOr<int>(void *comm)> commCount;
  std::function<StatusOr<int>(void *comm)> commUserRank;
  /// ncclCommDestroy (after the comm's work completed) and ncclCommAbort
  /// (frees the comm at once, cancelling whatever is in flight or hung).
  std::function<Status(void *comm)> commDestroy;
  std::function<Status(void *comm)> commAbort;
  /// ncclCommGetAsyncError: ok while the comm is healthy (or an operation is
  /// still in progress), else an error naming the asynchronous NCCL error
  /// (e.g. a peer that failed or a network timeout).
  std::function<Status(void *comm)> commGetAsyncError;

  //--- Operations (enqueued on `stream`) ------------------------------------//

  /// ncclGroupStart / ncclGroupEnd: the calls between them are issued
  /// together at ncclGroupEnd (point-to-point batches).
  std::function<Status()> groupStart;
  std::function<Status()> groupEnd;
  /// ncclAllReduce; in place when send == recv.
  std::function<Status(const void *send, void *recv, size_t count,
                       ElementType type, ReduceKind op, void *comm,
                       void *stream)>
      allReduce;
  /// ncclAllGather: recv = concat over ranks of send (sendCount each); in
  /// place when send == recv + rank * sendCount elements.
  std::function<Status(const void *send, void *recv, size_t sendCount,
                       ElementType type, void *comm, void *stream)>
      allGather;
  /// ncclReduceScatter: recv = this rank's recvCount-element block of the
  /// reduction; in place when recv == send + rank * recvCount elements.
  std::function<Status(const void *send, void *recv, size_t recvCount,
                       ElementType type, ReduceKind op, void *comm,
                       void *stream)>
      reduceScatter;
  /// ncclSend / ncclRecv to / from rank `peer` of `comm`. NCCL has no tags:
  /// the operations between two ranks match in the order they are issued.
  std::function<Status(const void *buffer, size_t count, ElementType type,
                       int peer, void *comm, void *stream)>
      send;
  std::function<Status(void *buffer, size_t count, ElementType type, int peer,
                       void *comm, void *stream)>
      recv;

  //--- CUDA runtime ---------------------------------------------------------//

  /// cudaStreamCreateWithFlags(cudaStreamNonBlocking): a stream that does
  /// not synchronise with the legacy default stream.
  std::function<StatusOr<void *>()> streamCreate;
  std::function<Status(void *stream)> streamDestroy;
  /// cudaStreamSynchronize: blocks the host until the stream's work is done.
  std::function<Status(void *stream)> streamSynchronize;
  /// cudaEventCreateWithFlags(cudaEventDisableTiming): ordering only.
  std::function<StatusOr<void *>()> eventCreate;
  std::function<Status(void *event)> eventDestroy;
  /// cudaEventRecord(event, stream): the event completes when the stream's
  /// work enqueued so far does.
  std::function<Status(void *event, void *stream)> eventRecord;
  /// cudaStreamWaitEvent(stream, event, 0): the stream's later work waits
  /// for the event's latest record at the time of this call (so the event
  /// may be recorded again afterwards). Does not block the host.
  std::function<Status(void *stream, void *event)> streamWaitEvent;
  /// cudaEventQuery: true when complete, false when not yet (cudaErrorNot
  /// Ready), an error otherwise.
  std::function<StatusOr<bool>(void *event)> eventQuery;
  /// cudaMalloc / cudaFree (device scratch).
  std::function<StatusOr<void *>(size_t bytes)> memAlloc;
  std::function<Status(void *ptr)> memFree;
};

} // namespace tessera::rt

#endif // TESSERA_RT_NCCLAPI_H
