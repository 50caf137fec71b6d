//===- Compile.cpp - The tessera-compile driver ---------------------------===//
//
// Checks the flags, resolves the mesh (dp from --world-size) and the batch
// (--micro-batches), and either prints a report that needs no model
// (--emit=rank-groups, --emit=schedule) or runs the training pipeline and
// writes its result.
//
//===----------------------------------------------------------------------===//

#include "tessera/Pipeline/Compile.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/Frontend/HfImport.h"
#include "tessera/Import/OnnxImport.h"
#include "tessera/InitAll.h"
#include "tessera/Pipeline/Reports.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

#include <cstdio>
#include <deque>
#include <set>

using namespace mlir;
namespace cl = llvm::cl;

tessera::CompileOptions::CompileOptions()
    : input(cl::Positional,
            cl::desc("<model.mlir, model.onnx (a torch.onnx.export, "
                     "imported as tessera-translate --import-onnx does) or "
                     "a Hugging Face model directory (config.json and "
                     "safetensors: Llama, Mistral, Qwen3, Mixtral, its "
                     "weights the initial values)>"),
            cl::Optional,
            cl::cat(getCompileCategory())),
      output("o", cl::desc("output file"), cl::value_desc("file"),
             cl::init("-"), cl::cat(getCompileCategory())),
      worldSize("world-size",
                cl::desc("number of ranks; derives dp when --dp is not given "
                         "(0, the default: tp x cp x dp x pp)"),
                cl::init(0), cl::cat(getCompileCategory())),
      microBatches(
          "micro-batches",
          cl::desc("micro-batches per step (0, the default: global / "
                   "(micro x dp))"),
          cl::init(0), cl::cat(getCompileCategory())),
      numLayers(
          "num-layers",
          cl::desc("transformer layers, for --emit=schedule without a model"),
          cl::init(0), cl::cat(getCompileCategory())),
      emit("emit",
           cl::desc("what to write: artifact (default), mlir (the rt-level "
                    "module) rank-groups (every rank group of the mesh; needs "
                    "no model), schedule (layer placement and per-rank "
                    "pipeline order), memory (the per-rank static memory plan "
                    "by kind) or buckets (gradient buffers, buckets and "
                    "distributed-optimizer shard ranges)"),
           cl::init("artifact"), cl::cat(getCompileCategory())),
      emitFormat("emit-format",
                 cl::desc("json (default), text, or trace (a Chrome/Perfetto "
                          "trace of the planned schedule)"),
                 cl::init("json"), cl::cat(getCompileCategory())),
      hfCheckpoint("hf-checkpoint",
                   cl::desc("a Hugging Face model directory to compile with "
                            "its weights (the same as giving it as the "
                            "input)"),
                   cl::init(""), cl::cat(getCompileCategory())),
      seqLength("seq-length",
                cl::desc("a Hugging Face model's training sequence length "
                         "(default: its max_position_embeddings)"),
                cl::init(0), cl::cat(getCompileCategory())),
      loss("loss",
           cl::desc("for an ONNX model that returns logits: the loss to add "
                    "(cross-entropy: the mean token cross-entropy over a "
                    "labels input)"),
           cl::init(""), cl::cat(getCompileCategory())),
      plan("plan",
           cl::desc("cluster description (JSON): compile the layout "
                    "tessera-plan ranks first for it (--world-size GPUs, or "
                    "the file's); parallel flags given too restrict the "
                    "search"),
           cl::init(""), cl::cat(getCompileCategory())) {}

namespace {

int fail(const llvm::Twine &message) {
  llvm::errs() << "tessera-compile: error: " << message << "\n";
  return 1;
}

/// The model: the positional input, or --hf-checkpoint's directory.
const std::string &modelPath(const tessera::CompileOptions &options) {
  return options.hfCheckpoint.empty() ? options.input.getValue()
                                      : options.hfCheckpoint.getValue();
}

/// The model of the positional input: nn IR (.mlir), or an ONNX export
/// imported by lib/Import. Errors go to the context's handler.
OwningOpRef<ModuleOp> loadModel(const tessera::CompileOptions &options,
                                MLIRContext &context,
                                llvm::SourceMgr &sourceMgr) {
  if (tessera::isHfCheckpoint(modelPath(options))) {
    if (options.output == "-") {
      fail("a Hugging Face model compiles to an artifact: give -o FILE (its "
           "weights, converted to Megatron's layouts, go to FILE.weights)");
      return nullptr;
    }
    tessera::HfImportOptions hf;
    hf.seqLength = options.seqLength;
    hf.weightsPath = options.output + ".weights";
    std::string error;
    OwningOpRef<ModuleOp> module =
        tessera::importHfCheckpoint(&context, modelPath(options), hf, error);
    if (!module)
      fail(error);
    return module;
  }
  if (options.seqLength != 0) {
    fail("--seq-length applies to Hugging Face model directories; '" +
         modelPath(options) + "' states its sequence in its shapes");
    return nullptr;
  }
  if (tessera::isOnnxFile(modelPath(options))) {
    if (!options.loss.empty() && options.loss != "cross-entropy") {
      fail("--loss must be 'cross-entropy', got '" + options.loss + "'");
      return nullptr;
    }
    tessera::OnnxImportOptions onnx;
    onnx.loss = options.loss;
    return tessera::importOnnxModel(&context, modelPath(options), onnx);
  }
  if (!options.loss.empty()) {
    fail("--loss applies to ONNX models; '" + modelPath(options) +
         "' is nn IR, which states its loss");
    return nullptr;
  }
  std::string error;
  auto file = openInputFile(modelPath(options), &error);
  if (!file) {
    fail(error);
    return nullptr;
  }
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  return parseSourceFile<ModuleOp>(sourceMgr, &context);
}

/// Writes a report (--emit=schedule, rank-groups, memory, buckets) to -o,
/// or stdout when -o is "-". Returns the exit code.
int writeReport(llvm::StringRef output,
                llvm::function_ref<bool(llvm::raw_ostream &)> print) {
  if (output == "-")
    return print(llvm::outs()) ? 0 : 1;
  std::string error;
  auto out = openOutputFile(output, &error);
  if (!out)
    return fail(error);
  if (!print(out->os()))
    return 1;
  out->keep();
  return 0;
}

/// Writes the artifact next to -o, then renames it: a reader never sees
/// half a file.
int writeArtifactFile(ModuleOp module, llvm::StringRef output) {
  if (output == "-")
    return fail("give the artifact's path with -o");
  std::string tmp = (output + ".tmp").str();
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(tmp, ec);
    if (ec)
      return fail("cannot write '" + tmp + "': " + ec.message());
    if (failed(tessera::writeArtifact(module, os)))
      return 1;
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, output))
    return fail("cannot rename to '" + output + "': " + ec.message());
  return 0;
}

/// The mesh of the flags, with dp derived from --world-size when --dp is
/// not given; fails (after the error) when it is invalid.
FailureOr<tessera::mesh::MeshConfig>
resolveMesh(const tessera::CompileOptions &options) {
  const tessera::TrainPipelineOptions &p = options.pipeline;
  tessera::mesh::MeshConfig mesh;
  mesh.tp = p.tp;
  mesh.cp = p.cp;
  mesh.ep = p.ep;
  // 0: Megatron's default, each expert split over tp like the dense layers.
  mesh.etp = p.etp > 0 ? int64_t(p.etp) : int64_t(p.tp);
  mesh.dp = p.dp == 0 ? 1 : int64_t(p.dp);
  mesh.pp = p.pp;
  mesh.vpp = tessera::effectiveVpp(p);
  mesh.order = p.order;
  std::string error;
  if (options.worldSize != 0)
    error = tessera::mesh::applyWorldSize(mesh, options.worldSize, p.dp != 0);
  if (error.empty()) {
    error = tessera::mesh::completeOrder(mesh);
    if (error.empty())
      error = tessera::mesh::validateMesh(mesh);
    if (!error.empty()) {
      error = "invalid mesh: " + error;
      if (p.etp == 0 && mesh.etp > 1 && error.find("etp") != std::string::npos)
        error += " (--etp defaults to --tp, as Megatron's "
                 "--expert-tensor-parallel-size; --etp 1 keeps every "
                 "expert whole)";
    }
  }
  if (!error.empty()) {
    fail(error);
    return failure();
  }
  return mesh;
}

/// --emit=schedule: layers from --num-layers or the model's `nn.layer`
/// marks, micro-batches from --micro-batches or the batch sizes.
int emitSchedule(const tessera::CompileOptions &options,
                 const tessera::mesh::MeshConfig &mesh) {
  namespace sched = tessera::schedule;
  const tessera::TrainPipelineOptions &p = options.pipeline;
  sched::PipelineConfig config;
  config.pp = mesh.pp;
  config.vpp = mesh.vpp;
  std::string kind = p.schedule;
  if (kind == "auto")
    kind = mesh.vpp > 1 ? "interleaved" : "1f1b";
  if (!sched::parseKind(kind, config.kind))
    return fail("unknown --schedule=" + p.schedule +
                " (expected none, 1f1b, interleaved, zb-h1, zbv or dualpipev)");
  config.microbatches = options.microBatches;
  if (config.microbatches == 0) {
    int64_t micro = p.microBatchSize, global = p.globalBatchSize;
    if (micro > 0 && global > 0 && global % (micro * mesh.dp) == 0)
      config.microbatches = global / (micro * mesh.dp);
    else if (micro > 0 || global > 0)
      return fail("give --micro-batches, or a --global-batch-size divisible by "
                  "--micro-batch-size x dp");
    else
      config.microbatches = 1;
  }
  config.layers = options.numLayers;
  if (!modelPath(options).empty()) {
    DialectRegistry registry;
    tessera::registerAllDialects(registry);
    MLIRContext context(registry);
    llvm::SourceMgr sourceMgr;
    SourceMgrDiagnosticHandler handler(sourceMgr, &context);
    OwningOpRef<ModuleOp> module = loadModel(options, context, sourceMgr);
    if (!module)
      return 1;
    FailureOr<int64_t> layers = tessera::getNumLayers(*module);
    if (failed(layers))
      return 1;
    if (*layers == 0)
      return fail("the model marks no transformer layers (nn.layer)");
    config.layers = *layers;
  }
  if (config.layers == 0)
    return fail("--emit=schedule needs a model or --num-layers");
  config.stageLayers.assign(p.ppLayers.begin(), p.ppLayers.end());
  if (std::string error =
          sched::resolveSplit(tessera::splitOptions(p), config);
      !error.empty())
    return fail(error);
  if (std::string error = sched::validate(config); !error.empty())
    return fail(error);
  return writeReport(options.output, [&](llvm::raw_ostream &os) {
    tessera::printSchedule(config, options.emitFormat, os);
    return true;
  });
}

} // namespace

int tessera::compile(const CompileOptions &options,
                     llvm::ArrayRef<const char *> args) {
  llvm::StringRef emit = options.emit, format = options.emitFormat;
  if (!options.hfCheckpoint.empty()) {
    if (!options.input.empty())
      return fail("give the model once: '" + options.input +
                  "' and --hf-checkpoint " + options.hfCheckpoint);
    if (!tessera::isHfCheckpoint(options.hfCheckpoint))
      return fail("--hf-checkpoint " + options.hfCheckpoint +
                  ": not a Hugging Face model directory (no config.json)");
  }
  if (!llvm::is_contained(
          {"artifact", "mlir", "rank-groups", "schedule", "memory", "buckets"},
          emit))
    return fail("unknown --emit=" + emit +
                " (expected artifact, mlir, rank-groups, schedule, memory or "
                "buckets)");
  if (!llvm::is_contained({"json", "text", "trace"}, format))
    return fail("unknown --emit-format=" + format +
                " (expected json, text or trace)");
  if (format == "trace" && emit != "schedule")
    return fail("--emit-format=trace draws --emit=schedule only");

  // Count flags: 0 means "derive it" (said in each flag's help), a
  // negative value is an error, and batch-like counts are bounded so that
  // their products cannot overflow.
  const TrainPipelineOptions &p = options.pipeline;
  const std::pair<const char *, int64_t> counts[] = {
      {"micro-batch-size", p.microBatchSize},
      {"global-batch-size", p.globalBatchSize},
      {"micro-batches", options.microBatches},
      {"bucket-size", p.bucketSize},
      {"num-layers", options.numLayers},
      {"world-size", options.worldSize}};
  for (auto [flag, value] : counts)
    if (value < 0 || value > (int64_t(1) << 40))
      return fail("invalid --" + llvm::Twine(flag) + " " + llvm::Twine(value) +
                  " (expected 0 for its default, or a positive count up to "
                  "2^40)");

  if (!options.plan.empty() && (emit == "rank-groups" || emit == "schedule"))
    return fail("--plan chooses the layout of a model to compile; it does "
                "not apply to --emit=" + emit);
  // The mesh, checked once for every kind of output.
  FailureOr<mesh::MeshConfig> mesh = resolveMesh(options);
  if (failed(mesh))
    return 1;
  if (emit == "rank-groups")
    return writeReport(options.output, [&](llvm::raw_ostream &os) {
      printRankGroups(*mesh, format, os);
      return true;
    });
  if (emit == "schedule")
    return emitSchedule(options, *mesh);
  if (modelPath(options).empty())
    return fail("no input model given (only --emit=rank-groups needs none)");
  // The pipeline's options as given, with the values the tool derives: dp
  // (--world-size) and the global batch (--micro-batches M stands for a
  // global batch of M x micro x dp).
  TrainPipelineOptions pipeline;
  pipeline.copyOptionValuesFrom(options.pipeline);
  pipeline.dp = mesh->dp;
  if (options.microBatches != 0) {
    int64_t micro = pipeline.microBatchSize, global = pipeline.globalBatchSize;
    if (micro <= 0)
      return fail("--micro-batches needs --micro-batch-size");
    int64_t derived = options.microBatches * micro * mesh->dp;
    if (global != 0 && global != derived)
      return fail("--micro-batches " +
                  llvm::Twine(int64_t(options.microBatches)) +
                  " disagrees with --global-batch-size " + llvm::Twine(global) +
                  " (micro-batch-size " + llvm::Twine(micro) + " x dp " +
                  llvm::Twine(mesh->dp) +
                  " x micro-batches = " + llvm::Twine(derived) + ")");
    pipeline.globalBatchSize = derived;
  }

  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  // Errors name the op and its location; printing the op itself would dump
  // whole model functions.
  context.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = loadModel(options, context, sourceMgr);
  if (!module)
    return 1;
  Builder b(&context);
  (*module)->setAttr(kCompileFlagsAttr, b.getStringAttr(llvm::join(args, " ")));
  (*module)->setAttr(kModelNameAttr,
                     b.getStringAttr(llvm::sys::path::stem(modelPath(options))));

  // A pass's error about the options or the whole model is located at the
  // module itself: say it as the tool's error (naming the options), not as
  // a place in the input with its first line quoted.
  Location moduleLoc = (*module)->getLoc();
  ScopedDiagnosticHandler optionErrors(&context, [&](Diagnostic &diag) {
    if (diag.getLocation() != moduleLoc)
      return failure();
    const char *kind = diag.getSeverity() == DiagnosticSeverity::Error ? "error"
                       : diag.getSeverity() == DiagnosticSeverity::Warning
                           ? "warning"
                           : "note";
    llvm::errs() << "tessera-compile: " << kind << ": " << diag.str() << "\n";
    for (const Diagnostic &note : diag.getNotes())
      llvm::errs() << "tessera-compile: note: " << note.str() << "\n";
    return success();
  });

  if (std::string error = checkTrainPipelineOptions(options.pipeline);
      !error.empty())
    return fail(error);
  if (!options.plan.empty()) {
    if (!options.planLayout)
      return fail("--plan is not available in this driver");
    if (failed(options.planLayout(*module, options.pipeline, pipeline,
                                  options.plan, options.worldSize)))
      return 1;
  }
  // The gradient buffers do not depend on the batch: --emit=buckets needs no
  // batch flags, a model with a dynamic batch is laid out with one sample.
  if (options.emit == "buckets" && pipeline.microBatchSize == 0 &&
      pipeline.globalBatchSize == 0)
    if (func::FuncOp model = getModelFunc(*module))
      for (BlockArgument arg : model.getArguments())
        if (model.getArgAttr(arg.getArgNumber(), kInputAttr))
          if (auto t = dyn_cast<RankedTensorType>(arg.getType());
              t && !t.hasStaticShape())
            pipeline.microBatchSize = 1;
  PassManager pm(&context);
  buildTrainPipeline(pm, pipeline);
  if (failed(pm.run(*module)))
    return 1;

  if (emit == "buckets")
    return writeReport(options.output, [&](llvm::raw_ostream &os) {
      return succeeded(printBuckets(*module, format, os));
    });
  if (emit == "memory")
    return writeReport(options.output, [&](llvm::raw_ostream &os) {
      return succeeded(printMemory(*module, format, os));
    });
  if (emit == "mlir") {
    std::string error;
    auto out = openOutputFile(options.output, &error);
    if (!out)
      return fail(error);
    module->print(out->os());
    out->keep();
    return 0;
  }
  return writeArtifactFile(*module, options.output);
}

void tessera::describeDefaults(CompileOptions &options) {
  // The pipeline's options print as "{name=value name=value ...}" with their
  // values, which before parsing are the defaults.
  std::string text;
  llvm::raw_string_ostream os(text);
  options.pipeline.print(os);
  llvm::StringRef list = llvm::StringRef(text).trim().trim("{}");
  // The descriptions must outlive the options that point to them.
  static std::deque<std::string> descriptions;
  auto &registered = llvm::cl::getRegisteredOptions();
  llvm::SmallVector<llvm::StringRef> entries;
  list.split(entries, ' ', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef entry : entries) {
    auto [name, value] = entry.split('=');
    auto it = registered.find(name);
    if (value.empty() || it == registered.end())
      continue;
    llvm::cl::Option *opt = it->second;
    // Flags off by default say nothing; descriptions that already give
    // their default keep their own words.
    if (value == "false" || opt->HelpStr.contains_insensitive("default"))
      continue;
    std::string shown = value.str();
    double number;
    if (!value.getAsDouble(number) && value.contains_insensitive("e")) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", number);
      shown = buf;
    }
    descriptions.push_back(
        (opt->HelpStr + " (default: " + shown + ")").str());
    opt->setDescription(descriptions.back());
  }
}
