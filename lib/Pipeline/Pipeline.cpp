//===- Pipeline.cpp - Registration and the training pipeline --------------===//

#include "tessera/Pipeline/Pipeline.h"
#include "dialects/dist/Transforms/Passes.h"
#include "dialects/nn/Transforms/Passes.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/InitAll.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void tessera::registerAllDialects(DialectRegistry &registry) {
  registry.insert<nn::NNDialect, dist::DistDialect, rt::RTDialect,
                  func::FuncDialect>();
}

void tessera::buildTrainPipeline(OpPassManager &pm,
                                 const TrainPipelineOptions &options) {
  dist::AttachMeshPassOptions mesh;
  mesh.tp = options.tp;
  mesh.dp = options.dp;
  mesh.pp = options.pp;
  mesh.vpp = options.vpp;
  mesh.order = options.order;
  pm.addPass(dist::createAttachMeshPass(mesh));
  pm.addPass(dist::createSetBatchPass(
      {options.microBatchSize, options.globalBatchSize}));
  dist::PadVocabPassOptions pad;
  pad.divisibleBy = options.makeVocabSizeDivisibleBy;
  pm.addPass(dist::createPadVocabPass(pad));
  dist::TPPartitionPassOptions tpOptions;
  tpOptions.sequenceParallel = options.sequenceParallel;
  pm.addPass(dist::createTPPartitionPass(tpOptions));
  dist::PPSplitPassOptions split;
  split.stageLayers.assign(options.ppLayers.begin(), options.ppLayers.end());
  pm.addPass(dist::createPPSplitPass(split));
  if (options.bf16) {
    nn::MixedPrecisionPassOptions mp;
    mp.paramsDtype = "bf16";
    mp.gradReduceInFp32 = options.gradReduceInFp32;
    pm.addPass(nn::createMixedPrecisionPass(mp));
  }
  pm.addPass(nn::createAutodiffPass());
  dist::DPGradAllReducePassOptions grads;
  grads.bucketSize = options.bucketSize;
  grads.distributedOptimizer = options.distributedOptimizer;
  grads.padBucketsForHighNcclBusbw = options.padBucketsForHighNcclBusbw;
  grads.singleBucketGroup = options.singleBucketGroup;
  grads.overlapGradReduce = options.overlapGradReduce;
  pm.addPass(dist::createDPGradAllReducePass(grads));
  nn::OptimizerPassOptions opt;
  opt.optimizer = options.optimizer;
  opt.lr = options.lr;
  opt.weightDecay = options.weightDecay;
  opt.lrWarmupIters = options.lrWarmupIters;
  opt.lrDecayIters = options.lrDecayIters;
  opt.lrDecayStyle = options.lrDecayStyle;
  opt.minLr = options.minLr;
  pm.addPass(nn::createOptimizerPass(opt));
  pm.addPass(dist::createPPSchedulePass({options.schedule}));
  pm.addPass(dist::createVerifySchedulePass());
  pm.addPass(createLowerToRTPass());
}

void tessera::registerAllPasses() {
  dist::registerTesseraDistPasses();
  nn::registerTesseraNNPasses();
  registerTesseraConversionPasses();
  PassPipelineRegistration<TrainPipelineOptions>(
      "tessera-train-pipeline",
      "the whole compilation from an nn model to an rt program",
      buildTrainPipeline);
}
