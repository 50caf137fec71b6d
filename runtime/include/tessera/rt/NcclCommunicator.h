//===- NcclCommunicator.h - NCCL implementation of Communicator -*- C++ -*-===//
//
// A Communicator over one NCCL communicator, for the CUDA backend. It calls
// NCCL and the CUDA runtime only through an NcclApi table (NcclApi.h), so it
// is plain C++ in TesseraRuntime and is tested without a GPU against a fake
// table over MPI.
//
// Collectives are stream-ordered and never block the host (the executor
// issues them between kernels, as Megatron-LM does with NCCL through
// torch.distributed): each one records an event on the compute stream, makes
// the communicator's own communication stream wait on it, and enqueues the
// NCCL call there. The blocking forms (allReduce, allGather, reduceScatter
// and the in-place forms) then make the compute stream wait on an event
// recorded on the communication stream after the call, so later kernels see
// the result; "blocking" means ordered before the compute stream's later
// work, not that the host waited. The Start forms record their completion
// event likewise but leave the compute stream free until wait() (or
// waitAll()) makes it wait on that event: kernels enqueued in between
// overlap the collective, like Megatron's overlapped gradient
// reduce-scatter. progress() has nothing to drive.
//
// In-place forms use NCCL's native layouts (no copies): all-gather with
// sendbuff = recvbuff + rank * count elements, reduce-scatter with
// recvbuff = sendbuff + rank * count elements.
//
// Point-to-point: isend/irecv only queue the operation; waitAll issues the
// queued operations of its requests as one ncclGroupStart ... ncclGroupEnd
// batch on the communication stream (after it waited on the compute stream,
// and before the compute stream waits on it), so that a batch that both
// sends to and receives from a peer cannot deadlock (Megatron's
// batch_isend_irecv). NCCL has no tags: operations between two ranks match
// in issue order. The batch is issued sorted by tag (stable), so a send
// matches the receive of the same tag as long as each batch holds exactly
// the operations its peers' batches match, which the executor's pipeline
// exchanges do.
//
// Byte counters are the MPI communicator's (ring volumes, p2p bytes counted
// at isend, one call per collective and per queued operation). Unlike the
// MPI communicator's, max reductions of bf16 are supported (NCCL has them);
// sums of bf16 are NCCL's.
//
// barrier() is the only call that blocks the host: an all-reduce of a
// one-element device scratch buffer, then a synchronisation of the
// communication stream.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_NCCLCOMMUNICATOR_H
#define TESSERA_RT_NCCLCOMMUNICATOR_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/NcclApi.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessera::rt {

class NcclCommunicator final : public Communicator {
public:
  /// Wraps NCCL communicator `comm` (takes ownership: ncclCommDestroy on
  /// destruction, also when creation fails) whose rank and size are `rank`
  /// and `size`. `computeStream` is the backend's stream, which the
  /// collectives are ordered against; it must outlive the communicator.
  /// Creates the communication stream and its events. The CUDA device must
  /// already be current (the backend's).
  static StatusOr<std::unique_ptr<NcclCommunicator>>
  create(const NcclApi &api, void *comm, int rank, int size,
         void *computeStream);

  /// Waits for the communication stream, then frees the events, the stream,
  /// the scratch buffer and the NCCL communicator (errors ignored). After
  /// abort() the communicator is not touched again.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator &) = delete;
  NcclCommunicator &operator=(const NcclCommunicator &) = delete;

  int rank() const override { return myRank; }
  int size() const override { return mySize; }

  Status allReduce(void *buffer, int64_t count, ElementType type,
                   ReduceKind op) override;
  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type) override;
  Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                       ElementType type, ReduceKind op) override;
  /// One NCCL group of a send and a receive per rank (NCCL has no
  /// all-to-all collective; this is its documented pattern).
  Status allToAll(const void *send, void *recv, int64_t count,
                  ElementType type) override;
  Status allToAllV(const void *send, const int64_t *sendCounts,
                   const int64_t *sendOffsets, void *recv,
                   const int64_t *recvCounts, const int64_t *recvOffsets,
                   ElementType type) override;
  StatusOr<CommRequest> allReduceStart(void *buffer, int64_t count,
                                       ElementType type,
                                       ReduceKind op) override;
  StatusOr<CommRequest> reduceScatterStart(const void *send, void *recv,
                                           int64_t recvCount, ElementType type,
                                           ReduceKind op) override;
  Status allGatherInPlace(void *buffer, int64_t count,
                          ElementType type) override;
  Status reduceScatterInPlace(void *buffer, int64_t count, ElementType type,
                              ReduceKind op) override;
  StatusOr<CommRequest> reduceScatterInPlaceStart(void *buffer, int64_t count,
                                                  ElementType type,
                                                  ReduceKind op) override;
  StatusOr<CommRequest> allGatherStart(const void *send, void *recv,
                                       int64_t sendCount,
                                       ElementType type) override;
  StatusOr<CommRequest> allGatherInPlaceStart(void *buffer, int64_t count,
                                              ElementType type) override;
  /// Makes the compute stream wait for the request (a started collective's
  /// completion event; a queued send or receive is issued first, as a batch
  /// of one). Does not block the host.
  Status wait(CommRequest request) override;
  /// Nothing to drive: NCCL kernels progress on the device.
  Status progress(CommRequest) override { return Status(); }

  /// Queue the operation (nothing is issued before waitAll or wait).
  StatusOr<CommRequest> isend(const void *buffer, int64_t count,
                              ElementType type, int peer, int tag) override;
  StatusOr<CommRequest> irecv(void *buffer, int64_t count, ElementType type,
                              int peer, int tag) override;
  /// Issues the queued operations among `requests` as one group (see the
  /// file comment) and makes the compute stream wait for them and for the
  /// started collectives among `requests`. Every request is consumed, even
  /// when an error is returned.
  Status waitAll(const std::vector<CommRequest> &requests) override;
  Status issue(const std::vector<CommRequest> &requests) override;

  /// Blocks the host until every rank arrived (see the file comment).
  Status barrier() override;

  bool streamOrdered() const override { return true; }

  /// ncclCommAbort: frees the NCCL communicator at once, cancelling its
  /// in-flight (possibly hung) operations. Safe to call from another thread
  /// (the launcher's watchdog) while this one is blocked in NCCL; afterwards
  /// every operation returns Aborted. Idempotent.
  Status abort();
  /// ncclCommGetAsyncError as a Status: ok while the communicator is
  /// healthy, else the asynchronous error (a failed peer, a network error);
  /// Aborted after abort().
  Status asyncError() const;

  /// The handles (for the backend and tests).
  void *ncclComm() const { return comm; }
  void *commStream() const { return stream; }
  void *computeStream() const { return compute; }

private:
  NcclCommunicator(const NcclApi &api, void *comm, int rank, int size,
                   void *computeStream);

  /// A started collective (its completion event) or a queued point-to-point
  /// operation.
  struct Pending {
    enum class Kind { Collective, Send, Recv } kind = Kind::Collective;
    void *event = nullptr;
    void *buffer = nullptr;
    size_t count = 0;
    ElementType type = ElementType::F32;
    int peer = 0;
    int tag = 0;
  };

  Status checkUsable() const;
  /// The compute stream's work so far precedes the communication stream's
  /// next work.
  /// Checks, orders after the compute stream's work so far, issues the
  /// collective on the communication stream and counts its bytes; the
  /// blocking forms then order the compute stream after it, the started
  /// forms record its completion event (`started`).
  Status issueAllReduce(void *buffer, int64_t count, ElementType type,
                        ReduceKind op);
  /// `inPlace`: NCCL's in-place layout, `send` (all-gather) or `recv`
  /// (reduce-scatter) being the rank's block of the other.
  Status issueAllGather(const void *send, void *recv, int64_t sendCount,
                        ElementType type, bool inPlace);
  Status issueReduceScatter(const void *send, void *recv, int64_t recvCount,
                            ElementType type, ReduceKind op, bool inPlace);
  StatusOr<CommRequest> started(Status issued);
  Status orderAfterCompute();
  /// The communication stream's work so far precedes the compute stream's
  /// next work.
  Status orderBeforeCompute();
  /// An event from the pool (or a new one) recorded on the communication
  /// stream.
  StatusOr<void *> recordCompletion();
  void releaseEvent(void *event) { freeEvents.push_back(event); }
  CommRequest track(Pending pending);
  /// Issues `ops` as one NCCL group, ordered after the compute stream and
  /// before its later work.
  /// Issues `ops` as one group after the compute stream's work so far;
  /// with `orderCompute`, the compute stream's next work waits for them.
  Status issuePointToPoint(std::vector<Pending> ops, bool orderCompute = true);
  StatusOr<CommRequest> queue(Pending::Kind kind, void *buffer, int64_t count,
                              ElementType type, int peer, int tag);

  NcclApi api;
  void *comm;
  int myRank, mySize;
  void *compute;
  void *stream = nullptr;
  /// Recorded on the compute stream before each operation, and on the
  /// communication stream after each blocking one; re-recording is safe as
  /// soon as the wait on the previous record is enqueued.
  void *computeReady = nullptr, *commDone = nullptr;
  /// Every event created for started collectives, and those free to reuse.
  std::vector<void *> requestEvents, freeEvents;
  void *scratch = nullptr;
  std::atomic<bool> aborted{false};
  int64_t nextId = 0;
  std::unordered_map<int64_t, Pending> pending;
};

/// Creates the NCCL communicator over MPI_COMM_WORLD: world rank 0 creates
/// the unique id, MPI_Bcast hands it to the others, and every rank calls
/// ncclCommInitRank. The ranks agree (over MPI) on success, so none is left
/// waiting in a later collective when another failed. Collective over
/// MPI_COMM_WORLD.
StatusOr<std::unique_ptr<NcclCommunicator>>
createNcclWorldCommunicator(const NcclApi &api, void *computeStream);

/// The NCCL communicators of one rank.
struct NcclCommunicators {
  /// Over the world (the parent of the groups' splits; for barriers).
  std::unique_ptr<NcclCommunicator> world;
  /// Keyed by rank-group kind; kinds that leave this rank out get no entry.
  std::map<std::string, std::unique_ptr<NcclCommunicator>> groups;
};

/// createNcclWorldCommunicator, then for each of `kinds` in order (every
/// rank must pass the same list) ncclCommSplit of the world communicator
/// with colour = index of the artifact's instance of the kind holding this
/// rank and key = the rank's position there (no colour, and no entry, when
/// none holds it). The members of each instance are checked against the
/// artifact's group table as createMpiGroupCommunicator checks them (an MPI
/// split along the same colours and keys, whose members' world ranks are
/// all-gathered); a mismatch is a FailedPrecondition naming the kind and
/// both rank lists, returned only after every kind is split so that the
/// ranks never disagree about the collectives they enter. Collective over
/// MPI_COMM_WORLD.
///
/// A one-rank world needs no NCCL at all: every group is a one-rank
/// instance, which the executor runs on self communicators, so unless
/// `atOneRank` asks for them (a check that NCCL itself starts, e.g.
/// tessera-run's TESSERA_NCCL_ONE_RANK=1) it returns an empty set without
/// calling NCCL.
StatusOr<NcclCommunicators>
createNcclCommunicators(const NcclApi &api, void *computeStream,
                        const fb::Artifact &artifact,
                        const std::vector<std::string> &kinds,
                        bool atOneRank = false);

} // namespace tessera::rt

#endif // TESSERA_RT_NCCLCOMMUNICATOR_H
