//===- GradBuckets.h - Megatron's param-and-grad buffers and buckets -*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), like the rank groups and the schedules: the
// layout of Megatron's _ParamAndGradBuffer
// (megatron/core/distributed/param_and_grad_buffer.py, the current layout):
//   - parameters grouped into buffers by (param dtype, grad dtype), grads
//     in fp32 with grad_reduce_in_fp32;
//   - laid out in reverse order (roughly the order the backward produces
//     the gradients);
//   - with the distributed optimizer, every parameter starts at a multiple
//     of 64 elements (128 bytes for >= 16-bit types) and every bucket ends
//     at a multiple of lcm(dp, 128), or lcm(dp, 128, 2^16) with
//     pad_buckets_for_high_nccl_busbw, so each bucket splits evenly over dp;
//   - a new bucket once a bucket holds bucket_size elements (on the first
//     pipeline stage only: later stages keep one bucket); the shared
//     embedding (tied word embedding) in a bucket of its own with the
//     distributed optimizer;
//   - bucket groups (_ParamAndGradBucketGroup, partition_buckets): one
//     bucket each, or all in one (single_bucket_group);
// and the distributed optimizer's four ranges per (dp rank, bucket,
// parameter) of DistributedOptimizer._build_model_gbuf_range
// (megatron/core/optimizer/distrib_optimizer.py): gbuf_world,
// gbuf_world_in_bucket, gbuf_local and param.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_BUCKETS_GRADBUCKETS_H
#define TESSERA_BUCKETS_GRADBUCKETS_H

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::buckets {

/// A parameter, in the model's order.
struct ParamInfo {
  std::string name;
  int64_t numel = 0;
  std::string paramDtype = "f32";
  std::string gradDtype = "f32";
  /// The word embedding shared with the LM head across pipeline stages.
  bool sharedEmbedding = false;
};

struct LayoutOptions {
  int64_t dp = 1;
  /// Elements per bucket; 0 for Megatron's default max(40000000, 1000000 dp).
  int64_t bucketSize = 0;
  bool distributedOptimizer = false;
  bool padForHighNcclBusbw = false;
  /// Later pipeline stages keep one bucket (their reduction is off the
  /// critical path).
  bool firstPipelineStage = true;
};

/// Megatron's default bucket size for `dp` data-parallel ranks.
int64_t defaultBucketSize(int64_t dp);

struct ParamRange {
  std::string name;
  int64_t start = 0, end = 0; ///< elements in the buffer
  int64_t bucket = 0;
};

struct Bucket {
  int64_t start = 0, end = 0; ///< padded, elements in the buffer
  int64_t numelUnpadded = 0;
  std::vector<std::string> params; ///< in buffer order (reverse model order)
};

struct Buffer {
  std::string paramDtype, gradDtype;
  int64_t numel = 0, numelUnpadded = 0;
  std::vector<ParamRange> params; ///< in the model's parameter order
  std::vector<Bucket> buckets;
};

/// The buffers of one pipeline stage's parameters, in order of first
/// appearance of each (param dtype, grad dtype).
std::vector<Buffer> layoutBuffers(const std::vector<ParamInfo> &params,
                                  const LayoutOptions &options);

/// Checks a buffer's invariants; returns "" or what is wrong: parameters
/// inside their bucket and not overlapping, buckets contiguous from 0 to
/// numel, with the distributed optimizer 64-element parameter starts and
/// bucket ends divisible by the padding divisor (hence by dp), without it
/// no padding at all.
std::string validate(const Buffer &buffer, const LayoutOptions &options);

struct Range {
  int64_t start = 0, end = 0;
  int64_t size() const { return end - start; }
};

/// One parameter's part of a dp rank's shard of a bucket.
struct ShardParam {
  std::string name;
  Range gbufWorld;         ///< in the whole buffer
  Range gbufWorldInBucket; ///< in the bucket
  Range gbufLocal;         ///< in the rank's shard of the bucket
  Range param;             ///< in the flattened parameter
};

struct Shard {
  int64_t dpRank = 0, bucket = 0;
  Range gbufWorld; ///< the rank's shard of the bucket, in the buffer
  std::vector<ShardParam> params;
};

/// Every dp rank's shard of every bucket (bucket-major), with the ranges of
/// the parameters that overlap it (Megatron's
/// _build_model_gbuf_param_range_map). Bucket sizes must divide by dp.
std::vector<Shard> shardRanges(const Buffer &buffer, int64_t dp);

/// Ranges of `params` (start, end in the buffer) in a shard `shardRange`
/// of a bucket starting at `bucketOffset`: the core of shardRanges, exposed
/// for layouts built by hand (the 16-element sharding example of Megatron's
/// distributed-optimizer guide, dist_optimizer.md).
std::vector<ShardParam> paramRangesInShard(const std::vector<ParamRange> &params,
                                           Range shardRange, int64_t bucketOffset);

/// A group of buckets whose reductions are issued together: (buffer,
/// bucket) pairs.
struct BucketGroup {
  std::vector<std::pair<int64_t, int64_t>> buckets;
};

/// Megatron's partition_buckets without fp8: one group per bucket, or one
/// group of all buckets.
std::vector<BucketGroup> partitionBuckets(const std::vector<Buffer> &buffers,
                                          bool singleBucketGroup);

} // namespace tessera::buckets

#endif // TESSERA_BUCKETS_GRADBUCKETS_H
