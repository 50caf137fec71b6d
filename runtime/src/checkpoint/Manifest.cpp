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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <type_traits>
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
  for (const auto &[axis, size] : mesh)
    if (axis == "ep" && size > 1)
      s += " ep=" + std::to_string(size);
  if (vpp > 1)
    s += " vpp=" + std::to_string(vpp);
  s += ", world " + std::to_string(worldSize);
  if (distributedOptimizer)
    s += ", distributed optimizer";
  return s;
}

/// A manifest is JSON, whose strings must be UTF-8 (nlohmann's dump throws
/// on anything else): an error naming the first string that is not (the
/// artifact's names are not checked by the loader; the dataset prefix is a
/// path).
static Status checkUtf8(const std::string &fileName,
                        const CheckpointManifest &m) {
  auto check = [&](const char *what, const std::string &s) -> Status {
    try {
      (void)nlohmann::json(s).dump();
    } catch (const nlohmann::json::exception &) {
      return invalidArgument(fileName, ": ", what, " ",
                             nlohmann::json(s).dump(
                                 -1, ' ', true,
                                 nlohmann::json::error_handler_t::replace),
                             " is not valid UTF-8, which a checkpoint "
                             "manifest (JSON) cannot hold");
    }
    return Status();
  };
  TESSERA_RETURN_IF_ERROR(check("model name", m.model));
  TESSERA_RETURN_IF_ERROR(check("artifact file name", m.artifact));
  TESSERA_RETURN_IF_ERROR(check("producer", m.producer));
  TESSERA_RETURN_IF_ERROR(check("compile flags", m.compileFlags));
  TESSERA_RETURN_IF_ERROR(check("rank order", m.order));
  TESSERA_RETURN_IF_ERROR(check("optimizer", m.optimizer));
  TESSERA_RETURN_IF_ERROR(check("dataset prefix", m.datasetPrefix));
  for (const auto &axis : m.mesh)
    TESSERA_RETURN_IF_ERROR(check("mesh axis", axis.first));
  for (const auto &group : m.groups)
    TESSERA_RETURN_IF_ERROR(check("rank group kind", group.first));
  for (const ManifestTensor &t : m.tensors) {
    TESSERA_RETURN_IF_ERROR(check("buffer name", t.name));
    TESSERA_RETURN_IF_ERROR(check("shard axis", t.shardAxis));
    TESSERA_RETURN_IF_ERROR(check("parameter name", t.param));
  }
  for (const ManifestBucket &b : m.buckets) {
    TESSERA_RETURN_IF_ERROR(check("bucket name", b.name));
    for (const auto &param : b.params)
      TESSERA_RETURN_IF_ERROR(check("bucket parameter", std::get<0>(param)));
  }
  return Status();
}

StatusOr<CheckpointManifest> describeCheckpoint(const LoadedArtifact &artifact,
                                                const CheckpointRunInfo &info) {
  const fb::Artifact &a = *artifact.root();
  CheckpointManifest m;
  m.iteration = info.iteration;
  m.seed = info.seed;
  m.gradScaler = info.gradScaler;
  m.skippedIterations = info.skippedIterations;
  m.datasetPrefix = info.datasetPrefix;
  m.datasetTokens = info.datasetTokens;
  m.model = a.model() ? a.model()->str() : "";
  m.artifact = artifact.name();
  m.producer = a.producer() ? a.producer()->str() : "";
  m.compileFlags = a.compile_flags() ? a.compile_flags()->str() : "";
  m.architecture = a.architecture() ? a.architecture()->str() : "";
  m.onnxSource = a.onnx_source() ? a.onnx_source()->str() : "";
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
              t->kind != b->kind() || t->numShards != l.numShards() ||
              t->shardDim != l.shardDim || t->shard2Dim != l.shardDim2)
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
        nt.numShards = l.numShards();
        nt.shard2Dim = l.shardDim2;
        nt.shard2Axis = l.shardDim2 >= 0 ? l.axis2 : "";
        nt.numShards2 = l.count2;
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
      t->holders.emplace_back(r, l.flatIndex());
    }
  }
  for (const fb::Program *p : *a.programs())
    for (ManifestBucket &bucket : bucketLayouts(*p))
      m.buckets.push_back(std::move(bucket));
  TESSERA_RETURN_IF_ERROR(checkUtf8(artifact.name(), m));
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
  // The artifact's architecture record (JSON), when it has one.
  if (!m.architecture.empty())
    j["architecture"] = json::parse(m.architecture, nullptr, false);
  // An imported ONNX model's record of its parameters' initializers.
  if (!m.onnxSource.empty())
    j["onnx_source"] = json::parse(m.onnxSource, nullptr, false);
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
  // Megatron's DynamicGradScaler state_dict; the scale as a JSON double
  // (exact), so that a resumed fp16 run scales as the uninterrupted one.
  if (m.gradScaler)
    j["grad_scaler"] = {{"scale", m.gradScaler->scale},
                        {"growth_tracker", m.gradScaler->growthTracker},
                        {"hysteresis_tracker", m.gradScaler->hysteresisTracker},
                        {"skipped_iterations", m.skippedIterations}};
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
    if (t.shard2Dim >= 0) {
      b["shard2_dim"] = t.shard2Dim;
      b["shard2_axis"] = t.shard2Axis;
      b["num_shards2"] = t.numShards2;
    }
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

using json = nlohmann::json;

/// The integer `v` as a T. nlohmann's get<int>() converts a float (1e300:
/// undefined behaviour) and wraps an integer out of range; a manifest field
/// that is not an integer in T's range is an error naming the field.
template <typename T> T integer(const json &v, const std::string &what) {
  using L = std::numeric_limits<T>;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(L::max()))
      return T(u);
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (std::is_signed_v<T> ? i >= int64_t(L::min()) && i <= int64_t(L::max())
                            : i >= 0 && uint64_t(i) <= uint64_t(L::max()))
      return T(i);
  }
  throw ManifestError{detail::concat(what, " is ", v.dump(),
                                     ", not an integer in [", +L::min(), ", ",
                                     +L::max(), "]")};
}

/// `object[key]` as a T, or `fallback` when the key is absent.
template <typename T>
T integerOr(const json &object, const char *key, T fallback,
            const std::string &what) {
  return object.contains(key) ? integer<T>(object.at(key), what) : fallback;
}

/// `object[key]` (0 when absent): an optimizer hyper-parameter, a float in
/// the artifact, so a finite number in float's range (manifestToJson writes
/// it as the nearest float; 1e80 would become inf, which JSON cannot hold).
double hyperParameter(const json &object, const char *key) {
  if (!object.contains(key))
    return 0.0;
  const json &v = object.at(key);
  double d = v.is_number() ? v.get<double>() : 0.0;
  if (!v.is_number() || !std::isfinite(d) ||
      std::fabs(d) > double(std::numeric_limits<float>::max()))
    throw ManifestError{detail::concat("optimizer.", key, " is ", v.dump(),
                                       ", not a finite float")};
  return d;
}

/// The array `v` of integers.
template <typename T>
std::vector<T> integers(const json &v, const std::string &what) {
  if (!v.is_array())
    throw ManifestError{what + " is " + v.dump() + ", not an array"};
  std::vector<T> out;
  for (const json &e : v)
    out.push_back(integer<T>(e, what + " element"));
  return out;
}

} // namespace

StatusOr<CheckpointManifest> parseManifest(const std::string &text,
                                           const std::string &fileName) {
  CheckpointManifest m;
  try {
    json j = json::parse(text);
    auto fail = [](auto &&...args) {
      throw ManifestError{detail::concat(args...)};
    };
    if (!j.is_object() || j.value("format", "") != "tessera-checkpoint")
      fail("not a Tessera checkpoint manifest (no \"format\": "
           "\"tessera-checkpoint\")");
    m.formatVersion = integer<int>(j.at("format_version"), "format_version");
    if (m.formatVersion != ckpt::kManifestFormatVersion)
      fail("unsupported manifest format version ", m.formatVersion,
           " (this runtime supports version ", ckpt::kManifestFormatVersion,
           ")");
    m.iteration = integer<int64_t>(j.at("iteration"), "iteration");
    m.model = j.at("model").get<std::string>();
    m.artifact = j.value("artifact", "");
    m.producer = j.value("producer", "");
    m.compileFlags = j.value("compile_flags", "");
    if (j.contains("architecture")) {
      if (!j.at("architecture").is_object())
        fail("\"architecture\" must be an object");
      m.architecture = j.at("architecture").dump();
    }
    if (j.contains("onnx_source")) {
      if (!j.at("onnx_source").is_object())
        fail("\"onnx_source\" must be an object");
      m.onnxSource = j.at("onnx_source").dump();
    }
    m.worldSize = integer<int>(j.at("world_size"), "world_size");
    for (const json &axis : j.at("mesh"))
      m.mesh.emplace_back(axis.at("name").get<std::string>(),
                          integer<int>(axis.at("size"), "mesh axis size"));
    m.order = j.value("order", "");
    const json &par = j.at("parallel");
    m.tp = integer<int>(par.at("tp"), "parallel.tp");
    m.pp = integer<int>(par.at("pp"), "parallel.pp");
    m.dp = integer<int>(par.at("dp"), "parallel.dp");
    m.cp = integerOr<int>(par, "cp", 1, "parallel.cp");
    m.vpp = integerOr<int>(par, "vpp", 1, "parallel.vpp");
    m.distributedOptimizer = par.value("distributed_optimizer", false);
    const json &batch = j.at("batch");
    m.microBatch = integer<int64_t>(batch.at("micro_batch_size"),
                                    "batch.micro_batch_size");
    m.globalBatch = integer<int64_t>(batch.at("global_batch_size"),
                                     "batch.global_batch_size");
    m.numMicrobatches = integer<int64_t>(batch.at("num_microbatches"),
                                         "batch.num_microbatches");
    const json &opt = j.at("optimizer");
    m.optimizer = opt.at("kind").get<std::string>();
    m.lr = hyperParameter(opt, "lr");
    m.beta1 = hyperParameter(opt, "beta1");
    m.beta2 = hyperParameter(opt, "beta2");
    m.eps = hyperParameter(opt, "eps");
    m.weightDecay = hyperParameter(opt, "weight_decay");
    if (j.contains("grad_scaler")) {
      const json &gs = j.at("grad_scaler");
      if (!gs.is_object() || !gs.contains("scale") ||
          !gs.at("scale").is_number() || !(gs.at("scale").get<double>() > 0))
        fail("\"grad_scaler\" must be an object with a positive \"scale\"");
      GradScalerState s;
      s.scale = gs.at("scale").get<double>();
      s.growthTracker = integer<int64_t>(gs.at("growth_tracker"),
                                         "grad_scaler.growth_tracker");
      s.hysteresisTracker = integer<int64_t>(gs.at("hysteresis_tracker"),
                                             "grad_scaler.hysteresis_tracker");
      m.skippedIterations = integer<int64_t>(gs.at("skipped_iterations"),
                                             "grad_scaler.skipped_iterations");
      if (m.skippedIterations < 0 || m.skippedIterations > m.iteration)
        fail("grad_scaler.skipped_iterations ", m.skippedIterations,
             " is not within [0, iteration ", m.iteration, "]");
      m.gradScaler = s;
    }
    const json &data = j.at("data");
    m.consumedSamples =
        integer<int64_t>(data.at("consumed_samples"), "data.consumed_samples");
    m.seed = integer<uint64_t>(data.at("seed"), "data.seed");
    m.datasetPrefix = data.value("dataset", "");
    m.datasetTokens = integerOr<int64_t>(data, "dataset_tokens", -1,
                                         "data.dataset_tokens");
    if (j.contains("groups"))
      for (const auto &[kind, instances] : j.at("groups").items()) {
        if (!instances.is_array())
          fail("groups.", kind, " is not an array of rank lists");
        for (const json &instance : instances)
          m.groups[kind].push_back(integers<int>(instance, "groups." + kind));
      }
    if (m.worldSize < 1)
      fail("world_size ", m.worldSize, " < 1");
    for (const json &f : j.at("shard_files")) {
      ManifestShardFile sf;
      sf.rank = integer<int>(f.at("rank"), "shard_files rank");
      sf.file = f.at("file").get<std::string>();
      sf.bytes = integer<uint64_t>(f.at("bytes"), "shard_files bytes");
      sf.crc = integer<uint32_t>(f.at("crc32"), "shard_files crc32");
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
      const std::string what = "buffer '" + t.name + "'";
      t.shape = integers<int64_t>(b.at("shape"), what + " shape");
      t.globalShape =
          integers<int64_t>(b.at("global_shape"), what + " global_shape");
      t.shardDim = integer<int>(b.at("shard_dim"), what + " shard_dim");
      t.shardAxis = b.value("shard_axis", "");
      t.numShards = integer<int>(b.at("num_shards"), what + " num_shards");
      t.shard2Dim = integerOr<int>(b, "shard2_dim", -1, what + " shard2_dim");
      t.shard2Axis = b.value("shard2_axis", "");
      t.numShards2 = integerOr<int>(b, "num_shards2", 1, what + " num_shards2");
      t.param = b.value("param", "");
      t.reshardable = b.value("reshardable", true);
      t.distributedOptimizer = b.value("distributed_optimizer", false);
      t.stage = integerOr<int>(b, "stage", -1, what + " stage");
      for (const json &h : b.at("shards"))
        t.holders.emplace_back(integer<int>(h.at(0), what + " shard rank"),
                               integer<int>(h.at(1), what + " shard index"));
      if (t.numShards < 1 || t.shardDim >= int(t.globalShape.size()) ||
          t.shape.size() != t.globalShape.size() ||
          (t.numShards > 1 && t.shardDim < 0) || t.numShards2 < 1 ||
          t.numShards % t.numShards2 ||
          t.shard2Dim >= int(t.globalShape.size()) ||
          (t.numShards2 > 1 &&
           (t.shard2Dim < 0 || t.shardDim < 0 || t.shard2Dim == t.shardDim)))
        fail("buffer '", t.name, "' has an inconsistent layout");
      for (int64_t d : t.globalShape)
        if (d < 0)
          fail("buffer '", t.name, "' has a negative dimension");
      const int count1 = t.numShards / t.numShards2;
      if (count1 > 1 && t.globalShape[size_t(t.shardDim)] % count1)
        fail("buffer '", t.name, "': dimension ", t.shardDim, " of ",
             shapeString(t.globalShape), " is not divisible by ", count1,
             " shards");
      if (t.numShards2 > 1 &&
          t.globalShape[size_t(t.shard2Dim)] % t.numShards2)
        fail("buffer '", t.name, "': dimension ", t.shard2Dim, " of ",
             shapeString(t.globalShape), " is not divisible by ",
             t.numShards2, " shards");
      for (const auto &[rank, index] : t.holders)
        if (rank < 0 || rank >= m.worldSize || index < 0 ||
            index >= t.numShards)
          fail("buffer '", t.name, "' lists shard ", index, " on rank ", rank);
      m.tensors.push_back(std::move(t));
    }
    if (j.contains("buckets"))
      for (const json &b : j.at("buckets")) {
        ManifestBucket bucket;
        bucket.stage = integer<int>(b.at("stage"), "bucket stage");
        bucket.name = b.at("name").get<std::string>();
        bucket.numel = integer<int64_t>(b.at("numel"), "bucket numel");
        for (const json &p : b.at("params"))
          bucket.params.emplace_back(
              p.at(0).get<std::string>(),
              integer<int64_t>(p.at(1), "bucket '" + bucket.name + "' offset"),
              integer<int64_t>(p.at(2), "bucket '" + bucket.name + "' numel"));
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
