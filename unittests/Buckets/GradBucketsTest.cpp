//===- GradBucketsTest.cpp - _ParamAndGradBuffer's layout, rule by rule ---===//

#include "tessera/Buckets/GradBuckets.h"

#include <gtest/gtest.h>

#include <map>

using namespace tessera::buckets;

namespace {

std::vector<ParamInfo> params(std::vector<std::pair<std::string, int64_t>> list) {
  std::vector<ParamInfo> out;
  for (auto &[name, n] : list)
    out.push_back(ParamInfo{name, n});
  return out;
}

const ParamRange &find(const Buffer &b, const std::string &name) {
  for (const ParamRange &p : b.params)
    if (p.name == name)
      return p;
  static ParamRange none;
  ADD_FAILURE() << "no parameter " << name;
  return none;
}

TEST(GradBuckets, ReverseOrderWithoutPadding) {
  LayoutOptions o;
  o.dp = 4;
  auto bufs = layoutBuffers(params({{"a", 10}, {"b", 20}, {"c", 30}}), o);
  ASSERT_EQ(bufs.size(), 1u);
  const Buffer &b = bufs[0];
  // The last parameter comes first: roughly the order of the backward.
  EXPECT_EQ(find(b, "c").start, 0);
  EXPECT_EQ(find(b, "b").start, 30);
  EXPECT_EQ(find(b, "a").start, 50);
  EXPECT_EQ(find(b, "a").end, 60);
  // The parameters are listed in the model's order.
  EXPECT_EQ(b.params[0].name, "a");
  ASSERT_EQ(b.buckets.size(), 1u);
  EXPECT_EQ(b.numel, 60);
  EXPECT_EQ(b.numelUnpadded, 60);
  EXPECT_EQ(validate(b, o), "");
}

TEST(GradBuckets, DistributedOptimizerAlignsStartsTo64AndPadsBucketsToLcm) {
  LayoutOptions o;
  o.dp = 2;
  o.distributedOptimizer = true;
  auto b = layoutBuffers(params({{"a", 10}, {"b", 100}}), o)[0];
  EXPECT_EQ(find(b, "b").start, 0);
  EXPECT_EQ(find(b, "a").start, 128); // 100 padded to 64 elements
  EXPECT_EQ(find(b, "a").end, 138);
  EXPECT_EQ(b.buckets[0].end, 256); // lcm(2, 128) = 128
  EXPECT_EQ(b.numel, 256);
  EXPECT_EQ(b.numelUnpadded, 138);
  EXPECT_EQ(validate(b, o), "");

  o.dp = 3; // lcm(3, 128) = 384
  b = layoutBuffers(params({{"a", 10}, {"b", 100}}), o)[0];
  EXPECT_EQ(b.numel, 384);
  EXPECT_EQ(b.numel % 3, 0);

  o.padForHighNcclBusbw = true; // lcm(3, 128, 2^16)
  b = layoutBuffers(params({{"a", 10}, {"b", 100}}), o)[0];
  EXPECT_EQ(b.numel, 3 * 65536);
  EXPECT_EQ(validate(b, o), "");
}

TEST(GradBuckets, NewBucketOnceBucketSizeIsReached) {
  LayoutOptions o;
  o.bucketSize = 100;
  auto b = layoutBuffers(params({{"p0", 60}, {"p1", 60}, {"p2", 60}, {"p3", 60}}), o)[0];
  ASSERT_EQ(b.buckets.size(), 2u);
  EXPECT_EQ(b.buckets[0].start, 0);
  EXPECT_EQ(b.buckets[0].end, 120); // p3 and p2: 120 >= 100 closes it
  EXPECT_EQ(b.buckets[1].start, 120);
  EXPECT_EQ(b.buckets[1].end, 240);
  EXPECT_EQ(find(b, "p3").bucket, 0);
  EXPECT_EQ(find(b, "p1").bucket, 1);
  EXPECT_EQ((std::vector<std::string>{"p3", "p2"}), b.buckets[0].params);
  // A parameter is never split: the bucket closes after the one that
  // crosses the size.
  o.bucketSize = 90;
  b = layoutBuffers(params({{"p0", 60}, {"p1", 60}, {"p2", 60}}), o)[0];
  EXPECT_EQ(b.buckets[0].end, 120);
  EXPECT_EQ(validate(b, o), "");
}

TEST(GradBuckets, LaterPipelineStagesKeepOneBucket) {
  LayoutOptions o;
  o.bucketSize = 100;
  o.firstPipelineStage = false;
  auto b = layoutBuffers(params({{"p0", 60}, {"p1", 60}, {"p2", 60}}), o)[0];
  EXPECT_EQ(b.buckets.size(), 1u);
}

TEST(GradBuckets, SharedEmbeddingGetsItsOwnBucket) {
  LayoutOptions o;
  o.dp = 2;
  o.distributedOptimizer = true;
  auto list = params({{"emb", 1000}, {"w", 50}, {"head", 70}});
  list[0].sharedEmbedding = true;
  auto b = layoutBuffers(list, o)[0];
  ASSERT_EQ(b.buckets.size(), 2u);
  EXPECT_EQ((std::vector<std::string>{"head", "w"}), b.buckets[0].params);
  EXPECT_EQ((std::vector<std::string>{"emb"}), b.buckets[1].params);
  EXPECT_EQ(b.buckets[1].start, 256);
  EXPECT_EQ(find(b, "emb").start, 256);
  EXPECT_EQ(b.buckets[1].end, 1280);
  EXPECT_EQ(validate(b, o), "");
  // Without the distributed optimizer Megatron keeps it with the others.
  o.distributedOptimizer = false;
  EXPECT_EQ(layoutBuffers(list, o)[0].buckets.size(), 1u);
}

TEST(GradBuckets, BuffersByParamAndGradDtype) {
  auto list = params({{"w", 10}, {"b", 4}, {"v", 6}});
  list[0].paramDtype = "bf16";
  list[2].paramDtype = "bf16";
  auto bufs = layoutBuffers(list, LayoutOptions());
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[0].paramDtype, "bf16");
  EXPECT_EQ(bufs[0].numel, 16);
  EXPECT_EQ(bufs[1].paramDtype, "f32");
  EXPECT_EQ(bufs[1].numel, 4);
}

TEST(GradBuckets, ValidateNamesEachBrokenInvariant) {
  LayoutOptions o;
  o.dp = 2;
  o.distributedOptimizer = true;
  Buffer good = layoutBuffers(params({{"a", 10}, {"b", 100}}), o)[0];
  Buffer b = good;
  b.params[0].start = 130; // "a"
  b.params[0].end = 140;
  EXPECT_NE(validate(b, o).find("not at a multiple of 64"), std::string::npos);
  b = good;
  b.params[0].start = 64; // overlaps b [0, 100)
  b.params[0].end = 74;
  EXPECT_NE(validate(b, o).find("overlap"), std::string::npos);
  b = good;
  b.params[0].end = 300;
  EXPECT_NE(validate(b, o).find("split across buckets"), std::string::npos);
  b = good;
  b.buckets[0].end = 255;
  b.numel = 255;
  EXPECT_NE(validate(b, o).find("not divisible by dp 2"), std::string::npos);
  LayoutOptions plain;
  EXPECT_NE(validate(good, plain).find("padded"), std::string::npos);
}

// The sharding-scheme figure of Megatron's distributed-optimizer guide
// (dist_optimizer.md): 16 elements, 4 parameters, dp = 4. The yellow
// parameter (Param1, elements [3, 8)) has one element on rank 0 and four
// on rank 1.
TEST(GradBuckets, DistOptimizerGuideShardRanges) {
  std::vector<ParamRange> ps = {{"p0", 0, 3, 0}, {"p1", 3, 8, 0},
                                {"p2", 8, 12, 0}, {"p3", 12, 16, 0}};
  auto r0 = paramRangesInShard(ps, Range{0, 4}, 0);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[1].name, "p1");
  EXPECT_EQ(r0[1].gbufWorld.start, 3);
  EXPECT_EQ(r0[1].gbufWorld.end, 4);
  EXPECT_EQ(r0[1].gbufLocal.start, 3);
  EXPECT_EQ(r0[1].gbufLocal.end, 4);
  EXPECT_EQ(r0[1].param.start, 0);
  EXPECT_EQ(r0[1].param.end, 1);
  auto r1 = paramRangesInShard(ps, Range{4, 8}, 0);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].name, "p1");
  EXPECT_EQ(r1[0].gbufWorld.start, 4);
  EXPECT_EQ(r1[0].gbufWorld.end, 8);
  EXPECT_EQ(r1[0].gbufLocal.start, 0);
  EXPECT_EQ(r1[0].gbufLocal.end, 4);
  EXPECT_EQ(r1[0].param.start, 1);
  EXPECT_EQ(r1[0].param.end, 5);

  Buffer b;
  b.numel = b.numelUnpadded = 16;
  b.params = ps;
  b.buckets = {Bucket{0, 16, 16, {"p0", "p1", "p2", "p3"}}};
  auto shards = shardRanges(b, 4);
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[1].gbufWorld.start, 4);
  EXPECT_EQ(shards[1].params.size(), 1u);
  EXPECT_EQ(shards[3].params[0].name, "p3");
}

TEST(GradBuckets, ShardRangesCoverEveryParameterOnce) {
  LayoutOptions o;
  o.dp = 4;
  o.distributedOptimizer = true;
  o.bucketSize = 300;
  auto b = layoutBuffers(params({{"a", 250}, {"b", 7}, {"c", 333}, {"d", 64}, {"e", 1}}), o)[0];
  ASSERT_EQ(validate(b, o), "");
  std::map<std::string, int64_t> covered;
  for (const Shard &s : shardRanges(b, 4)) {
    const Bucket &k = b.buckets[size_t(s.bucket)];
    EXPECT_EQ(s.gbufWorld.size(), (k.end - k.start) / 4);
    for (const ShardParam &p : s.params) {
      covered[p.name] += p.param.size();
      EXPECT_EQ(p.gbufWorld.start - s.gbufWorld.start, p.gbufLocal.start);
      EXPECT_EQ(p.gbufWorld.start - k.start, p.gbufWorldInBucket.start);
      EXPECT_EQ(find(b, p.name).start + p.param.start, p.gbufWorld.start);
    }
  }
  for (auto &[name, n] : std::map<std::string, int64_t>{{"a", 250}, {"b", 7}, {"c", 333}, {"d", 64}, {"e", 1}})
    EXPECT_EQ(covered[name], n) << name;
}

TEST(GradBuckets, BucketGroups) {
  LayoutOptions o;
  o.bucketSize = 100;
  auto bufs = layoutBuffers(params({{"p0", 60}, {"p1", 60}, {"p2", 60}, {"p3", 60}}), o);
  EXPECT_EQ(partitionBuckets(bufs, false).size(), 2u);
  auto single = partitionBuckets(bufs, true);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].buckets.size(), 2u);
}

} // namespace
