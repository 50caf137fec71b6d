//===- Layout.cpp - Saved buffers and their global layouts ----------------===//
//
// Where each saved buffer of a rank sits in its global tensor (see
// Layout.h): parameters from their shape, global_shape, shard_dim and
// shard_axis; Adam state and fp32 main params from the buffer they belong
// to ("of"); the distributed optimizer's bucket shards from their bucket
// view and the rank's dp group; and the bucket layouts (each parameter's
// element range in its bucket view) the manifest records.
//
//===----------------------------------------------------------------------===//

#include "Layout.h"

#include "Strings.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace tessera::rt::ckpt {

StatusOr<TensorLayout> paramLayout(const LoadedArtifact &artifact,
                                   const fb::Buffer &b, int rank) {
  TensorLayout l;
  l.local = toVector(b.shape());
  l.global = b.global_shape() && b.global_shape()->size()
                 ? toVector(b.global_shape())
                 : l.local;
  auto error = [&](auto &&...args) {
    return invalidArgument(artifact.name(), ": parameter '", nameOf(b),
                           "': ", args...);
  };
  if (l.global.size() != l.local.size())
    return error("shape and global_shape have different ranks");
  StatusOr<std::vector<ParameterSplit>> found =
      parameterSplits(*artifact.root(), b, rank);
  if (!found.ok())
    return error(found.status().message());
  std::vector<ParameterSplit> splits = std::move(*found);
  for (size_t d = 0; d < l.local.size(); ++d) {
    int64_t count = 1;
    for (const ParameterSplit &s : splits)
      if (s.dim == int(d))
        count = s.count;
    if (l.global[d] % count || l.local[d] != l.global[d] / count)
      return error("local shape ", shapeString(l.local), " is not a 1/",
                   count, " shard along dim ", d, " of global shape ",
                   shapeString(l.global));
  }
  // Splits over a single rank are none.
  splits.erase(std::remove_if(splits.begin(), splits.end(),
                              [](const ParameterSplit &s) {
                                return s.count == 1;
                              }),
               splits.end());
  if (!splits.empty()) {
    l.shardDim = splits[0].dim;
    l.axis = splits[0].axis;
    l.index = splits[0].index;
    l.count = splits[0].count;
  }
  if (splits.size() == 2) {
    l.shardDim2 = splits[1].dim;
    l.axis2 = splits[1].axis;
    l.index2 = splits[1].index;
    l.count2 = splits[1].count;
  }
  return l;
}

namespace {

/// Buffer `index` of `program`, or null when out of range (-1: none).
const fb::Buffer *bufferAt(const fb::Program &program, int index) {
  return index >= 0 && index < int(program.buffers()->size())
             ? program.buffers()->Get(flatbuffers::uoffset_t(index))
             : nullptr;
}

/// The group that splits bucket view `bucket` ("pbuf:B:k") of `program`:
/// the rank group of its shard view ("pshard:B:k"; "dp-cp" under context
/// parallelism, "edp" for the experts' buffers), "dp" where the artifact
/// does not say.
std::string bucketGroup(const fb::Program &program, const std::string &bucket) {
  const std::string shard =
      startsWith(bucket, "pbuf:") ? "pshard:" + bucket.substr(5) : "";
  if (!shard.empty() && program.buffers())
    for (const fb::Buffer *b : *program.buffers())
      if (nameOf(*b) == shard && b->rank_group() && b->rank_group()->size())
        return b->rank_group()->str();
  return "dp";
}

/// A flat shard of `viewNumel` elements (a bucket) of this rank's group
/// of the bucket: distributed-optimizer state, loadable only where it was
/// saved.
TensorLayout bucketShardLayout(const LoadedArtifact &artifact,
                               const fb::Program &program,
                               std::vector<int64_t> local, int64_t viewNumel,
                               std::string bucket, int rank) {
  TensorLayout l;
  l.local = l.global = std::move(local);
  l.reshardable = false;
  l.distOpt = true;
  l.param = std::move(bucket);
  if (l.local.size() == 1) {
    const std::string group = bucketGroup(program, l.param);
    GroupPosition pos = findGroupPosition(*artifact.root(), group, rank);
    if (viewNumel == l.local[0] * pos.size) {
      l.global = {viewNumel};
      l.shardDim = 0;
      l.axis = group;
      l.index = pos.index;
      l.count = pos.size;
    }
  }
  return l;
}

} // namespace

StatusOr<TensorLayout> layoutOf(const LoadedArtifact &artifact,
                                const fb::Program &program, const fb::Buffer &b,
                                int rank) {
  switch (b.kind()) {
  case fb::BufferKind::Param:
    return paramLayout(artifact, b, rank);
  case fb::BufferKind::MainParam: {
    std::vector<int64_t> local = toVector(b.shape());
    const fb::Buffer *of = bufferAt(program, b.of());
    if (of && of->kind() == fb::BufferKind::Param &&
        toVector(of->shape()) == local) {
      // Per-parameter main params take their parameter's layout (and
      // reshard with it), like per-parameter Adam state.
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               paramLayout(artifact, *of, rank));
      l.param = nameOf(*of);
      return l;
    }
    std::string name = nameOf(b);
    if (startsWith(name, kBucketMainPrefix) && local.size() == 1) {
      // This rank's 1/dp of a parameter bucket: the same layout as the
      // distributed optimizer's Adam state of the bucket. It is that by
      // construction, so the bucket's view need not exist.
      std::string bucket = name.substr(kMainPrefix.size());
      GroupPosition pos = findGroupPosition(
          *artifact.root(), bucketGroup(program, bucket), rank);
      return bucketShardLayout(artifact, program, local, local[0] * pos.size,
                               std::move(bucket), rank);
    }
    TensorLayout l;
    l.local = l.global = local;
    l.reshardable = false;
    l.param = of ? nameOf(*of) : "";
    return l;
  }
  case fb::BufferKind::OptState: {
    const fb::Buffer *of = bufferAt(program, b.of());
    std::vector<int64_t> local = toVector(b.shape());
    // State kept per main param: the main param's layout.
    if (of && of->kind() == fb::BufferKind::MainParam) {
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               layoutOf(artifact, program, *of, rank));
      if (l.local == local)
        return l;
    }
    if (of && of->kind() == fb::BufferKind::Param &&
        toVector(of->shape()) == local) {
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               paramLayout(artifact, *of, rank));
      l.param = nameOf(*of);
      return l;
    }
    // A flat shard of a bucket view (the distributed optimizer) or state of
    // an unknown layout: only loadable where it was saved.
    if (of && of->kind() == fb::BufferKind::View)
      return bucketShardLayout(artifact, program, local,
                               numElements(of->shape()), nameOf(*of), rank);
    TensorLayout l;
    l.local = l.global = local;
    l.reshardable = false;
    l.param = of ? nameOf(*of) : "";
    return l;
  }
  default: {
    TensorLayout l;
    l.local = l.global = toVector(b.shape());
    return l;
  }
  }
}

/// The bucket views the optimizer state of `program` shards, with the
/// parameters laid out in each.
std::vector<ManifestBucket> bucketLayouts(const fb::Program &program) {
  std::vector<ManifestBucket> out;
  std::set<int> views;
  const auto &buffers = *program.buffers();
  for (const fb::Buffer *b : buffers)
    if (b->kind() == fb::BufferKind::OptState && b->of() >= 0 &&
        b->of() < int(buffers.size()) &&
        buffers.Get(flatbuffers::uoffset_t(b->of()))->kind() ==
            fb::BufferKind::View)
      views.insert(b->of());
  // Main params of parameter buckets name their bucket's view.
  for (const fb::Buffer *b : buffers)
    if (b->kind() == fb::BufferKind::MainParam &&
        startsWith(nameOf(*b), kBucketMainPrefix))
      for (flatbuffers::uoffset_t v = 0; v < buffers.size(); ++v)
        if (buffers.Get(v)->kind() == fb::BufferKind::View &&
            nameOf(*buffers.Get(v)) == nameOf(*b).substr(kMainPrefix.size()))
          views.insert(int(v));
  for (int v : views) {
    const fb::Buffer &view = *buffers.Get(flatbuffers::uoffset_t(v));
    ManifestBucket bucket;
    bucket.stage = program.pp_rank();
    bucket.name = nameOf(view);
    bucket.numel = numElements(view.shape());
    int64_t es = dtypeSize(view.dtype());
    int64_t begin = view.offset(), end = begin + bucket.numel * es;
    for (const fb::Buffer *p : buffers) {
      // (ZeRO-3: the staged parameters of a staged view.)
      if (p->kind() != fb::BufferKind::Param || p->staged() != view.staged())
        continue;
      int64_t bytes = numElements(p->shape()) * dtypeSize(p->dtype());
      if (p->offset() >= begin && p->offset() + bytes <= end)
        bucket.params.emplace_back(nameOf(*p), (p->offset() - begin) / es,
                                   numElements(p->shape()));
    }
    std::sort(bucket.params.begin(), bucket.params.end(),
              [](const auto &a, const auto &b) {
                return std::get<1>(a) < std::get<1>(b);
              });
    out.push_back(std::move(bucket));
  }
  return out;
}

int ppStage(const fb::Artifact &a, int rank) {
  GroupPosition pp = findGroupPosition(a, "pp", rank);
  return pp.group ? pp.index : 0;
}

} // namespace tessera::rt::ckpt
