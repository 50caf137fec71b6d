//===- tessera-compile.cpp - Model to .tsr artifact -----------------------===//
//
// Parses flags, runs the training pipeline and writes the artifact
// atomically (temporary file, then rename).
//
//===----------------------------------------------------------------------===//

#include "tessera/Conversion/Passes.h"
#include "tessera/InitAll.h"
#include "tessera/Pipeline/Pipeline.h"
#include "tessera/Pipeline/Reports.h"
#include "tessera/Schedule/PipelineSchedule.h"

#include <set>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
namespace cl = llvm::cl;

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.mlir>"),
                                      cl::Optional);
static cl::opt<std::string> outputFile("o", cl::desc("output file"),
                                       cl::value_desc("file"), cl::init("-"));
static cl::opt<int64_t> tp("tp", cl::desc("tensor-parallel size"), cl::init(1));
static cl::opt<int64_t> dp("dp", cl::desc("data-parallel size (default: "
                                          "world-size / (tp*cp*pp), else 1)"),
                           cl::init(0));
static cl::opt<int64_t> cp("cp", cl::desc("context-parallel size"), cl::init(1));
static cl::opt<int64_t> ep("ep", cl::desc("expert-parallel size"), cl::init(1));
static cl::opt<int64_t> etp("etp", cl::desc("expert tensor-parallel size"),
                            cl::init(1));
static cl::opt<int64_t> pp("pp", cl::desc("pipeline-parallel size"), cl::init(1));
static cl::opt<int64_t> vpp("vpp", cl::desc("virtual pipeline chunks per pp rank"),
                            cl::init(1));
static cl::opt<int64_t> worldSize("world-size",
                                  cl::desc("number of ranks; derives dp when "
                                           "--dp is not given"),
                                  cl::init(0));
static cl::opt<std::string> order("order", cl::desc("rank order"),
                                  cl::init("tp-cp-ep-dp-pp"));
static cl::opt<int64_t> microBatch("micro-batch-size",
                                   cl::desc("samples per microbatch per dp rank"),
                                   cl::init(0));
static cl::opt<int64_t> globalBatch("global-batch-size",
                                    cl::desc("samples per step over all dp ranks"),
                                    cl::init(0));
static cl::opt<int64_t> vocabDivisibleBy(
    "make-vocab-size-divisible-by",
    cl::desc("pad the vocabulary to a multiple of this times tp (default 128)"),
    cl::init(128));
static cl::opt<bool> sequenceParallel(
    "sequence-parallel",
    cl::desc("Megatron sequence parallelism: layer norms and residuals on "
             "sequence shards, all-gather/reduce-scatter around each region"),
    cl::init(false));
static cl::opt<bool> bf16(
    "bf16",
    cl::desc("mixed precision: bf16 parameters, f32 computation, fp32 main "
             "parameters for the optimizer (Megatron's --bf16)"),
    cl::init(false));
static cl::opt<bool> gradReduceInFp32(
    "grad-reduce-in-fp32",
    cl::desc("with --bf16: accumulate and reduce gradients in f32 (the "
             "default, as Megatron does for bf16)"),
    cl::init(false));
static cl::opt<bool> gradReduceInBf16(
    "grad-reduce-in-bf16",
    cl::desc("with --bf16: accumulate and reduce gradients in bf16"),
    cl::init(false));
static cl::opt<int64_t> bucketSize(
    "bucket-size",
    cl::desc("gradient bucket size in elements (default Megatron's "
             "max(40000000, 1000000 x dp))"),
    cl::init(0));
static cl::opt<bool> distributedOptimizer(
    "use-distributed-optimizer",
    cl::desc("ZeRO-1 distributed optimizer: reduce-scatter each bucket, each "
             "dp rank updates its shard, all-gather the parameters"),
    cl::init(false));
static cl::alias distributedOptimizerAlias("dist-optimizer",
                                           cl::desc("alias for --use-distributed-optimizer"),
                                           cl::aliasopt(distributedOptimizer));
static cl::opt<bool> padBuckets(
    "pad-buckets-for-high-nccl-busbw",
    cl::desc("pad buckets to lcm(dp, 128, 2^16) elements"), cl::init(false));
static cl::opt<bool> overlapGradReduce(
    "overlap-grad-reduce",
    cl::desc("start each gradient bucket's all-reduce in the last "
             "microbatch's backward as soon as its gradients are complete"),
    cl::init(false));
static cl::opt<bool> singleBucketGroup(
    "single-bucket-group", cl::desc("reduce all buckets as one group"),
    cl::init(false));
static cl::opt<std::string> optimizer("optimizer", cl::desc("sgd or adam"),
                                      cl::init("adam"));
static cl::opt<double> lr("lr", cl::desc("learning rate"), cl::init(1e-3));
static cl::opt<double> weightDecay("weight-decay",
                                   cl::desc("decoupled weight decay"),
                                   cl::init(0.0));
static cl::opt<int64_t> lrWarmupIters("lr-warmup-iters",
                                      cl::desc("linear learning-rate warmup "
                                               "iterations"),
                                      cl::init(0));
static cl::opt<int64_t> lrDecayIters("lr-decay-iters",
                                     cl::desc("iteration at which the decay "
                                              "reaches --min-lr"),
                                     cl::init(0));
static cl::opt<std::string> lrDecayStyle("lr-decay-style",
                                         cl::desc("constant (default), linear "
                                                  "or cosine"),
                                         cl::init("constant"));
static cl::opt<double> minLr("min-lr", cl::desc("learning rate after the decay"),
                             cl::init(0.0));
static cl::opt<std::string> emit(
    "emit",
    cl::desc("what to write: artifact (default), mlir (the rt-level module) "
             "rank-groups (every rank group of the mesh; needs no model), schedule "
             "(layer placement and per-rank pipeline order), memory (the "
             "per-rank static memory plan by kind) or buckets (gradient "
             "buffers, buckets and distributed-optimizer shard ranges)"),
    cl::init("artifact"));
static cl::opt<std::string> scheduleKind(
    "schedule",
    cl::desc("pipeline schedule: none, 1f1b or interleaved (default: "
             "interleaved with --vpp > 1, else 1f1b)"),
    cl::init("auto"));
static cl::opt<int64_t> microBatches(
    "micro-batches",
    cl::desc("micro-batches per step (default: global / (micro x dp))"),
    cl::init(0));
static cl::opt<int64_t> numLayers(
    "num-layers",
    cl::desc("transformer layers, for --emit=schedule without a model"),
    cl::init(0));
static cl::opt<std::string> ppLayers(
    "pp-layers",
    cl::desc("uneven pipeline split: layers per pipeline rank, e.g. 3,5,5,3"),
    cl::init(""));
static cl::opt<std::string> emitFormat(
    "emit-format",
    cl::desc("json (default), text, or trace (a Chrome/Perfetto trace of "
             "the planned schedule)"),
                                       cl::init("json"));

static int fail(const llvm::Twine &message) {
  llvm::errs() << "tessera-compile: error: " << message << "\n";
  return 1;
}

/// Writes a report (--emit=schedule, rank-groups, memory, buckets) to -o,
/// or stdout when -o is "-" or absent. Returns the exit code.
static int writeReport(llvm::function_ref<bool(llvm::raw_ostream &)> print) {
  if (outputFile == "-")
    return print(llvm::outs()) ? 0 : 1;
  std::string error;
  auto out = mlir::openOutputFile(outputFile, &error);
  if (!out)
    return fail(error);
  if (!print(out->os()))
    return 1;
  out->keep();
  return 0;
}

/// --pp-layers as a list; false (after an error) when it does not parse.
static bool parsePpLayers(std::vector<int64_t> &out) {
  if (ppLayers.empty())
    return true;
  llvm::SmallVector<llvm::StringRef> parts;
  llvm::StringRef(ppLayers).split(parts, ',');
  for (llvm::StringRef part : parts) {
    int64_t n = 0;
    if (part.trim().getAsInteger(10, n)) {
      fail("--pp-layers must be a comma-separated list of integers, got '" +
           ppLayers + "'");
      return false;
    }
    out.push_back(n);
  }
  return true;
}

static std::string scheduleName(int64_t vpp) {
  if (scheduleKind == "auto")
    return vpp > 1 ? "interleaved" : "1f1b";
  return scheduleKind;
}

/// --emit=schedule: layers from --num-layers or the model's `nn.layer`
/// marks, micro-batches from --micro-batches or the batch sizes.
static int emitSchedule(const tessera::mesh::MeshConfig &mesh) {
  namespace sched = tessera::schedule;
  sched::PipelineConfig config;
  config.pp = mesh.pp;
  config.vpp = mesh.vpp;
  if (!sched::parseKind(scheduleName(mesh.vpp), config.kind))
    return fail("unknown --schedule=" + scheduleKind +
                " (expected none, 1f1b or interleaved)");
  config.microbatches = microBatches;
  if (config.microbatches == 0) {
    int64_t micro = microBatch, global = globalBatch;
    if (micro > 0 && global > 0 && global % (micro * mesh.dp) == 0)
      config.microbatches = global / (micro * mesh.dp);
    else if (micro > 0 || global > 0)
      return fail("give --micro-batches, or a --global-batch-size divisible by "
                  "--micro-batch-size x dp");
    else
      config.microbatches = 1;
  }
  config.layers = numLayers;
  if (!inputFile.empty()) {
    mlir::DialectRegistry registry;
    tessera::registerAllDialects(registry);
    mlir::MLIRContext context(registry);
    auto module = mlir::parseSourceFile<mlir::ModuleOp>(inputFile.getValue(),
                                                        &context);
    if (!module)
      return 1;
    std::set<int64_t> marks;
    module->walk([&](mlir::Operation *op) {
      if (auto layer = op->getAttrOfType<mlir::IntegerAttr>("nn.layer"))
        marks.insert(layer.getInt());
    });
    if (marks.empty())
      return fail("the model marks no transformer layers (nn.layer)");
    config.layers = int64_t(marks.size());
  }
  if (config.layers == 0)
    return fail("--emit=schedule needs a model or --num-layers");
  if (!parsePpLayers(config.stageLayers))
    return 1;
  if (std::string error = tessera::schedule::validate(config); !error.empty())
    return fail(error);
  return writeReport([&](llvm::raw_ostream &os) {
    tessera::printSchedule(config, emitFormat, os);
    return true;
  });
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  std::string flags;
  for (int i = 1; i < argc; ++i)
    flags += std::string(i > 1 ? " " : "") + argv[i];
  cl::ParseCommandLineOptions(argc, argv, "Tessera compiler\n");
  if (emit != "artifact" && emit != "mlir" && emit != "rank-groups" &&
      emit != "schedule" && emit != "memory" && emit != "buckets")
    return fail("unknown --emit=" + emit +
                " (expected artifact, mlir, rank-groups, schedule, memory or "
                "buckets)");
  if (emitFormat != "json" && emitFormat != "text" && emitFormat != "trace")
    return fail("unknown --emit-format=" + emitFormat +
                " (expected json, text or trace)");
  if (emitFormat == "trace" && emit != "schedule")
    return fail("--emit-format=trace draws --emit=schedule only");

  // The mesh, checked once for every kind of output.
  tessera::mesh::MeshConfig mesh;
  mesh.tp = tp;
  mesh.cp = cp;
  mesh.ep = ep;
  mesh.etp = etp;
  mesh.dp = dp == 0 ? 1 : int64_t(dp);
  mesh.pp = pp;
  mesh.vpp = vpp;
  mesh.order = order;
  if (worldSize != 0) {
    std::string error = tessera::mesh::applyWorldSize(mesh, worldSize, dp != 0);
    if (!error.empty())
      return fail(error);
  }
  if (std::string error = tessera::mesh::validateMesh(mesh); !error.empty())
    return fail("invalid mesh: " + error);

  if (emit == "rank-groups") {
    return writeReport([&](llvm::raw_ostream &os) {
      tessera::printRankGroups(mesh, emitFormat, os);
      return true;
    });
  }
  if (emit == "schedule")
    return emitSchedule(mesh);
  if (inputFile.empty())
    return fail("no input model given (only --emit=rank-groups needs none)");
  for (auto [flag, value] : {std::pair<const char *, int64_t>{"cp", mesh.cp},
                             {"ep", mesh.ep},
                             {"etp", mesh.etp}})
    if (value != 1)
      return fail(llvm::Twine("--") + flag + " " + llvm::Twine(value) +
                  ": this version compiles models with tensor, pipeline and "
                  "data parallelism (--tp, --pp, --vpp, --dp); other axes are "
                  "accepted by --emit=rank-groups");
  std::vector<int64_t> stageLayers;
  if (!parsePpLayers(stageLayers))
    return 1;
  // --micro-batches M stands for a global batch of M x micro x dp.
  int64_t global = globalBatch;
  if (microBatches != 0) {
    if (microBatch <= 0)
      return fail("--micro-batches needs --micro-batch-size");
    int64_t derived = microBatches * microBatch * mesh.dp;
    if (global != 0 && global != derived)
      return fail("--micro-batches " + llvm::Twine(int64_t(microBatches)) +
                  " disagrees with --global-batch-size " + llvm::Twine(global) +
                  " (micro-batch-size " + llvm::Twine(int64_t(microBatch)) +
                  " x dp " + llvm::Twine(mesh.dp) + " x micro-batches = " +
                  llvm::Twine(derived) + ")");
    global = derived;
  }

  DialectRegistry registry;
  tessera::registerAllDialects(registry);
  MLIRContext context(registry);
  // Errors name the op and its location; printing the op itself would dump
  // whole model functions.
  context.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  std::string error;
  auto file = openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "tessera-compile: error: " << error << "\n";
    return 1;
  }
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;
  Builder b(&context);
  (*module)->setAttr("tessera.compile_flags", b.getStringAttr(flags));
  (*module)->setAttr("tessera.model",
                     b.getStringAttr(llvm::sys::path::stem(inputFile)));

  if (gradReduceInBf16 && (!bf16 || gradReduceInFp32))
    return fail("--grad-reduce-in-bf16 needs --bf16 and excludes "
                "--grad-reduce-in-fp32");
  tessera::TrainPipelineOptions options;
  options.bf16 = bf16;
  options.gradReduceInFp32 = !gradReduceInBf16;
  options.tp = tp;
  options.dp = mesh.dp;
  options.order = order;
  options.microBatchSize = microBatch;
  options.globalBatchSize = global;
  options.pp = mesh.pp;
  options.vpp = mesh.vpp;
  for (int64_t n : stageLayers)
    options.ppLayers.push_back(n);
  options.schedule = scheduleName(mesh.vpp);
  options.makeVocabSizeDivisibleBy = vocabDivisibleBy;
  options.sequenceParallel = sequenceParallel;
  options.optimizer = optimizer;
  options.bucketSize = bucketSize;
  options.distributedOptimizer = distributedOptimizer;
  options.padBucketsForHighNcclBusbw = padBuckets;
  options.singleBucketGroup = singleBucketGroup;
  options.overlapGradReduce = overlapGradReduce;
  options.lr = lr;
  options.weightDecay = weightDecay;
  options.lrWarmupIters = lrWarmupIters;
  options.lrDecayIters = lrDecayIters;
  options.lrDecayStyle = lrDecayStyle;
  options.minLr = minLr;
  PassManager pm(&context);
  tessera::buildTrainPipeline(pm, options);
  if (failed(pm.run(*module)))
    return 1;

  if (emit == "buckets")
    return writeReport([&](llvm::raw_ostream &os) {
      return succeeded(tessera::printBuckets(*module, emitFormat, os));
    });
  if (emit == "memory")
    return writeReport([&](llvm::raw_ostream &os) {
      return succeeded(tessera::printMemory(*module, emitFormat, os));
    });
  if (emit == "mlir") {
    auto out = openOutputFile(outputFile, &error);
    if (!out) {
      llvm::errs() << "tessera-compile: error: " << error << "\n";
      return 1;
    }
    module->print(out->os());
    out->keep();
    return 0;
  }
  if (outputFile == "-") {
    llvm::errs() << "tessera-compile: error: give the artifact's path with -o\n";
    return 1;
  }
  // Write next to the target, then rename: a reader never sees half a file.
  std::string tmp = outputFile + ".tmp";
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(tmp, ec);
    if (ec) {
      llvm::errs() << "tessera-compile: error: cannot write '" << tmp
                   << "': " << ec.message() << "\n";
      return 1;
    }
    if (failed(tessera::writeArtifact(*module, os)))
      return 1;
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, outputFile)) {
    llvm::errs() << "tessera-compile: error: cannot rename to '" << outputFile
                 << "': " << ec.message() << "\n";
    return 1;
  }
  return 0;
}
