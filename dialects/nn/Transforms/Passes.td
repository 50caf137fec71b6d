//===- Passes.td - nn-level training passes -------------------*- tablegen -*-===//

#ifndef TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_TD
#define TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def AutodiffPass : Pass<"tessera-autodiff", "mlir::ModuleOp"> {
  let summary = "turn the forward model into a microbatch training step";
  let description = [{
    Reverse-mode differentiation through DifferentiableOpInterface: the model
    function becomes the `microbatch` phase returning the loss and one
    gradient per parameter. The backward is seeded with 1/num_microbatches
    (Megatron scales the loss the same way), so accumulated gradients are
    the mean over the microbatches. Values that do not depend on a
    parameter get no adjoint, so no collective is emitted for them. Under
    mixed precision a parameter's gradient has the recorded grad dtype (an
    f32 gradient is the adjoint of the parameter's cast, not rounded), and
    the backward casts a bf16 parameter again where it needs it.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect", "::tessera::dist::DistDialect"];
}

def MixedPrecisionPass : Pass<"tessera-mixed-precision", "mlir::ModuleOp"> {
  let summary = "bf16 or f16 parameters and GEMMs, f32 elsewhere (Megatron's --bf16, --fp16)";
  let description = [{
    Every f32 parameter of the model (of each pipeline chunk after
    tessera-pp-split) becomes a bf16 (`params-dtype=bf16`) or f16
    (`params-dtype=f16`) argument. With `gemm-dtype=bf16` (the default: the
    GEMMs in the parameters' 16-bit dtype) every nn.linear, nn.matmul and
    nn.grouped_linear that reads a parameter (or a parameter entering a
    tensor-parallel region) reads it as it is, its other operand cast to
    that dtype right before it, and accumulates in f32 (Megatron's bf16 and
    fp16 GEMMs); every other reader gets the parameter cast to f32 once,
    before the first of them. With `gemm-dtype=f32` all readers do: 16 bits
    are stored, f32 computed. f16 needs `grad-reduce-in-fp32`, and
    tessera-autodiff then seeds the backward with the loss scale
    (nn.loss_seed) for the optimizer to unscale. The dtypes are recorded in `tessera.mixed_precision` on the
    root module: tessera-autodiff then returns each parameter's gradient in
    the grad dtype (f32 with `grad-reduce-in-fp32`, taken before the cast
    back, so gradients accumulate and are reduced in f32 as Megatron's
    main_grad; bf16 otherwise), tessera-dp-grad-allreduce groups the buffers
    by (param dtype, grad dtype), and tessera-optimizer keeps fp32 main
    parameters for the update.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
  let options = [
    Option<"paramsDtype", "params-dtype", "std::string", "\"bf16\"",
           "stored parameter dtype (bf16 or f16)">,
    Option<"gradReduceInFp32", "grad-reduce-in-fp32", "bool", "true",
           "accumulate and reduce gradients in f32 (else in the param dtype)">,
    Option<"gemmDtype", "gemm-dtype", "std::string", "\"bf16\"",
           "operand dtype of the GEMMs that read parameters: bf16 (the "
           "parameters' 16-bit dtype, f32 accumulation) or f32">,
    Option<"moeRouterDtype", "moe-router-dtype", "std::string", "\"\"",
           "the MoE router's GEMM (the linear whose logits nn.moe_router "
           "reads): fp32 keeps it in f32 under bf16 GEMMs (Megatron's "
           "--moe-router-dtype); empty: as the other GEMMs">
  ];
}

def Bf16ActivationsPass : Pass<"tessera-bf16-activations", "mlir::ModuleOp"> {
  let summary = "bf16 activations between ops, f32 inside them (Megatron's --bf16)";
  let description = [{
    After tessera-mixed-precision (bf16 parameters), before
    tessera-autodiff: every f32 result of an activation-producing op
    (linear, matmul, the activations, add, bias_add, the embeddings, the
    norms, attention, rotary, repeat_kv, qk_norm, dropout, the MoE
    dispatch, grouped_linear and combine, add_aux_loss, mask_columns; not
    a router's GEMM; nn.add_layer_norm and nn.add_rms_norm are split into
    their add and norm first, so the norm reads the rounded sum) is cast
    to bf16 right after it, and each reader casts
    it back to f32 right before it (marked nn.recompute_in_backward, so
    the backward casts again rather than keep the f32 copy). A reader that
    is a cast to bf16 reads the bf16 value itself; the tensor-parallel
    region ops, the sum collectives, dist.send and the expert exchange at
    etp 1 carry it in bf16, and a dist.recv of a bf16 send becomes bf16.
    The loss, the cross entropy's statistics, the router's values, the
    expert exchange at etp > 1 and ring attention stay f32.
    Records `activations = "bf16"` in `tessera.mixed_precision`.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
}

def RecomputePass : Pass<"tessera-recompute", "mlir::ModuleOp"> {
  let summary = "choose the layers whose activations the backward recomputes";
  let description = [{
    Megatron's activation recompute (`--recompute-granularity`,
    `--recompute-method`, `--recompute-num-layers`; TransformerBlock's
    `_checkpointed_forward`). With `granularity=full` the transformer layers
    of each model function (each pipeline chunk after tessera-pp-split) are
    grouped: `method=uniform` makes groups of `num-layers` consecutive
    layers, `method=block` makes each of the first `num-layers` layers a
    group and leaves the others alone. Every op from a group's first layer
    op to its last gets `nn.recompute = <group>`; tessera-autodiff then
    recomputes the group's values in the backward, right before it first
    reads them, so the forward keeps only the group's inputs. The fusions
    never merge ops of different groups (a residual add at the end of one
    layer stays apart from the next layer's layer norm), so a group's input
    is one tensor. `granularity=selective` recomputes attention's core,
    which nn.attention and dist.ring_attention already do inside their
    backward (they keep no s x s scores); under sequence parallelism it
    marks the all-gathers `nn.recompute_in_backward`, so that the backward
    gathers the shard again for the weight gradients instead of keeping
    the whole sequence (Megatron's linear layers keep the shard). Runs on the
    model, after tp-partition, pp-split and mixed-precision and before the
    fusions and autodiff.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
  let options = [
    Option<"granularity", "granularity", "std::string", "\"\"",
           "full or selective (empty: no recompute)">,
    Option<"method", "method", "std::string", "\"\"",
           "with full: uniform or block">,
    Option<"numLayers", "num-layers", "int64_t", "0",
           "with full: layers per group (uniform) or recomputed layers per "
           "model chunk (block)">
  ];
}

def FuseBiasGeluPass : Pass<"tessera-fuse-bias-gelu", "mlir::ModuleOp"> {
  let summary = "add a bias inside the GELU after it (Megatron's bias_gelu_impl)";
  let description = [{
    An `nn.gelu` whose input is a biased `nn.linear` (or an `nn.bias_add`,
    a bias that tp-partition moved after a row-parallel reduction) and is
    used by nothing else becomes `nn.bias_gelu(x, bias)` on the unbiased
    GEMM output, as Megatron's MLP runs its first projection with
    `skip_bias_add` and `bias_gelu_impl`. The runtime then adds the bias
    inside the GELU instead of in a pass of its own, and the backward
    (nn.bias_gelu_grad) sums the bias gradient in the GELU gradient's pass.
    The computation is the same, so results are bit-identical. Runs on the
    model, after tp-partition, pp-split and mixed-precision and before
    autodiff; the pipeline's `fuse-bias-gelu` option turns it off.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
}

def FuseCrossEntropyPass : Pass<"tessera-fuse-cross-entropy", "mlir::ModuleOp"> {
  let summary = "read the logits once per pass of the loss and its gradient";
  let description = [{
    An `nn.softmax_cross_entropy` with `ignore_index` whose vocabulary is
    not sharded (tp 1; tp-partition already splits a vocabulary-parallel
    loss into statistics and collectives) becomes `nn.logits_stats` (row
    max, sum of exponentials and label logit in one pass over each row)
    and `nn.cross_entropy_from_stats`. Its adjoint reads the saved `max` and
    `sum_exp`, so the backward is one pass over the logits
    (nn.cross_entropy_stats_grad) instead of recomputing the statistics:
    two passes over the logits per microbatch instead of five. The same
    formulas in the same order, so results are bit-identical. Runs on the
    model, after tp-partition and before autodiff; the pipeline's
    `fuse-cross-entropy` option turns it off.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
}

def FuseAddLayerNormPass : Pass<"tessera-fuse-add-layer-norm", "mlir::ModuleOp"> {
  let summary = "add the residual inside the layer norm that reads the sum";
  let description = [{
    An `nn.layer_norm` of an `nn.add` (the residual stream) becomes one
    `nn.add_layer_norm` that returns the sum (for its other readers, the
    next residual add) and the normalised value, as Megatron fuses the
    residual add into the following LayerNorm; an `nn.rms_norm` of one
    becomes `nn.add_rms_norm` (and its backward `nn.add_rms_norm_grad`) the
    same way. The runtime then writes the
    sum while normalising it instead of reading it back, and the backward
    (nn.add_layer_norm_grad) adds the residual's gradient in the layer-norm
    gradient's pass instead of a separate nn.add. The same formulas, so
    results are bit-identical. Runs on the model, after tp-partition (under
    sequence parallelism on the sequence shards) and before autodiff; the
    pipeline's `fuse-add-layer-norm` option turns it off.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
}

def EvalPhasePass : Pass<"tessera-eval-phase", "mlir::ModuleOp"> {
  let summary = "add the forward-only evaluation phase (Megatron's evaluate)";
  let description = [{
    For each program, a copy of the microbatch phase (`eval`) or of each
    pipeline chunk's forward phase (`eval_c<k>`) that computes the loss and
    nothing else, for `tessera-run --eval-only` (Megatron's evaluate(),
    forward_only=True): the gradients, the saved activations and whatever
    computes only them (the backward, its collectives, the gradient
    buckets' reductions) are removed; a pipeline chunk keeps its sends and
    receives of activations (and what they need); dropout is the identity,
    as in Megatron's model.eval(). A pipeline runs its chunks' evaluation
    phases in the order of the schedule's forwards. Runs after autodiff, on
    the phase functions.

    ```mlir
    func.func @eval(%tokens: tensor<8x2xi32> {nn.input = "tokens"}, ...)
        -> (tensor<f32> {tessera.buffer = "loss"})
        attributes {tessera.phase = "eval"}
    ```
  }];
  let dependentDialects = ["mlir::func::FuncDialect"];
}

def OptimizerPass : Pass<"tessera-optimizer", "mlir::ModuleOp"> {
  let summary = "append the optimizer update to the step function";
  let description = [{
    For each gradient the step function produces, adds the parameter and
    fp32 optimizer state as arguments, the update (`nn.sgd` or `nn.adam`)
    and results that write the new parameter and state back; gradients are
    zeroed for the next step. The steps carry the peak learning rate; the
    schedule (warmup, constant/linear/cosine decay to min-lr, Megatron's)
    is recorded in `tessera.optimizer` and applied by the runtime per
    iteration. A bf16 parameter (tessera-mixed-precision) is updated through
    an fp32 main parameter (`main:<param>`, or with the distributed
    optimizer this rank's shard of the bucket, `main:pbuf:<buffer>:<k>`),
    cast back to bf16; an `init` phase creates the main parameters from the
    parameters once.

    Weight decay (Megatron's get_param_groups): none on biases and 1-D
    parameters (norm weights); inside a distributed-optimizer bucket shard
    those elements are the update's `runs`. Gradient clipping
    (`clip-grad` > 0, Megatron's clip_grad_norm_fp32): before any update,
    each gradient's sum of squares (`nn.sum_squares`, over the runs of its
    class in a shard) is all-reduced over the ranks that hold distinct
    parts of it (tp if split over tp, the shard group, pp; ep/etp for
    experts), so that every element of every distinct parameter counts
    once: a tensor-parallel duplicate once, the tied embedding once (on
    pipeline rank 0), a ZeRO-1 shard over dp; the classes are the same, in
    the same order, in every pipeline program. `nn.clip_grad_norm` gives
    the norm (the step's `grad_norm` result) and min(1, clip / (norm +
    1e-6)), which scales every gradient (`nn.scale_by`). SGD with
    `sgd-momentum` > 0 (Megatron's default 0.9) is `nn.sgd_momentum` with an
    fp32 buffer per parameter (`sgd.momentum_buffer:<param>`, or per bucket
    shard). `log-params-norm` (Megatron's --log-params-norm): the updated
    fp32 parameters' (main parameters', shards') global norm, counted as the
    gradients' (the step's `params_norm` result).

    fp16 (f16 parameters, whose backward tessera-autodiff seeds with the
    loss scale): the global norm is taken whatever `clip-grad` (0: no
    clipping, the coefficient then only unscales) with
    `nn.clip_grad_norm {unscale}`, whose coefficient divides every gradient
    by the loss scale as it clips and whose non-finite norm makes the
    runtime skip the iteration's updates (Megatron's found_inf). The loss
    scaler's settings (`loss-scale`, `initial-loss-scale`,
    `min-loss-scale`, `loss-scale-window`, `hysteresis`: Megatron's
    flags, applied by the launcher) are recorded in `tessera.optimizer`.

    `overlap-param-gather` (Megatron's --overlap-param-gather, with the
    distributed optimizer): the step's all-gather of each updated parameter
    bucket gets `param_sync`, so it stays in flight when the step returns,
    and every forward phase (the microbatch phase and its variants, or each
    pipeline chunk's forward) gets a `dist.param_sync_wait` of the bucket
    right before its first op that reads one of the bucket's parameters:
    the gathers of the buckets the forward reads later run under the
    forward of the earlier ones.
  }];
  let dependentDialects = ["::tessera::nn::NNDialect"];
  let options = [
    Option<"optimizer", "optimizer", "std::string", "\"adam\"", "sgd or adam">,
    Option<"lr", "lr", "double", "1.0e-3", "learning rate">,
    Option<"beta1", "adam-beta1", "double", "0.9", "Adam beta1">,
    Option<"beta2", "adam-beta2", "double", "0.999", "Adam beta2">,
    Option<"eps", "adam-eps", "double", "1.0e-8", "Adam epsilon">,
    Option<"sgdMomentum", "sgd-momentum", "double", "0.9",
           "SGD momentum (torch.optim.SGD's; 0: none)">,
    Option<"logParamsNorm", "log-params-norm", "bool", "false",
           "compute the parameters' global L2 norm after each update (the "
           "step's params_norm result)">,
    Option<"weightDecay", "weight-decay", "double", "0.01",
           "decoupled weight decay (none on biases and 1-D parameters)">,
    Option<"clipGrad", "clip-grad", "double", "1.0",
           "clip gradients to this global L2 norm (0: no clipping)">,
    Option<"lrWarmupIters", "lr-warmup-iters", "int64_t", "0",
           "iterations of linear learning-rate warmup">,
    Option<"lrDecayIters", "lr-decay-iters", "int64_t", "0",
           "iteration at which the decay reaches min-lr">,
    Option<"lrDecayStyle", "lr-decay-style", "std::string", "\"constant\"",
           "constant, linear or cosine">,
    Option<"minLr", "min-lr", "double", "0.0", "learning rate after the decay">,
    Option<"lossScale", "loss-scale", "double", "0.0",
           "fp16: a constant loss scale (0: dynamic loss scaling)">,
    Option<"initialLossScale", "initial-loss-scale", "double", "4294967296.0",
           "fp16: the dynamic loss scale's start (2^32)">,
    Option<"minLossScale", "min-loss-scale", "double", "1.0",
           "fp16: the dynamic loss scale's floor">,
    Option<"lossScaleWindow", "loss-scale-window", "int64_t", "1000",
           "fp16: iterations without overflow before the scale doubles">,
    Option<"hysteresis", "hysteresis", "int64_t", "2",
           "fp16: overflowing iterations before the scale halves">,
    Option<"overlapParamGather", "overlap-param-gather", "bool", "false",
           "distributed optimizer: leave each bucket's parameter all-gather "
           "in flight after the step and finish it in the next forward, "
           "right before the bucket's first reader (Megatron's "
           "--overlap-param-gather)">
  ];
}

#endif // TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_TD
