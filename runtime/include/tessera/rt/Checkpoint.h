//===- Checkpoint.h - Distributed training checkpoints ----------*- C++ -*-===//
//
// tessera-run --save DIR / --load DIR. A checkpoint of iteration N is
//
//   DIR/iter_000000N/rank_RRRRR.bin   one shard file per world rank
//   DIR/iter_000000N/manifest.json    written by rank 0 once every shard is
//   DIR/latest                        "N\n", updated last
//
// Every file is written to a temporary name in its directory, fsynced,
// renamed into place and the directory fsynced (writeFileAtomic,
// tessera/rt/FileIO.h), so a crash at any point leaves the previous
// complete checkpoint loadable (`latest` only ever names an iteration whose
// shards and manifest are all on disk).
//
// A shard file holds the rank's persistent training state: the buffers of
// kind Param, OptState, MainParam and Iteration of its program (gradients
// are zero at step boundaries; activations, inputs, the loss and views are
// transient or alias other buffers). The data loader and dropout are addressed
// purely by (seed, iteration, microbatch, global sample index), so the
// completed iteration plus the seed is the whole data/RNG state; both are
// recorded.
//
// This header is the checkpoint API of tessera-run: locating, saving and
// loading a checkpoint. It includes the parts they are built from, each
// implemented in runtime/src/checkpoint/:
//   tessera/rt/checkpoint/ShardFile.h  the shard file format
//   tessera/rt/checkpoint/Manifest.h   manifest.json (configuration, global
//                                      shapes, who holds which shard)
//   tessera/rt/checkpoint/LoadPlan.h   compatibility checks and resharding
//                                      (another tp / pp / dp layout, the
//                                      distributed optimizer, F32 <-> BF16)
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_H
#define TESSERA_RT_CHECKPOINT_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/FileIO.h"
#include "tessera/rt/Status.h"
#include "tessera/rt/WaitMonitor.h"
#include "tessera/rt/checkpoint/LoadPlan.h"
#include "tessera/rt/checkpoint/Manifest.h"
#include "tessera/rt/checkpoint/ShardFile.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::rt {

class Communicator;
class Executor;

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

/// What cleanInterruptedSaves removed.
struct CleanedSaves {
  std::vector<std::string> iterDirs; ///< iter_ directories without a manifest
  int64_t tempFiles = 0;             ///< writeFileAtomic's "*.tmp.<pid>"
};
/// Removes what interrupted saves left in --save DIR: iter_NNNNNNN
/// directories without a manifest.json (the manifest is written last, once
/// every shard is on disk, so such a directory was never a checkpoint; the
/// one `latest` names is kept whatever it holds) and the temporary files of
/// atomic writes ("<name>.tmp.<pid>") in DIR and its iter_ directories.
/// Nothing else is touched. Call on one rank, before any rank saves; a DIR
/// that does not exist is fine.
StatusOr<CleanedSaves> cleanInterruptedSaves(const std::string &dir);

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
  /// fp16's loss scaler and skipped iterations as saved (none without).
  std::optional<GradScalerState> gradScaler;
  int64_t skippedIterations = 0;
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
