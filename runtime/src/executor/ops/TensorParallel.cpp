//===- TensorParallel.cpp - GEMMs pipelined with tp's ring exchanges ------===//
//
// Decode and run functions (Ops.h) of Megatron-LM's --tp-comm-overlap under
// sequence parallelism (TransformerEngine's userbuffers ring exchange,
// PyTorch's fused_all_gather_matmul and fused_matmul_reduce_scatter):
//
// AllGatherGemm [X, B, Xg, C]: the group's blocks of rows X travel around
// the ring into Xg (block j from rank j, as the all-gather puts them); at
// step s a rank holds block (r - s) mod n, starts passing it on to r + 1
// while receiving block (r - s - 1) from r - 1, and computes C's rows of
// the block it holds meanwhile. Each row of C is the GEMM's row for the
// same row of Xg, so C equals the unfused GEMM's wherever the GEMM kernel
// computes a row independently of the others' count (OpenBLAS here).
//
// GemmReduceScatter [A, B, W, Y]: block c's partial sums start on rank
// c + 1 and go around the ring, each rank adding its own product of block
// c to them, until they reach rank c after n - 1 hops: at step s rank r
// computes block (r - 1 - s) mod n into a workspace block, adds the sum
// that arrived from r - 1, and sends the result on to r + 1 while the next
// block's GEMM runs. Rank r's block is the sum in ring order; at n = 2 it is
// the one sum of two terms the reduce-scatter forms (addition commutes), so
// the same bits.
//
// On NCCL the exchanges are issued (Communicator::issue) before the GEMM,
// which runs on the compute stream while they run on the communicator's;
// on MPI they are posted before it and completed after.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

namespace tessera::rt::ops {

/// Message tags on the tp communicator (each exchange completes within its
/// instruction).
static constexpr int kGatherTag = 0;
static constexpr int kScatterTag = 1;

/// The communicator of the instruction's group, which the rank must be in.
static Status bindGroup(Decoder &d, const fb::Instr &in, Thunk &t,
                        GroupPosition &pos) {
  const std::string kind = in.group()->str();
  pos = d.position(kind);
  TESSERA_RETURN_IF_ERROR(requireMember(d, kind, pos));
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator(kind));
  return Status();
}

/// op(B)'s columns for the k columns of the rows it multiplies.
static Status gemmColumns(Decoder &d, const fb::Instr &in, const Thunk &t,
                          int64_t k, int64_t &n) {
  TESSERA_ASSIGN_OR_RETURN(Matrix b, d.matrix(in, 1));
  const int64_t kb = t.transB ? b.cols : b.rows;
  n = t.transB ? b.rows : b.cols;
  if (kb != k)
    return invalidArgument("rows of ", k, " features times B ", d.desc(in, 1),
                           t.transB ? " transposed" : "",
                           ", which has ", kb, " rows");
  return Status();
}

/// Whether arena byte ranges [a, a + an) and [b, b + bn) meet.
static bool overlaps(int64_t a, int64_t an, int64_t b, int64_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

//===----------------------------------------------------------------------===//
// AllGatherGemm
//===----------------------------------------------------------------------===//

Status decodeAllGatherGemm(Decoder &d, const fb::Instr &in, Thunk &t) {
  GroupPosition pos;
  TESSERA_RETURN_IF_ERROR(bindGroup(d, in, t, pos));
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.matrix(in, 0));
  TESSERA_ASSIGN_OR_RETURN(Matrix xg, d.matrix(in, 2));
  TESSERA_ASSIGN_OR_RETURN(Matrix c, d.matrix(in, 3));
  if (xg.cols != x.cols || xg.rows != x.rows * pos.size)
    return invalidArgument("Xg ", d.desc(in, 2), " must hold ", pos.size,
                           " (size of group '", in.group()->str(),
                           "') blocks of X ", d.desc(in, 0));
  int64_t n = 0;
  TESSERA_RETURN_IF_ERROR(gemmColumns(d, in, t, x.cols, n));
  if (c.rows != xg.rows || c.cols != n)
    return invalidArgument("C ", d.desc(in, 3), " must be [", xg.rows, ", ",
                           n, "]: Xg's rows times op(B)");
  t.m = x.rows;
  t.n = n;
  t.k = x.cols;
  t.type = d.floatType(in, 0);
  // X is either this rank's block of Xg (nothing to copy) or apart from it;
  // C may meet none of the others.
  const int64_t es = elementSize(t.type);
  const int64_t xAt = d.finalOffset(0), xgAt = d.finalOffset(2);
  const int64_t blockBytes = x.rows * x.cols * es;
  const int64_t mine = xgAt + int64_t(pos.index) * blockBytes;
  if (overlaps(xAt, blockBytes, xgAt, blockBytes * pos.size)) {
    if (xAt != mine)
      return invalidArgument("X ", d.desc(in, 0), " overlaps Xg ",
                             d.desc(in, 2),
                             " but is not this rank's block of it");
    t.i[0] = 1;
  }
  // Nothing the ring writes (Xg, C) may meet another operand.
  const int64_t bytes[4] = {blockBytes, d.numel(in, 1) * es,
                            blockBytes * pos.size, c.rows * c.cols * 4};
  for (auto [w, r] : {std::pair{3, 0}, {3, 1}, {3, 2}, {2, 1}})
    if (overlaps(d.finalOffset(w), bytes[w], d.finalOffset(r), bytes[r]))
      return invalidArgument(w == 3 ? "C " : "Xg ", d.desc(in, w),
                             " overlaps operand ", r, " ", d.desc(in, r));
  return Status();
}

/// out = rows @ op(B): t.m rows of t.k elements of the thunk's float type
/// (f32, or 16-bit accumulated in f32), op(B) being operand 1.
static Status gemmRows(RunContext &x, const Thunk &t, const void *rows,
                       float *out) {
  if (isHalf(t))
    return x.backend().gemmHalf(floatFormat(t), false, t.transB, t.m, t.n, t.k,
                                1.0f, static_cast<const uint16_t *>(rows),
                                half(t, 1), 0.0f, out);
  return x.backend().gemm(false, t.transB, t.m, t.n, t.k, 1.0f,
                          static_cast<const float *>(rows), f32(t, 1), 0.0f,
                          out);
}

Status runAllGatherGemm(RunContext &x, const Thunk &t) {
  Communicator &comm = *t.comm;
  const int n = comm.size(), r = comm.rank();
  const int64_t blockElems = t.m * t.k;
  const int64_t blockBytes = blockElems * elementSize(t.type);
  auto *xg = static_cast<uint8_t *>(t.ptr[2]);
  float *c = f32(t, 3);
  if (!t.i[0])
    TESSERA_RETURN_IF_ERROR(
        x.backend().copy(t.ptr[0], xg + int64_t(r) * blockBytes, blockBytes));
  for (int s = 0; s < n; ++s) {
    const int held = (r - s + n) % n;
    std::vector<CommRequest> requests;
    if (s + 1 < n) {
      const int next = (held - 1 + n) % n;
      TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
      TESSERA_ASSIGN_OR_RETURN(
          CommRequest send,
          comm.isend(xg + int64_t(held) * blockBytes, blockElems, t.type,
                     (r + 1) % n, kGatherTag));
      requests.push_back(send);
      auto recv = comm.irecv(xg + int64_t(next) * blockBytes, blockElems,
                             t.type, (r - 1 + n) % n, kGatherTag);
      if (recv.ok())
        requests.push_back(*recv);
      Status st = recv.ok() ? comm.issue(requests) : recv.status();
      if (!st.ok()) {
        comm.waitAll(requests).ignoreError();
        return st;
      }
    }
    Status st = gemmRows(x, t, xg + int64_t(held) * blockBytes,
                         c + int64_t(held) * t.m * t.n);
    Status done = requests.empty() ? Status() : comm.waitAll(requests);
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(done);
  }
  // The ring's volume is the all-gather's: n - 1 blocks sent.
  comm.countP2pAs(&CommCounters::allGather, uint64_t(n - 1) * blockBytes);
  return Status();
}

//===----------------------------------------------------------------------===//
// GemmReduceScatter
//===----------------------------------------------------------------------===//

Status decodeGemmReduceScatter(Decoder &d, const fb::Instr &in, Thunk &t) {
  GroupPosition pos;
  TESSERA_RETURN_IF_ERROR(bindGroup(d, in, t, pos));
  TESSERA_ASSIGN_OR_RETURN(Matrix a, d.matrix(in, 0));
  TESSERA_ASSIGN_OR_RETURN(Matrix y, d.matrix(in, 3));
  int64_t n = 0;
  TESSERA_RETURN_IF_ERROR(gemmColumns(d, in, t, a.cols, n));
  if (y.cols != n || y.rows * pos.size != a.rows)
    return invalidArgument("Y ", d.desc(in, 3), " must be [", a.rows,
                           " / ", pos.size, " (size of group '",
                           in.group()->str(), "'), ", n,
                           "]: a block of the rows of A ", d.desc(in, 0),
                           " times op(B)");
  const int64_t block = y.rows * y.cols;
  if (d.numel(in, 2) < 3 * block)
    return invalidArgument("workspace W ", d.desc(in, 2),
                           " holds fewer than three blocks of Y (",
                           3 * block, " floats)");
  t.m = y.rows;
  t.n = n;
  t.k = a.cols;
  t.type = d.floatType(in, 0);
  // Nothing the ring writes (W, Y) may meet another operand.
  const int64_t es = elementSize(t.type);
  const int64_t bytes[4] = {d.numel(in, 0) * es, d.numel(in, 1) * es,
                            3 * block * 4, block * 4};
  for (auto [w, r] : {std::pair{3, 2}, {3, 0}, {3, 1}, {2, 0}, {2, 1}})
    if (overlaps(d.finalOffset(w), bytes[w], d.finalOffset(r), bytes[r]))
      return invalidArgument(w == 3 ? "Y " : "workspace W ", d.desc(in, w),
                             " overlaps operand ", r, " ", d.desc(in, r));
  return Status();
}

Status runGemmReduceScatter(RunContext &x, const Thunk &t) {
  Communicator &comm = *t.comm;
  const int n = comm.size(), r = comm.rank();
  const int64_t block = t.m * t.n;
  float *w = f32(t, 2);
  float *part[2] = {w, w + block};
  float *arrived = w + 2 * block;
  const auto *a = static_cast<const uint8_t *>(t.ptr[0]);
  const int64_t aBlockBytes = t.m * t.k * elementSize(t.type);
  std::vector<CommRequest> requests;
  for (int s = 0; s < n; ++s) {
    const int j = ((r - 1 - s) % n + n) % n;
    float *dst = s + 1 == n ? f32(t, 3) : part[s % 2];
    Status st = gemmRows(x, t, a + j * aBlockBytes, dst);
    if (!requests.empty()) {
      Status done = comm.waitAll(requests);
      requests.clear();
      TESSERA_RETURN_IF_ERROR(st);
      TESSERA_RETURN_IF_ERROR(done);
      // This rank's product first, then the sum that came around the
      // ring.
      st = x.backend().add(dst, arrived, dst, block);
    }
    TESSERA_RETURN_IF_ERROR(st);
    if (s + 1 < n) {
      TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
      TESSERA_ASSIGN_OR_RETURN(CommRequest send,
                               comm.isend(dst, block, ElementType::F32,
                                          (r + 1) % n, kScatterTag));
      requests.push_back(send);
      auto recv = comm.irecv(arrived, block, ElementType::F32, (r - 1 + n) % n,
                             kScatterTag);
      if (recv.ok())
        requests.push_back(*recv);
      st = recv.ok() ? comm.issue(requests) : recv.status();
      if (!st.ok()) {
        comm.waitAll(requests).ignoreError();
        return st;
      }
    }
  }
  // The ring's volume is the reduce-scatter's: n - 1 blocks of partial sums.
  comm.countP2pAs(&CommCounters::reduceScatter,
                  uint64_t(n - 1) * uint64_t(block) * 4);
  return Status();
}

} // namespace tessera::rt::ops
