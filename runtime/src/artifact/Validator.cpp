//===- Validator.cpp - semantic validation of a .tsr artifact -------------===//
//
// Everything the FlatBuffer verifier cannot see: mesh and rank groups,
// batch arithmetic, every TensorRef inside its arena, every instruction
// against its row of the instruction contract (tessera/rt/Opcodes.def),
// microbatch slots and pipeline schedules. Every error names the file and
// the place (program, function, instruction and its source location).
//
//===----------------------------------------------------------------------===//

#include "ArtifactInternal.h"
#include "tessera/rt/Opcodes.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <set>

namespace tessera::rt {

namespace {

/// Bytes of a tensor of `shape` (dimensions already checked non-negative)
/// with `es`-byte elements, or -1 when that overflows int64_t.
int64_t checkedBytes(const flatbuffers::Vector<int64_t> *shape, int64_t es) {
  int64_t bytes = es;
  bool overflow = false;
  if (shape)
    for (int64_t d : *shape) {
      if (d == 0)
        return 0;
      overflow = overflow || __builtin_mul_overflow(bytes, d, &bytes);
    }
  return overflow ? -1 : bytes;
}

/// Accumulates the context for error messages.
class Validator {
public:
  Validator(const std::string &file, const fb::Artifact &a)
      : file(file), a(a) {}

  Status run();

private:
  template <typename... Args> Status error(Args &&...args) {
    return invalidArgument(file, ": ", std::forward<Args>(args)...);
  }
  Status checkAlignment();
  Status checkMeshAndGroups();
  Status checkBatch();
  Status checkProgram(int pi, const fb::Program &p);
  Status checkRef(const std::string &what, const fb::TensorRef *ref,
                  int64_t arenaBytes);
  /// A rank-relative ref: a known group kind, a non-negative stride, and
  /// every index's placement aligned and inside the arena.
  Status checkRankRelativeRef(const std::string &what, const fb::TensorRef &ref,
                              int64_t bytes, int64_t arenaBytes);
  Status checkInstr(const std::string &where, const fb::Instr &in,
                    int64_t arenaBytes);
  Status checkSlots(const std::string &prog, const fb::Program &p);
  Status checkSchedule(const std::string &prog, const fb::Program &p);

  const std::string &file;
  const fb::Artifact &a;
  std::set<std::string> groupKinds;
};

Status Validator::run() {
  // 0 means "unset"; the container header is authoritative.
  if (a.format_version() != 0 && a.format_version() != artifact::kFormatVersion)
    return error("payload format_version ", a.format_version(),
                 " does not match the header's supported version ",
                 artifact::kFormatVersion);
  TESSERA_RETURN_IF_ERROR(checkAlignment());
  TESSERA_RETURN_IF_ERROR(checkMeshAndGroups());
  TESSERA_RETURN_IF_ERROR(checkBatch());
  if (!a.programs() || a.programs()->size() == 0)
    return error("artifact has no programs");
  std::set<int> ppRanks;
  for (flatbuffers::uoffset_t i = 0; i < a.programs()->size(); ++i) {
    const fb::Program *p = a.programs()->Get(i);
    if (!ppRanks.insert(p->pp_rank()).second)
      return error("two programs have pp_rank ", p->pp_rank());
    TESSERA_RETURN_IF_ERROR(checkProgram(int(i), *p));
  }
  return Status();
}

/// FlatBuffers' verifier (2.0) checks the alignment of a vector's length,
/// not of its elements: a crafted payload can place the int64 elements of a
/// shape or iattrs vector at an address that is not a multiple of 8, which
/// every read of them would then load misaligned (undefined behaviour).
/// The payload itself is heap-allocated, so addresses stand for offsets.
Status Validator::checkAlignment() {
  auto misaligned = [](const flatbuffers::Vector<int64_t> *v) {
    // (An empty vector's data pointer need not be aligned: nothing is read.)
    return v && v->size() > 0 &&
           reinterpret_cast<uintptr_t>(v->data()) % alignof(int64_t) != 0;
  };
  auto fail = [&](const std::string &what) {
    return error(what, ": int64 vector not 8-byte aligned (malformed payload)");
  };
  if (!a.programs())
    return Status();
  for (flatbuffers::uoffset_t pi = 0; pi < a.programs()->size(); ++pi) {
    const fb::Program *p = a.programs()->Get(pi);
    std::string prog = "program " + std::to_string(pi);
    if (p->buffers())
      for (flatbuffers::uoffset_t bi = 0; bi < p->buffers()->size(); ++bi) {
        const fb::Buffer *b = p->buffers()->Get(bi);
        if (misaligned(b->shape()) || misaligned(b->global_shape()))
          return fail(prog + " buffer " + std::to_string(bi));
      }
    if (p->functions())
      for (const fb::Function *f : *p->functions()) {
        if (!f->instrs())
          continue;
        for (flatbuffers::uoffset_t ii = 0; ii < f->instrs()->size(); ++ii) {
          const fb::Instr *in = f->instrs()->Get(ii);
          std::string where = prog + " function '" + fbString(f->name()) +
                              "' instruction " + std::to_string(ii);
          if (misaligned(in->iattrs()))
            return fail(where + " iattrs");
          if (in->operands())
            for (const fb::TensorRef *r : *in->operands())
              if (r && misaligned(r->shape()))
                return fail(where + " operand shape");
        }
      }
  }
  return Status();
}

Status Validator::checkMeshAndGroups() {
  int world = a.world_size();
  if (world <= 0)
    return error("world_size must be positive, got ", world);
  int64_t product = 1;
  std::string meshText;
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh()) {
      if (axis->size() <= 0)
        return error("mesh axis '", fbString(axis->name()),
                     "' has non-positive size ", axis->size());
      // world_size is an int: a larger product cannot match it.
      if (__builtin_mul_overflow(product, int64_t(axis->size()), &product) ||
          product > int64_t(INT32_MAX))
        return error("the product of the mesh sizes exceeds ", INT32_MAX,
                     " (world_size ", world, ")");
      meshText += (meshText.empty() ? "" : " x ") + fbString(axis->name()) + "=" +
                  std::to_string(axis->size());
    }
  if (product != world)
    return error("world_size ", world, " != product of mesh sizes ", product,
                 " (", meshText.empty() ? "empty mesh" : meshText, ")");

  // The instances of a kind are disjoint, equally sized subsets of
  // [0, world). Every kind must also cover the world (partition it), except
  // the embedding kinds, which hold only the first (and last) pipeline stage.
  std::map<std::string, std::vector<const fb::RankGroup *>> byKind;
  if (a.groups())
    for (const fb::RankGroup *g : *a.groups()) {
      if (!g->kind() || g->kind()->size() == 0)
        return error("rank group without a kind");
      byKind[g->kind()->str()].push_back(g);
    }
  for (auto &[kind, groups] : byKind) {
    groupKinds.insert(kind);
    std::vector<int> seen(world, 0);
    size_t size = 0;
    for (const fb::RankGroup *g : groups) {
      if (!g->ranks() || g->ranks()->size() == 0)
        return error("empty rank group of kind '", kind, "'");
      if (size == 0)
        size = g->ranks()->size();
      else if (size != g->ranks()->size())
        return error("rank groups of kind '", kind, "' have different sizes (",
                     size, " and ", g->ranks()->size(), ")");
      for (int r : *g->ranks()) {
        if (r < 0 || r >= world)
          return error("rank ", r, " in a group of kind '", kind,
                       "' is outside world_size ", world);
        if (seen[r]++)
          return error("rank ", r, " appears twice in groups of kind '", kind,
                       "'");
      }
    }
    if (mayLeaveRanksOut(kind))
      continue;
    for (int r = 0; r < world; ++r)
      if (!seen[r])
        return error("rank ", r, " is in no group of kind '", kind,
                     "' (every group kind except embedding and "
                     "position-embedding must partition the world)");
  }
  return Status();
}

Status Validator::checkBatch() {
  const fb::Batch *b = a.batch();
  if (!b)
    return error("missing batch");
  if (b->micro_batch_size() <= 0 || b->num_microbatches() <= 0 ||
      b->global_batch_size() <= 0)
    return error("batch sizes must be positive (micro ", b->micro_batch_size(),
                 ", global ", b->global_batch_size(), ", microbatches ",
                 b->num_microbatches(), ")");
  int dp = findGroupPosition(a, "dp", 0).size;
  int64_t samples = 0;
  if (__builtin_mul_overflow(b->micro_batch_size(), b->num_microbatches(),
                             &samples) ||
      __builtin_mul_overflow(samples, int64_t(dp), &samples) ||
      samples != b->global_batch_size())
    return error("global_batch_size ", b->global_batch_size(),
                 " != micro_batch_size ", b->micro_batch_size(),
                 " * num_microbatches ", b->num_microbatches(), " * dp ", dp);
  return Status();
}

Status Validator::checkRef(const std::string &what, const fb::TensorRef *ref,
                           int64_t arenaBytes) {
  if (!ref)
    return error(what, " is missing");
  if (ref->shape())
    for (int64_t d : *ref->shape())
      if (d < 0)
        return error(what, " has negative dimension in shape ",
                     shapeToString(ref->shape()));
  int64_t es = dtypeSize(ref->dtype());
  if (es == 0)
    return error(what, " has unknown dtype ", int(ref->dtype()));
  int64_t bytes = checkedBytes(ref->shape(), es);
  if (bytes < 0)
    return error(what, " of shape ", shapeToString(ref->shape()),
                 " has more than 2^63 bytes");
  if (ref->rank_group() && ref->rank_group()->size())
    return checkRankRelativeRef(what, *ref, bytes, arenaBytes);
  if (ref->rank_stride() != 0)
    return error(what, " has rank_stride ", ref->rank_stride(),
                 " but no rank_group (only a rank-relative ref has a stride)");
  if (ref->offset() < 0 || ref->offset() % es != 0 || bytes > arenaBytes ||
      ref->offset() > arenaBytes - bytes)
    return error(what, " (offset ", ref->offset(), ", ", bytes,
                 " bytes, shape ", shapeToString(ref->shape()),
                 ") lies outside the arena of ", arenaBytes,
                 " bytes or is misaligned");
  return Status();
}

Status Validator::checkRankRelativeRef(const std::string &what,
                                       const fb::TensorRef &ref, int64_t bytes,
                                       int64_t arenaBytes) {
  std::string kind = ref.rank_group()->str();
  const int64_t es = dtypeSize(ref.dtype());
  const int64_t offset = ref.offset(), stride = ref.rank_stride();
  if (!groupKinds.count(kind))
    return error(what, " is relative to rank group kind '", kind,
                 "' but the artifact has no rank groups of that kind");
  if (stride < 0)
    return error(what, " has negative rank_stride ", stride);
  // Instances of a kind are equally sized (checkMeshAndGroups).
  int64_t size = 1;
  for (const fb::RankGroup *g : *a.groups())
    if (fbString(g->kind()) == kind) {
      size = int64_t(g->ranks()->size());
      break;
    }
  std::string placement = " (offset " + std::to_string(offset) + " + i * " +
                          std::to_string(stride) + " for " + kind +
                          " index i < " + std::to_string(size) + ", " +
                          std::to_string(bytes) + " bytes, shape " +
                          shapeToString(ref.shape()) + ")";
  if (offset % es != 0 || (size > 1 && stride % es != 0))
    return error(what, placement, " is not aligned to its ",
                 fb::EnumNameDType(ref.dtype()), " elements (", es, " bytes)");
  // Every rank's shard inside the arena, the last rank's too:
  // offset + (size - 1) * stride + bytes <= arenaBytes, without overflow.
  int64_t span = 0;
  if (offset < 0 || bytes > arenaBytes || offset > arenaBytes - bytes ||
      __builtin_mul_overflow(size - 1, stride, &span) ||
      span > arenaBytes - bytes - offset)
    return error(what, placement, " lies outside the arena of ", arenaBytes,
                 " bytes for ", kind, " index ", size - 1);
  return Status();
}

Status Validator::checkInstr(const std::string &where, const fb::Instr &in,
                             int64_t arenaBytes) {
  // The contract's row: operand count and dtypes, attribute counts, what
  // the group may hold, events.
  const OpcodeInfo *info = findOpcodeInfo(in.op());
  if (!info)
    return error(where, ": unknown opcode ", int(in.op()));
  const std::string name(info->name);
  const int got = in.operands() ? int(in.operands()->size()) : 0;
  if (got != info->numOperands())
    return error(where, ": ", name, " expects ", info->numOperands(),
                 " operands, got ", got);
  for (int i = 0; i < got; ++i)
    TESSERA_RETURN_IF_ERROR(checkRef(where + ": operand " + std::to_string(i),
                                     in.operands()->Get(i), arenaBytes));
  auto desc = [&](int i) {
    const fb::TensorRef *r = in.operands()->Get(flatbuffers::uoffset_t(i));
    return std::string(fb::EnumNameDType(r->dtype())) +
           shapeToString(r->shape());
  };
  for (int i = 0; i < got; ++i) {
    const char code = info->operands[size_t(i)];
    const fb::DType dtype = in.operands()->Get(flatbuffers::uoffset_t(i))->dtype();
    if (!dtypeAllowed(code, dtype))
      return error(where, ": ", name, " operand ", i, " (",
                   info->operandName(i), ") must be ", dtypeCodeText(code),
                   ", got ", desc(i),
                   code == 'f' && dtype != fb::DType::F32 && isFloatDType(dtype)
                       ? " (16-bit values need a Cast to f32 first)"
                       : "");
  }
  if (info->has(SameDType))
    for (int i = 1; i < got; ++i)
      if (in.operands()->Get(flatbuffers::uoffset_t(i))->dtype() !=
          in.operands()->Get(0)->dtype())
        return error(where, ": ", name, " operands ", desc(0), " and ", desc(i),
                     info->operands[0] == 'h'
                         ? " must be both F32 or both BF16 (mix formats with "
                           "a Cast)"
                         : " must have the same dtype");
  if (info->has(SameFloatDType)) {
    int first = -1;
    for (int i = 0; i < got; ++i) {
      if (info->operands[size_t(i)] != 'h')
        continue;
      if (first < 0)
        first = i;
      else if (in.operands()->Get(flatbuffers::uoffset_t(i))->dtype() !=
               in.operands()->Get(flatbuffers::uoffset_t(first))->dtype())
        return error(where, ": ", name, " operands ", info->operandName(first),
                     " ", desc(first), " and ", info->operandName(i), " ",
                     desc(i), " must be both F32 or both BF16 (mix formats "
                     "with a Cast)");
    }
    // A product's result: F32, or rounded once into its operands' 16-bit
    // format, which leaves nothing to accumulate into.
    for (int i = 0; i < got; ++i) {
      if (info->operands[size_t(i)] != 'r')
        continue;
      const fb::DType dtype =
          in.operands()->Get(flatbuffers::uoffset_t(i))->dtype();
      if (dtype == fb::DType::F32)
        continue;
      if (first < 0 ||
          dtype != in.operands()->Get(flatbuffers::uoffset_t(first))->dtype())
        return error(where, ": ", name, " result ", info->operandName(i), " ",
                     desc(i), " must be F32 or the format of its operands",
                     first < 0 ? std::string()
                               : " (" + std::string(info->operandName(first)) +
                                     " " + desc(first) + ")");
      if (in.beta() != 0.0f)
        return error(where, ": ", name, " accumulates (beta ", in.beta(),
                     ") into the 16-bit ", info->operandName(i), " ", desc(i),
                     "; an accumulated result must be F32");
    }
  }
  const int iattrs = in.iattrs() ? int(in.iattrs()->size()) : 0;
  if (info->has(Runs)) {
    if (std::string_view why =
            runsError(iattrs ? in.iattrs()->data() : nullptr, size_t(iattrs));
        !why.empty())
      return error(where, ": ", name, ": ", std::string(why));
  } else if (iattrs != info->numIAttrs) {
    return error(where, ": ", name, " expects ", info->numIAttrs,
                 " iattrs, got ", iattrs);
  }
  const int fattrs = in.fattrs() ? int(in.fattrs()->size()) : 0;
  if (fattrs != info->numFAttrs)
    return error(where, ": ", name, " expects ", info->numFAttrs,
                 " fattrs, got ", fattrs);
  const std::string g = fbString(in.group());
  switch (info->group) {
  case GroupUse::None:
    if (!g.empty())
      return error(where, ": ", name, " takes no group, got '", g, "'");
    break;
  case GroupUse::Shard:
    if (!g.empty() && !groupKinds.count(g))
      return error(where, ": ", name, " is sharded over group kind '", g,
                   "' but the artifact has no rank groups of that kind");
    break;
  case GroupUse::Required:
    if (g.empty())
      return error(where, ": collective ", name, " without a group");
    if (!groupKinds.count(g))
      return error(where, ": collective over group kind '", g,
                   "' but the artifact has no rank groups of that kind");
    break;
  case GroupUse::Pipeline:
    if (!g.empty() && g != "pp")
      return error(where, ": ", name,
                   " runs over the pipeline group 'pp', not '", g, "'");
    break;
  }
  if (info->has(HasEvent) && in.event() < 0)
    return error(where, ": ", name, " needs an event id >= 0");

  // Value rules of single opcodes.
  auto iattr = [&](int i) { return in.iattrs()->Get(flatbuffers::uoffset_t(i)); };
  auto fattr = [&](int i) { return in.fattrs()->Get(flatbuffers::uoffset_t(i)); };
  switch (in.op()) {
  case fb::Opcode::LayerNorm:
  case fb::Opcode::LayerNormGrad:
    if (!(fattr(0) >= 0))
      return error(where, ": ", name, " needs fattrs = [eps] with eps >= 0");
    break;
  case fb::Opcode::Dropout:
    if (!(fattr(0) >= 0 && fattr(0) < 1))
      return error(where, ": Dropout needs fattrs = [rate] with rate in "
                          "[0, 1), got ",
                   fattr(0));
    break;
  case fb::Opcode::Embedding:
    if (iattr(0) <= 0)
      return error(where,
                   ": Embedding needs iattrs = [vocab_size] with "
                   "vocab_size > 0, got ",
                   iattr(0));
    break;
  case fb::Opcode::Send:
  case fb::Opcode::Recv: {
    int64_t peer = iattr(0), tag = iattr(1);
    if (peer != 1 && peer != -1 && peer != 0)
      return error(where, ": ", name,
                   " needs iattrs = [peer, tag] with peer +1 (next pp rank), "
                   "-1 (previous) or 0 (itself), got peer ",
                   peer);
    // 32767 is the smallest MPI_TAG_UB MPI allows.
    if (tag < 0 || tag > 32767)
      return error(where, ": ", name, " tag ", tag, " outside [0, 32767]");
    break;
  }
  case fb::Opcode::Attention:
  case fb::Opcode::AttentionGrad:
    if (iattr(0) <= 0 || (iattr(1) != 0 && iattr(1) != 1))
      return error(where, ": ", name,
                   " needs iattrs = [num_heads > 0, causal 0/1], got [",
                   iattr(0), ", ", iattr(1), "]");
    break;
  default:
    break;
  }
  return Status();
}

Status Validator::checkProgram(int pi, const fb::Program &p) {
  std::string prog = "program " + std::to_string(pi);
  int64_t arena = p.arena_bytes();
  if (arena < 0)
    return error(prog, ": negative arena_bytes ", arena);
  if (p.staging_bytes() < 0)
    return error(prog, ": negative staging_bytes ", p.staging_bytes());
  if (p.persistent_bytes() < 0 || p.persistent_bytes() > arena)
    return error(prog, ": persistent_bytes ", p.persistent_bytes(),
                 " exceeds arena_bytes ", arena);
  // The runtime iterates over every program's buffers (the executor, the
  // checkpoints): the vector must be there, even if empty.
  if (!p.buffers())
    return error(prog, ": missing buffers");
  int numBuffers = int(p.buffers()->size());
  for (int bi = 0; bi < numBuffers; ++bi) {
    const fb::Buffer *b = p.buffers()->Get(bi);
    std::string what =
        prog + ": buffer " + std::to_string(bi) + " '" + fbString(b->name()) + "'";
    int64_t es = dtypeSize(b->dtype());
    if (es == 0)
      return error(what, " has unknown dtype");
    if (b->shape())
      for (int64_t d : *b->shape())
        if (d < 0)
          return error(what, " has a negative dimension");
    int64_t bytes = checkedBytes(b->shape(), es);
    if (bytes < 0)
      return error(what, " of shape ", shapeToString(b->shape()),
                   " has more than 2^63 bytes");
    // ZeRO-3: a staged buffer lies in the staging space, not the arena.
    const int64_t space = b->staged() ? p.staging_bytes() : arena;
    if (b->staged() && b->kind() != fb::BufferKind::Param &&
        b->kind() != fb::BufferKind::View)
      return error(what, " of kind ", fb::EnumNameBufferKind(b->kind()),
                   " is staged (only parameters and their bucket views are)");
    if (b->offset() < 0 || bytes > space || b->offset() > space - bytes)
      return error(what, " (offset ", b->offset(), ", ", bytes,
                   " bytes) lies outside the ",
                   b->staged() ? "staging space" : "arena", " of ", space,
                   " bytes");
    if (b->kind() == fb::BufferKind::ParamShard) {
      // This rank's block of a staged bucket view, split over rank_group.
      if (b->of() < 0 || b->of() >= numBuffers)
        return error(what, " is a parameter shard without its bucket view "
                           "(of ", b->of(), ")");
      const fb::Buffer *view = p.buffers()->Get(flatbuffers::uoffset_t(b->of()));
      if (view->kind() != fb::BufferKind::View || !view->staged() ||
          view->dtype() != b->dtype())
        return error(what, " is the shard of buffer ", b->of(), " '",
                     fbString(view->name()),
                     "', which is not a staged bucket view of its dtype");
      if (!b->rank_group() || !groupKinds.count(b->rank_group()->str()))
        return error(what, " is split over group '", fbString(b->rank_group()),
                     "', which has no rank groups");
      GroupPosition pos = findGroupPosition(a, b->rank_group()->str(), 0);
      if (pos.size > 0 &&
          numElements(b->shape()) * pos.size != numElements(view->shape()))
        return error(what, " holds ", numElements(b->shape()),
                     " elements, not 1/", pos.size, " of its bucket view's ",
                     numElements(view->shape()));
    }
    if ((b->kind() == fb::BufferKind::Grad ||
         b->kind() == fb::BufferKind::OptState) &&
        b->of() >= numBuffers)
      return error(what, " refers to param buffer ", b->of(),
                   " but there are only ", numBuffers, " buffers");
    // Parameters are initialised from f32 values (16-bit ones rounded).
    if (b->kind() == fb::BufferKind::Param && !isFloatDType(b->dtype()))
      return error(what, " is a parameter of dtype ",
                   fb::EnumNameDType(b->dtype()),
                   " (parameters are F32, BF16 or F16)");
    if (b->kind() == fb::BufferKind::MainParam) {
      // fp32 main params: of a parameter (its shape and layout) or, with
      // of = -1, a distributed-optimizer shard of a parameter bucket.
      if (b->dtype() != fb::DType::F32)
        return error(what, " is a main param of dtype ",
                     fb::EnumNameDType(b->dtype()), " (main params are F32)");
      if (b->of() < -1 || b->of() >= numBuffers)
        return error(what, " refers to param buffer ", b->of(),
                     " but there are only ", numBuffers,
                     " buffers (main params name their parameter, or -1 for "
                     "a bucket shard)");
      if (b->of() >= 0) {
        const fb::Buffer *param =
            p.buffers()->Get(flatbuffers::uoffset_t(b->of()));
        if (param->kind() != fb::BufferKind::Param)
          return error(what, " refers to buffer ", b->of(), " '",
                       fbString(param->name()), "' of kind ",
                       fb::EnumNameBufferKind(param->kind()),
                       ", not a parameter");
        auto dims = [](const flatbuffers::Vector<int64_t> *v) {
          return v ? std::vector<int64_t>(v->begin(), v->end())
                   : std::vector<int64_t>();
        };
        // Like per-parameter optimizer state, a main param takes its
        // parameter's layout (shard dim and axis), so only the local shape
        // must agree.
        if (dims(b->shape()) != dims(param->shape()))
          return error(what, " has shape ", shapeToString(b->shape()),
                       ", but its parameter '", fbString(param->name()),
                       "' has shape ", shapeToString(param->shape()));
      }
    }
    if (b->kind() == fb::BufferKind::Param && b->shard_dim() >= 0) {
      int rank = b->shape() ? int(b->shape()->size()) : 0;
      if (b->shard_dim() >= rank)
        return error(what, " has shard_dim ", b->shard_dim(), " but rank ",
                     rank);
      if (!b->shard_axis() || !groupKinds.count(b->shard_axis()->str()))
        return error(what, " is sharded over axis '", fbString(b->shard_axis()),
                     "' which has no rank groups");
    }
    if (b->shard2_dim() >= 0) {
      int rank = b->shape() ? int(b->shape()->size()) : 0;
      if (b->kind() != fb::BufferKind::Param || b->shard_dim() < 0 ||
          b->shard2_dim() >= rank || b->shard2_dim() == b->shard_dim())
        return error(what, " has a second split (shard2_dim ",
                     b->shard2_dim(), ") that is not of another dimension of "
                     "a split parameter");
      if (!b->shard2_axis() || !groupKinds.count(b->shard2_axis()->str()))
        return error(what, " is sharded over axis '",
                     fbString(b->shard2_axis()), "' which has no rank groups");
    }
    if (b->global_shape() && b->global_shape()->size() > 0 && b->shape() &&
        b->global_shape()->size() != b->shape()->size())
      return error(what, " has shape ", shapeToString(b->shape()),
                   " but global_shape ", shapeToString(b->global_shape()));
  }
  auto checkIndex = [&](int idx, const char *field) -> Status {
    if (idx < -1 || idx >= numBuffers)
      return error(prog, ": ", field, " ", idx, " out of range (", numBuffers,
                   " buffers)");
    return Status();
  };
  TESSERA_RETURN_IF_ERROR(checkIndex(p.loss_buffer(), "loss_buffer"));
  TESSERA_RETURN_IF_ERROR(checkIndex(p.iteration_buffer(), "iteration_buffer"));
  if (p.loss_buffer() >= 0) {
    const fb::Buffer *b = p.buffers()->Get(p.loss_buffer());
    if (b->dtype() != fb::DType::F32 || numElements(b->shape()) != 1)
      return error(prog, ": loss buffer must be a scalar f32");
  }
  // ZeRO-3: every staged parameter lies inside a staged bucket view of its
  // dtype that a ParamShard holds (else its value would never reach the
  // device).
  std::vector<std::pair<int64_t, const fb::Buffer *>> shardedViews;
  for (const fb::Buffer *b : *p.buffers())
    if (b->kind() == fb::BufferKind::ParamShard)
      shardedViews.push_back(
          {p.buffers()->Get(flatbuffers::uoffset_t(b->of()))->offset(),
           p.buffers()->Get(flatbuffers::uoffset_t(b->of()))});
  std::sort(shardedViews.begin(), shardedViews.end(),
            [](const auto &x, const auto &y) { return x.first < y.first; });
  for (int bi = 0; bi < numBuffers; ++bi) {
    const fb::Buffer *b = p.buffers()->Get(bi);
    if (!b->staged() || b->kind() != fb::BufferKind::Param)
      continue;
    const int64_t begin = b->offset(),
                  end = begin + checkedBytes(b->shape(), dtypeSize(b->dtype()));
    auto it = std::upper_bound(
        shardedViews.begin(), shardedViews.end(), begin,
        [](int64_t at, const auto &v) { return at < v.first; });
    const fb::Buffer *view = it == shardedViews.begin() ? nullptr : (it - 1)->second;
    if (!view || view->dtype() != b->dtype() ||
        end > view->offset() + checkedBytes(view->shape(),
                                            dtypeSize(view->dtype())))
      return error(prog, ": buffer ", bi, " '", fbString(b->name()),
                   "' is a staged parameter outside every bucket view of its "
                   "dtype that a parameter shard holds");
  }
  if (p.iteration_buffer() >= 0) {
    const fb::Buffer *b = p.buffers()->Get(p.iteration_buffer());
    if (b->dtype() != fb::DType::I64 || numElements(b->shape()) != 1)
      return error(prog, ": iteration buffer must be a scalar i64");
  }
  if (p.inputs())
    for (const fb::InputSpec *in : *p.inputs()) {
      if (in->buffer() < 0 || in->buffer() >= numBuffers)
        return error(prog, ": input '", fbString(in->name()), "' buffer index ",
                     in->buffer(), " out of range (", numBuffers, " buffers)");
      if (in->num_classes() < 0 || in->vocab_size() < 0 ||
          (in->num_classes() > 0 && in->vocab_size() > 0))
        return error(prog, ": input '", fbString(in->name()), "' has num_classes ",
                     in->num_classes(), " and vocab_size ", in->vocab_size(),
                     " (at most one may be set, neither negative)");
    }
  std::set<std::string> names;
  // overlap_param_gather: a sync id is started by one ParamSyncStart of the
  // program, and every ParamSyncWait names a started one.
  std::map<int, std::string> syncStarts;
  std::vector<std::pair<int, std::string>> syncWaits;
  if (p.functions())
    for (const fb::Function *f : *p.functions()) {
      std::string fname = fbString(f->name());
      if (!names.insert(fname).second)
        return error(prog, ": duplicate function '", fname, "'");
      if (!f->instrs())
        continue;
      for (flatbuffers::uoffset_t ii = 0; ii < f->instrs()->size(); ++ii) {
        const fb::Instr *in = f->instrs()->Get(ii);
        std::string where = prog + " function '" + fname + "' instruction " +
                            std::to_string(ii);
        if (in->loc() && in->loc()->size())
          where += " (" + in->loc()->str() + ")";
        TESSERA_RETURN_IF_ERROR(checkInstr(where, *in, arena));
        // A weight-gradient phase computes while the sends before it are
        // in flight (Executor::runThunks): it may not send or receive.
        if (isWeightGradFunction(fname) &&
            (in->op() == fb::Opcode::Send || in->op() == fb::Opcode::Recv))
          return error(where, ": ", fb::EnumNameOpcode(in->op()),
                       " in a weight-gradient phase (backward_w*), which "
                       "runs while the previous phase's sends are in "
                       "flight and has no point-to-point transfers");
        if (in->op() == fb::Opcode::ParamSyncStart &&
            !syncStarts.emplace(in->event(), where).second)
          return error(where, ": ParamSyncStart of sync id ", in->event(),
                       ", which ", syncStarts[in->event()],
                       " already starts");
        if (in->op() == fb::Opcode::ParamSyncWait)
          syncWaits.push_back({in->event(), where});
      }
    }
  for (const auto &[id, where] : syncWaits)
    if (!syncStarts.count(id))
      return error(where, ": ParamSyncWait of sync id ", id,
                   ", which no ParamSyncStart of the program starts");
  TESSERA_RETURN_IF_ERROR(checkSlots(prog, p));
  return checkSchedule(prog, p);
}

Status Validator::checkSlots(const std::string &prog, const fb::Program &p) {
  int64_t arena = p.arena_bytes();
  if (p.num_chunks() < 1)
    return error(prog, ": num_chunks must be at least 1, got ", p.num_chunks());
  if (!p.functions())
    return Status();
  for (const fb::Function *f : *p.functions()) {
    std::string what = prog + " function '" + fbString(f->name()) + "'";
    if (f->chunk() < -1 || f->chunk() >= p.num_chunks())
      return error(what, ": chunk ", f->chunk(), " out of range (num_chunks ",
                   p.num_chunks(), ")");
    if (f->num_slots() < 0)
      return error(what, ": negative num_slots ", f->num_slots());
    if (f->num_slots() == 0)
      continue;
    // slot_bytes 0: a chunk that keeps nothing from its forward for its
    // backward (a virtual pipeline stage without layers).
    int64_t base = f->slot_base(), bytes = f->slot_bytes(), n = f->num_slots();
    if (base < 0 || bytes < 0)
      return error(what,
                   ": slot region needs slot_base >= 0 and slot_bytes >= 0, "
                   "got slot_base ",
                   base, " and slot_bytes ", bytes);
    // slot_base + num_slots * slot_bytes <= arena_bytes, without overflow.
    if (base > arena || bytes > (arena - base) / n)
      return error(what, ": ", n, " slots of ", bytes, " bytes at slot_base ",
                   base, " exceed the arena of ", arena, " bytes");
    // An input is filled at its slot's copy only if it lies in the region.
    if (p.inputs())
      for (const fb::InputSpec *in : *p.inputs()) {
        const fb::Buffer *b = p.buffers()->Get(in->buffer());
        int64_t begin = b->offset(),
                end = begin + numElements(b->shape()) * dtypeSize(b->dtype());
        bool inside = begin >= base && end <= base + bytes;
        bool outside = end <= base || begin >= base + bytes;
        if (!inside && !outside)
          return error(what, ": input '", fbString(in->name()), "' (bytes ", begin,
                       " to ", end, ") straddles the slot region [", base, ", ",
                       base + bytes, ")");
      }
  }
  // An input in a slot region is filled by the forwards of the chunk it
  // names (InputSpec.chunk), which must be one whose region holds it.
  if (p.inputs())
    for (const fb::InputSpec *in : *p.inputs()) {
      int64_t offset = p.buffers()->Get(in->buffer())->offset();
      std::set<int> holders;
      // The forwards fill them (Executor::runSchedule).
      for (const fb::Function *f : *p.functions())
        if (f->num_slots() > 0 && isForwardFunction(fbString(f->name())) &&
            offset >= f->slot_base() &&
            offset < f->slot_base() + f->slot_bytes())
          holders.insert(f->chunk());
      if (!holders.empty() && !holders.count(in->chunk())) {
        std::string chunks;
        for (int c : holders)
          chunks += (chunks.empty() ? "" : ", ") + std::to_string(c);
        return error(prog, ": input '", fbString(in->name()),
                     "' lies in the slot region of chunk ", chunks,
                     " but names chunk ", in->chunk(),
                     " (InputSpec.chunk: the chunk whose forwards fill it)");
      }
    }
  return Status();
}

Status Validator::checkSchedule(const std::string &prog, const fb::Program &p) {
  if (!p.schedule() || p.schedule()->size() == 0)
    return Status();
  const int64_t numMicro = a.batch()->num_microbatches();
  const int numFunctions = p.functions() ? int(p.functions()->size()) : 0;
  // For each forward/backward function: the step that runs each microbatch.
  // A variant for the last microbatch ("<name>:last", e.g. a backward that
  // starts the gradient buckets' reductions) counts as its function.
  auto logicalName = [](std::string_view name) {
    std::string n(name);
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ":last") == 0)
      n.resize(n.size() - 5);
    return n;
  };
  std::map<int, int> logicalOf; // function index -> representative index
  std::map<std::string, int> representative;
  std::map<int, std::vector<int>> stepOf;
  for (int fi = 0; fi < numFunctions; ++fi) {
    std::string_view name = p.functions()->Get(fi)->name()
                                ? p.functions()->Get(fi)->name()->string_view()
                                : std::string_view();
    if (!isForwardFunction(name) && !isBackwardFunction(name))
      continue;
    auto [it, fresh] = representative.try_emplace(logicalName(name), fi);
    logicalOf[fi] = it->second;
    if (fresh)
      stepOf[fi].assign(size_t(numMicro), -1);
  }
  const auto &schedule = *p.schedule();
  auto logicalFunction = [&](int fi) {
    auto it = logicalOf.find(fi);
    return it == logicalOf.end() ? fi : it->second;
  };
  for (flatbuffers::uoffset_t si = 0; si < schedule.size(); ++si) {
    const fb::ScheduleStep *step = schedule.Get(si);
    std::string where = prog + ": schedule step " + std::to_string(si);
    int fi = step->function();
    if (fi < 0 || fi >= numFunctions)
      return error(where, ": function index ", fi, " out of range (",
                   numFunctions, " functions)");
    const fb::Function *f = p.functions()->Get(fi);
    std::string fname = fbString(f->name());
    where += " ('" + fname + "' microbatch " +
             std::to_string(step->microbatch()) + ")";
    if (fname == "step" || fname == "microbatch")
      return error(where, ": '", fname,
                   "' cannot be a schedule step (the schedule replaces the "
                   "microbatch loop; 'step' runs after it)");
    if (fname == "init")
      return error(where, ": 'init' cannot be a schedule step (it runs once, "
                          "before the first iteration)");
    int slots = std::max(1, f->num_slots());
    if (step->slot() < 0 || step->slot() >= slots)
      return error(where, ": slot ", step->slot(),
                   " out of range (the function has ", f->num_slots(),
                   " slots)");
    if (step->microbatch() < 0 || step->microbatch() >= numMicro)
      return error(where, ": microbatch out of range (num_microbatches ",
                   numMicro, ")");
    auto it = stepOf.find(logicalFunction(fi));
    if (it == stepOf.end())
      continue;
    int &seen = it->second[size_t(step->microbatch())];
    if (seen >= 0)
      return error(where, ": runs '", logicalName(fname), "' for microbatch ",
                   step->microbatch(), " a second time (first at step ", seen,
                   ")");
    seen = int(si);
  }
  for (auto &[fi, steps] : stepOf)
    for (size_t m = 0; m < steps.size(); ++m)
      if (steps[m] < 0)
        return error(prog, ": the schedule never runs '",
                     fbString(p.functions()->Get(fi)->name()), "' for microbatch ",
                     m, " (every forward and backward function runs each ",
                     "of the ", numMicro, " microbatches once)");

  // A chunk's backward ("backward<suffix>") reads what its forward
  // ("forward<suffix>") saved in the slot: it must come later, on the same
  // slot, and no other microbatch's forward may reuse the slot in between.
  // A split backward's weight-gradient phase ("backward_w<suffix>") reads
  // the slot after the backward: the slot is held until it runs.
  auto findLogical = [&](const std::string &name) {
    for (auto &[fi, unused] : stepOf)
      if (logicalName(fbString(p.functions()->Get(fi)->name())) == name)
        return fi;
    return -1;
  };
  for (auto &[fwd, fwdSteps] : stepOf) {
    std::string fname = logicalName(fbString(p.functions()->Get(fwd)->name()));
    if (!isForwardFunction(fname))
      continue;
    std::string bname = "backward" + fname.substr(7);
    std::string wname = "backward_w" + fname.substr(7);
    int bwd = findLogical(bname);
    if (bwd < 0)
      continue;
    int wgt = findLogical(wname);
    // (earlier phase, later phase): the backward after the forward, W after
    // the backward.
    std::vector<std::pair<int, int>> chain{{fwd, bwd}};
    if (wgt >= 0)
      chain.push_back({bwd, wgt});
    for (auto [before, after] : chain) {
      const std::vector<int> &beforeSteps = stepOf[before];
      const std::vector<int> &afterSteps = stepOf[after];
      std::string aname =
          logicalName(fbString(p.functions()->Get(after)->name()));
      const char *its = before == fwd ? "its forward" : "its backward";
      for (size_t m = 0; m < beforeSteps.size(); ++m) {
        int fs = beforeSteps[m], bs = afterSteps[m];
        if (bs < fs)
          return error(prog, ": schedule step ", bs, " runs '", aname,
                       "' for microbatch ", m, " before ", its, " (step ", fs,
                       ")");
        if (schedule.Get(fs)->slot() != schedule.Get(bs)->slot())
          return error(prog, ": schedule step ", bs, " runs '", aname,
                       "' for microbatch ", m, " on slot ",
                       schedule.Get(bs)->slot(), " but ", its, " (step ", fs,
                       ") ran on slot ", schedule.Get(fs)->slot());
      }
    }
    // Slot occupancy: slot -> microbatch whose last phase has not run yet.
    const int release = wgt >= 0 ? wgt : bwd;
    const std::vector<int> &releaseSteps = stepOf[release];
    std::map<int, int> holder;
    for (flatbuffers::uoffset_t si = 0; si < schedule.size(); ++si) {
      const fb::ScheduleStep *step = schedule.Get(si);
      if (logicalFunction(step->function()) == fwd) {
        auto held = holder.find(step->slot());
        if (held != holder.end())
          return error(prog, ": schedule step ", si, " runs '", fname,
                       "' for microbatch ", step->microbatch(), " on slot ",
                       step->slot(), ", which still holds microbatch ",
                       held->second, " (its ",
                       wgt >= 0 ? "weight gradients run" : "backward runs",
                       " at step ", releaseSteps[size_t(held->second)], ")");
        holder[step->slot()] = step->microbatch();
      } else if (logicalFunction(step->function()) == release) {
        holder.erase(step->slot());
      }
    }
  }
  return Status();
}

} // namespace

Status validateArtifact(const std::string &name, const fb::Artifact &artifact) {
  return Validator(name, artifact).run();
}

} // namespace tessera::rt
