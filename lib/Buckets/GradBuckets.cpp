//===- GradBuckets.cpp - Megatron's param-and-grad buffers and buckets ----===//

#include "tessera/Buckets/GradBuckets.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace tessera::buckets;

int64_t tessera::buckets::defaultBucketSize(int64_t dp) {
  return std::max<int64_t>(40000000, 1000000 * dp);
}

static int64_t padTo(int64_t v, int64_t divisor) {
  return (v + divisor - 1) / divisor * divisor;
}

static int64_t bucketDivisor(const LayoutOptions &o) {
  int64_t d = std::lcm<int64_t>(o.dp, 128);
  if (o.padForHighNcclBusbw)
    d = std::lcm<int64_t>(d, int64_t(1) << 16);
  return d;
}

/// One buffer's layout (the param_index_map / bucket_indices loop of
/// Megatron's _ParamAndGradBuffer.__init__).
static Buffer layoutOne(const std::vector<const ParamInfo *> &params,
                        const LayoutOptions &o) {
  Buffer buf;
  buf.paramDtype = params.front()->paramDtype;
  buf.gradDtype = params.front()->gradDtype;
  const bool distOpt = o.distributedOptimizer;
  int64_t bucketSize = o.bucketSize > 0 ? o.bucketSize : defaultBucketSize(o.dp);
  const bool bucketed = o.firstPipelineStage;
  auto padStart = [&](int64_t i) { return distOpt ? padTo(i, 64) : i; };
  auto padEnd = [&](int64_t i) { return distOpt ? padTo(i, bucketDivisor(o)) : i; };
  auto requiresNewBucket = [&](const ParamInfo *p) {
    return p->sharedEmbedding && distOpt;
  };

  std::map<std::string, ParamRange> index;
  std::vector<Bucket> buckets;
  int64_t paramStart = 0, paramEnd = 0, bucketStart = 0;
  std::vector<std::string> bucketParams;
  auto closeBucket = [&](int64_t end) {
    Bucket b;
    b.start = bucketStart;
    b.numelUnpadded = end - bucketStart;
    b.end = padEnd(end);
    b.params = bucketParams;
    buckets.push_back(b);
    bucketStart = b.end;
    bucketParams.clear();
    return b.end;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const ParamInfo *p = *it;
    paramStart = padStart(paramStart);
    if (requiresNewBucket(p)) {
      if (distOpt && paramStart % o.dp != 0)
        paramStart = padEnd(paramStart);
      if (!bucketParams.empty())
        paramStart = closeBucket(paramStart);
    }
    paramEnd = paramStart + p->numel;
    index[p->name] = ParamRange{p->name, paramStart, paramEnd,
                                int64_t(buckets.size())};
    bucketParams.push_back(p->name);
    if ((bucketed && paramEnd - bucketStart >= bucketSize) ||
        requiresNewBucket(p))
      paramStart = closeBucket(paramEnd);
    else
      paramStart = paramEnd;
  }
  if (!bucketParams.empty())
    closeBucket(paramEnd);
  buf.buckets = buckets;
  buf.numel = buckets.empty() ? 0 : buckets.back().end;
  for (const Bucket &b : buckets)
    buf.numelUnpadded += b.numelUnpadded;
  for (const ParamInfo *p : params)
    buf.params.push_back(index[p->name]);
  return buf;
}

std::vector<Buffer>
tessera::buckets::layoutBuffers(const std::vector<ParamInfo> &params,
                                const LayoutOptions &options) {
  std::vector<std::pair<std::string, std::string>> keys;
  std::map<std::pair<std::string, std::string>, std::vector<const ParamInfo *>> groups;
  for (const ParamInfo &p : params) {
    auto key = std::make_pair(p.paramDtype, p.gradDtype);
    if (!groups.count(key))
      keys.push_back(key);
    groups[key].push_back(&p);
  }
  std::vector<Buffer> out;
  for (auto &key : keys)
    out.push_back(layoutOne(groups[key], options));
  return out;
}

std::string tessera::buckets::validate(const Buffer &b, const LayoutOptions &o) {
  auto s = [](int64_t v) { return std::to_string(v); };
  int64_t expect = 0, unpadded = 0;
  for (size_t i = 0; i < b.buckets.size(); ++i) {
    const Bucket &k = b.buckets[i];
    if (k.start != expect)
      return "bucket " + s(i) + " starts at " + s(k.start) + ", not at " +
             s(expect) + " where the previous one ends";
    if (k.end < k.start || k.numelUnpadded > k.end - k.start)
      return "bucket " + s(i) + " [" + s(k.start) + ", " + s(k.end) +
             ") is smaller than its " + s(k.numelUnpadded) + " unpadded elements";
    if (o.distributedOptimizer && (k.end - k.start) % o.dp != 0)
      return "bucket " + s(i) + " holds " + s(k.end - k.start) +
             " elements, not divisible by dp " + s(o.dp);
    if (o.distributedOptimizer && k.end % bucketDivisor(o) != 0 &&
        i + 1 < b.buckets.size())
      return "bucket " + s(i) + " ends at " + s(k.end) +
             ", not padded to a multiple of " + s(bucketDivisor(o));
    expect = k.end;
    unpadded += k.numelUnpadded;
  }
  if (b.numel != expect)
    return "the buffer holds " + s(b.numel) + " elements, its buckets " + s(expect);
  if (b.numelUnpadded != unpadded)
    return "the buffer counts " + s(b.numelUnpadded) +
           " unpadded elements, its buckets " + s(unpadded);
  if (o.distributedOptimizer && b.numel % o.dp != 0)
    return "the buffer holds " + s(b.numel) + " elements, not divisible by dp " +
           s(o.dp);
  if (!o.distributedOptimizer && b.numel != b.numelUnpadded)
    return "the buffer is padded (" + s(b.numel) + " elements, " +
           s(b.numelUnpadded) + " used) without the distributed optimizer";
  // Listed in the model's order, which the buffer holds in reverse: the
  // offsets decrease along the list (pack and unpack find a bucket's
  // parameters by binary search on it).
  for (size_t i = 0; i + 1 < b.params.size(); ++i)
    if (b.params[i + 1].start >= b.params[i].start)
      return "parameter '" + b.params[i + 1].name + "' starts at " +
             s(b.params[i + 1].start) + ", not below '" + b.params[i].name +
             "' at " + s(b.params[i].start) +
             " (parameters are listed in the model's order, at decreasing "
             "offsets)";
  std::vector<ParamRange> sorted = b.params;
  std::sort(sorted.begin(), sorted.end(),
            [](const ParamRange &a, const ParamRange &c) { return a.start < c.start; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const ParamRange &p = sorted[i];
    if (p.bucket < 0 || p.bucket >= int64_t(b.buckets.size()))
      return "parameter '" + p.name + "' names bucket " + s(p.bucket) +
             " of " + s(int64_t(b.buckets.size()));
    const Bucket &k = b.buckets[size_t(p.bucket)];
    if (p.start < k.start || p.end > k.end || p.end < p.start)
      return "parameter '" + p.name + "' [" + s(p.start) + ", " + s(p.end) +
             ") is split across buckets or outside bucket " + s(p.bucket) +
             " [" + s(k.start) + ", " + s(k.end) + ")";
    if (o.distributedOptimizer && p.start % 64 != 0)
      return "parameter '" + p.name + "' starts at " + s(p.start) +
             ", not at a multiple of 64 elements";
    if (i + 1 < sorted.size() && sorted[i + 1].start < p.end)
      return "parameters '" + p.name + "' and '" + sorted[i + 1].name +
             "' overlap";
  }
  return "";
}

std::vector<ShardParam>
tessera::buckets::paramRangesInShard(const std::vector<ParamRange> &params,
                                     Range shard, int64_t bucketOffset) {
  std::vector<ShardParam> out;
  for (const ParamRange &p : params) {
    int64_t localStart = std::max<int64_t>(0, p.start - shard.start);
    int64_t localEnd = std::min<int64_t>(shard.size(), p.end - shard.start);
    if (localEnd <= localStart)
      continue;
    ShardParam sp;
    sp.name = p.name;
    sp.gbufLocal = {localStart, localEnd};
    sp.gbufWorld = {localStart + shard.start, localEnd + shard.start};
    sp.gbufWorldInBucket = {sp.gbufWorld.start - bucketOffset,
                            sp.gbufWorld.end - bucketOffset};
    int64_t subStart = std::max<int64_t>(0, shard.start - p.start);
    sp.param = {subStart, subStart + (localEnd - localStart)};
    out.push_back(sp);
  }
  return out;
}

std::vector<Shard> tessera::buckets::shardRanges(const Buffer &buffer, int64_t dp) {
  std::vector<Shard> out;
  for (size_t k = 0; k < buffer.buckets.size(); ++k) {
    const Bucket &bucket = buffer.buckets[k];
    int64_t size = bucket.end - bucket.start;
    int64_t per = size / dp;
    std::vector<ParamRange> inBucket;
    for (const ParamRange &p : buffer.params)
      if (p.bucket == int64_t(k))
        inBucket.push_back(p);
    // Buffer order (ascending start) within the bucket.
    std::sort(inBucket.begin(), inBucket.end(),
              [](const ParamRange &a, const ParamRange &b) { return a.start < b.start; });
    for (int64_t r = 0; r < dp; ++r) {
      Shard s;
      s.dpRank = r;
      s.bucket = int64_t(k);
      int64_t start = r * per;
      int64_t end = std::min(size, start + per);
      s.gbufWorld = {start + bucket.start, end + bucket.start};
      s.params = paramRangesInShard(inBucket, s.gbufWorld, bucket.start);
      out.push_back(s);
    }
  }
  return out;
}

std::vector<BucketGroup>
tessera::buckets::partitionBuckets(const std::vector<Buffer> &buffers,
                                   bool singleBucketGroup) {
  std::vector<BucketGroup> groups;
  if (singleBucketGroup) {
    BucketGroup all;
    for (size_t b = 0; b < buffers.size(); ++b)
      for (size_t k = 0; k < buffers[b].buckets.size(); ++k)
        all.buckets.push_back({int64_t(b), int64_t(k)});
    if (!all.buckets.empty())
      groups.push_back(all);
    return groups;
  }
  for (size_t b = 0; b < buffers.size(); ++b)
    for (size_t k = 0; k < buffers[b].buckets.size(); ++k)
      groups.push_back(BucketGroup{{{int64_t(b), int64_t(k)}}});
  return groups;
}
