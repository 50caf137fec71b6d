//===- Executor.cpp - Program interpreter ---------------------------------===//
//
// XLA-thunk-style interpreter: each instruction is decoded once into a Thunk
// (opcode, arena pointers, sizes, attributes, bound communicator) with all
// shape and dtype checks done up front; execution is one switch per thunk.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Executor.h"
#include "tessera/rt/BF16.h"
#include "tessera/rt/LrSchedule.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

namespace tessera::rt {

/// A decoded instruction.
struct Thunk {
  fb::Opcode op = fb::Opcode::Fill;
  void *ptr[6] = {};
  /// gemm: m, n, k; matrix ops: rows (m) x cols (n); elementwise: n.
  int64_t m = 0, n = 0, k = 0;
  /// Integer parameters of the transformer kernels (see decodeInstr); for
  /// Cast, i[0] and i[1] are 1 when X and Y are bf16; for AllGather and
  /// ReduceScatter(Start), i[0] is 1 when in place (the shard is this rank's
  /// block of the full buffer).
  int64_t i[4] = {};
  int64_t bytes = 0;
  bool transA = false, transB = false;
  float alpha = 1.0f, beta = 0.0f;
  float f[5] = {};
  Communicator *comm = nullptr;
  /// Collectives and Send/Recv: the element type; Fill, Scale and Axpy: BF16
  /// selects the bf16 kernel.
  ElementType type = ElementType::F32;
  ReduceKind reduce = ReduceKind::Sum;
  int event = -1;
  std::string where; ///< "function 'f' instruction i (Op at loc)"
  /// Send/Recv: "send to pp rank 2 tag 5, [4, 2, 8] f32 at loc" (watchdog)
  /// and "send→pp2" (trace). Peer index, tag and own index are i[0..2].
  std::string p2pDetail, p2pLabel;
};

/// A function decoded once per microbatch slot (once without slots).
struct Executor::DecodedFunction {
  std::string name;
  int chunk = -1;
  bool forward = false;
  /// Slot region (numSlots = 0: none).
  int64_t slotBase = 0, slotBytes = 0;
  int numSlots = 0;
  /// Not a backward, and some instruction has the loss buffer as an operand.
  bool writesLoss = false;
  std::vector<std::vector<Thunk>> slots;
};

namespace {

using RefVec = flatbuffers::Vector<flatbuffers::Offset<fb::TensorRef>>;

StatusOr<ElementType> elementTypeOf(fb::DType t) {
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

/// Collapses a shape of rank >= 2 to [prod(leading), last].
struct Matrix {
  int64_t rows = 0, cols = 0;
};

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

/// Decodes the instructions of one function against an arena base (which
/// may be null when only validating). `worldRank` < 0 decodes for no rank in
/// particular: membership is not checked, and the positions in the groups
/// (rank-relative operands, in-place collective blocks) are those of
/// `positionRank` where an instance holds it, else index 0 of any instance.
class Decoder {
public:
  using CommLookup =
      std::function<StatusOr<Communicator *>(const std::string &kind)>;

  Decoder(const LoadedArtifact &artifact, const fb::Program &program,
          uint8_t *base, int worldRank, CommLookup lookup,
          int positionRank = -1)
      : artifact(artifact), program(program), base(base), worldRank(worldRank),
        positionRank(worldRank >= 0 ? worldRank : positionRank),
        lookup(std::move(lookup)) {}

  /// Decodes `fn` for microbatch slot `slot` (0 <= slot < num_slots, or 0
  /// when the function has no slots).
  Status decode(const fb::Function &fn, std::vector<Thunk> &out, int slot = 0) {
    std::string fname = fn.name() ? fn.name()->str() : "";
    slotBase = fn.num_slots() > 0 ? fn.slot_base() : 0;
    slotBytes = fn.num_slots() > 0 ? fn.slot_bytes() : 0;
    slotIndex = slot;
    if (!fn.instrs())
      return Status();
    for (flatbuffers::uoffset_t i = 0; i < fn.instrs()->size(); ++i) {
      const fb::Instr &in = *fn.instrs()->Get(i);
      Thunk t;
      t.where = "program " + std::to_string(program.pp_rank()) + " function '" +
                fname + "' instruction " + std::to_string(i) + " (" +
                fb::EnumNameOpcode(in.op());
      if (in.loc() && in.loc()->size())
        t.where += " at " + in.loc()->str();
      t.where += ")";
      Status st = resolveOffsets(in);
      if (st.ok())
        st = checkRelocation(in);
      if (st.ok())
        st = decodeInstr(in, t);
      if (!st.ok())
        return invalidArgument(artifact.name(), ": ", t.where, ": ",
                               st.message());
      out.push_back(std::move(t));
    }
    return Status();
  }

private:
  const fb::TensorRef &ref(const fb::Instr &in, int i) {
    return *in.operands()->Get(flatbuffers::uoffset_t(i));
  }
  /// Resolves every operand's offset on this rank (rank-relative refs moved
  /// to this rank's shard) into `offsets`, before the slot relocation, the
  /// overlap checks and the pointers use it.
  Status resolveOffsets(const fb::Instr &in) {
    offsets.clear();
    if (!in.operands())
      return Status();
    for (flatbuffers::uoffset_t i = 0; i < in.operands()->size(); ++i) {
      const fb::TensorRef &r = *in.operands()->Get(i);
      if (worldRank < 0 && r.rank_group() && r.rank_group()->size()) {
        offsets.push_back(
            r.offset() +
            int64_t(position(r.rank_group()->string_view()).index) *
                r.rank_stride());
        continue;
      }
      StatusOr<int64_t> offset = resolvedOffset(*artifact.root(), r, worldRank);
      if (!offset.ok())
        return invalidArgument("operand ", i, ": ",
                               offset.status().message());
      offsets.push_back(*offset);
    }
    return Status();
  }
  /// The position of the rank decoded for in its instance of `kind`: of
  /// `positionRank` where an instance holds it, else (no rank, or one that
  /// an embedding kind leaves out) index 0 and the size of any instance,
  /// `group` null.
  GroupPosition position(std::string_view kind) const {
    GroupPosition pos;
    if (positionRank >= 0)
      pos = findGroupPosition(*artifact.root(), kind, positionRank);
    if (!pos.group && worldRank < 0)
      pos.size = anyGroupSize(*artifact.root(), kind);
    return pos;
  }
  bool inSlotRegion(int64_t offset) const {
    return slotBytes > 0 && offset >= slotBase && offset < slotBase + slotBytes;
  }
  /// Arena offset of operand `i` on this rank and the slot being decoded.
  int64_t finalOffset(int i) const {
    int64_t offset = offsets[size_t(i)];
    if (inSlotRegion(offset))
      offset += int64_t(slotIndex) * slotBytes;
    return offset;
  }
  /// Arena address of operand `i` on this rank and the slot being decoded.
  void *ptrOf(int i) { return static_cast<void *>(base + finalOffset(i)); }
  /// Operands in the slot region must lie inside it, and their slot's copy
  /// inside the arena.
  Status checkRelocation(const fb::Instr &in) {
    if (slotBytes <= 0 || !in.operands())
      return Status();
    for (flatbuffers::uoffset_t i = 0; i < in.operands()->size(); ++i) {
      const fb::TensorRef &r = *in.operands()->Get(i);
      const int64_t offset = offsets[i];
      if (!inSlotRegion(offset))
        continue;
      int64_t bytes = numel(r) * dtypeSize(r.dtype());
      if (offset + bytes > slotBase + slotBytes)
        return invalidArgument("operand ", i, " ", desc(r), " (offset ",
                               offset, ", ", bytes,
                               " bytes) straddles the end of the slot region [",
                               slotBase, ", ", slotBase + slotBytes, ")");
      int64_t moved = offset + int64_t(slotIndex) * slotBytes;
      if (moved + bytes > program.arena_bytes())
        return invalidArgument("operand ", i, " ", desc(r), " on slot ",
                               slotIndex, " (offset ", moved, ", ", bytes,
                               " bytes) lies outside the arena of ",
                               program.arena_bytes(), " bytes");
    }
    return Status();
  }
  static int64_t numel(const fb::TensorRef &r) {
    return numElements(r.shape());
  }
  static std::string desc(const fb::TensorRef &r) {
    return std::string(fb::EnumNameDType(r.dtype())) + shapeToString(r.shape());
  }
  /// Operands `idx` of `in` are f32: the kernels of every opcode but the
  /// mixed-precision ones (Cast and the bf16 Fill, Scale, Axpy) compute on
  /// f32 only.
  Status requireF32(const fb::Instr &in, std::initializer_list<int> idx) {
    for (int i : idx)
      if (ref(in, i).dtype() != fb::DType::F32)
        return invalidArgument(fb::EnumNameOpcode(in.op()), " operand ", i,
                               " must be F32, got ", desc(ref(in, i)),
                               ref(in, i).dtype() == fb::DType::BF16
                                   ? " (bf16 values need a Cast to f32 first)"
                                   : "");
    return Status();
  }
  /// The format of operand `i` of a mixed-precision opcode: F32 or BF16,
  /// anything else is an error naming the opcode and the dtype.
  StatusOr<FloatFormat> floatFormat(const fb::Instr &in, int i) {
    switch (ref(in, i).dtype()) {
    case fb::DType::F32:
      return FloatFormat::F32;
    case fb::DType::BF16:
      return FloatFormat::BF16;
    default:
      return invalidArgument(fb::EnumNameOpcode(in.op()), " operand ", i,
                             " must be F32 or BF16, got ", desc(ref(in, i)));
    }
  }
  Status requireSameNumel(const fb::Instr &in, std::initializer_list<int> idx) {
    int first = *idx.begin();
    for (int i : idx)
      if (numel(ref(in, i)) != numel(ref(in, first)))
        return invalidArgument("operands ", first, " ", desc(ref(in, first)),
                               " and ", i, " ", desc(ref(in, i)),
                               " must have the same number of elements");
    return Status();
  }
  StatusOr<Matrix> matrix(const fb::Instr &in, int i) {
    const fb::TensorRef &r = ref(in, i);
    int rank = r.shape() ? int(r.shape()->size()) : 0;
    if (rank < 2)
      return invalidArgument("operand ", i, " ", desc(r),
                             " must have rank >= 2");
    Matrix mat;
    mat.cols = r.shape()->Get(flatbuffers::uoffset_t(rank - 1));
    mat.rows = mat.cols ? numel(r) / mat.cols : 0;
    return mat;
  }
  StatusOr<Matrix> rowsCols(const fb::Instr &in, int i) {
    const fb::TensorRef &r = ref(in, i);
    int rank = r.shape() ? int(r.shape()->size()) : 0;
    if (rank < 1)
      return invalidArgument("operand ", i, " ", desc(r),
                             " must have rank >= 1");
    Matrix mat;
    mat.cols = r.shape()->Get(flatbuffers::uoffset_t(rank - 1));
    mat.rows = mat.cols ? numel(r) / mat.cols : 0;
    return mat;
  }

  Status decodeInstr(const fb::Instr &in, Thunk &t);
  Status decodeTransformerInstr(const fb::Instr &in, Thunk &t);
  /// Vocabulary offset (this rank's index in its instance of the Instr's
  /// `group` kind times `localVocab`; 0 without a group) and the number of
  /// shards.
  Status vocabShard(const fb::Instr &in, int64_t localVocab, int64_t &offset,
                    int64_t &shards);

  const LoadedArtifact &artifact;
  const fb::Program &program;
  uint8_t *base;
  int worldRank;
  /// The rank whose group positions are decoded at (worldRank when >= 0).
  int positionRank;
  CommLookup lookup;
  /// The slot region of the function being decoded and the slot.
  int64_t slotBase = 0, slotBytes = 0;
  int slotIndex = 0;
  /// The operands' offsets on this rank (resolveOffsets), before slot
  /// relocation.
  std::vector<int64_t> offsets;
};

Status Decoder::decodeInstr(const fb::Instr &in, Thunk &t) {
  using O = fb::Opcode;
  t.op = in.op();
  t.transA = in.trans_a();
  t.transB = in.trans_b();
  t.alpha = in.alpha();
  t.beta = in.beta();
  t.event = in.event();
  t.reduce =
      in.reduce() == fb::ReduceOp::Max ? ReduceKind::Max : ReduceKind::Sum;
  if (in.fattrs())
    for (flatbuffers::uoffset_t i = 0; i < in.fattrs()->size() && i < 5; ++i)
      t.f[i] = in.fattrs()->Get(i);
  int count = in.operands() ? int(in.operands()->size()) : 0;
  if (count != expectedOperandCount(in.op()))
    return invalidArgument("expected ", expectedOperandCount(in.op()),
                           " operands, got ", count);
  for (int i = 0; i < count; ++i)
    t.ptr[i] = ptrOf(i);
  if (count)
    t.n = numel(ref(in, 0));

  switch (in.op()) {
  case O::Gemm: {
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1, 2}));
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
    return Status();
  }
  case O::BiasAdd: {
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1, 2}));
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
  case O::Add:
  case O::GeluGrad:
  case O::ReluGrad:
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1, 2}));
    return requireSameNumel(in, {0, 1, 2});
  case O::Gelu:
  case O::Relu:
  case O::Sgd:
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
    return requireSameNumel(in, {0, 1});
  case O::Scale:
  case O::Axpy: {
    // f32, or both bf16 (computed in f32, rounded once).
    TESSERA_ASSIGN_OR_RETURN(FloatFormat x, floatFormat(in, 0));
    TESSERA_ASSIGN_OR_RETURN(FloatFormat y, floatFormat(in, 1));
    if (x != y)
      return invalidArgument(fb::EnumNameOpcode(in.op()), " operands ",
                             desc(ref(in, 0)), " and ", desc(ref(in, 1)),
                             " must be both F32 or both BF16 (mix formats "
                             "with a Cast)");
    t.type = x == FloatFormat::BF16 ? ElementType::BF16 : ElementType::F32;
    return requireSameNumel(in, {0, 1});
  }
  case O::Cast: {
    TESSERA_ASSIGN_OR_RETURN(FloatFormat x, floatFormat(in, 0));
    TESSERA_ASSIGN_OR_RETURN(FloatFormat y, floatFormat(in, 1));
    t.i[0] = x == FloatFormat::BF16;
    t.i[1] = y == FloatFormat::BF16;
    return requireSameNumel(in, {0, 1});
  }
  case O::Copy: {
    if (ref(in, 0).dtype() != ref(in, 1).dtype())
      return invalidArgument("Copy between different dtypes ", desc(ref(in, 0)),
                             " and ", desc(ref(in, 1)));
    int64_t size = dtypeSize(ref(in, 1).dtype());
    t.bytes = numel(ref(in, 1)) * size;
    if (in.group() && in.group()->size()) {
      // This rank's block of X: Y holds 1/|group| of X (sequence shards).
      int64_t offset = 0, shards = 1;
      TESSERA_RETURN_IF_ERROR(vocabShard(in, numel(ref(in, 1)), offset, shards));
      if (numel(ref(in, 0)) != numel(ref(in, 1)) * shards)
        return invalidArgument("Copy of a shard: ", desc(ref(in, 0)), " must be ",
                               shards, " times ", desc(ref(in, 1)));
      t.ptr[0] = static_cast<uint8_t *>(t.ptr[0]) + offset * size;
      return Status();
    }
    return requireSameNumel(in, {0, 1});
  }
  case O::ReduceRows: {
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
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
    TESSERA_RETURN_IF_ERROR(grad ? requireF32(in, {0, 2, 3})
                                 : requireF32(in, {0, 2}));
    if (ref(in, 1).dtype() != fb::DType::I32)
      return invalidArgument("targets must be i32, got ", desc(ref(in, 1)));
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
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
    if (numel(ref(in, 1)) != 1)
      return invalidArgument("result must be a scalar, got ", desc(ref(in, 1)));
    return Status();
  case O::MeanGrad:
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
    if (numel(ref(in, 0)) != 1)
      return invalidArgument("dy must be a scalar, got ", desc(ref(in, 0)));
    t.n = numel(ref(in, 1));
    return Status();
  case O::Fill: {
    TESSERA_ASSIGN_OR_RETURN(FloatFormat y, floatFormat(in, 0));
    t.type = y == FloatFormat::BF16 ? ElementType::BF16 : ElementType::F32;
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
      if (ref(in, 0).dtype() != ref(in, 1).dtype())
        return invalidArgument("operands have different dtypes");
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
    if (!in.iattrs() || in.iattrs()->size() != 2)
      return invalidArgument("iattrs must be [peer, tag]");
    int64_t peer = in.iattrs()->Get(0), tag = in.iattrs()->Get(1);
    if (peer != 1 && peer != -1)
      return invalidArgument("peer must be +1 or -1, got ", peer);
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
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1, 2, 3}));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2, 3}));
    if (ref(in, 4).dtype() != fb::DType::I64 || numel(ref(in, 4)) != 1)
      return invalidArgument("iteration operand must be a scalar i64, got ",
                             desc(ref(in, 4)));
    if (!in.fattrs() || in.fattrs()->size() != 5)
      return invalidArgument("fattrs must be [lr, beta1, beta2, eps, wd]");
    return Status();
  }
  case O::LayerNorm:
  case O::LayerNormGrad:
  case O::Embedding:
  case O::EmbeddingGrad:
  case O::AddPositionEmbedding:
  case O::PositionEmbeddingGrad:
  case O::Attention:
  case O::AttentionGrad:
  case O::LogitsMax:
  case O::CrossEntropyStats:
  case O::CrossEntropyFromStats:
  case O::CrossEntropyStatsGrad:
  case O::TokenMean:
  case O::TokenMeanGrad:
  case O::Dropout:
    return decodeTransformerInstr(in, t);
  }
  return unimplemented("unknown opcode ", int(in.op()));
}

Status Decoder::vocabShard(const fb::Instr &in, int64_t localVocab,
                           int64_t &offset, int64_t &shards) {
  offset = 0;
  shards = 1;
  std::string kind = in.group() ? in.group()->str() : "";
  if (kind.empty())
    return Status();
  if (!hasGroupKind(*artifact.root(), kind))
    return invalidArgument("sharded over group kind '", kind,
                           "' but the artifact has no rank groups of that "
                           "kind");
  GroupPosition pos = position(kind);
  if (!pos.group && worldRank >= 0)
    return invalidArgument("rank ", worldRank, " is in no rank group of kind '",
                           kind, "', which shards this kernel's operand");
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
  auto requireI32 = [&](int i, const char *what) -> Status {
    if (ref(in, i).dtype() != fb::DType::I32)
      return invalidArgument(what, " (operand ", i, ") must be i32, got ",
                             desc(ref(in, i)));
    return Status();
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
  int expectedIAttrs = expectedIAttrCount(in.op());
  if (int(in.iattrs() ? in.iattrs()->size() : 0) != expectedIAttrs)
    return invalidArgument("expected ", expectedIAttrs, " iattrs");

  switch (in.op()) {
  case O::LayerNorm:
  case O::LayerNormGrad: {
    bool grad = in.op() == O::LayerNormGrad;
    TESSERA_RETURN_IF_ERROR(grad ? requireF32(in, {0, 1, 2, 3, 4, 5})
                                 : requireF32(in, {0, 1, 2, 3}));
    if (!in.fattrs() || in.fattrs()->size() != 1)
      return invalidArgument("fattrs must be [eps]");
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
  case O::Embedding:
  case O::EmbeddingGrad: {
    bool grad = in.op() == O::EmbeddingGrad;
    int table = grad ? 2 : 1, rowsRef = grad ? 1 : 2;
    TESSERA_RETURN_IF_ERROR(requireI32(0, "ids"));
    TESSERA_RETURN_IF_ERROR(requireF32(in, {1, 2}));
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
    TESSERA_RETURN_IF_ERROR(grad ? requireF32(in, {0, 1})
                                 : requireF32(in, {0, 1, 2}));
    if (rankOf(0) < 2)
      return invalidArgument("operand 0 ", desc(ref(in, 0)),
                             " must be [S, B, H] (rank >= 2)");
    if (rankOf(pos) != 2)
      return invalidArgument("position table ", desc(ref(in, pos)),
                             " must be [positions, H]");
    int64_t s = dim(0, 0), h = dim(0, rankOf(0) - 1);
    int64_t b = s * h != 0 ? numel(ref(in, 0)) / (s * h) : 0;
    if (dim(pos, 1) != h || dim(pos, 0) < s)
      return invalidArgument("position table ", desc(ref(in, pos)),
                             " must have hidden size ", h, " and at least ", s,
                             " rows for ", desc(ref(in, 0)));
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
    TESSERA_RETURN_IF_ERROR(grad ? requireF32(in, {0, 1, 2})
                                 : requireF32(in, {0, 1}));
    if (rankOf(0) != 3 || rankOf(out) != 3)
      return invalidArgument("QKV ", desc(ref(in, 0)), " and ",
                             grad ? "dO " : "O ", desc(ref(in, out)),
                             " must be [S, B, features]");
    int64_t heads = iattr(0);
    int64_t f = dim(out, 2);
    if (dim(0, 0) != dim(out, 0) || dim(0, 1) != dim(out, 1) ||
        dim(0, 2) != 3 * f)
      return invalidArgument("QKV ", desc(ref(in, 0)), " must be [S, B, 3 * ",
                             f, "] for ", grad ? "dO " : "O ",
                             desc(ref(in, out)));
    if (heads <= 0 || dim(0, 2) % (3 * heads) != 0)
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
    if (t.k != 0 && t.k != 1)
      return invalidArgument("causal must be 0 or 1, got ", t.k);
    return Status();
  }
  case O::LogitsMax: {
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
    TESSERA_ASSIGN_OR_RETURN(Matrix z, rowsCols(in, 0));
    TESSERA_RETURN_IF_ERROR(requireNumel(1, z.rows, "row max"));
    t.m = z.rows;
    t.n = z.cols;
    return Status();
  }
  case O::CrossEntropyStats:
  case O::CrossEntropyStatsGrad: {
    bool grad = in.op() == O::CrossEntropyStatsGrad;
    TESSERA_RETURN_IF_ERROR(grad ? requireF32(in, {0, 2, 3, 4, 5})
                                 : requireF32(in, {0, 2, 3, 4}));
    TESSERA_RETURN_IF_ERROR(requireI32(1, "labels"));
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
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1, 2, 4}));
    TESSERA_RETURN_IF_ERROR(requireI32(3, "labels"));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1, 2, 3, 4}));
    t.m = numel(ref(in, 0));
    t.i[0] = iattr(0);
    return Status();
  }
  case O::Dropout: {
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 1}));
    TESSERA_RETURN_IF_ERROR(requireSameNumel(in, {0, 1}));
    if (rankOf(0) != 3)
      return invalidArgument("Dropout expects [seq, batch, hidden], got ",
                             desc(ref(in, 0)));
    if (!in.fattrs() || in.fattrs()->size() != 1 || in.fattrs()->Get(0) < 0 ||
        in.fattrs()->Get(0) >= 1)
      return invalidArgument("Dropout needs fattrs = [rate] with rate in [0, 1)");
    t.m = dim(0, 0);
    t.n = dim(0, 1);
    t.k = dim(0, 2);
    int64_t offset = 0, shards = 1;
    TESSERA_RETURN_IF_ERROR(vocabShard(in, t.m, offset, shards));
    t.i[0] = offset;
    t.i[1] = t.m * shards;
    t.i[2] = iattr(0);
    return Status();
  }
  case O::TokenMean:
  case O::TokenMeanGrad: {
    bool grad = in.op() == O::TokenMeanGrad;
    TESSERA_RETURN_IF_ERROR(requireF32(in, {0, 2}));
    TESSERA_RETURN_IF_ERROR(requireI32(1, "labels"));
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

} // namespace

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

Executor::Executor() = default;

Executor::~Executor() {
  if (arena && be)
    be->deallocate(arena);
}

static const fb::Program *selectProgram(const LoadedArtifact &artifact,
                                        int worldRank) {
  return artifact.programForWorldRank(worldRank);
}

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
      if (selectProgram(artifact, r) != p)
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
      for (const fb::Function *fn : *p->functions())
        for (int slot = 0; slot < std::max(1, fn->num_slots()); ++slot) {
          std::vector<Thunk> thunks;
          TESSERA_RETURN_IF_ERROR(decoder.decode(*fn, thunks, slot));
        }
    }
  }
  // Every rank must find a program, and be in a group of every kind its
  // program's collectives use; a program with Send/Recv needs a pp group of
  // more than one rank holding the rank.
  for (int r = 0; r < a.world_size(); ++r) {
    const fb::Program *p = selectProgram(artifact, r);
    if (!p)
      return invalidArgument(artifact.name(), ": no program for rank ", r,
                             " (its pp index has no program)");
    TESSERA_RETURN_IF_ERROR(checkCollectiveMembership(artifact, *p, r));
    TESSERA_RETURN_IF_ERROR(checkPipelineMembership(artifact, *p, r));
  }
  return Status();
}

StatusOr<std::unique_ptr<Executor>>
Executor::create(std::shared_ptr<const LoadedArtifact> artifact,
                 std::unique_ptr<Backend> backend, CommunicatorSet comms,
                 int worldRank, const ExecutorOptions &options) {
  if (!artifact || !backend)
    return invalidArgument("Executor::create needs an artifact and a backend");
  std::unique_ptr<Executor> ex(new Executor());
  const fb::Artifact &a = *artifact->root();
  if (worldRank < 0 || worldRank >= a.world_size())
    return invalidArgument(artifact->name(), ": rank ", worldRank,
                           " outside world_size ", a.world_size());
  ex->prog = selectProgram(*artifact, worldRank);
  if (!ex->prog)
    return invalidArgument(artifact->name(), ": no program for rank ",
                           worldRank);
  ex->art = std::move(artifact);
  ex->be = std::move(backend);
  ex->comms = std::move(comms);
  ex->rank = worldRank;
  ex->options = options;

  GroupPosition dp = findGroupPosition(a, "dp", worldRank);
  GroupPosition pp = findGroupPosition(a, "pp", worldRank);
  ex->ppIndex = pp.group ? pp.index : 0;
  ex->ppSize = pp.group ? pp.size : 1;
  ex->layout.seed = options.seed;
  ex->layout.globalBatch = a.batch()->global_batch_size();
  ex->layout.microBatch = a.batch()->micro_batch_size();
  ex->layout.dpIndex = dp.index;
  ex->layout.dpSize = dp.size;
  ex->layout.dataset = options.dataset;
  if (options.dataset)
    TESSERA_RETURN_IF_ERROR(checkTokenInputs(
        *ex->prog, ex->layout.microBatch, *options.dataset, ex->art->name()));

  TESSERA_ASSIGN_OR_RETURN(void *mem,
                           ex->be->allocate(ex->prog->arena_bytes()));
  ex->arena = static_cast<uint8_t *>(mem);
  TESSERA_RETURN_IF_ERROR(ex->bindFunctions());
  return ex;
}

Status Executor::bindFunctions() {
  auto lookup = [this](const std::string &kind) -> StatusOr<Communicator *> {
    auto it = comms.groups.find(kind);
    if (it != comms.groups.end() && it->second)
      return it->second.get();
    // Kinds with a one-rank instance here may run without MPI. The decoder
    // has already rejected kinds whose instances leave this rank out.
    GroupPosition pos = findGroupPosition(*art->root(), kind, rank);
    if (pos.size != 1)
      return failedPrecondition("no communicator for group kind '", kind, "' (",
                                pos.size, " ranks)");
    auto &self = selfComms[kind];
    if (!self)
      self = createSelfCommunicator();
    return self.get();
  };
  Decoder decoder(*art, *prog, arena, rank, lookup);
  int64_t lossOffset = prog->loss_buffer() >= 0
                           ? prog->buffers()->Get(prog->loss_buffer())->offset()
                           : -1;
  if (prog->functions())
    for (const fb::Function *fn : *prog->functions()) {
      DecodedFunction f;
      f.name = fn->name() ? fn->name()->str() : "";
      f.chunk = fn->chunk();
      f.forward = isForwardFunction(f.name);
      f.numSlots = fn->num_slots();
      f.slotBase = f.numSlots > 0 ? fn->slot_base() : 0;
      f.slotBytes = f.numSlots > 0 ? fn->slot_bytes() : 0;
      f.slots.resize(size_t(std::max(1, f.numSlots)));
      for (int slot = 0; slot < int(f.slots.size()); ++slot)
        TESSERA_RETURN_IF_ERROR(
            decoder.decode(*fn, f.slots[size_t(slot)], slot));
      // A backward that reads (or recomputes) the loss does not add to it.
      if (lossOffset >= 0 && fn->instrs() && !isBackwardFunction(f.name))
        for (const fb::Instr *in : *fn->instrs())
          if (in->operands())
            for (const fb::TensorRef *r : *in->operands()) {
              // Decoding resolved every rank-relative ref already.
              StatusOr<int64_t> offset =
                  resolvedOffset(*art->root(), *r, rank);
              f.writesLoss |= offset.ok() && *offset == lossOffset;
            }
      functionIndex[f.name] = functions.size();
      functions.push_back(std::move(f));
    }
  for (const fb::Program *p : *art->root()->programs())
    artifactHasLoss |= p->loss_buffer() >= 0;
  // Inputs in no forward's slot region are filled in place by every forward.
  if (prog->inputs())
    for (const fb::InputSpec *spec : *prog->inputs()) {
      int64_t offset = prog->buffers()->Get(spec->buffer())->offset();
      bool slotted = false;
      for (const DecodedFunction &f : functions)
        slotted |= f.forward && f.numSlots > 0 && offset >= f.slotBase &&
                   offset < f.slotBase + f.slotBytes;
      if (!slotted)
        unslottedInputs.push_back(spec);
    }
  bool scheduled = prog->schedule() && prog->schedule()->size();
  if (scheduled)
    for (const fb::ScheduleStep *step : *prog->schedule())
      stageHasLoss |= functions[size_t(step->function())].writesLoss;
  if (!scheduled && !functionIndex.count("microbatch"))
    return invalidArgument(art->name(), ": program ", prog->pp_rank(),
                           " has no 'microbatch' function (and no "
                           "schedule)");
  return Status();
}

const fb::Buffer *Executor::findBuffer(const std::string &name) const {
  if (prog->buffers())
    for (const fb::Buffer *b : *prog->buffers())
      if (b->name() && b->name()->str() == name)
        return b;
  return nullptr;
}

Status Executor::initializeParameters() {
  std::vector<float> host;
  std::vector<uint16_t> half;
  for (const fb::Buffer *b : *prog->buffers()) {
    int64_t n = numElements(b->shape());
    if (b->kind() == fb::BufferKind::MainParam) {
      // Zero until "init" (or a checkpoint) writes them, also when the
      // parameters are initialised a second time.
      std::vector<uint8_t> zeros(size_t(n * dtypeSize(b->dtype())), 0);
      TESSERA_RETURN_IF_ERROR(be->copyToDevice(
          arena + b->offset(), zeros.data(), int64_t(zeros.size())));
      continue;
    }
    if (b->kind() != fb::BufferKind::Param && b->init() == fb::InitKind::Zeros)
      continue;
    if (b->kind() != fb::BufferKind::Param && b->dtype() != fb::DType::F32)
      continue;
    host.assign(size_t(n), 0.0f);
    TESSERA_RETURN_IF_ERROR(initParameterBuffer(
        *art->root(), *b, rank, options.seed, art->name(), host.data()));
    if (b->dtype() == fb::DType::BF16) {
      // The f32 initial values rounded: a bf16 run starts from the f32
      // run's weights to bf16 precision.
      half.resize(size_t(n));
      floatsToBf16(host.data(), half.data(), n);
      TESSERA_RETURN_IF_ERROR(
          be->copyToDevice(arena + b->offset(), half.data(), n * 2));
    } else {
      TESSERA_RETURN_IF_ERROR(
          be->copyToDevice(arena + b->offset(), host.data(), n * 4));
    }
  }
  initDue = true;
  mainParamWritten.assign(prog->buffers()->size(), false);
  return Status();
}

StatusOr<bool> Executor::runInit() {
  if (!initDue)
    return false;
  initDue = false;
  auto it = functionIndex.find("init");
  if (it == functionIndex.end())
    return false;
  // Skipped when a checkpoint restored every main param: recomputing them
  // from the bf16 params would throw away their fp32 precision.
  int mainParams = 0, restored = 0;
  for (flatbuffers::uoffset_t i = 0; i < prog->buffers()->size(); ++i)
    if (prog->buffers()->Get(i)->kind() == fb::BufferKind::MainParam) {
      ++mainParams;
      restored += i < mainParamWritten.size() && mainParamWritten[i];
    }
  if (mainParams > 0 && restored == mainParams)
    return false;
  const DecodedFunction &fn = functions[it->second];
  TESSERA_RETURN_IF_ERROR(runThunks(fn, 0, "init", "", /*drainP2p=*/true));
  return true;
}

Status Executor::fillInputs(int64_t iteration, int64_t microbatch,
                            int64_t displacement, int64_t regionBegin,
                            int64_t regionEnd) {
  if (!prog->inputs())
    return Status();
  for (const fb::InputSpec *spec : *prog->inputs()) {
    int64_t offset = prog->buffers()->Get(spec->buffer())->offset();
    if (offset >= regionBegin && offset < regionEnd)
      TESSERA_RETURN_IF_ERROR(
          fillInput(*spec, iteration, microbatch, displacement));
  }
  return Status();
}

Status Executor::fillInput(const fb::InputSpec &spec, int64_t iteration,
                           int64_t microbatch, int64_t displacement) {
  TESSERA_RETURN_IF_ERROR(generateInput(*prog, spec, layout, iteration,
                                        microbatch, art->name(), hostInput));
  const fb::Buffer *b = prog->buffers()->Get(spec.buffer());
  int64_t offset = b->offset() + displacement;
  int64_t bytes = int64_t(hostInput.size());
  if (offset < 0 || offset + bytes > prog->arena_bytes())
    return outOfRange(art->name(), ": input '",
                      spec.name() ? spec.name()->str() : "", "' moved by ",
                      displacement, " bytes lies outside the arena of ",
                      prog->arena_bytes(), " bytes");
  return be->copyToDevice(arena + offset, hostInput.data(), bytes);
}

Status Executor::execute(const Thunk &t) {
  using O = fb::Opcode;
  auto F = [&](int i) { return static_cast<float *>(t.ptr[i]); };
  auto I = [&](int i) { return static_cast<const int32_t *>(t.ptr[i]); };
  auto H = [&](int i) { return static_cast<uint16_t *>(t.ptr[i]); };
  switch (t.op) {
  case O::Gemm:
    return be->gemm(t.transA, t.transB, t.m, t.n, t.k, t.alpha, F(0), F(1),
                    t.beta, F(2));
  case O::BiasAdd:
    return be->biasAdd(F(0), F(1), F(2), t.m, t.n);
  case O::Add:
    return be->add(F(0), F(1), F(2), t.n);
  case O::Gelu:
    return be->gelu(F(0), F(1), t.n);
  case O::GeluGrad:
    return be->geluGrad(F(0), F(1), F(2), t.n);
  case O::Relu:
    return be->relu(F(0), F(1), t.n);
  case O::ReluGrad:
    return be->reluGrad(F(0), F(1), F(2), t.n);
  case O::ReduceRows:
    return be->reduceRows(F(0), F(1), t.m, t.n, t.alpha, t.beta);
  case O::CrossEntropy:
    return be->crossEntropy(F(0), I(1), F(2), t.m, t.n);
  case O::CrossEntropyGrad:
    return be->crossEntropyGrad(F(0), I(1), F(2), F(3), t.m, t.n);
  case O::Mean:
    return be->mean(F(0), F(1), t.n);
  case O::MeanGrad:
    return be->meanGrad(F(0), F(1), t.n);
  case O::Fill:
    if (t.type == ElementType::BF16)
      return be->fillBf16(H(0), t.f[0], t.n);
    return be->fill(F(0), t.f[0], t.n);
  case O::Scale:
    if (t.type == ElementType::BF16)
      return be->scaleBf16(H(0), H(1), t.alpha, t.n);
    return be->scale(F(0), F(1), t.alpha, t.n);
  case O::Copy:
    return be->copy(t.ptr[0], t.ptr[1], t.bytes);
  case O::Axpy:
    if (t.type == ElementType::BF16)
      return be->axpyBf16(t.alpha, H(0), H(1), t.n);
    return be->axpy(t.alpha, F(0), F(1), t.n);
  case O::Cast:
    return be->cast(t.ptr[0], t.i[0] ? FloatFormat::BF16 : FloatFormat::F32,
                    t.ptr[1], t.i[1] ? FloatFormat::BF16 : FloatFormat::F32,
                    t.n, t.beta);
  case O::AllReduce:
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    return t.comm->allReduce(t.ptr[0], t.n, t.type, t.reduce);
  case O::AllGather:
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    if (t.i[0])
      return t.comm->allGatherInPlace(t.ptr[1], t.n, t.type);
    return t.comm->allGather(t.ptr[0], t.ptr[1], t.n, t.type);
  case O::ReduceScatter:
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    if (t.i[0])
      return t.comm->reduceScatterInPlace(t.ptr[0], t.n, t.type, t.reduce);
    return t.comm->reduceScatter(t.ptr[0], t.ptr[1], t.n, t.type, t.reduce);
  case O::AllReduceStart: {
    if (pending.count(t.event))
      return failedPrecondition("event ", t.event, " is already in flight");
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    TESSERA_ASSIGN_OR_RETURN(
        CommRequest req,
        t.comm->allReduceStart(t.ptr[0], t.n, t.type, t.reduce));
    pending[t.event] = {t.comm, req};
    return Status();
  }
  case O::ReduceScatterStart: {
    if (pending.count(t.event))
      return failedPrecondition("event ", t.event, " is already in flight");
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    // In place, the communicator moves the result into this rank's block
    // when the Wait completes it.
    TESSERA_ASSIGN_OR_RETURN(
        CommRequest req,
        t.i[0] ? t.comm->reduceScatterInPlaceStart(t.ptr[0], t.n, t.type,
                                                   t.reduce)
               : t.comm->reduceScatterStart(t.ptr[0], t.ptr[1], t.n, t.type,
                                            t.reduce));
    pending[t.event] = {t.comm, req};
    return Status();
  }
  case O::Send:
  case O::Recv: {
    // Posted now, completed with the rest of the batch (completeP2pBatch).
    TESSERA_RETURN_IF_ERROR(be->synchronize());
    if (p2pBatch.empty()) {
      p2pBatchOpener =
          "function '" + (currentFunction ? currentFunction->name : "?") + "'";
      if (currentFunction && currentFunction->name != "step")
        p2pBatchOpener += " microbatch " + std::to_string(currentMicrobatch);
      if (currentFunction && currentFunction->numSlots > 0)
        p2pBatchOpener += " slot " + std::to_string(currentSlot);
    }
    StatusOr<CommRequest> req =
        t.op == O::Send
            ? t.comm->isend(t.ptr[0], t.n, t.type, int(t.i[0]), int(t.i[1]))
            : t.comm->irecv(t.ptr[0], t.n, t.type, int(t.i[0]), int(t.i[1]));
    if (!req.ok())
      return req.status();
    p2pBatch.push_back({t.comm, *req, &t});
    return Status();
  }
  case O::Wait: {
    auto it = pending.find(t.event);
    if (it == pending.end())
      return failedPrecondition("Wait on event ", t.event,
                                " which was not started");
    auto [comm, req] = it->second;
    pending.erase(it);
    return comm->wait(req);
  }
  case O::Adam: {
    int64_t step = 0;
    TESSERA_RETURN_IF_ERROR(be->copyToHost(&step, t.ptr[4], 8));
    AdamParams hp{float(t.f[0] * lrFactor), t.f[1], t.f[2], t.f[3], t.f[4]};
    return be->adam(F(0), F(1), F(2), F(3), t.n, step, hp);
  }
  case O::Sgd:
    return be->sgd(F(0), F(1), t.n, float(t.f[0] * lrFactor), t.f[1]);
  case O::LayerNorm:
    return be->layerNorm(F(0), F(1), F(2), F(3), t.m, t.n, t.f[0]);
  case O::LayerNormGrad:
    return be->layerNormGrad(F(0), F(1), F(2), F(3), F(4), F(5), t.m, t.n,
                             t.f[0], t.beta);
  case O::Embedding:
    return be->embedding(I(0), F(1), F(2), t.m, t.i[0], t.n, t.i[1], t.i[2]);
  case O::EmbeddingGrad:
    return be->embeddingGrad(I(0), F(1), F(2), t.m, t.i[0], t.n, t.i[1],
                             t.beta);
  case O::AddPositionEmbedding:
    return be->addPositionEmbedding(F(0), F(1), F(2), t.i[0], t.i[1], t.i[2]);
  case O::PositionEmbeddingGrad:
    return be->positionEmbeddingGrad(F(0), F(1), t.i[0], t.i[1], t.i[2], t.i[3],
                                     t.beta);
  case O::Attention:
    return be->attention(F(0), F(1), t.i[0], t.i[1], t.i[2], t.i[3], t.k != 0);
  case O::AttentionGrad:
    return be->attentionGrad(F(0), F(1), F(2), t.i[0], t.i[1], t.i[2], t.i[3],
                             t.k != 0);
  case O::LogitsMax:
    return be->logitsMax(F(0), F(1), t.m, t.n);
  case O::CrossEntropyStats:
    return be->crossEntropyStats(F(0), I(1), F(2), F(3), F(4), t.m, t.n, t.i[0],
                                 t.i[1], t.i[2]);
  case O::CrossEntropyFromStats:
    return be->crossEntropyFromStats(F(0), F(1), F(2), I(3), F(4), t.m, t.i[0]);
  case O::CrossEntropyStatsGrad:
    return be->crossEntropyStatsGrad(F(0), I(1), F(2), F(3), F(4), F(5), t.m,
                                     t.n, t.i[0], t.i[1], t.i[2]);
  case O::TokenMean:
    return be->tokenMean(F(0), I(1), F(2), t.m, t.i[0]);
  case O::TokenMeanGrad:
    return be->tokenMeanGrad(F(0), I(1), F(2), t.m, t.i[0]);
  case O::Dropout: {
    // Masks are keyed by the global sample of each batch column.
    std::vector<int64_t> samples(size_t(t.n));
    for (int64_t b = 0; b < t.n; ++b)
      samples[size_t(b)] =
          globalSampleIndex(layout, currentIteration, currentMicrobatch, b);
    return be->dropout(F(0), F(1), t.m, t.n, t.k, t.i[0], t.i[1],
                       samples.data(), options.seed, t.i[2], t.f[0]);
  }
  }
  return unimplemented("unknown opcode ", int(t.op));
}

static int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Executor::stalledInstruction(double seconds) const {
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    if (!waitDescription.empty()) {
      double stuck = double(steadyNowNs() - waitSinceNs) * 1e-9;
      if (stuck < seconds)
        return "";
      return art->name() + ": " + waitDescription + " made no progress for " +
             std::to_string(int64_t(stuck)) + " s";
    }
  }
  const Thunk *t = inFlight.load();
  if (!t)
    return "";
  double stuck = double(steadyNowNs() - inFlightSinceNs.load()) * 1e-9;
  if (stuck < seconds || inFlight.load() != t)
    return "";
  return art->name() + ": " + t->where + " made no progress for " +
         std::to_string(int64_t(stuck)) + " s";
}

Status Executor::completeP2pBatch() {
  if (p2pBatch.empty())
    return Status();
  std::vector<P2pOp> batch;
  batch.swap(p2pBatch);
  std::string what =
      "pipeline stage " + std::to_string(ppIndex) + " (pp rank " +
      std::to_string(ppIndex) + " of " + std::to_string(ppSize) +
      "): waiting for the p2p batch opened by " + p2pBatchOpener + ": ";
  for (size_t i = 0; i < batch.size(); ++i)
    what += (i ? "; " : "") + batch[i].thunk->p2pDetail;
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription = what;
    waitSinceNs = steadyNowNs();
  }
  auto start = std::chrono::steady_clock::now();
  // Every request of one communicator is waited together (all Send/Recv run
  // over "pp", so this is one MPI_Waitall).
  Status st;
  std::vector<Communicator *> order;
  std::map<Communicator *, std::vector<CommRequest>> byComm;
  for (const P2pOp &op : batch) {
    if (!byComm.count(op.comm))
      order.push_back(op.comm);
    byComm[op.comm].push_back(op.request);
  }
  for (Communicator *comm : order) {
    Status s = comm->waitAll(byComm[comm]);
    if (st.ok())
      st = s;
  }
  {
    std::lock_guard<std::mutex> lock(waitMutex);
    waitDescription.clear();
  }
  auto end = std::chrono::steady_clock::now();
  if (options.profile)
    kernelTime["P2pWait"] += std::chrono::duration<double>(end - start).count();
  if (options.trace)
    trace.push_back({"p2p wait", "p2p", sinceEpochUs(start),
                     sinceEpochUs(end) - sinceEpochUs(start)});
  if (!st.ok())
    return Status(st.getCode(),
                  art->name() + ": " + what + ": " + st.message());
  return Status();
}

std::string Executor::phaseName(const DecodedFunction &fn,
                                int64_t microbatch) const {
  std::string mb = "mb" + std::to_string(microbatch);
  if (fn.name == "microbatch" || fn.name == "microbatch:last")
    return "microbatch " + std::to_string(microbatch);
  bool forward = fn.forward, backward = isBackwardFunction(fn.name);
  if (!forward && !backward)
    return fn.name;
  int chunk = fn.chunk;
  size_t c = fn.name.rfind("_c");
  if (chunk < 0 && c != std::string::npos && c + 2 < fn.name.size() &&
      std::all_of(fn.name.begin() + long(c) + 2, fn.name.end(),
                  [](char ch) { return std::isdigit((unsigned char)ch); }))
    chunk = std::atoi(fn.name.c_str() + c + 2);
  return std::string(forward ? "F " : "B ") +
         (chunk >= 0 ? "c" + std::to_string(chunk) + " " : "") + mb;
}

Status Executor::runFunction(const std::string &name, int slot) {
  auto it = functionIndex.find(name);
  if (it == functionIndex.end())
    return notFound(art->name(), ": program ", prog->pp_rank(),
                    " has no function '", name, "'");
  const DecodedFunction &fn = functions[it->second];
  if (slot < 0 || slot >= int(fn.slots.size()))
    return outOfRange(art->name(), ": program ", prog->pp_rank(), " function '",
                      name, "' has no slot ", slot, " (", fn.numSlots,
                      " slots)");
  return runThunks(fn, slot, phaseName(fn, currentMicrobatch), "",
                   /*drainP2p=*/false);
}

Status Executor::runThunks(const DecodedFunction &fn, int slot,
                           const std::string &phase, const std::string &context,
                           bool drainP2p) {
  const bool timed = options.profile || options.trace;
  currentFunction = &fn;
  currentSlot = slot;
  auto phaseStart = std::chrono::steady_clock::now();
  for (const Thunk &t : fn.slots[size_t(slot)]) {
    const bool p2p = isPointToPoint(t.op);
    // Anything but another Send/Recv needs the open batch completed first.
    if (!p2p)
      TESSERA_RETURN_IF_ERROR(completeP2pBatch());
    Status st;
    auto start = timed ? std::chrono::steady_clock::now()
                       : std::chrono::steady_clock::time_point();
    inFlightSinceNs.store(steadyNowNs());
    inFlight.store(&t);
    try {
      st = execute(t);
    } catch (const std::exception &e) {
      st = internalError("exception: ", e.what());
    }
    inFlight.store(nullptr);
    if (timed) {
      // Kernels may run asynchronously on other backends: time to completion.
      if (st.ok())
        st = be->synchronize();
      auto end = std::chrono::steady_clock::now();
      if (options.profile)
        kernelTime[fb::EnumNameOpcode(t.op)] +=
            std::chrono::duration<double>(end - start).count();
      if (options.trace)
        trace.push_back({p2p ? t.p2pLabel : fb::EnumNameOpcode(t.op),
                         p2p      ? "p2p"
                         : t.comm ? "communication"
                                  : "compute",
                         sinceEpochUs(start),
                         sinceEpochUs(end) - sinceEpochUs(start)});
    }
    if (!st.ok())
      return Status(st.getCode(), art->name() + ": " + t.where + context +
                                      ": " + st.message());
    // Started collectives advance between kernels (overlap with compute).
    if (!pending.empty() && !t.comm && !p2p)
      for (auto &[event, request] : pending)
        TESSERA_RETURN_IF_ERROR(request.first->progress(request.second).withContext(
            art->name() + ": " + t.where + context + ": progressing event " +
            std::to_string(event)));
  }
  if (drainP2p)
    TESSERA_RETURN_IF_ERROR(completeP2pBatch());
  if (options.trace) {
    double begin = sinceEpochUs(phaseStart);
    trace.push_back({phase, "phase", begin,
                     sinceEpochUs(std::chrono::steady_clock::now()) - begin});
  }
  if (!pending.empty()) {
    int event = pending.begin()->first;
    // Complete the stray requests so MPI state stays consistent.
    for (auto &entry : pending)
      entry.second.first->wait(entry.second.second).ignoreError();
    pending.clear();
    return failedPrecondition(
        art->name(), ": program ", prog->pp_rank(), " function '", fn.name,
        "' ended with async event ", event, " never waited for");
  }
  return be->synchronize();
}

double Executor::learningRate(int64_t iteration) const {
  const fb::Optimizer *opt = art->root()->optimizer();
  if (!opt)
    return 0.0;
  LrSchedule schedule;
  schedule.maxLr = opt->lr();
  schedule.minLr = opt->min_lr();
  schedule.warmupIters = opt->lr_warmup_iters();
  schedule.decayIters = opt->lr_decay_iters();
  if (opt->lr_decay_style() && opt->lr_decay_style()->size())
    schedule.style = opt->lr_decay_style()->str();
  return schedule.at(iteration);
}

Status Executor::runStep(int64_t iteration) {
  // Gradient sync and the optimizer run once, after every microbatch.
  TESSERA_RETURN_IF_ERROR(completeP2pBatch());
  if (prog->iteration_buffer() >= 0) {
    const fb::Buffer *b = prog->buffers()->Get(prog->iteration_buffer());
    int64_t it = iteration;
    TESSERA_RETURN_IF_ERROR(be->copyToDevice(arena + b->offset(), &it, 8));
  }
  if (functionIndex.count("step"))
    TESSERA_RETURN_IF_ERROR(runFunction("step"));
  return completeP2pBatch();
}

StatusOr<double> Executor::runIteration(int64_t iteration) {
  // The main params exist before the first step (callers that restore a
  // checkpoint run "init" themselves, after the load).
  if (initDue)
    TESSERA_RETURN_IF_ERROR(runInit().status());
  // The optimizer steps carry the peak rate; the schedule scales it.
  if (const fb::Optimizer *opt = art->root()->optimizer())
    lrFactor = opt->lr() > 0 ? learningRate(iteration) / double(opt->lr()) : 1.0;
  if (prog->schedule() && prog->schedule()->size())
    return runSchedule(iteration);
  const int64_t numMicro = art->root()->batch()->num_microbatches();
  double lossSum = 0.0;
  bool hasLoss = prog->loss_buffer() >= 0;
  for (int64_t m = 0; m < numMicro; ++m) {
    TESSERA_RETURN_IF_ERROR(fillInputs(iteration, m));
    currentIteration = iteration;
    currentMicrobatch = m;
    // The last microbatch may have a variant that starts the gradient
    // buckets' reductions during its backward (overlap).
    const bool last = m + 1 == numMicro && functionIndex.count("microbatch:last");
    TESSERA_RETURN_IF_ERROR(runFunction(last ? "microbatch:last" : "microbatch"));
    if (hasLoss) {
      const fb::Buffer *b = prog->buffers()->Get(prog->loss_buffer());
      float loss = 0.0f;
      TESSERA_RETURN_IF_ERROR(be->copyToHost(&loss, arena + b->offset(), 4));
      lossSum += double(loss);
    }
  }
  TESSERA_RETURN_IF_ERROR(runStep(iteration));
  if (!hasLoss)
    return std::numeric_limits<double>::quiet_NaN();
  double loss = lossSum / double(numMicro);
  if (comms.lossReduce && comms.lossReduce->size() > 1) {
    TESSERA_RETURN_IF_ERROR(
        comms.lossReduce->allReduce(&loss, 1, ElementType::F64, ReduceKind::Sum)
            .withContext(art->name() + ": averaging the loss over dp"));
    loss /= double(comms.lossReduce->size());
  }
  return loss;
}

StatusOr<double> Executor::runSchedule(int64_t iteration) {
  const int64_t numMicro = art->root()->batch()->num_microbatches();
  const auto &schedule = *prog->schedule();
  double lossSum = 0.0;
  int64_t lossOffset = prog->loss_buffer() >= 0
                           ? prog->buffers()->Get(prog->loss_buffer())->offset()
                           : -1;
  currentIteration = iteration;
  for (flatbuffers::uoffset_t si = 0; si < schedule.size(); ++si) {
    const fb::ScheduleStep &step = *schedule.Get(si);
    const DecodedFunction &fn = functions[size_t(step.function())];
    const int slot = step.slot();
    const int64_t displacement = int64_t(slot) * fn.slotBytes;
    currentMicrobatch = step.microbatch();
    std::string context = " in schedule step " + std::to_string(si) +
                          " (microbatch " + std::to_string(step.microbatch()) +
                          ", slot " + std::to_string(slot) + ")";
    if (fn.forward) {
      // A forward fills the inputs in its slot region at the slot's copy,
      // and those in no forward's slot region in place.
      Status st;
      if (fn.numSlots > 0)
        st = fillInputs(iteration, step.microbatch(), displacement, fn.slotBase,
                        fn.slotBase + fn.slotBytes);
      for (const fb::InputSpec *spec : unslottedInputs)
        if (st.ok())
          st = fillInput(*spec, iteration, step.microbatch(), 0);
      TESSERA_RETURN_IF_ERROR(st.withContext("function '" + fn.name + "'" +
                                             context + ": filling the inputs"));
    }
    // The end of the schedule completes the open batch (inside the last
    // step's phase on the timeline).
    bool last = si + 1 == schedule.size();
    TESSERA_RETURN_IF_ERROR(runThunks(fn, slot,
                                      phaseName(fn, step.microbatch()), context,
                                      /*drainP2p=*/last));
    if (fn.writesLoss) {
      int64_t offset = lossOffset;
      if (fn.slotBytes > 0 && offset >= fn.slotBase &&
          offset < fn.slotBase + fn.slotBytes)
        offset += displacement;
      float loss = 0.0f;
      TESSERA_RETURN_IF_ERROR(be->copyToHost(&loss, arena + offset, 4));
      lossSum += double(loss);
    }
  }
  TESSERA_RETURN_IF_ERROR(runStep(iteration));
  if (!artifactHasLoss)
    return std::numeric_limits<double>::quiet_NaN();
  // The stage that computes the loss reports the microbatch mean, the others
  // 0; the sum over the stages is the pipeline's loss.
  double loss = stageHasLoss ? lossSum / double(numMicro) : 0.0;
  if (ppSize > 1) {
    if (!comms.lossReducePp)
      return failedPrecondition(
          art->name(), ": a pipeline of ", ppSize,
          " stages needs a loss channel over its pp group "
          "(CommunicatorSet::lossReducePp)");
    TESSERA_RETURN_IF_ERROR(
        comms.lossReducePp
            ->allReduce(&loss, 1, ElementType::F64, ReduceKind::Sum)
            .withContext(art->name() + ": summing the loss over pp"));
  }
  if (comms.lossReduce && comms.lossReduce->size() > 1) {
    TESSERA_RETURN_IF_ERROR(
        comms.lossReduce->allReduce(&loss, 1, ElementType::F64, ReduceKind::Sum)
            .withContext(art->name() + ": averaging the loss over dp"));
    loss /= double(comms.lossReduce->size());
  }
  return loss;
}

StatusOr<std::vector<uint8_t>>
Executor::readBuffer(const std::string &name) const {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  std::vector<uint8_t> out(
      size_t(numElements(b->shape()) * dtypeSize(b->dtype())));
  TESSERA_RETURN_IF_ERROR(
      be->copyToHost(out.data(), arena + b->offset(), int64_t(out.size())));
  return out;
}

StatusOr<std::vector<float>>
Executor::readFloatBuffer(const std::string &name) const {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  if (b->dtype() != fb::DType::F32 && b->dtype() != fb::DType::BF16)
    return invalidArgument(art->name(), ": buffer '", name, "' is ",
                           fb::EnumNameDType(b->dtype()), ", not F32 or BF16");
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, readBuffer(name));
  std::vector<float> out(size_t(numElements(b->shape())));
  if (b->dtype() == fb::DType::BF16) {
    std::vector<uint16_t> half(out.size());
    std::memcpy(half.data(), bytes.data(), bytes.size());
    bf16ToFloats(half.data(), out.data(), int64_t(out.size()));
  } else {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  }
  return out;
}

Status Executor::writeBuffer(const std::string &name, const void *data,
                             int64_t bytes) {
  const fb::Buffer *b = findBuffer(name);
  if (!b)
    return notFound(art->name(), ": no buffer named '", name, "'");
  int64_t size = numElements(b->shape()) * dtypeSize(b->dtype());
  if (bytes != size)
    return invalidArgument(art->name(), ": buffer '", name, "' holds ", size,
                           " bytes, got ", bytes);
  TESSERA_RETURN_IF_ERROR(be->copyToDevice(arena + b->offset(), data, bytes));
  if (b->kind() == fb::BufferKind::MainParam) {
    // b points into the program's buffer vector: its index.
    for (flatbuffers::uoffset_t i = 0; i < prog->buffers()->size(); ++i)
      if (prog->buffers()->Get(i) == b) {
        if (mainParamWritten.size() != prog->buffers()->size())
          mainParamWritten.assign(prog->buffers()->size(), false);
        mainParamWritten[i] = true;
      }
  }
  return Status();
}

std::map<std::string, CommCounters> Executor::commCounters() const {
  std::map<std::string, CommCounters> result;
  for (auto &[kind, comm] : comms.groups)
    if (comm)
      result[kind] += comm->counters();
  for (auto &[kind, comm] : selfComms)
    result[kind] += comm->counters();
  return result;
}

} // namespace tessera::rt
