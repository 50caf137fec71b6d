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
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_COMMUNICATOR_H
#define TESSERA_RT_COMMUNICATOR_H

#include "tessera/rt/Status.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace tessera::rt {

/// Element type of a collective buffer.
enum class ElementType { F32, I32, I64, BF16, F64 };
/// Reduction of all-reduce / reduce-scatter.
enum class ReduceKind { Sum, Max };

int64_t elementSize(ElementType type);

/// Bytes sent per collective kind.
struct CommCounters {
  uint64_t allReduce = 0;
  uint64_t allGather = 0;
  uint64_t reduceScatter = 0;
  uint64_t calls = 0;

  CommCounters &operator+=(const CommCounters &o);
  CommCounters operator-(const CommCounters &o) const;
  uint64_t total() const { return allReduce + allGather + reduceScatter; }
};

/// Ring volumes (see file comment).
uint64_t ringAllReduceBytes(uint64_t bytes, int n);
uint64_t ringAllGatherBytes(uint64_t fullBytes, int n);
uint64_t ringReduceScatterBytes(uint64_t fullBytes, int n);

/// Handle of an in-flight asynchronous collective.
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
  /// Starts an in-place all-reduce; complete it with wait().
  virtual StatusOr<CommRequest> allReduceStart(void *buffer, int64_t count,
                                               ElementType type,
                                               ReduceKind op) = 0;
  virtual Status wait(CommRequest request) = 0;
  /// Blocks until every rank of the group arrives.
  virtual Status barrier() = 0;

  const CommCounters &counters() const { return stats; }
  void resetCounters() { stats = CommCounters(); }

protected:
  CommCounters stats;
};

/// A communicator for a group of one rank (no MPI needed).
std::unique_ptr<Communicator> createSelfCommunicator();

/// Communicators of one rank, keyed by rank-group kind ("tp", "dp", ...).
struct CommunicatorSet {
  std::map<std::string, std::unique_ptr<Communicator>> groups;
  /// A separate channel over the dp group used only to average the reported
  /// loss, so that reporting traffic is not counted. May be null.
  std::unique_ptr<Communicator> lossReduce;
  /// The whole world (for barriers). May be null.
  std::unique_ptr<Communicator> world;
};

} // namespace tessera::rt

#endif // TESSERA_RT_COMMUNICATOR_H
