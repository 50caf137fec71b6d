//===- Passes.td - Parallelisation passes ---------------------*- tablegen -*-===//

#ifndef TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD
#define TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def AttachMeshPass : Pass<"tessera-attach-mesh", "mlir::ModuleOp"> {
  let summary = "attach the device mesh and check the model against it";
  let description = [{
    Adds `dist.mesh @mesh` with the given sizes and checks the configuration:
    valid sizes and order string, an integral expert data-parallel size
    (ep * etp divides tp * cp * dp), and every dimension that tp-partition
    will split divisible by tp (an error names the op and the sizes).
  }];
  let dependentDialects = ["::tessera::dist::DistDialect"];
  let options = [
    Option<"tp", "tp", "int64_t", "1", "tensor-parallel size">,
    Option<"cp", "cp", "int64_t", "1", "context-parallel size">,
    Option<"ep", "ep", "int64_t", "1", "expert-parallel size">,
    Option<"etp", "etp", "int64_t", "1", "expert tensor-parallel size">,
    Option<"dp", "dp", "int64_t", "1", "data-parallel size">,
    Option<"pp", "pp", "int64_t", "1", "pipeline-parallel size">,
    Option<"vpp", "vpp", "int64_t", "1", "virtual pipeline chunks per pp rank">,
    Option<"order", "order", "std::string", "\"tp-cp-ep-dp-pp\"",
           "rank order, fastest varying axis first">
  ];
}

def SetBatchPass : Pass<"tessera-set-batch", "mlir::ModuleOp"> {
  let summary = "fix the batch dimension and the microbatch count (Megatron semantics)";
  let description = [{
    `micro-batch-size` is per data-parallel rank, `global-batch-size` the
    whole step over all dp ranks; a step runs global / (micro x dp)
    microbatches. Sets the model inputs' batch dimension to the micro-batch
    size, re-infers every result type and records `tessera.batch` on the
    module. 0 means: take the micro batch from the model's static batch
    dimension and the global batch as micro x dp.
  }];
  let options = [
    Option<"microBatchSize", "micro-batch-size", "int64_t", "0",
           "samples per microbatch per data-parallel rank">,
    Option<"globalBatchSize", "global-batch-size", "int64_t", "0",
           "samples per training step over all data-parallel ranks">
  ];
}

def PadVocabPass : Pass<"tessera-pad-vocab", "mlir::ModuleOp"> {
  let summary = "pad the vocabulary to a multiple of divisible-by x tp (Megatron)";
  let description = [{
    Megatron pads the vocabulary so that it splits evenly over tensor-parallel
    ranks into shards of a friendly size: the padded size is the vocabulary
    rounded up to a multiple of `make-vocab-size-divisible-by` times tp.
    The word-embedding tables and the LM-head weight (the linear producing
    the cross-entropy logits in a model with an embedding) grow to the
    padded size; ids never reach the padding rows, whose logits take part
    in the softmax like any other (as in Megatron). Records
    `tessera.vocab = {size, padded}` on the module.
  }];
  let options = [
    Option<"divisibleBy", "make-vocab-size-divisible-by", "int64_t", "128",
           "pad the vocabulary to a multiple of this times tp">
  ];
}

def TPPartitionPass : Pass<"tessera-tp-partition", "mlir::ModuleOp"> {
  let summary = "split linear pairs column/row-parallel over the tp axis";
  let description = [{
    Seed 004: a linear whose output reaches another linear through
    elementwise ops becomes column-parallel (weight and bias split along
    out-features, input entering the region through `dist.copy_to_region`)
    and the second row-parallel (weight split along in-features, result
    leaving through `dist.reduce_from_region`, bias added after the
    reduction). Parameters get local shapes and a `dist.sharding`
    attribute. Other linears stay replicated. In a model with an embedding
    the vocabulary is split as well (embedding, LM head, cross-entropy).
    With `sequence-parallel`, the activations between regions live on
    sequence shards: an all-gather along the sequence replaces each
    region's entry and a reduce-scatter its exit, the embeddings are
    scattered onto sequence shards, and the parameters of the layer norms
    and biases that run on shards enter through `dist.copy_to_region`, so
    their gradients are all-reduced.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
  let options = [
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "Megatron sequence parallelism: activations outside the tensor-"
           "parallel regions (layer norms, residuals) on sequence shards; "
           "all-gather before and reduce-scatter after each region">
  ];
  let statistics = [
    Statistic<"numColumn", "column-parallel", "linears split column-parallel">,
    Statistic<"numRow", "row-parallel", "linears split row-parallel">
  ];
}

def DPGradAllReducePass : Pass<"tessera-dp-grad-allreduce", "mlir::ModuleOp"> {
  let summary = "average gradients over the data-parallel group";
  let description = [{
    Creates the `step` function (`tessera.phase = "step"`) that takes the
    accumulated gradients, scales them by 1/dp and all-reduces them over
    the dp group, as Megatron's gradient_scaling_factor does. Gradients the
    microbatch phase ends with a sum all-reduce (parameters entering a
    tensor-parallel region, e.g. layer norms under sequence parallelism)
    are accumulated unreduced and reduced once in the step instead.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect",
                           "::mlir::func::FuncDialect"];
}

#endif // TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD
