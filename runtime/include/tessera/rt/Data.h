//===- Data.h - Synthetic classification data -------------------*- C++ -*-===//
//
// The model inputs are drawn from a deterministic Gaussian-mixture
// classification task addressed by a global sample index g:
//   label(g)      = min(C - 1, floor(uniform(seed, "data.labels", g) * C))
//   centre[c][j]  = normal(seed, "data.centres", c * F + j)
//   x(g)[j]       = 2/sqrt(F) * centre[label(g)][j]
//                   + normal(seed, "data.noise", g * F + j)
// For microbatch m (0-based) of iteration `it` (1-based) on the rank with
// index r in its dp group of size D, sample i of the micro batch b is
//   g = (it - 1) * G + m * b * D + r * b + i,   G = global batch size,
// so every parallel configuration with the same G sees the same data.
//
// Language-model inputs ("tokens" and "labels" [S, b] i32 with vocab_size >
// 0) come from a Megatron indexed dataset instead (DataLayout::dataset,
// tessera-run --data): with the same g, sample g is the S + 1 consecutive
// tokens of the dataset's token stream starting at (g * S) mod (T - S)
// (IndexedDataset.h); tokens[s][i] = sample_i[s], labels[s][i] =
// sample_i[s + 1], element (s, i) at s * b + i.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_DATA_H
#define TESSERA_RT_DATA_H

#include "tessera/rt/Artifact.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace tessera::rt {

class IndexedDataset;

/// Where a rank's micro batches come from.
struct DataLayout {
  uint64_t seed = 1234;
  int64_t globalBatch = 1; ///< G
  int64_t microBatch = 1;  ///< b
  int dpIndex = 0;         ///< r
  int dpSize = 1;          ///< D
  /// Context parallelism: token inputs split over "cp" hold cp rank
  /// cpIndex's load-balanced share of each sample (math/SequenceLayout.h).
  int cpIndex = 0;
  int cpSize = 1;
  /// Token dataset of the language-model inputs (null: none given).
  std::shared_ptr<const IndexedDataset> dataset;
  /// Without a dataset: synthetic tokens (tessera-run --mock-data), the
  /// token at position p of global sample g drawn from Philox stream
  /// (seed, "mock-data") at index g * (S + 1) + p, so every layout sees the
  /// same samples, like a dataset's.
  bool mockData = false;
};

/// True for an input filled from the token dataset: "tokens" or "labels"
/// with vocab_size > 0.
bool isTokenInput(const fb::InputSpec &spec);

/// True if any program of `artifact` has a token input.
bool artifactNeedsTokenData(const fb::Artifact &artifact);

/// Checks the token inputs of `program` against `dataset`: i32 [S, b]
/// buffers with b = the micro batch size, every token id below the input's
/// vocab_size and more than S tokens in the dataset. `fileName` names the
/// artifact in errors.
Status checkTokenInputs(const fb::Program &program, int64_t microBatch,
                        const IndexedDataset &dataset,
                        const std::string &fileName);

/// Global index of sample `i` of microbatch `m` in iteration `it`.
int64_t globalSampleIndex(const DataLayout &layout, int64_t iteration,
                          int64_t microbatch, int64_t i);

int32_t syntheticLabel(uint64_t seed, int64_t g, int64_t numClasses);

/// Writes the F features of sample g (with label `label`) to `out`.
void syntheticFeatures(uint64_t seed, int64_t g, int32_t label,
                       int64_t numFeatures, float *out);

/// Generates the host bytes of input `spec` of `program` for one microbatch.
/// `fileName` is used in error messages.
Status generateInput(const fb::Program &program, const fb::InputSpec &spec,
                     const DataLayout &layout, int64_t iteration,
                     int64_t microbatch, const std::string &fileName,
                     std::vector<uint8_t> &out);

/// Fills `out` with shard `shardIndex` of `shardCount` (split along
/// `shardDim`, -1 for replicated) of the parameter `name` of `globalShape`:
/// element with global row-major index g gets
///   Normal:  scale * normal(seed, name, g)
///   Uniform: scale * (2 * uniform(seed, name, g) - 1)
///   Zeros / Ones.
Status initParameterShard(fb::InitKind init, float scale, uint64_t seed,
                          std::string_view name,
                          const std::vector<int64_t> &globalShape, int shardDim,
                          int shardIndex, int shardCount, float *out);

/// The block of a global tensor a rank holds: per dimension, its first
/// index `lo` and its extent.
struct TensorBlock {
  std::vector<int64_t> lo, extent;
};
/// As initParameterShard, for any block of the global tensor (a parameter
/// split along two dimensions).
Status initParameterBlock(fb::InitKind init, float scale, uint64_t seed,
                          std::string_view name,
                          const std::vector<int64_t> &globalShape,
                          const TensorBlock &block, float *out);

/// The path of an initial-value data file (fb::Buffer::data_file, relative
/// to data_dir): inside `dataDir` where that holds the file, else inside the
/// directory of the artifact at `artifactPath` (moved with its data). A path
/// that is absolute, names a parent directory, or resolves (symbolic links
/// followed) outside its directory is an error: an artifact reads no file
/// outside the directory it names.
StatusOr<std::string> resolveDataFile(const std::string &file,
                                      const std::string &dataDir,
                                      const std::string &artifactPath);

/// Initialises param `buffer` of `artifact` as seen by world rank `rank`
/// into host memory `out` (numElements(buffer.shape()) floats). A BF16
/// parameter gets the same f32 values (the caller rounds them to bf16).
Status initParameterBuffer(const fb::Artifact &artifact,
                           const fb::Buffer &buffer, int rank, uint64_t seed,
                           const std::string &fileName, float *out);

} // namespace tessera::rt

#endif // TESSERA_RT_DATA_H
