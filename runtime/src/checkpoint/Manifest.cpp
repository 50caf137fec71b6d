//===- Manifest.cpp - Checkpoint manifest.json ----------------------------===//
//
// The manifest of a checkpoint (tessera/rt/checkpoint/Manifest.h):
// describeCheckpoint reads an artifact's configuration (mesh, tp / pp / dp /
// cp / vpp, batch, optimizer, rank groups) and every rank's saved buffers
// with their layouts (Layout.h); manifestToJson writes it, one line per key
// and per buffer; parseManifest reads it back and checks its consistency.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/checkpoint/Manifest.h"

#include "Layout.h"
#include "Strings.h"
#include "tessera/rt/checkpoint/ShardFile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

namespace tessera::rt {

using ckpt::bucketLayouts;
using ckpt::isSavedKind;
using ckpt::layoutOf;
using ckpt::nameOf;
using ckpt::ppStage;
using ckpt::shapeString;
using ckpt::TensorLayout;

//===----------------------------------------------------------------------===//
// Describing an artifact's checkpoint
//===----------------------------------------------------------------------===//

static int meshSize(const fb::Artifact &a, std::string_view axis,
                    int fallback) {
  if (a.mesh())
    for (const fb::MeshAxis *m : *a.mesh())
      if (m->name() && m->name()->string_view() == axis)
        return m->size();
  return fallback;
}

std::string CheckpointManifest::configString() const {
  std::string s = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                  " dp=" + std::to_string(dp);
  if (cp > 1)
    s += " cp=" + std::to_string(cp);
  if (vpp > 1)
    s += " vpp=" + std::to_string(vpp);
  s += ", world " + std::to_string(worldSize);
  if (distributedOptimizer)
    s += ", distributed optimizer";
  return s;
}

StatusOr<CheckpointManifest> describeCheckpoint(const LoadedArtifact &artifact,
                                                const CheckpointRunInfo &info) {
  const fb::Artifact &a = *artifact.root();
  CheckpointManifest m;
  m.iteration = info.iteration;
  m.seed = info.seed;
  m.datasetPrefix = info.datasetPrefix;
  m.datasetTokens = info.datasetTokens;
  m.model = a.model() ? a.model()->str() : "";
  m.artifact = artifact.name();
  m.producer = a.producer() ? a.producer()->str() : "";
  m.compileFlags = a.compile_flags() ? a.compile_flags()->str() : "";
  m.worldSize = a.world_size();
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      m.mesh.emplace_back(axis->name() ? axis->name()->str() : "",
                          axis->size());
  m.order = a.order() ? a.order()->str() : "";
  m.tp = meshSize(a, "tp", findGroupPosition(a, "tp", 0).size);
  m.dp = meshSize(a, "dp", findGroupPosition(a, "dp", 0).size);
  m.pp = meshSize(a, "pp", findGroupPosition(a, "pp", 0).size);
  m.cp = meshSize(a, "cp", 1);
  m.vpp = a.programs() && a.programs()->size()
              ? std::max(1, a.programs()->Get(0)->num_chunks())
              : 1;
  if (const fb::Batch *b = a.batch()) {
    m.microBatch = b->micro_batch_size();
    m.globalBatch = b->global_batch_size();
    m.numMicrobatches = b->num_microbatches();
  }
  m.consumedSamples = m.iteration * m.globalBatch;
  if (const fb::Optimizer *o = a.optimizer()) {
    m.optimizer = o->kind() ? o->kind()->str() : "";
    m.lr = o->lr();
    m.beta1 = o->beta1();
    m.beta2 = o->beta2();
    m.eps = o->eps();
    m.weightDecay = o->weight_decay();
  }
  if (a.groups())
    for (const fb::RankGroup *g : *a.groups())
      m.groups[g->kind() ? g->kind()->str() : ""].push_back(
          g->ranks() ? std::vector<int>(g->ranks()->begin(), g->ranks()->end())
                     : std::vector<int>());

  std::map<std::string, size_t> byName;
  for (int r = 0; r < a.world_size(); ++r) {
    const fb::Program *p = artifact.programForWorldRank(r);
    if (!p)
      return invalidArgument(artifact.name(), ": no program for rank ", r);
    for (const fb::Buffer *b : *p->buffers()) {
      if (!isSavedKind(b->kind()))
        continue;
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l, layoutOf(artifact, *p, *b, r));
      std::string name = nameOf(*b);
      ManifestTensor *t = nullptr;
      if (l.reshardable) {
        auto it = byName.find(name);
        if (it != byName.end()) {
          t = &m.tensors[it->second];
          if (t->globalShape != l.global || t->dtype != b->dtype() ||
              t->kind != b->kind() || t->numShards != l.count ||
              t->shardDim != l.shardDim)
            return invalidArgument(
                artifact.name(), ": buffer '", name,
                "' has different layouts on different ranks (global shape ",
                shapeString(t->globalShape), " vs ", shapeString(l.global),
                ")");
        }
      }
      if (!t) {
        ManifestTensor nt;
        nt.name = name;
        nt.kind = b->kind();
        nt.dtype = b->dtype();
        nt.shape = l.local;
        nt.globalShape = l.global;
        nt.shardDim = l.shardDim;
        nt.shardAxis = l.shardDim >= 0 ? l.axis : "";
        nt.numShards = l.count;
        nt.param = l.param;
        nt.reshardable = l.reshardable;
        nt.distributedOptimizer = l.distOpt;
        nt.stage = l.reshardable ? -1 : ppStage(a, r);
        m.distributedOptimizer |= l.distOpt;
        if (l.reshardable)
          byName[name] = m.tensors.size();
        m.tensors.push_back(std::move(nt));
        t = &m.tensors.back();
      }
      t->holders.emplace_back(r, l.index);
    }
  }
  for (const fb::Program *p : *a.programs())
    for (ManifestBucket &bucket : bucketLayouts(*p))
      m.buckets.push_back(std::move(bucket));
  return m;
}

//===----------------------------------------------------------------------===//
// Manifest JSON
//===----------------------------------------------------------------------===//

/// The double nearest to the float `v` printed shortest (0.001, not
/// 0.0010000000474974513).
static double shortest(double v) {
  float f = float(v);
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, double(f));
    if (float(std::strtod(buf, nullptr)) == f)
      break;
  }
  return std::strtod(buf, nullptr);
}

std::string manifestToJson(const CheckpointManifest &m) {
  using json = nlohmann::ordered_json;
  json j;
  j["format"] = "tessera-checkpoint";
  j["format_version"] = m.formatVersion;
  j["iteration"] = m.iteration;
  j["model"] = m.model;
  j["artifact"] = m.artifact;
  j["producer"] = m.producer;
  j["compile_flags"] = m.compileFlags;
  j["world_size"] = m.worldSize;
  json mesh = json::array();
  for (const auto &[name, size] : m.mesh)
    mesh.push_back({{"name", name}, {"size", size}});
  j["mesh"] = mesh;
  j["order"] = m.order;
  j["parallel"] = {
      {"tp", m.tp},   {"pp", m.pp},
      {"dp", m.dp},   {"cp", m.cp},
      {"vpp", m.vpp}, {"distributed_optimizer", m.distributedOptimizer}};
  j["batch"] = {{"micro_batch_size", m.microBatch},
                {"global_batch_size", m.globalBatch},
                {"num_microbatches", m.numMicrobatches}};
  j["optimizer"] = {
      {"kind", m.optimizer},        {"lr", shortest(m.lr)},
      {"beta1", shortest(m.beta1)}, {"beta2", shortest(m.beta2)},
      {"eps", shortest(m.eps)},     {"weight_decay", shortest(m.weightDecay)}};
  j["data"] = {{"iteration", m.iteration},
               {"consumed_samples", m.consumedSamples},
               {"seed", m.seed},
               {"dataset", m.datasetPrefix},
               {"dataset_tokens", m.datasetTokens}};
  json groups = json::object();
  for (const auto &[kind, instances] : m.groups)
    groups[kind] = instances;
  j["groups"] = groups;
  json files = json::array();
  for (const ManifestShardFile &f : m.files)
    files.push_back({{"rank", f.rank},
                     {"file", f.file},
                     {"bytes", f.bytes},
                     {"crc32", f.crc}});
  j["shard_files"] = files;
  json buffers = json::array();
  for (const ManifestTensor &t : m.tensors) {
    json b;
    b["name"] = t.name;
    b["kind"] = fb::EnumNameBufferKind(t.kind);
    b["dtype"] = fb::EnumNameDType(t.dtype);
    b["shape"] = t.shape;
    b["global_shape"] = t.globalShape;
    b["shard_dim"] = t.shardDim;
    b["shard_axis"] = t.shardAxis;
    b["num_shards"] = t.numShards;
    if (!t.param.empty())
      b["param"] = t.param;
    b["reshardable"] = t.reshardable;
    if (t.distributedOptimizer)
      b["distributed_optimizer"] = true;
    if (t.stage >= 0)
      b["stage"] = t.stage;
    json holders = json::array();
    for (const auto &[rank, index] : t.holders)
      holders.push_back({rank, index});
    b["shards"] = holders;
    buffers.push_back(std::move(b));
  }
  j["buffers"] = buffers;
  json buckets = json::array();
  for (const ManifestBucket &bucket : m.buckets) {
    json params = json::array();
    for (const auto &[name, offset, numel] : bucket.params)
      params.push_back({name, offset, numel});
    buckets.push_back({{"stage", bucket.stage},
                       {"name", bucket.name},
                       {"numel", bucket.numel},
                       {"params", params}});
  }
  j["buckets"] = buckets;
  // One line per key, and per element of the long lists.
  std::string out = "{\n";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out += std::string(first ? "" : ",\n") + " " + json(it.key()).dump() + ": ";
    first = false;
    const json &v = it.value();
    if (v.is_array() && !v.empty() &&
        (it.key() == "shard_files" || it.key() == "buffers" ||
         it.key() == "buckets")) {
      out += "[\n";
      for (size_t i = 0; i < v.size(); ++i)
        out += "  " + v[i].dump() + (i + 1 < v.size() ? ",\n" : "\n");
      out += " ]";
    } else {
      out += v.dump();
    }
  }
  return out + "\n}\n";
}

namespace {

template <typename Enum>
bool enumFromName(const std::string &name, const Enum *values,
                  const char *const *names, size_t count, Enum &out) {
  for (size_t i = 0; i < count; ++i)
    if (name == names[i]) {
      out = values[i];
      return true;
    }
  return false;
}

struct ManifestError {
  std::string message;
};

} // namespace

StatusOr<CheckpointManifest> parseManifest(const std::string &text,
                                           const std::string &fileName) {
  using json = nlohmann::json;
  CheckpointManifest m;
  try {
    json j = json::parse(text);
    auto fail = [](auto &&...args) {
      throw ManifestError{detail::concat(args...)};
    };
    if (!j.is_object() || j.value("format", "") != "tessera-checkpoint")
      fail("not a Tessera checkpoint manifest (no \"format\": "
           "\"tessera-checkpoint\")");
    m.formatVersion = j.at("format_version").get<int>();
    if (m.formatVersion != ckpt::kManifestFormatVersion)
      fail("unsupported manifest format version ", m.formatVersion,
           " (this runtime supports version ", ckpt::kManifestFormatVersion,
           ")");
    m.iteration = j.at("iteration").get<int64_t>();
    m.model = j.at("model").get<std::string>();
    m.artifact = j.value("artifact", "");
    m.producer = j.value("producer", "");
    m.compileFlags = j.value("compile_flags", "");
    m.worldSize = j.at("world_size").get<int>();
    for (const json &axis : j.at("mesh"))
      m.mesh.emplace_back(axis.at("name").get<std::string>(),
                          axis.at("size").get<int>());
    m.order = j.value("order", "");
    const json &par = j.at("parallel");
    m.tp = par.at("tp").get<int>();
    m.pp = par.at("pp").get<int>();
    m.dp = par.at("dp").get<int>();
    m.cp = par.value("cp", 1);
    m.vpp = par.value("vpp", 1);
    m.distributedOptimizer = par.value("distributed_optimizer", false);
    const json &batch = j.at("batch");
    m.microBatch = batch.at("micro_batch_size").get<int64_t>();
    m.globalBatch = batch.at("global_batch_size").get<int64_t>();
    m.numMicrobatches = batch.at("num_microbatches").get<int64_t>();
    const json &opt = j.at("optimizer");
    m.optimizer = opt.at("kind").get<std::string>();
    m.lr = opt.value("lr", 0.0);
    m.beta1 = opt.value("beta1", 0.0);
    m.beta2 = opt.value("beta2", 0.0);
    m.eps = opt.value("eps", 0.0);
    m.weightDecay = opt.value("weight_decay", 0.0);
    const json &data = j.at("data");
    m.consumedSamples = data.at("consumed_samples").get<int64_t>();
    m.seed = data.at("seed").get<uint64_t>();
    m.datasetPrefix = data.value("dataset", "");
    m.datasetTokens = data.value("dataset_tokens", int64_t(-1));
    if (j.contains("groups"))
      for (const auto &[kind, instances] : j.at("groups").items())
        m.groups[kind] = instances.get<std::vector<std::vector<int>>>();
    if (m.worldSize < 1)
      fail("world_size ", m.worldSize, " < 1");
    for (const json &f : j.at("shard_files")) {
      ManifestShardFile sf;
      sf.rank = f.at("rank").get<int>();
      sf.file = f.at("file").get<std::string>();
      sf.bytes = f.at("bytes").get<uint64_t>();
      sf.crc = f.at("crc32").get<uint32_t>();
      if (sf.rank != int(m.files.size()) || sf.file != shardFileName(sf.rank))
        fail("shard_files entry ", m.files.size(), " is rank ", sf.rank,
             " file '", sf.file, "' (expected rank ", m.files.size(), " file '",
             shardFileName(int(m.files.size())), "')");
      m.files.push_back(sf);
    }
    if (int(m.files.size()) != m.worldSize)
      fail("lists ", m.files.size(), " shard files for world size ",
           m.worldSize);
    for (const json &b : j.at("buffers")) {
      ManifestTensor t;
      t.name = b.at("name").get<std::string>();
      std::string kind = b.at("kind").get<std::string>();
      std::string dtype = b.at("dtype").get<std::string>();
      if (!enumFromName(kind, fb::EnumValuesBufferKind(),
                        fb::EnumNamesBufferKind(),
                        size_t(fb::BufferKind::MAX) + 1, t.kind))
        fail("buffer '", t.name, "' has unknown kind '", kind, "'");
      if (!enumFromName(dtype, fb::EnumValuesDType(), fb::EnumNamesDType(),
                        size_t(fb::DType::MAX) + 1, t.dtype))
        fail("buffer '", t.name, "' has unknown dtype '", dtype, "'");
      t.shape = b.at("shape").get<std::vector<int64_t>>();
      t.globalShape = b.at("global_shape").get<std::vector<int64_t>>();
      t.shardDim = b.at("shard_dim").get<int>();
      t.shardAxis = b.value("shard_axis", "");
      t.numShards = b.at("num_shards").get<int>();
      t.param = b.value("param", "");
      t.reshardable = b.value("reshardable", true);
      t.distributedOptimizer = b.value("distributed_optimizer", false);
      t.stage = b.value("stage", -1);
      for (const json &h : b.at("shards"))
        t.holders.emplace_back(h.at(0).get<int>(), h.at(1).get<int>());
      if (t.numShards < 1 || t.shardDim >= int(t.globalShape.size()) ||
          t.shape.size() != t.globalShape.size() ||
          (t.numShards > 1 && t.shardDim < 0))
        fail("buffer '", t.name, "' has an inconsistent layout");
      for (int64_t d : t.globalShape)
        if (d < 0)
          fail("buffer '", t.name, "' has a negative dimension");
      if (t.numShards > 1 && t.globalShape[size_t(t.shardDim)] % t.numShards)
        fail("buffer '", t.name, "': dimension ", t.shardDim, " of ",
             shapeString(t.globalShape), " is not divisible by ", t.numShards,
             " shards");
      for (const auto &[rank, index] : t.holders)
        if (rank < 0 || rank >= m.worldSize || index < 0 ||
            index >= t.numShards)
          fail("buffer '", t.name, "' lists shard ", index, " on rank ", rank);
      m.tensors.push_back(std::move(t));
    }
    if (j.contains("buckets"))
      for (const json &b : j.at("buckets")) {
        ManifestBucket bucket;
        bucket.stage = b.at("stage").get<int>();
        bucket.name = b.at("name").get<std::string>();
        bucket.numel = b.at("numel").get<int64_t>();
        for (const json &p : b.at("params"))
          bucket.params.emplace_back(p.at(0).get<std::string>(),
                                     p.at(1).get<int64_t>(),
                                     p.at(2).get<int64_t>());
        m.buckets.push_back(std::move(bucket));
      }
  } catch (const ManifestError &e) {
    return dataLoss(fileName, ": invalid manifest: ", e.message);
  } catch (const std::exception &e) {
    return dataLoss(fileName, ": invalid manifest: ", e.what());
  }
  return m;
}

} // namespace tessera::rt
