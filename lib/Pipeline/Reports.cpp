//===- Reports.cpp - tessera-compile --emit explanations ------------------===//

#include "tessera/Pipeline/Reports.h"
#include "dialects/dist/IR/DistOps.h"
#include "dialects/rt/IR/RTOps.h"
#include "tessera/Support/Model.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/ADT/StringSwitch.h"

#include <map>
#include <set>

using namespace tessera;

static const char *const kAxes[] = {"tp", "cp", "ep", "etp", "dp", "edp", "pp"};

static int64_t sizeOf(const mesh::MeshConfig &m, llvm::StringRef axis) {
  return llvm::StringSwitch<int64_t>(axis)
      .Case("tp", m.tp)
      .Case("cp", m.cp)
      .Case("ep", m.ep)
      .Case("etp", m.etp)
      .Case("dp", m.dp)
      .Case("edp", m.edp())
      .Case("pp", m.pp)
      .Default(1);
}

void tessera::printRankGroups(const mesh::MeshConfig &m, llvm::StringRef format,
                              llvm::raw_ostream &os) {
  const auto &kinds = mesh::standardGroupKinds();
  std::vector<std::vector<std::vector<int64_t>>> groups;
  for (const std::string &kind : kinds) {
    std::string error;
    groups.push_back(mesh::rankGroups(m, kind, error));
  }
  // index[k][r]: position of rank r in its group of kind k, or -1.
  std::vector<std::vector<int64_t>> index(
      kinds.size(), std::vector<int64_t>(m.worldSize(), -1));
  for (size_t k = 0; k < kinds.size(); ++k)
    for (auto &g : groups[k])
      for (size_t i = 0; i < g.size(); ++i)
        index[k][g[i]] = int64_t(i);

  if (format == "text") {
    os << llvm::formatv("world size {0}, order {1}\n", m.worldSize(), m.order);
    os << "sizes:";
    for (const char *axis : kAxes)
      os << " " << axis << "=" << sizeOf(m, axis);
    os << " vpp=" << m.vpp << "\n";
    for (size_t k = 0; k < kinds.size(); ++k) {
      os << llvm::formatv("\n{0} groups ({1}):\n", kinds[k], groups[k].size());
      for (auto [i, g] : llvm::enumerate(groups[k])) {
        os << llvm::formatv("  {0}_group[{1}] = [", kinds[k], i);
        for (auto [j, r] : llvm::enumerate(g))
          os << (j ? ", " : "") << r;
        os << "]\n";
      }
    }
    os << "\nrank";
    for (const std::string &kind : kinds)
      os << "  " << kind;
    os << "\n";
    for (int64_t r = 0; r < m.worldSize(); ++r) {
      os << llvm::formatv("{0,4}", r);
      for (size_t k = 0; k < kinds.size(); ++k) {
        std::string cell = index[k][r] < 0 ? "-" : std::to_string(index[k][r]);
        os << "  " << std::string(kinds[k].size() > cell.size()
                                      ? kinds[k].size() - cell.size()
                                      : 0,
                                  ' ')
           << cell;
      }
      os << "\n";
    }
    return;
  }

  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attribute("world_size", m.worldSize());
    j.attribute("order", m.order);
    j.attributeObject("sizes", [&] {
      for (const char *axis : kAxes)
        j.attribute(axis, sizeOf(m, axis));
      j.attribute("vpp", m.vpp);
    });
    j.attributeObject("groups", [&] {
      for (size_t k = 0; k < kinds.size(); ++k)
        j.attributeArray(kinds[k], [&] {
          for (auto &g : groups[k])
            j.array([&] {
              for (int64_t r : g)
                j.value(r);
            });
        });
    });
    j.attributeArray("ranks", [&] {
      for (int64_t r = 0; r < m.worldSize(); ++r)
        j.object([&] {
          j.attribute("rank", r);
          for (size_t k = 0; k < kinds.size(); ++k) {
            if (index[k][r] < 0)
              j.attribute(kinds[k], nullptr);
            else
              j.attribute(kinds[k], index[k][r]);
          }
        });
    });
  });
  os << "\n";
}

void tessera::printSchedule(const schedule::PipelineConfig &c,
                            llvm::StringRef format, llvm::raw_ostream &os) {
  auto layers = schedule::placeLayers(c);
  auto ranks = schedule::buildSchedule(c);
  // Megatron's cost model: a chunk takes 1/vpp of a stage, a backward twice
  // a forward (split into B and W: one forward each, the zero-bubble
  // paper's F = B = W).
  auto opName = [](const schedule::Step &s) {
    return s.forward ? "F" : s.weight ? "W" : "B";
  };
  schedule::Simulation sim = schedule::simulate(
      c, ranks, 1.0 / double(c.vpp), 2.0 / double(c.vpp));
  if (format == "trace") {
    // Chrome/Perfetto trace events, one track per pipeline rank; 1 ms is
    // one forward of a whole stage.
    llvm::json::OStream j(os, 1);
    j.object([&] {
      j.attributeArray("traceEvents", [&] {
        for (int64_t r = 0; r < c.pp; ++r)
          j.object([&] {
            j.attribute("name", "thread_name");
            j.attribute("ph", "M");
            j.attribute("pid", 0);
            j.attribute("tid", r);
            j.attributeObject("args", [&] {
              j.attribute("name", "pipeline rank " + std::to_string(r));
            });
          });
        for (const schedule::TimedStep &t : sim.steps)
          j.object([&] {
            std::string name =
                std::string(opName(t.step)) + std::to_string(t.step.microbatch);
            if (c.vpp > 1)
              name += "." + std::to_string(t.step.chunk);
            j.attribute("name", name);
            j.attribute("cat", t.step.forward  ? "forward"
                               : t.step.weight ? "weight"
                                               : "backward");
            j.attribute("ph", "X");
            j.attribute("pid", 0);
            j.attribute("tid", t.ppRank);
            j.attribute("ts", t.start * 1000.0);
            j.attribute("dur", (t.end - t.start) * 1000.0);
          });
      });
      j.attributeObject("otherData", [&] {
        j.attribute("schedule", schedule::kindName(c.kind));
        j.attribute("bubble_fraction", sim.bubbleFraction);
      });
    });
    os << "\n";
    return;
  }
  if (format == "text") {
    os << llvm::formatv("{0} schedule: pp {1}, vpp {2}, {3} micro-batches, "
                        "{4} layers\n",
                        schedule::kindName(c.kind), c.pp, c.vpp,
                        c.microbatches, c.layers);
    for (int64_t r = 0; r < c.pp; ++r) {
      os << llvm::formatv("rank {0} layers:", r);
      for (int64_t chunk = 0; chunk < c.vpp; ++chunk) {
        os << " [";
        bool first = true;
        for (auto &l : layers)
          if (l.ppRank == r && l.chunk == chunk) {
            os << (first ? "" : ", ") << l.layer;
            first = false;
          }
        os << "]";
      }
      os << "\n";
    }
    for (auto &rs : ranks) {
      os << llvm::formatv("rank {0} (warmup {1}):", rs.ppRank, rs.warmup);
      for (auto &st : rs.order) {
        os << " " << opName(st) << st.microbatch;
        if (c.vpp > 1)
          os << "." << st.chunk;
      }
      os << "\n";
    }
    os << llvm::formatv("bubble fraction {0:F4} (simulated, backward = 2 x "
                        "forward{1})\n",
                        sim.bubbleFraction,
                        schedule::splitsBackward(c.kind) ? ", B = W = forward"
                                                         : "");
    return;
  }
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attribute("pp", c.pp);
    j.attribute("vpp", c.vpp);
    j.attribute("micro_batches", c.microbatches);
    j.attribute("schedule", schedule::kindName(c.kind));
    j.attribute("bubble_fraction", sim.bubbleFraction);
    j.attributeArray("layers", [&] {
      for (auto &l : layers)
        j.object([&] {
          j.attribute("layer", l.layer);
          j.attribute("pp_rank", l.ppRank);
          j.attribute("chunk", l.chunk);
        });
    });
    j.attributeArray("ranks", [&] {
      for (auto &rs : ranks)
        j.object([&] {
          j.attribute("pp_rank", rs.ppRank);
          j.attribute("warmup", rs.warmup);
          j.attributeArray("order", [&] {
            for (auto &st : rs.order)
              j.object([&] {
                j.attribute("op", opName(st));
                j.attribute("microbatch", st.microbatch);
                j.attribute("chunk", st.chunk);
              });
          });
        });
    });
  });
  os << "\n";
}

mlir::LogicalResult tessera::printBuckets(mlir::ModuleOp module,
                                          llvm::StringRef format,
                                          llvm::raw_ostream &os) {
  int64_t dp = 1, reduceSize = 1;
  std::string reduceGroup = "dp";
  if (auto mesh = dist::lookupMesh(module)) {
    dp = mesh.getDp();
    reduceSize = mesh.getGradReduceSize();
    reduceGroup = mesh.getGradReduceGroup().str();
  }
  struct Entry {
    int64_t ppRank;
    dist::GradBufferOp op;
    buckets::Buffer layout;
  };
  std::vector<Entry> entries;
  for (mlir::ModuleOp program : getPrograms(module)) {
    int64_t ppRank = 0;
    if (auto r = program->getAttrOfType<mlir::IntegerAttr>(kPpRankAttr))
      ppRank = r.getInt();
    for (auto gb : program.getOps<dist::GradBufferOp>())
      entries.push_back({ppRank, gb, gb.getLayout()});
  }
  if (entries.empty())
    return mlir::emitError(module.getLoc())
           << "--emit=buckets found no grad buffers (run tessera-dp-grad-allreduce)";
  if (format == "text") {
    for (Entry &e : entries) {
      os << llvm::formatv("pipeline rank {0}, buffer {1} ({2} params, {3} grads): "
                          "{4} elements, {5} unpadded, {6} buckets, over {8} "
                          "({9} ranks){7}\n",
                          e.ppRank, e.op.getSymName(), e.layout.paramDtype,
                          e.layout.gradDtype, e.layout.numel,
                          e.layout.numelUnpadded, e.layout.buckets.size(),
                          e.op.getDistributed() ? ", distributed optimizer" : "",
                          e.op.getGroup(), e.op.getDp());
      for (auto [k, b] : llvm::enumerate(e.layout.buckets))
        os << llvm::formatv("  bucket {0}: [{1}, {2}) {3} unpadded, {4} params\n",
                            k, b.start, b.end, b.numelUnpadded, b.params.size());
    }
    return mlir::success();
  }
  auto range = [](llvm::json::OStream &j, llvm::StringRef key, buckets::Range r) {
    j.attributeArray(key, [&] {
      j.value(r.start);
      j.value(r.end);
    });
  };
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attribute("dp", dp);
    // The group the buckets are reduced and sharded over: dp, or dp-cp
    // under context parallelism.
    j.attribute("grad_reduce_group", reduceGroup);
    j.attribute("grad_reduce_size", reduceSize);
    j.attribute("single_bucket_group",
                module->hasAttr(kSingleBucketGroupAttr) ||
                    llvm::any_of(getPrograms(module), [](mlir::ModuleOp p) {
                      return p->hasAttr(kSingleBucketGroupAttr);
                    }));
    j.attributeArray("buffers", [&] {
      for (Entry &e : entries)
        j.object([&] {
          j.attribute("pp_rank", e.ppRank);
          j.attribute("name", e.op.getSymName());
          j.attribute("param_dtype", e.layout.paramDtype);
          j.attribute("grad_dtype", e.layout.gradDtype);
          j.attribute("distributed_optimizer", e.op.getDistributed());
          j.attribute("group", e.op.getGroup());
          j.attribute("group_size", e.op.getDp());
          j.attribute("numel", e.layout.numel);
          j.attribute("numel_unpadded", e.layout.numelUnpadded);
          j.attributeArray("params", [&] {
            for (const buckets::ParamRange &p : e.layout.params)
              j.object([&] {
                j.attribute("name", p.name);
                j.attribute("start", p.start);
                j.attribute("end", p.end);
                j.attribute("bucket", p.bucket);
              });
          });
          j.attributeArray("buckets", [&] {
            for (const buckets::Bucket &b : e.layout.buckets)
              j.object([&] {
                j.attribute("start", b.start);
                j.attribute("end", b.end);
                j.attribute("numel_unpadded", b.numelUnpadded);
                j.attributeArray("params", [&] {
                  for (const std::string &p : b.params)
                    j.value(p);
                });
              });
          });
          if (!e.op.getDistributed())
            return;
          j.attributeArray("shards", [&] {
            for (const buckets::Shard &s :
                 buckets::shardRanges(e.layout, e.op.getDp()))
              j.object([&] {
                j.attribute("dp_rank", s.dpRank);
                j.attribute("bucket", s.bucket);
                range(j, "gbuf_world", s.gbufWorld);
                j.attributeArray("params", [&] {
                  for (const buckets::ShardParam &p : s.params)
                    j.object([&] {
                      j.attribute("name", p.name);
                      range(j, "gbuf_world", p.gbufWorld);
                      range(j, "gbuf_world_in_bucket", p.gbufWorldInBucket);
                      range(j, "gbuf_local", p.gbufLocal);
                      range(j, "param", p.param);
                    });
                });
              });
          });
        });
    });
  });
  os << "\n";
  return mlir::success();
}

namespace {
/// One pipeline rank's memory plan by kind.
struct MemoryRows {
  int64_t ppRank = 0;
  std::vector<std::pair<std::string, int64_t>> rows;
  std::map<int64_t, int64_t> slots; // chunk -> microbatches in flight
  int64_t poolSlots = 0, poolBytes = 0;
  /// The V schedules' sends to the rank itself: each tag's most values
  /// queued at once times their size, summed (a bound on the device memory
  /// the executor's queue takes, outside the arena).
  int64_t selfQueueBytes = 0;
};
} // namespace

static mlir::FailureOr<MemoryRows> memoryRows(mlir::ModuleOp module) {
  auto arena = module->getAttrOfType<mlir::IntegerAttr>("rt.arena_bytes");
  auto persistent =
      module->getAttrOfType<mlir::IntegerAttr>("rt.persistent_bytes");
  if (!arena || !persistent)
    return mlir::emitError(module.getLoc())
           << "--emit=memory needs the rt-level module";
  MemoryRows out;
  if (auto r = module->getAttrOfType<mlir::IntegerAttr>(kPpRankAttr))
    out.ppRank = r.getInt();
  // The slot pool (pipelines): `slots` copies of `stride` bytes holding the
  // inputs and saved activations of the microbatch-chunks in flight.
  // Slot regions by base: (bytes per slot, slots); one pool shared by the
  // chunks, or one region per chunk.
  std::map<int64_t, std::pair<int64_t, int64_t>> regions;
  for (auto f : module.getOps<mlir::func::FuncOp>())
    if (auto n = f->getAttrOfType<mlir::IntegerAttr>("rt.num_slots"))
      regions[f->getAttrOfType<mlir::IntegerAttr>("rt.slot_base").getInt()] = {
          f->getAttrOfType<mlir::IntegerAttr>("rt.slot_bytes").getInt(),
          n.getInt()};
  for (auto &[base, region] : regions) {
    out.poolSlots += region.second;
    out.poolBytes += region.first * region.second;
  }
  // Microbatches each chunk has in flight at most, from the schedule: a
  // forward holds a slot from its first step to its backward's last, or to
  // its weight-gradient phase when the backward is split.
  std::set<int64_t> split;
  for (auto f : module.getOps<mlir::func::FuncOp>())
    if (auto p = f->getAttrOfType<mlir::StringAttr>(kPhaseAttr);
        p && p.getValue() == kBackwardWPhase)
      if (auto c = f->getAttrOfType<mlir::IntegerAttr>("rt.chunk"))
        split.insert(c.getInt());
  for (auto sched : module.getOps<dist::ScheduleOp>()) {
    std::map<int64_t, int64_t> now;
    std::set<std::pair<int64_t, int64_t>> held;
    for (auto run : sched.getBody().front().getOps<dist::RunOp>()) {
      auto f = module.lookupSymbol<mlir::func::FuncOp>(run.getCallee());
      auto c = f ? f->getAttrOfType<mlir::IntegerAttr>("rt.chunk") : nullptr;
      if (!c)
        continue;
      llvm::StringRef phase =
          f->getAttrOfType<mlir::StringAttr>(kPhaseAttr).getValue();
      bool forward = phase == kForwardPhase;
      bool releases = split.count(c.getInt()) ? phase == kBackwardWPhase
                                              : phase == kBackwardPhase;
      std::pair<int64_t, int64_t> key{c.getInt(), int64_t(run.getMicrobatch())};
      std::optional<dist::RunPart> part = run.getPart();
      if (forward && held.insert(key).second)
        out.slots[c.getInt()] =
            std::max(out.slots[c.getInt()], ++now[c.getInt()]);
      bool hasSend = module.lookupSymbol(("send:" + run.getCallee()).str());
      bool last = !part || part == dist::RunPart::Send ||
                  (part == dist::RunPart::Compute && !hasSend);
      if (releases && last && held.erase(key))
        --now[c.getInt()];
    }
  }
  // The V's turn (sends to the rank itself, peer 0): replaying the
  // schedule, the most values of each tag queued at once, times their size.
  for (auto sched : module.getOps<dist::ScheduleOp>()) {
    std::map<int64_t, int64_t> queued, peak, size;
    auto replay = [&](llvm::StringRef name) {
      auto f = module.lookupSymbol<mlir::func::FuncOp>(name);
      if (!f)
        return;
      f.walk([&](mlir::Operation *op) {
        bool send = mlir::isa<rt::SendOp>(op), recv = mlir::isa<rt::RecvOp>(op);
        auto iattrs = op->getAttrOfType<mlir::DenseI64ArrayAttr>("iattrs");
        if ((!send && !recv) || !iattrs || iattrs.size() < 2 || iattrs[0] != 0)
          return;
        int64_t tag = iattrs[1];
        auto type = mlir::cast<mlir::MemRefType>(op->getOperand(0).getType());
        size[tag] = type.getNumElements() *
                    (type.getElementType().getIntOrFloatBitWidth() / 8);
        queued[tag] += send ? 1 : -1;
        peak[tag] = std::max(peak[tag], queued[tag]);
      });
    };
    for (auto run : sched.getBody().front().getOps<dist::RunOp>()) {
      std::optional<dist::RunPart> part = run.getPart();
      llvm::StringRef callee = run.getCallee();
      if (!part || part == dist::RunPart::Recv)
        replay(("recv:" + callee).str());
      if (!part || part == dist::RunPart::Compute)
        replay(callee);
      if (!part || part == dist::RunPart::Send)
        replay(("send:" + callee).str());
    }
    for (auto &[tag, n] : peak)
      out.selfQueueBytes += n * size[tag];
  }
  // Bytes by kind. Persistent buffers are 64-byte aligned; the padding is
  // what the alignment adds. A chunk's inputs and saved activations are laid
  // out once per pool slot.
  std::map<std::string, int64_t> bytes;
  int64_t used = 0;
  std::map<int64_t, int64_t> regionInputs; // base -> input bytes per slot
  for (auto buf : module.getOps<rt::BufferOp>()) {
    auto type = mlir::cast<mlir::MemRefType>(buf.getType());
    int64_t n = type.getNumElements() *
                (type.getElementType().getIntOrFloatBitWidth() / 8);
    std::string kind = rt::stringifyEnum(buf.getKind()).str();
    if (buf.getKind() == rt::BufferKind::View) // a bucket: owns no memory
      continue;
    // ZeRO-3: staged parameters are host copies (their device copy is the
    // shards, counted as parameters).
    if (buf.getStaged())
      continue;
    if (buf.getKind() == rt::BufferKind::ParamShard)
      kind = "param";
    auto region = llvm::find_if(regions, [&](const auto &r) {
      int64_t off = int64_t(buf.getOffset());
      return off >= r.first && off < r.first + r.second.first;
    });
    if (region != regions.end()) {
      // Accounted below, from the regions' sizes.
      if (kind == "input")
        regionInputs[region->first] = std::max(regionInputs[region->first], n);
      continue;
    }
    if (kind == "activation")
      kind = "p2p_buffers";
    if (kind == "iteration" || kind == "loss" || kind == "metric")
      kind = "other"; // the step counter, the loss, the gradient norm
    bytes[kind] += n;
    used += n;
  }
  int64_t slotInputs = 0;
  for (auto &[base, n] : regionInputs)
    slotInputs += n * regions[base].second;
  bytes["input"] += slotInputs;
  bytes["saved_activations"] = out.poolBytes - slotInputs;
  used += out.poolBytes;
  int64_t activations = arena.getInt() - persistent.getInt();
  // Grad buffers' padding (bucket ends, 64-element starts): once for the
  // gradients, once more for the parameters with the distributed optimizer.
  // (ZeRO-2's gradient shards hold their share of it: counted as grads;
  // ZeRO-3's parameter shards theirs: counted as params.)
  int64_t bufferPadding = 0;
  auto dtypeBytes = [](FloatDtype dtype) {
    return floatDtypeBytes(dtype);
  };
  for (auto gb : module.getOps<dist::GradBufferOp>())
    bufferPadding += (gb.getNumel() - gb.getNumelUnpadded()) *
                     ((gb.getShardGrads() ? 0 : dtypeBytes(gb.getGradDtype())) +
                      (gb.getDistributed() && !gb.getShardParams()
                           ? dtypeBytes(gb.getParamDtype())
                           : 0));
  int64_t padding = persistent.getInt() - used - bufferPadding;
  out.rows = {{"params", bytes["param"]},
              {"grads", bytes["grad"]},
              {"main_params", bytes["main_param"]},
              {"optimizer_state", bytes["opt_state"]},
              {"inputs", bytes["input"]},
              {"saved_activations", bytes["saved_activations"]},
              {"p2p_buffers", bytes["p2p_buffers"]},
              {"other", bytes["other"]},
              {"buffer_padding", bufferPadding},
              {"padding", padding},
              {"peak_activations", activations},
              {"total", arena.getInt()}};
  return out;
}

mlir::FailureOr<std::vector<tessera::ProgramMemory>>
tessera::programMemory(mlir::ModuleOp module) {
  std::vector<ProgramMemory> out;
  for (mlir::ModuleOp program : getPrograms(module)) {
    auto rows = memoryRows(program);
    if (mlir::failed(rows))
      return mlir::failure();
    ProgramMemory m;
    m.ppRank = rows->ppRank;
    for (auto &[name, n] : rows->rows)
      m.bytes[name] = n;
    m.inFlight = rows->slots;
    out.push_back(std::move(m));
  }
  return out;
}

mlir::LogicalResult tessera::printMemory(mlir::ModuleOp module,
                                         llvm::StringRef format,
                                         llvm::raw_ostream &os) {
  std::vector<MemoryRows> programs;
  for (mlir::ModuleOp program : getPrograms(module)) {
    auto rows = memoryRows(program);
    if (mlir::failed(rows))
      return mlir::failure();
    programs.push_back(*rows);
  }
  mesh::MeshConfig config;
  if (auto mesh = dist::lookupMesh(module))
    config = mesh.getConfig();
  int64_t world = config.worldSize();
  // The pipeline rank of every world rank.
  std::vector<int64_t> ppOf(world, 0);
  std::string error;
  for (auto &group : mesh::rankGroups(config, "pp", error))
    for (size_t i = 0; i < group.size(); ++i)
      ppOf[group[i]] = int64_t(i);
  auto find = [&](int64_t pp) -> const MemoryRows & {
    for (const MemoryRows &m : programs)
      if (m.ppRank == pp)
        return m;
    return programs.front();
  };
  if (format == "text") {
    for (const MemoryRows &m : programs) {
      int64_t ranks = llvm::count(ppOf, m.ppRank);
      if (programs.size() == 1)
        os << llvm::formatv("per-rank memory plan ({0} ranks, the same program "
                            "on each):\n",
                            world);
      else
        os << llvm::formatv("pipeline rank {0} ({1} ranks):\n", m.ppRank, ranks);
      for (auto &[name, n] : m.rows)
        os << llvm::formatv("  {0,-17} {1,14} bytes  {2,10:F2} MiB\n", name, n,
                            double(n) / (1024.0 * 1024.0));
      for (auto &[chunk, slots] : m.slots)
        os << llvm::formatv("  chunk {0}: {1} microbatches in flight\n", chunk,
                            slots);
      if (m.poolSlots)
        os << llvm::formatv("  slots: {0}, {1} bytes\n", m.poolSlots,
                            m.poolBytes);
      if (m.selfQueueBytes)
        os << llvm::formatv("  self queue (the V's turn; outside the arena): "
                            "at most {0} bytes\n",
                            m.selfQueueBytes);
    }
    return mlir::success();
  }
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attributeArray("ranks", [&] {
      for (int64_t r = 0; r < world; ++r)
        j.object([&] {
          const MemoryRows &m = find(ppOf[r]);
          j.attribute("rank", r);
          j.attribute("pp_rank", m.ppRank);
          for (auto &[name, n] : m.rows)
            j.attribute(name, n);
          if (!m.slots.empty()) {
            j.attributeArray("in_flight", [&] {
              for (auto &[chunk, slots] : m.slots)
                j.value(slots);
            });
            j.attribute("slots", m.poolSlots);
          }
          if (m.selfQueueBytes)
            j.attribute("self_queue_bytes", m.selfQueueBytes);
        });
    });
  });
  os << "\n";
  return mlir::success();
}
