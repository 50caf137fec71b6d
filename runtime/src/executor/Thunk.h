//===- Thunk.h - A decoded instruction --------------------------*- C++ -*-===//
//
// What the decoder (Decoder.cpp) hands the executor (Executor.cpp) for each
// instruction: the opcode and its run function, resolved arena pointers,
// sizes, attributes and the bound communicator, all checked once when the
// program is loaded.
// Internal to the executor.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXECUTOR_THUNK_H
#define TESSERA_RT_EXECUTOR_THUNK_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/BF16.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/Opcodes.h"
#include "tessera/rt/math/SequenceLayout.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::rt {

namespace ops {
class RunContext;
} // namespace ops

/// A decoded instruction.
struct Thunk {
  fb::Opcode op = fb::Opcode::Fill;
  /// The opcode's run function (executor/ops/Ops.h).
  Status (*run)(ops::RunContext &, const Thunk &) = nullptr;
  void *ptr[maxOperands()] = {};
  /// The storage format of each float operand (F32 for other dtypes): what
  /// the kernels that load and store any format (FloatIn, FloatOut) read.
  FloatFormat fmt[maxOperands()] = {};
  /// gemm: m, n, k; matrix ops: rows (m) x cols (n); elementwise: n.
  int64_t m = 0, n = 0, k = 0;
  /// Integer parameters of the kernels (see each opcode's decode function in
  /// executor/ops); for Cast, i[0] and i[1] are X's and Y's FloatFormat; for
  /// AllGather and ReduceScatter(Start), i[0] is 1 when in place (the shard
  /// is this rank's block of the full buffer).
  int64_t i[4] = {};
  int64_t bytes = 0;
  /// Dropout and the position embeddings: the runs of rows whose global
  /// sequence positions are consecutive (one, or two under context
  /// parallelism) and the whole sequence's length.
  math::SequencePieces seq;
  int64_t seqTotal = 0;
  bool transA = false, transB = false;
  float alpha = 1.0f, beta = 0.0f;
  float f[5] = {};
  Communicator *comm = nullptr;
  /// Collectives and Send/Recv: the element type; Fill, Scale, Axpy, Gemm
  /// and GroupedLinear(Grad) (their float inputs): BF16 or F16 selects the
  /// 16-bit kernel.
  ElementType type = ElementType::F32;
  ReduceKind reduce = ReduceKind::Sum;
  int event = -1;
  std::string where; ///< "function 'f' instruction i (Op at loc)"
  std::string group; ///< the instruction's rank-group kind, if any (trace)
  /// Send/Recv: "send to pp rank 2 tag 5, [4, 2, 8] f32 at loc" (watchdog)
  /// and "send→pp2" (trace). Peer index, tag and own index are i[0..2].
  std::string p2pDetail, p2pLabel;
  /// Opcodes with Runs (Opcodes.def): whether iattrs gave runs, and the runs
  /// that meet this rank's shard, as [begin, end) of the first operand.
  bool hasRuns = false;
  std::vector<std::pair<int64_t, int64_t>> runs;
};

} // namespace tessera::rt

#endif // TESSERA_RT_EXECUTOR_THUNK_H
