//===- Pipeline.cpp - Registration and the training pipeline --------------===//

#include "tessera/Pipeline/Pipeline.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/InitAll.h"

#include "dialects/onnx/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void tessera::registerAllDialects(DialectRegistry &registry) {
  registry.insert<TesseraDialect, nn::NNDialect, dist::DistDialect,
                  rt::RTDialect, onnx::OnnxDialect, func::FuncDialect>();
}

llvm::cl::OptionCategory &tessera::getCompileCategory() {
  static llvm::cl::OptionCategory category("tessera-compile options");
  return category;
}

std::string
tessera::checkTrainPipelineOptions(const TrainPipelineOptions &options) {
  if (options.gradReduceInBf16 &&
      (!options.bf16 || options.gradReduceInFp32.getNumOccurrences()))
    return "--grad-reduce-in-bf16 needs --bf16 and excludes "
           "--grad-reduce-in-fp32";
  if (options.bf16 && options.fp16)
    return "--fp16 and --bf16 exclude each other (one 16-bit parameter "
           "dtype)";
  if (options.fp16 && options.gradReduceInFp32.getNumOccurrences() &&
      !options.gradReduceInFp32)
    return "--fp16 reduces gradients in f32 (Megatron's "
           "--accumulate-allreduce-grads-in-fp32); --grad-reduce-in-fp32=false "
           "is not supported with it";
  if (options.gemmDtype.getNumOccurrences() && !options.bf16 && !options.fp16)
    return "--gemm-dtype needs --bf16 or --fp16 (without them every GEMM is "
           "f32)";
  if (!options.fp16) {
    const std::pair<const char *, bool> scalerFlags[] = {
        {"loss-scale", options.lossScale.getNumOccurrences() > 0},
        {"initial-loss-scale", options.initialLossScale.getNumOccurrences() > 0},
        {"min-loss-scale", options.minLossScale.getNumOccurrences() > 0},
        {"loss-scale-window", options.lossScaleWindow.getNumOccurrences() > 0},
        {"hysteresis", options.hysteresis.getNumOccurrences() > 0}};
    for (auto [flag, given] : scalerFlags)
      if (given)
        return std::string("--") + flag +
               " needs --fp16 (loss scaling is fp16's; bf16 and fp32 train "
               "unscaled)";
  }
  if (options.decoderFirstPipelineNumLayers.getNumOccurrences() &&
      options.decoderFirstPipelineNumLayers <= 0)
    return "num_layers_in_first_pipeline_stage must be larger than 0 "
           "(--decoder-first-pipeline-num-layers " +
           std::to_string(int64_t(options.decoderFirstPipelineNumLayers)) + ")";
  if (options.decoderLastPipelineNumLayers.getNumOccurrences() &&
      options.decoderLastPipelineNumLayers <= 0)
    return "num_layers_in_last_pipeline_stage must be larger than 0 "
           "(--decoder-last-pipeline-num-layers " +
           std::to_string(int64_t(options.decoderLastPipelineNumLayers)) + ")";
  if (!options.pipelineModelParallelLayout.empty()) {
    std::string error;
    int64_t detected = schedule::layoutVpp(options.pipelineModelParallelLayout,
                                           options.pp, error);
    if (!error.empty())
      return error;
    if (options.vpp.getNumOccurrences() && detected != options.vpp)
      return "virtual_pipeline_model_parallel_size conflicts with "
             "pipeline_model_parallel_layout, "
             "(virtual_pipeline_model_parallel_size=" +
             std::to_string(int64_t(options.vpp)) +
             ", detected_vpp_size=" + std::to_string(detected) + ")";
  }
  if (options.schedule == "zbv" || options.schedule == "dualpipev") {
    if (options.pp <= 1)
      return "--schedule " + options.schedule +
             " needs pipeline parallelism (--pp > 1)";
    if (effectiveVpp(options) != 2)
      return "--schedule " + options.schedule +
             " runs exactly two model chunks per pipeline rank, placed as a "
             "V (--vpp 2, the default under it), got --vpp " +
             std::to_string(effectiveVpp(options));
    if (!options.ppLayers.empty())
      return "--pp-layers gives layers per rank, but --schedule " +
             options.schedule +
             " runs two chunks per rank (give "
             "--pipeline-model-parallel-layout)";
  }
  if (options.schedule == "zb-h1") {
    if (options.pp <= 1)
      return "--schedule zb-h1 needs pipeline parallelism (--pp > 1)";
    if (effectiveVpp(options) > 1)
      return "--schedule zb-h1 runs one model chunk per pipeline rank; "
             "it cannot be combined with virtual pipeline stages (--vpp " +
             std::to_string(effectiveVpp(options)) + ")";
  }
  const std::string &strategy = options.dataParallelShardingStrategy;
  if (!strategy.empty() && strategy != "no_shard" && strategy != "optim" &&
      strategy != "optim_grads" && strategy != "optim_grads_params")
    return "--data-parallel-sharding-strategy must be no_shard, optim, "
           "optim_grads or optim_grads_params, got '" +
           strategy + "'";
  if (strategy == "no_shard" && options.distributedOptimizer)
    return "--data-parallel-sharding-strategy no_shard contradicts "
           "--use-distributed-optimizer";
  if ((strategy == "optim_grads" || strategy == "optim_grads_params") &&
      options.distributedOptimizer.getNumOccurrences() &&
      !options.distributedOptimizer)
    return "--data-parallel-sharding-strategy " + strategy +
           " needs the distributed optimizer (--use-distributed-optimizer="
           "false given)";
  // Megatron's checks (arguments.py), with its words.
  if (options.tpCommOverlap && (!options.sequenceParallel || options.tp <= 1))
    return "Tensor parallel communication/GEMM overlap can happen only when "
           "sequence parallelism is enabled (--tp-comm-overlap needs "
           "--sequence-parallel and --tp > 1)";
  if ((options.disableTpCommOverlapAg || options.disableTpCommOverlapRs) &&
      !options.tpCommOverlap)
    return std::string("--disable-tp-comm-overlap-") +
           (options.disableTpCommOverlapAg ? "ag" : "rs") +
           " needs --tp-comm-overlap (without it nothing is overlapped)";
  if (options.overlapParamGather && !usesDistributedOptimizer(options))
    return "--overlap-param-gather only supported with distributed optimizer "
           "(--use-distributed-optimizer)";
  if (options.overlapParamGather && !options.overlapGradReduce)
    return "Must use --overlap-param-gather with --overlap-grad-reduce";
  if (!options.activationsDtype.empty() &&
      options.activationsDtype != "bf16" && options.activationsDtype != "f32")
    return "--activations-dtype must be bf16 or f32, got '" +
           options.activationsDtype + "'";
  if (options.activationsDtype == "bf16" && !options.bf16)
    return "--activations-dtype bf16 needs --bf16 (bf16 parameters)";
  if (options.gemmDtype != "bf16" && options.gemmDtype != "f32")
    return "--gemm-dtype must be bf16 or f32, got '" + options.gemmDtype + "'";
  if (!options.moeRouterDtype.empty() && options.moeRouterDtype != "fp32")
    return "--moe-router-dtype must be fp32 (the router's GEMM is otherwise "
           "in the GEMM dtype), got '" +
           options.moeRouterDtype + "'";
  return "";
}

tessera::schedule::SplitOptions
tessera::splitOptions(const TrainPipelineOptions &options) {
  schedule::SplitOptions split;
  split.layout = options.pipelineModelParallelLayout;
  split.firstStageLayers = options.decoderFirstPipelineNumLayers;
  split.lastStageLayers = options.decoderLastPipelineNumLayers;
  split.accountForEmbedding = options.accountForEmbeddingInPipelineSplit;
  split.accountForLoss = options.accountForLossInPipelineSplit;
  return split;
}

bool tessera::usesDistributedOptimizer(const TrainPipelineOptions &options) {
  return options.distributedOptimizer ||
         options.dataParallelShardingStrategy == "optim" ||
         options.dataParallelShardingStrategy == "optim_grads" ||
         options.dataParallelShardingStrategy == "optim_grads_params";
}

bool tessera::usesBf16Activations(const TrainPipelineOptions &options) {
  // Megatron's --bf16 stores activations in bf16; --activations-dtype f32
  // keeps them f32 (and they are f32 without --bf16, where --activations-dtype
  // bf16 is refused).
  if (options.activationsDtype.empty())
    return options.bf16;
  return options.activationsDtype == "bf16";
}

int64_t tessera::effectiveVpp(const TrainPipelineOptions &options) {
  // The V-shaped schedules run two chunks per rank unless told otherwise.
  if ((options.schedule == "zbv" || options.schedule == "dualpipev") &&
      !options.vpp.getNumOccurrences() &&
      options.pipelineModelParallelLayout.empty())
    return 2;
  if (options.pipelineModelParallelLayout.empty() ||
      options.vpp.getNumOccurrences())
    return options.vpp;
  std::string error;
  int64_t vpp = schedule::layoutVpp(options.pipelineModelParallelLayout,
                                    options.pp, error);
  return error.empty() ? vpp : int64_t(options.vpp);
}

// The one place where the pipeline's options become the passes' options.
void tessera::buildTrainPipeline(OpPassManager &pm,
                                 const TrainPipelineOptions &options) {
  dist::AttachMeshPassOptions mesh;
  mesh.tp = options.tp;
  mesh.cp = options.cp;
  mesh.ep = options.ep;
  mesh.etp = options.etp;
  mesh.dp = options.dp == 0 ? 1 : int64_t(options.dp);
  mesh.pp = options.pp;
  mesh.vpp = effectiveVpp(options);
  mesh.order = options.order;
  pm.addPass(dist::createAttachMeshPass(mesh));

  dist::SetBatchPassOptions batch;
  batch.microBatchSize = options.microBatchSize;
  batch.globalBatchSize = options.globalBatchSize;
  pm.addPass(dist::createSetBatchPass(batch));

  dist::PadVocabPassOptions pad;
  pad.divisibleBy = options.makeVocabSizeDivisibleBy;
  pad.maskPadding = options.maskPaddedVocab;
  pm.addPass(dist::createPadVocabPass(pad));

  dist::TPPartitionPassOptions tp;
  tp.sequenceParallel = options.sequenceParallel;
  pm.addPass(dist::createTPPartitionPass(tp));
  pm.addPass(dist::createCPPartitionPass());
  pm.addPass(dist::createEPPartitionPass());

  dist::PPSplitPassOptions split;
  split.stageLayers.assign(options.ppLayers.begin(), options.ppLayers.end());
  schedule::SplitOptions megatron = splitOptions(options);
  split.layout = megatron.layout;
  split.firstStageLayers = megatron.firstStageLayers;
  split.lastStageLayers = megatron.lastStageLayers;
  split.accountForEmbedding = megatron.accountForEmbedding;
  split.accountForLoss = megatron.accountForLoss;
  split.vShape = options.schedule == "zbv" || options.schedule == "dualpipev";
  pm.addPass(dist::createPPSplitPass(split));

  if (options.bf16 || options.fp16) {
    nn::MixedPrecisionPassOptions mp;
    mp.paramsDtype = options.fp16 ? "f16" : "bf16";
    mp.gradReduceInFp32 = options.gradReduceInFp32 && !options.gradReduceInBf16;
    mp.gemmDtype = options.gemmDtype;
    mp.moeRouterDtype = options.moeRouterDtype;
    pm.addPass(nn::createMixedPrecisionPass(mp));
  }

  if (!options.recomputeGranularity.empty() ||
      !options.recomputeMethod.empty() || options.recomputeNumLayers != 0) {
    nn::RecomputePassOptions recompute;
    recompute.granularity = options.recomputeGranularity;
    recompute.method = options.recomputeMethod;
    recompute.numLayers = options.recomputeNumLayers;
    pm.addPass(nn::createRecomputePass(recompute));
  }

  if (options.fuseBiasGelu)
    pm.addPass(nn::createFuseBiasGeluPass());
  if (options.fuseCrossEntropy)
    pm.addPass(nn::createFuseCrossEntropyPass());
  if (options.fuseAddLayerNorm)
    pm.addPass(nn::createFuseAddLayerNormPass());

  // After the fusions, which match the ops as written.
  if (usesBf16Activations(options))
    pm.addPass(nn::createBf16ActivationsPass());

  pm.addPass(nn::createAutodiffPass());
  // The 16-bit GEMMs' operands gathered in 16 bits (the forward's and the
  // backward's gathers, as autodiff made them).
  if (options.bf16 || options.fp16)
    pm.addPass(dist::createCastBeforeGatherPass());

  dist::DPGradAllReducePassOptions grads;
  grads.bucketSize = options.bucketSize;
  grads.distributedOptimizer = usesDistributedOptimizer(options);
  grads.shardGrads = options.dataParallelShardingStrategy == "optim_grads" ||
                     options.dataParallelShardingStrategy ==
                         "optim_grads_params";
  grads.shardParams =
      options.dataParallelShardingStrategy == "optim_grads_params";
  grads.padBucketsForHighNcclBusbw = options.padBucketsForHighNcclBusbw;
  grads.singleBucketGroup = options.singleBucketGroup;
  grads.overlapGradReduce = options.overlapGradReduce;
  pm.addPass(dist::createDPGradAllReducePass(grads));

  nn::OptimizerPassOptions opt;
  opt.optimizer = options.optimizer;
  opt.lr = options.lr;
  opt.weightDecay = options.weightDecay;
  opt.beta1 = options.adamBeta1;
  opt.beta2 = options.adamBeta2;
  opt.eps = options.adamEps;
  opt.clipGrad = options.clipGrad;
  opt.sgdMomentum = options.sgdMomentum;
  opt.logParamsNorm = options.logParamsNorm;
  opt.lrWarmupIters = options.lrWarmupIters;
  opt.lrDecayIters = options.lrDecayIters;
  opt.lrDecayStyle = options.lrDecayStyle;
  opt.minLr = options.minLr;
  opt.lossScale = options.lossScale;
  opt.initialLossScale = options.initialLossScale;
  opt.minLossScale = options.minLossScale;
  opt.lossScaleWindow = options.lossScaleWindow;
  opt.hysteresis = options.hysteresis;
  // (Under ZeRO-3 the step gathers nothing: --overlap-param-gather is the
  // phases' prefetch, tessera-gather-params'.)
  opt.overlapParamGather =
      options.overlapParamGather &&
      options.dataParallelShardingStrategy != "optim_grads_params";
  pm.addPass(nn::createOptimizerPass(opt));
  // The forward-only phase tessera-run --eval-only runs.
  pm.addPass(nn::createEvalPhasePass());

  // The zero-bubble schedules run each backward as B and W.
  schedule::Kind kind;
  if (schedule::parseKind(options.schedule, kind) &&
      schedule::splitsBackward(kind))
    pm.addPass(dist::createSplitBackwardPass());
  // ZeRO-3: every phase gathers the parameter buckets it reads (after the
  // B/W split, so each of B and W gathers its own).
  if (options.dataParallelShardingStrategy == "optim_grads_params") {
    dist::GatherParamsPassOptions gather;
    gather.prefetch = options.overlapParamGather;
    pm.addPass(dist::createGatherParamsPass(gather));
  }
  // After every phase has its final ops (recomputation, B/W split).
  if (options.tpCommOverlap) {
    dist::TPCommOverlapPassOptions overlap;
    overlap.allGather = !options.disableTpCommOverlapAg;
    overlap.reduceScatter = !options.disableTpCommOverlapRs;
    pm.addPass(dist::createTPCommOverlapPass(overlap));
  }
  dist::PPSchedulePassOptions schedule;
  schedule.schedule = options.schedule;
  pm.addPass(dist::createPPSchedulePass(schedule));
  pm.addPass(dist::createVerifySchedulePass());
  // The folded casts' CUDA kernels have not run on a GPU yet: only the
  // opt-in bf16 activations take them; --bf16 alone keeps the GPU-checked
  // Cast kernels until they have (docs/ARCHITECTURE.md, section 9).
  LowerToRTPassOptions lower;
  lower.foldCasts = options.fuseCasts && usesBf16Activations(options);
  pm.addPass(createLowerToRTPass(lower));
  if (options.fuseBucketOptimizer)
    pm.addPass(createFuseBucketOptimizerPass());
}

void tessera::registerAllPasses() {
  dist::registerTesseraDistPasses();
  nn::registerTesseraNNPasses();
  onnx::registerTesseraOnnxPasses();
  // The ONNX frontend's pipeline uses common-subexpression elimination.
  mlir::registerCSEPass();
  registerTesseraConversionPasses();
  // PassPipelineRegistration<TrainPipelineOptions>, plus the options check.
  registerPassPipeline(
      "tessera-train-pipeline",
      "the whole compilation from an nn model to an rt program",
      [](OpPassManager &pm, StringRef text,
         function_ref<LogicalResult(const Twine &)> errorHandler) {
        TrainPipelineOptions options;
        if (failed(options.parseFromString(text)))
          return failure();
        if (std::string error = checkTrainPipelineOptions(options);
            !error.empty())
          return errorHandler(error);
        buildTrainPipeline(pm, options);
        return success();
      },
      [](function_ref<void(const mlir::detail::PassOptions &)> printHelp) {
        printHelp(TrainPipelineOptions());
      });
}
