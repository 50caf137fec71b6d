//===- Planner.cpp - tessera-plan's search and cost model -----------------===//
//
// See include/tessera/Plan/Planner.h. Three parts:
//   1. calibration: compile the model (its real width) at pp 3 with one
//      layer on the first and the last stage and the rest in the middle,
//      per (tp, cp, ep, etp, recompute) at micro-batch size 1, and read each
//      stage's phase FLOPs, parameters (the experts' apart), slot bytes
//      (inputs and saved activations of one microbatch), transient peak and
//      emitted transfers (expert parallelism's exchanges among them); the
//      middle stage divided by its layers is one layer, the first stage less
//      a layer the embedding, the last less a layer the head. Everything
//      read scales with the micro-batch size.
//   2. evaluation of a layout: each virtual stage's forward and backward
//      time, the schedule (lib/Schedule) run with them for the bubble and
//      the microbatches in flight, the data-parallel reductions after the
//      last backward (the experts' over the expert data-parallel group),
//      the optimizer's pass, and each pipeline rank's memory;
//   3. the search over the layouts the mesh and the model allow, and a whole
//      compile of the best few for their exact memory.
//
//===----------------------------------------------------------------------===//

#include "tessera/Plan/Planner.h"
#include "tessera/InitAll.h"
#include "tessera/Pipeline/Pipeline.h"
#include "tessera/Pipeline/Reports.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "tessera/Support/Model.h"

#include "dialects/rt/IR/RTOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <chrono>
#include <numeric>
#include <set>
#include <cmath>

using namespace mlir;
using namespace tessera;
using namespace tessera::plan;

//===----------------------------------------------------------------------===//
// Cluster files
//===----------------------------------------------------------------------===//

llvm::Expected<Cluster> tessera::plan::readCluster(const std::string &path) {
  auto fail = [&](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "cluster file '" + path + "': " + msg);
  };
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return fail(buffer.getError().message());
  llvm::Expected<llvm::json::Value> json =
      llvm::json::parse((*buffer)->getBuffer());
  if (!json)
    return fail(llvm::toString(json.takeError()));
  const llvm::json::Object *root = json->getAsObject();
  if (!root)
    return fail("expected a JSON object");
  Cluster c;
  // A positive number at `key` of `obj` (`where` names it in errors).
  auto number = [&](const llvm::json::Object &obj, llvm::StringRef key,
                    llvm::StringRef where, double &out,
                    bool required = true) -> llvm::Error {
    const llvm::json::Value *v = obj.get(key);
    if (!v) {
      if (!required)
        return llvm::Error::success();
      return fail("missing '" + where + key + "'");
    }
    std::optional<double> d = v->getAsNumber();
    if (!d || !(*d > 0) || !std::isfinite(*d))
      return fail("'" + where + key + "' must be a positive number");
    out = *d;
    return llvm::Error::success();
  };
  if (auto name = root->getString("name"))
    c.name = name->str();
  double gpusPerNode = 0, nodes = 0, memoryGiB = 0, hbm = 0;
  if (auto e = number(*root, "gpus_per_node", "", gpusPerNode))
    return std::move(e);
  if (auto e = number(*root, "nodes", "", nodes))
    return std::move(e);
  if (gpusPerNode != std::floor(gpusPerNode) || nodes != std::floor(nodes))
    return fail("'gpus_per_node' and 'nodes' must be integers");
  c.gpusPerNode = int64_t(gpusPerNode);
  c.nodes = int64_t(nodes);
  if (auto e = number(*root, "memory_gib", "", memoryGiB))
    return std::move(e);
  c.memoryBytes = memoryGiB * double(1 << 30);
  if (auto e = number(*root, "usable_memory_fraction", "", c.usableMemory,
                      /*required=*/false))
    return std::move(e);
  if (c.usableMemory > 1)
    return fail("'usable_memory_fraction' must be at most 1");
  if (auto e = number(*root, "hbm_bandwidth_gb_per_s", "", hbm))
    return std::move(e);
  c.hbmBandwidth = hbm * 1e9;
  const llvm::json::Object *peak = root->getObject("peak_tflops");
  if (!peak)
    return fail("missing 'peak_tflops' (an object of dtype: TFLOP/s)");
  for (const char *dtype : {"bf16", "fp32"}) {
    double tflops = 0;
    if (auto e = number(*peak, dtype, "peak_tflops.", tflops))
      return std::move(e);
    c.peakFlops[dtype] = tflops * 1e12;
  }
  for (auto [key, bw, lat] :
       {std::tuple{"intra_node", &c.intraBandwidth, &c.intraLatency},
        std::tuple{"inter_node", &c.interBandwidth, &c.interLatency}}) {
    const llvm::json::Object *link = root->getObject(key);
    if (!link)
      return fail(llvm::Twine("missing '") + key +
                  "' (bandwidth_gb_per_s per GPU and latency_us)");
    std::string where = std::string(key) + ".";
    double gbps = 0, us = 0;
    if (auto e = number(*link, "bandwidth_gb_per_s", where, gbps))
      return std::move(e);
    if (auto e = number(*link, "latency_us", where, us))
      return std::move(e);
    *bw = gbps * 1e9;
    *lat = us * 1e-6;
  }
  if (const llvm::json::Object *gemm = root->getObject("gemm_efficiency")) {
    if (auto e = number(*gemm, "max", "gemm_efficiency.", c.gemmMax))
      return std::move(e);
    if (auto e = number(*gemm, "half_size", "gemm_efficiency.", c.gemmHalf))
      return std::move(e);
    if (c.gemmMax > 1)
      return fail("'gemm_efficiency.max' must be at most 1");
  }
  return c;
}

std::vector<std::string> Layout::flags(int64_t globalBatch) const {
  std::vector<std::string> f = {
      "--tp", std::to_string(tp), "--cp", std::to_string(cp), "--pp",
      std::to_string(pp), "--dp", std::to_string(dp), "--micro-batch-size",
      std::to_string(microBatch), "--global-batch-size",
      std::to_string(globalBatch)};
  if (vpp > 1)
    f.insert(f.end(), {"--vpp", std::to_string(vpp)});
  if (zeroBubble)
    f.insert(f.end(), {"--schedule", "zb-h1"});
  if (ep > 1)
    f.insert(f.end(), {"--ep", std::to_string(ep)});
  if (etp > 0)
    f.insert(f.end(), {"--etp", std::to_string(etp)});
  if (tp > 1)
    f.push_back("--sequence-parallel");
  if (tp > 1 && tpCommOverlap)
    f.push_back("--tp-comm-overlap");
  if (recompute == "full")
    f.insert(f.end(), {"--recompute-granularity", "full", "--recompute-method",
                       "uniform", "--recompute-num-layers", "1"});
  else if (recompute == "selective")
    f.insert(f.end(), {"--recompute-granularity", "selective"});
  if (distributedOptimizer && shardGrads && shardParams)
    f.insert(f.end(),
             {"--data-parallel-sharding-strategy", "optim_grads_params"});
  else if (distributedOptimizer && shardGrads)
    f.insert(f.end(), {"--data-parallel-sharding-strategy", "optim_grads"});
  else if (distributedOptimizer)
    f.push_back("--use-distributed-optimizer");
  if (dp * cp > 1 && overlapGradReduce)
    f.push_back("--overlap-grad-reduce");
  if (paramGatherOverlapped())
    f.push_back("--overlap-param-gather");
  if (bf16)
    f.push_back("--bf16");
  // bf16 activations are --bf16's default; the f32 ones are asked for.
  if (bf16 && !bf16Activations)
    f.insert(f.end(), {"--activations-dtype", "f32"});
  if (gradReduceBf16)
    f.push_back("--grad-reduce-in-bf16");
  return f;
}

void Layout::apply(TrainPipelineOptions &o, int64_t globalBatch) const {
  o.tp = tp;
  o.cp = cp;
  o.pp = pp;
  o.vpp = vpp;
  if (zeroBubble)
    o.schedule = "zb-h1";
  else if (o.schedule == "zb-h1")
    o.schedule = "auto";
  o.dp = dp;
  o.ep = ep;
  o.etp = etp;
  o.microBatchSize = microBatch;
  o.globalBatchSize = globalBatch;
  o.sequenceParallel = tp > 1;
  o.tpCommOverlap = tp > 1 && tpCommOverlap;
  o.bf16 = bf16;
  o.activationsDtype = bf16 && bf16Activations ? "bf16" : "f32";
  o.distributedOptimizer = distributedOptimizer;
  o.dataParallelShardingStrategy =
      !distributedOptimizer || !shardGrads ? ""
      : shardParams                        ? "optim_grads_params"
                                           : "optim_grads";
  o.overlapGradReduce = dp * cp > 1 && overlapGradReduce;
  o.overlapParamGather = paramGatherOverlapped();
  o.gradReduceInBf16 = bf16 && gradReduceBf16;
  o.recomputeGranularity = recompute == "none" ? "" : recompute;
  o.recomputeMethod = recompute == "full" ? "uniform" : "";
  o.recomputeNumLayers = recompute == "full" ? 1 : 0;
}

namespace {

//===----------------------------------------------------------------------===//
// Calibration
//===----------------------------------------------------------------------===//

/// What one stage (or one layer, or the embedding, or the head) costs per
/// microbatch of one sample.
struct Part {
  double fwdFlops = 0, bwdFlops = 0;
  /// Of those, the compute-bound ops' FLOPs; the bytes the others move.
  double fwdDense = 0, bwdDense = 0, fwdLight = 0, bwdLight = 0;
  /// Of the backward's, those of its weight gradients (W, from a
  /// calibration with the backward split; 0 otherwise).
  double wDense = 0, wLight = 0;
  /// What the input-gradient phase saves for W per microbatch (in the
  /// slot too under the zero-bubble schedule; not in slotBytes).
  double wSlotBytes = 0;
  double params = 0;    ///< elements, this rank's shard
  /// Of those, the experts' (reduced over edp, not dp x cp).
  double expertParams = 0;
  double slotBytes = 0; ///< inputs and saved activations of a microbatch
  double transient = 0; ///< the stage's transient peak
  /// The stage's point-to-point staging buffers (a stage's, not a sum:
  /// each chunk of a rank has its own).
  double staging = 0;
  /// Collective bytes per microbatch by group kind, with the ring factor
  /// applied later: (all-reduce bytes, gather/scatter bytes, count).
  std::map<std::string, std::array<double, 3>> comm;
  double p2pBytes = 0; ///< sent per microbatch, forward and backward
  /// Ring attention's K/V exchange per microbatch: (cp - 1) K/V blocks
  /// forward, K/V and their gradients backward (cp is applied later).
  double ringFwd = 0, ringBwd = 0;
  /// --tp-comm-overlap's fused collectives per microbatch, forward and
  /// backward (not in `comm`): their gather/scatter bytes, their count, and
  /// the FLOPs of the GEMMs they are pipelined with.
  double ovFwdBytes = 0, ovBwdBytes = 0, ovFwdCount = 0, ovBwdCount = 0;
  double ovFwdFlops = 0, ovBwdFlops = 0;

  /// this += f x o, for every quantity that adds up over layers (the
  /// transient peak is a stage's, not a sum).
  Part &axpy(double f, const Part &o) {
    for (auto [mine, theirs] :
         {std::pair{&fwdFlops, o.fwdFlops}, {&bwdFlops, o.bwdFlops},
          {&fwdDense, o.fwdDense}, {&bwdDense, o.bwdDense},
          {&fwdLight, o.fwdLight}, {&bwdLight, o.bwdLight},
          {&wDense, o.wDense}, {&wLight, o.wLight},
          {&wSlotBytes, o.wSlotBytes},
          {&params, o.params}, {&expertParams, o.expertParams},
          {&slotBytes, o.slotBytes},
          {&p2pBytes, o.p2pBytes}, {&ringFwd, o.ringFwd},
          {&ringBwd, o.ringBwd}, {&ovFwdBytes, o.ovFwdBytes},
          {&ovBwdBytes, o.ovBwdBytes}, {&ovFwdCount, o.ovFwdCount},
          {&ovBwdCount, o.ovBwdCount},
          {&ovFwdFlops, o.ovFwdFlops}, {&ovBwdFlops, o.ovBwdFlops}})
      *mine += f * theirs;
    for (auto &[k, v] : o.comm)
      for (int i = 0; i < 3; ++i)
        comm[k][i] += f * v[i];
    return *this;
  }
  Part operator-(const Part &o) const { return Part(*this).axpy(-1, o); }
  Part scaled(double f) const {
    Part r;
    r.transient = transient;
    r.staging = staging;
    return r.axpy(f, *this);
  }
};

struct Calibration {
  Part embedding, layer, head;
  double p2pBytes = 0; ///< a middle stage's sends per microbatch (both ways)
  double firstTransient = 0, middleTransient = 0, lastTransient = 0;
  double firstStaging = 0, middleStaging = 0, lastStaging = 0;
  /// Under the zero-bubble schedule the first stage sends nothing back: its
  /// B only receives and W is its whole backward; what it saves for W is
  /// the gradient it receives (not a layer's share).
  double firstWSlotBytes = 0;
};

int64_t bytesOf(Type t) {
  auto m = dyn_cast<MemRefType>(t);
  if (!m || !m.hasStaticShape())
    return 0;
  return m.getNumElements() * int64_t(m.getElementTypeBitWidth() / 8);
}

/// One pipeline rank's numbers from the rt-level program.
Part readStage(ModuleOp program) {
  Part p;
  // The experts' weights: those the grouped GEMMs read.
  llvm::StringSet<> experts;
  program.walk([&](rt::GroupedLinearOp g) {
    if (auto get = g->getOperand(2).getDefiningOp<rt::GetOp>())
      experts.insert(get.getBuffer());
  });
  for (auto buf : program.getOps<rt::BufferOp>())
    if (buf.getKind() == rt::BufferKind::Param) {
      double n = double(cast<MemRefType>(buf.getType()).getNumElements());
      p.params += n;
      if (experts.contains(buf.getSymName()))
        p.expertParams += n;
    }
  for (auto f : program.getOps<func::FuncOp>()) {
    StringRef name = f.getSymName();
    // A split backward's W ("backward_w_c0") is part of the backward.
    bool fwd = name.contains("forward_c"), w = name.contains("backward_w_c"),
         bwd = name.contains("backward_c") || w;
    // A last microbatch's variant ("backward_c0:last") replaces a run; it
    // adds none.
    if ((!fwd && !bwd) || name.ends_with(":last"))
      continue;
    auto read = [&](StringRef attr, double &fwdOut, double &bwdOut) {
      if (auto a = f->getAttrOfType<IntegerAttr>(attr))
        (fwd ? fwdOut : bwdOut) += double(a.getInt());
    };
    // The receive and send parts ("recv:forward_c0") hold only transfers.
    if (!name.contains(':')) {
      read("rt.flops", p.fwdFlops, p.bwdFlops);
      read("rt.dense_flops", p.fwdDense, p.bwdDense);
      read("rt.light_bytes", p.fwdLight, p.bwdLight);
      if (w) {
        double unused = 0;
        read("rt.dense_flops", unused, p.wDense);
        read("rt.light_bytes", unused, p.wLight);
      }
    }
    if (auto slot = f->getAttrOfType<IntegerAttr>("rt.slot_bytes"))
      p.slotBytes = double(slot.getInt());
    f.walk([&](Operation *op) {
      StringRef kind = op->getName().getStringRef();
      int64_t bytes = 0;
      for (Value v : op->getOperands())
        bytes = std::max(bytes, bytesOf(v.getType()));
      if (kind == "rt.send") {
        p.p2pBytes += double(bytes);
        return;
      }
      // Expert parallelism's exchanges: this rank's routed rows go to (and
      // come back from) the etp ranks of their experts' run; the operands
      // with room for every rank's rows do not count.
      if (kind == "rt.expert_dispatch" || kind == "rt.expert_combine") {
        auto iattrs = op->getAttrOfType<DenseI64ArrayAttr>("iattrs");
        auto group = op->getAttrOfType<StringAttr>("group");
        const int64_t etp = iattrs && iattrs.size() > 1 ? iattrs[1] : 1;
        Value rows = op->getOperand(kind == "rt.expert_dispatch" ? 0 : 3);
        if (group) {
          p.comm[group.str()][1] += double(bytesOf(rows.getType()) * etp);
          p.comm[group.str()][2] += 1;
        }
        return;
      }
      // --tp-comm-overlap's GEMMs with their ring exchanges: the gathered
      // rows (all_gather_gemm's Xg) or the unreduced product (rows of A
      // times Y's columns) travel, as in the all-gather or reduce-scatter.
      if (kind == "rt.all_gather_gemm" || kind == "rt.gemm_reduce_scatter") {
        auto shape = [&](int i) {
          return cast<MemRefType>(op->getOperand(i).getType()).getShape();
        };
        auto numel = [&](int i) {
          return double(cast<MemRefType>(op->getOperand(i).getType())
                            .getNumElements());
        };
        const bool gather = kind == "rt.all_gather_gemm";
        // The product's rows x columns, and its inner dimension.
        double k = double(shape(0).back());
        double rows = numel(gather ? 2 : 0) / k;
        double cols = double(shape(3).back());
        double moved = gather ? double(bytesOf(op->getOperand(2).getType()))
                              : rows * cols * 4;
        (fwd ? p.ovFwdBytes : p.ovBwdBytes) += moved;
        (fwd ? p.ovFwdFlops : p.ovBwdFlops) += 2 * rows * cols * k;
        (fwd ? p.ovFwdCount : p.ovBwdCount) += 1;
        return;
      }
      // The K and V thirds of the QKV operand go around the ring, in the
      // instruction's kv_format (bf16 under bf16 activations); the
      // backward's dK/dV blocks follow them in f32.
      if (kind == "rt.ring_attention" || kind == "rt.ring_attention_grad") {
        double f32 = 2.0 / 3.0 * double(bytesOf(op->getOperand(0).getType()));
        auto iattrs = op->getAttrOfType<DenseI64ArrayAttr>("iattrs");
        double kv = iattrs && iattrs.size() > 2 && iattrs[2] != 0 ? f32 / 2
                                                                  : f32;
        (kind == "rt.ring_attention" ? p.ringFwd : p.ringBwd) +=
            kind == "rt.ring_attention" ? kv : kv + f32;
        return;
      }
      auto group = op->getAttrOfType<StringAttr>("group");
      if (!group)
        return;
      if (kind == "rt.all_reduce" || kind == "rt.all_reduce_start") {
        p.comm[group.str()][0] += double(bytes);
        p.comm[group.str()][2] += 1;
      } else if (kind == "rt.all_gather" || kind == "rt.reduce_scatter" ||
                 kind == "rt.reduce_scatter_start" || kind == "rt.all_to_all") {
        p.comm[group.str()][1] += double(bytes);
        p.comm[group.str()][2] += 1;
      }
    });
  }
  // The send and receive staging buffers: activation buffers outside the
  // chunks' slot regions (persistent, one set per chunk).
  std::vector<std::pair<int64_t, int64_t>> regions;
  for (auto f : program.getOps<func::FuncOp>())
    if (auto base = f->getAttrOfType<IntegerAttr>("rt.slot_base"))
      if (auto bytes = f->getAttrOfType<IntegerAttr>("rt.slot_bytes"))
        if (auto n = f->getAttrOfType<IntegerAttr>("rt.num_slots"))
          regions.push_back(
              {base.getInt(), base.getInt() + bytes.getInt() * n.getInt()});
  for (auto buf : program.getOps<rt::BufferOp>()) {
    if (buf.getKind() != rt::BufferKind::Activation)
      continue;
    // What B saves for W: the slot minus these is the unsplit backward's
    // (each buffer of the slot takes its size rounded up to 64 bytes).
    if (buf.getForWeightGrad()) {
      double bytes = double((bytesOf(buf.getType()) + 63) / 64 * 64);
      p.wSlotBytes += bytes;
      p.slotBytes -= bytes;
      continue;
    }
    const int64_t at = int64_t(buf.getOffset());
    if (llvm::none_of(regions, [&](auto r) { return at >= r.first && at < r.second; }))
      p.staging += double(bytesOf(buf.getType()));
  }
  int64_t arena = program->getAttrOfType<IntegerAttr>("rt.arena_bytes").getInt();
  int64_t persistent =
      program->getAttrOfType<IntegerAttr>("rt.persistent_bytes").getInt();
  p.transient = double(arena - persistent);
  return p;
}

/// Builds the model for a compile: a copy of the given module, or the GPT
/// of the options with `layers` layers.
OwningOpRef<ModuleOp> buildModel(MLIRContext &ctx, const PlanOptions &options,
                                 int64_t layers) {
  if (options.module)
    return cast<ModuleOp>(options.module->clone());
  GPTConfig config = options.model;
  config.layers = layers;
  return buildGPT(&ctx, config);
}

/// The sizes the search needs from an nn-level module: its layers, and from
/// its first attention the heads, the sequence and the hidden size.
llvm::Error describeModule(ModuleOp module, GPTConfig &g) {
  auto fail = [](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
  };
  FailureOr<int64_t> layers = getNumLayers(module);
  if (failed(layers))
    return fail("the model's layer marks (nn.layer) are not contiguous");
  if (*layers < 3)
    return fail("tessera-plan needs a model of at least 3 layers (nn.layer); "
                "it has " + llvm::Twine(*layers));
  Operation *attention = nullptr;
  module.walk([&](Operation *op) {
    if (!attention && op->getName().getStringRef() == "nn.attention")
      attention = op;
  });
  auto heads = attention ? attention->getAttrOfType<IntegerAttr>("num_heads")
                         : IntegerAttr();
  auto qkv = attention ? dyn_cast<RankedTensorType>(attention->getOperand(0).getType())
                       : RankedTensorType();
  if (!heads || !qkv || qkv.getRank() != 3 || qkv.isDynamicDim(0) ||
      qkv.isDynamicDim(2))
    return fail("tessera-plan plans transformers: the model has no nn.attention "
                "with a static [seq, batch, 3 x hidden] input");
  g.layers = *layers;
  g.heads = heads.getInt();
  g.seq = qkv.getDimSize(0);
  // The attention's features (heads x head dim), or the hidden size the
  // first embedding gives (they differ under --kv-channels).
  g.hidden = qkv.getDimSize(2) / 3;
  g.vocab = 0; // reported only: the vocabulary of the first embedding
  g.numExperts = 0;
  bool embedded = false;
  module.walk([&](Operation *op) {
    if (op->getName().getStringRef() == "nn.moe_dispatch" && !g.numExperts)
      if (auto e = op->getAttrOfType<IntegerAttr>("num_experts"))
        g.numExperts = e.getInt();
    if (auto v = op->getAttrOfType<IntegerAttr>("vocab_size"); v && !g.vocab)
      g.vocab = v.getInt();
    if (op->getName().getStringRef() == "nn.embedding" && !embedded)
      if (auto t = dyn_cast<RankedTensorType>(op->getResult(0).getType());
          t && !t.isDynamicDim(t.getRank() - 1)) {
        g.hidden = t.getDimSize(t.getRank() - 1);
        embedded = true;
      }
  });
  return llvm::Error::success();
}

/// Runs the training pipeline on `module`; the diagnostics are collected.
LogicalResult compileModule(MLIRContext &ctx, ModuleOp module,
                            const TrainPipelineOptions &options,
                            std::string &error) {
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
    if (d.getSeverity() == DiagnosticSeverity::Error && error.empty())
      error = d.str();
    return success();
  });
  PassManager pm(&ctx);
  buildTrainPipeline(pm, options);
  return pm.run(module);
}

/// Compiles the model at pp 3 (one layer, the middle, one layer) for
/// (tp, cp, recompute) at micro-batch size 1 and splits it into parts.
llvm::Expected<Calibration> calibrate(MLIRContext &ctx,
                                      const PlanOptions &options, int64_t tp,
                                      int64_t cp, int64_t ep, int64_t etp,
                                      const std::string &recompute,
                                      bool zeroBubble) {
  // A module is compiled whole (its layers are not ours to remove).
  int64_t middle = 1;
  if (options.module) {
    FailureOr<int64_t> layers = getNumLayers(options.module);
    middle = succeeded(layers) ? *layers - 2 : 1;
  }
  OwningOpRef<ModuleOp> module = buildModel(ctx, options, middle + 2);
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = 3;
  l.ep = ep;
  l.etp = etp;
  // Expert parallelism needs ep x etp ranks among tp x cp x dp: the
  // fewest data-parallel ranks that make room (each runs the same three
  // microbatches of one sample).
  const int64_t experts = ep * std::max<int64_t>(etp, 1);
  l.dp = experts / std::gcd(tp * cp, experts);
  l.recompute = recompute;
  // In the planned precision: under bf16 the GEMMs keep bf16 copies of
  // their activation operands for the backward, the rest stays fp32; with
  // 16-bit activations under bf16 the compile stores them all in bf16.
  // 16-bit activations without bf16 halve an fp32 compile, where every
  // activation is f32.
  l.bf16 = options.bf16;
  l.bf16Activations = options.bf16 && options.activationBytes == 2;
  l.overlapGradReduce = false; // the dp reductions are modelled, not read
  l.overlapParamGather = false;
  // The sequence-parallel collectives fused with their GEMMs, so that they
  // are read apart from the others (the same bytes either way): a layout
  // without --tp-comm-overlap costs them as plain collectives.
  l.tpCommOverlap = true;
  // The zero-bubble schedule's calibration: the backward split, for W's
  // FLOPs and what B saves for it.
  l.zeroBubble = zeroBubble;
  TrainPipelineOptions o;
  l.apply(o, /*globalBatch=*/3 * l.dp);
  o.ppLayers = llvm::ArrayRef<int64_t>{1, middle, 1};
  std::string error;
  if (failed(compileModule(ctx, *module, o, error)))
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "calibration compile (tp %lld, cp %lld, ep %lld, etp %lld, recompute "
        "%s%s) failed: %s",
        (long long)tp, (long long)cp, (long long)ep, (long long)etp,
        recompute.c_str(), zeroBubble ? ", zb-h1" : "", error.c_str());
  std::map<int64_t, Part> stages;
  // Activation bytes as the options model them: the compile's own (bf16
  // activations, or fp32 ones under --activations fp32, but for the GEMMs'
  // bf16 operand copies in bf16), or an fp32 compile's halved.
  const double act = l.bf16Activations ? 1.0 : options.activationBytes / 4.0;
  for (ModuleOp program : getPrograms(*module)) {
    Part p = readStage(program);
    p.fwdLight *= act;
    p.bwdLight *= act;
    p.wLight *= act;
    p.slotBytes *= act;
    p.wSlotBytes *= act;
    p.transient *= act;
    p.staging *= act;
    p.p2pBytes *= act;
    p.ringFwd *= act;
    p.ringBwd *= act;
    p.ovFwdBytes *= act;
    p.ovBwdBytes *= act;
    for (auto &[kind, v] : p.comm) {
      v[0] *= act; // bytes, not the count of collectives
      v[1] *= act;
    }
    stages[program->getAttrOfType<IntegerAttr>(kPpRankAttr).getInt()] = p;
  }
  // Per microbatch: the compile ran 3 microbatches of one sample.
  Calibration c;
  c.layer = stages[1].scaled(1.0 / double(middle));
  c.embedding = stages[0] - c.layer;
  c.head = stages[2] - c.layer;
  c.p2pBytes = stages[1].p2pBytes;
  c.firstTransient = stages[0].transient;
  c.middleTransient = stages[1].transient;
  c.lastTransient = stages[2].transient;
  c.firstStaging = stages[0].staging;
  c.firstWSlotBytes = stages[0].wSlotBytes;
  c.middleStaging = stages[1].staging;
  c.lastStaging = stages[2].staging;
  return c;
}

//===----------------------------------------------------------------------===//
// Evaluation
//===----------------------------------------------------------------------===//

struct ScheduleFacts {
  std::vector<schedule::RankSchedule> ranks;
  /// Microbatches in flight per (pp rank, chunk).
  std::vector<std::vector<int64_t>> inFlight;
};

class Evaluator {
public:
  Evaluator(const Cluster &cluster, const PlanOptions &options)
      : cluster(cluster), options(options) {}

  /// The time of one collective over `n` ranks of `bytes`, by kind.
  double collective(double allReduceBytes, double gatherBytes, double count,
                    int64_t n, bool intra) const {
    if (n <= 1)
      return 0;
    double bw = intra ? cluster.intraBandwidth : cluster.interBandwidth;
    double lat = intra ? cluster.intraLatency : cluster.interLatency;
    double f = double(n - 1) / double(n);
    return count * lat * double(n - 1) +
           (2 * f * allReduceBytes + f * gatherBytes) / bw;
  }

  static schedule::PipelineConfig scheduleConfig(int64_t pp, int64_t vpp,
                                                 int64_t m, bool zb = false) {
    schedule::PipelineConfig config;
    config.pp = pp;
    config.vpp = vpp;
    config.microbatches = m;
    config.layers = pp * vpp;
    config.kind = pp == 1   ? schedule::Kind::None
                  : zb      ? schedule::Kind::ZbH1
                  : vpp > 1 ? schedule::Kind::Interleaved
                            : schedule::Kind::OneFOneB;
    return config;
  }

  /// The schedule's order per rank, and the microbatches each (rank, chunk)
  /// has in flight at most.
  const ScheduleFacts &orders(int64_t pp, int64_t vpp, int64_t m,
                              bool zb = false) {
    auto [it, inserted] = orderCache.try_emplace(
        std::make_tuple(pp, vpp, m, zb), ScheduleFacts());
    if (!inserted)
      return it->second;
    ScheduleFacts &f = it->second;
    f.ranks = schedule::buildSchedule(scheduleConfig(pp, vpp, m, zb));
    f.inFlight.assign(size_t(pp), std::vector<int64_t>(size_t(vpp), 0));
    for (const schedule::RankSchedule &r : f.ranks) {
      std::vector<int64_t> now(size_t(vpp), 0);
      // A microbatch is in flight until its backward, or its W when the
      // schedule splits the backward.
      const bool split = llvm::any_of(
          r.order, [](const schedule::Step &s) { return s.weight; });
      for (const schedule::Step &s : r.order) {
        int64_t &n = now[size_t(s.chunk)];
        n += s.forward ? 1 : (s.weight || !split) ? -1 : 0;
        int64_t &peak = f.inFlight[size_t(r.ppRank)][size_t(s.chunk)];
        peak = std::max(peak, n);
      }
    }
    return f;
  }

  /// The schedule run with backward/forward time `ratio` (in steps of
  /// 1/20): makespan in forward times, and the bubble. Under the
  /// zero-bubble schedule (`weightRatio` >= 0) `ratio` is B's and
  /// `weightRatio` W's.
  std::pair<double, double> simulation(int64_t pp, int64_t vpp, int64_t m,
                                       double ratio, double weightRatio = -1) {
    const bool zb = weightRatio >= 0;
    int64_t key = std::max<int64_t>(1, std::lround(ratio * 20));
    int64_t wKey = zb ? std::max<int64_t>(1, std::lround(weightRatio * 20)) : -1;
    auto [it, inserted] = simCache.try_emplace(
        std::make_tuple(pp, vpp, m, key, wKey), 0.0, 0.0);
    if (!inserted)
      return it->second;
    const size_t stages = size_t(pp * vpp);
    schedule::Simulation sim = schedule::simulate(
        scheduleConfig(pp, vpp, m, zb), orders(pp, vpp, m, zb).ranks,
        std::vector<double>(stages, 1.0),
        std::vector<double>(stages, double(key) / 20.0),
        zb ? std::vector<double>(stages, double(wKey) / 20.0)
           : std::vector<double>());
    it->second = {sim.makespan, sim.bubbleFraction};
    return it->second;
  }

  Prediction evaluate(const Layout &l, const Calibration &cal,
                      const Calibration &modelCal) {
    Prediction p;
    p.layout = l;
    const GPTConfig &g = options.model;
    const int64_t stages = l.pp * l.vpp, perChunk = g.layers / stages;
    const int64_t m = options.globalBatch / (l.microBatch * l.dp);
    const double mb = double(l.microBatch);
    const double peak =
        cluster.peakFlops.at(options.bf16 ? "bf16" : "fp32");
    // The GEMMs' smaller side: the hidden shard, or the tokens of a
    // microbatch on this rank (the whole sequence share under sequence
    // parallelism, which gathers it before each GEMM).
    double d = std::min(double(g.hidden) / double(l.tp),
                        double(g.seq) * mb / double(l.cp));
    double eff = cluster.gemmMax * d / (d + cluster.gemmHalf);
    // A group's ranks are consecutive world ranks times its stride (order
    // tp-cp-ep-dp-pp): inside a node while stride x size fits one.
    auto intra = [&](int64_t stride, int64_t size) {
      return stride * size <= cluster.gpusPerNode;
    };
    const int64_t etp = l.etp > 0 ? l.etp : l.tp;
    // The experts' gradients reduce (and their optimizer state shards)
    // over the expert data-parallel group.
    const int64_t edp = l.tp * l.cp * l.dp / (etp * l.ep);
    auto groupSize = [&](StringRef kind) -> std::pair<int64_t, bool> {
      if (kind == "tp")
        return {l.tp, intra(1, l.tp)};
      if (kind == "cp")
        return {l.cp, intra(l.tp, l.cp)};
      if (kind == "tp-cp")
        return {l.tp * l.cp, intra(1, l.tp * l.cp)};
      // The expert layout (etp-ep-edp-pp, etp fastest: the same ranks
      // folded, as Megatron's).
      if (kind == "ep")
        return {l.ep, intra(etp, l.ep)};
      if (kind == "etp-ep")
        return {etp * l.ep, intra(1, etp * l.ep)};
      if (kind == "etp")
        return {etp, intra(1, etp)};
      return {1, true};
    };
    // One virtual stage's parts, per microbatch of one sample.
    auto stagePart = [&](int64_t s, const Calibration &c) {
      Part part = c.layer.scaled(double(perChunk));
      if (s == 0)
        part.axpy(1, c.embedding);
      if (s == stages - 1)
        part.axpy(1, c.head);
      return part;
    };
    double tf = 0, tb = 0, tw = 0, commInStage = 0;
    const bool zb = l.zeroBubble;
    const bool ppIntra = intra(l.tp * l.cp * l.dp, 2);
    for (int64_t s = 0; s < stages; ++s) {
      Part part = stagePart(s, cal);
      double comm = 0;
      for (auto &[kind, v] : part.comm) {
        auto [n, in] = groupSize(kind);
        comm += collective(v[0] * mb, v[1] * mb, v[2], n, in);
      }
      // Each direction receives one boundary's activation or gradient.
      double p2p = stages > 1
                       ? (ppIntra ? cluster.intraLatency : cluster.interLatency) +
                             cal.p2pBytes / 2 * mb /
                                 (ppIntra ? cluster.intraBandwidth
                                          : cluster.interBandwidth)
                       : 0;
      // Ring attention's exchange, counted as not overlapped with the
      // attention blocks (pessimistic for long sequences).
      double ringF = 0, ringB = 0;
      if (l.cp > 1) {
        bool in = intra(l.tp, l.cp);
        double bw = in ? cluster.intraBandwidth : cluster.interBandwidth;
        double lat = in ? cluster.intraLatency : cluster.interLatency;
        double hops = double(l.cp - 1);
        ringF = part.ringFwd * mb * hops / bw + lat * hops * perChunk;
        ringB = part.ringBwd * mb * hops / bw + lat * hops * perChunk;
        comm += ringF + ringB;
      }
      // Collectives split between the directions like the FLOPs.
      double total = part.fwdFlops + part.bwdFlops;
      double fwdShare = total > 0 ? part.fwdFlops / total : 0.5;
      // Compute-bound ops at the GEMM efficiency, the others at the memory
      // bandwidth (their FLOPs are noise next to their bytes).
      double coll = comm - ringF - ringB;
      double denseF = part.fwdDense * mb / (peak * eff),
             denseB = part.bwdDense * mb / (peak * eff);
      double collF = coll * fwdShare, collB = coll * (1 - fwdShare);
      // The sequence-parallel gathers and reduce-scatters beside the
      // column- and row-parallel GEMMs; with --tp-comm-overlap each
      // phase's exchanges run under those GEMMs, exposed only where they
      // take longer. Of a ring's n blocks of GEMM, n - 1 have a transfer
      // under them (the last block's has none).
      double ovF = 0, ovB = 0;
      if (part.ovFwdBytes + part.ovBwdBytes > 0) {
        auto [n, in] = groupSize("tp");
        ovF = collective(0, part.ovFwdBytes * mb, part.ovFwdCount, n, in);
        ovB = collective(0, part.ovBwdBytes * mb, part.ovBwdCount, n, in);
        if (l.tpCommOverlap && n > 1) {
          const double under = double(n - 1) / double(n) * mb / (peak * eff);
          ovF = std::max(0.0, ovF - part.ovFwdFlops * under);
          ovB = std::max(0.0, ovB - part.ovBwdFlops * under);
        }
        comm += ovF + ovB;
      }
      // ZeRO-3: each microbatch's forward and backward all-gather the
      // chunk's parameter buckets before their readers (the dense ones
      // over dp x cp, the experts' over edp). Only the first pipeline
      // stage cuts its buffer into Megatron's buckets (max(40M, 1M x d)
      // elements); a later stage's chunk is one bucket. With the prefetch
      // (--overlap-param-gather) each bucket's gather runs under the
      // previous bucket's compute: the first is exposed, the rest only
      // where they take longer than the compute they run under.
      double z3f = 0, z3b = 0;
      if (l.shardParams) {
        const double paramBytes = options.bf16 ? 2 : 4;
        const int64_t group = l.dp * l.cp;
        const double dense = part.params - part.expertParams;
        const double bucket = s % l.pp == 0
                                  ? std::max(4e7, 1e6 * double(group))
                                  : std::max(1.0, part.params);
        const double buckets =
            std::max(1.0, std::ceil(dense / bucket)) +
            (part.expertParams > 0 ? std::ceil(part.expertParams / bucket) : 0);
        const double z3 =
            collective(0, dense * paramBytes, std::ceil(dense / bucket), group,
                       intra(l.tp, group)) +
            collective(0, part.expertParams * paramBytes,
                       std::ceil(part.expertParams / bucket), edp,
                       intra(etp * l.ep, edp));
        z3f = z3b = z3;
        if (l.paramGatherOverlapped()) {
          const double first = z3 / buckets;
          z3f = first + std::max(0.0, z3 - first - denseF * (buckets - 1) / buckets);
          z3b = first + std::max(0.0, z3 - first - denseB * (buckets - 1) / buckets);
        }
        comm += z3f + z3b;
      }
      double f = denseF + part.fwdLight * mb / cluster.hbmBandwidth +
                 collF + ovF + ringF + p2p + z3f;
      double b = denseB + part.bwdLight * mb / cluster.hbmBandwidth +
                 collB + ovB + ringB + p2p + z3b;
      // The zero-bubble schedule runs W, the weight gradients' GEMMs and
      // reductions, apart: B is the rest of the backward.
      if (zb) {
        // (The first stage's B only receives: all its compute is W's.)
        const bool first = s == 0;
        double w = (first ? part.bwdDense : part.wDense) * mb / (peak * eff) +
                   (first ? part.bwdLight : part.wLight) * mb /
                       cluster.hbmBandwidth;
        // The backward's collectives split with its GEMMs' FLOPs (W's
        // gather the inputs of the weight GEMMs under sequence
        // parallelism).
        if (part.bwdDense > 0)
          w += collB * (first ? 1.0 : part.wDense / part.bwdDense);
        // ZeRO-3: the phase that reads the parameters gathers them: B on
        // later stages, W on the first (its B reads none).
        if (first)
          w += z3b;
        b = std::max(b - w, 0.0);
        tw = std::max(tw, w);
        p.stageWeight.push_back(w);
      }
      tf = std::max(tf, f);
      tb = std::max(tb, b);
      p.stageForward.push_back(f);
      p.stageBackward.push_back(b);
      commInStage = std::max(commInStage, comm + 2 * p2p);
    }
    if (!(tf > 0) || !(tb > 0)) {
      p.reason = "no cost (the phases have no costed ops)";
      return p;
    }
    const ScheduleFacts &sf = orders(l.pp, l.vpp, m, zb);

    // Per pipeline rank: parameters, memory; the fullest rank counts.
    double worstMem = 0, worstDp = 0, worstOpt = 0;
    const double gradBytes = options.gradReduceBf16 ? 2 : 4,
                 paramBytes = options.bf16 ? 2 : 4;
    const double stateBytes = options.bf16 ? 12 : 8; // main fp32 + Adam
    // Gradients are reduced over dp x cp ("dp-cp", Megatron's
    // data-parallel group with context parallelism), which also shards the
    // distributed optimizer's state.
    const int64_t gradGroup = l.dp * l.cp;
    const int64_t dpOpt = l.distributedOptimizer ? gradGroup : 1;
    const int64_t edpOpt = l.distributedOptimizer ? edp : 1;
    for (int64_t r = 0; r < l.pp; ++r) {
      double params = 0, expertParams = 0, act = 0, transient = 0;
      double maxChunkParams = 0;
      for (int64_t c = 0; c < l.vpp; ++c) {
        int64_t s = c * l.pp + r;
        Part part = stagePart(s, cal);
        params += part.params;
        maxChunkParams = std::max(maxChunkParams, part.params);
        expertParams += part.expertParams;
        // Under the zero-bubble schedule a slot also keeps what B saved
        // for W.
        act += double(sf.inFlight[size_t(r)][size_t(c)]) * mb *
               (part.slotBytes +
                (!zb ? 0.0 : s == 0 ? cal.firstWSlotBytes : part.wSlotBytes));
        double t = s == stages - 1 ? cal.lastTransient
                   : s == 0        ? cal.firstTransient
                                   : cal.middleTransient;
        transient = std::max(transient, t * mb);
        // Each chunk's own send and receive staging (none without
        // pipelines).
        if (stages > 1)
          act += mb * (s == stages - 1 ? cal.lastStaging
                       : s == 0        ? cal.firstStaging
                                       : cal.middleStaging);
      }
      const double dense = params - expertParams;
      // ZeRO-2: the gradients' shards, plus the whole gradients of the
      // bucket being reduced (Megatron's default bucket, max(40M, 1M x
      // dp) elements), counted on top of the activations (it lives
      // through the backward).
      const bool zero2 = l.distributedOptimizer && l.shardGrads;
      // ZeRO-3: the parameters' shards, plus the gathered buckets of them
      // live at once (a transient, counted on top like ZeRO-2's): one, two
      // with the prefetch; a bucket of Megatron's size on the first stage,
      // a whole chunk on a later one.
      const double gatheredBucket =
          r == 0 ? std::min(params, std::max(4e7, 1e6 * double(gradGroup)))
                 : maxChunkParams;
      const double paramMem =
          zero2 && l.shardParams
              ? paramBytes * (dense / double(dpOpt) +
                              expertParams / double(edpOpt)) +
                    paramBytes * std::min(params,
                                          gatheredBucket *
                                              (l.paramGatherOverlapped() ? 2 : 1))
              : params * paramBytes;
      const double grads =
          zero2 ? gradBytes * (dense / double(dpOpt) +
                               expertParams / double(edpOpt)) +
                      gradBytes * std::min(params,
                                           std::max(4e7, 1e6 * double(gradGroup)))
                : gradBytes * params;
      double mem = paramMem + grads +
                   stateBytes * (dense / double(dpOpt) +
                                 expertParams / double(edpOpt)) +
                   act + transient;
      if (mem > worstMem) {
        worstMem = mem;
        p.fullestPpRank = r;
      }
      // Data-parallel reductions of this rank's gradients (and the
      // parameters' all-gather with the distributed optimizer).
      bool dpIntra = intra(l.tp, gradGroup);
      bool edpIntra = intra(etp * l.ep, edp);
      // The gradients' all-reduce, or with the distributed optimizer their
      // reduce-scatter, overlaps the last microbatch's backward on this
      // rank (--overlap-grad-reduce) or follows it; the distributed
      // optimizer's all-gather of the updated parameters runs in the step.
      // The experts' run over edp.
      auto reduceOver = [&](double n, int64_t group, bool in) {
        return l.distributedOptimizer
                   ? collective(0, n * gradBytes, 1, group, in)
                   : collective(n * gradBytes, 0, 1, group, in);
      };
      auto gatherOver = [&](double n, int64_t group, bool in) {
        return l.distributedOptimizer
                   ? collective(0, n * paramBytes, 1, group, in)
                   : 0.0;
      };
      double reduce = reduceOver(dense, gradGroup, dpIntra) +
                      reduceOver(expertParams, edp, edpIntra);
      // (ZeRO-3 gathers in the phases, above, not after the step.)
      double gather = l.shardParams
                          ? 0.0
                          : gatherOver(dense, gradGroup, dpIntra) +
                                gatherOver(expertParams, edp, edpIntra);
      // The reductions start in the last microbatch's backward (in its W
      // under the zero-bubble schedule) and overlap what follows it.
      const double lastBackward = zb ? tw : double(l.vpp) * tb;
      double hidden = options.overlapGradReduce ? lastBackward : 0.0;
      // --overlap-param-gather: the all-gather runs behind the next
      // iteration's first forward on this rank.
      if (l.paramGatherOverlapped())
        gather = std::max(0.0, gather - double(l.vpp) * tf);
      // ZeRO-2 reduces every microbatch's gradients under its own
      // backward (m times the traffic, each hidden by one backward).
      if (l.distributedOptimizer && l.shardGrads)
        worstDp = std::max(worstDp, double(m) * std::max(0.0, reduce -
                                                                  lastBackward) +
                                        gather);
      else
        worstDp = std::max(worstDp, std::max(0.0, reduce - hidden) + gather);
      worstOpt = std::max(worstOpt, (dense / double(dpOpt) +
                                     expertParams / double(edpOpt)) *
                                        30.0 / cluster.hbmBandwidth);
    }
    p.memoryBytes = worstMem;
    double usable = cluster.memoryBytes * cluster.usableMemory;
    p.feasible = worstMem <= usable;
    if (!p.feasible) {
      // Not simulated: a layout that does not fit has no time.
      p.reason = "memory";
      return p;
    }
    auto [makespanUnits, bubble] =
        simulation(l.pp, l.vpp, m, tb / tf, zb ? tw / tf : -1.0);
    p.bubbleFraction = bubble;
    p.afterPipelineSeconds = worstDp + worstOpt;
    p.stepSeconds = makespanUnits * tf + p.afterPipelineSeconds;
    p.exposedCommSeconds =
        commInStage * double(m) * double(l.vpp) + worstDp;

    // FLOPs of a step over all GPUs: each rank's share times tp x cp.
    auto stepFlops = [&](const Calibration &c) {
      double f = 0;
      for (int64_t s = 0; s < stages; ++s) {
        Part part = stagePart(s, c);
        f += part.fwdFlops + part.bwdFlops;
      }
      return f * mb * double(m) * double(l.dp) * double(l.tp * l.cp);
    };
    double gpus = double(l.tp * l.cp * l.pp * l.dp);
    p.tflopsPerGpu = stepFlops(cal) / p.stepSeconds / gpus / 1e12;
    p.mfu = stepFlops(modelCal) / p.stepSeconds / gpus / peak;
    return p;
  }

  /// Simulates the schedule again with each stage's own times (the search
  /// runs every stage at the slowest one's), and rescales the rates.
  void refine(Prediction &p) {
    const Layout &l = p.layout;
    if (l.pp == 1 || p.stageForward.empty())
      return;
    const int64_t m = options.globalBatch / (l.microBatch * l.dp);
    schedule::Simulation sim = schedule::simulate(
        scheduleConfig(l.pp, l.vpp, m, l.zeroBubble),
        orders(l.pp, l.vpp, m, l.zeroBubble).ranks, p.stageForward,
        p.stageBackward, p.stageWeight);
    if (!sim.deadlock.empty())
      return;
    double step = sim.makespan + p.afterPipelineSeconds;
    p.tflopsPerGpu *= p.stepSeconds / step;
    p.mfu *= p.stepSeconds / step;
    p.stepSeconds = step;
    p.bubbleFraction = sim.bubbleFraction;
  }

private:
  const Cluster &cluster;
  const PlanOptions &options;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, ScheduleFacts>
      orderCache;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>,
           std::pair<double, double>>
      simCache;
};

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0)
      d.push_back(i);
  return d;
}

} // namespace

//===----------------------------------------------------------------------===//
// Search
//===----------------------------------------------------------------------===//

llvm::Expected<PlanResult> tessera::plan::plan(const Cluster &cluster,
                                               const PlanOptions &options) {
  auto start = std::chrono::steady_clock::now();
  auto fail = [](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
  };
  GPTConfig g = options.model;
  if (options.module) {
    if (llvm::Error e = describeModule(options.module, g))
      return std::move(e);
  } else if (std::string e = validateGPTConfig(g); !e.empty()) {
    return fail("invalid model: " + e);
  }
  const bool moe = g.numExperts > 0;
  if (!moe && (options.ep > 1 || options.etp > 0))
    return fail("--ep and --etp plan mixture-of-experts models; this model "
                "has no experts");
  // From here on, the options with the model's sizes.
  PlanOptions resolved = options;
  resolved.model = g;
  if (options.globalBatch <= 0)
    return fail("give --global-batch-size");
  const int64_t n = cluster.gpus();
  if (!cluster.peakFlops.count(options.bf16 ? "bf16" : "fp32"))
    return fail("the cluster has no peak for the training dtype");

  // The module's context, or one of our own for a GPT by flags.
  std::unique_ptr<MLIRContext> owned;
  if (!options.module) {
    DialectRegistry registry;
    tessera::registerAllDialects(registry);
    owned = std::make_unique<MLIRContext>(registry);
    owned->loadAllAvailableDialects();
    owned->printOpOnDiagnostic(false);
  }
  MLIRContext &ctx = owned ? *owned : *options.module->getContext();

  PlanResult result;
  using CalKey =
      std::tuple<int64_t, int64_t, int64_t, int64_t, std::string, bool>;
  std::map<CalKey, Calibration> cals;
  // A layout whose calibration does not compile is not feasible (the
  // compiler's error is its reason).
  std::map<CalKey, std::string> calErrors;
  auto calibration = [&](int64_t tp, int64_t cp, int64_t ep, int64_t etp,
                         const std::string &rc,
                         bool zb) -> const Calibration * {
    auto key = std::make_tuple(tp, cp, ep, etp, rc, zb);
    if (auto it = cals.find(key); it != cals.end())
      return &it->second;
    if (calErrors.count(key))
      return nullptr;
    llvm::Expected<Calibration> c =
        calibrate(ctx, resolved, tp, cp, ep, etp, rc, zb);
    ++result.calibrationCompiles;
    if (!c) {
      calErrors[key] = llvm::toString(c.takeError());
      return nullptr;
    }
    return &cals.emplace(key, *c).first->second;
  };

  Evaluator eval(cluster, resolved);
  std::vector<Prediction> all;
  std::vector<std::string> recomputes =
      options.recompute.empty()
          ? std::vector<std::string>{"none", "selective", "full"}
          : std::vector<std::string>{options.recompute};
  for (int64_t tp : divisors(cluster.gpusPerNode)) {
    if (n % tp || g.heads % tp || (options.tp && tp != options.tp))
      continue;
    for (int64_t cp : divisors(n / tp)) {
      if ((options.cp ? cp != options.cp : cp > 8) || g.seq % (2 * cp) ||
          (cp > 1 && tp > 1 && g.seq % (cp * tp)))
        continue;
      for (int64_t pp : divisors(n / (tp * cp))) {
        if (g.layers % pp || (options.pp && pp != options.pp) ||
            (pp > 1 && g.layers / pp < 1))
          continue;
        int64_t dp = n / (tp * cp * pp);
        // Mixture of experts: etp 1 or tp (Megatron's default), ep
        // dividing the experts, ep x etp dividing tp x cp x dp (the same
        // ranks, folded).
        std::vector<std::pair<int64_t, int64_t>> expertLayouts;
        if (!moe)
          expertLayouts.push_back({1, 0});
        for (int64_t etp : std::set<int64_t>{1, tp})
          for (int64_t ep : moe ? divisors(g.numExperts)
                                : std::vector<int64_t>{})
            if ((tp * cp * dp) % (ep * etp) == 0 &&
                (!options.ep || ep == options.ep) &&
                (!options.etp || etp == options.etp))
              expertLayouts.push_back({ep, etp});
        for (int64_t vpp : divisors(g.layers / pp)) {
          if ((options.vpp ? vpp != options.vpp : vpp > 8) ||
              (vpp > 1 && pp == 1))
            continue;
          for (int64_t mb : {1, 2, 4, 8}) {
            if ((options.microBatch && mb != options.microBatch) ||
                options.globalBatch % (mb * dp))
              continue;
            int64_t m = options.globalBatch / (mb * dp);
            if (vpp > 1 && m % pp)
              continue;
            for (auto [ep, etp] : expertLayouts)
            for (const std::string &rc : recomputes)
              for (bool dist : {false, true})
              for (bool shard : {false, true})
              for (bool shard3 : {false, true})
              for (bool zb : {false, true}) {
                // The zero-bubble schedule: pipelines without virtual
                // stages.
                if (zb && (pp == 1 || vpp > 1))
                  continue;
                if (options.zeroBubble >= 0 && pp > 1 && vpp == 1 &&
                    zb != bool(options.zeroBubble))
                  continue;
                // ZeRO-2 shards the distributed optimizer's gradients.
                if (shard && !dist)
                  continue;
                if (options.shardGrads >= 0 && shard != bool(options.shardGrads))
                  continue;
                // ZeRO-3 shards ZeRO-2's parameters.
                if (shard3 && !shard)
                  continue;
                if (options.shardParams >= 0 &&
                    shard3 != bool(options.shardParams))
                  continue;
                // Without sequence parallelism selective recompute is what
                // the attention kernels do anyway: the same layout as none.
                if (rc == "selective" && tp == 1 && options.recompute.empty())
                  continue;
                if (options.distributedOptimizer >= 0 &&
                    dist != bool(options.distributedOptimizer))
                  continue;
                if (dist && dp * cp == 1)
                  continue;
                Layout l;
                l.tp = tp;
                l.cp = cp;
                l.pp = pp;
                l.vpp = vpp;
                l.dp = dp;
                l.microBatch = mb;
                l.ep = ep;
                l.etp = etp;
                l.recompute = rc;
                l.distributedOptimizer = dist;
                l.shardGrads = shard;
                l.shardParams = shard3;
                l.overlapGradReduce = options.overlapGradReduce;
                l.overlapParamGather = options.overlapParamGather;
                l.gradReduceBf16 = options.gradReduceBf16;
                l.bf16 = options.bf16;
                l.bf16Activations =
                    options.bf16 && options.activationBytes == 2;
                l.zeroBubble = zb;
                l.tpCommOverlap = options.tpCommOverlap;
                ++result.candidates;
                const Calibration *cal = calibration(tp, cp, ep, etp, rc, zb);
                const Calibration *modelCal =
                    calibration(tp, cp, ep, etp, "none", false);
                if (!cal || !modelCal) {
                  Prediction p;
                  p.layout = l;
                  p.reason = "does not compile";
                  const std::string &e = calErrors[
                      cal ? std::make_tuple(tp, cp, ep, etp, std::string("none"),
                                            false)
                          : std::make_tuple(tp, cp, ep, etp, rc, zb)];
                  if (result.compileError.empty())
                    result.compileError = e;
                  all.push_back(p);
                  continue;
                }
                all.push_back(eval.evaluate(l, *cal, *modelCal));
              }
          }
        }
      }
    }
  }
  auto byTime = [](const Prediction &a, const Prediction &b) {
    if (a.feasible != b.feasible)
      return a.feasible;
    return a.stepSeconds < b.stepSeconds;
  };
  std::stable_sort(all.begin(), all.end(), byTime);
  // The best pipelines again, each stage at its own times (the embedding's
  // and the head's stages differ from the middle ones).
  for (size_t i = 0; i < all.size() && i < 64 && all[i].feasible; ++i)
    eval.refine(all[i]);
  std::stable_sort(all.begin(), all.end(), byTime);
  // The best few, compiled whole: the memory plan's bytes of the rank the
  // prediction found fullest.
  // (Not for 16-bit activations modelled on an fp32 compile, which has no
  // compiled counterpart.) A layout that does not compile whole is not
  // feasible; the next one is verified instead.
  const int64_t verify =
      options.activationBytes == 4 || options.bf16 ? options.verifyTop : 0;
  int64_t verified = 0;
  bool failedAny = false;
  for (Prediction &p : all) {
    if (verified >= verify || !p.feasible)
      break;
    OwningOpRef<ModuleOp> module = buildModel(ctx, resolved, g.layers);
    TrainPipelineOptions o;
    p.layout.apply(o, options.globalBatch);
    std::string error;
    FailureOr<std::vector<ProgramMemory>> memory = failure();
    if (succeeded(compileModule(ctx, *module, o, error)))
      memory = programMemory(*module);
    if (failed(memory)) {
      p.feasible = false;
      p.reason = "does not compile";
      if (result.compileError.empty())
        result.compileError = error;
      failedAny = true;
      continue;
    }
    ++verified;
    for (const ProgramMemory &pm : *memory)
      if (pm.ppRank == p.fullestPpRank)
        p.compiledMemoryBytes = double(pm.bytes.at("total"));
  }
  if (failedAny)
    std::stable_sort(all.begin(), all.end(),
                     [](const Prediction &a, const Prediction &b) {
                       return a.feasible && !b.feasible;
                     });
  result.ranked = std::move(all);
  result.model = g;
  result.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  return result;
}

std::string tessera::plan::explainNoLayout(const PlanResult &result,
                                          const Cluster &cluster) {
  double usable = cluster.memoryBytes * cluster.usableMemory / double(1 << 30);
  if (result.candidates == 0)
    return llvm::formatv(
        "no layout of {0} GPUs meets the restrictions (tp dividing the GPUs "
        "per node and the heads; cp up to 8, dividing seq / 2; pp dividing "
        "the layers; micro-batch size 1, 2, 4 or 8 dividing the batch of a "
        "dp rank; vpp > 1 only with pp > 1 and microbatches divisible by pp; "
        "the distributed optimizer only with dp x cp > 1; for experts, ep "
        "dividing them and etp 1 or tp, ep x etp dividing tp x cp x dp) and "
        "the flags given",
        cluster.gpus());
  double smallest = 0;
  int64_t compileFailures = 0;
  for (const Prediction &p : result.ranked) {
    if (p.reason == "memory" &&
        (smallest == 0 || p.memoryBytes < smallest))
      smallest = p.memoryBytes;
    compileFailures += p.reason == "does not compile";
  }
  if (compileFailures == result.candidates)
    return "no layout compiles: " + result.compileError;
  if (smallest == 0)
    return llvm::formatv("none of {0} layouts is feasible", result.candidates);
  return llvm::formatv("none of {0} layouts fits {1} GPUs: {2:F1} GiB usable "
                       "each ({3:F0} GiB x {4}), the smallest needs {5:F1} GiB",
                       result.candidates, cluster.gpus(), usable,
                       cluster.memoryBytes / double(1 << 30),
                       cluster.usableMemory, smallest / double(1 << 30));
}

void tessera::plan::printPlan(const PlanResult &result, const Cluster &cluster,
                              const PlanOptions &options, int64_t top,
                              bool text, llvm::raw_ostream &os) {
  const GPTConfig &g = result.model;
  std::map<std::string, int64_t> infeasible;
  for (const Prediction &p : result.ranked)
    if (!p.feasible)
      ++infeasible[p.reason];
  auto gib = [](double b) { return b / double(1 << 30); };
  if (text) {
    os << llvm::formatv("{0} layouts of {1} GPUs ({2}), {3} calibration "
                        "compiles, {4:F2} s\n",
                        result.candidates, cluster.gpus(), cluster.name,
                        result.calibrationCompiles, result.seconds);
    int64_t shown = 0;
    for (const Prediction &p : result.ranked) {
      if (!p.feasible || shown++ >= top)
        break;
      const Layout &l = p.layout;
      std::string experts =
          g.numExperts > 0
              ? llvm::formatv(" ep {0} etp {1}", l.ep, l.etp > 0 ? l.etp : l.tp)
                    .str()
              : std::string();
      os << llvm::formatv(
          "{0,2}. tp {1} cp {2} pp {3} vpp {4} dp {5}{14} mb {6} recompute "
          "{7}{8}{15}: {9:F3} s/step, {10:F1} TFLOP/s/GPU, MFU {11:F3}, bubble "
          "{12:F3}, {13:F1} GiB",
          shown, l.tp, l.cp, l.pp, l.vpp, l.dp, l.microBatch, l.recompute,
          l.distributedOptimizer
              ? (l.shardParams ? " zero3" : l.shardGrads ? " zero2" : " distopt")
              : "",
          p.stepSeconds,
          p.tflopsPerGpu, p.mfu, p.bubbleFraction, gib(p.memoryBytes),
          experts, l.zeroBubble ? " zb-h1" : "");
      if (p.compiledMemoryBytes > 0)
        os << llvm::formatv(" (compiled: {0:F1} GiB)", gib(p.compiledMemoryBytes));
      os << "\n";
    }
    for (auto &[reason, count] : infeasible)
      os << llvm::formatv("{0} layouts infeasible: {1}\n", count, reason);
    if (!result.compileError.empty())
      os << "first compile error: " << result.compileError << "\n";
    return;
  }
  llvm::json::OStream j(os, 1);
  j.object([&] {
    j.attribute("cluster", cluster.name);
    j.attribute("gpus", cluster.gpus());
    j.attributeObject("model", [&] {
      j.attribute("layers", g.layers);
      j.attribute("hidden", g.hidden);
      j.attribute("heads", g.heads);
      j.attribute("seq", g.seq);
      j.attribute("vocab", g.vocab);
      if (g.numExperts > 0)
        j.attribute("experts", g.numExperts);
      j.attribute("global_batch", options.globalBatch);
    });
    j.attribute("candidates", result.candidates);
    j.attribute("calibration_compiles", result.calibrationCompiles);
    j.attribute("seconds", result.seconds);
    j.attributeArray("ranked", [&] {
      int64_t shown = 0;
      for (const Prediction &p : result.ranked) {
        if (!p.feasible || shown++ >= top)
          break;
        const Layout &l = p.layout;
        j.object([&] {
          j.attribute("tp", l.tp);
          j.attribute("cp", l.cp);
          j.attribute("pp", l.pp);
          j.attribute("vpp", l.vpp);
          j.attribute("schedule", l.pp == 1         ? "none"
                                  : l.zeroBubble    ? "zb-h1"
                                  : l.vpp > 1       ? "interleaved"
                                                    : "1f1b");
          j.attribute("dp", l.dp);
          j.attribute("tp_comm_overlap", l.tp > 1 && l.tpCommOverlap);
          if (g.numExperts > 0) {
            j.attribute("ep", l.ep);
            j.attribute("etp", l.etp > 0 ? l.etp : l.tp);
          }
          j.attribute("micro_batch", l.microBatch);
          j.attribute("recompute", l.recompute);
          j.attribute("distributed_optimizer", l.distributedOptimizer);
          j.attribute("sharding_strategy",
                      !l.distributedOptimizer ? "no_shard"
                      : l.shardParams         ? "optim_grads_params"
                      : l.shardGrads          ? "optim_grads"
                                              : "optim");
          j.attribute("step_seconds", p.stepSeconds);
          j.attribute("tflops_per_gpu", p.tflopsPerGpu);
          j.attribute("mfu", p.mfu);
          j.attribute("bubble", p.bubbleFraction);
          j.attribute("exposed_comm_seconds", p.exposedCommSeconds);
          j.attribute("memory_gib", gib(p.memoryBytes));
          if (p.compiledMemoryBytes > 0) {
            j.attribute("compiled_memory_gib", gib(p.compiledMemoryBytes));
            j.attribute("memory_fit_error",
                        p.memoryBytes / p.compiledMemoryBytes - 1);
          }
          std::string flags;
          for (const std::string &f : l.flags(options.globalBatch))
            flags += (flags.empty() ? "" : " ") + f;
          j.attribute("flags", flags);
        });
      }
    });
    j.attributeObject("infeasible", [&] {
      for (auto &[reason, count] : infeasible)
        j.attribute(reason, count);
    });
    if (!result.compileError.empty())
      j.attribute("first_compile_error", result.compileError);
  });
  os << "\n";
}
