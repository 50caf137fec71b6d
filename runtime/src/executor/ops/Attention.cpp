//===- Attention.cpp - Attention, grouped-query and ring attention --------===//
//
// Decode and run functions (Ops.h) of self-attention over a fused QKV
// [S, B, heads * 3 * head_dim] (causal or not), of grouped-query
// attention's repeat of each group's K/V for its heads (Megatron's
// DotProductAttention repeat_interleave, Hugging Face's repeat_kv) and its
// gradient, and of context parallelism's ring attention.
//
// Ring attention: Megatron's context parallelism passes the keys and values
// around the cp group (TransformerEngine's AttnFuncWithCPAndKVP2P, which
// Megatron's TEDotProductAttention calls with cp_comm_type "p2p"). At step
// i, cp rank r holds the K/V block of rank (r - i) mod cp: it posts the send
// of that block to the next rank and the receive of the following one from
// the previous rank, computes its queries against the block it holds while
// they are in flight (the backend's online-softmax step), then completes
// both. The backward does the same with the blocks' gradients travelling
// behind them: each rank adds its queries' share of dK/dV to the block's
// running gradient and passes it on, so after cp steps every block's
// gradient is back with the rank that owns it.
//
// Bytes sent per rank (CommCounters::p2p), with KV the packed K/V block of
// the rank's share (S B heads 2 D values): forward (cp - 1) KV, backward
// (cp - 1) KV + cp KV. Under bf16 activations QKV is a bf16 activation
// widened for the kernels (kv_format BF16), so its K/V blocks travel in
// bf16, exactly and in half the bytes, and are widened again on arrival;
// the dK/dV blocks stay f32, since each rank adds its share on the way
// (rounding them per hop would round cp times).
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <cstdint>

namespace tessera::rt::ops {

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// Attention [QKV, O] and AttentionGrad [QKV, dO, dQKV]; iattrs [heads,
/// causal]: i = [S, B, heads, head_dim], k = causal.
static Status decodeAttentionOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                bool grad) {
  const int out = 1; // O (or dO)
  if (d.rankOf(in, 0) != 3 || d.rankOf(in, out) != 3)
    return invalidArgument("QKV ", d.desc(in, 0), " and ", grad ? "dO " : "O ",
                           d.desc(in, out), " must be [S, B, features]");
  int64_t heads = d.iattr(in, 0);
  int64_t f = d.dim(in, out, 2), f3 = 0;
  if (d.dim(in, 0, 0) != d.dim(in, out, 0) ||
      d.dim(in, 0, 1) != d.dim(in, out, 1) ||
      __builtin_mul_overflow(f, 3, &f3) || d.dim(in, 0, 2) != f3)
    return invalidArgument("QKV ", d.desc(in, 0), " must be [S, B, 3 * ", f,
                           "] for ", grad ? "dO " : "O ", d.desc(in, out));
  if (heads <= 0 || heads > INT64_MAX / 3 || d.dim(in, 0, 2) % (3 * heads) != 0)
    return invalidArgument("the last dimension of QKV ", d.desc(in, 0),
                           " is not divisible by 3 * num_heads (", heads, ")");
  if (grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 2}));
  t.i[0] = d.dim(in, 0, 0);
  t.i[1] = d.dim(in, 0, 1);
  t.i[2] = heads;
  t.i[3] = f / heads;
  t.k = d.iattr(in, 1);
  return Status();
}

Status decodeAttention(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAttentionOp(d, in, t, false);
}

Status runAttention(RunContext &x, const Thunk &t) {
  return x.backend().attention(f32(t, 0), f32(t, 1), t.i[0], t.i[1], t.i[2],
                               t.i[3], t.k != 0);
}

Status decodeAttentionGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAttentionOp(d, in, t, true);
}

Status runAttentionGrad(RunContext &x, const Thunk &t) {
  return x.backend().attentionGrad(f32(t, 0), f32(t, 1), f32(t, 2), t.i[0],
                                   t.i[1], t.i[2], t.i[3], t.k != 0);
}

//===----------------------------------------------------------------------===//
// Grouped-query attention
//===----------------------------------------------------------------------===//

Status decodeGroupedQkv(Decoder &d, const fb::Instr &in, int grouped,
                        Thunk &t) {
  const int64_t heads = d.iattr(in, 0), groups = d.iattr(in, 1);
  if (heads < 1 || groups < 1 || heads % groups != 0)
    return invalidArgument("num_heads ", heads,
                           " must be a positive multiple of num_query_groups ",
                           groups);
  TESSERA_ASSIGN_OR_RETURN(Matrix g, d.rowsCols(in, grouped));
  const int64_t per = heads + 2 * groups, headDim = g.cols / per;
  if (headDim < 1 || g.cols != per * headDim)
    return invalidArgument("grouped qkv ", d.desc(in, grouped),
                           " must be [rows, ", groups, " x (", heads / groups,
                           " + 2) x head_dim]");
  t.m = g.rows;
  t.n = headDim;
  t.i[0] = heads;
  t.i[1] = groups;
  return Status();
}

/// RepeatKV [X (grouped), Y (head-major)] and RepeatKVGrad [dY (head-major),
/// dX (grouped)].
static Status decodeRepeatKVOp(Decoder &d, const fb::Instr &in, Thunk &t,
                               bool grad) {
  TESSERA_RETURN_IF_ERROR(decodeGroupedQkv(d, in, grad ? 1 : 0, t));
  const int headMajor = grad ? 0 : 1;
  if (d.numel(in, headMajor) != t.m * t.i[0] * 3 * t.n)
    return invalidArgument("head-major ", d.desc(in, headMajor),
                           " must be [rows, ", t.i[0], " x 3 x head_dim ", t.n,
                           "]");
  return Status();
}

Status decodeRepeatKV(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRepeatKVOp(d, in, t, false);
}

Status runRepeatKV(RunContext &x, const Thunk &t) {
  return x.backend().repeatKV(floatIn(t, 0), floatOut(t, 1), t.m, t.i[0],
                              t.i[1], t.n);
}

Status decodeRepeatKVGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRepeatKVOp(d, in, t, true);
}

Status runRepeatKVGrad(RunContext &x, const Thunk &t) {
  return x.backend().repeatKVGrad(floatIn(t, 0), floatOut(t, 1), t.m, t.i[0],
                                  t.i[1],
                                  t.n);
}

//===----------------------------------------------------------------------===//
// Ring attention
//===----------------------------------------------------------------------===//

/// RingAttention [QKV, W, O, LSE] and RingAttentionGrad [QKV, O, LSE, dO, W,
/// dQKV] over the cp group, iattrs [heads, causal, kv_format]; i = [S, B,
/// heads, head_dim], k = causal, type = the K/V blocks' format on the ring.
static Status decodeRingAttentionOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                    bool grad) {
  const int o = grad ? 1 : 2, lse = grad ? 2 : 3, w = grad ? 4 : 1;
  if (d.rankOf(in, 0) != 3 || d.rankOf(in, o) != 3 || d.rankOf(in, lse) != 3)
    return invalidArgument("QKV ", d.desc(in, 0), ", O ", d.desc(in, o),
                           " and LSE ", d.desc(in, lse),
                           " must be [S, B, features]");
  int64_t heads = d.iattr(in, 0);
  int64_t f = d.dim(in, o, 2), f3 = 0;
  if (heads <= 0 || heads > INT64_MAX / 3 || f % heads != 0 ||
      __builtin_mul_overflow(f, 3, &f3) || d.dim(in, 0, 2) != f3 ||
      d.dim(in, 0, 0) != d.dim(in, o, 0) || d.dim(in, 0, 1) != d.dim(in, o, 1))
    return invalidArgument("QKV ", d.desc(in, 0), " must be [S, B, 3 * ", f,
                           "] with ", f, " divisible by num_heads (", heads,
                           ") for O ", d.desc(in, o));
  if (d.dim(in, lse, 0) != d.dim(in, 0, 0) ||
      d.dim(in, lse, 1) != d.dim(in, 0, 1) || d.dim(in, lse, 2) != heads)
    return invalidArgument("LSE ", d.desc(in, lse), " must be [",
                           d.dim(in, 0, 0), ", ", d.dim(in, 0, 1), ", ", heads,
                           "]");
  if (grad) {
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {1, 3}));
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 5}));
  }
  if (d.dim(in, 0, 0) % 2 != 0)
    return invalidArgument("ring attention needs an even local sequence "
                           "(two chunks), got ",
                           d.desc(in, 0));
  Backend::RingAttentionDims dims;
  dims.seq = d.dim(in, 0, 0);
  dims.batch = d.dim(in, 0, 1);
  dims.heads = heads;
  dims.headDim = f / heads;
  int64_t need = grad ? dims.backwardWorkspace() : dims.forwardWorkspace();
  if (d.numel(in, w) < need)
    return invalidArgument("workspace W ", d.desc(in, w),
                           " holds fewer than the ",
                           need, " floats ring attention needs");
  t.i[0] = dims.seq;
  t.i[1] = dims.batch;
  t.i[2] = heads;
  t.i[3] = dims.headDim;
  t.k = d.iattr(in, 1);
  const int64_t wire = d.iattr(in, 2);
  if (wire < 0 || wire > int64_t(FloatFormat::F16))
    return invalidArgument("kv_format ", wire,
                           " is not a float format (0 F32, 1 BF16, 2 F16)");
  t.type = wire == int64_t(FloatFormat::BF16)  ? ElementType::BF16
           : wire == int64_t(FloatFormat::F16) ? ElementType::F16
                                               : ElementType::F32;
  const std::string kind = in.group()->str();
  if (!d.position(kind).group && d.rank() >= 0)
    return invalidArgument("rank ", d.rank(), " is in no rank group of kind '",
                           kind,
                           "', but its program has ring attention "
                           "over it");
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator(kind));
  return Status();
}

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

/// Posts the exchange of one block of `count` values of `type`: `send` to
/// the next rank of the ring, `recv` from the previous one.
static Status postRing(Communicator &comm, const void *send, void *recv,
                       int64_t count, ElementType type, int tag,
                       std::vector<CommRequest> &requests) {
  const int n = comm.size(), r = comm.rank();
  TESSERA_ASSIGN_OR_RETURN(CommRequest s,
                           comm.isend(send, count, type, (r + 1) % n, tag));
  requests.push_back(s);
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest q, comm.irecv(recv, count, type, (r + n - 1) % n, tag));
  requests.push_back(q);
  return Status();
}

/// The K/V blocks of one ring: the f32 block the step kernels read and the
/// two blocks in flight, which are those f32 blocks themselves when K/V
/// travel in f32, or two 16-bit blocks in the place of the second f32 one
/// (RingAttentionDims' workspace), widened into the first on arrival.
struct RingBlocks {
  ElementType wire = ElementType::F32;
  FloatFormat format = FloatFormat::F32;
  float *f32[2] = {};
  void *flight[2] = {};
  int64_t count = 0;

  RingBlocks(const Thunk &t, float *w, int64_t block) : wire(t.type) {
    count = block;
    f32[0] = w;
    f32[1] = w + block;
    if (wire == ElementType::F32) {
      flight[0] = f32[0];
      flight[1] = f32[1];
      return;
    }
    format = wire == ElementType::BF16 ? FloatFormat::BF16 : FloatFormat::F16;
    auto *half = reinterpret_cast<uint16_t *>(w + block);
    flight[0] = half;
    flight[1] = half + block;
  }
  bool half() const { return wire != ElementType::F32; }
  /// The block step `i` computes with (the f32 one it was widened into).
  const float *atStep(int64_t i) const { return half() ? f32[0] : f32[i % 2]; }
  /// Packs this rank's block from QKV and, for the ring, rounds it into
  /// the first block in flight (exact: QKV holds values of that format).
  Status pack(Backend &be, const float *qkv,
              const Backend::RingAttentionDims &d, bool sends) const {
    TESSERA_RETURN_IF_ERROR(be.ringPackKeysValues(qkv, f32[0], d));
    if (half() && sends)
      return be.cast(f32[0], FloatFormat::F32, flight[0], format, count, 0.0f);
    return Status();
  }
  /// Before step i > 0: widens the block that arrived for it.
  Status arrived(Backend &be, int64_t i) const {
    if (!half() || i == 0)
      return Status();
    return be.cast(flight[i % 2], format, f32[0], FloatFormat::F32, count,
                   0.0f);
  }
  Status post(Communicator &comm, int64_t i,
              std::vector<CommRequest> &requests) const {
    return postRing(comm, flight[i % 2], flight[(i + 1) % 2], count, wire,
                    kRingKvTag, requests);
  }
};

Status decodeRingAttention(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRingAttentionOp(d, in, t, false);
}

Status runRingAttention(RunContext &x, const Thunk &t) {
  Backend &be = x.backend();
  const Backend::RingAttentionDims d = ringDims(t);
  const float *qkv = f32(t, 0);
  float *w = f32(t, 1);
  float *o = f32(t, 2);
  float *lse = f32(t, 3);
  const RingBlocks kv(t, w, d.kvBlock());
  float *stats = w + 2 * d.kvBlock();
  const int64_t n = d.cpSize;
  TESSERA_RETURN_IF_ERROR(kv.pack(be, qkv, d, n > 1));
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_RETURN_IF_ERROR(kv.arrived(be, i));
    std::vector<CommRequest> requests;
    if (i + 1 < n) {
      TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
      TESSERA_RETURN_IF_ERROR(kv.post(*t.comm, i, requests));
    }
    Status st = be.ringAttentionStep(qkv, kv.atStep(i), o, stats,
                                     i + 1 == n ? lse : nullptr, d,
                                     (d.cpRank - i + n) % n, i == 0);
    Status done = requests.empty() ? Status() : t.comm->waitAll(requests);
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(done);
  }
  return Status();
}

Status decodeRingAttentionGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRingAttentionOp(d, in, t, true);
}

Status runRingAttentionGrad(RunContext &x, const Thunk &t) {
  Backend &be = x.backend();
  const Backend::RingAttentionDims d = ringDims(t);
  float *w = f32(t, 4);
  float *dqkv = f32(t, 5);
  const int64_t block = d.kvBlock();
  const RingBlocks kv(t, w, block);
  float *dkv[2] = {w + 2 * block, w + 3 * block};
  float *delta = w + 4 * block;
  const int64_t n = d.cpSize;
  TESSERA_RETURN_IF_ERROR(kv.pack(be, f32(t, 0), d, n > 1));
  TESSERA_RETURN_IF_ERROR(be.fill(dkv[0], 0.0f, block));
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_RETURN_IF_ERROR(kv.arrived(be, i));
    std::vector<CommRequest> requests;
    if (i + 1 < n) {
      TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
      TESSERA_RETURN_IF_ERROR(kv.post(*t.comm, i, requests));
    }
    Status st = be.ringAttentionGradStep(
        f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3), kv.atStep(i), dkv[i % 2],
        delta, dqkv, d, (d.cpRank - i + n) % n, i == 0);
    // The block's gradient moves on once this rank's share is in it; the
    // last exchange brings every rank its own block's.
    if (st.ok() && n > 1) {
      st = x.syncForHostComm(t);
      if (st.ok())
        st = postRing(*t.comm, dkv[i % 2], dkv[(i + 1) % 2], block,
                      ElementType::F32, kRingGradTag, requests);
    }
    Status done = requests.empty() ? Status() : t.comm->waitAll(requests);
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(done);
  }
  return be.ringUnpackKeyValueGrads(dkv[n > 1 ? n % 2 : 0], dqkv, d);
}

} // namespace tessera::rt::ops
