//===- Pipeline.h - The training compilation pipeline -------------*- C++ -*-===//

#ifndef TESSERA_PIPELINE_PIPELINE_H
#define TESSERA_PIPELINE_PIPELINE_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace tessera {

/// Options of `tessera-train-pipeline` and of tessera-compile.
struct TrainPipelineOptions
    : public mlir::PassPipelineOptions<TrainPipelineOptions> {
  Option<int64_t> tp{*this, "tp", llvm::cl::desc("tensor-parallel size"),
                     llvm::cl::init(1)};
  Option<int64_t> dp{*this, "dp", llvm::cl::desc("data-parallel size"),
                     llvm::cl::init(1)};
  Option<int64_t> pp{*this, "pp", llvm::cl::desc("pipeline-parallel size"),
                     llvm::cl::init(1)};
  Option<int64_t> vpp{*this, "vpp",
                      llvm::cl::desc("virtual pipeline stages (model chunks) per rank"),
                      llvm::cl::init(1)};
  ListOption<int64_t> ppLayers{*this, "pp-layers",
                               llvm::cl::desc("layers per pipeline rank (uneven split)")};
  Option<std::string> schedule{*this, "schedule",
                               llvm::cl::desc("none, 1f1b, interleaved or auto"),
                               llvm::cl::init("auto")};
  Option<std::string> order{*this, "order", llvm::cl::desc("rank order"),
                            llvm::cl::init("tp-cp-ep-dp-pp")};
  Option<int64_t> microBatchSize{*this, "micro-batch-size",
                                 llvm::cl::desc("samples per microbatch per dp rank"),
                                 llvm::cl::init(0)};
  Option<int64_t> globalBatchSize{*this, "global-batch-size",
                                  llvm::cl::desc("samples per step over all dp ranks"),
                                  llvm::cl::init(0)};
  Option<int64_t> makeVocabSizeDivisibleBy{
      *this, "make-vocab-size-divisible-by",
      llvm::cl::desc("pad the vocabulary to a multiple of this times tp"),
      llvm::cl::init(128)};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("Megatron sequence parallelism (with tp > 1)"),
      llvm::cl::init(false)};
  Option<bool> bf16{*this, "bf16",
                    llvm::cl::desc("bf16 parameters, f32 computation and main "
                                   "parameters (Megatron's --bf16)"),
                    llvm::cl::init(false)};
  Option<bool> gradReduceInFp32{
      *this, "grad-reduce-in-fp32",
      llvm::cl::desc("with bf16: accumulate and reduce gradients in f32 (else bf16)"),
      llvm::cl::init(true)};
  Option<int64_t> bucketSize{*this, "bucket-size",
                             llvm::cl::desc("gradient bucket size in elements (0: Megatron's default)"),
                             llvm::cl::init(0)};
  Option<bool> distributedOptimizer{
      *this, "distributed-optimizer",
      llvm::cl::desc("ZeRO-1: shard optimizer state and updates over dp"),
      llvm::cl::init(false)};
  Option<bool> padBucketsForHighNcclBusbw{
      *this, "pad-buckets-for-high-nccl-busbw",
      llvm::cl::desc("pad buckets to lcm(dp, 128, 2^16)"), llvm::cl::init(false)};
  Option<bool> overlapGradReduce{
      *this, "overlap-grad-reduce",
      llvm::cl::desc("start bucket reductions during the last backward"),
      llvm::cl::init(false)};
  Option<bool> singleBucketGroup{*this, "single-bucket-group",
                                 llvm::cl::desc("one bucket group for all buckets"),
                                 llvm::cl::init(false)};
  Option<std::string> optimizer{*this, "optimizer", llvm::cl::desc("sgd or adam"),
                                llvm::cl::init("adam")};
  Option<double> lr{*this, "lr", llvm::cl::desc("learning rate"),
                    llvm::cl::init(1e-3)};
  Option<double> weightDecay{*this, "weight-decay",
                             llvm::cl::desc("decoupled weight decay"),
                             llvm::cl::init(0.0)};
  Option<int64_t> lrWarmupIters{*this, "lr-warmup-iters",
                                llvm::cl::desc("linear warmup iterations"),
                                llvm::cl::init(0)};
  Option<int64_t> lrDecayIters{*this, "lr-decay-iters",
                               llvm::cl::desc("iteration the decay ends"),
                               llvm::cl::init(0)};
  Option<std::string> lrDecayStyle{*this, "lr-decay-style",
                                   llvm::cl::desc("constant, linear or cosine"),
                                   llvm::cl::init("constant")};
  Option<double> minLr{*this, "min-lr", llvm::cl::desc("final learning rate"),
                       llvm::cl::init(0.0)};
};

/// attach-mesh, set-batch, pad-vocab, tp-partition, pp-split, autodiff,
/// dp-grad-allreduce, optimizer, pp-schedule, verify-schedule, lower-to-rt
/// (serialisation is left to the caller).
void buildTrainPipeline(mlir::OpPassManager &pm,
                        const TrainPipelineOptions &options);

} // namespace tessera

#endif // TESSERA_PIPELINE_PIPELINE_H
