//===- ExpertParallel.cpp - MoE rows to their experts' ranks and back -----===//
//
// Decode and run functions (Ops.h) of the ExpertDispatch and ExpertCombine
// opcodes (part of the MoE family, MoE.cpp): Megatron's
// MoEAlltoAllTokenDispatcher without token dropping. The group's ranks come
// in runs of etp (1 without expert tensor parallelism); run j holds experts
// [j El, (j + 1) El), El = E etp / size, each rank of the run a 1/etp slice
// of their FFN. A rank's routed rows come in expert order with counts per
// expert, so the rows for run j are one contiguous run. The dispatch:
//   1. exchanges the counts (an all-to-all of El counts per rank), so each
//      rank learns how many rows every source sends to each of its experts
//      (the splits);
//   2. sends the rows (an all-to-all with per-rank counts) into the
//      workspace, source by source: every rank of run j gets the rows for
//      run j (Megatron's all-to-all over ep, then all-gather over etp);
//   3. reorders them expert by expert (Megatron's sort_chunks_by_idxs), so
//      the grouped GEMM sees each local expert's rows together.
// The combine undoes 3 and 2; with etp each row comes back from the etp
// ranks of its run as partial sums, added in rank order (Megatron's
// reduce-scatter over etp). The counts travel through host memory (one
// device-to-host copy per dispatch, as Megatron's dispatcher synchronises
// on its token counts), which is what the all-to-all's counts need anyway;
// on a device backend their exchange is staged through device memory,
// which NCCL needs.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <numeric>

namespace tessera::rt::ops {

/// The exchange of one dispatch: per (source rank, local expert) row counts
/// and the per-rank element counts and offsets of both directions.
struct ExpertExchange {
  /// The sizes of thunk `t` (an ExpertDispatch or ExpertCombine).
  explicit ExpertExchange(const Thunk &t)
      : size(t.comm->size()), etp(t.i[1]), local(t.i[0] * t.i[1] / size),
        features(t.n), counts(size_t(t.i[0])), splits(size_t(size * local)) {}

  int64_t size = 1, etp = 1, local = 1, features = 0;
  std::vector<int32_t> counts; ///< [E] this rank's rows per expert
  std::vector<int32_t> splits; ///< [size, El] rows from source i for expert e
  /// This rank's rows by destination rank (the rows of rank g's run, the
  /// same rows for every rank of a run), and the experts' side by source.
  std::vector<int64_t> mineCounts, mineOffsets;
  std::vector<int64_t> theirsCounts, theirsOffsets;
  /// With etp: where the partials from each rank land, packed.
  std::vector<int64_t> packedOffsets;

  /// The counts this rank sends rank g: those of g's run's experts.
  std::vector<int32_t> countsByRank() const {
    std::vector<int32_t> out(size_t(size * local));
    for (int64_t g = 0; g < size; ++g)
      for (int64_t e = 0; e < local; ++e)
        out[size_t(g * local + e)] = counts[size_t((g / etp) * local + e)];
    return out;
  }

  void plan() {
    const int64_t runs = size / etp;
    std::vector<int64_t> runStart(size_t(runs) + 1, 0);
    for (int64_t j = 0; j < runs; ++j) {
      runStart[size_t(j + 1)] = runStart[size_t(j)];
      for (int64_t e = 0; e < local; ++e)
        runStart[size_t(j + 1)] += counts[size_t(j * local + e)] * features;
    }
    mineCounts.assign(size_t(size), 0);
    mineOffsets.assign(size_t(size), 0);
    theirsCounts.assign(size_t(size), 0);
    theirsOffsets.assign(size_t(size), 0);
    packedOffsets.assign(size_t(size), 0);
    for (int64_t g = 0; g < size; ++g) {
      const int64_t j = g / etp;
      mineCounts[size_t(g)] = runStart[size_t(j + 1)] - runStart[size_t(j)];
      mineOffsets[size_t(g)] = runStart[size_t(j)];
      for (int64_t e = 0; e < local; ++e)
        theirsCounts[size_t(g)] += splits[size_t(g * local + e)] * features;
      if (g > 0) {
        theirsOffsets[size_t(g)] =
            theirsOffsets[size_t(g - 1)] + theirsCounts[size_t(g - 1)];
        packedOffsets[size_t(g)] =
            packedOffsets[size_t(g - 1)] + mineCounts[size_t(g - 1)];
      }
    }
  }
};

namespace {

/// Copies the chunks between source-major order (src: for each source i,
/// its rows for each local expert e) and expert-major order (for each
/// expert e, each source's rows), in the direction `toExpertMajor`.
Status reorderChunks(Backend &be, const ExpertExchange &x, const void *srcRows,
                     void *dstRows, int64_t elementBytes, bool toExpertMajor) {
  const auto *src = static_cast<const uint8_t *>(srcRows);
  auto *dst = static_cast<uint8_t *>(dstRows);
  const int64_t rowBytes = x.features * elementBytes;
  // Row offsets of chunk (i, e) in both orders.
  std::vector<int64_t> sourceMajor(size_t(x.size * x.local)),
      expertMajor(size_t(x.size * x.local));
  int64_t at = 0;
  for (int64_t i = 0; i < x.size; ++i)
    for (int64_t e = 0; e < x.local; ++e) {
      sourceMajor[size_t(i * x.local + e)] = at;
      at += x.splits[size_t(i * x.local + e)];
    }
  at = 0;
  for (int64_t e = 0; e < x.local; ++e)
    for (int64_t i = 0; i < x.size; ++i) {
      expertMajor[size_t(i * x.local + e)] = at;
      at += x.splits[size_t(i * x.local + e)];
    }
  for (int64_t c = 0; c < x.size * x.local; ++c) {
    const int64_t rows = x.splits[size_t(c)];
    if (rows == 0)
      continue;
    const int64_t from =
        toExpertMajor ? sourceMajor[size_t(c)] : expertMajor[size_t(c)];
    const int64_t to =
        toExpertMajor ? expertMajor[size_t(c)] : sourceMajor[size_t(c)];
    TESSERA_RETURN_IF_ERROR(
        be.copy(src + from * rowBytes, dst + to * rowBytes, rows * rowBytes));
  }
  return Status();
}

Status checkCounts(const std::vector<int32_t> &counts, int64_t rows,
                   const char *what) {
  int64_t total = 0;
  for (int32_t c : counts) {
    if (c < 0)
      return outOfRange(what, " hold a negative row count ", c);
    total += c;
  }
  if (total > rows)
    return outOfRange(what, " add up to ", total, " rows, more than the ", rows,
                      " the buffers hold");
  return Status();
}

} // namespace

/// The all-to-all of the per-expert counts (El per rank) into x.splits.
/// A host-memory backend's communicator (MPI) reads the host vectors; a
/// device backend's (NCCL) needs device memory: the counts go through the
/// executor's scratch, and come back to the host.
static Status exchangeExpertCounts(RunContext &ctx, const Thunk &t,
                                   ExpertExchange &x) {
  Backend &be = ctx.backend();
  std::vector<int32_t> send = x.countsByRank();
  const int64_t n = int64_t(send.size());
  if (be.hostMemory())
    return t.comm->allToAll(send.data(), x.splits.data(), x.local,
                            ElementType::I32);
  TESSERA_ASSIGN_OR_RETURN(uint8_t * staged, ctx.scratch(2 * n * 4));
  uint8_t *received = staged + n * 4;
  TESSERA_RETURN_IF_ERROR(be.copyToDevice(staged, send.data(), n * 4));
  TESSERA_RETURN_IF_ERROR(
      t.comm->allToAll(staged, received, x.local, ElementType::I32));
  return be.copyToHost(x.splits.data(), received, n * 4);
}

/// ExpertDispatch [rows, counts, R, local, splits, W] and ExpertCombine [R,
/// splits, counts, rows, W]; iattrs [experts, etp]: m rows, n features, i =
/// [experts, etp].
static Status decodeExchange(Decoder &d, const fb::Instr &in, Thunk &t,
                             bool dispatch) {
  const int rows = dispatch ? 0 : 3, counts = dispatch ? 1 : 2,
            recv = dispatch ? 2 : 0, splits = dispatch ? 4 : 1,
            work = dispatch ? 5 : 4;
  std::string kind = in.group() ? in.group()->str() : "";
  GroupPosition pos = d.position(kind);
  if (!pos.group && d.rank() >= 0)
    return invalidArgument("rank ", d.rank(), " is in no rank group of kind '",
                           kind, "', over which its experts are split");
  const int64_t experts = d.iattr(in, 0), etp = d.iattr(in, 1), size = pos.size;
  if (etp < 1 || size % etp != 0)
    return invalidArgument("etp ", etp, " does not divide the ", size,
                           " ranks of group '", kind, "'");
  const int64_t ep = size / etp;
  if (experts < 1 || experts % ep != 0)
    return invalidArgument(experts, " experts do not split evenly over the ",
                           ep, " expert-parallel ranks of group '", kind, "'");
  if (d.numel(in, counts) != experts || d.numel(in, splits) != experts * etp ||
      (dispatch && d.numel(in, 3) != experts / ep))
    return invalidArgument("counts ", d.desc(in, counts), ", splits ",
                           d.desc(in, splits),
                           " must hold one count per expert");
  if (d.rankOf(in, rows) != 2 || d.rankOf(in, recv) != 2)
    return invalidArgument("rows ", d.desc(in, rows), " and ", d.desc(in, recv),
                           " must be [rows, features]");
  const int64_t n = d.dim(in, rows, 0), h = d.dim(in, rows, 1);
  if (d.dim(in, recv, 1) != h || d.dim(in, recv, 0) != size * n)
    return invalidArgument(d.desc(in, recv), " must hold ", size,
                           " x the rows of ", d.desc(in, rows));
  // The combine with etp also receives etp partials of each row.
  const int64_t workElements =
      size * n * h + (!dispatch && etp > 1 ? etp * n * h : 0);
  if (d.numel(in, work) < workElements)
    return invalidArgument("workspace ", d.desc(in, work), " holds fewer than ",
                           workElements, " elements");
  // 16-bit rows (bf16 activations) only move: the partial sums of etp > 1
  // are added in f32.
  t.type = d.floatType(in, rows);
  if (t.type != ElementType::F32 && etp > 1)
    return invalidArgument("rows ", d.desc(in, rows),
                           " are 16-bit, but etp ", etp,
                           " > 1 adds the experts' partial sums, in f32 only");
  t.m = n;
  t.n = h;
  t.i[0] = experts;
  t.i[1] = etp;
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator(kind));
  return Status();
}

Status decodeExpertDispatch(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeExchange(d, in, t, true);
}

Status runExpertDispatch(RunContext &ctx, const Thunk &t) {
  Backend *be = &ctx.backend();
  ExpertExchange x(t);
  const int64_t experts = t.i[0], rows = t.m;
  TESSERA_RETURN_IF_ERROR(
      be->copyToHost(x.counts.data(), t.ptr[1], experts * 4));
  TESSERA_RETURN_IF_ERROR(checkCounts(x.counts, rows, "the routed counts"));
  // 1. Each rank's counts for run j's experts go to run j's ranks.
  TESSERA_RETURN_IF_ERROR(exchangeExpertCounts(ctx, t, x));
  TESSERA_RETURN_IF_ERROR(
      checkCounts(x.splits, x.size * rows, "the received counts"));
  x.plan();
  // 2. The rows, source by source, into the workspace.
  const int64_t es = elementSize(t.type);
  void *work = t.ptr[5];
  auto *recv = static_cast<uint8_t *>(t.ptr[2]);
  TESSERA_RETURN_IF_ERROR(ctx.syncForHostComm(t));
  TESSERA_RETURN_IF_ERROR(t.comm->allToAllV(
      t.ptr[0], x.mineCounts.data(), x.mineOffsets.data(), work,
      x.theirsCounts.data(), x.theirsOffsets.data(), t.type));
  // 3. Expert by expert; the rows past them are zero.
  TESSERA_RETURN_IF_ERROR(reorderChunks(*be, x, work, recv, es, true));
  const int64_t received =
      std::accumulate(x.splits.begin(), x.splits.end(), int64_t(0));
  uint8_t *past = recv + received * x.features * es;
  const int64_t zeros = (x.size * rows - received) * x.features;
  TESSERA_RETURN_IF_ERROR(
      t.type == ElementType::F32
          ? be->fill(reinterpret_cast<float *>(past), 0.0f, zeros)
          : be->fillHalf(floatFormat(t.type), reinterpret_cast<uint16_t *>(past),
                         0.0f, zeros));
  std::vector<int32_t> local(size_t(x.local), 0);
  for (int64_t i = 0; i < x.size; ++i)
    for (int64_t e = 0; e < x.local; ++e)
      local[size_t(e)] += x.splits[size_t(i * x.local + e)];
  TESSERA_RETURN_IF_ERROR(
      be->copyToDevice(t.ptr[3], local.data(), x.local * 4));
  return be->copyToDevice(t.ptr[4], x.splits.data(),
                          int64_t(x.splits.size()) * 4);
}

Status decodeExpertCombine(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeExchange(d, in, t, false);
}

Status runExpertCombine(RunContext &ctx, const Thunk &t) {
  Backend *be = &ctx.backend();
  ExpertExchange x(t);
  const int64_t experts = t.i[0], rows = t.m;
  TESSERA_RETURN_IF_ERROR(
      be->copyToHost(x.splits.data(), t.ptr[1], int64_t(x.splits.size()) * 4));
  TESSERA_RETURN_IF_ERROR(
      be->copyToHost(x.counts.data(), t.ptr[2], experts * 4));
  TESSERA_RETURN_IF_ERROR(checkCounts(x.counts, rows, "the routed counts"));
  TESSERA_RETURN_IF_ERROR(checkCounts(x.splits, x.size * rows, "the splits"));
  x.plan();
  TESSERA_RETURN_IF_ERROR(reorderChunks(*be, x, t.ptr[0], t.ptr[4],
                                        elementSize(t.type), false));
  TESSERA_RETURN_IF_ERROR(ctx.syncForHostComm(t));
  // The reverse exchange: what this rank's experts hold goes back to each
  // source; what this rank sent comes back to where it was.
  if (x.etp == 1)
    return t.comm->allToAllV(t.ptr[4], x.theirsCounts.data(),
                             x.theirsOffsets.data(), t.ptr[3],
                             x.mineCounts.data(), x.mineOffsets.data(), t.type);
  // (f32 rows: the decoder refuses 16-bit ones with etp > 1.)
  float *work = static_cast<float *>(t.ptr[4]);
  float *out = static_cast<float *>(t.ptr[3]);
  // With etp each row comes back from every rank of its run, as partial
  // sums (behind the source-major rows in the workspace), added in rank
  // order.
  float *partials = work + x.size * rows * x.features;
  TESSERA_RETURN_IF_ERROR(t.comm->allToAllV(
      work, x.theirsCounts.data(), x.theirsOffsets.data(), partials,
      x.mineCounts.data(), x.packedOffsets.data(), ElementType::F32));
  for (int64_t g = 0; g < x.size; ++g) {
    const int64_t n = x.mineCounts[size_t(g)];
    if (n == 0)
      continue;
    float *dst = out + x.mineOffsets[size_t(g)];
    const float *part = partials + x.packedOffsets[size_t(g)];
    TESSERA_RETURN_IF_ERROR(g % x.etp == 0 ? be->copy(part, dst, n * 4)
                                           : be->add(dst, part, dst, n));
  }
  return Status();
}

} // namespace tessera::rt::ops
