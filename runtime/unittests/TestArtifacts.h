//===- TestArtifacts.h - Building artifacts in tests ------------*- C++ -*-===//
//
// A small description layer over the FlatBuffers builder so that tests can
// write .tsr artifacts without the compiler.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_UNITTESTS_TESTARTIFACTS_H
#define TESSERA_RT_UNITTESTS_TESTARTIFACTS_H

#include "tessera/artifact/artifact_generated.h"
#include "tessera/rt/ArtifactFormat.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tessera::rt::test {

namespace fb = ::tessera::artifact;

struct RefDesc {
  int64_t offset = 0;
  std::vector<int64_t> shape;
  fb::DType dtype = fb::DType::F32;
  /// Rank-relative view: at offset + i * rankStride, i the rank's index in
  /// its instance of rankGroup (empty: a plain ref).
  std::string rankGroup;
  int64_t rankStride = 0;
};

/// Rank `i`'s block of `full` (|group| blocks of `shape`) as a rank-relative
/// ref over `group`: the distributed optimizer's shard of a bucket.
inline RefDesc rankBlock(const RefDesc &full, std::vector<int64_t> shape,
                         const std::string &group) {
  int64_t elems = 1;
  for (int64_t d : shape)
    elems *= d;
  int64_t es = full.dtype == fb::DType::I64    ? 8
               : full.dtype == fb::DType::BF16 ? 2
                                                : 4;
  RefDesc r{full.offset, std::move(shape), full.dtype};
  r.rankGroup = group;
  r.rankStride = elems * es;
  return r;
}

struct BufferDesc {
  std::string name;
  fb::BufferKind kind = fb::BufferKind::Param;
  fb::DType dtype = fb::DType::F32;
  int64_t offset = 0;
  std::vector<int64_t> shape, globalShape;
  int shardDim = -1;
  std::string shardAxis;
  fb::InitKind init = fb::InitKind::Zeros;
  float initScale = 0.0f;
  int of = -1;
  /// ZeRO-3: the group a ParamShard is split over; whether the buffer is
  /// staged (its offset into ProgramDesc::stagingBytes).
  std::string rankGroup;
  bool staged = false;
};

struct InstrDesc {
  fb::Opcode op = fb::Opcode::Fill;
  std::vector<RefDesc> operands;
  bool transA = false, transB = false;
  float alpha = 1.0f, beta = 0.0f;
  std::vector<float> fattrs;
  std::vector<int64_t> iattrs;
  std::string group;
  fb::ReduceOp reduce = fb::ReduceOp::Sum;
  int event = -1;
  std::string loc;
};

struct InputDesc {
  std::string name;
  int buffer = -1;
  int64_t numClasses = 0;
  int64_t vocabSize = 0;
  int chunk = -1; // the chunk whose slot region holds it
};

/// Pipeline attributes of a function (see Function in artifact.fbs).
struct FunctionAttrs {
  int64_t slotBase = 0, slotBytes = 0;
  int numSlots = 0;
  int chunk = -1;
};

struct ScheduleStepDesc {
  std::string function; ///< resolved to its index by buildPayload
  int microbatch = 0;
  int slot = 0;
  int functionIndex = -1; ///< >= 0: used instead of `function` (bad indices)
};

struct ProgramDesc {
  int ppRank = 0;
  int64_t arenaBytes = 0;
  std::vector<BufferDesc> buffers;
  std::vector<InputDesc> inputs;
  int lossBuffer = -1, iterationBuffer = -1;
  std::vector<std::pair<std::string, std::vector<InstrDesc>>> functions;
  /// Slots and chunk per function name (absent: none).
  std::map<std::string, FunctionAttrs> functionAttrs;
  std::vector<ScheduleStepDesc> schedule;
  std::string scheduleKind;
  int numChunks = 1;
  int64_t stagingBytes = 0;

  int functionIndex(const std::string &name) const {
    for (size_t i = 0; i < functions.size(); ++i)
      if (functions[i].first == name)
        return int(i);
    return -1;
  }

  /// Appends a buffer at the next 64-byte aligned offset; returns its index.
  int add(const std::string &name, fb::BufferKind kind,
          std::vector<int64_t> shape, fb::DType dtype = fb::DType::F32,
          fb::InitKind init = fb::InitKind::Zeros, float scale = 0.0f,
          int of = -1) {
    BufferDesc b;
    b.name = name;
    b.kind = kind;
    b.dtype = dtype;
    b.shape = shape;
    b.globalShape = shape;
    b.init = init;
    b.initScale = scale;
    b.of = of;
    int64_t elems = 1;
    for (int64_t d : shape)
      elems *= d;
    int64_t es = dtype == fb::DType::I64 ? 8 : dtype == fb::DType::BF16 ? 2 : 4;
    b.offset = (arenaBytes + 63) / 64 * 64;
    arenaBytes = b.offset + elems * es;
    buffers.push_back(b);
    return int(buffers.size()) - 1;
  }
  /// Arena space that is not a named buffer (activations, temporaries).
  RefDesc scratch(std::vector<int64_t> shape,
                  fb::DType dtype = fb::DType::F32) {
    int64_t elems = 1;
    for (int64_t d : shape)
      elems *= d;
    int64_t es = dtype == fb::DType::I64 ? 8 : dtype == fb::DType::BF16 ? 2 : 4;
    RefDesc r{(arenaBytes + 63) / 64 * 64, shape, dtype};
    arenaBytes = r.offset + elems * es;
    return r;
  }
  RefDesc ref(int buffer) const {
    const BufferDesc &b = buffers[size_t(buffer)];
    return RefDesc{b.offset, b.shape, b.dtype};
  }
  std::vector<InstrDesc> &function(const std::string &name) {
    for (auto &f : functions)
      if (f.first == name)
        return f.second;
    functions.push_back({name, {}});
    return functions.back().second;
  }
};

struct ArtifactDesc {
  uint32_t formatVersion = artifact::kFormatVersion;
  int worldSize = 1;
  std::vector<std::pair<std::string, int>> mesh;
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  int64_t microBatch = 1, globalBatch = 1, numMicrobatches = 1;
  std::string optimizer = "adam";
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.0f;
  std::vector<ProgramDesc> programs;
};

/// Serialises `desc` into a FlatBuffer payload.
/// The tp and dp groups of a tp x dp mesh, tp fastest (tp groups are
/// consecutive ranks).
inline void addTpDpGroups(ArtifactDesc &a, int tp, int dp) {
  for (int d = 0; d < dp; ++d) {
    std::vector<int> g;
    for (int t = 0; t < tp; ++t)
      g.push_back(d * tp + t);
    a.groups.push_back({"tp", g});
  }
  for (int t = 0; t < tp; ++t) {
    std::vector<int> g;
    for (int d = 0; d < dp; ++d)
      g.push_back(d * tp + t);
    a.groups.push_back({"dp", g});
  }
}

inline std::string buildPayload(const ArtifactDesc &desc) {
  flatbuffers::FlatBufferBuilder fbb;
  auto makeRef = [&](const RefDesc &r) {
    return fb::CreateTensorRefDirect(
        fbb, r.offset, &r.shape, r.dtype,
        r.rankGroup.empty() ? nullptr : r.rankGroup.c_str(), r.rankStride);
  };
  std::vector<flatbuffers::Offset<fb::Program>> programs;
  for (const ProgramDesc &p : desc.programs) {
    std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
    for (const BufferDesc &b : p.buffers)
      buffers.push_back(fb::CreateBufferDirect(
          fbb, b.name.c_str(), b.kind, b.dtype, b.offset, &b.shape,
          &b.globalShape, b.shardDim,
          b.shardAxis.empty() ? nullptr : b.shardAxis.c_str(), b.init,
          b.initScale, b.of, nullptr, nullptr, nullptr, 0, -1, nullptr,
          b.rankGroup.empty() ? nullptr : b.rankGroup.c_str(), nullptr,
          b.staged));
    std::vector<flatbuffers::Offset<fb::InputSpec>> inputs;
    for (const InputDesc &in : p.inputs)
      inputs.push_back(fb::CreateInputSpecDirect(
          fbb, in.name.c_str(), in.buffer, in.numClasses, in.vocabSize,
          in.chunk));
    std::vector<flatbuffers::Offset<fb::Function>> functions;
    for (const auto &[name, instrs] : p.functions) {
      std::vector<flatbuffers::Offset<fb::Instr>> list;
      for (const InstrDesc &in : instrs) {
        std::vector<flatbuffers::Offset<fb::TensorRef>> refs;
        for (const RefDesc &r : in.operands)
          refs.push_back(makeRef(r));
        list.push_back(
            fb::CreateInstrDirect(fbb, in.op, &refs, in.transA, in.transB,
                                  in.alpha, in.beta, &in.fattrs, &in.iattrs,
                                  in.group.empty() ? nullptr : in.group.c_str(),
                                  in.reduce, in.event, in.loc.c_str()));
      }
      FunctionAttrs attrs;
      auto it = p.functionAttrs.find(name);
      if (it != p.functionAttrs.end())
        attrs = it->second;
      functions.push_back(fb::CreateFunctionDirect(
          fbb, name.c_str(), &list, attrs.slotBase, attrs.slotBytes,
          attrs.numSlots, attrs.chunk));
    }
    std::vector<fb::ScheduleStep> schedule;
    for (const ScheduleStepDesc &step : p.schedule)
      schedule.emplace_back(step.functionIndex >= 0
                                ? step.functionIndex
                                : p.functionIndex(step.function),
                            step.microbatch, step.slot);
    programs.push_back(fb::CreateProgramDirect(
        fbb, p.ppRank, p.arenaBytes, p.arenaBytes, &buffers, &inputs,
        p.lossBuffer, p.iterationBuffer, &functions, &schedule,
        p.scheduleKind.empty() ? nullptr : p.scheduleKind.c_str(),
        p.numChunks, p.stagingBytes));
  }
  std::vector<flatbuffers::Offset<fb::MeshAxis>> mesh;
  for (const auto &[name, size] : desc.mesh)
    mesh.push_back(fb::CreateMeshAxisDirect(fbb, name.c_str(), size));
  std::vector<flatbuffers::Offset<fb::RankGroup>> groups;
  for (const auto &[kind, ranks] : desc.groups)
    groups.push_back(fb::CreateRankGroupDirect(fbb, kind.c_str(), &ranks));
  auto batch = fb::CreateBatch(fbb, desc.microBatch, desc.globalBatch,
                               desc.numMicrobatches);
  auto optimizer =
      fb::CreateOptimizerDirect(fbb, desc.optimizer.c_str(), desc.lr,
                                desc.beta1, desc.beta2, desc.eps, desc.wd);
  std::string order;
  for (const auto &axis : desc.mesh)
    order += (order.empty() ? "" : "-") + axis.first;
  auto root = fb::CreateArtifactDirect(
      fbb, desc.formatVersion, "tessera-unittest", "test_model", desc.worldSize,
      &mesh, order.c_str(), &groups, batch, optimizer, "unittest", &programs);
  fb::FinishArtifactBuffer(fbb, root);
  return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
                     fbb.GetSize());
}

/// Header + payload.
inline std::string buildFile(const std::string &payload) {
  const auto *data = reinterpret_cast<const uint8_t *>(payload.data());
  return artifact::makeHeader(data, payload.size()) + payload;
}

inline InstrDesc instr(fb::Opcode op, std::vector<RefDesc> operands,
                       const std::string &loc = "") {
  InstrDesc in;
  in.op = op;
  in.operands = std::move(operands);
  in.loc = loc;
  return in;
}

/// The dp gradient averaging of the test models' step: the weight's
/// all-reduce started, the bias's done, the weight's waited for, then both
/// scaled by 1/dp.
inline void appendDpAverage(ProgramDesc &p, std::vector<InstrDesc> &step, int gw,
                            int gb, int dp) {
  using O = fb::Opcode;
  InstrDesc start = instr(O::AllReduceStart, {p.ref(gw)}, "dp.grad.w");
  start.group = "dp";
  start.event = 0;
  step.push_back(start);
  InstrDesc ar = instr(O::AllReduce, {p.ref(gb)}, "dp.grad.b");
  ar.group = "dp";
  step.push_back(ar);
  InstrDesc wait = instr(O::Wait, {}, "dp.grad.w");
  wait.event = 0;
  step.push_back(wait);
  for (int g : {gw, gb}) {
    InstrDesc sc = instr(O::Scale, {p.ref(g), p.ref(g)}, "dp.average");
    sc.alpha = 1.0f / float(dp);
    step.push_back(sc);
  }
}

/// One-layer softmax regression over F features and C classes, trained with
/// Adam (or SGD), micro batch b, M microbatches, data parallel over `dp`
/// ranks (world = dp). Gradients are averaged over dp in "step" with an
/// async all-reduce for W and a synchronous one for the bias.
inline ArtifactDesc softmaxRegression(int64_t features = 8, int64_t classes = 4,
                                      int64_t b = 16, int64_t microbatches = 2,
                                      int dp = 1, bool adam = true,
                                      float lr = 0.05f) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.worldSize = dp;
  a.mesh = {{"tp", 1}, {"dp", dp}};
  addTpDpGroups(a, 1, dp);
  a.microBatch = b;
  a.numMicrobatches = microbatches;
  a.globalBatch = b * microbatches * dp;
  a.optimizer = adam ? "adam" : "sgd";
  a.lr = lr;

  ProgramDesc p;
  int w = p.add("fc.weight", K::Param, {features, classes}, fb::DType::F32,
                fb::InitKind::Normal, 0.1f);
  int bias = p.add("fc.bias", K::Param, {classes});
  int gw = p.add("grad:fc.weight", K::Grad, {features, classes}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, w);
  int gb = p.add("grad:fc.bias", K::Grad, {classes}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, bias);
  int mw = p.add("adam.m:fc.weight", K::OptState, {features, classes},
                 fb::DType::F32, fb::InitKind::Zeros, 0.0f, w);
  int vw = p.add("adam.v:fc.weight", K::OptState, {features, classes},
                 fb::DType::F32, fb::InitKind::Zeros, 0.0f, w);
  int mb = p.add("adam.m:fc.bias", K::OptState, {classes}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, bias);
  int vb = p.add("adam.v:fc.bias", K::OptState, {classes}, fb::DType::F32,
                 fb::InitKind::Zeros, 0.0f, bias);
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  int loss = p.add("loss", K::Loss, {});
  int x = p.add("features", K::Input, {b, features});
  int t = p.add("labels", K::Input, {b}, fb::DType::I32);
  // Activations live in the arena but are not named buffers.
  RefDesc z = p.scratch({b, classes});
  RefDesc l = p.scratch({b});
  RefDesc dloss = p.scratch({});
  RefDesc dl = p.scratch({b});
  RefDesc dz = p.scratch({b, classes});
  p.inputs = {{"features", x, 0}, {"labels", t, classes}};
  p.lossBuffer = loss;
  p.iterationBuffer = it;

  auto &mbf = p.function("microbatch");
  mbf.push_back(instr(O::Gemm, {p.ref(x), p.ref(w), z}, "fc"));
  mbf.push_back(instr(O::BiasAdd, {z, p.ref(bias), z}, "fc"));
  mbf.push_back(instr(O::CrossEntropy, {z, p.ref(t), l}, "ce"));
  mbf.push_back(instr(O::Mean, {l, p.ref(loss)}, "mean"));
  InstrDesc fill = instr(O::Fill, {dloss}, "seed-grad");
  fill.fattrs = {1.0f / float(microbatches)};
  mbf.push_back(fill);
  mbf.push_back(instr(O::MeanGrad, {dloss, dl}, "mean.grad"));
  mbf.push_back(instr(O::CrossEntropyGrad, {z, p.ref(t), dl, dz}, "ce.grad"));
  InstrDesc gwi = instr(O::Gemm, {p.ref(x), dz, p.ref(gw)}, "fc.dw");
  gwi.transA = true;
  gwi.beta = 1.0f;
  mbf.push_back(gwi);
  InstrDesc gbi = instr(O::ReduceRows, {dz, p.ref(gb)}, "fc.db");
  gbi.beta = 1.0f;
  mbf.push_back(gbi);

  auto &step = p.function("step");
  if (dp > 1)
    appendDpAverage(p, step, gw, gb, dp);
  if (adam) {
    for (auto [pp, gg, m, v] :
         {std::tuple{w, gw, mw, vw}, {bias, gb, mb, vb}}) {
      InstrDesc ad =
          instr(O::Adam, {p.ref(pp), p.ref(gg), p.ref(m), p.ref(v), p.ref(it)},
                "adam");
      ad.fattrs = {lr, 0.9f, 0.999f, 1e-8f, 0.0f};
      step.push_back(ad);
    }
  } else {
    for (auto [pp, gg] : {std::pair{w, gw}, {bias, gb}}) {
      InstrDesc sg = instr(O::Sgd, {p.ref(pp), p.ref(gg)}, "sgd");
      sg.fattrs = {lr, 0.0f};
      step.push_back(sg);
    }
  }
  for (int g : {gw, gb}) {
    InstrDesc zero = instr(O::Fill, {p.ref(g)}, "zero-grad");
    zero.fattrs = {0.0f};
    step.push_back(zero);
  }
  a.programs.push_back(std::move(p));
  return a;
}

/// ZeRO-3 on one rank: parameters w (normal, 0.1) and v (ones) staged at
/// elements 0 and 64 of a 128-element bucket view, this rank's shard of it
/// ("pshard:b:0", over "dp" of one rank: the whole bucket) in the arena.
/// "microbatch" gathers the shard and takes the mean of the bucket; "step"
/// doubles the shard (an update of the parameters).
inline ArtifactDesc zero3Bucket() {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.mesh = {{"tp", 1}, {"dp", 1}};
  addTpDpGroups(a, 1, 1);
  ProgramDesc p;
  p.stagingBytes = 512;
  auto staged = [&](const std::string &name, K kind, int64_t n, int64_t at,
                    fb::InitKind init, float scale) {
    BufferDesc b;
    b.name = name;
    b.kind = kind;
    b.shape = b.globalShape = {n};
    b.offset = at;
    b.init = init;
    b.initScale = scale;
    b.staged = true;
    p.buffers.push_back(b);
    return int(p.buffers.size()) - 1;
  };
  staged("w", K::Param, 4, 0, fb::InitKind::Normal, 0.1f);
  staged("v", K::Param, 4, 256, fb::InitKind::Ones, 0.0f);
  int view = staged("pbuf:b:0", K::View, 128, 0, fb::InitKind::Zeros, 0.0f);
  int shard = p.add("pshard:b:0", K::ParamShard, {128});
  p.buffers[size_t(shard)].of = view;
  p.buffers[size_t(shard)].rankGroup = "dp";
  int loss = p.add("loss", K::Loss, {});
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  p.lossBuffer = loss;
  p.iterationBuffer = it;
  RefDesc gathered = p.scratch({128});
  InstrDesc gather = instr(O::AllGather, {p.ref(shard), gathered}, "gather");
  gather.group = "dp";
  p.function("microbatch") = {gather,
                              instr(O::Mean, {gathered, p.ref(loss)}, "mean")};
  InstrDesc twice = instr(O::Scale, {p.ref(shard), p.ref(shard)}, "update");
  twice.alpha = 2.0f;
  p.function("step") = {twice};
  a.programs.push_back(std::move(p));
  return a;
}

/// softmaxRegression on a tp x dp mesh, tp fastest (tp groups are
/// consecutive ranks), with a tp all-reduce in "step" so that tp is a
/// collective group kind too.
inline ArtifactDesc tpDpMeshArtifact(int tp, int dp) {
  ArtifactDesc a = softmaxRegression(8, 4, 4, 1, dp);
  a.worldSize = tp * dp;
  a.mesh = {{"tp", tp}, {"dp", dp}};
  a.groups.clear();
  addTpDpGroups(a, tp, dp);
  ProgramDesc &p = a.programs[0];
  InstrDesc ar = instr(fb::Opcode::AllReduce, {p.ref(3)}, "tp.ar");
  ar.group = "tp";
  p.function("step").insert(p.function("step").begin(), ar);
  return a;
}

/// softmaxRegression in mixed precision (Megatron's --bf16): the weight and
/// bias are bf16 with fp32 main params ("main:fc.weight", "main:fc.bias",
/// kind MainParam), the microbatch casts them to f32 scratch and computes
/// in f32; gradients are f32 or, with `bf16Grads`, bf16 (accumulated with a
/// Cast of beta 1, all-reduced and averaged in bf16, cast to f32 for Adam).
/// "step" runs Adam on the main params and casts them back into the
/// params; "init" casts the params into the main params.
inline ArtifactDesc
mixedPrecisionRegression(int64_t features = 8, int64_t classes = 4,
                         int64_t b = 16, int64_t microbatches = 2, int dp = 1,
                         bool bf16Grads = false, float lr = 0.05f) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  const auto F32 = fb::DType::F32, BF16 = fb::DType::BF16;
  const fb::DType G = bf16Grads ? BF16 : F32;
  ArtifactDesc a;
  a.worldSize = dp;
  a.mesh = {{"tp", 1}, {"dp", dp}};
  addTpDpGroups(a, 1, dp);
  a.microBatch = b;
  a.numMicrobatches = microbatches;
  a.globalBatch = b * microbatches * dp;
  a.lr = lr;

  ProgramDesc p;
  int w = p.add("fc.weight", K::Param, {features, classes}, BF16,
                fb::InitKind::Normal, 0.1f);
  int bias = p.add("fc.bias", K::Param, {classes}, BF16);
  int mainW = p.add("main:fc.weight", K::MainParam, {features, classes}, F32,
                    fb::InitKind::Zeros, 0.0f, w);
  int mainB = p.add("main:fc.bias", K::MainParam, {classes}, F32,
                    fb::InitKind::Zeros, 0.0f, bias);
  int gw = p.add("grad:fc.weight", K::Grad, {features, classes}, G,
                 fb::InitKind::Zeros, 0.0f, w);
  int gb = p.add("grad:fc.bias", K::Grad, {classes}, G, fb::InitKind::Zeros,
                 0.0f, bias);
  int mw = p.add("adam.m:fc.weight", K::OptState, {features, classes}, F32,
                 fb::InitKind::Zeros, 0.0f, w);
  int vw = p.add("adam.v:fc.weight", K::OptState, {features, classes}, F32,
                 fb::InitKind::Zeros, 0.0f, w);
  int mb = p.add("adam.m:fc.bias", K::OptState, {classes}, F32,
                 fb::InitKind::Zeros, 0.0f, bias);
  int vb = p.add("adam.v:fc.bias", K::OptState, {classes}, F32,
                 fb::InitKind::Zeros, 0.0f, bias);
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  int loss = p.add("loss", K::Loss, {});
  int x = p.add("features", K::Input, {b, features});
  int t = p.add("labels", K::Input, {b}, fb::DType::I32);
  RefDesc wf = p.scratch({features, classes});
  RefDesc bf = p.scratch({classes});
  RefDesc z = p.scratch({b, classes});
  RefDesc l = p.scratch({b});
  RefDesc dloss = p.scratch({});
  RefDesc dl = p.scratch({b});
  RefDesc dz = p.scratch({b, classes});
  RefDesc dw = p.scratch({features, classes});
  RefDesc db = p.scratch({classes});
  p.inputs = {{"features", x, 0}, {"labels", t, classes}};
  p.lossBuffer = loss;
  p.iterationBuffer = it;
  auto cast = [&](RefDesc from, RefDesc to, float beta, const char *loc) {
    InstrDesc c = instr(O::Cast, {std::move(from), std::move(to)}, loc);
    c.beta = beta;
    return c;
  };

  auto &init = p.function("init");
  init.push_back(cast(p.ref(w), p.ref(mainW), 0.0f, "main.w"));
  init.push_back(cast(p.ref(bias), p.ref(mainB), 0.0f, "main.b"));

  auto &mbf = p.function("microbatch");
  mbf.push_back(cast(p.ref(w), wf, 0.0f, "fc.w.f32"));
  mbf.push_back(cast(p.ref(bias), bf, 0.0f, "fc.b.f32"));
  mbf.push_back(instr(O::Gemm, {p.ref(x), wf, z}, "fc"));
  mbf.push_back(instr(O::BiasAdd, {z, bf, z}, "fc"));
  mbf.push_back(instr(O::CrossEntropy, {z, p.ref(t), l}, "ce"));
  mbf.push_back(instr(O::Mean, {l, p.ref(loss)}, "mean"));
  InstrDesc fill = instr(O::Fill, {dloss}, "seed-grad");
  fill.fattrs = {1.0f / float(microbatches)};
  mbf.push_back(fill);
  mbf.push_back(instr(O::MeanGrad, {dloss, dl}, "mean.grad"));
  mbf.push_back(instr(O::CrossEntropyGrad, {z, p.ref(t), dl, dz}, "ce.grad"));
  InstrDesc gwi =
      instr(O::Gemm, {p.ref(x), dz, bf16Grads ? dw : p.ref(gw)}, "fc.dw");
  gwi.transA = true;
  gwi.beta = bf16Grads ? 0.0f : 1.0f;
  mbf.push_back(gwi);
  InstrDesc gbi =
      instr(O::ReduceRows, {dz, bf16Grads ? db : p.ref(gb)}, "fc.db");
  gbi.beta = bf16Grads ? 0.0f : 1.0f;
  mbf.push_back(gbi);
  if (bf16Grads) {
    mbf.push_back(cast(dw, p.ref(gw), 1.0f, "fc.dw.acc"));
    mbf.push_back(cast(db, p.ref(gb), 1.0f, "fc.db.acc"));
  }

  auto &step = p.function("step");
  if (dp > 1)
    appendDpAverage(p, step, gw, gb, dp);
  RefDesc gwF32 = p.ref(gw), gbF32 = p.ref(gb);
  if (bf16Grads) {
    step.push_back(cast(p.ref(gw), dw, 0.0f, "grad.w.f32"));
    step.push_back(cast(p.ref(gb), db, 0.0f, "grad.b.f32"));
    gwF32 = dw;
    gbF32 = db;
  }
  for (auto [mp, gg, m, v] :
       {std::tuple{mainW, gwF32, mw, vw}, std::tuple{mainB, gbF32, mb, vb}}) {
    InstrDesc ad =
        instr(O::Adam, {p.ref(mp), gg, p.ref(m), p.ref(v), p.ref(it)}, "adam");
    ad.fattrs = {lr, 0.9f, 0.999f, 1e-8f, 0.0f};
    step.push_back(ad);
  }
  step.push_back(cast(p.ref(mainW), p.ref(w), 0.0f, "param.w"));
  step.push_back(cast(p.ref(mainB), p.ref(bias), 0.0f, "param.b"));
  for (int g : {gw, gb}) {
    InstrDesc zero = instr(O::Fill, {p.ref(g)}, "zero-grad");
    zero.fattrs = {0.0f};
    step.push_back(zero);
  }
  a.programs.push_back(std::move(p));
  return a;
}

/// 1F1B order of pipeline stage `stage` of `stages` over `microbatches`
/// (warmup stages - stage - 1 forwards, then one forward one backward, then
/// the remaining backwards) for one chunk; microbatch m uses slot
/// m % numSlots.
inline std::vector<ScheduleStepDesc> oneFOneB(int stage, int stages,
                                              int microbatches, int numSlots) {
  std::vector<ScheduleStepDesc> steps;
  int warmup = std::min(stages - stage - 1, microbatches);
  int f = 0, b = 0;
  auto fwd = [&] {
    steps.push_back({"forward_c0", f, f % numSlots});
    ++f;
  };
  auto bwd = [&] {
    steps.push_back({"backward_c0", b, b % numSlots});
    ++b;
  };
  for (int i = 0; i < warmup; ++i)
    fwd();
  while (f < microbatches) {
    fwd();
    bwd();
  }
  while (b < microbatches)
    bwd();
  return steps;
}

/// A one-stage "pipeline" of `features` F and micro batch b over M
/// microbatches whose functions use `numSlots` microbatch slots. The slot
/// region holds the "features" input [b, F] and act [F]:
///   forward_c0:  act = column sums of features; loss = mean(act)
///   backward_c0: acc += act
///   step:        acc.out = acc; acc = 0
/// so after an iteration acc.out = sum over microbatches of the column sums,
/// which needs each backward to see its own forward's slot. The schedule is
/// 1F1B-like with all forwards first (F0 F1 .. B0 B1 ..) when numSlots >=
/// M, else F0 B0 F1 B1 ...
inline ArtifactDesc slottedSchedule(int numSlots = 2, int64_t microbatches = 2,
                                    int64_t b = 2, int64_t features = 4) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.mesh = {{"tp", 1}, {"dp", 1}, {"pp", 1}};
  a.groups = {{"tp", {0}}, {"dp", {0}}, {"pp", {0}}};
  a.microBatch = b;
  a.numMicrobatches = microbatches;
  a.globalBatch = b * microbatches;
  ProgramDesc p;
  int acc = p.add("acc", K::Param, {features});
  int out = p.add("acc.out", K::OptState, {features}, fb::DType::F32,
                  fb::InitKind::Zeros, 0.0f, acc);
  int loss = p.add("loss", K::Loss, {});
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  int64_t slotBase = (p.arenaBytes + 63) / 64 * 64;
  int x = p.add("features", K::Input, {b, features});
  RefDesc act = p.scratch({features});
  int64_t slotBytes = (p.arenaBytes - slotBase + 63) / 64 * 64;
  p.arenaBytes = slotBase + std::max(1, numSlots) * slotBytes;
  p.inputs = {{"features", x, 4, 0, 0}};
  p.lossBuffer = loss;
  p.iterationBuffer = it;

  auto &fwd = p.function("forward_c0");
  fwd.push_back(instr(O::ReduceRows, {p.ref(x), act}, "colsum"));
  fwd.push_back(instr(O::Mean, {act, p.ref(loss)}, "loss"));
  p.function("backward_c0").push_back(instr(O::Axpy, {act, p.ref(acc)}, "acc"));
  auto &step = p.function("step");
  step.push_back(instr(O::Copy, {p.ref(acc), p.ref(out)}, "acc.out"));
  InstrDesc zero = instr(O::Fill, {p.ref(acc)}, "acc.zero");
  zero.fattrs = {0.0f};
  step.push_back(zero);
  for (const char *name : {"forward_c0", "backward_c0"})
    p.functionAttrs[name] = {slotBase, slotBytes, numSlots, 0};
  if (numSlots >= microbatches) {
    for (int m = 0; m < microbatches; ++m)
      p.schedule.push_back({"forward_c0", m, m});
    for (int m = 0; m < microbatches; ++m)
      p.schedule.push_back({"backward_c0", m, m});
  } else {
    for (int m = 0; m < microbatches; ++m) {
      p.schedule.push_back({"forward_c0", m, 0});
      p.schedule.push_back({"backward_c0", m, 0});
    }
  }
  p.scheduleKind = "1f1b";
  a.programs.push_back(std::move(p));
  return a;
}

/// Two pipeline stages (world 2 = pp 2) exchanging activations and
/// gradients [b, F] f32 under 1F1B over M microbatches:
///   stage 0 forward_c0:  act = features; Send act (+1, tag 0)
///           backward_c0: Recv grad (+1, tag 1); acc += grad
///           step:        acc.out = acc; acc = 0        (no loss buffer)
///   stage 1 forward_c0:  Recv act (-1, tag 0); loss = mean(act)
///           backward_c0: grad = 2 * act; Send grad (-1, tag 1)
/// so that acc.out on stage 0 = 2 * the sum of the microbatches' features
/// and the loss (stage 1's) = the mean over microbatches of mean(features).
/// Stage 0 keeps two microbatches in flight (two slots), stage 1 one.
inline ArtifactDesc twoStagePipeline(int64_t microbatches = 2, int64_t b = 2,
                                     int64_t features = 4) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.worldSize = 2;
  a.mesh = {{"tp", 1}, {"dp", 1}, {"pp", 2}};
  a.groups = {
      {"tp", {0}}, {"tp", {1}}, {"dp", {0}}, {"dp", {1}}, {"pp", {0, 1}}};
  a.microBatch = b;
  a.numMicrobatches = microbatches;
  a.globalBatch = b * microbatches;
  auto p2p = [](O op, RefDesc ref, int64_t peer, int64_t tag,
                const std::string &loc) {
    InstrDesc in = instr(op, {std::move(ref)}, loc);
    in.iattrs = {peer, tag};
    in.group = "pp";
    return in;
  };
  {
    ProgramDesc p;
    p.ppRank = 0;
    int acc = p.add("acc", K::Param, {b, features});
    int out = p.add("acc.out", K::OptState, {b, features}, fb::DType::F32,
                    fb::InitKind::Zeros, 0.0f, acc);
    int64_t slotBase = (p.arenaBytes + 63) / 64 * 64;
    int x = p.add("features", K::Input, {b, features});
    RefDesc act = p.scratch({b, features});
    RefDesc grad = p.scratch({b, features});
    int64_t slotBytes = (p.arenaBytes - slotBase + 63) / 64 * 64;
    p.arenaBytes = slotBase + 2 * slotBytes;
    p.inputs = {{"features", x, 4, 0, 0}};
    auto &fwd = p.function("forward_c0");
    fwd.push_back(instr(O::Copy, {p.ref(x), act}, "stage0.act"));
    fwd.push_back(p2p(O::Send, act, +1, 0, "send.act"));
    auto &bwd = p.function("backward_c0");
    bwd.push_back(p2p(O::Recv, grad, +1, 1, "recv.grad"));
    bwd.push_back(instr(O::Axpy, {grad, p.ref(acc)}, "acc"));
    auto &step = p.function("step");
    step.push_back(instr(O::Copy, {p.ref(acc), p.ref(out)}, "acc.out"));
    InstrDesc zero = instr(O::Fill, {p.ref(acc)}, "acc.zero");
    zero.fattrs = {0.0f};
    step.push_back(zero);
    for (const char *name : {"forward_c0", "backward_c0"})
      p.functionAttrs[name] = {slotBase, slotBytes, 2, 0};
    p.schedule = oneFOneB(0, 2, int(microbatches), 2);
    p.scheduleKind = "1f1b";
    a.programs.push_back(std::move(p));
  }
  {
    ProgramDesc p;
    p.ppRank = 1;
    int loss = p.add("loss", K::Loss, {});
    int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
    int64_t slotBase = (p.arenaBytes + 63) / 64 * 64;
    RefDesc act = p.scratch({b, features});
    RefDesc grad = p.scratch({b, features});
    int64_t slotBytes = (p.arenaBytes - slotBase + 63) / 64 * 64;
    p.arenaBytes = slotBase + slotBytes;
    p.lossBuffer = loss;
    p.iterationBuffer = it;
    auto &fwd = p.function("forward_c0");
    fwd.push_back(p2p(O::Recv, act, -1, 0, "recv.act"));
    fwd.push_back(instr(O::Mean, {act, p.ref(loss)}, "loss"));
    auto &bwd = p.function("backward_c0");
    InstrDesc scale = instr(O::Scale, {act, grad}, "grad");
    scale.alpha = 2.0f;
    bwd.push_back(scale);
    bwd.push_back(p2p(O::Send, grad, -1, 1, "send.grad"));
    for (const char *name : {"forward_c0", "backward_c0"})
      p.functionAttrs[name] = {slotBase, slotBytes, 1, 0};
    p.schedule = oneFOneB(1, 2, int(microbatches), 1);
    p.scheduleKind = "1f1b";
    a.programs.push_back(std::move(p));
  }
  return a;
}

/// twoStagePipeline under ZB-H1 (a split backward): stage 0's backward_c0
/// only receives the gradient and its backward_w_c0 accumulates it; stage
/// 1's backward_c0 computes and sends the gradient and its backward_w_c0
/// adds the activation into "w.acc". Each rank runs 1F1B's F and B order,
/// rank r running W(i - r) after B(i), and holds two slots (a slot is free
/// after its W).
inline ArtifactDesc zeroBubblePipeline(int64_t microbatches = 4, int64_t b = 2,
                                       int64_t features = 4) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a = twoStagePipeline(microbatches, b, features);
  const int m = int(microbatches);
  for (int r = 0; r < 2; ++r) {
    ProgramDesc &p = a.programs[size_t(r)];
    p.function("backward_w_c0"); // (before the references below)
    auto &bwd = p.function("backward_c0");
    auto &w = p.function("backward_w_c0");
    if (r == 0) {
      // B receives; W accumulates what B received.
      w.push_back(bwd.back());
      bwd.pop_back();
    } else {
      // The slot region (activation, gradient) doubles: two slots; then a
      // parameter W accumulates the activation into.
      FunctionAttrs attrs = p.functionAttrs["forward_c0"];
      attrs.numSlots = 2;
      p.arenaBytes = attrs.slotBase + 2 * attrs.slotBytes;
      p.functionAttrs["forward_c0"] = attrs;
      p.functionAttrs["backward_c0"] = attrs;
      int acc = p.add("w.acc", K::Param, {b, features});
      RefDesc act = p.function("forward_c0").front().operands[0];
      p.function("backward_w_c0").push_back(
          instr(O::Axpy, {act, p.ref(acc)}, "w.acc"));
    }
    p.functionAttrs["backward_w_c0"] = p.functionAttrs["backward_c0"];
    std::vector<ScheduleStepDesc> order;
    int f = 0, weights = 0;
    auto F = [&] { order.push_back({"forward_c0", f, f % 2}); ++f; };
    int warmup = std::min(1 - r, m);
    for (int i = 0; i < warmup; ++i)
      F();
    for (int i = 0; i < m; ++i) {
      if (f < m)
        F();
      order.push_back({"backward_c0", i, i % 2});
      if (i >= r) {
        order.push_back({"backward_w_c0", weights, weights % 2});
        ++weights;
      }
    }
    for (; weights < m; ++weights)
      order.push_back({"backward_w_c0", weights, weights % 2});
    p.schedule = order;
    p.scheduleKind = "zb-h1";
  }
  return a;
}

/// The distributed optimizer's in-place collectives over "dp" on a tp x dp
/// mesh (tp fastest), every buffer `dtype` of `block` elements per dp rank
/// (kind Activation: zeros, filled by the tests through writeBuffer):
///   "rs":      ReduceScatter [grad, dp block of grad]            (in place)
///   "rs.ref":  ReduceScatter [grad.ref, shard.ref]           (out of place)
///   "rsa":     ReduceScatterStart [grad.async, dp block of it] (in place),
///              a Fill of "other" (f32), Wait
///   "ag":      AllGather [dp block of param, param]              (in place)
///   "ag.ref":  AllGather [param.src, param.ref]              (out of place)
///   "aga":     AllGatherStart [param.src, param.async] (out of place, as
///              ZeRO-3's prefetch), a Fill of "other" (f32), Wait
///   "ps.start": ParamSyncStart [dp block of param.sync, param.sync], sync
///              id 2 (in place; overlap_param_gather), left in flight
///   "ps.wait": ParamSyncWait of sync id 2
///   "mark":    Fill 7 into the dp block of "param" and 5 into the tp block
///              of "tpbuf" (rank-relative refs outside collectives)
/// Without `collectives` only "mark" (and an empty "microbatch") is built,
/// which decodes for any rank without communicators.
inline ArtifactDesc shardedBuckets(int tp, int dp, int64_t block,
                                   fb::DType dtype = fb::DType::F32,
                                   bool collectives = true) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  ArtifactDesc a;
  a.worldSize = tp * dp;
  a.mesh = {{"tp", tp}, {"dp", dp}};
  addTpDpGroups(a, tp, dp);
  a.microBatch = 1;
  a.numMicrobatches = 1;
  a.globalBatch = dp;
  ProgramDesc p;
  auto buf = [&](const char *name, int64_t blocks, fb::DType t) {
    return p.ref(p.add(name, K::Activation, {blocks * block}, t));
  };
  RefDesc grad = buf("grad", dp, dtype), gradRef = buf("grad.ref", dp, dtype);
  RefDesc shardRef = buf("shard.ref", 1, dtype);
  RefDesc gradAsync = buf("grad.async", dp, dtype);
  RefDesc param = buf("param", dp, dtype), paramSrc = buf("param.src", 1, dtype);
  RefDesc paramRef = buf("param.ref", dp, dtype);
  RefDesc paramSync = buf("param.sync", dp, dtype);
  RefDesc paramAsync = buf("param.async", dp, dtype);
  RefDesc other = buf("other", 1, fb::DType::F32);
  RefDesc tpbuf = buf("tpbuf", tp, dtype);
  p.function("microbatch");
  auto collective = [](O op, std::vector<RefDesc> refs, const char *loc) {
    InstrDesc in = instr(op, std::move(refs), loc);
    in.group = "dp";
    return in;
  };
  if (collectives) {
    p.function("rs").push_back(collective(
        O::ReduceScatter, {grad, rankBlock(grad, {block}, "dp")}, "rs"));
    p.function("rs.ref").push_back(
        collective(O::ReduceScatter, {gradRef, shardRef}, "rs.ref"));
    // A started collective, a Fill of `other` to `value` between, its Wait.
    auto startFillWait = [&](const char *name, InstrDesc start, int event,
                             float value) {
      auto &f = p.function(name);
      start.event = event;
      f.push_back(start);
      InstrDesc fill = instr(O::Fill, {other}, "between");
      fill.fattrs = {value};
      f.push_back(fill);
      InstrDesc wait = instr(O::Wait, {}, name);
      wait.event = event;
      f.push_back(wait);
    };
    startFillWait("rsa",
                  collective(O::ReduceScatterStart,
                             {gradAsync, rankBlock(gradAsync, {block}, "dp")},
                             "rsa"),
                  3, 1.0f);
    p.function("ag").push_back(collective(
        O::AllGather, {rankBlock(param, {block}, "dp"), param}, "ag"));
    p.function("ag.ref").push_back(
        collective(O::AllGather, {paramSrc, paramRef}, "ag.ref"));
    startFillWait("aga",
                  collective(O::AllGatherStart, {paramSrc, paramAsync}, "aga"),
                  4, 2.0f);
    InstrDesc sync = collective(
        O::ParamSyncStart, {rankBlock(paramSync, {block}, "dp"), paramSync},
        "ps.start");
    sync.event = 2;
    p.function("ps.start").push_back(sync);
    InstrDesc syncWait = instr(O::ParamSyncWait, {}, "ps.wait");
    syncWait.event = 2;
    p.function("ps.wait").push_back(syncWait);
  }
  auto &mark = p.function("mark");
  InstrDesc seven = instr(O::Fill, {rankBlock(param, {block}, "dp")}, "mark");
  seven.fattrs = {7.0f};
  mark.push_back(seven);
  InstrDesc five = instr(O::Fill, {rankBlock(tpbuf, {block}, "tp")}, "mark");
  five.fattrs = {5.0f};
  mark.push_back(five);
  a.programs.push_back(std::move(p));
  return a;
}

/// Expert parallelism's exchange on its own: `ep` ranks (one "ep" group of
/// all of them, expert tensor parallelism 1), `experts` experts, each rank
/// `rows` routed rows of `features` in expert order. "dispatch" is
/// ExpertDispatch (x, counts -> recv, local, splits); "combine" is
/// ExpertCombine (recv, splits, counts -> out), which brings every row back
/// where it came from.
/// (The rows, and their workspaces, in `dtype`: F32, or BF16 as under
/// bf16 activations.)
inline ArtifactDesc expertExchange(int ep, int64_t experts, int64_t rows,
                                   int64_t features,
                                   fb::DType dtype = fb::DType::F32) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  const auto I32 = fb::DType::I32;
  ArtifactDesc a;
  a.worldSize = ep;
  a.mesh = {{"tp", 1}, {"dp", ep}};
  addTpDpGroups(a, 1, ep);
  std::vector<int> all;
  for (int r = 0; r < ep; ++r)
    all.push_back(r);
  a.groups.push_back({"ep", all});
  a.globalBatch = ep;
  ProgramDesc p;
  const int64_t local = experts / ep;
  RefDesc x = p.ref(p.add("x", K::Activation, {rows, features}, dtype));
  RefDesc counts = p.ref(p.add("counts", K::Activation, {experts}, I32));
  RefDesc recv =
      p.ref(p.add("recv", K::Activation, {ep * rows, features}, dtype));
  RefDesc localCounts = p.ref(p.add("local", K::Activation, {local}, I32));
  RefDesc splits = p.ref(p.add("splits", K::Activation, {ep, local}, I32));
  RefDesc work =
      p.ref(p.add("work", K::Activation, {ep * rows * features}, dtype));
  RefDesc out = p.ref(p.add("out", K::Activation, {rows, features}, dtype));
  RefDesc work2 =
      p.ref(p.add("work2", K::Activation, {ep * rows * features}, dtype));
  p.function("microbatch");
  InstrDesc d = instr(O::ExpertDispatch,
                      {x, counts, recv, localCounts, splits, work}, "dispatch");
  d.iattrs = {experts, 1};
  d.group = "ep";
  p.function("dispatch").push_back(d);
  InstrDesc c =
      instr(O::ExpertCombine, {recv, splits, counts, out, work2}, "combine");
  c.iattrs = {experts, 1};
  c.group = "ep";
  p.function("combine").push_back(c);
  a.programs.push_back(std::move(p));
  return a;
}

/// --tp-comm-overlap's instructions over a tp group of every rank, next to
/// their unfused forms: function "fused" runs AllGatherGemm (x, w ->
/// gathered, c) and GemmReduceScatter (a, w2 -> y); "plain" the AllGather
/// and Gemm into gathered.ref and c.ref, and the Gemm and ReduceScatter
/// into y.ref. x is [rows, k] per rank, w [n, k] and w2 [n, k] used
/// transposed, a [tp * rows, k]; those and the gathered rows in `dtype`
/// (F32 or BF16), the products and sums in f32.
inline ArtifactDesc tpCommOverlap(int tp, int64_t rows, int64_t k, int64_t n,
                                  fb::DType dtype = fb::DType::F32) {
  using K = fb::BufferKind;
  using O = fb::Opcode;
  const fb::DType h = dtype; // the GEMMs' operands (bf16: products in f32)
  ArtifactDesc a;
  a.worldSize = tp;
  a.mesh = {{"tp", tp}, {"dp", 1}};
  addTpDpGroups(a, tp, 1);
  a.globalBatch = 1;
  ProgramDesc p;
  RefDesc x = p.ref(p.add("x", K::Activation, {rows, k}, h));
  RefDesc w = p.ref(p.add("w", K::Activation, {n, k}, h));
  RefDesc g = p.ref(p.add("gathered", K::Activation, {tp * rows, k}, h));
  RefDesc c = p.ref(p.add("c", K::Activation, {tp * rows, n}));
  RefDesc gRef = p.ref(p.add("gathered.ref", K::Activation, {tp * rows, k}, h));
  RefDesc cRef = p.ref(p.add("c.ref", K::Activation, {tp * rows, n}));
  RefDesc in = p.ref(p.add("a", K::Activation, {tp * rows, k}, h));
  RefDesc w2 = p.ref(p.add("w2", K::Activation, {n, k}, h));
  RefDesc ws = p.ref(p.add("workspace", K::Activation, {3 * rows * n}));
  RefDesc y = p.ref(p.add("y", K::Activation, {rows, n}));
  RefDesc prod = p.ref(p.add("product", K::Activation, {tp * rows, n}));
  RefDesc yRef = p.ref(p.add("y.ref", K::Activation, {rows, n}));
  p.function("microbatch");
  InstrDesc ag = instr(O::AllGatherGemm, {x, w, g, c}, "fused.gather");
  ag.group = "tp";
  ag.transB = true;
  InstrDesc rs = instr(O::GemmReduceScatter, {in, w2, ws, y}, "fused.scatter");
  rs.group = "tp";
  rs.transB = true;
  p.function("fused") = {ag, rs};
  InstrDesc gather = instr(O::AllGather, {x, gRef}, "plain.gather");
  gather.group = "tp";
  InstrDesc gemm = instr(O::Gemm, {gRef, w, cRef}, "plain.gemm");
  gemm.transB = true;
  InstrDesc gemm2 = instr(O::Gemm, {in, w2, prod}, "plain.gemm2");
  gemm2.transB = true;
  InstrDesc scatter = instr(O::ReduceScatter, {prod, yRef}, "plain.scatter");
  scatter.group = "tp";
  p.function("plain") = {gather, gemm, gemm2, scatter};
  a.programs.push_back(std::move(p));
  return a;
}

} // namespace tessera::rt::test

#endif // TESSERA_RT_UNITTESTS_TESTARTIFACTS_H
