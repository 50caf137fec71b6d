//===- Checkpoint.h - Distributed training checkpoints ----------*- C++ -*-===//
//
// tessera-run --save DIR / --load DIR. A checkpoint of iteration N is
//
//   DIR/iter_000000N/rank_RRRRR.bin   one shard file per world rank
//   DIR/iter_000000N/manifest.json    written by rank 0 once every shard is
//   DIR/latest                        "N\n", updated last
//
// Every file is written to a temporary name in its directory, fsynced,
// renamed into place and the directory fsynced, so a crash at any point
// leaves the previous complete checkpoint loadable (`latest` only ever names
// an iteration whose shards and manifest are all on disk).
//
// A shard file holds the rank's persistent training state: the buffers of
// kind Param, OptState, MainParam and Iteration of its program (gradients
// are zero at step boundaries; activations, inputs, the loss and views are
// transient or alias other buffers). The data loader and dropout are addressed
// purely by (seed, iteration, microbatch, global sample index), so the
// completed iteration plus the seed is the whole data/RNG state; both are
// recorded.
//
// Shard file: a 32-byte header, then the payload.
//   bytes 0..3   magic "TSCK"
//   bytes 4..7   format version (u32 LE) == kShardFormatVersion
//   bytes 8..15  payload size (u64)
//   bytes 16..19 CRC-32 (IEEE) of the payload
//   bytes 20..23 world rank (u32)          bytes 24..27 world size (u32)
//   bytes 28..31 reserved, zero
// Payload: u64 iteration, u64 consumed samples, u64 seed, u32 tensor count,
// u32 reserved; per tensor u32 name length, name, u8 kind (BufferKind),
// u8 dtype, u8 rank, u8 reserved, i64 dims[rank], u64 data offset (from the
// payload's start, 64-byte aligned), u64 data bytes; then the data.
//
// The manifest (JSON) records the parallel configuration and, for every
// saved tensor, its global shape and which world rank holds which shard, so
// a checkpoint can be loaded into a different tp / pp / dp layout
// (resharding). Distributed-optimizer state (flat 1/dp shards of gradient
// buckets) is read back per parameter through the bucket layouts the
// manifest records (each parameter's [start, end) in its bucket, the
// shard of dp index i being elements [i n/dp, (i+1) n/dp) of a bucket of
// n): that is the parameter's local (tp/pp-sharded) flattened state, which
// reshards like per-parameter state. A distributed-optimizer target fills
// each of its bucket shards from the parameters overlapping it, through
// its own artifact's layout (the same description the manifest records:
// the bucket views "pbuf:<grad buffer>:<k>" and the Param buffers whose
// bytes lie inside them); padding is zero. The same configuration with the
// same bucket layout reads its own shards as saved (bit-identical).
//
// Mixed precision: fp32 main params (MainParam) are optimizer state. Per
// parameter ("main:<param>") they take and reshard with their parameter's
// layout like per-parameter Adam state; the distributed optimizer's shards
// of parameter buckets ("main:pbuf:...") behave like its Adam shards
// (and a checkpoint without them gives them from its F32 parameters).
// --no-load-optim skips them, and a checkpoint without them (saved without
// --bf16) leaves them to the program's "init" function, except that main
// params of F32 checkpoint parameters are those parameters. Parameters
// whose dtype changed between save and load (F32 <-> BF16) are converted:
// to bf16 rounded to nearest even, to f32 exactly (from the checkpoint's
// main params where it has them and the optimizer state is loaded).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_H
#define TESSERA_RT_CHECKPOINT_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Status.h"
#include "tessera/rt/WaitMonitor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::rt {

class Communicator;
class Executor;

namespace ckpt {
constexpr char kShardMagic[4] = {'T', 'S', 'C', 'K'};
constexpr uint32_t kShardFormatVersion = 1;
constexpr size_t kShardHeaderSize = 32;
constexpr int kManifestFormatVersion = 1;
} // namespace ckpt

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

/// Writes `size` bytes to `path` atomically and durably: a temporary file in
/// the same directory, fsync, rename over `path`, fsync of the directory.
/// On error the temporary file is removed and `path` is untouched.
Status writeFileAtomic(const std::string &path, const void *data, size_t size);
inline Status writeFileAtomic(const std::string &path,
                              const std::string &bytes) {
  return writeFileAtomic(path, bytes.data(), bytes.size());
}
/// fsync of a directory (makes renames and creations in it durable).
Status syncDirectory(const std::string &dir);
/// mkdir -p (existing directories are fine).
Status makeDirectories(const std::string &dir);
/// The whole file.
StatusOr<std::string> readWholeFile(const std::string &path);

/// "iter_0000010".
std::string iterationDirName(int64_t iteration);
/// "rank_00003.bin".
std::string shardFileName(int rank);

//===----------------------------------------------------------------------===//
// Shard files
//===----------------------------------------------------------------------===//

struct ShardTensor {
  std::string name;
  fb::BufferKind kind = fb::BufferKind::Param;
  fb::DType dtype = fb::DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

struct ShardFile {
  int rank = 0, worldSize = 1;
  int64_t iteration = 0, consumedSamples = 0;
  uint64_t seed = 0;
  /// CRC-32 of the payload (set by decodeShard).
  uint32_t crc = 0;
  std::vector<ShardTensor> tensors;
  /// The tensor named `name`, or null.
  const ShardTensor *find(const std::string &name) const;
};

/// Header fields of a shard file.
struct ShardHeader {
  uint32_t version = 0;
  uint64_t payloadSize = 0;
  uint32_t crc = 0;
  int rank = 0, worldSize = 0;
};

/// Header + payload of `shard`.
std::string encodeShard(const ShardFile &shard);
/// Checks, in order: size of the header, magic, version, rank < world size,
/// payload size against the bytes present (truncation, trailing bytes), the
/// CRC-32, and the tensor index (bounds, sizes, unique names). Every message
/// starts with `fileName`.
StatusOr<ShardFile> decodeShard(const std::string &bytes,
                                const std::string &fileName);
/// The header checks of decodeShard (everything but the CRC and the index)
/// on the file's first bytes and its size, without reading the payload.
StatusOr<ShardHeader> readShardHeader(const std::string &path);
StatusOr<ShardFile> readShardFile(const std::string &path);

//===----------------------------------------------------------------------===//
// Manifest
//===----------------------------------------------------------------------===//

/// One saved tensor. Reshardable tensors (parameters, per-parameter optimizer
/// state, the iteration) appear once, with every holder; `holders` pairs a
/// world rank with the index of the shard it holds (0 <= index < numShards,
/// along shardDim of globalShape; numShards = 1: replicated). A tensor that
/// is not reshardable (distributed-optimizer bucket shards) appears once per
/// holding rank, with its pipeline stage.
struct ManifestTensor {
  std::string name;
  fb::BufferKind kind = fb::BufferKind::Param;
  fb::DType dtype = fb::DType::F32;
  std::vector<int64_t> shape, globalShape;
  int shardDim = -1;
  std::string shardAxis;
  int numShards = 1;
  /// OptState: the parameter (or bucket view) it belongs to.
  std::string param;
  bool reshardable = true;
  bool distributedOptimizer = false;
  int stage = -1;
  std::vector<std::pair<int, int>> holders;
};

/// The parameters laid out in one bucket view of the distributed optimizer
/// (element offset inside the bucket, element count), per pipeline stage.
struct ManifestBucket {
  int stage = 0;
  std::string name;
  int64_t numel = 0;
  std::vector<std::tuple<std::string, int64_t, int64_t>> params;
  bool operator==(const ManifestBucket &o) const {
    return stage == o.stage && name == o.name && numel == o.numel &&
           params == o.params;
  }
};

struct ManifestShardFile {
  int rank = 0;
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

struct CheckpointManifest {
  int formatVersion = ckpt::kManifestFormatVersion;
  int64_t iteration = 0, consumedSamples = 0;
  uint64_t seed = 0;
  std::string model, artifact, producer, compileFlags;
  int worldSize = 1;
  std::vector<std::pair<std::string, int>> mesh;
  std::string order;
  int tp = 1, pp = 1, dp = 1, cp = 1, vpp = 1;
  bool distributedOptimizer = false;
  int64_t microBatch = 1, globalBatch = 1, numMicrobatches = 1;
  std::string optimizer;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  std::map<std::string, std::vector<std::vector<int>>> groups;
  std::string datasetPrefix;
  int64_t datasetTokens = -1;
  std::vector<ManifestShardFile> files;
  std::vector<ManifestTensor> tensors;
  std::vector<ManifestBucket> buckets;

  /// "tp=2 pp=1 dp=2 (world 4)" plus ", vpp=2" / ", distributed optimizer".
  std::string configString() const;
};

/// Run information the manifest records besides the artifact's.
struct CheckpointRunInfo {
  int64_t iteration = 0;
  uint64_t seed = 0;
  std::string datasetPrefix;
  int64_t datasetTokens = -1;
};

/// The manifest of `artifact` at `info` (files left empty): every rank's
/// saved tensors and their shards, the bucket layouts, the configuration.
StatusOr<CheckpointManifest> describeCheckpoint(const LoadedArtifact &artifact,
                                                const CheckpointRunInfo &info);
std::string manifestToJson(const CheckpointManifest &manifest);
/// Parses and checks a manifest; errors start with `fileName`.
StatusOr<CheckpointManifest> parseManifest(const std::string &text,
                                           const std::string &fileName);

//===----------------------------------------------------------------------===//
// Locating, planning, saving and loading
//===----------------------------------------------------------------------===//

struct CheckpointLocation {
  std::string dir;        ///< the iter_NNNNNNN directory
  int64_t iteration = -1; ///< from `latest` (-1: DIR was the iter directory)
};

/// Resolves --load DIR: DIR/latest names DIR/iter_N; or DIR holds a
/// manifest.json (an iter_ directory itself). NotFound when DIR holds no
/// checkpoint at all (no `latest`, not an iter_ directory); other codes for
/// a broken one.
StatusOr<CheckpointLocation> locateCheckpoint(const std::string &dir);
/// Reads and parses `location.dir`/manifest.json (checks its iteration
/// against `latest`'s).
StatusOr<CheckpointManifest> readManifest(const CheckpointLocation &location);

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
  /// The saved tensor's dtype; an F32 or BF16 piece of a buffer of the
  /// other one is converted (to bf16 rounded to nearest even, to f32
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

struct CheckpointSaveOptions {
  std::string dir;
  CheckpointRunInfo info;
  /// Test hook (TESSERA_DEBUG_EXIT_IN_SAVE): every rank _exit(9)s right
  /// after writing its shard of this iteration, before the manifest.
  int64_t debugExitAfterShard = -1;
  /// Marks each step that waits for other ranks or the file system
  /// (tessera-run's watchdog); null: not tracked.
  WaitMonitor *monitor = nullptr;
  /// Test hook (TESSERA_DEBUG_STALL_IN_SAVE): this world rank sleeps for an
  /// hour after writing its shard, before the all-gather of the shard sizes
  /// and CRCs.
  int debugStallRank = -1;
};
struct CheckpointSaveResult {
  std::string dir;
  uint64_t bytes = 0; ///< all shard files together (rank 0; else own)
};

/// Collective over `world` (null: one rank): every rank writes its shard of
/// `options.info.iteration` into DIR/iter_N; after all have (an all-gather
/// of their sizes and CRCs), rank 0 writes manifest.json, then DIR/latest;
/// a final barrier. A rank that fails returns its error (tessera-run then
/// aborts every rank before rank 0 can commit the checkpoint).
StatusOr<CheckpointSaveResult>
saveCheckpoint(const Executor &executor, const CheckpointSaveOptions &options,
               Communicator *world);

struct CheckpointLoadResult {
  std::string dir;
  int64_t iteration = 0;
  bool resharded = false;
  std::string savedConfig, targetConfig;
  std::vector<std::string> notes;
};

/// Restores the executor's parameters, optimizer state and iteration from
/// the checkpoint --load `dir` names (all ranks must agree on it: checked
/// with an all-gather over `world`), reading its own shard file or, when
/// resharding, the shards of every rank that holds a piece it needs (one
/// file at a time, each fully validated). Ends with a barrier over `world`,
/// so no rank returns success before every rank has its state; a rank that
/// fails returns its error without entering it (tessera-run then aborts
/// the job).
StatusOr<CheckpointLoadResult>
loadCheckpoint(Executor &executor, const std::string &dir,
               const CheckpointLoadOptions &options, Communicator *world);

} // namespace tessera::rt

#endif // TESSERA_RT_CHECKPOINT_H
