//===- Ops.h - Each opcode's decode and run functions -----------*- C++ -*-===//
//
// The executor's per-opcode code, kept out of the decoder and the executor:
// every row of the instruction contract (tessera/rt/Opcodes.def) has two
// functions here,
//   decode<Name>(Decoder &, const fb::Instr &, Thunk &)
//       the shape rules that tie the instruction's operands together (the
//       loader checked the row's counts, dtypes and attributes) and the
//       sizes the kernel needs, into the thunk;
//   run<Name>(RunContext &, const Thunk &)
//       the call into the backend (or the communicator).
// Table.cpp builds the dispatch table from Opcodes.def, so the decoder and
// the executor name no opcode: adding one means writing these two functions
// in the file of its family (below), and an opcode without them does not
// link ("undefined reference to tessera::rt::ops::decodeSilu").
//
// The families, one file each:
//   Dense.cpp        GEMM, elementwise, activations, SwiGLU, casts, copies
//   Norm.cpp         LayerNorm, RMSNorm (with the residual add), QK-norm
//   Attention.cpp    attention, grouped-query attention, ring attention
//   Sequence.cpp     embeddings, position embeddings, RoPE, dropout
//   Loss.cpp         cross entropy (vocab-parallel), token means
//   Optimizer.cpp    Adam, SGD, gradient clipping
//   MoE.cpp          router, dispatch and combine, grouped GEMMs, expert
//                    parallelism's exchanges
//   Collectives.cpp  collectives, async events, pipeline send/recv
//   TensorParallel.cpp  --tp-comm-overlap's GEMMs with their ring exchanges
// Internal to the executor.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXECUTOR_OPS_OPS_H
#define TESSERA_RT_EXECUTOR_OPS_OPS_H

#include "executor/Decoder.h"
#include "executor/Thunk.h"

#include "tessera/rt/Backend.h"
#include "tessera/rt/Communicator.h"

namespace tessera::rt::ops {

/// What an opcode's run function may use besides its thunk: the backend
/// and the executor's state across instructions. The Executor implements
/// it.
class RunContext {
public:
  virtual ~RunContext() = default;
  virtual Backend &backend() = 0;
  /// The learning-rate schedule's factor on the optimizers' lr for the
  /// iteration running.
  virtual double lrFactor() const = 0;
  /// fp16's loss scale for the iteration running (1 without one).
  virtual double lossScale() const = 0;
  /// Whether the iteration's optimizer updates are skipped (fp16: inf or
  /// NaN gradients, found by ClipGradNorm), and the call that skips them.
  virtual bool updatesSkipped() const = 0;
  virtual void skipUpdates() = 0;
  /// Waits for the queued kernels when `t`'s communicator reads memory from
  /// the host (MPI); nothing when it is ordered on the backend's stream
  /// (NCCL, a group of one).
  virtual Status syncForHostComm(const Thunk &t) = 0;
  /// Async collectives: an error when `event` is already in flight; then
  /// the started request is recorded under it, and the Wait takes it back.
  virtual Status checkEventFree(int event) = 0;
  /// (`comm` is null for a collective already complete, which its Wait
  /// then skips: TESSERA_DEBUG_GATHER_AT_START.)
  virtual void recordEvent(int event, Communicator *comm,
                           CommRequest request) = 0;
  virtual StatusOr<std::pair<Communicator *, CommRequest>>
  takeEvent(int event) = 0;
  /// TESSERA_DEBUG_GATHER_AT_START=1 (a test hook): an AllGatherStart
  /// completes before it returns, and its Wait does nothing.
  virtual bool gatherAtStart() const { return false; }
  /// overlap_param_gather: a parameter bucket's all-gather started under
  /// program-wide `id` (an error when that id is still in flight), and its
  /// completion, which does nothing when `id` is not in flight.
  virtual Status startParamSync(const Thunk &t) = 0;
  virtual Status finishParamSync(int id) = 0;
  /// Send/Recv: the posted request joins the open point-to-point batch,
  /// completed before the next instruction that is not a Send/Recv.
  virtual void joinP2pBatch(const Thunk &t, CommRequest request) = 0;
  /// Send/Recv to the rank itself (the turn of a V-shaped pipeline
  /// placement): the send copies its operand into a queue of its tag and
  /// completes; the receive copies the oldest queued value out (an error
  /// when the queue is empty or holds another size).
  virtual Status selfSend(const Thunk &t) = 0;
  virtual Status selfRecv(const Thunk &t) = 0;
  /// Dropout's masks: the run's seed and the global sample index of the
  /// running microbatch's first batch column.
  virtual uint64_t seed() const = 0;
  virtual int64_t firstSample() const = 0;
  /// Device memory of at least `bytes`, kept across instructions and
  /// reused (expert parallelism stages its counts there).
  virtual StatusOr<uint8_t *> scratch(int64_t bytes) = 0;
};

using DecodeFn = Status (*)(Decoder &, const fb::Instr &, Thunk &);
using RunFn = Status (*)(RunContext &, const Thunk &);

/// The decode and run functions of `op` (from the table Table.cpp builds);
/// null for a value outside the schema's opcodes.
DecodeFn decoderOf(fb::Opcode op);
RunFn runnerOf(fb::Opcode op);

/// The rank decoded for must be in an instance of `kind` when the artifact
/// has that kind (Collectives.cpp).
Status requireMember(Decoder &d, const std::string &kind,
                     const GroupPosition &pos);

/// Starts the all-gather of a ParamSyncStart thunk (in place).
StatusOr<CommRequest> startParamSyncGather(const Thunk &t);

// Every opcode's pair, declared from Opcodes.def (defined in its family's
// file).
#define TESSERA_OPCODE(Name, Class, Operands, OperandNames, IAttrs, FAttrs,    \
                       Group, Flags)                                           \
  Status decode##Name(Decoder &d, const fb::Instr &in, Thunk &t);              \
  Status run##Name(RunContext &x, const Thunk &t);
#include "tessera/rt/Opcodes.def"

//===----------------------------------------------------------------------===//
// Helpers of the run functions: operand i of a thunk as the kernel's type.
//===----------------------------------------------------------------------===//

inline float *f32(const Thunk &t, int i) {
  return static_cast<float *>(t.ptr[i]);
}
/// Operand i of a kernel that loads (FloatIn) or stores (FloatOut) any
/// float format: its pointer and the format its dtype gives.
inline FloatIn floatIn(const Thunk &t, int i) { return {t.ptr[i], t.fmt[i]}; }
inline FloatOut floatOut(const Thunk &t, int i) { return {t.ptr[i], t.fmt[i]}; }
inline int32_t *i32(const Thunk &t, int i) {
  return static_cast<int32_t *>(t.ptr[i]);
}
/// A 16-bit float operand (bf16 or f16 bits).
inline uint16_t *half(const Thunk &t, int i) {
  return static_cast<uint16_t *>(t.ptr[i]);
}
/// The storage format of a float element type.
inline FloatFormat floatFormat(ElementType type) {
  return type == ElementType::BF16  ? FloatFormat::BF16
         : type == ElementType::F16 ? FloatFormat::F16
                                    : FloatFormat::F32;
}
/// The storage format of a kernel's float inputs from the thunk's type.
inline FloatFormat floatFormat(const Thunk &t) { return floatFormat(t.type); }
/// Whether the kernel's float inputs are 16-bit (bf16 or f16).
inline bool isHalf(const Thunk &t) {
  return floatFormat(t) != FloatFormat::F32;
}

/// A grouped QKV (grouped-query attention's and QK-norm's operand
/// `grouped`, [rows, groups * (heads/groups + 2) * head_dim]) with iattrs
/// [heads, groups]: t.m rows, t.n head dim, t.i = [heads, groups]
/// (Attention.cpp).
Status decodeGroupedQkv(Decoder &d, const fb::Instr &in, int grouped, Thunk &t);

} // namespace tessera::rt::ops

#endif // TESSERA_RT_EXECUTOR_OPS_OPS_H
