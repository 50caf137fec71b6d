//===- Communicator.cpp - Counters and the self communicator --------------===//

#include "tessera/rt/Communicator.h"

#include <cstring>

namespace tessera::rt {

Communicator::~Communicator() = default;

int64_t elementSize(ElementType type) {
  switch (type) {
  case ElementType::F32:
  case ElementType::I32:
    return 4;
  case ElementType::I64:
  case ElementType::F64:
    return 8;
  case ElementType::BF16:
  case ElementType::F16:
    return 2;
  }
  return 0;
}

CommCounters &CommCounters::operator+=(const CommCounters &o) {
  allReduce += o.allReduce;
  allGather += o.allGather;
  reduceScatter += o.reduceScatter;
  allToAll += o.allToAll;
  p2p += o.p2p;
  calls += o.calls;
  return *this;
}

CommCounters CommCounters::operator-(const CommCounters &o) const {
  CommCounters r;
  r.allReduce = allReduce - o.allReduce;
  r.allGather = allGather - o.allGather;
  r.reduceScatter = reduceScatter - o.reduceScatter;
  r.allToAll = allToAll - o.allToAll;
  r.p2p = p2p - o.p2p;
  r.calls = calls - o.calls;
  return r;
}

void useDeviceCommunicators(
    CommunicatorSet &set,
    std::map<std::string, std::unique_ptr<Communicator>> device) {
  set.groups = std::move(device);
}

uint64_t ringAllReduceBytes(uint64_t bytes, int n) {
  return n <= 1 ? 0 : 2 * uint64_t(n - 1) * bytes / uint64_t(n);
}
uint64_t ringAllGatherBytes(uint64_t fullBytes, int n) {
  return n <= 1 ? 0 : uint64_t(n - 1) * fullBytes / uint64_t(n);
}
uint64_t ringReduceScatterBytes(uint64_t fullBytes, int n) {
  return n <= 1 ? 0 : uint64_t(n - 1) * fullBytes / uint64_t(n);
}

namespace {

/// Group of one: collectives are copies.
class SelfCommunicator final : public Communicator {
public:
  explicit SelfCommunicator(CopyFn copyFn) : copyFn(std::move(copyFn)) {}
  bool streamOrdered() const override { return bool(copyFn); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status allReduce(void *, int64_t, ElementType, ReduceKind) override {
    ++stats.calls;
    return Status();
  }
  Status allGather(const void *send, void *recv, int64_t count,
                   ElementType type) override {
    ++stats.calls;
    return copy(send, recv, count * elementSize(type));
  }
  Status reduceScatter(const void *send, void *recv, int64_t count,
                       ElementType type, ReduceKind) override {
    ++stats.calls;
    return copy(send, recv, count * elementSize(type));
  }
  Status allToAll(const void *send, void *recv, int64_t count,
                  ElementType type) override {
    ++stats.calls;
    return copy(send, recv, count * elementSize(type));
  }
  Status allToAllV(const void *send, const int64_t *sendCounts,
                   const int64_t *sendOffsets, void *recv,
                   const int64_t *recvCounts, const int64_t *recvOffsets,
                   ElementType type) override {
    ++stats.calls;
    if (sendCounts[0] != recvCounts[0])
      return invalidArgument("all-to-all of a group of one: sends ",
                             sendCounts[0], " elements but receives ",
                             recvCounts[0]);
    const int64_t es = elementSize(type);
    return copy(static_cast<const uint8_t *>(send) + sendOffsets[0] * es,
                static_cast<uint8_t *>(recv) + recvOffsets[0] * es,
                sendCounts[0] * es);
  }
  StatusOr<CommRequest> allReduceStart(void *, int64_t, ElementType,
                                       ReduceKind) override {
    ++stats.calls;
    return CommRequest{nextId++};
  }
  StatusOr<CommRequest> reduceScatterStart(const void *send, void *recv,
                                           int64_t count, ElementType type,
                                           ReduceKind op) override {
    TESSERA_RETURN_IF_ERROR(reduceScatter(send, recv, count, type, op));
    return CommRequest{nextId++};
  }
  // One block: it is the whole buffer, already in place.
  Status allGatherInPlace(void *, int64_t, ElementType) override {
    ++stats.calls;
    return Status();
  }
  Status reduceScatterInPlace(void *, int64_t, ElementType,
                              ReduceKind) override {
    ++stats.calls;
    return Status();
  }
  StatusOr<CommRequest> reduceScatterInPlaceStart(void *, int64_t, ElementType,
                                                  ReduceKind) override {
    ++stats.calls;
    return CommRequest{nextId++};
  }
  StatusOr<CommRequest> allGatherStart(const void *send, void *recv,
                                       int64_t count,
                                       ElementType type) override {
    TESSERA_RETURN_IF_ERROR(allGather(send, recv, count, type));
    return CommRequest{nextId++};
  }
  StatusOr<CommRequest> allGatherInPlaceStart(void *, int64_t,
                                              ElementType) override {
    ++stats.calls;
    return CommRequest{nextId++};
  }
  Status wait(CommRequest request) override {
    if (request.id < 0 || request.id >= nextId)
      return invalidArgument("wait on unknown request ", request.id);
    return Status();
  }
  StatusOr<CommRequest> isend(const void *, int64_t, ElementType, int peer,
                              int tag) override {
    return noPeer("send to", peer, tag);
  }
  StatusOr<CommRequest> irecv(void *, int64_t, ElementType, int peer,
                              int tag) override {
    return noPeer("receive from", peer, tag);
  }
  Status waitAll(const std::vector<CommRequest> &requests) override {
    if (!requests.empty())
      return failedPrecondition("waitAll on a group of one rank, which has no "
                                "point-to-point requests");
    return Status();
  }
  Status barrier() override { return Status(); }

private:
  Status copy(const void *src, void *dst, int64_t bytes) {
    if (src == dst || bytes == 0)
      return Status();
    if (copyFn)
      return copyFn(src, dst, bytes);
    std::memmove(dst, src, size_t(bytes));
    return Status();
  }
  static Status noPeer(const char *what, int peer, int tag) {
    return failedPrecondition(
        "point-to-point ", what, " peer ", peer, " (tag ", tag,
        ") on a group of one rank: a pipeline needs a group of more than one "
        "rank");
  }

  CopyFn copyFn;
  int64_t nextId = 0;
};

} // namespace

std::unique_ptr<Communicator> createSelfCommunicator(CopyFn copy) {
  return std::make_unique<SelfCommunicator>(std::move(copy));
}

} // namespace tessera::rt
