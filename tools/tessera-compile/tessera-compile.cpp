//===- tessera-compile.cpp - Model to .tsr artifact -----------------------===//
//
// Parses the flags (the training pipeline's options and the tool's own,
// declared in tessera/Pipeline) and runs the compile driver; --plan asks
// tessera-plan's search (lib/Plan) for the layout first.
//
//===----------------------------------------------------------------------===//

#include "tessera/Pipeline/Compile.h"
#include "tessera/Plan/Planner.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"

using namespace tessera;

/// --plan: the best layout of the cluster for `model`; explicit parallel
/// flags restrict the search.
static mlir::LogicalResult planLayout(mlir::ModuleOp model,
                                      const TrainPipelineOptions &given,
                                      TrainPipelineOptions &p,
                                      llvm::StringRef clusterFile,
                                      int64_t worldSize) {
  auto fail = [](const llvm::Twine &msg) {
    llvm::errs() << "tessera-compile: error: " << msg << "\n";
    return mlir::failure();
  };
  llvm::Expected<plan::Cluster> cluster = plan::readCluster(clusterFile.str());
  if (!cluster)
    return fail(llvm::toString(cluster.takeError()));
  if (worldSize > 0) {
    if (worldSize % cluster->gpusPerNode)
      return fail(llvm::formatv("--world-size {0} is not a multiple of the "
                                "cluster's {1} GPUs per node",
                                worldSize, cluster->gpusPerNode));
    cluster->nodes = worldSize / cluster->gpusPerNode;
  }
  plan::PlanOptions options;
  options.module = model;
  options.globalBatch = p.globalBatchSize;
  // fp16 spends memory as bf16 does (16-bit parameters, fp32 main
  // parameters and gradients); the planner plans it as bf16.
  const bool fp16 = p.fp16;
  options.bf16 = p.bf16 || fp16;
  // fp16's activations are f32 (16-bit ones are bf16's).
  options.activationBytes = usesBf16Activations(p) ? 2 : 4;
  options.gradReduceBf16 = p.gradReduceInBf16;
  options.verifyTop = 0;
  if (given.tp.getNumOccurrences())
    options.tp = given.tp;
  if (given.cp.getNumOccurrences())
    options.cp = given.cp;
  if (given.pp.getNumOccurrences())
    options.pp = given.pp;
  if (given.vpp.getNumOccurrences())
    options.vpp = given.vpp;
  if (given.microBatchSize.getNumOccurrences())
    options.microBatch = given.microBatchSize;
  // The planner's own choices may not be given as well.
  if (given.dp.getNumOccurrences() || given.ppLayers.getNumOccurrences() ||
      !given.pipelineModelParallelLayout.empty() ||
      given.decoderFirstPipelineNumLayers.getNumOccurrences() ||
      given.decoderLastPipelineNumLayers.getNumOccurrences() ||
      given.accountForEmbeddingInPipelineSplit ||
      given.accountForLossInPipelineSplit)
    return fail("--plan chooses dp and an even layer split: drop --dp, "
                "--pp-layers and Megatron's split options "
                "(--pipeline-model-parallel-layout, "
                "--decoder-first/last-pipeline-num-layers, "
                "--account-for-embedding/loss-in-pipeline-split), or compile "
                "without --plan");
  if (given.recomputeGranularity.getNumOccurrences()) {
    options.recompute = given.recomputeGranularity;
    if (given.recomputeGranularity == "full" &&
        (given.recomputeMethod != "uniform" || given.recomputeNumLayers != 1))
      return fail("--plan plans full recompute as --recompute-method uniform "
                  "--recompute-num-layers 1; give those, or compile without "
                  "--plan");
  }
  if (given.distributedOptimizer.getNumOccurrences())
    options.distributedOptimizer = given.distributedOptimizer ? 1 : 0;
  if (!given.dataParallelShardingStrategy.empty()) {
    const std::string &s = given.dataParallelShardingStrategy;
    options.distributedOptimizer = s == "no_shard" ? 0 : 1;
    options.shardGrads = s == "optim_grads" || s == "optim_grads_params" ? 1 : 0;
    options.shardParams = s == "optim_grads_params" ? 1 : 0;
  }
  // The planner plans GPU clusters, whose backend refuses the V-shaped
  // schedules (their sends stay in flight, which NCCL's one p2p stream
  // cannot do yet).
  if (given.schedule == "zbv" || given.schedule == "dualpipev")
    return fail("--plan does not plan --schedule " + given.schedule +
                " (the CUDA backend does not run it yet); give the layout "
                "without --plan");
  // A given schedule of one chunk per rank (1f1b, zb-h1) plans only layouts
  // without virtual stages, under it (zb-h1 also needs --pp > 1, which the
  // options check asked for); interleaved needs --vpp, none pp 1: those the
  // flags already restrict.
  if (given.schedule.getNumOccurrences() &&
      (given.schedule == "1f1b" || given.schedule == "zb-h1")) {
    options.zeroBubble = given.schedule == "zb-h1" ? 1 : 0;
    options.vpp = 1;
  }
  if (given.overlapGradReduce.getNumOccurrences())
    options.overlapGradReduce = given.overlapGradReduce;
  if (given.overlapParamGather.getNumOccurrences())
    options.overlapParamGather = given.overlapParamGather;
  if (given.tpCommOverlap.getNumOccurrences())
    options.tpCommOverlap = given.tpCommOverlap;
  if (p.globalBatchSize <= 0)
    return fail("--plan needs --global-batch-size");
  llvm::Expected<plan::PlanResult> result = plan::plan(*cluster, options);
  if (!result)
    return fail(llvm::toString(result.takeError()));
  if (result->ranked.empty() || !result->ranked.front().feasible)
    return fail("--plan: " + plan::explainNoLayout(*result, *cluster));
  const plan::Prediction &best = result->ranked.front();
  const plan::Layout &l = best.layout;
  l.apply(p, p.globalBatchSize);
  if (fp16)
    p.bf16 = false;
  std::string flags;
  std::vector<std::string> planned = l.flags(p.globalBatchSize);
  for (size_t i = 0; i < planned.size(); ++i) {
    // fp16's activations are f32 without asking.
    if (fp16 && planned[i] == "--activations-dtype") {
      ++i;
      continue;
    }
    flags += " " + (fp16 && planned[i] == "--bf16" ? std::string("--fp16")
                                                    : planned[i]);
  }
  llvm::errs() << llvm::formatv(
      "tessera-compile: plan for {0} GPUs ({1}):{2}; predicted {3:F3} s/step, "
      "MFU {4:F3}, {5:F1} GiB on the fullest rank\n",
      cluster->gpus(), cluster->name, flags, best.stepSeconds, best.mfu,
      best.memoryBytes / double(1 << 30));
  return mlir::success();
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  CompileOptions options;
  options.planLayout = planLayout;
  // --help lists tessera-compile's flags, not every LLVM option linked in.
  llvm::cl::HideUnrelatedOptions(getCompileCategory());
  describeDefaults(options);
  llvm::cl::ParseCommandLineOptions(argc, argv, "Tessera compiler\n");
  return compile(options, llvm::ArrayRef<const char *>(argv + 1, argv + argc));
}
