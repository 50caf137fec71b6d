//===- tessera-plan.cpp - Rank parallel layouts for a model and cluster ---===//
//
// tessera-plan gpt --layers 96 --hidden 12288 --heads 96 --seq 2048
//     --vocab 51200 --global-batch-size 1536 --cluster dgx-a100-80gb.json
//     [--nodes 128] [--tp 8 --pp 8 ...] [--top 10] [--format text]
// tessera-plan llama3-8b|llama3-70b|llama3.1-405b|qwen3-8b|mistral-7b
//     [--layers ...]
//     --global-batch-size 1024 --cluster ...
// tessera-plan model.mlir|model.onnx [--loss cross-entropy] --cluster ...
//
// Prints the feasible layouts, fastest first, with the predicted step time,
// TFLOP/s per GPU, MFU, bubble, exposed communication and memory per GPU,
// and the tessera-compile flags of each (lib/Plan).
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxImport.h"
#include "tessera/InitAll.h"
#include "tessera/Plan/Planner.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/SourceMgr.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

static cl::OptionCategory category("tessera-plan options");
static cl::opt<std::string> model(
    cl::Positional,
    cl::desc("<model: gpt (by the flags below), a preset (llama3-8b, "
             "llama3-70b, llama3.1-405b, qwen3-8b, mistral-7b, "
             "mixtral-8x7b), or a .mlir or .onnx file>"),
    cl::Required, cl::cat(category));
static cl::opt<std::string> loss("loss",
                                 cl::desc("for an ONNX model that returns "
                                          "logits: cross-entropy"),
                                 cl::init(""), cl::cat(category));
static cl::opt<std::string> clusterFile("cluster",
                                        cl::desc("cluster description (JSON)"),
                                        cl::Required, cl::cat(category));
static cl::opt<int64_t> nodes("nodes",
                              cl::desc("nodes to plan for (default: the "
                                       "cluster file's)"),
                              cl::init(0), cl::cat(category));
static cl::opt<int64_t> layers("layers", cl::desc("transformer layers"),
                               cl::init(24), cl::cat(category));
static cl::opt<int64_t> hidden("hidden", cl::desc("hidden size"),
                               cl::init(2048), cl::cat(category));
static cl::opt<int64_t> heads("heads", cl::desc("attention heads"),
                              cl::init(16), cl::cat(category));
static cl::opt<int64_t> vocab("vocab", cl::desc("vocabulary size"),
                              cl::init(51200), cl::cat(category));
static cl::opt<int64_t> seqLength("seq", cl::desc("sequence length"), cl::init(2048),
                            cl::cat(category));
static cl::opt<int64_t> ffn("ffn", cl::desc("MLP hidden size (default 4 x hidden)"),
                            cl::init(0), cl::cat(category));
static cl::opt<int64_t> globalBatch("global-batch-size",
                                    cl::desc("samples per step"), cl::Required,
                                    cl::cat(category));
static cl::opt<bool> fp32("fp32",
                          cl::desc("plan fp32 training (default: bf16 mixed "
                                   "precision, Megatron's --bf16)"),
                          cl::init(false), cl::cat(category));
static cl::opt<int64_t> tp("tp", cl::desc("only this tensor-parallel size"),
                           cl::init(0), cl::cat(category));
static cl::opt<int64_t> cp("cp", cl::desc("only this context-parallel size"),
                           cl::init(0), cl::cat(category));
static cl::opt<int64_t> pp("pp", cl::desc("only this pipeline-parallel size"),
                           cl::init(0), cl::cat(category));
static cl::opt<int64_t> vpp("vpp", cl::desc("only this virtual pipeline size"),
                            cl::init(0), cl::cat(category));
static cl::opt<int64_t> ep("ep",
                           cl::desc("only this expert-parallel size (models "
                                    "with experts)"),
                           cl::init(0), cl::cat(category));
static cl::opt<int64_t> etp("etp",
                            cl::desc("only this expert tensor-parallel size "
                                     "(models with experts; default: 1 and "
                                     "tp are searched)"),
                            cl::init(0), cl::cat(category));
static cl::opt<int64_t> microBatch("micro-batch-size",
                                   cl::desc("only this micro-batch size"),
                                   cl::init(0), cl::cat(category));
static cl::opt<std::string> recompute("recompute",
                                      cl::desc("only none, selective or full"),
                                      cl::init(""), cl::cat(category));
static cl::opt<int> distOpt("distributed-optimizer",
                            cl::desc("only with (1) or without (0) the "
                                     "distributed optimizer"),
                            cl::init(-1), cl::cat(category));
static cl::opt<std::string> shardingStrategy(
    "data-parallel-sharding-strategy",
    cl::desc("only no_shard, optim (the distributed optimizer), "
             "optim_grads (ZeRO-2) or optim_grads_params (ZeRO-3) layouts"),
    cl::init(""), cl::cat(category));
static cl::opt<std::string> scheduleOpt(
    "schedule",
    cl::desc("the pipeline schedule of layouts without virtual stages: "
             "1f1b or zb-h1 (the zero-bubble schedule); default: both are "
             "searched"),
    cl::init(""), cl::cat(category));
static cl::opt<bool> noOverlap(
    "no-overlap-grad-reduce",
    cl::desc("reduce the data-parallel gradients after the backward instead "
             "of overlapping them with it"),
    cl::init(false), cl::cat(category));
static cl::opt<bool> gradBf16("grad-reduce-in-bf16",
                              cl::desc("reduce gradients in bf16"),
                              cl::init(false), cl::cat(category));
static cl::opt<std::string> activations(
    "activations",
    cl::desc("bf16 (the default under bf16: Megatron's 16-bit activations "
             "and transfers, as --bf16 compiles them; with --fp32, an fp32 "
             "compile halved) or fp32 (the default with --fp32; under bf16 "
             "the layouts compile with --activations-dtype f32)"),
    cl::init(""), cl::cat(category));
static cl::opt<bool> noOverlapParamGather(
    "no-overlap-param-gather",
    cl::desc("plan without --overlap-param-gather (the distributed "
             "optimizer's all-gather then runs in the step)"),
    cl::init(false), cl::cat(category));
static cl::opt<bool> noTpCommOverlap(
    "no-tp-comm-overlap",
    cl::desc("plan without --tp-comm-overlap (the sequence-parallel "
             "all-gathers and reduce-scatters then run apart from their "
             "GEMMs)"),
    cl::init(false), cl::cat(category));
static cl::opt<int64_t> top("top", cl::desc("layouts to print (default 10)"),
                            cl::init(10), cl::cat(category));
static cl::opt<int64_t> verifyTop(
    "verify-top",
    cl::desc("compile the best N layouts whole for their exact memory "
             "(default 1)"),
    cl::init(1), cl::cat(category));
static cl::opt<std::string> outputFormat("format", cl::desc("json (default) or text"),
                                   cl::init("json"), cl::cat(category));

static int fail(const Twine &message) {
  errs() << "tessera-plan: error: " << message << "\n";
  return 1;
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(argc, argv, "Tessera parallel-layout planner\n");
  // A model file is planned as it is; "gpt" is built from the flags.
  mlir::DialectRegistry registry;
  tessera::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  context.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::optional<tessera::GPTConfig> preset = tessera::gptPreset(model);
  if (model != "gpt" && !preset) {
    if (tessera::isOnnxFile(model)) {
      tessera::OnnxImportOptions onnx;
      onnx.loss = loss;
      module = tessera::importOnnxModel(&context, model, onnx);
    } else if (StringRef(model).ends_with(".mlir")) {
      std::string error;
      auto file = mlir::openInputFile(model, &error);
      if (!file)
        return fail(error);
      sourceMgr.AddNewSourceBuffer(std::move(file), SMLoc());
      module = mlir::parseSourceFile<mlir::ModuleOp>(sourceMgr, &context);
    } else {
      return fail("unknown model '" + model +
                  "' (gpt with its flags, a preset such as llama3-8b, or a "
                  ".mlir or .onnx file)");
    }
    if (!module)
      return 1;
  }
  if (outputFormat != "json" && outputFormat != "text")
    return fail("unknown --format=" + outputFormat + " (json or text)");
  if (top < 1)
    return fail("--top must be at least 1, got " + Twine(top));
  if (verifyTop < 0)
    return fail("--verify-top must be 0 (no compile) or more, got " +
                Twine(verifyTop));
  if (!recompute.empty() && recompute != "none" && recompute != "selective" &&
      recompute != "full")
    return fail("--recompute must be none, selective or full, got '" +
                recompute + "'");
  Expected<tessera::plan::Cluster> cluster =
      tessera::plan::readCluster(clusterFile);
  if (!cluster)
    return fail(toString(cluster.takeError()));
  if (nodes < 0)
    return fail("--nodes must be positive");
  if (nodes > 0)
    cluster->nodes = nodes;
  tessera::plan::PlanOptions options;
  options.module = module ? *module : mlir::ModuleOp();
  // A preset's model (tessera-gen's), its sizes overridden by those given.
  if (preset)
    options.model = *preset;
  auto set = [&](int64_t &field, const cl::opt<int64_t> &opt) {
    if (!preset || opt.getNumOccurrences() > 0)
      field = opt;
  };
  set(options.model.layers, layers);
  set(options.model.hidden, hidden);
  set(options.model.heads, heads);
  set(options.model.vocab, vocab);
  set(options.model.seq, seqLength);
  set(options.model.ffn, ffn);
  options.globalBatch = globalBatch;
  options.bf16 = !fp32;
  options.tp = tp;
  options.cp = cp;
  options.pp = pp;
  options.vpp = vpp;
  options.ep = ep;
  options.etp = etp;
  if (ep < 0 || etp < 0)
    return fail("--ep and --etp must be positive");
  options.microBatch = microBatch;
  options.recompute = recompute;
  options.distributedOptimizer = distOpt;
  if (!shardingStrategy.empty()) {
    const std::string &s = shardingStrategy;
    if (s != "no_shard" && s != "optim" && s != "optim_grads" &&
        s != "optim_grads_params")
      return fail("--data-parallel-sharding-strategy must be no_shard, optim, "
                  "optim_grads or optim_grads_params, got '" + s + "'");
    const int dist = s == "no_shard" ? 0 : 1;
    if (distOpt >= 0 && distOpt != dist)
      return fail("--data-parallel-sharding-strategy " + s +
                  " contradicts --distributed-optimizer " +
                  std::to_string(int(distOpt)));
    options.distributedOptimizer = dist;
    options.shardGrads = s == "optim_grads" || s == "optim_grads_params" ? 1 : 0;
    options.shardParams = s == "optim_grads_params" ? 1 : 0;
  }
  if (!scheduleOpt.empty()) {
    if (scheduleOpt != "1f1b" && scheduleOpt != "zb-h1")
      return fail("--schedule must be 1f1b or zb-h1, got '" + scheduleOpt +
                  "' (layouts with virtual stages run the interleaved "
                  "schedule)");
    options.zeroBubble = scheduleOpt == "zb-h1" ? 1 : 0;
  }
  options.verifyTop = verifyTop;
  options.overlapGradReduce = !noOverlap;
  options.overlapParamGather = !noOverlapParamGather;
  options.tpCommOverlap = !noTpCommOverlap;
  if (!activations.empty() && activations != "fp32" && activations != "bf16")
    return fail("--activations must be fp32 or bf16, got '" + activations + "'");
  options.activationBytes =
      activations == "bf16" || (activations.empty() && !fp32) ? 2 : 4;
  options.gradReduceBf16 = gradBf16;
  if (gradBf16 && fp32)
    return fail("--grad-reduce-in-bf16 needs bf16 training (no --fp32)");
  Expected<tessera::plan::PlanResult> result =
      tessera::plan::plan(*cluster, options);
  if (!result)
    return fail(toString(result.takeError()));
  if (result->ranked.empty() || !result->ranked.front().feasible) {
    tessera::plan::printPlan(*result, *cluster, options, top,
                             outputFormat == "text", outs());
    return fail(tessera::plan::explainNoLayout(*result, *cluster));
  }
  tessera::plan::printPlan(*result, *cluster, options, top, outputFormat == "text",
                           outs());
  return 0;
}
