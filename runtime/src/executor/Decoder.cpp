//===- Decoder.cpp - Instructions to thunks, and pre-launch checks --------===//
//
// The decoder of Decoder.h: what every instruction shares (rank-relative
// operands resolved, slot relocation, pointers, attributes, the runs of
// sharded optimizer operands, the sequence and vocabulary shards), then the
// opcode's own decode function from the dispatch table (executor/ops: the
// shape rules that tie its operands together and the communicator it
// binds; the loader checked counts, dtypes and attributes against
// tessera/rt/Opcodes.def). Also Executor::validate, which decodes every
// program at every rank's positions before tessera-run launches anything.
//
//===----------------------------------------------------------------------===//

#include "Decoder.h"

#include "ops/Ops.h"

#include "tessera/rt/Executor.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>

namespace tessera::rt {

StatusOr<ElementType> Decoder::elementType(fb::DType t) {
  switch (t) {
  case fb::DType::F32:
    return ElementType::F32;
  case fb::DType::I32:
    return ElementType::I32;
  case fb::DType::I64:
    return ElementType::I64;
  case fb::DType::BF16:
    return ElementType::BF16;
  case fb::DType::F16:
    return ElementType::F16;
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
  for (int i = 0; i < count; ++i) {
    t.ptr[i] = ptrOf(i);
    switch (floatType(in, i)) {
    case ElementType::BF16:
      t.fmt[i] = FloatFormat::BF16;
      break;
    case ElementType::F16:
      t.fmt[i] = FloatFormat::F16;
      break;
    default:
      t.fmt[i] = FloatFormat::F32;
    }
  }
  if (count)
    t.n = numel(ref(in, 0));
  if (opcodeInfo(in.op()).has(Runs))
    TESSERA_RETURN_IF_ERROR(decodeRuns(in, t));

  const ops::DecodeFn decode = ops::decoderOf(in.op());
  t.run = ops::runnerOf(in.op());
  if (!decode || !t.run)
    return unimplemented("unknown opcode ", int(in.op()));
  return decode(*this, in, t);
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
