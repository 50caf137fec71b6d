//===- Model.h - Conventions of a Tessera training module ---------*- C++ -*-===//
//
// Attribute names and helpers shared by the passes: how a model function
// marks parameters and inputs, how phase functions bind their arguments and
// results to persistent buffers, and type re-inference after a shape change.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_SUPPORT_MODEL_H
#define TESSERA_SUPPORT_MODEL_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace tessera {

// The discardable attributes the frontend and the passes hand to each other
// are named here and nowhere else. The dialect that owns a prefix verifies
// them (nn, dist, and tessera for `tessera.*`).

// Model function argument attributes.
constexpr llvm::StringLiteral kParamAttr = "nn.param";   // parameter name
constexpr llvm::StringLiteral kInitAttr = "nn.init";     // "normal:<std>", "zeros", "ones", "data"
constexpr llvm::StringLiteral kInputAttr = "nn.input";   // "features", "labels", "tokens"
constexpr llvm::StringLiteral kBatchDimAttr = "nn.batch_dim"; // default 0
/// {axis, dim}: the parameter or input is split along `dim` over the rank
/// group `axis`; {axis, dim, axis2, dim2} adds a second split of another
/// dimension (the experts over "ep" and their FFN over "etp").
constexpr llvm::StringLiteral kShardingAttr = "dist.sharding";
/// On a model op: the transformer layer it belongs to (tessera-gen marks
/// them; tessera-pp-split places ops by them).
constexpr llvm::StringLiteral kLayerAttr = "nn.layer";
/// On a model op: the activation-recompute group it belongs to
/// (tessera-recompute marks the ops of the layers it recomputes;
/// tessera-autodiff recomputes each group in its backward, and the fusions
/// never merge ops of different groups).
constexpr llvm::StringLiteral kRecomputeAttr = "nn.recompute";

/// On a forward op (a unit attribute): the backward does not keep its
/// result but computes it again where it first needs it (tessera-recompute
/// selective marks sequence parallelism's all-gathers: Megatron keeps the
/// shard and gathers it again in the backward).
constexpr llvm::StringLiteral kRecomputeInBackwardAttr =
    "nn.recompute_in_backward";

/// On an nn.cast to bf16 (a unit attribute, tessera-bf16-activations): its
/// result is the stored form of its input, an activation. The backward
/// reads that, cast to f32 again, wherever it would read the input, so the
/// f32 value dies in the forward (Megatron saves the bf16 tensor).
constexpr llvm::StringLiteral kStoredActivationAttr = "nn.stored_activation";

/// Whether `a` and `b` may be fused: both in the same recompute group, or
/// neither in any.
inline bool sameRecomputeGroup(mlir::Operation *a, mlir::Operation *b) {
  return a->getAttr(kRecomputeAttr) == b->getAttr(kRecomputeAttr);
}

// Module attributes: what tessera-compile records for the artifact, and
// tessera-pad-vocab's {size, padded}.
constexpr llvm::StringLiteral kCompileFlagsAttr = "tessera.compile_flags";
constexpr llvm::StringLiteral kModelNameAttr = "tessera.model";
constexpr llvm::StringLiteral kVocabAttr = "tessera.vocab";
// The architecture of a model tessera-gen built, as Megatron-LM's arguments
// name it (num_layers, hidden_size, num_query_groups, swiglu, ...): a
// dictionary of integers, floats, bools and strings that the artifact and
// its checkpoints carry (as JSON) for tessera-export.
constexpr llvm::StringLiteral kArchitectureAttr = "tessera.architecture";
// Initial values of the parameters whose nn.init is "data" (imported
// models), by parameter name: an f32 elements attribute of the parameter
// (inline data), or {file = "<absolute path>", offset = <bytes>, shape =
// array<i64: ...>} for little-endian f32 data of that shape in an external
// file (ONNX external data).
constexpr llvm::StringLiteral kWeightsAttr = "tessera.weights";
// Where an imported ONNX model's parameters came from, for tessera-export
// --format onnx (the artifact and its checkpoints carry it as JSON):
// {model = "<absolute path of the .onnx>", parameters = [{param, kind
// (identity | transpose | qkv | blocks | stack), shape, transposed?,
// num_heads?, num_query_groups?, head_dim?, sources = [{initializer,
// shape, readers = [ONNX node names]}]}]}, one entry per parameter view
// (a tied parameter has one per initializer it was read from).
constexpr llvm::StringLiteral kOnnxSourceAttr = "tessera.onnx_source";

// Phase functions and their bindings.
constexpr llvm::StringLiteral kPhaseAttr = "tessera.phase"; // "microbatch", "step"
constexpr llvm::StringLiteral kBufferAttr = "tessera.buffer";
constexpr llvm::StringLiteral kGradOfAttr = "tessera.grad_of";
constexpr llvm::StringLiteral kBatchAttr = "tessera.batch";
constexpr llvm::StringLiteral kOptimizerAttr = "tessera.optimizer";
constexpr llvm::StringLiteral kMicrobatchPhase = "microbatch";
constexpr llvm::StringLiteral kStepPhase = "step";

// Pipelines (tessera-pp-split and later). The top-level module holds one
// nested module per pipeline rank (`dist.pp_rank`, symbol @pp<r>); each is
// a program like a pp = 1 module, with one model function per chunk
// (`dist.stage`), which autodiff turns into the forward and backward
// phases of the chunk (`dist.chunk`). A forward returns the activations
// its backward needs (`tessera.stash` = index, same on both sides).
constexpr llvm::StringLiteral kPpRankAttr = "dist.pp_rank";
constexpr llvm::StringLiteral kStageAttr = "dist.stage";
constexpr llvm::StringLiteral kChunkAttr = "dist.chunk";
constexpr llvm::StringLiteral kStashAttr = "tessera.stash";
constexpr llvm::StringLiteral kTiedAttr = "dist.tied"; // group kind of a param held by several pp ranks
/// A step result holding a bucket's reduce-scattered gradient shard
/// (distributed optimizer): {buffer = @gbuf, bucket = k}.
constexpr llvm::StringLiteral kGradShardAttr = "tessera.grad_shard";
/// The variant of the microbatch phase run for the last microbatch.
constexpr llvm::StringLiteral kLastMicrobatchAttr = "tessera.last_microbatch";
/// On a dist.run: the slot in a region of its chunk alone (`slot` is in the
/// rank's pool shared by its chunks); lower-to-rt keeps whichever layout is
/// smaller.
constexpr llvm::StringLiteral kChunkSlotAttr = "dist.chunk_slot";
/// On a (pipeline-rank) module: every bucket of its grad buffers forms one
/// bucket group (tessera-dp-grad-allreduce's single-bucket-group).
constexpr llvm::StringLiteral kSingleBucketGroupAttr =
    "dist.single_bucket_group";
constexpr llvm::StringLiteral kForwardPhase = "forward";
// Mixed precision: the stored parameter and gradient dtypes
// ({params = "bf16", grads = "f32" | "bf16", activations = "bf16" (optional,
// tessera-bf16-activations)} on the root module), and the
// phase that initialises the fp32 main parameters from the bf16 ones (run
// once before the first iteration). Main parameters are bound as
// "main:<param>" or, for a distributed-optimizer shard,
// "main:pbuf:<grad buffer>:<bucket>".
constexpr llvm::StringLiteral kMixedPrecisionAttr = "tessera.mixed_precision";
constexpr llvm::StringLiteral kInitPhase = "init";
constexpr llvm::StringLiteral kBackwardPhase = "backward";
// A chunk's weight-gradient phase (tessera-split-backward, for the
// zero-bubble schedules): its backward's ops that no send depends on; the
// "backward" phase keeps the input gradient.
constexpr llvm::StringLiteral kBackwardWPhase = "backward_w";
// Evaluation (tessera-eval-phase): the forward of the microbatch phase
// ("eval") or of a pipeline chunk ("eval_c<k>") alone, to the loss, without
// dropout (Megatron's evaluate() runs the model in eval mode).
constexpr llvm::StringLiteral kEvalPhase = "eval";

/// One split of a `dist.sharding`: `dim` over the rank group `axis`.
struct ShardSplit {
  llvm::StringRef axis;
  int64_t dim;
};
/// The `dist.sharding` of `splits` (one or two, on different dims).
mlir::DictionaryAttr makeSharding(mlir::MLIRContext *ctx,
                                  llvm::ArrayRef<ShardSplit> splits);
/// The splits of a `dist.sharding` (none for null).
llvm::SmallVector<ShardSplit, 2> getShardSplits(mlir::DictionaryAttr sharding);

/// The programs of a module: its pipeline-rank modules when it has them,
/// else the module itself.
llvm::SmallVector<mlir::ModuleOp> getPrograms(mlir::ModuleOp module);

/// The outermost module containing `op` (where the mesh and the batch and
/// optimizer settings live).
mlir::ModuleOp getRootModule(mlir::Operation *op);

/// The model function: the one func.func without a phase, or the
/// microbatch phase once autodiff ran. Emits an error and returns null when
/// there is none or more than one.
mlir::func::FuncOp getModelFunc(mlir::ModuleOp module);

/// The function of the given phase, or null.
mlir::func::FuncOp getPhaseFunc(mlir::ModuleOp module, llvm::StringRef phase);

/// Recomputes the result types of `op` from its operands (InferTypeOpInterface
/// or SameOperandsAndResultType). Returns failure if the op can do neither.
mlir::LogicalResult reinferResultTypes(mlir::Operation *op);

/// Makes the function type match its block arguments and returned values.
void updateFunctionType(mlir::func::FuncOp func);

/// Number of microbatches recorded by tessera-set-batch (1 if absent);
/// `module` may be a pipeline-rank module.
int64_t getNumMicrobatches(mlir::ModuleOp module);

/// The number of transformer layers `root`'s ops mark with `nn.layer`: the
/// marks must be exactly 0 .. L-1 (each layer holds at least one op). Emits
/// an error naming the first op whose mark leaves a gap (or is absurdly
/// large) and fails; returns 0 when nothing is marked.
mlir::FailureOr<int64_t> getNumLayers(mlir::Operation *root);

} // namespace tessera

#endif // TESSERA_SUPPORT_MODEL_H
