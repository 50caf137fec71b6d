//===- LoadPlan.h - Checkpoint compatibility and resharding -----*- C++ -*-===//
//
// How a rank of an artifact is rebuilt from a checkpoint's manifest (see
// tessera/rt/checkpoint/Manifest.h), before any shard file is read: the
// compatibility checks, and per buffer the pieces of saved tensors that
// make it up. Tensors reshard through their global shapes: each rank
// assembles its boxes from the shards that overlap them, so a checkpoint
// loads into a different tp / pp / dp layout.
//
// Distributed-optimizer state (flat 1/dp shards of gradient buckets) is
// read back per parameter through the bucket layouts the manifest records
// (each parameter's [start, end) in its bucket, the shard of dp index i
// being elements [i n/dp, (i+1) n/dp) of a bucket of n): that is the
// parameter's local (tp/pp-sharded) flattened state, which reshards like
// per-parameter state. A distributed-optimizer target fills each of its
// bucket shards from the parameters overlapping it, through its own
// artifact's layout (the same description the manifest records: the bucket
// views "pbuf:<grad buffer>:<k>" and the Param buffers whose bytes lie
// inside them); padding is zero. The same configuration with the same
// bucket layout reads its own shards as saved (bit-identical).
//
// Mixed precision: fp32 main params (MainParam) are optimizer state. Per
// parameter ("main:<param>") they take and reshard with their parameter's
// layout like per-parameter Adam state; the distributed optimizer's shards
// of parameter buckets ("main:pbuf:...") behave like its Adam shards
// (and a checkpoint without them gives them from its F32 parameters).
// --no-load-optim skips them, and a checkpoint without them (saved without
// --bf16) leaves them to the program's "init" function, except that main
// params of F32 checkpoint parameters are those parameters. Parameters
// whose dtype changed between save and load (F32 <-> BF16 or F16) are converted:
// to a 16-bit format rounded to nearest even, to f32 exactly (from the checkpoint's
// main params where it has them and the optimizer state is loaded).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_LOADPLAN_H
#define TESSERA_RT_CHECKPOINT_LOADPLAN_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Status.h"
#include "tessera/rt/WaitMonitor.h"
#include "tessera/rt/checkpoint/Manifest.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::rt {

struct CheckpointLoadOptions {
  /// The run's --seed (compared with the checkpoint's).
  uint64_t seed = 1234;
  /// Restore optimizer state, main params included (false: --no-load-optim,
  /// parameters and iteration only).
  bool loadOptimizer = true;
  std::string datasetPrefix;
  int64_t datasetTokens = -1;
  /// loadCheckpoint marks each step that waits for other ranks or the file
  /// system here (tessera-run's watchdog); null: not tracked. Not used by
  /// planning.
  WaitMonitor *monitor = nullptr;
  /// Test hook (TESSERA_DEBUG_STALL_IN_LOAD): this world rank sleeps for an
  /// hour after reading the manifest, before the all-gather of iterations.
  int debugStallRank = -1;
};

/// A box [lo, hi) per dimension of a global tensor.
struct TensorBox {
  std::vector<int64_t> lo, hi;
  bool operator==(const TensorBox &o) const { return lo == o.lo && hi == o.hi; }
  int64_t volume() const;
};

/// Shard `index` of `count` along `dim` (-1 or count 1: the whole tensor).
TensorBox shardBox(const std::vector<int64_t> &globalShape, int dim, int index,
                   int count);
/// Shard `j` of saved tensor `t` (both of its splits).
TensorBox shardBox(const ManifestTensor &t, int j);
/// Copies the elements of `region` (inside both boxes) from `src`, a dense
/// row-major tensor covering `srcBox`, to `dst`, covering `dstBox`.
void copyTensorBox(const uint8_t *src, const TensorBox &srcBox, uint8_t *dst,
                   const TensorBox &dstBox, const TensorBox &region,
                   int64_t elementSize);

/// A run of a saved distributed-optimizer bucket shard: `count` elements
/// from element `sourceOffset` of tensor `sourceName` in the shard file of
/// `sourceRank`, to element `offset` of the (flattened) tensor assembled.
struct FlatRun {
  int sourceRank = 0;
  std::string sourceName;
  int64_t sourceOffset = 0, offset = 0, count = 0;
  bool operator==(const FlatRun &o) const {
    return sourceRank == o.sourceRank && sourceName == o.sourceName &&
           sourceOffset == o.sourceOffset && offset == o.offset &&
           count == o.count;
  }
};

/// How one buffer of the loading rank is rebuilt: pieces of saved tensors.
struct RestorePiece {
  int sourceRank = 0;
  std::string sourceName;
  TensorBox sourceBox, region;
  /// The saved tensor's dtype; a float piece of a buffer of another float
  /// dtype is converted (to bf16 or f16 rounded to nearest even, to f32
  /// exactly).
  fb::DType dtype = fb::DType::F32;
  /// Non-empty: the source is no saved tensor but the per-parameter state
  /// `sourceName` of one shard (sourceBox) of a parameter, assembled
  /// (row-major) from runs of the distributed optimizer's bucket shards of
  /// several ranks; sourceRank is then -1.
  std::vector<FlatRun> runs;
};

/// Part of a distributed-optimizer bucket shard on the loading rank:
/// elements [begin, end) of the row-major `box` (one parameter's local
/// shard, in its global tensor), assembled from `pieces`, go to element
/// `offset` of the buffer.
struct RestoreSegment {
  std::string param;
  TensorBox box;
  int64_t begin = 0, end = 0, offset = 0;
  std::vector<RestorePiece> pieces;
};

struct BufferRestore {
  std::string name;
  fb::BufferKind kind = fb::BufferKind::Param;
  fb::DType dtype = fb::DType::F32;
  TensorBox box;
  std::vector<RestorePiece> pieces;
  /// A distributed-optimizer bucket shard built from per-parameter state
  /// (another configuration): its parameters' parts; padding stays zero.
  /// `pieces` is then empty and `box` the flat shard.
  std::vector<RestoreSegment> segments;
  /// The Iteration buffer: set to the checkpoint's iteration.
  bool isIteration = false;
};
struct CheckpointLoadPlan {
  int rank = 0;
  std::vector<BufferRestore> buffers;
  /// Shard files to read (world ranks), own rank first when needed.
  std::vector<int> sourceRanks;
  /// The configuration differs from the checkpoint's, or some buffer is
  /// assembled from a different layout.
  bool resharded = false;
  /// The artifact's configuration (CheckpointManifest::configString).
  std::string targetConfig;
  /// Warnings (different model name, dataset, harmless seed change).
  std::vector<std::string> notes;
};

/// The compatibility checks (parameter set and global shapes, optimizer
/// kind, global batch, seed, distributed-optimizer state) and the plan of
/// world rank `rank` of `artifact`. Pure: reads no files. `checkpointDir`
/// names the checkpoint in errors.
StatusOr<CheckpointLoadPlan>
planCheckpointLoad(const CheckpointManifest &manifest,
                   const LoadedArtifact &artifact, int rank,
                   const CheckpointLoadOptions &options,
                   const std::string &checkpointDir);

/// Before launch: locates the checkpoint, plans every rank and checks the
/// header (magic, version, rank, world size, size, CRC against the manifest)
/// of every shard file a rank will read. NotFound as locateCheckpoint.
Status checkCheckpointForLaunch(const LoadedArtifact &artifact,
                                const std::string &dir,
                                const CheckpointLoadOptions &options);

} // namespace tessera::rt

#endif // TESSERA_RT_CHECKPOINT_LOADPLAN_H
