//===- Artifact.cpp - .tsr artifact loading and validation ----------------===//
//
// Container checks, FlatBuffer verification and semantic validation of
// compiled artifacts.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Artifact.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace tessera::rt {

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

int64_t numElements(const flatbuffers::Vector<int64_t> *shape) {
  int64_t n = 1;
  if (shape)
    for (int64_t d : *shape)
      n *= d;
  return n;
}

int64_t dtypeSize(fb::DType dtype) {
  switch (dtype) {
  case fb::DType::F32:
  case fb::DType::I32:
    return 4;
  case fb::DType::I64:
    return 8;
  case fb::DType::BF16:
    return 2;
  }
  return 0;
}

std::string shapeToString(const flatbuffers::Vector<int64_t> *shape) {
  std::string s = "[";
  if (shape)
    for (flatbuffers::uoffset_t i = 0; i < shape->size(); ++i)
      s += (i ? ", " : "") + std::to_string(shape->Get(i));
  return s + "]";
}

int expectedOperandCount(fb::Opcode op) {
  using O = fb::Opcode;
  switch (op) {
  case O::Gemm:
  case O::BiasAdd:
  case O::Add:
  case O::GeluGrad:
  case O::ReluGrad:
  case O::CrossEntropy:
    return 3;
  case O::Gelu:
  case O::Relu:
  case O::ReduceRows:
  case O::Mean:
  case O::MeanGrad:
  case O::Scale:
  case O::Copy:
  case O::Axpy:
  case O::AllGather:
  case O::ReduceScatter:
  case O::ReduceScatterStart:
  case O::Sgd:
  case O::Cast:
    return 2;
  case O::CrossEntropyGrad:
    return 4;
  case O::Fill:
  case O::AllReduce:
  case O::AllReduceStart:
  case O::Send:
  case O::Recv:
    return 1;
  case O::Wait:
    return 0;
  case O::Adam:
    return 5;
  case O::LayerNorm:
    return 4;
  case O::LayerNormGrad:
    return 6;
  case O::Embedding:
  case O::EmbeddingGrad:
    return 3;
  case O::AddPositionEmbedding:
    return 3;
  case O::PositionEmbeddingGrad:
  case O::Attention:
  case O::LogitsMax:
    return 2;
  case O::AttentionGrad:
  case O::TokenMean:
  case O::TokenMeanGrad:
    return 3;
  case O::CrossEntropyStats:
  case O::CrossEntropyFromStats:
    return 5;
  case O::CrossEntropyStatsGrad:
    return 6;
  case O::Dropout:
    return 2;
  }
  return -1;
}

int expectedIAttrCount(fb::Opcode op) {
  using O = fb::Opcode;
  if (expectedOperandCount(op) < 0)
    return -1;
  switch (op) {
  case O::Embedding:
  case O::CrossEntropyStats:
  case O::CrossEntropyFromStats:
  case O::CrossEntropyStatsGrad:
  case O::TokenMean:
  case O::TokenMeanGrad:
  case O::Dropout:
    return 1;
  case O::Attention:
  case O::AttentionGrad:
  case O::Send:
  case O::Recv:
    return 2;
  default:
    return 0;
  }
}

bool isCollective(fb::Opcode op) {
  using O = fb::Opcode;
  return op == O::AllReduce || op == O::AllGather || op == O::ReduceScatter ||
         op == O::AllReduceStart || op == O::ReduceScatterStart;
}

bool isPointToPoint(fb::Opcode op) {
  return op == fb::Opcode::Send || op == fb::Opcode::Recv;
}

bool isForwardFunction(std::string_view name) {
  return name.substr(0, 7) == "forward";
}

bool isBackwardFunction(std::string_view name) {
  return name.substr(0, 8) == "backward";
}

bool isShardedKernel(fb::Opcode op) {
  using O = fb::Opcode;
  return op == O::Embedding || op == O::EmbeddingGrad ||
         op == O::CrossEntropyStats || op == O::CrossEntropyStatsGrad ||
         op == O::Copy || op == O::Dropout;
}

static std::string str(const flatbuffers::String *s) {
  return s ? s->str() : std::string();
}

bool mayLeaveRanksOut(std::string_view kind) {
  return kind == "embedding" || kind == "position-embedding";
}

bool hasGroupKind(const fb::Artifact &artifact, std::string_view kind) {
  if (artifact.groups())
    for (const fb::RankGroup *g : *artifact.groups())
      if (g->kind() && g->kind()->string_view() == kind)
        return true;
  return false;
}

std::string ranksToString(const flatbuffers::Vector<int32_t> *ranks) {
  std::string s = "[";
  if (ranks)
    for (flatbuffers::uoffset_t i = 0; i < ranks->size(); ++i)
      s += (i ? ", " : "") + std::to_string(ranks->Get(i));
  return s + "]";
}

GroupPosition findGroupPosition(const fb::Artifact &artifact,
                                std::string_view kind, int rank) {
  GroupPosition pos;
  if (!artifact.groups())
    return pos;
  int instance = 0;
  for (const fb::RankGroup *g : *artifact.groups()) {
    if (!g->kind() || g->kind()->string_view() != kind)
      continue;
    if (g->ranks())
      for (flatbuffers::uoffset_t i = 0; i < g->ranks()->size(); ++i)
        if (g->ranks()->Get(i) == rank) {
          pos.group = g;
          pos.instance = instance;
          pos.index = int(i);
          pos.size = int(g->ranks()->size());
          return pos;
        }
    ++instance;
  }
  return pos;
}

std::vector<std::string> collectiveGroupKinds(const fb::Artifact &artifact) {
  std::set<std::string> kinds;
  if (artifact.programs())
    for (const fb::Program *p : *artifact.programs())
      if (p->functions())
        for (const fb::Function *f : *p->functions())
          if (f->instrs())
            for (const fb::Instr *in : *f->instrs()) {
              if (isPointToPoint(in->op()))
                kinds.insert("pp");
              else if (isCollective(in->op()) && in->group() &&
                       in->group()->size())
                kinds.insert(in->group()->str());
            }
  if (artifact.groups())
    for (const fb::RankGroup *g : *artifact.groups())
      if (g->kind() && g->kind()->str() == "dp")
        kinds.insert("dp");
  return {kinds.begin(), kinds.end()};
}

const fb::Program *LoadedArtifact::programForPpRank(int ppRank) const {
  if (!rootPtr->programs())
    return nullptr;
  for (const fb::Program *p : *rootPtr->programs())
    if (p->pp_rank() == ppRank)
      return p;
  return nullptr;
}

const fb::Program *LoadedArtifact::programForWorldRank(int worldRank) const {
  GroupPosition pp = findGroupPosition(*rootPtr, "pp", worldRank);
  const fb::Program *p = programForPpRank(pp.group ? pp.index : 0);
  if (!p && rootPtr->programs() && rootPtr->programs()->size() == 1)
    p = rootPtr->programs()->Get(0);
  return p;
}

//===----------------------------------------------------------------------===//
// Semantic validation
//===----------------------------------------------------------------------===//

namespace {

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

Status Validator::checkMeshAndGroups() {
  int world = a.world_size();
  if (world <= 0)
    return error("world_size must be positive, got ", world);
  int64_t product = 1;
  std::string meshText;
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh()) {
      if (axis->size() <= 0)
        return error("mesh axis '", str(axis->name()),
                     "' has non-positive size ", axis->size());
      product *= axis->size();
      meshText += (meshText.empty() ? "" : " x ") + str(axis->name()) + "=" +
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
  if (b->micro_batch_size() * b->num_microbatches() * dp !=
      b->global_batch_size())
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
  int64_t bytes = numElements(ref->shape()) * es;
  if (ref->rank_group() && ref->rank_group()->size())
    return checkRankRelativeRef(what, *ref, bytes, arenaBytes);
  if (ref->rank_stride() != 0)
    return error(what, " has rank_stride ", ref->rank_stride(),
                 " but no rank_group (only a rank-relative ref has a stride)");
  if (ref->offset() < 0 || ref->offset() % es != 0 ||
      ref->offset() + bytes > arenaBytes)
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
    if (str(g->kind()) == kind) {
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
  // Every rank's shard inside the arena, the last rank's too (the stride is
  // bounded first so that the product cannot overflow).
  if (offset < 0 || (size > 1 && stride > arenaBytes) ||
      offset + (size - 1) * stride + bytes > arenaBytes)
    return error(what, placement, " lies outside the arena of ", arenaBytes,
                 " bytes for ", kind, " index ", size - 1);
  return Status();
}

Status Validator::checkInstr(const std::string &where, const fb::Instr &in,
                             int64_t arenaBytes) {
  int expected = expectedOperandCount(in.op());
  if (expected < 0)
    return error(where, ": unknown opcode ", int(in.op()));
  int got = in.operands() ? int(in.operands()->size()) : 0;
  if (got != expected)
    return error(where, ": ", fb::EnumNameOpcode(in.op()), " expects ",
                 expected, " operands, got ", got);
  for (int i = 0; i < got; ++i)
    TESSERA_RETURN_IF_ERROR(checkRef(where + ": operand " + std::to_string(i),
                                     in.operands()->Get(i), arenaBytes));
  int iattrs = in.iattrs() ? int(in.iattrs()->size()) : 0;
  int expectedIAttrs = expectedIAttrCount(in.op());
  if (iattrs != expectedIAttrs)
    return error(where, ": ", fb::EnumNameOpcode(in.op()), " expects ",
                 expectedIAttrs, " iattrs, got ", iattrs);
  if (isShardedKernel(in.op()) && in.group() && in.group()->size() &&
      !groupKinds.count(in.group()->str()))
    return error(where, ": vocabulary-sharded ", fb::EnumNameOpcode(in.op()),
                 " over group kind '", in.group()->str(),
                 "' but the artifact has no rank groups of that kind");
  switch (in.op()) {
  case fb::Opcode::AllReduce:
  case fb::Opcode::AllGather:
  case fb::Opcode::ReduceScatter:
  case fb::Opcode::ReduceScatterStart:
  case fb::Opcode::AllReduceStart: {
    std::string g = str(in.group());
    if (g.empty())
      return error(where, ": collective without a group");
    if (!groupKinds.count(g))
      return error(where, ": collective over group kind '", g,
                   "' but the artifact has no rank groups of that kind");
    if ((in.op() == fb::Opcode::AllReduceStart ||
         in.op() == fb::Opcode::ReduceScatterStart) &&
        in.event() < 0)
      return error(where, ": ", fb::EnumNameOpcode(in.op()),
                   " needs an event id >= 0");
    break;
  }
  case fb::Opcode::Wait:
    if (in.event() < 0)
      return error(where, ": Wait needs an event id >= 0");
    break;
  case fb::Opcode::Fill:
    if (!in.fattrs() || in.fattrs()->size() < 1)
      return error(where, ": Fill needs fattrs = [value]");
    break;
  case fb::Opcode::Adam:
    if (!in.fattrs() || in.fattrs()->size() != 5)
      return error(where, ": Adam needs fattrs = [lr, beta1, beta2, eps, "
                          "weight_decay]");
    break;
  case fb::Opcode::Sgd:
    if (!in.fattrs() || in.fattrs()->size() != 2)
      return error(where, ": Sgd needs fattrs = [lr, weight_decay]");
    break;
  case fb::Opcode::LayerNorm:
  case fb::Opcode::LayerNormGrad:
    if (!in.fattrs() || in.fattrs()->size() != 1 || !(in.fattrs()->Get(0) >= 0))
      return error(where, ": ", fb::EnumNameOpcode(in.op()),
                   " needs fattrs = [eps] with eps >= 0");
    break;
  case fb::Opcode::Embedding:
    if (in.iattrs()->Get(0) <= 0)
      return error(where,
                   ": Embedding needs iattrs = [vocab_size] with "
                   "vocab_size > 0, got ",
                   in.iattrs()->Get(0));
    break;
  case fb::Opcode::Send:
  case fb::Opcode::Recv: {
    const char *name = fb::EnumNameOpcode(in.op());
    std::string g = str(in.group());
    if (!g.empty() && g != "pp")
      return error(where, ": ", name,
                   " runs over the pipeline group 'pp', not '", g, "'");
    int64_t peer = in.iattrs()->Get(0), tag = in.iattrs()->Get(1);
    if (peer != 1 && peer != -1)
      return error(where, ": ", name,
                   " needs iattrs = [peer, tag] with peer +1 (next pp rank) "
                   "or -1 (previous), got peer ",
                   peer);
    // 32767 is the smallest MPI_TAG_UB MPI allows.
    if (tag < 0 || tag > 32767)
      return error(where, ": ", name, " tag ", tag, " outside [0, 32767]");
    break;
  }
  case fb::Opcode::Attention:
  case fb::Opcode::AttentionGrad:
    if (in.iattrs()->Get(0) <= 0 ||
        (in.iattrs()->Get(1) != 0 && in.iattrs()->Get(1) != 1))
      return error(where, ": ", fb::EnumNameOpcode(in.op()),
                   " needs iattrs = [num_heads > 0, causal 0/1], got [",
                   in.iattrs()->Get(0), ", ", in.iattrs()->Get(1), "]");
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
  if (p.persistent_bytes() < 0 || p.persistent_bytes() > arena)
    return error(prog, ": persistent_bytes ", p.persistent_bytes(),
                 " exceeds arena_bytes ", arena);
  int numBuffers = p.buffers() ? int(p.buffers()->size()) : 0;
  for (int bi = 0; bi < numBuffers; ++bi) {
    const fb::Buffer *b = p.buffers()->Get(bi);
    std::string what =
        prog + ": buffer " + std::to_string(bi) + " '" + str(b->name()) + "'";
    int64_t es = dtypeSize(b->dtype());
    if (es == 0)
      return error(what, " has unknown dtype");
    if (b->shape())
      for (int64_t d : *b->shape())
        if (d < 0)
          return error(what, " has a negative dimension");
    int64_t bytes = numElements(b->shape()) * es;
    if (b->offset() < 0 || b->offset() + bytes > arena)
      return error(what, " (offset ", b->offset(), ", ", bytes,
                   " bytes) lies outside the arena of ", arena, " bytes");
    if ((b->kind() == fb::BufferKind::Grad ||
         b->kind() == fb::BufferKind::OptState) &&
        b->of() >= numBuffers)
      return error(what, " refers to param buffer ", b->of(),
                   " but there are only ", numBuffers, " buffers");
    // Parameters are initialised from f32 values (bf16 ones rounded).
    if (b->kind() == fb::BufferKind::Param && b->dtype() != fb::DType::F32 &&
        b->dtype() != fb::DType::BF16)
      return error(what, " is a parameter of dtype ",
                   fb::EnumNameDType(b->dtype()),
                   " (parameters are F32 or BF16)");
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
                       str(param->name()), "' of kind ",
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
                       ", but its parameter '", str(param->name()),
                       "' has shape ", shapeToString(param->shape()));
      }
    }
    if (b->kind() == fb::BufferKind::Param && b->shard_dim() >= 0) {
      int rank = b->shape() ? int(b->shape()->size()) : 0;
      if (b->shard_dim() >= rank)
        return error(what, " has shard_dim ", b->shard_dim(), " but rank ",
                     rank);
      if (!b->shard_axis() || !groupKinds.count(b->shard_axis()->str()))
        return error(what, " is sharded over axis '", str(b->shard_axis()),
                     "' which has no rank groups");
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
  if (p.iteration_buffer() >= 0) {
    const fb::Buffer *b = p.buffers()->Get(p.iteration_buffer());
    if (b->dtype() != fb::DType::I64 || numElements(b->shape()) != 1)
      return error(prog, ": iteration buffer must be a scalar i64");
  }
  if (p.inputs())
    for (const fb::InputSpec *in : *p.inputs()) {
      if (in->buffer() < 0 || in->buffer() >= numBuffers)
        return error(prog, ": input '", str(in->name()), "' buffer index ",
                     in->buffer(), " out of range (", numBuffers, " buffers)");
      if (in->num_classes() < 0 || in->vocab_size() < 0 ||
          (in->num_classes() > 0 && in->vocab_size() > 0))
        return error(prog, ": input '", str(in->name()), "' has num_classes ",
                     in->num_classes(), " and vocab_size ", in->vocab_size(),
                     " (at most one may be set, neither negative)");
    }
  std::set<std::string> names;
  if (p.functions())
    for (const fb::Function *f : *p.functions()) {
      std::string fname = str(f->name());
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
      }
    }
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
    std::string what = prog + " function '" + str(f->name()) + "'";
    if (f->chunk() < -1 || f->chunk() >= p.num_chunks())
      return error(what, ": chunk ", f->chunk(), " out of range (num_chunks ",
                   p.num_chunks(), ")");
    if (f->num_slots() < 0)
      return error(what, ": negative num_slots ", f->num_slots());
    if (f->num_slots() == 0)
      continue;
    int64_t base = f->slot_base(), bytes = f->slot_bytes(), n = f->num_slots();
    if (base < 0 || bytes <= 0)
      return error(what,
                   ": slot region needs slot_base >= 0 and slot_bytes > 0, "
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
          return error(what, ": input '", str(in->name()), "' (bytes ", begin,
                       " to ", end, ") straddles the slot region [", base, ", ",
                       base + bytes, ")");
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
    std::string fname = str(f->name());
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
                     str(p.functions()->Get(fi)->name()), "' for microbatch ",
                     m, " (every forward and backward function runs each ",
                     "of the ", numMicro, " microbatches once)");

  // A chunk's backward ("backward<suffix>") reads what its forward
  // ("forward<suffix>") saved in the slot: it must come later, on the same
  // slot, and no other microbatch's forward may reuse the slot in between.
  for (auto &[fwd, fwdSteps] : stepOf) {
    std::string fname = logicalName(str(p.functions()->Get(fwd)->name()));
    if (!isForwardFunction(fname))
      continue;
    std::string bname = "backward" + fname.substr(7);
    int bwd = -1;
    for (auto &[fi, unused] : stepOf)
      if (logicalName(str(p.functions()->Get(fi)->name())) == bname)
        bwd = fi;
    if (bwd < 0)
      continue;
    const std::vector<int> &bwdSteps = stepOf[bwd];
    for (size_t m = 0; m < fwdSteps.size(); ++m) {
      int fs = fwdSteps[m], bs = bwdSteps[m];
      if (bs < fs)
        return error(prog, ": schedule step ", bs, " runs '", bname,
                     "' for microbatch ", m, " before its forward (step ", fs,
                     ")");
      if (schedule.Get(fs)->slot() != schedule.Get(bs)->slot())
        return error(prog, ": schedule step ", bs, " runs '", bname,
                     "' for microbatch ", m, " on slot ",
                     schedule.Get(bs)->slot(), " but its forward (step ", fs,
                     ") ran on slot ", schedule.Get(fs)->slot());
    }
    // Slot occupancy: slot -> microbatch whose backward has not run yet.
    std::map<int, int> holder;
    for (flatbuffers::uoffset_t si = 0; si < schedule.size(); ++si) {
      const fb::ScheduleStep *step = schedule.Get(si);
      if (logicalFunction(step->function()) == fwd) {
        auto held = holder.find(step->slot());
        if (held != holder.end())
          return error(prog, ": schedule step ", si, " runs '", fname,
                       "' for microbatch ", step->microbatch(), " on slot ",
                       step->slot(), ", which still holds microbatch ",
                       held->second, " (its backward runs at step ",
                       bwdSteps[size_t(held->second)], ")");
        holder[step->slot()] = step->microbatch();
      } else if (logicalFunction(step->function()) == bwd) {
        holder.erase(step->slot());
      }
    }
  }
  return Status();
}

} // namespace

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

StatusOr<std::shared_ptr<const LoadedArtifact>>
LoadedArtifact::loadFromFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound(path, ": cannot open artifact file for reading");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad())
    return dataLoss(path, ": error reading artifact file");
  return loadFromMemory(os.str(), path);
}

StatusOr<std::shared_ptr<const LoadedArtifact>>
LoadedArtifact::loadFromMemory(std::string bytes, const std::string &name) {
  using namespace ::tessera::artifact;
  const auto *data = reinterpret_cast<const uint8_t *>(bytes.data());
  if (bytes.size() < kHeaderSize)
    return dataLoss(name, ": file is ", bytes.size(),
                    " bytes, smaller than the ", kHeaderSize,
                    "-byte .tsr header (truncated or not an artifact)");
  if (std::memcmp(data, kMagic, 4) != 0)
    return invalidArgument(name, ": bad magic (not a Tessera .tsr artifact)");
  uint32_t version = loadLE32(data + 4);
  if (version != kFormatVersion)
    return failedPrecondition(name, ": unsupported format version ", version,
                              " (this runtime supports version ",
                              kFormatVersion, "); recompile the model");
  uint64_t payloadSize = loadLE64(data + 8);
  uint64_t expected = kHeaderSize + payloadSize;
  if (payloadSize > bytes.size() || bytes.size() < expected)
    return dataLoss(name, ": file is truncated: expected ", expected,
                    " bytes, got ", bytes.size());
  if (bytes.size() > expected)
    return dataLoss(name, ": file has ", bytes.size() - expected,
                    " unexpected trailing bytes (expected ", expected,
                    " bytes, got ", bytes.size(), ")");
  uint32_t crc = loadLE32(data + 16);
  uint32_t actual = artifact::crc32(data + kHeaderSize, payloadSize);
  if (crc != actual) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%08x, computed 0x%08x", crc, actual);
    return dataLoss(name, ": payload is corrupted (CRC-32 mismatch: header ",
                    buf, ")");
  }

  std::shared_ptr<LoadedArtifact> result(new LoadedArtifact());
  result->fileName = name;
  // A fresh string keeps the payload heap-aligned for the verifier.
  result->payload = bytes.substr(kHeaderSize);
  const auto *buf = reinterpret_cast<const uint8_t *>(result->payload.data());
  flatbuffers::Verifier verifier(buf, result->payload.size());
  if (!verifier.VerifyBuffer<fb::Artifact>(nullptr))
    return dataLoss(name, ": FlatBuffer verification failed (payload does not "
                          "match schema artifact.fbs)");
  result->rootPtr = flatbuffers::GetRoot<fb::Artifact>(buf);
  TESSERA_RETURN_IF_ERROR(Validator(name, *result->rootPtr).run());
  return std::shared_ptr<const LoadedArtifact>(std::move(result));
}

Status writeArtifactFile(const std::string &path, const uint8_t *payload,
                         size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return notFound(path, ": cannot open for writing");
  std::string header = artifact::makeHeader(payload, size);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char *>(payload), std::streamsize(size));
  if (!out)
    return dataLoss(path, ": write failed");
  return Status();
}

//===----------------------------------------------------------------------===//
// Summary
//===----------------------------------------------------------------------===//

static const char *kindName(fb::BufferKind k) {
  return fb::EnumNameBufferKind(k);
}

std::string summarizeArtifact(const LoadedArtifact &artifact) {
  const fb::Artifact &a = *artifact.root();
  std::ostringstream os;
  os << "artifact: " << artifact.name() << "\n";
  os << "  format version: " << a.format_version() << "\n";
  os << "  producer: " << str(a.producer()) << "\n";
  os << "  model: " << str(a.model()) << "\n";
  os << "  compile flags: " << str(a.compile_flags()) << "\n";
  os << "  world size: " << a.world_size() << "\n";
  os << "  mesh:";
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      os << " " << str(axis->name()) << "=" << axis->size();
  os << " (order " << str(a.order()) << ")\n";
  os << "  rank groups:\n";
  std::map<std::string, std::vector<std::string>> groups;
  if (a.groups())
    for (const fb::RankGroup *g : *a.groups()) {
      std::string s = "[";
      if (g->ranks())
        for (flatbuffers::uoffset_t i = 0; i < g->ranks()->size(); ++i)
          s += (i ? "," : "") + std::to_string(g->ranks()->Get(i));
      groups[str(g->kind())].push_back(s + "]");
    }
  for (auto &[kind, list] : groups) {
    os << "    " << kind << ":";
    for (auto &s : list)
      os << " " << s;
    os << "\n";
  }
  if (const fb::Batch *b = a.batch())
    os << "  batch: micro " << b->micro_batch_size() << ", global "
       << b->global_batch_size() << ", microbatches " << b->num_microbatches()
       << "\n";
  if (const fb::Optimizer *o = a.optimizer())
    os << "  optimizer: " << str(o->kind()) << " lr=" << o->lr()
       << " beta1=" << o->beta1() << " beta2=" << o->beta2()
       << " eps=" << o->eps() << " weight_decay=" << o->weight_decay() << "\n";
  if (a.programs())
    for (const fb::Program *p : *a.programs()) {
      os << "  program pp_rank " << p->pp_rank() << ": arena "
         << p->arena_bytes() << " bytes (persistent " << p->persistent_bytes()
         << ")\n";
      os << "    buffers:\n";
      if (p->buffers())
        for (flatbuffers::uoffset_t i = 0; i < p->buffers()->size(); ++i) {
          const fb::Buffer *b = p->buffers()->Get(i);
          os << "      #" << i << " " << str(b->name()) << " "
             << kindName(b->kind()) << " " << fb::EnumNameDType(b->dtype())
             << shapeToString(b->shape()) << " @" << b->offset();
          if (b->global_shape() && b->global_shape()->size())
            os << " global" << shapeToString(b->global_shape());
          if (b->shard_dim() >= 0)
            os << " shard dim " << b->shard_dim() << " over "
               << str(b->shard_axis());
          if (b->kind() == fb::BufferKind::Param)
            os << " init " << fb::EnumNameInitKind(b->init()) << "("
               << b->init_scale() << ")";
          if (b->of() >= 0)
            os << " of #" << b->of();
          os << "\n";
        }
      if (p->inputs())
        for (const fb::InputSpec *in : *p->inputs())
          os << "    input " << str(in->name()) << " -> #" << in->buffer()
             << (in->num_classes() ? " classes " : "")
             << (in->num_classes() ? std::to_string(in->num_classes()) : "")
             << (in->vocab_size() ? " vocab " : "")
             << (in->vocab_size() ? std::to_string(in->vocab_size()) : "")
             << "\n";
      os << "    loss buffer #" << p->loss_buffer() << ", iteration buffer #"
         << p->iteration_buffer() << "\n";
      if (p->functions())
        for (const fb::Function *f : *p->functions()) {
          os << "    function " << str(f->name()) << ": "
             << (f->instrs() ? f->instrs()->size() : 0) << " instructions";
          if (f->chunk() >= 0)
            os << ", chunk " << f->chunk();
          if (f->num_slots() > 0)
            os << ", " << f->num_slots()
               << (f->num_slots() == 1 ? " slot of " : " slots of ")
               << f->slot_bytes() << " bytes @" << f->slot_base();
          os << "\n";
        }
      if (p->schedule() && p->schedule()->size()) {
        os << "    schedule " << str(p->schedule_kind()) << " ("
           << p->num_chunks()
           << (p->num_chunks() == 1 ? " chunk, " : " chunks, ")
           << p->schedule()->size() << " steps):";
        const flatbuffers::uoffset_t shown = 32;
        for (flatbuffers::uoffset_t si = 0;
             si < p->schedule()->size() && si < shown; ++si) {
          const fb::ScheduleStep *step = p->schedule()->Get(si);
          int fi = step->function();
          std::string name =
              p->functions() && fi >= 0 && fi < int(p->functions()->size())
                  ? str(p->functions()->Get(fi)->name())
                  : "#" + std::to_string(fi);
          os << " " << name << "/mb" << step->microbatch() << "/s"
             << step->slot();
        }
        if (p->schedule()->size() > shown)
          os << " ... (" << p->schedule()->size() - shown << " more)";
        os << "\n";
      }
    }
  return os.str();
}

} // namespace tessera::rt
