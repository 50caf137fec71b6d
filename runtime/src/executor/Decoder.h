//===- Decoder.h - Instructions to thunks -----------------------*- C++ -*-===//
//
// Turns a function's instructions into thunks for one rank: resolves
// rank-relative operands and microbatch slots to arena pointers, binds
// communicators and checks each kernel's shape rules. The loader has
// already checked every instruction against its row of the instruction
// contract (tessera/rt/Opcodes.def): operand counts and dtypes, attribute
// counts and values, groups and events. Internal to the executor.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXECUTOR_DECODER_H
#define TESSERA_RT_EXECUTOR_DECODER_H

#include "Thunk.h"

#include "tessera/rt/Backend.h"

#include <functional>
#include <vector>

namespace tessera::rt {

/// Collapses a shape to [prod(leading), last].
struct Matrix {
  int64_t rows = 0, cols = 0;
};

/// The arena offset of `r` on world rank `worldRank`: its offset, moved by
/// rank_stride per index of the rank in its instance of rank_group when the
/// ref is rank-relative (a bucket shard of the distributed optimizer). With
/// `worldRank` < 0 (no rank in particular) index 0 is used; the loader has
/// checked every index's placement, and Executor::validate decodes at every
/// rank's index. A rank that no instance of the kind holds (embedding kinds)
/// has no index: an error.
StatusOr<int64_t> resolvedOffset(const fb::Artifact &artifact,
                                 const fb::TensorRef &r, int worldRank);

/// Size of the first instance of `kind` (instances have equal sizes), or 1.
int anyGroupSize(const fb::Artifact &artifact, std::string_view kind);

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

  //===--------------------------------------------------------------------===//
  // For the opcodes' decode functions (executor/ops): the operands of the
  // instruction being decoded and the shape rules they share.
  //===--------------------------------------------------------------------===//

  const fb::TensorRef &ref(const fb::Instr &in, int i) const {
    return *in.operands()->Get(flatbuffers::uoffset_t(i));
  }
  static int64_t numel(const fb::TensorRef &r) {
    return numElements(r.shape());
  }
  int64_t numel(const fb::Instr &in, int i) const { return numel(ref(in, i)); }
  /// "F32[4, 8]": operand i's dtype and shape, for messages.
  static std::string desc(const fb::TensorRef &r) {
    return std::string(fb::EnumNameDType(r.dtype())) + shapeToString(r.shape());
  }
  std::string desc(const fb::Instr &in, int i) const {
    return desc(ref(in, i));
  }
  /// Operand i's rank and dimension d (d < rank).
  int rankOf(const fb::Instr &in, int i) const {
    return ref(in, i).shape() ? int(ref(in, i).shape()->size()) : 0;
  }
  int64_t dim(const fb::Instr &in, int i, int d) const {
    return ref(in, i).shape()->Get(flatbuffers::uoffset_t(d));
  }
  /// The last dimension of operand i (1 for a scalar).
  int64_t lastDim(const fb::Instr &in, int i) const {
    const auto *shape = ref(in, i).shape();
    return shape && shape->size() ? shape->Get(shape->size() - 1) : 1;
  }
  /// iattrs[i] (the loader checked the count).
  static int64_t iattr(const fb::Instr &in, int i) {
    return in.iattrs()->Get(flatbuffers::uoffset_t(i));
  }
  /// The float type of operand `i`: BF16, F16 or F32 (the loader
  /// admitted only these where a kernel takes any of them).
  ElementType floatType(const fb::Instr &in, int i) const {
    switch (ref(in, i).dtype()) {
    case fb::DType::BF16:
      return ElementType::BF16;
    case fb::DType::F16:
      return ElementType::F16;
    default:
      return ElementType::F32;
    }
  }
  /// The element type of a communicated operand.
  static StatusOr<ElementType> elementType(fb::DType t);
  Status requireSameNumel(const fb::Instr &in,
                          std::initializer_list<int> idx) const {
    int first = *idx.begin();
    for (int i : idx)
      if (numel(ref(in, i)) != numel(ref(in, first)))
        return invalidArgument("operands ", first, " ", desc(ref(in, first)),
                               " and ", i, " ", desc(ref(in, i)),
                               " must have the same number of elements");
    return Status();
  }
  /// Operand i (`what` in the message) has n elements.
  Status requireNumel(const fb::Instr &in, int i, int64_t n,
                      const char *what) const {
    if (numel(ref(in, i)) != n)
      return invalidArgument(what, " (operand ", i, ") ", desc(ref(in, i)),
                             " must have ", n, " elements");
    return Status();
  }
  /// Operand i as [prod(leading), last], rank >= 2.
  StatusOr<Matrix> matrix(const fb::Instr &in, int i) const {
    return asMatrix(in, i, 2);
  }
  /// Operand i as [prod(leading), last], rank >= 1.
  StatusOr<Matrix> rowsCols(const fb::Instr &in, int i) const {
    return asMatrix(in, i, 1);
  }

  /// The rank decoded for (< 0: none in particular, validating).
  int rank() const { return worldRank; }
  const fb::Artifact &root() const { return *artifact.root(); }
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
  /// The communicator of group kind `kind` on this rank.
  StatusOr<Communicator *> communicator(const std::string &kind) {
    return lookup(kind);
  }
  /// Arena offset of operand `i` on this rank and the slot being decoded.
  int64_t finalOffset(int i) const {
    int64_t offset = offsets[size_t(i)];
    if (inSlotRegion(offset))
      offset += int64_t(slotIndex) * slotBytes;
    return offset;
  }
  /// The global sequence positions of the `rows` rows of a sequence-major
  /// operand of `in`, whose `group` names the axes sharding the sequence
  /// ("tp", "cp" or "tp-cp"; none: the whole sequence), into t.seq and
  /// t.seqTotal.
  Status sequenceShard(const fb::Instr &in, int64_t rows, Thunk &t);
  /// Vocabulary offset (this rank's index in its instance of the Instr's
  /// `group` kind times `localVocab`; 0 without a group) and the number of
  /// shards.
  Status vocabShard(const fb::Instr &in, int64_t localVocab, int64_t &offset,
                    int64_t &shards);

private:
  StatusOr<Matrix> asMatrix(const fb::Instr &in, int i, int minRank) const {
    const fb::TensorRef &r = ref(in, i);
    int rank = r.shape() ? int(r.shape()->size()) : 0;
    if (rank < minRank)
      return invalidArgument("operand ", i, " ", desc(r), " must have rank >= ",
                             minRank);
    Matrix mat;
    mat.cols = r.shape()->Get(flatbuffers::uoffset_t(rank - 1));
    mat.rows = mat.cols ? numel(r) / mat.cols : 0;
    return mat;
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
  bool inSlotRegion(int64_t offset) const {
    return slotBytes > 0 && offset >= slotBase && offset < slotBase + slotBytes;
  }
  /// Arena address of operand `i` on this rank and the slot being decoded;
  /// null when validating without an arena (an offset from a null base is
  /// undefined behaviour).
  void *ptrOf(int i) {
    return base ? static_cast<void *>(base + finalOffset(i)) : nullptr;
  }
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

  /// What every instruction shares (pointers, attributes, runs), then the
  /// opcode's decode function (executor/ops).
  Status decodeInstr(const fb::Instr &in, Thunk &t);
  /// Opcodes with Runs: checks iattrs and keeps in t.runs the runs that
  /// meet this rank's shard (its index in `group`), as ranges of operand 0.
  Status decodeRuns(const fb::Instr &in, Thunk &t);

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

} // namespace tessera::rt

#endif // TESSERA_RT_EXECUTOR_DECODER_H
