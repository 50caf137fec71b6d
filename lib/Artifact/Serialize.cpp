//===- Serialize.cpp - rt module to .tsr artifact -------------------------===//
//
// Translates rt buffers and kernels into the FlatBuffer schema of
// runtime/schema/artifact.fbs and wraps it in the versioned, checksummed
// container of tessera/rt/ArtifactFormat.h.
//
//===----------------------------------------------------------------------===//

#include "tessera/Mesh/RankGroups.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/Support/Model.h"

#include "tessera/artifact/artifact_generated.h"
#include "tessera/rt/ArtifactFormat.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/Support/InterleavedRange.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/ToolOutputFile.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringSwitch.h"

#include <cstring>
#include <set>
#include <sstream>

namespace tessera {
#define GEN_PASS_DEF_SERIALIZEPASS
#include "tessera/Conversion/Passes.h.inc"
} // namespace tessera

using namespace mlir;
using namespace tessera;
namespace fa = tessera::artifact;

static fa::DType dtypeOf(Type element) {
  if (element.isInteger(32))
    return fa::DType::I32;
  if (element.isInteger(64))
    return fa::DType::I64;
  if (element.isBF16())
    return fa::DType::BF16;
  if (element.isF16())
    return fa::DType::F16;
  return fa::DType::F32;
}

static fa::BufferKind kindOf(rt::BufferKind kind) {
  switch (kind) {
  case rt::BufferKind::Param:
    return fa::BufferKind::Param;
  case rt::BufferKind::Grad:
    return fa::BufferKind::Grad;
  case rt::BufferKind::OptState:
    return fa::BufferKind::OptState;
  case rt::BufferKind::MainParam:
    return fa::BufferKind::MainParam;
  case rt::BufferKind::Input:
    return fa::BufferKind::Input;
  case rt::BufferKind::Loss:
    return fa::BufferKind::Loss;
  case rt::BufferKind::Iteration:
    return fa::BufferKind::Iteration;
  case rt::BufferKind::Activation:
    return fa::BufferKind::Activation;
  case rt::BufferKind::View:
    return fa::BufferKind::View;
  case rt::BufferKind::Metric:
    return fa::BufferKind::Metric;
  case rt::BufferKind::ParamShard:
    return fa::BufferKind::ParamShard;
  }
  llvm_unreachable("unknown rt buffer kind");
}

namespace {
class Writer {
public:
  explicit Writer(ModuleOp module)
      : module(module), fbb(initialCapacity(module)) {}
  LogicalResult write(llvm::raw_ostream &os);

private:
  flatbuffers::Offset<fa::TensorRef> tensorRef(Value memref);
  FailureOr<flatbuffers::Offset<fa::Program>> writeProgram(ModuleOp program,
                                                           int64_t ppRank);
  FailureOr<flatbuffers::Offset<fa::Instr>> instr(Operation *op,
                                                  DenseMap<Value, int> &events);
  /// A parameter's initial value (init "data"), from tessera.weights.
  struct InitData {
    std::vector<int64_t> shape;
    ArrayRef<char> bytes;
    std::vector<char> owned; ///< the bytes of a splat
    /// External data: `file`, relative to the directory `dir`.
    std::string dir, file;
    int64_t offset = 0;
  };
  LogicalResult initData(rt::BufferOp buf, ArrayRef<int64_t> global,
                         InitData &data);

  ModuleOp module;
  flatbuffers::FlatBufferBuilder fbb;
  /// Room for the inline weights from the start, plus 16 MiB for the
  /// rest: growing the builder by doubling holds the old and the new
  /// buffer at once (three times an imported model's weights at the peak).
  static size_t initialCapacity(ModuleOp module) {
    size_t bytes = size_t(16) << 20;
    if (auto weights = module->getAttrOfType<DictionaryAttr>(kWeightsAttr))
      for (NamedAttribute entry : weights)
        if (auto elements = dyn_cast<ElementsAttr>(entry.getValue()))
          bytes += size_t(elements.getNumElements()) * 4 + 64;
    return bytes;
  }
  llvm::StringMap<int64_t> bufferOffsets;
  /// Rank-relative views: (group, stride) by buffer name.
  llvm::StringMap<std::pair<std::string, int64_t>> rankViews;
  std::set<std::string> groupsUsed;
};
} // namespace

LogicalResult Writer::initData(rt::BufferOp buf, ArrayRef<int64_t> global,
                               InitData &data) {
  auto weights = module->getAttrOfType<DictionaryAttr>(kWeightsAttr);
  Attribute entry = weights ? weights.get(buf.getSymName()) : Attribute();
  if (!entry)
    return buf.emitOpError() << "has init \"data\" but the module's "
                             << kWeightsAttr << " has no value for it";
  if (auto file = dyn_cast<DictionaryAttr>(entry)) {
    auto dir = file.getAs<StringAttr>("dir");
    auto path = file.getAs<StringAttr>("file");
    auto offset = file.getAs<IntegerAttr>("offset");
    auto shape = file.getAs<DenseI64ArrayAttr>("shape");
    if (!dir || !path || !offset || !shape)
      return buf.emitOpError()
             << "external data needs {dir, file, offset, shape}";
    data.dir = dir.str();
    data.file = path.str();
    data.offset = offset.getInt();
    data.shape.assign(shape.asArrayRef().begin(), shape.asArrayRef().end());
  }
  auto elements = dyn_cast<ElementsAttr>(entry);
  auto type = elements ? dyn_cast<RankedTensorType>(elements.getType())
                       : RankedTensorType();
  if (data.file.empty() && (!type || !type.getElementType().isF32()))
    return buf.emitOpError() << "its " << kWeightsAttr
                             << " value is not an f32 tensor";
  if (data.file.empty())
    data.shape.assign(type.getShape().begin(), type.getShape().end());
  bool fits = data.shape.size() == global.size() && !global.empty() &&
              data.shape[0] <= global[0];
  for (size_t d = 1; fits && d < global.size(); ++d)
    fits = data.shape[d] == global[d];
  if (!fits)
    return buf.emitOpError()
           << "initial value of shape [" << llvm::interleaved(data.shape)
           << "] does not fit the parameter's global shape ["
           << llvm::interleaved(global)
           << "] (only the vocabulary rows of dim 0 may be padded)";
  if (!data.file.empty())
    return success();
  if (auto resource = dyn_cast<DenseResourceElementsAttr>(entry)) {
    AsmResourceBlob *blob = resource.getRawHandle().getBlob();
    if (!blob)
      return buf.emitOpError() << "its initial value's resource blob is "
                                  "missing";
    data.bytes = blob->getData();
  } else if (auto dense = dyn_cast<DenseElementsAttr>(entry)) {
    if (dense.isSplat()) {
      float v = dense.getSplatValue<float>();
      data.owned.resize(size_t(type.getNumElements()) * 4);
      for (size_t i = 0; i < data.owned.size(); i += 4)
        std::memcpy(data.owned.data() + i, &v, 4);
      data.bytes = data.owned;
    } else {
      data.bytes = dense.getRawData();
    }
  } else {
    return buf.emitOpError() << "its initial value must be a dense or "
                                "dense_resource f32 tensor";
  }
  if (int64_t(data.bytes.size()) != type.getNumElements() * 4)
    return buf.emitOpError() << "its initial value holds " << data.bytes.size()
                             << " bytes, not " << type.getNumElements() * 4;
  return success();
}

flatbuffers::Offset<fa::TensorRef> Writer::tensorRef(Value memref) {
  auto type = cast<MemRefType>(memref.getType());
  int64_t offset = 0;
  std::pair<std::string, int64_t> rankView;
  if (auto get = memref.getDefiningOp<rt::GetOp>()) {
    offset = bufferOffsets.lookup(get.getBuffer());
    rankView = rankViews.lookup(get.getBuffer());
  } else if (auto alloc = memref.getDefiningOp<rt::AllocOp>()) {
    offset = alloc.getOffset();
  }
  auto shape = fbb.CreateVector(std::vector<int64_t>(type.getShape().begin(),
                                                     type.getShape().end()));
  flatbuffers::Offset<flatbuffers::String> group;
  if (!rankView.first.empty()) {
    group = fbb.CreateString(rankView.first);
    groupsUsed.insert(rankView.first);
  }
  return fa::CreateTensorRef(fbb, offset, shape, dtypeOf(type.getElementType()),
                             group, rankView.second);
}

FailureOr<flatbuffers::Offset<fa::Instr>>
Writer::instr(Operation *op, DenseMap<Value, int> &events) {
  // Every instruction op names its opcode and states its attributes; the
  // rt verifier has checked both against the instruction contract.
  auto instruction = dyn_cast<rt::InstructionOpInterface>(op);
  if (!instruction)
    return op->emitOpError() << "cannot be serialized";
  const fa::Opcode opcode = instruction.getOpcode();
  const rt::InstrAttrs attrs = instruction.getInstrAttrs();
  SmallVector<Value> operands;
  int event = -1;
  for (Value v : op->getOperands()) {
    if (isa<MemRefType>(v.getType()))
      operands.push_back(v);
    else if (isa<rt::EventType>(v.getType()))
      event = events.lookup(v);
  }
  for (Value v : op->getResults())
    if (isa<rt::EventType>(v.getType())) {
      event = events.size();
      events[v] = event;
    }
  if (attrs.event >= 0)
    event = int(attrs.event);
  const std::string group = attrs.group.str();
  if (!group.empty())
    groupsUsed.insert(group);
  std::vector<float> fattrs(attrs.fattrs.begin(), attrs.fattrs.end());
  std::vector<int64_t> iattrs(attrs.iattrs.begin(), attrs.iattrs.end());

  std::vector<flatbuffers::Offset<fa::TensorRef>> refs;
  for (Value v : operands)
    refs.push_back(tensorRef(v));
  auto refsVec = fbb.CreateVector(refs);
  auto fattrVec = fbb.CreateVector(fattrs);
  auto iattrVec = fbb.CreateVector(iattrs);
  auto groupStr = fbb.CreateString(group);
  std::string locText;
  llvm::raw_string_ostream locOs(locText);
  locOs << op->getName() << " at " << op->getLoc();
  auto locStr = fbb.CreateString(locText);
  fa::InstrBuilder ib(fbb);
  ib.add_op(opcode);
  ib.add_operands(refsVec);
  ib.add_trans_a(attrs.transA);
  ib.add_trans_b(attrs.transB);
  ib.add_alpha(attrs.alpha);
  ib.add_beta(attrs.beta);
  ib.add_fattrs(fattrVec);
  ib.add_iattrs(iattrVec);
  ib.add_group(groupStr);
  ib.add_reduce(attrs.reduce);
  ib.add_event(event);
  ib.add_loc(locStr);
  return ib.Finish();
}

FailureOr<flatbuffers::Offset<fa::Program>>
Writer::writeProgram(ModuleOp module, int64_t ppRank) {
  auto arena = module->getAttrOfType<IntegerAttr>("rt.arena_bytes");
  if (!arena)
    return emitError(module.getLoc())
           << "tessera-serialize needs an rt module (run tessera-lower-to-rt)";
  bufferOffsets.clear();

  // Buffers.
  std::vector<flatbuffers::Offset<fa::Buffer>> buffers;
  std::vector<flatbuffers::Offset<fa::InputSpec>> inputs;
  llvm::StringMap<int> index;
  int lossBuffer = -1, iterationBuffer = -1;
  SmallVector<rt::BufferOp> bufferOps(module.getOps<rt::BufferOp>());
  for (auto [i, buf] : llvm::enumerate(bufferOps)) {
    index[buf.getSymName()] = i;
    bufferOffsets[buf.getSymName()] = buf.getOffset();
    if (auto group = buf.getRankGroupAttr(); group && buf.getRankStride())
      rankViews[buf.getSymName()] = {group.getValue().str(),
                                     int64_t(buf.getRankStride().value_or(0))};
    else
      rankViews.erase(buf.getSymName());
  }
  for (auto [i, buf] : llvm::enumerate(bufferOps)) {
    auto type = cast<MemRefType>(buf.getType());
    std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
    std::vector<int64_t> global = shape;
    if (auto g = buf.getGlobalShape())
      global.assign(g->begin(), g->end());
    fa::InitKind init = fa::InitKind::Zeros;
    float scale = 0;
    if (auto spec = buf.getInit()) {
      auto [kind, arg] = spec->split(':');
      if (kind == "normal")
        init = fa::InitKind::Normal;
      else if (kind == "uniform")
        init = fa::InitKind::Uniform;
      else if (kind == "ones")
        init = fa::InitKind::Ones;
      else if (kind == "data")
        init = fa::InitKind::Data;
      else if (kind != "zeros")
        return buf.emitOpError() << "unknown init spec '" << *spec
                                 << "' (normal:<std>, uniform:<a>, zeros, ones, "
                                    "data)";
      double d = 0;
      if (!arg.empty()) {
        if (arg.getAsDouble(d))
          return buf.emitOpError() << "bad init scale in '" << *spec << "'";
        scale = float(d);
      }
    }
    InitData data;
    if (init == fa::InitKind::Data &&
        failed(initData(buf, global, data)))
      return failure();
    auto name = fbb.CreateString(buf.getSymName().str());
    auto shapeVec = fbb.CreateVector(shape);
    auto globalVec = fbb.CreateVector(global);
    // The runtime places a shard by its rank's position in each axis.
    auto axis = fbb.CreateString(buf.getShardAxis().value_or("").str());
    if (int64_t(buf.getShardDim()) >= 0 && buf.getShardAxis())
      groupsUsed.insert(buf.getShardAxis()->str());
    flatbuffers::Offset<flatbuffers::String> rankGroup;
    if (auto group = buf.getRankGroupAttr())
      rankGroup = fbb.CreateString(group.getValue().str());
    flatbuffers::Offset<flatbuffers::String> axis2;
    if (int64_t(buf.getShard2Dim()) >= 0) {
      axis2 = fbb.CreateString(buf.getShard2Axis().value_or("").str());
      if (buf.getShard2Axis())
        groupsUsed.insert(buf.getShard2Axis()->str());
    }
    int of = buf.getOfAttr() ? index.lookup(buf.getOfAttr().getValue()) : -1;
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> dataVec;
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> dataShapeVec;
    flatbuffers::Offset<flatbuffers::String> dataFile, dataDir;
    if (init == fa::InitKind::Data) {
      dataShapeVec = fbb.CreateVector(data.shape);
      if (data.file.empty())
        dataVec = fbb.CreateVector(
            reinterpret_cast<const uint8_t *>(data.bytes.data()),
            data.bytes.size());
      else {
        dataFile = fbb.CreateString(data.file);
        dataDir = fbb.CreateString(data.dir);
      }
    }
    fa::BufferBuilder bb(fbb);
    bb.add_name(name);
    bb.add_kind(kindOf(buf.getKind()));
    bb.add_dtype(dtypeOf(type.getElementType()));
    bb.add_offset(buf.getOffset());
    bb.add_shape(shapeVec);
    bb.add_global_shape(globalVec);
    bb.add_shard_dim(buf.getShardDim());
    bb.add_shard_axis(axis);
    if (int64_t(buf.getShard2Dim()) >= 0) {
      bb.add_shard2_dim(buf.getShard2Dim());
      bb.add_shard2_axis(axis2);
    }
    if (!rankGroup.IsNull())
      bb.add_rank_group(rankGroup);
    bb.add_init(init);
    bb.add_init_scale(scale);
    if (buf.getStaged())
      bb.add_staged(true);
    bb.add_of(of);
    if (init == fa::InitKind::Data) {
      bb.add_data_shape(dataShapeVec);
      if (data.file.empty())
        bb.add_data(dataVec);
      else {
        bb.add_data_file(dataFile);
        bb.add_data_dir(dataDir);
        bb.add_data_offset(data.offset);
      }
    }
    buffers.push_back(bb.Finish());
    if (buf.getKind() == rt::BufferKind::Input) {
      auto inName = fbb.CreateString(buf.getSymName().str());
      inputs.push_back(fa::CreateInputSpec(
          fbb, inName, i, buf.getNumClasses() ? *buf.getNumClasses() : 0,
          buf.getVocabSize() ? *buf.getVocabSize() : 0,
          buf.getChunk() ? int(*buf.getChunk()) : -1));
    }
    if (buf.getKind() == rt::BufferKind::Loss)
      lossBuffer = i;
    if (buf.getKind() == rt::BufferKind::Iteration)
      iterationBuffer = i;
  }

  // Functions.
  std::vector<flatbuffers::Offset<fa::Function>> functions;
  llvm::StringMap<int> functionIndex;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (!func->hasAttr("rt.entry"))
      continue;
    functionIndex[func.getSymName()] = functions.size();
    DenseMap<Value, int> events;
    std::vector<flatbuffers::Offset<fa::Instr>> instrs;
    for (Operation &op : func.getBody().front()) {
      if (isa<rt::GetOp, rt::AllocOp, func::ReturnOp>(op))
        continue;
      FailureOr<flatbuffers::Offset<fa::Instr>> in = instr(&op, events);
      if (failed(in))
        return failure();
      instrs.push_back(*in);
    }
    auto name = fbb.CreateString(func.getSymName().str());
    auto vec = fbb.CreateVector(instrs);
    auto i64 = [&](StringRef n) -> int64_t {
      auto a = func->getAttrOfType<IntegerAttr>(n);
      return a ? a.getInt() : 0;
    };
    int chunk = func->hasAttr("rt.chunk") ? int(i64("rt.chunk")) : -1;
    functions.push_back(fa::CreateFunction(fbb, name, vec, i64("rt.slot_base"),
                                           i64("rt.slot_bytes"),
                                           int(i64("rt.num_slots")), chunk));
  }

  // The pipeline schedule.
  std::vector<fa::ScheduleStep> steps;
  std::string scheduleKind;
  int numChunks = 1;
  for (auto sched : module.getOps<dist::ScheduleOp>()) {
    scheduleKind = dist::stringifyScheduleKind(sched.getKind()).str();
    for (auto run : sched.getBody().front().getOps<dist::RunOp>()) {
      if (!functionIndex.count(run.getCallee()))
        return run.emitOpError() << "runs '" << run.getCallee()
                                 << "', which is not an rt entry function";
      // A whole phase runs as its receive, compute and send parts.
      SmallVector<std::string> parts;
      std::optional<dist::RunPart> part = run.getPart();
      if (!part || part == dist::RunPart::Recv)
        parts.push_back(("recv:" + run.getCallee()).str());
      if (!part || part == dist::RunPart::Compute)
        parts.push_back(run.getCallee().str());
      if (!part || part == dist::RunPart::Send)
        parts.push_back(("send:" + run.getCallee()).str());
      for (const std::string &name : parts)
        if (auto it = functionIndex.find(name); it != functionIndex.end())
          steps.emplace_back(it->second, int(run.getMicrobatch()),
                             int(run.getSlot()));
    }
  }
  for (auto func : module.getOps<func::FuncOp>())
    if (auto c = func->getAttrOfType<IntegerAttr>("rt.chunk"))
      numChunks = std::max<int>(numChunks, c.getInt() + 1);
  auto scheduleVec = fbb.CreateVectorOfStructs(steps);
  auto kindStr = fbb.CreateString(scheduleKind);

  auto buffersVec = fbb.CreateVector(buffers);
  auto inputsVec = fbb.CreateVector(inputs);
  auto functionsVec = fbb.CreateVector(functions);
  int64_t persistent = 0;
  if (auto p = module->getAttrOfType<IntegerAttr>("rt.persistent_bytes"))
    persistent = p.getInt();
  fa::ProgramBuilder pb(fbb);
  pb.add_pp_rank(int(ppRank));
  pb.add_arena_bytes(arena.getInt());
  pb.add_persistent_bytes(persistent);
  if (auto s = module->getAttrOfType<IntegerAttr>("rt.staging_bytes"))
    pb.add_staging_bytes(s.getInt());
  pb.add_buffers(buffersVec);
  pb.add_inputs(inputsVec);
  pb.add_loss_buffer(lossBuffer);
  pb.add_iteration_buffer(iterationBuffer);
  pb.add_functions(functionsVec);
  pb.add_schedule(scheduleVec);
  pb.add_schedule_kind(kindStr);
  pb.add_num_chunks(numChunks);
  return pb.Finish();
}

/// The architecture record as a JSON object: integers, floats, bools and
/// strings by name; with `maskedVocab`, "mask_padded_vocab": true (the
/// padded vocabulary's logits were kept out of the loss, so the model
/// without its padding rows is the trained one).
static std::string architectureJson(DictionaryAttr arch, bool maskedVocab) {
  llvm::json::Object o;
  if (maskedVocab)
    o["mask_padded_vocab"] = true;
  for (NamedAttribute a : arch) {
    if (auto v = dyn_cast<BoolAttr>(a.getValue()))
      o[a.getName().str()] = v.getValue();
    else if (auto v = dyn_cast<IntegerAttr>(a.getValue()))
      o[a.getName().str()] = v.getInt();
    else if (auto v = dyn_cast<FloatAttr>(a.getValue()))
      o[a.getName().str()] = v.getValueAsDouble();
    else if (auto v = dyn_cast<StringAttr>(a.getValue()))
      o[a.getName().str()] = v.str();
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(o));
  return text;
}

/// An attribute as JSON: dictionaries, arrays, i64 arrays, strings,
/// integers, floats and bools (the ONNX export record).
static llvm::json::Value attrJson(Attribute a) {
  if (auto d = dyn_cast<DictionaryAttr>(a)) {
    llvm::json::Object o;
    for (NamedAttribute n : d)
      o[n.getName().str()] = attrJson(n.getValue());
    return o;
  }
  if (auto arr = dyn_cast<ArrayAttr>(a)) {
    llvm::json::Array out;
    for (Attribute e : arr)
      out.push_back(attrJson(e));
    return out;
  }
  if (auto arr = dyn_cast<DenseI64ArrayAttr>(a))
    return llvm::json::Array(arr.asArrayRef());
  if (auto v = dyn_cast<BoolAttr>(a))
    return v.getValue();
  if (isa<UnitAttr>(a))
    return true;
  if (auto v = dyn_cast<IntegerAttr>(a))
    return v.getInt();
  if (auto v = dyn_cast<FloatAttr>(a))
    return v.getValueAsDouble();
  if (auto v = dyn_cast<StringAttr>(a))
    return v.str();
  return nullptr;
}

LogicalResult Writer::write(llvm::raw_ostream &os) {
  dist::MeshOp meshOp = dist::lookupMesh(module);
  std::vector<flatbuffers::Offset<fa::Program>> programList;
  for (ModuleOp program : getPrograms(module)) {
    int64_t ppRank = 0;
    if (auto r = program->getAttrOfType<IntegerAttr>(kPpRankAttr))
      ppRank = r.getInt();
    FailureOr<flatbuffers::Offset<fa::Program>> p = writeProgram(program, ppRank);
    if (failed(p))
      return failure();
    programList.push_back(*p);
  }

  // Mesh and every group kind the runtime needs.
  mesh::MeshConfig config;
  if (meshOp)
    config = meshOp.getConfig();
  groupsUsed.insert({"tp", "dp", "pp"});
  // Under context parallelism the data loader and the sequence kernels
  // place this rank's share of the sequence by its cp position.
  if (config.cp > 1)
    groupsUsed.insert("cp");
  std::vector<flatbuffers::Offset<fa::RankGroup>> groups;
  for (const std::string &kind : groupsUsed) {
    std::string error;
    auto instances = mesh::rankGroups(config, kind, error);
    if (!error.empty())
      return emitError(module.getLoc()) << error;
    for (auto &ranks : instances) {
      auto kindStr = fbb.CreateString(kind);
      std::vector<int32_t> r(ranks.begin(), ranks.end());
      groups.push_back(fa::CreateRankGroup(fbb, kindStr, fbb.CreateVector(r)));
    }
  }
  // The dense layout's axes, fastest first.
  std::vector<flatbuffers::Offset<fa::MeshAxis>> axes;
  std::stringstream order(config.order);
  for (std::string axis; std::getline(order, axis, '-');) {
    if (axis == "ep")
      continue;
    int64_t size = axis == "tp" ? config.tp : axis == "cp" ? config.cp
                 : axis == "dp" ? config.dp : config.pp;
    axes.push_back(fa::CreateMeshAxis(fbb, fbb.CreateString(axis), size));
  }

  int64_t micro = 1, global = 1, numMicro = 1;
  if (auto batch = module->getAttrOfType<DictionaryAttr>(kBatchAttr)) {
    micro = batch.getAs<IntegerAttr>("micro_batch_size").getInt();
    global = batch.getAs<IntegerAttr>("global_batch_size").getInt();
    numMicro = batch.getAs<IntegerAttr>("num_microbatches").getInt();
  }
  auto batchOff = fa::CreateBatch(fbb, micro, global, numMicro);
  flatbuffers::Offset<fa::Optimizer> optOff;
  if (auto opt = module->getAttrOfType<DictionaryAttr>(kOptimizerAttr)) {
    auto f = [&](StringRef n) {
      return float(opt.getAs<FloatAttr>(n).getValueAsDouble());
    };
    auto kind = fbb.CreateString(opt.getAs<StringAttr>("kind").getValue().str());
    auto i = [&](StringRef n) -> int64_t {
      auto a = opt.getAs<IntegerAttr>(n);
      return a ? a.getInt() : 0;
    };
    auto d = [&](StringRef n, double otherwise) {
      auto a = opt.getAs<FloatAttr>(n);
      return a ? a.getValueAsDouble() : otherwise;
    };
    auto style = opt.getAs<StringAttr>("lr_decay_style");
    auto styleStr = fbb.CreateString(style ? style.getValue().str() : "constant");
    float minLr = opt.getAs<FloatAttr>("min_lr")
                      ? f("min_lr")
                      : 0.0f;
    optOff = fa::CreateOptimizer(fbb, kind, f("lr"), f("beta1"), f("beta2"),
                                 f("eps"), f("weight_decay"),
                                 i("lr_warmup_iters"), i("lr_decay_iters"),
                                 styleStr, minLr,
                                 opt.getAs<FloatAttr>("clip_grad")
                                     ? f("clip_grad")
                                     : 0.0f,
                                 opt.getAs<FloatAttr>("momentum")
                                     ? f("momentum")
                                     : 0.0f,
                                 d("loss_scale", 0.0),
                                 d("initial_loss_scale", 0.0),
                                 d("min_loss_scale", 1.0),
                                 opt.getAs<IntegerAttr>("loss_scale_window")
                                     ? i("loss_scale_window")
                                     : 1000,
                                 opt.getAs<IntegerAttr>("hysteresis")
                                     ? int32_t(i("hysteresis"))
                                     : 2);
  }
  std::string flags;
  if (auto a = module->getAttrOfType<StringAttr>(kCompileFlagsAttr))
    flags = a.getValue().str();
  std::string model = "model";
  if (auto a = module->getAttrOfType<StringAttr>(kModelNameAttr))
    model = a.getValue().str();

  auto groupsVec = fbb.CreateVector(groups);
  auto axesVec = fbb.CreateVector(axes);
  auto programs = fbb.CreateVector(programList);
  auto producer = fbb.CreateString("tessera-compile 0.1");
  auto modelStr = fbb.CreateString(model);
  auto orderStr = fbb.CreateString(config.order);
  auto flagsStr = fbb.CreateString(flags);
  flatbuffers::Offset<flatbuffers::String> archStr;
  if (auto arch = module->getAttrOfType<DictionaryAttr>(kArchitectureAttr))
  {
    auto vocab = module->getAttrOfType<DictionaryAttr>(kVocabAttr);
    archStr = fbb.CreateString(
        architectureJson(arch, vocab && vocab.get("masked")));
  }
  flatbuffers::Offset<flatbuffers::String> onnxStr;
  if (auto record = module->getAttrOfType<DictionaryAttr>(kOnnxSourceAttr)) {
    // With the vocabulary's padding, which the export cuts off.
    llvm::json::Value value = attrJson(record);
    if (auto vocab = module->getAttrOfType<DictionaryAttr>(kVocabAttr))
      value.getAsObject()->try_emplace("vocab", attrJson(vocab));
    std::string text;
    llvm::raw_string_ostream js(text);
    js << value;
    onnxStr = fbb.CreateString(text);
  }
  fa::ArtifactBuilder ab(fbb);
  ab.add_format_version(fa::kFormatVersion);
  ab.add_producer(producer);
  ab.add_model(modelStr);
  ab.add_world_size(config.worldSize());
  ab.add_mesh(axesVec);
  ab.add_order(orderStr);
  ab.add_groups(groupsVec);
  ab.add_batch(batchOff);
  if (!optOff.IsNull())
    ab.add_optimizer(optOff);
  ab.add_compile_flags(flagsStr);
  ab.add_programs(programs);
  if (auto flops = module->getAttrOfType<IntegerAttr>("rt.flops_per_step"))
    ab.add_flops_per_step(double(flops.getInt()));
  if (!archStr.IsNull())
    ab.add_architecture(archStr);
  if (!onnxStr.IsNull())
    ab.add_onnx_source(onnxStr);
  fbb.Finish(ab.Finish(), fa::ArtifactIdentifier());

  const uint8_t *data = fbb.GetBufferPointer();
  size_t size = fbb.GetSize();
  os << fa::makeHeader(data, size);
  os.write(reinterpret_cast<const char *>(data), size);
  return success();
}

LogicalResult tessera::writeArtifact(ModuleOp module, llvm::raw_ostream &os) {
  return Writer(module).write(os);
}

namespace {
struct SerializePass : tessera::impl::SerializePassBase<SerializePass> {
  using SerializePassBase::SerializePassBase;
  void runOnOperation() override {
    if (output.empty()) {
      emitError(getOperation().getLoc())
          << "tessera-serialize needs output=<file>";
      return signalPassFailure();
    }
    std::string error;
    auto file = mlir::openOutputFile(output, &error);
    if (!file) {
      emitError(getOperation().getLoc())
          << "cannot open '" << output << "': " << error;
      return signalPassFailure();
    }
    if (failed(writeArtifact(getOperation(), file->os())))
      return signalPassFailure();
    file->keep();
  }
};
} // namespace
