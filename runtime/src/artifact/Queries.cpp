//===- Queries.cpp - .tsr artifact queries shared by the runtime ----------===//
//
// Element counts, dtype sizes, rank-group positions and program lookup:
// the small questions the validator, the executor, checkpoints and the
// launcher ask of a loaded artifact.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Artifact.h"

#include <set>

namespace tessera::rt {

int64_t numElements(const flatbuffers::Vector<int64_t> *shape) {
  if (!shape)
    return 1;
  // A zero dimension first: the loader bounds the bytes of every shape, but
  // the other dimensions of an empty tensor may multiply past int64.
  for (int64_t d : *shape)
    if (d == 0)
      return 0;
  int64_t n = 1;
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
  case fb::DType::F16:
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

bool isForwardFunction(std::string_view name) {
  return name.substr(0, 7) == "forward";
}

bool isBackwardFunction(std::string_view name) {
  return name.substr(0, 8) == "backward";
}

bool isWeightGradFunction(std::string_view name) {
  return name.substr(0, 10) == "backward_w";
}

std::string fbString(const flatbuffers::String *s) {
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

StatusOr<std::vector<ParameterSplit>>
parameterSplits(const fb::Artifact &artifact, const fb::Buffer &buffer,
                int rank) {
  std::vector<ParameterSplit> splits;
  const int dims = buffer.shape() ? int(buffer.shape()->size()) : 0;
  for (auto [dim, axis] :
       {std::pair(buffer.shard_dim(), buffer.shard_axis()),
        std::pair(buffer.shard2_dim(), buffer.shard2_axis())}) {
    if (dim < 0)
      continue;
    ParameterSplit s{dim, fbString(axis)};
    if (dim >= dims || (!splits.empty() && splits[0].dim == dim))
      return invalidArgument("shard dim ", dim, " (over '", s.axis,
                             "') is out of range or split twice");
    GroupPosition pos = findGroupPosition(artifact, s.axis, rank);
    if (!pos.group)
      return invalidArgument("no rank group of shard axis '", s.axis,
                             "' contains rank ", rank);
    s.index = pos.index;
    s.count = pos.size;
    splits.push_back(std::move(s));
  }
  return splits;
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
} // namespace tessera::rt
