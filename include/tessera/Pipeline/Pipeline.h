//===- Pipeline.h - The training compilation pipeline -----------*- C++ -*-===//
//
// The options of the training pipeline are declared once, here: they are
// the options of `tessera-opt --tessera-train-pipeline="..."` and, the same
// objects registered on the process's command line, the flags of
// tessera-compile (`--tp 2`). buildTrainPipeline maps them onto each pass's
// options (Passes.td), whose defaults they take.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_PIPELINE_PIPELINE_H
#define TESSERA_PIPELINE_PIPELINE_H

#include "dialects/dist/Transforms/Passes.h"
#include "tessera/Schedule/PipelineSchedule.h"
#include "dialects/nn/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "llvm/Support/CommandLine.h"

namespace tessera {

/// The category of tessera-compile's flags in `--help`.
llvm::cl::OptionCategory &getCompileCategory();

namespace detail {
/// An llvm::cl modifier that also puts an option of a pass pipeline on the
/// process's top-level command line, in tessera-compile's category, when
/// `enabled`. A pipeline's options otherwise live in the pipeline's own
/// sub-command, which only its option string reaches.
struct OnCommandLine {
  bool enabled;
  void apply(llvm::cl::Option &option) const {
    if (!enabled)
      return;
    option.addSubCommand(llvm::cl::SubCommand::getTopLevel());
    option.addCategory(getCompileCategory());
  }
};
} // namespace detail

/// Options of `tessera-train-pipeline` and flags of tessera-compile. The
/// defaults are the passes' (Passes.td) except `dp`.
struct TrainPipelineOptions
    : public mlir::PassPipelineOptions<TrainPipelineOptions> {
  /// The options of one pipeline (`tessera-opt`, a PassPipelineRegistration).
  TrainPipelineOptions() = default;
  /// Also registers every option as a flag of the tool's command line, to be
  /// parsed by llvm::cl::ParseCommandLineOptions (tessera-compile). At most
  /// one such instance may exist; it must outlive the parsing.
  struct CommandLineTag {};
  explicit TrainPipelineOptions(CommandLineTag) : onCommandLine{true} {}

private:
  // Declared before the options, which read it when they are constructed.
  detail::OnCommandLine onCommandLine{false};

public:
  Option<int64_t> tp{*this, "tp", llvm::cl::desc("tensor-parallel size"),
                     llvm::cl::init(dist::AttachMeshPassOptions().tp),
                     onCommandLine};
  Option<int64_t> cp{*this, "cp",
                     llvm::cl::desc("context-parallel size (the sequence "
                                    "over cp ranks, Megatron's load-balanced "
                                    "layout and ring attention)"),
                     llvm::cl::init(dist::AttachMeshPassOptions().cp),
                     onCommandLine};
  Option<int64_t> ep{*this, "ep",
                     llvm::cl::desc("expert-parallel size (each MoE layer's "
                                    "experts split over ep ranks of dp)"),
                     llvm::cl::init(dist::AttachMeshPassOptions().ep),
                     onCommandLine};
  Option<int64_t> etp{*this, "etp",
                      llvm::cl::desc("expert tensor-parallel size (each "
                                     "expert's FFN split over etp ranks, "
                                     "Megatron's --expert-tensor-parallel-size; "
                                     "default: tp, as Megatron's; 1 keeps "
                                     "every expert whole)"),
                      llvm::cl::init(dist::AttachMeshPassOptions().etp),
                      onCommandLine};
  /// 0 stands for 1 in the pipeline; tessera-compile derives it from
  /// --world-size.
  Option<int64_t> dp{*this, "dp",
                     llvm::cl::desc("data-parallel size (default: world-size "
                                    "/ (tp*cp*pp), else 1)"),
                     llvm::cl::init(0), onCommandLine};
  Option<int64_t> pp{*this, "pp", llvm::cl::desc("pipeline-parallel size"),
                     llvm::cl::init(dist::AttachMeshPassOptions().pp),
                     onCommandLine};
  Option<int64_t> vpp{
      *this, "vpp", llvm::cl::desc("virtual pipeline chunks per pp rank"),
      llvm::cl::init(dist::AttachMeshPassOptions().vpp), onCommandLine};
  Option<std::string> order{*this, "order", llvm::cl::desc("rank order"),
                            llvm::cl::init(dist::AttachMeshPassOptions().order),
                            onCommandLine};
  ListOption<int64_t> ppLayers{
      *this, "pp-layers",
      llvm::cl::desc("uneven pipeline split: layers per pipeline rank, e.g. "
                     "3,5,5,3"),
      onCommandLine};
  // Megatron's uneven splits (its flags), resolved by tessera-pp-split.
  Option<std::string> pipelineModelParallelLayout{
      *this, "pipeline-model-parallel-layout",
      llvm::cl::desc("Megatron's layout of every (virtual) pipeline stage, "
                     "e.g. \"E|(t|)*3,t|L\": 'E' embedding, 't' a "
                     "transformer layer, 'L' loss, '|' between stages in "
                     "virtual stage order (gives vpp = stages / pp)"),
      llvm::cl::init(""), onCommandLine};
  Option<int64_t> decoderFirstPipelineNumLayers{
      *this, "decoder-first-pipeline-num-layers",
      llvm::cl::desc("layers on the first pipeline rank; the others split "
                     "what remains evenly (Megatron's)"),
      llvm::cl::init(-1), onCommandLine};
  Option<int64_t> decoderLastPipelineNumLayers{
      *this, "decoder-last-pipeline-num-layers",
      llvm::cl::desc("layers on the last pipeline rank (Megatron's)"),
      llvm::cl::init(-1), onCommandLine};
  Option<bool> accountForEmbeddingInPipelineSplit{
      *this, "account-for-embedding-in-pipeline-split",
      llvm::cl::desc("count the embedding as a layer of the first virtual "
                     "stage when splitting (Megatron's)"),
      llvm::cl::init(false), onCommandLine};
  Option<bool> accountForLossInPipelineSplit{
      *this, "account-for-loss-in-pipeline-split",
      llvm::cl::desc("count the loss as a layer of the last virtual stage "
                     "when splitting (Megatron's)"),
      llvm::cl::init(false), onCommandLine};
  Option<std::string> schedule{
      *this, "schedule",
      llvm::cl::desc("pipeline schedule: none, 1f1b, interleaved, zb-h1, zbv "
                     "or dualpipev (zero bubble: backwards split into input "
                     "and weight gradients; zbv and dualpipev: two chunks "
                     "per rank placed as a V; default: interleaved with "
                     "--vpp > 1, else 1f1b)"),
      llvm::cl::init(dist::PPSchedulePassOptions().schedule), onCommandLine};
  Option<int64_t> microBatchSize{
      *this, "micro-batch-size",
      llvm::cl::desc("samples per microbatch per dp rank (0, the default: "
                     "the model's static batch size)"),
      llvm::cl::init(dist::SetBatchPassOptions().microBatchSize),
      onCommandLine};
  Option<int64_t> globalBatchSize{
      *this, "global-batch-size",
      llvm::cl::desc("samples per step over all dp ranks (0, the default: "
                     "micro-batch-size x dp)"),
      llvm::cl::init(dist::SetBatchPassOptions().globalBatchSize),
      onCommandLine};
  Option<int64_t> makeVocabSizeDivisibleBy{
      *this, "make-vocab-size-divisible-by",
      llvm::cl::desc("pad the vocabulary to a multiple of this times tp "
                     "(default 128)"),
      llvm::cl::init(dist::PadVocabPassOptions().divisibleBy), onCommandLine};
  Option<std::string> maskPaddedVocab{
      *this, "mask-padded-vocab",
      llvm::cl::desc("keep the padded vocabulary rows' logits out of the "
                     "softmax and the loss, so that padding does not change "
                     "the model: true, false (Megatron's: they take part) or "
                     "auto (the default: true for imported weights, ONNX or "
                     "Hugging Face, false for models initialised here)"),
      llvm::cl::init(dist::PadVocabPassOptions().maskPadding), onCommandLine};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("Megatron sequence parallelism: layer norms and "
                     "residuals on sequence shards, all-gather/reduce-scatter "
                     "around each region"),
      llvm::cl::init(dist::TPPartitionPassOptions().sequenceParallel),
      onCommandLine};
  Option<bool> tpCommOverlap{
      *this, "tp-comm-overlap",
      llvm::cl::desc("Megatron's --tp-comm-overlap: under sequence "
                     "parallelism, pipeline each all-gather and "
                     "reduce-scatter of the tensor-parallel regions with "
                     "the GEMM beside it around the tp ring "
                     "(tessera-tp-comm-overlap)"),
      llvm::cl::init(false), onCommandLine};
  Option<bool> disableTpCommOverlapAg{
      *this, "disable-tp-comm-overlap-ag",
      llvm::cl::desc("with --tp-comm-overlap: leave the all-gathers apart "
                     "from their GEMMs (Megatron's flag)"),
      llvm::cl::init(false), onCommandLine};
  Option<bool> disableTpCommOverlapRs{
      *this, "disable-tp-comm-overlap-rs",
      llvm::cl::desc("with --tp-comm-overlap: leave the reduce-scatters "
                     "apart from their GEMMs (Megatron's flag)"),
      llvm::cl::init(false), onCommandLine};
  Option<bool> bf16{*this, "bf16",
                    llvm::cl::desc("mixed precision: bf16 parameters, "
                                   "GEMMs (f32 accumulation) and activations "
                                   "between ops (the kernels compute in f32; "
                                   "--activations-dtype f32 keeps them f32), "
                                   "fp32 main parameters for the optimizer "
                                   "(Megatron's --bf16)"),
                    llvm::cl::init(false), onCommandLine};
  Option<bool> fp16{*this, "fp16",
                    llvm::cl::desc("mixed precision: f16 parameters and GEMMs "
                                   "(f32 accumulation), f32 elsewhere, fp32 "
                                   "main parameters and gradients, dynamic "
                                   "loss scaling (Megatron's --fp16)"),
                    llvm::cl::init(false), onCommandLine};
  Option<std::string> activationsDtype{
      *this, "activations-dtype",
      llvm::cl::desc("the dtype activations are stored in between ops and "
                     "travel in: bf16 under --bf16 (the default there, as "
                     "Megatron's --bf16; the kernels compute in f32) or f32 "
                     "(the default without --bf16)"),
      llvm::cl::init(""), onCommandLine};
  Option<std::string> gemmDtype{
      *this, "gemm-dtype",
      llvm::cl::desc("with --bf16 or --fp16: the operand dtype of the GEMMs "
                     "that read parameters, bf16 (the default: the "
                     "parameters' 16-bit dtype) or f32 (16-bit storage, f32 "
                     "computation throughout)"),
      llvm::cl::init(nn::MixedPrecisionPassOptions().gemmDtype),
      onCommandLine};
  Option<std::string> moeRouterDtype{
      *this, "moe-router-dtype",
      llvm::cl::desc("with --bf16 or --fp16: fp32 computes the MoE router's GEMM in "
                     "f32 (Megatron's --moe-router-dtype fp32), so that "
                     "routing does not turn on bf16 rounding; by default it "
                     "is in the GEMM dtype"),
      llvm::cl::init(nn::MixedPrecisionPassOptions().moeRouterDtype),
      onCommandLine};
  Option<bool> gradReduceInFp32{
      *this, "grad-reduce-in-fp32",
      llvm::cl::desc("with --bf16: accumulate and reduce gradients in f32 "
                     "(the default, as Megatron does for bf16)"),
      llvm::cl::init(nn::MixedPrecisionPassOptions().gradReduceInFp32),
      onCommandLine};
  Option<bool> gradReduceInBf16{
      *this, "grad-reduce-in-bf16",
      llvm::cl::desc("with --bf16: accumulate and reduce gradients in bf16"),
      llvm::cl::init(false), onCommandLine};
  Option<std::string> recomputeGranularity{
      *this, "recompute-granularity",
      llvm::cl::desc("activation recompute (Megatron's): full recomputes "
                     "whole layers in the backward from their inputs "
                     "(with --recompute-method and --recompute-num-layers); "
                     "selective keeps only the shards of sequence "
                     "parallelism's all-gathers (attention's core the "
                     "kernels always recompute)"),
      llvm::cl::init(nn::RecomputePassOptions().granularity), onCommandLine};
  Option<std::string> recomputeMethod{
      *this, "recompute-method",
      llvm::cl::desc("with --recompute-granularity full: uniform (groups of "
                     "--recompute-num-layers layers, each keeping its input) "
                     "or block (only the first --recompute-num-layers layers "
                     "of each pipeline chunk, one by one)"),
      llvm::cl::init(nn::RecomputePassOptions().method), onCommandLine};
  Option<int64_t> recomputeNumLayers{
      *this, "recompute-num-layers",
      llvm::cl::desc("with --recompute-granularity full: layers per group "
                     "(uniform) or recomputed layers per chunk (block)"),
      llvm::cl::init(nn::RecomputePassOptions().numLayers), onCommandLine};
  Option<bool> fuseBiasGelu{
      *this, "fuse-bias-gelu",
      llvm::cl::desc("add the first MLP projection's bias inside the GELU "
                     "and sum its gradient in the GELU gradient's pass "
                     "(Megatron's bias_gelu_impl; default on, "
                     "=false for comparison)"),
      llvm::cl::init(true), onCommandLine};
  Option<bool> fuseCrossEntropy{
      *this, "fuse-cross-entropy",
      llvm::cl::desc("with an unsharded vocabulary: the loss's statistics in "
                     "one pass over the logits, reused by its gradient "
                     "(default on, =false for comparison)"),
      llvm::cl::init(true), onCommandLine};
  Option<bool> fuseAddLayerNorm{
      *this, "fuse-add-layer-norm",
      llvm::cl::desc("add the residual inside the layer norm that reads the "
                     "sum, and the residual's gradient inside its backward "
                     "(default on, =false for comparison)"),
      llvm::cl::init(true), onCommandLine};
  Option<bool> fuseCasts{
      *this, "fuse-casts",
      llvm::cl::desc("with bf16 activations: load and store the bf16 "
                     "activations inside the activation kernels (add, bias "
                     "add, bias-GELU, the norms, SwiGLU and their backwards) "
                     "rather than with Cast kernels and f32 copies around "
                     "them (default on, =false for comparison)"),
      llvm::cl::init(true), onCommandLine};
  Option<bool> fuseBucketOptimizer{
      *this, "fuse-bucket-optimizer",
      llvm::cl::desc("without the distributed optimizer: one Adam/SGD "
                     "kernel per gradient bucket instead of one per "
                     "parameter (default on, =false for comparison)"),
      llvm::cl::init(true), onCommandLine};
  Option<int64_t> bucketSize{
      *this, "bucket-size",
      llvm::cl::desc("gradient bucket size in elements (0, the default: "
                     "Megatron's max(40000000, 1000000 x dp))"),
      llvm::cl::init(dist::DPGradAllReducePassOptions().bucketSize),
      onCommandLine};
  Option<bool> distributedOptimizer{
      *this, "use-distributed-optimizer",
      llvm::cl::desc("ZeRO-1 distributed optimizer: reduce-scatter each "
                     "bucket, each dp rank updates its shard, all-gather the "
                     "parameters"),
      llvm::cl::init(dist::DPGradAllReducePassOptions().distributedOptimizer),
      onCommandLine};
  // Aliases take the sub-commands and category of their option.
  llvm::cl::alias distributedOptimizerShort{
      "dist-optimizer", llvm::cl::desc("alias for --use-distributed-optimizer"),
      llvm::cl::aliasopt(distributedOptimizer)};
  /// The pass's name for it (tessera-dp-grad-allreduce).
  llvm::cl::alias distributedOptimizerPass{
      "distributed-optimizer",
      llvm::cl::desc("alias for --use-distributed-optimizer"),
      llvm::cl::aliasopt(distributedOptimizer)};
  Option<bool> padBucketsForHighNcclBusbw{
      *this, "pad-buckets-for-high-nccl-busbw",
      llvm::cl::desc("pad buckets to lcm(dp, 128, 2^16) elements"),
      llvm::cl::init(
          dist::DPGradAllReducePassOptions().padBucketsForHighNcclBusbw),
      onCommandLine};
  Option<bool> overlapGradReduce{
      *this, "overlap-grad-reduce",
      llvm::cl::desc("start each gradient bucket's all-reduce in the last "
                     "microbatch's backward as soon as its gradients are "
                     "complete"),
      llvm::cl::init(dist::DPGradAllReducePassOptions().overlapGradReduce),
      onCommandLine};
  Option<std::string> dataParallelShardingStrategy{
      *this, "data-parallel-sharding-strategy",
      llvm::cl::desc("Megatron's ZeRO stage: no_shard, optim (the "
                     "distributed optimizer, ZeRO-1), optim_grads "
                     "(ZeRO-2: the gradients sharded too) or "
                     "optim_grads_params (ZeRO-3: the parameters too)"),
      llvm::cl::init(""), onCommandLine};
  Option<bool> overlapParamGather{
      *this, "overlap-param-gather",
      llvm::cl::desc("distributed optimizer: leave each bucket's parameter "
                     "all-gather in flight after the step and finish it in "
                     "the next forward before the bucket's first reader "
                     "(ZeRO-3: start each bucket's gather under the "
                     "previous bucket's readers)"),
      llvm::cl::init(nn::OptimizerPassOptions().overlapParamGather),
      onCommandLine};
  Option<bool> singleBucketGroup{
      *this, "single-bucket-group",
      llvm::cl::desc("reduce all buckets as one group"),
      llvm::cl::init(dist::DPGradAllReducePassOptions().singleBucketGroup),
      onCommandLine};
  Option<std::string> optimizer{
      *this, "optimizer", llvm::cl::desc("sgd or adam"),
      llvm::cl::init(nn::OptimizerPassOptions().optimizer), onCommandLine};
  Option<double> lr{*this, "lr", llvm::cl::desc("learning rate"),
                    llvm::cl::init(nn::OptimizerPassOptions().lr),
                    onCommandLine};
  Option<double> weightDecay{
      *this, "weight-decay",
      llvm::cl::desc("decoupled weight decay, none on biases and 1-D "
                     "parameters (Megatron's param groups)"),
      llvm::cl::init(nn::OptimizerPassOptions().weightDecay), onCommandLine};
  Option<double> adamBeta1{
      *this, "adam-beta1", llvm::cl::desc("Adam's beta1 (Megatron's)"),
      llvm::cl::init(nn::OptimizerPassOptions().beta1), onCommandLine};
  Option<double> adamBeta2{
      *this, "adam-beta2", llvm::cl::desc("Adam's beta2 (Megatron's)"),
      llvm::cl::init(nn::OptimizerPassOptions().beta2), onCommandLine};
  Option<double> adamEps{
      *this, "adam-eps", llvm::cl::desc("Adam's epsilon (Megatron's)"),
      llvm::cl::init(nn::OptimizerPassOptions().eps), onCommandLine};
  Option<double> sgdMomentum{
      *this, "sgd-momentum",
      llvm::cl::desc("SGD's momentum (Megatron's; 0: plain SGD)"),
      llvm::cl::init(nn::OptimizerPassOptions().sgdMomentum), onCommandLine};
  Option<bool> logParamsNorm{
      *this, "log-params-norm",
      llvm::cl::desc("compute and log the parameters' global L2 norm after "
                     "each update (Megatron's --log-params-norm)"),
      llvm::cl::init(nn::OptimizerPassOptions().logParamsNorm), onCommandLine};
  Option<double> clipGrad{
      *this, "clip-grad",
      llvm::cl::desc("clip the gradients to this global L2 norm (Megatron's "
                     "--clip-grad; 0: no clipping, no norm)"),
      llvm::cl::init(nn::OptimizerPassOptions().clipGrad), onCommandLine};
  Option<int64_t> lrWarmupIters{
      *this, "lr-warmup-iters",
      llvm::cl::desc("linear learning-rate warmup iterations"),
      llvm::cl::init(nn::OptimizerPassOptions().lrWarmupIters), onCommandLine};
  Option<int64_t> lrDecayIters{
      *this, "lr-decay-iters",
      llvm::cl::desc("iteration at which the decay reaches --min-lr"),
      llvm::cl::init(nn::OptimizerPassOptions().lrDecayIters), onCommandLine};
  Option<std::string> lrDecayStyle{
      *this, "lr-decay-style",
      llvm::cl::desc("constant (default), linear or cosine"),
      llvm::cl::init(nn::OptimizerPassOptions().lrDecayStyle), onCommandLine};
  Option<double> minLr{
      *this, "min-lr", llvm::cl::desc("learning rate after the decay"),
      llvm::cl::init(nn::OptimizerPassOptions().minLr), onCommandLine};
  Option<double> lossScale{
      *this, "loss-scale",
      llvm::cl::desc("with --fp16: a constant loss scale instead of the "
                     "dynamic one (Megatron's --loss-scale)"),
      llvm::cl::init(nn::OptimizerPassOptions().lossScale), onCommandLine};
  Option<double> initialLossScale{
      *this, "initial-loss-scale",
      llvm::cl::desc("with --fp16: the dynamic loss scale's start (default "
                     "2^32, Megatron's)"),
      llvm::cl::init(nn::OptimizerPassOptions().initialLossScale),
      onCommandLine};
  Option<double> minLossScale{
      *this, "min-loss-scale",
      llvm::cl::desc("with --fp16: the dynamic loss scale's floor (default "
                     "1)"),
      llvm::cl::init(nn::OptimizerPassOptions().minLossScale), onCommandLine};
  Option<int64_t> lossScaleWindow{
      *this, "loss-scale-window",
      llvm::cl::desc("with --fp16: iterations without inf or NaN gradients "
                     "before the loss scale doubles (default 1000)"),
      llvm::cl::init(nn::OptimizerPassOptions().lossScaleWindow),
      onCommandLine};
  Option<int64_t> hysteresis{
      *this, "hysteresis",
      llvm::cl::desc("with --fp16: iterations with inf or NaN gradients "
                     "before the loss scale halves (default 2)"),
      llvm::cl::init(nn::OptimizerPassOptions().hysteresis), onCommandLine};
};

/// The combinations of options the pipeline refuses (an error message), or
/// "": --grad-reduce-in-bf16 needs --bf16 and excludes --grad-reduce-in-fp32.
std::string checkTrainPipelineOptions(const TrainPipelineOptions &options);

/// Whether the optimizer state is sharded over dp (--use-distributed-optimizer
/// or --data-parallel-sharding-strategy optim, optim_grads or
/// optim_grads_params).
bool usesDistributedOptimizer(const TrainPipelineOptions &options);

/// Whether activations are stored in bf16 (under --bf16 unless
/// --activations-dtype f32; --activations-dtype bf16 needs --bf16):
/// tessera-bf16-activations runs.
bool usesBf16Activations(const TrainPipelineOptions &options);

/// Megatron's uneven split options as given (tessera-pp-split resolves
/// them, --emit=schedule too).
schedule::SplitOptions splitOptions(const TrainPipelineOptions &options);

/// The virtual pipeline size: --vpp, or without it the one a
/// --pipeline-model-parallel-layout gives (its stages / pp).
int64_t effectiveVpp(const TrainPipelineOptions &options);

/// attach-mesh, set-batch, pad-vocab, tp-partition, cp-partition,
/// ep-partition, pp-split, mixed-precision (with bf16), recompute (with a
/// recompute option), the fusions (unless turned off), autodiff,
/// dp-grad-allreduce, optimizer, pp-schedule, verify-schedule, lower-to-rt
/// (serialisation is left to the caller).
void buildTrainPipeline(mlir::OpPassManager &pm,
                        const TrainPipelineOptions &options);

} // namespace tessera

#endif // TESSERA_PIPELINE_PIPELINE_H
