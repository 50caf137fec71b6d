//===- Artifact.h - .tsr artifact loading and validation --------*- C++ -*-===//
//
// Loads a compiled Tessera artifact (.tsr): the 24-byte container header of
// ArtifactFormat.h around a FlatBuffer of schema/artifact.fbs. Loading checks,
// in order: the file is readable, holds at least a header, magic, format
// version, payload size (truncation), CRC-32, FlatBuffer verification and
// finally semantic consistency (TensorRefs inside the arena, every
// instruction against its row of the instruction contract in Opcodes.def,
// indices, mesh and rank groups, batch). Every error names the file.
// The sources are in runtime/src/artifact/: Container.cpp (header, CRC,
// FlatBuffer), Validator.cpp, Queries.cpp and Summary.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_ARTIFACT_H
#define TESSERA_RT_ARTIFACT_H

#include "tessera/artifact/artifact_generated.h"
#include "tessera/rt/ArtifactFormat.h"
#include "tessera/rt/BF16.h"
#include "tessera/rt/Opcodes.h"
#include "tessera/rt/Status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::rt {

namespace fb = ::tessera::artifact;

/// A verified artifact. Owns the payload bytes; `root()` points into them.
class LoadedArtifact {
public:
  /// Reads and fully validates `path`.
  static StatusOr<std::shared_ptr<const LoadedArtifact>>
  loadFromFile(const std::string &path);

  /// Validates an in-memory .tsr image (header + payload). `name` is used in
  /// error messages in place of a file name.
  static StatusOr<std::shared_ptr<const LoadedArtifact>>
  loadFromMemory(std::string fileBytes, const std::string &name);

  const fb::Artifact *root() const { return rootPtr; }
  const std::string &name() const { return fileName; }

  /// The program run by pipeline stage `ppRank`, or null.
  const fb::Program *programForPpRank(int ppRank) const;
  /// The program world rank `worldRank` runs: the one of its index in its
  /// "pp" group (pp rank 0 without one; the only program if there is one).
  const fb::Program *programForWorldRank(int worldRank) const;

private:
  LoadedArtifact() = default;
  std::string fileName;
  std::string payload;
  const fb::Artifact *rootPtr = nullptr;
};

/// Where a rank sits inside the rank group instance of some kind.
struct GroupPosition {
  const fb::RankGroup *group = nullptr; ///< null if the kind is absent
  int instance = 0; ///< index of the instance among groups of this kind
  int index = 0;    ///< position of the rank in `group->ranks()`
  int size = 1;     ///< number of ranks in the instance
};

/// Finds the instance of `kind` that contains `rank`. If no group of that
/// kind holds the rank (the kind is absent, or an embedding kind leaves the
/// rank out), returns {nullptr, 0, 0, 1}; use hasGroupKind to tell apart.
GroupPosition findGroupPosition(const fb::Artifact &artifact,
                                std::string_view kind, int rank);

/// One split of a parameter as world rank `rank` holds it: dim `dim` over
/// the rank group of kind `axis`, in which the rank is `index` of `count`.
struct ParameterSplit {
  int dim = -1;
  std::string axis;
  int index = 0, count = 1;
};
/// The splits of `buffer` (shard_dim over shard_axis, then shard2_dim over
/// shard2_axis; none for a replicated one) for `rank`. Errors (a dim out of
/// range or split twice, an axis without a group holding the rank) name
/// the field.
StatusOr<std::vector<ParameterSplit>>
parameterSplits(const fb::Artifact &artifact, const fb::Buffer &buffer,
                int rank);

/// True for the kinds whose instances need not cover the world: "embedding"
/// (first and last rank of each pp group) and "position-embedding" (first
/// rank). Every other kind partitions [0, world_size).
bool mayLeaveRanksOut(std::string_view kind);

/// True if the artifact has at least one rank group of `kind`.
bool hasGroupKind(const fb::Artifact &artifact, std::string_view kind);

/// The string of an optional FlatBuffer string field ("" when absent).
std::string fbString(const flatbuffers::String *s);

/// "[0, 2, 4]".
std::string ranksToString(const flatbuffers::Vector<int32_t> *ranks);

/// All rank-group kinds named by collectives (isCollective; not the groups
/// of vocab-sharded kernels) in any program, plus "dp" when
/// the artifact has dp groups and "pp" when a program has pipeline
/// point-to-point instructions (Send, Recv); sorted, unique. Every rank
/// derives the same list, so communicators can be split collectively in this
/// order.
std::vector<std::string> collectiveGroupKinds(const fb::Artifact &artifact);

/// Number of elements of `shape` (1 for a scalar, 0 when a dimension is 0);
/// for shapes the loader admitted (whose byte size fits in int64).
int64_t numElements(const flatbuffers::Vector<int64_t> *shape);
/// Bytes per element of `dtype`.
int64_t dtypeSize(fb::DType dtype);
/// Whether `dtype` is a float type (F32, BF16, F16).
inline bool isFloatDType(fb::DType dtype) {
  return dtype == fb::DType::F32 || dtype == fb::DType::BF16 ||
         dtype == fb::DType::F16;
}
/// The storage format of a float dtype (F32 for the integer ones).
inline FloatFormat floatFormatOf(fb::DType dtype) {
  return dtype == fb::DType::BF16  ? FloatFormat::BF16
         : dtype == fb::DType::F16 ? FloatFormat::F16
                                   : FloatFormat::F32;
}
/// "[2, 3]" etc.
std::string shapeToString(const flatbuffers::Vector<int64_t> *shape);

/// True if `name` is a pipeline forward ("forward...") or backward
/// ("backward...") function.
bool isForwardFunction(std::string_view name);
bool isBackwardFunction(std::string_view name);
/// A split backward's weight-gradient phase ("backward_w_c<k>"; also a
/// backward function by name).
bool isWeightGradFunction(std::string_view name);

/// Human-readable manifest of the artifact: header fields, mesh, groups,
/// batch, optimizer, per-program buffers, inputs and functions.
std::string summarizeArtifact(const LoadedArtifact &artifact);

/// Writes header + `payload` to `path` (used by tests and the compiler).
Status writeArtifactFile(const std::string &path, const uint8_t *payload,
                         size_t size);

} // namespace tessera::rt

#endif // TESSERA_RT_ARTIFACT_H
