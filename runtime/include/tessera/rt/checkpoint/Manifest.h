//===- Manifest.h - Checkpoint manifest.json --------------------*- C++ -*-===//
//
// The manifest (JSON) that rank 0 writes into a checkpoint's iter_NNNNNNN
// directory once every shard file is on disk (see tessera/rt/Checkpoint.h).
// It records the parallel configuration and, for every saved tensor, its
// global shape and which world rank holds which shard, so a checkpoint can
// be loaded into a different tp / pp / dp layout (resharding; see
// tessera/rt/checkpoint/LoadPlan.h). Distributed-optimizer state (flat 1/dp
// shards of gradient buckets) is described through the bucket layouts it
// records: each parameter's [start, end) in its bucket view.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_MANIFEST_H
#define TESSERA_RT_CHECKPOINT_MANIFEST_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/GradScaler.h"
#include "tessera/rt/Status.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tessera::rt {

namespace ckpt {
constexpr int kManifestFormatVersion = 1;
} // namespace ckpt

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
  /// Shards of both splits together; shard j is block j / numShards2 of
  /// shardDim and, within it, block j % numShards2 of shard2Dim.
  int numShards = 1;
  /// A second split (-1: none), of numShards2 blocks.
  int shard2Dim = -1;
  std::string shard2Axis;
  int numShards2 = 1;
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
  /// The model's architecture record (a JSON object in Megatron-LM's
  /// argument names, from the artifact; empty when it has none):
  /// tessera-export reads it.
  std::string architecture;
  /// An imported ONNX model's export record (JSON object, from the
  /// artifact; empty for other models): tessera-export --format onnx.
  std::string onnxSource;
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
  /// fp16: the loss scaler's state after `iteration` (manifest
  /// "grad_scaler") and the iterations whose updates were skipped so far.
  std::optional<GradScalerState> gradScaler;
  int64_t skippedIterations = 0;

  /// "tp=2 pp=1 dp=2 (world 4)" plus ", vpp=2" / ", distributed optimizer".
  std::string configString() const;
};

/// Run information the manifest records besides the artifact's.
struct CheckpointRunInfo {
  int64_t iteration = 0;
  std::optional<GradScalerState> gradScaler;
  int64_t skippedIterations = 0;
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

} // namespace tessera::rt

#endif // TESSERA_RT_CHECKPOINT_MANIFEST_H
