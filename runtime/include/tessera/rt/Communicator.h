//===- Communicator.h - Collective communication interface ------*- C++ -*-===//
//
// A channel over one rank-group instance (IREE hal/channel style). The MPI
// implementation lives in MpiCommunicator.h; a size-1 "self" communicator
// that needs no MPI is available for single-rank runs and tests.
//
// Every communicator counts the bytes it sends per collective kind using the
// standard ring volume (n = group size, B = bytes of the full buffer):
//   all-reduce      2 (n - 1) / n * B
//   all-gather      (n - 1) / n * B   (B = gathered output)
//   reduce-scatter  (n - 1) / n * B   (B = unreduced input)
//   all-to-all      (n - 1) / n * B   (B = the whole send buffer)
// and, for point-to-point (pipeline) traffic, the bytes of every isend.
// Byte counts use the element size of the buffer's type (2 for bf16, f16).
//
// Reductions of bf16 and f16 buffers are sums only: each pair of partial
// sums is added in f32 and rounded to the format (nearest even, BF16.h);
// ReduceKind::Max on them is Unimplemented over MPI (NCCL has it).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_COMMUNICATOR_H
#define TESSERA_RT_COMMUNICATOR_H

#include "tessera/rt/Status.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::rt {

/// Element type of a collective buffer.
enum class ElementType { F32, I32, I64, BF16, F64, F16 };
/// Reduction of all-reduce / reduce-scatter.
enum class ReduceKind { Sum, Max };

int64_t elementSize(ElementType type);

/// Bytes sent per collective kind.
struct CommCounters {
  uint64_t allReduce = 0;
  uint64_t allGather = 0;
  uint64_t reduceScatter = 0;
  uint64_t allToAll = 0;
  /// Point-to-point bytes sent (isend), e.g. pipeline activations.
  uint64_t p2p = 0;
  /// Collectives started plus point-to-point operations posted.
  uint64_t calls = 0;

  CommCounters &operator+=(const CommCounters &o);
  CommCounters operator-(const CommCounters &o) const;
  uint64_t total() const {
    return allReduce + allGather + reduceScatter + allToAll + p2p;
  }
};

/// Ring volumes (see file comment).
uint64_t ringAllReduceBytes(uint64_t bytes, int n);
uint64_t ringAllGatherBytes(uint64_t fullBytes, int n);
uint64_t ringReduceScatterBytes(uint64_t fullBytes, int n);

/// Handle of an in-flight asynchronous collective or point-to-point
/// operation.
struct CommRequest {
  int64_t id = -1;
};

/// Collective channel over one group of ranks.
class Communicator {
public:
  virtual ~Communicator();

  /// This rank's position in the group, and the group size.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// In-place all-reduce of `count` elements.
  virtual Status allReduce(void *buffer, int64_t count, ElementType type,
                           ReduceKind op) = 0;
  /// recv = concat over ranks of send (`sendCount` elements each).
  virtual Status allGather(const void *send, void *recv, int64_t sendCount,
                           ElementType type) = 0;
  /// recv = this rank's `recvCount`-element slice of the reduction of send
  /// (send holds size() * recvCount elements).
  virtual Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                               ElementType type, ReduceKind op) = 0;
  /// The equal-split all-to-all (MPI_Alltoall, Megatron's all_to_all with
  /// equal splits): send and recv hold size() blocks of `count` elements;
  /// block i of send goes to rank i, and block j of recv comes from rank j.
  /// The buffers must not overlap.
  virtual Status allToAll(const void *send, void *recv, int64_t count,
                          ElementType type) = 0;
  /// The all-to-all with per-rank counts (MPI_Alltoallv; expert
  /// parallelism's dropless token exchange): sendCounts[i] elements from
  /// send + sendOffsets[i] go to rank i, and recvCounts[j] elements from
  /// rank j land at recv + recvOffsets[j] (counts and offsets in elements,
  /// size() entries each, host memory). Counts the bytes sent to the other
  /// ranks.
  virtual Status allToAllV(const void *send, const int64_t *sendCounts,
                           const int64_t *sendOffsets, void *recv,
                           const int64_t *recvCounts,
                           const int64_t *recvOffsets, ElementType type) = 0;
  /// Starts an in-place all-reduce; complete it with wait().
  virtual StatusOr<CommRequest> allReduceStart(void *buffer, int64_t count,
                                               ElementType type,
                                               ReduceKind op) = 0;
  virtual Status wait(CommRequest request) = 0;
  /// Starts reduceScatter; complete it with wait(). Neither buffer may be
  /// touched until then.
  virtual StatusOr<CommRequest> reduceScatterStart(const void *send, void *recv,
                                                   int64_t recvCount,
                                                   ElementType type,
                                                   ReduceKind op) = 0;
  /// In-place forms (the distributed optimizer's buckets, Megatron's
  /// layout): `buffer` holds size() blocks of `count` elements, block r at
  /// buffer + r * count elements. They count the same bytes as the
  /// out-of-place forms; NCCL supports exactly these layouts natively
  /// (sendbuff = recvbuff + rank * count for all-gather, recvbuff = sendbuff
  /// + rank * count for reduce-scatter).
  ///
  /// allGather whose input is this rank's block of `buffer`.
  virtual Status allGatherInPlace(void *buffer, int64_t count,
                                  ElementType type) = 0;
  /// reduceScatter of the whole `buffer` into this rank's block of it; the
  /// other blocks are undefined afterwards.
  virtual Status reduceScatterInPlace(void *buffer, int64_t count,
                                      ElementType type, ReduceKind op) = 0;
  /// Starts reduceScatterInPlace; the result is in this rank's block once
  /// wait() (or waitAll()) returns, and no part of `buffer` may be touched
  /// until then.
  virtual StatusOr<CommRequest> reduceScatterInPlaceStart(void *buffer,
                                                          int64_t count,
                                                          ElementType type,
                                                          ReduceKind op) = 0;
  /// Starts allGather, or allGatherInPlace (Megatron's overlap_param_gather:
  /// the distributed optimizer's parameter all-gather, finished by the next
  /// forward); the output is complete once wait() returns, and no part of
  /// either buffer may be touched until then.
  virtual StatusOr<CommRequest> allGatherStart(const void *send, void *recv,
                                               int64_t sendCount,
                                               ElementType type) = 0;
  virtual StatusOr<CommRequest> allGatherInPlaceStart(void *buffer,
                                                      int64_t count,
                                                      ElementType type) = 0;
  /// Drives an in-flight request without blocking (MPI's non-blocking
  /// collectives advance only inside MPI calls, so the executor calls this
  /// between kernels to let a started reduction overlap computation). The
  /// request stays valid for wait(). Default: nothing to drive.
  virtual Status progress(CommRequest request) { return Status(); }
  /// Starts point-to-point requests a backend queues until their wait
  /// (NCCL, which issues a batch as one group) now, without making the
  /// computation wait for them; waiting for them later still completes
  /// them. Nothing to do where they started when posted (MPI).
  virtual Status issue(const std::vector<CommRequest> &requests) {
    return Status();
  }

  /// Point-to-point (pipeline stages). `peer` is a rank index within this
  /// group (0 <= peer < size()) and `tag` a non-negative message tag; a send
  /// matches the receive of the same tag posted by its peer. Neither blocks:
  /// complete them with waitAll() (or wait()) and do not touch the buffer
  /// before. isend counts count * elementSize(type) bytes in counters().p2p.
  /// The self communicator has no peer and returns FailedPrecondition.
  virtual StatusOr<CommRequest> isend(const void *buffer, int64_t count,
                                      ElementType type, int peer, int tag) = 0;
  virtual StatusOr<CommRequest> irecv(void *buffer, int64_t count,
                                      ElementType type, int peer, int tag) = 0;
  /// Completes all of `requests` together (MPI_Waitall), so a batch that
  /// both sends to and receives from a peer that does the same cannot
  /// deadlock. Every request is consumed, even when an error is returned.
  virtual Status waitAll(const std::vector<CommRequest> &requests) = 0;

  /// Blocks until every rank of the group arrives.
  virtual Status barrier() = 0;

  /// True when collectives are ordered on the backend's compute stream, so
  /// the executor must not synchronise the backend before them (NCCL); false
  /// when they read and write host-visible memory at the call (MPI, self).
  virtual bool streamOrdered() const { return false; }

  const CommCounters &counters() const { return stats; }
  /// Moves `bytes` counted as point-to-point to the collective a ring of
  /// isends carried out (`kind`: &CommCounters::allGather, ...: the fused
  /// GEMMs of --tp-comm-overlap), so that the counters name the exchange.
  void countP2pAs(uint64_t CommCounters::*kind, uint64_t bytes) {
    bytes = std::min(bytes, stats.p2p);
    stats.p2p -= bytes;
    stats.*kind += bytes;
  }
  void resetCounters() { stats = CommCounters(); }

protected:
  CommCounters stats;
};

/// Copies `bytes` bytes from `src` to `dst` (regions may overlap).
using CopyFn = std::function<Status(const void *src, void *dst, int64_t bytes)>;

/// A communicator for a group of one rank (no MPI needed). Its collectives
/// are copies (or nothing, in place); with `copy` (a backend's copy, which
/// may run on its stream) they go through it and the communicator is
/// stream-ordered, otherwise they are host memmoves.
std::unique_ptr<Communicator> createSelfCommunicator(CopyFn copy = nullptr);

/// Communicators of one rank, keyed by rank-group kind ("tp", "dp", ...).
struct CommunicatorSet {
  std::map<std::string, std::unique_ptr<Communicator>> groups;
  /// A separate channel over the dp group used only to average the reported
  /// loss, so that reporting traffic is not counted. May be null.
  std::unique_ptr<Communicator> lossReduce;
  /// The same over the pp group: pipeline stages sum their share of the
  /// reported loss (only the stage that computes it has one). May be null
  /// (then a pipeline with more than one stage cannot report its loss).
  std::unique_ptr<Communicator> lossReducePp;
  /// The whole world (for barriers). May be null.
  std::unique_ptr<Communicator> world;
};

/// A device backend's rank groups in `set`: every group communicator is
/// replaced by the backend's (`device`, e.g. NCCL's), and a kind it has none
/// for keeps none, since the MPI communicators read and write host memory
/// only; the executor then runs a one-rank group on a self communicator
/// that copies through the backend (a one-rank run needs no NCCL), and
/// refuses a larger one. The loss channels and the world stay MPI's: they
/// carry host values.
void useDeviceCommunicators(
    CommunicatorSet &set,
    std::map<std::string, std::unique_ptr<Communicator>> device);

} // namespace tessera::rt

#endif // TESSERA_RT_COMMUNICATOR_H
