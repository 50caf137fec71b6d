//===- RingAttention.cpp - Context-parallel attention's ring ---------------===//
//
// The RingAttention opcodes: Megatron's context parallelism passes the keys
// and values around the cp group (TransformerEngine's
// AttnFuncWithCPAndKVP2P, which Megatron's TEDotProductAttention calls with
// cp_comm_type "p2p"). At step i, cp rank r holds the K/V block of rank
// (r - i) mod cp: it posts the send of that block to the next rank and the
// receive of the following one from the previous rank, computes its
// queries against the block it holds while they are in flight (the
// backend's online-softmax step), then completes both. The backward does
// the same with the blocks' gradients travelling behind them: each rank
// adds its queries' share of dK/dV to the block's running gradient and
// passes it on, so after cp steps every block's gradient is back with the
// rank that owns it.
//
// Bytes sent per rank (CommCounters::p2p), with KV the packed K/V block of
// the rank's share (S B heads 2 D floats): forward (cp - 1) KV, backward
// (cp - 1) KV + cp KV.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Executor.h"

#include "Thunk.h"

namespace tessera::rt {

/// Message tags of the ring on the cp communicator (each exchange completes
/// within its instruction, so one tag per direction of data suffices).
static constexpr int kRingKvTag = 0;
static constexpr int kRingGradTag = 1;

static Backend::RingAttentionDims ringDims(const Thunk &t) {
  Backend::RingAttentionDims d;
  d.seq = t.i[0];
  d.batch = t.i[1];
  d.heads = t.i[2];
  d.headDim = t.i[3];
  d.causal = t.k != 0;
  d.cpRank = t.comm->rank();
  d.cpSize = t.comm->size();
  return d;
}

/// Posts the exchange of one block: `send` to the next rank of the ring,
/// `recv` from the previous one.
static Status postRing(Communicator &comm, const float *send, float *recv,
                       int64_t count, int tag,
                       std::vector<CommRequest> &requests) {
  const int n = comm.size(), r = comm.rank();
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest s, comm.isend(send, count, ElementType::F32, (r + 1) % n, tag));
  requests.push_back(s);
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest q,
      comm.irecv(recv, count, ElementType::F32, (r + n - 1) % n, tag));
  requests.push_back(q);
  return Status();
}

Status Executor::ringAttention(const Thunk &t) {
  const Backend::RingAttentionDims d = ringDims(t);
  const float *qkv = static_cast<const float *>(t.ptr[0]);
  float *w = static_cast<float *>(t.ptr[1]);
  float *o = static_cast<float *>(t.ptr[2]);
  float *lse = static_cast<float *>(t.ptr[3]);
  float *kv[2] = {w, w + d.kvBlock()};
  float *stats = w + 2 * d.kvBlock();
  const int64_t n = d.cpSize;
  TESSERA_RETURN_IF_ERROR(be->ringPackKeysValues(qkv, kv[0], d));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<CommRequest> requests;
    if (i + 1 < n) {
      TESSERA_RETURN_IF_ERROR(syncForHostComm(t));
      TESSERA_RETURN_IF_ERROR(postRing(*t.comm, kv[i % 2], kv[(i + 1) % 2],
                                       d.kvBlock(), kRingKvTag, requests));
    }
    Status st = be->ringAttentionStep(qkv, kv[i % 2], o, stats,
                                      i + 1 == n ? lse : nullptr, d,
                                      (d.cpRank - i + n) % n, i == 0);
    Status done = requests.empty() ? Status() : t.comm->waitAll(requests);
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(done);
  }
  return Status();
}

Status Executor::ringAttentionGrad(const Thunk &t) {
  const Backend::RingAttentionDims d = ringDims(t);
  auto in = [&](int i) { return static_cast<const float *>(t.ptr[i]); };
  float *w = static_cast<float *>(t.ptr[4]);
  float *dqkv = static_cast<float *>(t.ptr[5]);
  const int64_t block = d.kvBlock();
  float *kv[2] = {w, w + block};
  float *dkv[2] = {w + 2 * block, w + 3 * block};
  float *delta = w + 4 * block;
  const int64_t n = d.cpSize;
  TESSERA_RETURN_IF_ERROR(be->ringPackKeysValues(in(0), kv[0], d));
  TESSERA_RETURN_IF_ERROR(be->fill(dkv[0], 0.0f, block));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<CommRequest> requests;
    if (i + 1 < n) {
      TESSERA_RETURN_IF_ERROR(syncForHostComm(t));
      TESSERA_RETURN_IF_ERROR(postRing(*t.comm, kv[i % 2], kv[(i + 1) % 2],
                                       block, kRingKvTag, requests));
    }
    Status st = be->ringAttentionGradStep(in(0), in(1), in(2), in(3), kv[i % 2],
                                          dkv[i % 2], delta, dqkv, d,
                                          (d.cpRank - i + n) % n, i == 0);
    // The block's gradient moves on once this rank's share is in it; the
    // last exchange brings every rank its own block's.
    if (st.ok() && n > 1) {
      st = syncForHostComm(t);
      if (st.ok())
        st = postRing(*t.comm, dkv[i % 2], dkv[(i + 1) % 2], block,
                      kRingGradTag, requests);
    }
    Status done = requests.empty() ? Status() : t.comm->waitAll(requests);
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(done);
  }
  return be->ringUnpackKeyValueGrads(dkv[n > 1 ? n % 2 : 0], dqkv, d);
}

} // namespace tessera::rt
