//===- Layout.h - Saved buffers and their global layouts --------*- C++ -*-===//
//
// Internal to runtime/src/checkpoint/: which buffers a checkpoint saves, and
// where a saved buffer of one rank sits in its global tensor, read from the
// artifact: a parameter's shard along its shard_dim over the rank group of
// its shard_axis (Megatron's tensor-parallel split), per-parameter optimizer
// state and fp32 main params with their parameter's layout, and the
// distributed optimizer's flat 1/dp shards of bucket views (Megatron's
// DistributedOptimizer). describeCheckpoint records these layouts in the
// manifest; the load planner computes the target artifact's with them.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_LAYOUT_H
#define TESSERA_RT_CHECKPOINT_LAYOUT_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Status.h"
#include "tessera/rt/checkpoint/Manifest.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::rt::ckpt {

/// The buffers a shard file holds: the persistent training state.
inline bool isSavedKind(fb::BufferKind k) {
  return k == fb::BufferKind::Param || k == fb::BufferKind::OptState ||
         k == fb::BufferKind::MainParam || k == fb::BufferKind::Iteration;
}

/// Optimizer state in the --no-load-optim sense: Adam moments and the fp32
/// main params of mixed precision.
inline bool isOptimizerKind(fb::BufferKind k) {
  return k == fb::BufferKind::OptState || k == fb::BufferKind::MainParam;
}

/// Main params of a parameter bucket of the distributed optimizer are named
/// "main:" + the bucket's parameter view ("pbuf:<grad buffer>:<bucket>").
inline constexpr std::string_view kMainPrefix = "main:";
inline constexpr std::string_view kBucketMainPrefix = "main:pbuf:";

inline std::vector<int64_t> toVector(const flatbuffers::Vector<int64_t> *v) {
  return v ? std::vector<int64_t>(v->begin(), v->end())
           : std::vector<int64_t>();
}

inline std::string nameOf(const fb::Buffer &b) {
  return b.name() ? b.name()->str() : std::string();
}

/// Where a saved buffer of one rank sits in its global tensor: shard
/// `index` of `count` along `shardDim`, and within it shard `index2` of
/// `count2` along `shardDim2` (a second split, e.g. the experts over "ep"
/// and their FFN over "etp"). The manifest numbers the shards of both
/// splits together: flatIndex() of numShards().
struct TensorLayout {
  std::vector<int64_t> local, global;
  int shardDim = -1;
  std::string axis;
  int index = 0, count = 1;
  int shardDim2 = -1;
  std::string axis2;
  int index2 = 0, count2 = 1;
  bool reshardable = true, distOpt = false;
  std::string param;

  int flatIndex() const { return index * count2 + index2; }
  int numShards() const { return count * count2; }
};

/// The layout of parameter `b` on world rank `rank`: its global shape and,
/// when sharded, its index and count along shard_dim in the rank group of
/// its shard_axis. Errors name the artifact and the parameter.
StatusOr<TensorLayout> paramLayout(const LoadedArtifact &artifact,
                                   const fb::Buffer &b, int rank);
/// The layout of saved buffer `b` of `program` on world rank `rank`:
/// parameters, per-parameter Adam state and main params reshard (the
/// parameter's layout); bucket shards of the distributed optimizer and state
/// of an unknown layout do not (loadable only where they were saved).
StatusOr<TensorLayout> layoutOf(const LoadedArtifact &artifact,
                                const fb::Program &program, const fb::Buffer &b,
                                int rank);
/// The bucket views the optimizer state of `program` shards, with the
/// parameters laid out in each.
std::vector<ManifestBucket> bucketLayouts(const fb::Program &program);
/// The pipeline stage of world rank `rank` (0 without a pp group).
int ppStage(const fb::Artifact &a, int rank);

} // namespace tessera::rt::ckpt

#endif // TESSERA_RT_CHECKPOINT_LAYOUT_H
