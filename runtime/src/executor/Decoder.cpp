//===- Decoder.cpp - Instructions to thunks, and pre-launch checks --------===//
//
// The decoder of Decoder.h: per opcode, the shape rules that tie an
// instruction's operands together (the loader checked counts, dtypes and
// attributes against tessera/rt/Opcodes.def), the group positions of
// rank-relative operands, in-place collectives and vocabulary shards, and
// the communicator each collective binds. Also Executor::validate, which
// decodes every program at every rank's positions before tessera-run
// launches anything.
//
//===----------------------------------------------------------------------===//

#include "Decoder.h"

#include <cmath>

#include "tessera/rt/Executor.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>

namespace tessera::rt {

static StatusOr<ElementType> elementTypeOf(fb::DType t) {
  switch (t) {
  case fb::DType::F32:
    return ElementType::F32;
  case fb::DType::I32:
    return ElementType::I32;
  case fb::DType::I64:
    return ElementType::I64;
  case fb::DType::BF16:
    return ElementType::BF16;
  }
  return invalidArgument("unknown dtype");
}

/// Size of the first instance of `kind` (instances have equal sizes), or 1.
int anyGroupSize(const fb::Artifact &artifact, std::string_view kind) {
  if (artifact.groups())
    for (const fb::RankGroup *g : *artifact.groups())
      if (g->kind() && g->kind()->string_view() == kind && g->ranks())
        return int(g->ranks()->size());
  return 1;
}

/// The arena offset of `r` on world rank `worldRank`: its offset, moved by
/// rank_stride per index of the rank in its instance of rank_group when the
/// ref is rank-relative (a bucket shard of the distributed optimizer). With
/// `worldRank` < 0 (no rank in particular) index 0 is used; the loader has
/// checked every index's placement, and Executor::validate decodes at every
/// rank's index. A rank that no instance of the kind holds (embedding kinds)
/// has no index: an error.
StatusOr<int64_t> resolvedOffset(const fb::Artifact &artifact,
                                 const fb::TensorRef &r, int worldRank) {
  if (!r.rank_group() || r.rank_group()->size() == 0 || worldRank < 0)
    return r.offset();
  std::string kind = r.rank_group()->str();
  GroupPosition pos = findGroupPosition(artifact, kind, worldRank);
  if (!pos.group)
    return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                           kind, "', to which the operand is relative");
  return r.offset() + int64_t(pos.index) * r.rank_stride();
}

Status Decoder::decodeInstr(const fb::Instr &in, Thunk &t) {
  using O = fb::Opcode;
  t.op = in.op();
  t.transA = in.trans_a();
  t.transB = in.trans_b();
  t.alpha = in.alpha();
  t.beta = in.beta();
  t.event = in.event();
  t.group = in.group() ? in.group()->str() : std::string();
  t.reduce =
      in.reduce() == fb::ReduceOp::Max ? ReduceKind::Max : ReduceKind::Sum;
  if (in.fattrs())
    for (flatbuffers::uoffset_t i = 0; i < in.fattrs()->size() && i < 5; ++i)
      t.f[i] = in.fattrs()->Get(i);
  int count = in.operands() ? int(in.operands()->size()) : 0;
  for (int i = 0; i < count; ++i)
    t.ptr[i] = ptrOf(i);
  if (count)
    t.n = numel(ref(in, 0));
  if (opcodeInfo(in.op()).has(Runs))
    TESSERA_RETURN_IF_ERROR(decodeRuns(in, t));

  switch (in.op()) {
  case O::Gemm: {
    TESSERA_ASSIGN_OR_RETURN(Matrix a, matrix(in, 0));
    TESSERA_ASSIGN_OR_RETURN(Matrix b, matrix(in, 1));
    TESSERA_ASSIGN_OR_RETURN(Matrix c, matrix(in, 2));
    int64_t m = t.transA ? a.cols : a.rows, ka = t.transA ? a.rows : a.cols;
    int64_t kb = t.transB ? b.cols : b.rows, n = t.transB ? b.rows : b.cols;
    if (ka != kb || c.rows != m || c.cols != n)
      return invalidArgument("shape mismatch: op(A) is [", m, ", ", ka, "] (A ",
                             desc(ref(in, 0)), t.transA ? " transposed" : "",
                             "), op(B) is [", kb, ", ", n, "] (B ",
                             desc(ref(in, 1)), t.transB ? " transposed" : "",
                             "), C is ", desc(ref(in, 2)));
    t.m = m;
    t.n = n;
    t.k = ka;
    // A and B share a dtype (the validator's SameFloatDType).
    t.type = isBf16(in, 0) ? ElementType::BF16 : ElementType::F32;
    return Status();
  }
  case O::BiasAdd: {
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2}));
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    if (numel(ref(in, 1)) != x.cols)
      return invalidArgument("bias ", desc(ref(in, 1)),
                             " does not match the last dimension of ",
                             desc(ref(in, 0)));
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::BiasGelu:
  case O::BiasGeluGrad: {
    bool grad = in.op() == O::BiasGeluGrad;
    TESSERA_RETURN_IF_ERROR(
        grad ? requireSameNumel(in, {0, 2, 3}) : requireSameNumel(in, {0, 2}));
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    for (int i = 1; i <= (grad ? 4 : 1); i += 3)
      if (numel(ref(in, i)) != x.cols)
        return invalidArgument(i == 1 ? "bias " : "bias gradient ",
                               desc(ref(in, i)),
                               " does not match the last dimension of ",
                               desc(ref(in, 0)));
    t.m = x.rows;
    t.n = x.cols;
    t.i[0] = in.iattrs()->Get(0);
    return Status();
  }
  case O::SwiGLU:
  case O::SwiGLUGrad: {
    // X [rows, 2n] (gate | up per row); Y or dY [rows, n]; dX as X.
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    if (x.cols % 2 != 0 || numel(ref(in, 1)) * 2 != numel(ref(in, 0)))
      return invalidArgument(
          "SwiGLU input ", desc(ref(in, 0)),
          " must be [rows, 2n] (gate and up side by side) and ",
          in.op() == O::SwiGLU ? "Y " : "dY ", desc(ref(in, 1)),
          " [rows, n]");
    if (in.op() == O::SwiGLUGrad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2}));
    t.m = x.rows;
    t.n = x.cols / 2;
    return Status();
  }
  case O::RepeatKV:
  case O::RepeatKVGrad: {
    // The grouped side is operand 0 of RepeatKV and 1 of its gradient.
    const bool grad = in.op() == O::RepeatKVGrad;
    TESSERA_RETURN_IF_ERROR(decodeGroupedQkv(in, grad ? 1 : 0, t));
    if (numel(ref(in, grad ? 0 : 1)) != t.m * t.i[0] * 3 * t.n)
      return invalidArgument("head-major ", desc(ref(in, grad ? 0 : 1)),
                             " must be [rows, ", t.i[0], " x 3 x head_dim ",
                             t.n, "]");
    return Status();
  }
  case O::QKNorm:
  case O::QKNormGrad: {
    // f[0] eps; the weights are [head_dim].
    const bool grad = in.op() == O::QKNormGrad;
    TESSERA_RETURN_IF_ERROR(decodeGroupedQkv(in, 0, t));
    const int64_t d = t.n;
    const int weights[] = {1, 2, 5, 6};
    for (int w = 0; w < (grad ? 4 : 2); ++w)
      if (const int i = weights[w]; numel(ref(in, i)) != d)
        return invalidArgument("operand ", i, " ", desc(ref(in, i)),
                               " must hold head_dim = ", d, " weights");
    TESSERA_RETURN_IF_ERROR(grad ? requireSameNumel(in, {0, 3, 4})
                                 : requireSameNumel(in, {0, 3}));
    t.f[0] = in.fattrs()->Get(0);
    return Status();
  }
  case O::GeluGrad:
    t.i[0] = in.iattrs()->Get(0); // the form: 1 = tanh, 0 = erf
    return requireSameNumel(in, {0, 1, 2});
  case O::Gelu:
    t.i[0] = in.iattrs()->Get(0);
    return requireSameNumel(in, {0, 1});
  case O::Add:
  case O::ReluGrad:
    return requireSameNumel(in, {0, 1, 2});
  case O::Relu:
  case O::Sgd:
    return requireSameNumel(in, {0, 1});
  case O::SgdMomentum:
    return requireSameNumel(in, {0, 1, 2});
  case O::SumSquares:
    t.type = isBf16(in, 0) ? ElementType::BF16 : ElementType::F32;
    if (numel(ref(in, 1)) != 1)
      return invalidArgument("the sum ", desc(ref(in, 1)),
                             " must be one element");
    return Status();
  case O::ClipGradNorm:
    for (int i = 0; i < 3; ++i)
      if (numel(ref(in, i)) != 1)
        return invalidArgument("ClipGradNorm's operands are scalars, got ",
                               desc(ref(in, i)));
    if (!(t.f[0] >= 0) || !std::isfinite(t.f[0]))
      return invalidArgument("ClipGradNorm needs max_norm >= 0, got ", t.f[0]);
    return Status();
  case O::ScaleBy:
    if (numel(ref(in, 1)) != 1)
      return invalidArgument("the scale ", desc(ref(in, 1)),
                             " must be one element");
    return requireSameNumel(in, {0, 2});
  case O::Scale:
  case O::Axpy: {
    // f32, or both bf16 (computed in f32, rounded once).
    t.type = isBf16(in, 0) ? ElementType::BF16 : ElementType::F32;
    return requireSameNumel(in, {0, 1});
  }
  case O::Cast: {
    t.i[0] = isBf16(in, 0);
    t.i[1] = isBf16(in, 1);
    return requireSameNumel(in, {0, 1});
  }
  case O::Copy: {
    int64_t size = dtypeSize(ref(in, 1).dtype());
    t.bytes = numel(ref(in, 1)) * size;
    if (in.group() && in.group()->size()) {
      // This rank's block of X: Y holds 1/|group| of X (sequence shards).
      int64_t offset = 0, shards = 1;
      TESSERA_RETURN_IF_ERROR(vocabShard(in, numel(ref(in, 1)), offset, shards));
      if (numel(ref(in, 0)) != numel(ref(in, 1)) * shards)
        return invalidArgument("Copy of a shard: ", desc(ref(in, 0)), " must be ",
                               shards, " times ", desc(ref(in, 1)));
      if (t.ptr[0]) // null when validating without an arena
        t.ptr[0] = static_cast<uint8_t *>(t.ptr[0]) + offset * size;
      return Status();
    }
    return requireSameNumel(in, {0, 1});
  }
  case O::ReduceRows: {
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    if (numel(ref(in, 1)) != x.cols)
      return invalidArgument("output ", desc(ref(in, 1)),
                             " does not match the last dimension of ",
                             desc(ref(in, 0)));
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::CrossEntropy:
  case O::CrossEntropyGrad: {
    bool grad = in.op() == O::CrossEntropyGrad;
    TESSERA_ASSIGN_OR_RETURN(Matrix z, rowsCols(in, 0));
    if (numel(ref(in, 1)) != z.rows || numel(ref(in, 2)) != z.rows)
      return invalidArgument("targets ", desc(ref(in, 1)), " and ",
                             grad ? "dL " : "L ", desc(ref(in, 2)),
                             " must have one element per row of ",
                             desc(ref(in, 0)));
    if (grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 3}));
    t.m = z.rows;
    t.n = z.cols;
    return Status();
  }
  case O::Mean:
    if (numel(ref(in, 1)) != 1)
      return invalidArgument("result must be a scalar, got ", desc(ref(in, 1)));
    return Status();
  case O::MeanGrad:
    if (numel(ref(in, 0)) != 1)
      return invalidArgument("dy must be a scalar, got ", desc(ref(in, 0)));
    t.n = numel(ref(in, 1));
    return Status();
  case O::Fill: {
    t.type = isBf16(in, 0) ? ElementType::BF16 : ElementType::F32;
    return Status();
  }
  case O::ExpertDispatch:
  case O::ExpertCombine: {
    // Operands: dispatch [rows, counts, R, local, splits, W]; combine
    // [R, splits, counts, rows, W].
    bool dispatch = in.op() == O::ExpertDispatch;
    auto rankOf = [&](int i) {
      return ref(in, i).shape() ? int64_t(ref(in, i).shape()->size()) : 0;
    };
    auto dim = [&](int i, int d) {
      return ref(in, i).shape()->Get(flatbuffers::uoffset_t(d));
    };
    const int rows = dispatch ? 0 : 3, counts = dispatch ? 1 : 2,
              recv = dispatch ? 2 : 0, splits = dispatch ? 4 : 1,
              work = dispatch ? 5 : 4;
    std::string kind = in.group() ? in.group()->str() : "";
    GroupPosition pos = position(kind);
    if (!pos.group && worldRank >= 0)
      return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                             kind, "', over which its experts are split");
    const int64_t experts = in.iattrs()->Get(0), etp = in.iattrs()->Get(1),
                  size = pos.size;
    if (etp < 1 || size % etp != 0)
      return invalidArgument("etp ", etp, " does not divide the ", size,
                             " ranks of group '", kind, "'");
    const int64_t ep = size / etp;
    if (experts < 1 || experts % ep != 0)
      return invalidArgument(experts, " experts do not split evenly over the ",
                             ep, " expert-parallel ranks of group '", kind, "'");
    if (numel(ref(in, counts)) != experts ||
        numel(ref(in, splits)) != experts * etp ||
        (dispatch && numel(ref(in, 3)) != experts / ep))
      return invalidArgument("counts ", desc(ref(in, counts)), ", splits ",
                             desc(ref(in, splits)),
                             " must hold one count per expert");
    if (rankOf(rows) != 2 || rankOf(recv) != 2)
      return invalidArgument("rows ", desc(ref(in, rows)), " and ",
                             desc(ref(in, recv)), " must be [rows, features]");
    const int64_t n = dim(rows, 0), h = dim(rows, 1);
    if (dim(recv, 1) != h || dim(recv, 0) != size * n)
      return invalidArgument(desc(ref(in, recv)), " must hold ", size,
                             " x the rows of ", desc(ref(in, rows)));
    // The combine with etp also receives etp partials of each row.
    const int64_t workFloats =
        size * n * h + (!dispatch && etp > 1 ? etp * n * h : 0);
    if (numel(ref(in, work)) < workFloats)
      return invalidArgument("workspace ", desc(ref(in, work)),
                             " holds fewer than ", workFloats, " floats");
    t.m = n;
    t.n = h;
    t.i[0] = experts;
    t.i[1] = etp;
    TESSERA_ASSIGN_OR_RETURN(t.comm, lookup(kind));
    return Status();
  }
  case O::AllToAll: {
    std::string kind = in.group() ? in.group()->str() : "";
    TESSERA_ASSIGN_OR_RETURN(t.type, elementTypeOf(ref(in, 0).dtype()));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1}));
    GroupPosition pos = position(kind);
    if (!pos.group && worldRank >= 0 && hasGroupKind(*artifact.root(), kind))
      return invalidArgument("rank ", worldRank,
                             " is in no rank group of kind '", kind,
                             "', but its program has a collective over it");
    if (pos.size < 1 || numel(ref(in, 0)) % pos.size != 0)
      return invalidArgument(desc(ref(in, 0)), " does not split into one block "
                             "per rank of group '", kind, "' (", pos.size,
                             " ranks)");
    const int64_t es = dtypeSize(ref(in, 0).dtype());
    const int64_t x = finalOffset(0), y = finalOffset(1),
                  bytes = numel(ref(in, 0)) * es;
    if (bytes > 0 && x < y + bytes && y < x + bytes)
      return invalidArgument("all-to-all input ", desc(ref(in, 0)),
                             " and output overlap in the arena");
    t.n = numel(ref(in, 0)) / pos.size;
    TESSERA_ASSIGN_OR_RETURN(t.comm, lookup(kind));
    return Status();
  }
  case O::AllReduce:
  case O::AllReduceStart:
  case O::AllGather:
  case O::ReduceScatter:
  case O::ReduceScatterStart: {
    std::string kind = in.group() ? in.group()->str() : "";
    TESSERA_ASSIGN_OR_RETURN(t.type, elementTypeOf(ref(in, 0).dtype()));
    // bf16 buffers (gradients under --bf16) are summed in f32 pairwise and
    // rounded (MpiCommunicator's bf16 sum); there is no bf16 max.
    if (t.type == ElementType::BF16 && in.op() != O::AllGather &&
        t.reduce != ReduceKind::Sum)
      return invalidArgument(fb::EnumNameOpcode(in.op()),
                             " with reduce Max on ", desc(ref(in, 0)),
                             " is not supported (bf16 reductions are sums)");
    GroupPosition pos = position(kind);
    if (!pos.group && worldRank >= 0 && hasGroupKind(*artifact.root(), kind))
      return invalidArgument("rank ", worldRank,
                             " is in no rank group of kind '", kind,
                             "', but its program has a collective over it");
    if (in.op() == O::AllGather || in.op() == O::ReduceScatter ||
        in.op() == O::ReduceScatterStart) {
      bool gather = in.op() == O::AllGather;
      int64_t small = numel(ref(in, gather ? 0 : 1));
      int64_t big = numel(ref(in, gather ? 1 : 0));
      if (big != small * pos.size)
        return invalidArgument(gather ? "output " : "input ",
                               desc(ref(in, gather ? 1 : 0)), " must hold ",
                               pos.size, " (size of group '", kind, "') times ",
                               desc(ref(in, gather ? 0 : 1)));
      t.n = small;
      // In place (the distributed optimizer's buckets): the shard is exactly
      // this rank's block of the full buffer, which MPI_IN_PLACE (and NCCL)
      // handle. Any other overlap would have the collective overwrite what
      // it still has to read.
      const int shardIdx = gather ? 0 : 1, fullIdx = gather ? 1 : 0;
      const int64_t es = dtypeSize(ref(in, 0).dtype());
      const int64_t shardAt = finalOffset(shardIdx);
      const int64_t fullAt = finalOffset(fullIdx);
      const int64_t shardBytes = small * es, fullBytes = big * es;
      const int64_t blockAt = fullAt + int64_t(pos.index) * shardBytes;
      if (shardBytes > 0 && shardAt < fullAt + fullBytes &&
          fullAt < shardAt + shardBytes) {
        if (shardAt != blockAt)
          return invalidArgument(
              gather ? "input " : "output ", desc(ref(in, shardIdx)),
              " (arena bytes ", shardAt, " to ", shardAt + shardBytes,
              ") overlaps ", gather ? "output " : "input ",
              desc(ref(in, fullIdx)), " (bytes ", fullAt, " to ",
              fullAt + fullBytes, ") but is not this rank's block of it (",
              kind, " index ", pos.index, ": bytes ", blockAt, " to ",
              blockAt + shardBytes,
              "); an in-place collective needs exactly that block");
        t.i[0] = 1;
      }
    }
    TESSERA_ASSIGN_OR_RETURN(t.comm, lookup(kind));
    return Status();
  }
  case O::Send:
  case O::Recv: {
    TESSERA_ASSIGN_OR_RETURN(t.type, elementTypeOf(ref(in, 0).dtype()));
    int64_t peer = in.iattrs()->Get(0), tag = in.iattrs()->Get(1);
    GroupPosition pos = position("pp");
    if ((!pos.group && worldRank >= 0) || pos.size < 2)
      return invalidArgument(
          "pipeline point-to-point needs a 'pp' rank group of more than one "
          "rank",
          worldRank >= 0 ? " holding rank " + std::to_string(worldRank) : "",
          pos.group || worldRank < 0
              ? " (it has " + std::to_string(pos.size) + ")"
              : "");
    bool send = in.op() == O::Send;
    int64_t other = (pos.index + peer + pos.size) % pos.size;
    t.i[0] = other;
    t.i[1] = tag;
    t.i[2] = pos.index;
    std::string dtype = fb::EnumNameDType(ref(in, 0).dtype());
    for (char &c : dtype)
      c = char(std::tolower(static_cast<unsigned char>(c)));
    t.p2pDetail = std::string(send ? "send to" : "recv from") + " pp rank " +
                  std::to_string(other) + " tag " + std::to_string(tag) + ", " +
                  shapeToString(ref(in, 0).shape()) + " " + dtype;
    if (in.loc() && in.loc()->size())
      t.p2pDetail += " at " + in.loc()->str();
    t.p2pLabel = std::string(send ? "send\u2192pp" : "recv\u2190pp") +
                 std::to_string(other);
    TESSERA_ASSIGN_OR_RETURN(t.comm, lookup("pp"));
    return Status();
  }
  case O::Wait:
    return Status();
  case O::Adam: {
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2, 3}));
    if (numel(ref(in, 4)) != 1)
      return invalidArgument("iteration operand must be a scalar i64, got ",
                             desc(ref(in, 4)));
    return Status();
  }
  case O::LayerNorm:
  case O::LayerNormGrad:
  case O::AddLayerNorm:
  case O::AddLayerNormGrad:
  case O::RMSNorm:
  case O::RMSNormGrad:
  case O::AddRMSNorm:
  case O::AddRMSNormGrad:
  case O::Embedding:
  case O::EmbeddingGrad:
  case O::AddPositionEmbedding:
  case O::PositionEmbeddingGrad:
  case O::Attention:
  case O::AttentionGrad:
  case O::LogitsMax:
  case O::LogitsStats:
  case O::CrossEntropyStats:
  case O::CrossEntropyFromStats:
  case O::CrossEntropyStatsGrad:
  case O::TokenMean:
  case O::TokenMeanGrad:
  case O::TokenCount:
  case O::TokenMeanOver:
  case O::TokenMeanOverGrad:
  case O::RingAttention:
  case O::RingAttentionGrad:
  case O::Dropout:
  case O::RotaryEmbedding:
    return decodeTransformerInstr(in, t);
  case O::MoERouter:
  case O::MoERouterGrad:
  case O::MoEAuxLoss:
  case O::MoEAuxLossGrad:
  case O::MoEAuxLossOver:
  case O::MoEAuxLossOverGrad:
  case O::MoETokenCounts:
  case O::MoEDispatch:
  case O::MoEDispatchGrad:
  case O::GroupedLinear:
  case O::GroupedLinearGrad:
  case O::MoECombine:
  case O::MoECombineGrad:
  case O::MoECapacityDrop:
  case O::MoECapacityDropGrad:
    return decodeMoEInstr(in, t);
  }
  return unimplemented("unknown opcode ", int(in.op()));
}

/// A grouped QKV (grouped-query attention's and QK-norm's operand `grouped`,
/// [rows, groups * (heads/groups + 2) * head_dim]) with iattrs [heads,
/// groups]: t.m rows, t.n head dim, t.i = [heads, groups].
Status Decoder::decodeGroupedQkv(const fb::Instr &in, int grouped, Thunk &t) {
  const int64_t heads = in.iattrs()->Get(0), groups = in.iattrs()->Get(1);
  if (heads < 1 || groups < 1 || heads % groups != 0)
    return invalidArgument("num_heads ", heads,
                           " must be a positive multiple of num_query_groups ",
                           groups);
  TESSERA_ASSIGN_OR_RETURN(Matrix g, rowsCols(in, grouped));
  const int64_t per = heads + 2 * groups, d = g.cols / per;
  if (d < 1 || g.cols != per * d)
    return invalidArgument("grouped qkv ", desc(ref(in, grouped)),
                           " must be [rows, ", groups, " x (", heads / groups,
                           " + 2) x head_dim]");
  t.m = g.rows;
  t.n = d;
  t.i[0] = heads;
  t.i[1] = groups;
  return Status();
}

/// Integer parameters of the MoE kernels: i = [tokens, experts, k,
/// features]; GroupedLinear(Grad): m rows, n out, k in, i[1] experts.
Status Decoder::decodeMoEInstr(const fb::Instr &in, Thunk &t) {
  using O = fb::Opcode;
  auto last = [&](int i) -> int64_t {
    const auto *shape = ref(in, i).shape();
    return shape && shape->size() ? shape->Get(shape->size() - 1) : 1;
  };
  // tokens x width elements of operand i, with `what` naming the width.
  auto per = [&](int i, int64_t tokens, int64_t width,
                 const char *what) -> Status {
    if (numel(ref(in, i)) != tokens * width)
      return invalidArgument("operand ", i, " ", desc(ref(in, i)), " must hold ",
                             tokens, " tokens x ", width, " ", what);
    return Status();
  };
  auto routing = [&](int i, int64_t tokens, int64_t &k) -> Status {
    k = tokens > 0 ? numel(ref(in, i)) / tokens : last(i);
    if (k < 1 || numel(ref(in, i)) != tokens * k)
      return invalidArgument("routing ", desc(ref(in, i)), " must hold k >= 1 "
                             "choices for each of ", tokens, " tokens");
    return Status();
  };
  int64_t tokens = 0, experts = 0, k = 0, features = 0;
  switch (in.op()) {
  case O::MoERouter:
  case O::MoERouterGrad: {
    bool grad = in.op() == O::MoERouterGrad;
    const int logits = grad ? 3 : 0, probs = grad ? 0 : 1;
    k = last(probs);
    tokens = k > 0 ? numel(ref(in, probs)) / k : 0;
    experts = last(logits);
    TESSERA_RETURN_IF_ERROR(per(logits, tokens, experts, "experts' logits"));
    if (grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2}));
    else
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {1, 2}));
    if (k < 1 || k > experts)
      return invalidArgument("router topk ", k, " must be in [1, ", experts,
                             "]");
    break;
  }
  case O::MoEAuxLoss:
  case O::MoEAuxLossGrad:
  case O::MoEAuxLossOver:
  case O::MoEAuxLossOverGrad: {
    // Over: all ranks' counts follow y (the forward) or dy (the backward).
    const bool over =
        in.op() == O::MoEAuxLossOver || in.op() == O::MoEAuxLossOverGrad;
    const bool grad =
        in.op() == O::MoEAuxLossGrad || in.op() == O::MoEAuxLossOverGrad;
    const int y = over && !grad ? 3 : 2, counts = grad ? 3 : 2;
    experts = last(0);
    tokens = experts > 0 ? numel(ref(in, 0)) / experts : 0;
    TESSERA_RETURN_IF_ERROR(routing(1, tokens, k));
    if (over && numel(ref(in, counts)) != experts)
      return invalidArgument("counts ", desc(ref(in, counts)),
                             " must hold one for each of ", experts,
                             " experts");
    if (numel(ref(in, y)) != 1)
      return invalidArgument(grad ? "dy " : "y ", desc(ref(in, y)),
                             " must be a scalar");
    if (grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, over ? 4 : 3}));
    break;
  }
  case O::MoETokenCounts:
    // m = the choices, i[1] = the experts.
    t.m = numel(ref(in, 0));
    t.i[1] = numel(ref(in, 1));
    return Status();
  case O::MoEDispatch:
  case O::MoEDispatchGrad: {
    bool grad = in.op() == O::MoEDispatchGrad;
    const int x = grad ? 2 : 0, rows = grad ? 0 : 2;
    features = last(x);
    tokens = features > 0 ? numel(ref(in, x)) / features : 0;
    TESSERA_RETURN_IF_ERROR(routing(1, tokens, k));
    TESSERA_RETURN_IF_ERROR(per(rows, tokens * k, features, "features"));
    experts = grad ? in.iattrs()->Get(0) : numel(ref(in, 3));
    if (experts < 1)
      return invalidArgument("the number of experts must be positive, got ",
                             experts);
    break;
  }
  case O::MoECombine:
  case O::MoECombineGrad: {
    features = last(3);
    tokens = features > 0 ? numel(ref(in, 3)) / features : 0;
    TESSERA_RETURN_IF_ERROR(routing(2, tokens, k));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {1, 2}));
    TESSERA_RETURN_IF_ERROR(per(0, tokens * k, features, "features"));
    if (in.op() == O::MoECombineGrad) {
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 4}));
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {1, 5}));
    }
    experts = in.iattrs()->Get(0);
    if (experts < 1)
      return invalidArgument("the number of experts must be positive, got ",
                             experts);
    break;
  }
  case O::MoECapacityDrop: {
    // [probs, indices, P, I]: every operand [tokens..., k].
    k = last(0);
    tokens = k > 0 ? numel(ref(in, 0)) / k : 0;
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2, 3}));
    experts = in.iattrs()->Get(0);
    if (experts < 1)
      return invalidArgument("the number of experts must be positive, got ",
                             experts);
    const double factor = in.fattrs()->Get(0);
    if (!(factor > 0.0))
      return invalidArgument("the capacity factor must be positive, got ",
                             factor);
    // Megatron's get_capacity: ceil(tokens * k / experts * factor).
    t.m = int64_t(std::ceil(double(tokens * k) / double(experts) * factor));
    t.k = in.iattrs()->Get(1);
    break;
  }
  case O::MoECapacityDropGrad:
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2}));
    t.n = numel(ref(in, 0));
    break;
  case O::GroupedLinear:
  case O::GroupedLinearGrad: {
    // A stacked [experts, k, out, in] weight (SwiGLU experts) has k * out
    // out-features.
    const auto *w = ref(in, 2).shape();
    if (!w || w->size() < 3 || w->size() > 4)
      return invalidArgument("W ", desc(ref(in, 2)),
                             " must be [experts, out, in] or [experts, k, out, "
                             "in]");
    experts = w->Get(0);
    t.k = w->Get(w->size() - 1);
    t.n = w->Get(1) * (w->size() == 4 ? w->Get(2) : 1);
    if (numel(ref(in, 1)) != experts)
      return invalidArgument("counts ", desc(ref(in, 1)), " must have one "
                             "element per expert (", experts, ")");
    t.m = t.k > 0 ? numel(ref(in, 0)) / t.k : 0;
    TESSERA_RETURN_IF_ERROR(per(0, t.m, t.k, "input features"));
    TESSERA_RETURN_IF_ERROR(per(3, t.m, t.n, "output features"));
    if (in.op() == O::GroupedLinearGrad) {
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 4}));
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {2, 5}));
    }
    // The float inputs share a dtype (the validator's SameFloatDType).
    t.type = isBf16(in, 0) ? ElementType::BF16 : ElementType::F32;
    break;
  }
  default:
    return unimplemented("not a mixture-of-experts opcode");
  }
  t.i[0] = tokens;
  t.i[1] = experts;
  t.i[2] = k;
  t.i[3] = features;
  return Status();
}

Status Decoder::decodeRuns(const fb::Instr &in, Thunk &t) {
  const int64_t *a = in.iattrs() ? in.iattrs()->data() : nullptr;
  size_t n = in.iattrs() ? in.iattrs()->size() : 0;
  if (std::string_view why = runsError(a, n); !why.empty())
    return invalidArgument(std::string(why));
  t.hasRuns = n > 0;
  t.runs.clear();
  if (!t.hasRuns)
    return Status();
  // This rank's shard of the whole tensor: its index in `group`.
  int64_t index = 0;
  if (in.group() && in.group()->size()) {
    GroupPosition pos = position(in.group()->str());
    if (!pos.group && worldRank >= 0)
      return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                             in.group()->str(), "', which shards this operand");
    index = pos.index;
  }
  if (t.n > a[0])
    return invalidArgument("the operand's ", t.n,
                           " elements exceed the shard size ", a[0]);
  int64_t offset = 0;
  if (__builtin_mul_overflow(index, a[0], &offset))
    return invalidArgument("the shard offset overflows int64");
  forEachLocalRun(a, n, offset, t.n, [&](int64_t b, int64_t e) {
    t.runs.push_back({b, e});
  });
  return Status();
}

Status Decoder::sequenceShard(const fb::Instr &in, int64_t rows, Thunk &t) {
  std::string kind = in.group() ? in.group()->str() : "";
  bool tp = kind == "tp" || kind == "tp-cp";
  bool cp = kind == "cp" || kind == "tp-cp";
  if (!kind.empty() && !tp && !cp)
    return invalidArgument("the sequence is sharded over 'tp' (sequence "
                           "parallelism), 'cp' (context parallelism) or "
                           "'tp-cp', not '",
                           kind, "'");
  auto axis = [&](const char *name, GroupPosition &pos) -> Status {
    pos = position(name);
    if (!pos.group && worldRank >= 0)
      return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                             name, "', which shards this kernel's sequence");
    return Status();
  };
  GroupPosition tpPos, cpPos;
  if (tp)
    TESSERA_RETURN_IF_ERROR(axis("tp", tpPos));
  if (cp)
    TESSERA_RETURN_IF_ERROR(axis("cp", cpPos));
  int64_t cpLocal = 0, total = 0;
  if (__builtin_mul_overflow(rows, int64_t(tpPos.size), &cpLocal) ||
      __builtin_mul_overflow(cpLocal, int64_t(cpPos.size), &total))
    return invalidArgument(rows, " sequence rows times the shards of '", kind,
                           "' overflow int64");
  if (cpPos.size > 1 && cpLocal % 2 != 0)
    return invalidArgument("a context-parallel sequence share of ", cpLocal,
                           " rows is not two equal chunks");
  t.seq = math::sequencePieces(rows, int64_t(tpPos.index) * rows, cpLocal,
                               cpPos.index, cpPos.size);
  t.seqTotal = total;
  return Status();
}

Status Decoder::vocabShard(const fb::Instr &in, int64_t localVocab,
                           int64_t &offset, int64_t &shards) {
  offset = 0;
  shards = 1;
  std::string kind = in.group() ? in.group()->str() : "";
  if (kind.empty())
    return Status();
  GroupPosition pos = position(kind);
  if (!pos.group && worldRank >= 0)
    return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                           kind, "', which shards this kernel's operand");
  // The callers multiply localVocab by the shard count.
  int64_t total = 0;
  if (__builtin_mul_overflow(localVocab, int64_t(pos.size), &total))
    return invalidArgument(localVocab, " elements times ", pos.size,
                           " shards over '", kind, "' overflow int64");
  offset = int64_t(pos.index) * localVocab;
  shards = pos.size;
  return Status();
}

/// Integer parameters in Thunk::i per opcode:
///   Embedding / EmbeddingGrad: m rows, n dim, i = [localVocab, offset,
///     vocab_size (Embedding)];
///   (Add)PositionEmbedding(Grad): i = [S, B, H, rows of P];
///   Attention(Grad): i = [S, B, heads, headDim], k = causal;
///   LogitsMax / CrossEntropyStats(Grad): m rows, n cols, i = [offset,
///     number of classes over all shards, ignore_index];
///   CrossEntropyFromStats / TokenMean(Grad): m rows, i = [ignore_index].
Status Decoder::decodeTransformerInstr(const fb::Instr &in, Thunk &t) {
  using O = fb::Opcode;
  auto iattr = [&](int i) {
    return in.iattrs()->Get(flatbuffers::uoffset_t(i));
  };
  auto requireNumel = [&](int i, int64_t n, const char *what) -> Status {
    if (numel(ref(in, i)) != n)
      return invalidArgument(what, " (operand ", i, ") ", desc(ref(in, i)),
                             " must have ", n, " elements");
    return Status();
  };
  auto dim = [&](int i, int d) {
    return ref(in, i).shape()->Get(flatbuffers::uoffset_t(d));
  };
  auto rankOf = [&](int i) {
    return ref(in, i).shape() ? int(ref(in, i).shape()->size()) : 0;
  };

  switch (in.op()) {
  case O::LayerNorm:
  case O::LayerNormGrad: {
    bool grad = in.op() == O::LayerNormGrad;
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    if (grad) {
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2, 3}));
      TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
      TESSERA_RETURN_IF_ERROR(requireNumel(4, x.cols, "dgamma"));
      TESSERA_RETURN_IF_ERROR(requireNumel(5, x.cols, "dbeta"));
    } else {
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 3}));
      TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
      TESSERA_RETURN_IF_ERROR(requireNumel(2, x.cols, "beta"));
    }
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::AddLayerNorm: {
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 4, 5}));
    TESSERA_RETURN_IF_ERROR(requireNumel(2, x.cols, "gamma"));
    TESSERA_RETURN_IF_ERROR(requireNumel(3, x.cols, "beta"));
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::AddLayerNormGrad: {
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2, 3, 4}));
    TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
    TESSERA_RETURN_IF_ERROR(requireNumel(5, x.cols, "dgamma"));
    TESSERA_RETURN_IF_ERROR(requireNumel(6, x.cols, "dbeta"));
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::RMSNorm:
  case O::RMSNormGrad:
  case O::AddRMSNorm:
  case O::AddRMSNormGrad: {
    // Operands: X (or A, B), gamma, then dY (and dR), the outputs and,
    // for the gradients, dgamma last.
    TESSERA_ASSIGN_OR_RETURN(Matrix x, rowsCols(in, 0));
    switch (in.op()) {
    case O::RMSNorm:
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2}));
      TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
      break;
    case O::RMSNormGrad:
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2, 3}));
      TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
      TESSERA_RETURN_IF_ERROR(requireNumel(4, x.cols, "dgamma"));
      break;
    case O::AddRMSNorm:
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 3, 4}));
      TESSERA_RETURN_IF_ERROR(requireNumel(2, x.cols, "gamma"));
      break;
    default:
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2, 3, 4}));
      TESSERA_RETURN_IF_ERROR(requireNumel(1, x.cols, "gamma"));
      TESSERA_RETURN_IF_ERROR(requireNumel(5, x.cols, "dgamma"));
    }
    t.m = x.rows;
    t.n = x.cols;
    return Status();
  }
  case O::Embedding:
  case O::EmbeddingGrad: {
    bool grad = in.op() == O::EmbeddingGrad;
    int table = grad ? 2 : 1, rowsRef = grad ? 1 : 2;
    TESSERA_ASSIGN_OR_RETURN(Matrix tm, matrix(in, table));
    TESSERA_ASSIGN_OR_RETURN(Matrix y, rowsCols(in, rowsRef));
    if (rankOf(table) != 2)
      return invalidArgument("table ", desc(ref(in, table)),
                             " must be [local vocab, hidden]");
    if (numel(ref(in, 0)) != y.rows)
      return invalidArgument("ids ", desc(ref(in, 0)),
                             " must have one id per row of ",
                             grad ? "dY " : "Y ", desc(ref(in, rowsRef)));
    if (tm.cols != y.cols)
      return invalidArgument("table ", desc(ref(in, table)), " and ",
                             grad ? "dY " : "Y ", desc(ref(in, rowsRef)),
                             " must have the same last dimension");
    int64_t offset = 0, shards = 1;
    TESSERA_RETURN_IF_ERROR(vocabShard(in, tm.rows, offset, shards));
    t.m = y.rows;
    t.n = y.cols;
    t.i[0] = tm.rows;
    t.i[1] = offset;
    if (!grad) {
      t.i[2] = iattr(0);
      if (tm.rows * shards < t.i[2])
        return invalidArgument("vocab_size ", t.i[2], " exceeds the ", tm.rows,
                               " rows of table ", desc(ref(in, table)),
                               " times ", shards, " vocabulary shard(s)");
    }
    return Status();
  }
  case O::AddPositionEmbedding:
  case O::PositionEmbeddingGrad: {
    bool grad = in.op() == O::PositionEmbeddingGrad;
    const int pos = 1; // P (or dP)
    if (rankOf(0) < 2)
      return invalidArgument("operand 0 ", desc(ref(in, 0)),
                             " must be [S, B, H] (rank >= 2)");
    if (rankOf(pos) != 2)
      return invalidArgument("position table ", desc(ref(in, pos)),
                             " must be [positions, H]");
    int64_t s = dim(0, 0), h = dim(0, rankOf(0) - 1);
    // s * h overflows only when another dimension is 0 (then b is 0).
    int64_t sh = 0;
    int64_t b = !__builtin_mul_overflow(s, h, &sh) && sh != 0
                    ? numel(ref(in, 0)) / sh
                    : 0;
    TESSERA_RETURN_IF_ERROR(sequenceShard(in, s, t));
    if (dim(pos, 1) != h || dim(pos, 0) < t.seqTotal)
      return invalidArgument("position table ", desc(ref(in, pos)),
                             " must have hidden size ", h, " and at least ",
                             t.seqTotal, " rows for ", desc(ref(in, 0)));
    if (!grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2}));
    t.i[0] = s;
    t.i[1] = b;
    t.i[2] = h;
    t.i[3] = dim(pos, 0);
    return Status();
  }
  case O::Attention:
  case O::AttentionGrad: {
    bool grad = in.op() == O::AttentionGrad;
    const int out = 1; // O (or dO)
    if (rankOf(0) != 3 || rankOf(out) != 3)
      return invalidArgument("QKV ", desc(ref(in, 0)), " and ",
                             grad ? "dO " : "O ", desc(ref(in, out)),
                             " must be [S, B, features]");
    int64_t heads = iattr(0);
    int64_t f = dim(out, 2), f3 = 0;
    if (dim(0, 0) != dim(out, 0) || dim(0, 1) != dim(out, 1) ||
        __builtin_mul_overflow(f, 3, &f3) || dim(0, 2) != f3)
      return invalidArgument("QKV ", desc(ref(in, 0)), " must be [S, B, 3 * ",
                             f, "] for ", grad ? "dO " : "O ",
                             desc(ref(in, out)));
    if (heads <= 0 || heads > INT64_MAX / 3 || dim(0, 2) % (3 * heads) != 0)
      return invalidArgument("the last dimension of QKV ", desc(ref(in, 0)),
                             " is not divisible by 3 * num_heads (", heads,
                             ")");
    if (grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 2}));
    t.i[0] = dim(0, 0);
    t.i[1] = dim(0, 1);
    t.i[2] = heads;
    t.i[3] = f / heads;
    t.k = iattr(1);
    return Status();
  }
  case O::LogitsMax: {
    TESSERA_ASSIGN_OR_RETURN(Matrix z, rowsCols(in, 0));
    TESSERA_RETURN_IF_ERROR(requireNumel(1, z.rows, "row max"));
    t.m = z.rows;
    t.n = z.cols;
    return Status();
  }
  case O::CrossEntropyStats:
  case O::LogitsStats:
  case O::CrossEntropyStatsGrad: {
    bool grad = in.op() == O::CrossEntropyStatsGrad;
    TESSERA_ASSIGN_OR_RETURN(Matrix z, rowsCols(in, 0));
    TESSERA_RETURN_IF_ERROR(requireNumel(1, z.rows, "labels"));
    TESSERA_RETURN_IF_ERROR(requireNumel(2, z.rows, "M"));
    TESSERA_RETURN_IF_ERROR(requireNumel(3, z.rows, "se"));
    TESSERA_RETURN_IF_ERROR(requireNumel(4, z.rows, grad ? "dL" : "pl"));
    if (grad)
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 5}));
    int64_t offset = 0, shards = 1;
    TESSERA_RETURN_IF_ERROR(vocabShard(in, z.cols, offset, shards));
    t.m = z.rows;
    t.n = z.cols;
    t.i[0] = offset;
    t.i[1] = z.cols * shards;
    t.i[2] = iattr(0);
    return Status();
  }
  case O::CrossEntropyFromStats: {
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2, 3, 4}));
    t.m = numel(ref(in, 0));
    t.i[0] = iattr(0);
    return Status();
  }
  case O::Dropout: {
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1}));
    if (rankOf(0) != 3)
      return invalidArgument("Dropout expects [seq, batch, hidden], got ",
                             desc(ref(in, 0)));
    t.m = dim(0, 0);
    t.n = dim(0, 1);
    t.k = dim(0, 2);
    TESSERA_RETURN_IF_ERROR(sequenceShard(in, t.m, t));
    t.i[2] = iattr(0);
    return Status();
  }
  case O::RotaryEmbedding: {
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1}));
    if (rankOf(0) != 3)
      return invalidArgument("RotaryEmbedding expects [seq, batch, heads * 3 "
                             "* head_dim], got ",
                             desc(ref(in, 0)));
    t.m = dim(0, 0);
    t.n = dim(0, 1);
    t.k = dim(0, 2);
    const int64_t heads = iattr(0), rot = iattr(1);
    if (heads < 1 || t.k % (3 * heads) != 0)
      return invalidArgument("RotaryEmbedding: ", t.k,
                             " features are not 3 x num_heads (", heads,
                             ") x head_dim");
    if (rot < 2 || rot % 2 != 0 || rot > t.k / (3 * heads))
      return invalidArgument("RotaryEmbedding: rotary_dim ", rot,
                             " must be even and in [2, head_dim ",
                             t.k / (3 * heads), "]");
    if (!(t.f[0] > 1.0f) || !std::isfinite(t.f[0]))
      return invalidArgument("RotaryEmbedding: base must be finite and > 1, "
                             "got ",
                             t.f[0]);
    if (t.f[1] != 0.0f && !(t.f[1] >= 1.0f && std::isfinite(t.f[1])))
      return invalidArgument("RotaryEmbedding: scaling factor must be 0 "
                             "(none) or finite and >= 1, got ",
                             t.f[1]);
    TESSERA_RETURN_IF_ERROR(sequenceShard(in, t.m, t));
    t.i[0] = heads;
    t.i[1] = rot;
    t.i[2] = iattr(2);
    return Status();
  }
  case O::TokenCount: {
    TESSERA_RETURN_IF_ERROR(requireNumel(1, 1, "n"));
    t.m = numel(ref(in, 0));
    t.i[0] = iattr(0);
    return Status();
  }
  case O::TokenMeanOver:
  case O::TokenMeanOverGrad: {
    bool grad = in.op() == O::TokenMeanOverGrad;
    int scalar = grad ? 0 : 3, perRow = grad ? 3 : 0;
    TESSERA_RETURN_IF_ERROR(requireNumel(scalar, 1, grad ? "dy" : "y"));
    TESSERA_RETURN_IF_ERROR(requireNumel(2, 1, "n"));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {perRow, 1}));
    t.m = numel(ref(in, 1));
    t.i[0] = iattr(0);
    return Status();
  }
  case O::RingAttention:
  case O::RingAttentionGrad: {
    bool grad = in.op() == O::RingAttentionGrad;
    const int o = grad ? 1 : 2, lse = grad ? 2 : 3, w = grad ? 4 : 1;
    if (rankOf(0) != 3 || rankOf(o) != 3 || rankOf(lse) != 3)
      return invalidArgument("QKV ", desc(ref(in, 0)), ", O ", desc(ref(in, o)),
                             " and LSE ", desc(ref(in, lse)),
                             " must be [S, B, features]");
    int64_t heads = iattr(0);
    int64_t f = dim(o, 2), f3 = 0;
    if (heads <= 0 || heads > INT64_MAX / 3 || f % heads != 0 ||
        __builtin_mul_overflow(f, 3, &f3) || dim(0, 2) != f3 ||
        dim(0, 0) != dim(o, 0) || dim(0, 1) != dim(o, 1))
      return invalidArgument("QKV ", desc(ref(in, 0)), " must be [S, B, 3 * ",
                             f, "] with ", f, " divisible by num_heads (",
                             heads, ") for O ", desc(ref(in, o)));
    if (dim(lse, 0) != dim(0, 0) || dim(lse, 1) != dim(0, 1) ||
        dim(lse, 2) != heads)
      return invalidArgument("LSE ", desc(ref(in, lse)), " must be [",
                             dim(0, 0), ", ", dim(0, 1), ", ", heads, "]");
    if (grad) {
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {1, 3}));
      TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 5}));
    }
    if (dim(0, 0) % 2 != 0)
      return invalidArgument("ring attention needs an even local sequence "
                             "(two chunks), got ",
                             desc(ref(in, 0)));
    Backend::RingAttentionDims d;
    d.seq = dim(0, 0);
    d.batch = dim(0, 1);
    d.heads = heads;
    d.headDim = f / heads;
    int64_t need = grad ? d.backwardWorkspace() : d.forwardWorkspace();
    if (numel(ref(in, w)) < need)
      return invalidArgument("workspace W ", desc(ref(in, w)), " holds fewer "
                             "than the ", need, " floats ring attention needs");
    t.i[0] = d.seq;
    t.i[1] = d.batch;
    t.i[2] = heads;
    t.i[3] = d.headDim;
    t.k = iattr(1);
    const std::string kind = in.group()->str();
    if (!position(kind).group && worldRank >= 0)
      return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                             kind, "', but its program has ring attention "
                             "over it");
    TESSERA_ASSIGN_OR_RETURN(t.comm, lookup(kind));
    return Status();
  }
  case O::TokenMean:
  case O::TokenMeanGrad: {
    bool grad = in.op() == O::TokenMeanGrad;
    int scalar = grad ? 0 : 2, perRow = grad ? 2 : 0;
    TESSERA_RETURN_IF_ERROR(requireNumel(scalar, 1, grad ? "dy" : "y"));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {perRow, 1}));
    t.m = numel(ref(in, 1));
    t.i[0] = iattr(0);
    return Status();
  }
  default:
    break;
  }
  return unimplemented("unknown opcode ", int(in.op()));
}

//===----------------------------------------------------------------------===//
// Pre-launch validation
//===----------------------------------------------------------------------===//

/// "program P function 'F' instruction I (Opcode at loc": the start of a
/// membership error (the caller closes the parenthesis).
static std::string describeInstr(const fb::Program &program,
                                 const fb::Function &fn, flatbuffers::uoffset_t i,
                                 const fb::Instr &in) {
  std::string where = "program " + std::to_string(program.pp_rank()) +
                      " function '" + (fn.name() ? fn.name()->str() : "") +
                      "' instruction " + std::to_string(i) + " (" +
                      fb::EnumNameOpcode(in.op());
  if (in.loc() && in.loc()->size())
    where += " at " + in.loc()->str();
  return where;
}

/// Calls `check(fn, i, in)` on every instruction `in` (number `i` of
/// function `fn`) of `program`; stops at the first error and returns it.
template <typename Check>
static Status forEachInstr(const fb::Program &program, Check check) {
  if (!program.functions())
    return Status();
  for (const fb::Function *fn : *program.functions()) {
    if (!fn->instrs())
      continue;
    for (flatbuffers::uoffset_t i = 0; i < fn->instrs()->size(); ++i)
      TESSERA_RETURN_IF_ERROR(check(*fn, i, *fn->instrs()->Get(i)));
  }
  return Status();
}

/// Checks that `worldRank` is in an instance of every group kind that a
/// collective or a rank-relative operand of `program` uses (embedding kinds
/// leave ranks out). The error names the rank, the kind and the instruction
/// with its loc.
static Status checkCollectiveMembership(const LoadedArtifact &artifact,
                                        const fb::Program &program,
                                        int worldRank) {
  // True if `kind` may leave ranks out and none of its instances holds
  // this rank (the loader makes every other kind cover the world).
  auto leavesOut = [&](const std::string &kind) {
    return mayLeaveRanksOut(kind) &&
           !findGroupPosition(*artifact.root(), kind, worldRank).group &&
           hasGroupKind(*artifact.root(), kind);
  };
  return forEachInstr(
      program,
      [&](const fb::Function &fn, flatbuffers::uoffset_t i,
          const fb::Instr &in) -> Status {
        // Rank-relative operands need the rank's index in their group kind.
        if (in.operands())
          for (flatbuffers::uoffset_t o = 0; o < in.operands()->size(); ++o) {
            const fb::TensorRef &r = *in.operands()->Get(o);
            if (!r.rank_group() || !r.rank_group()->size())
              continue;
            std::string kind = r.rank_group()->str();
            if (!leavesOut(kind))
              continue;
            return invalidArgument(artifact.name(), ": ",
                                   describeInstr(program, fn, i, in),
                                   "): operand ", o,
                                   " is relative to rank group kind '", kind,
                                   "', but rank ", worldRank,
                                   " is in no rank group of that kind");
          }
        if (!in.group() || !in.group()->size() ||
            (!isCollective(in.op()) && !isShardedKernel(in.op())))
          return Status();
        std::string kind = in.group()->str();
        if (!leavesOut(kind))
          return Status();
        std::string where = describeInstr(program, fn, i, in);
        return invalidArgument(
            artifact.name(), ": ", where, "): rank ", worldRank,
            " is in no rank group of kind '", kind, "', but its program has ",
            isCollective(in.op()) ? "a collective over it"
                                  : "a kernel whose vocabulary it shards");
      });
}

/// A program with pipeline Send/Recv needs `worldRank` in a "pp" group of
/// more than one rank. The error names the rank and the instruction.
static Status checkPipelineMembership(const LoadedArtifact &artifact,
                                      const fb::Program &program,
                                      int worldRank) {
  GroupPosition pos = findGroupPosition(*artifact.root(), "pp", worldRank);
  if (pos.group && pos.size > 1)
    return Status();
  return forEachInstr(
      program,
      [&](const fb::Function &fn, flatbuffers::uoffset_t i,
          const fb::Instr &in) -> Status {
        if (!isPointToPoint(in.op()))
          return Status();
        std::string where = describeInstr(program, fn, i, in);
        return invalidArgument(
            artifact.name(), ": ", where, "): rank ", worldRank,
            pos.group ? " is the only rank of its 'pp' group"
                      : " is in no rank group of kind 'pp'",
            ", but its program sends to or receives from another pipeline "
            "stage");
      });
}

/// The group kinds whose index changes how `program` decodes: those of its
/// collectives and vocabulary-sharded kernels and of its rank-relative
/// operands.
static std::vector<std::string> positionKinds(const fb::Program &program) {
  std::set<std::string> kinds;
  (void)forEachInstr(program, [&](const fb::Function &, flatbuffers::uoffset_t,
                                  const fb::Instr &in) {
    if (in.group() && in.group()->size())
      kinds.insert(in.group()->str());
    if (in.operands())
      for (const fb::TensorRef *r : *in.operands())
        if (r->rank_group() && r->rank_group()->size())
          kinds.insert(r->rank_group()->str());
    return Status();
  });
  return std::vector<std::string>(kinds.begin(), kinds.end());
}

Status Executor::validate(const LoadedArtifact &artifact) {
  const fb::Artifact &a = *artifact.root();
  for (const fb::Program *p : *a.programs()) {
    if (!p->functions())
      continue;
    // Rank-relative operands and the blocks of in-place collectives depend
    // on the rank's index in its groups: the program is decoded at the
    // positions of every rank that runs it (once per combination of indices
    // in the kinds it uses), or of none when no rank runs it.
    std::vector<std::string> kinds = positionKinds(*p);
    std::set<std::vector<int>> seen;
    std::vector<int> ranks;
    for (int r = 0; r < a.world_size(); ++r) {
      if (artifact.programForWorldRank(r) != p)
        continue;
      std::vector<int> indices;
      for (const std::string &kind : kinds) {
        GroupPosition pos = findGroupPosition(a, kind, r);
        indices.push_back(pos.group ? pos.index : -1);
      }
      if (seen.insert(indices).second)
        ranks.push_back(r);
    }
    if (ranks.empty())
      ranks.push_back(-1);
    static Communicator *const kNone = nullptr;
    for (int r : ranks) {
      Decoder decoder(
          artifact, *p, nullptr, -1,
          [](const std::string &) -> StatusOr<Communicator *> { return kNone; },
          r);
      // Only the relocation check depends on the slot, and an operand's
      // place is affine in the slot index: the first and the last slot
      // bound every other (num_slots is an int32 the loader bounds only by
      // the arena; decoding each slot could take minutes).
      for (const fb::Function *fn : *p->functions())
        for (int slot : {0, std::max(1, fn->num_slots()) - 1}) {
          std::vector<Thunk> thunks;
          TESSERA_RETURN_IF_ERROR(decoder.decode(*fn, thunks, slot));
          if (fn->num_slots() <= 1)
            break;
        }
    }
  }
  // Every rank must find a program, and be in a group of every kind its
  // program's collectives use; a program with Send/Recv needs a pp group of
  // more than one rank holding the rank.
  for (int r = 0; r < a.world_size(); ++r) {
    const fb::Program *p = artifact.programForWorldRank(r);
    if (!p)
      return invalidArgument(artifact.name(), ": no program for rank ", r,
                             " (its pp index has no program)");
    TESSERA_RETURN_IF_ERROR(checkCollectiveMembership(artifact, *p, r));
    TESSERA_RETURN_IF_ERROR(checkPipelineMembership(artifact, *p, r));
  }
  return Status();
}

} // namespace tessera::rt
