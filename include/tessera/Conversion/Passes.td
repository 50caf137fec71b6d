//===- Passes.td - Lowering and serialisation -----------------*- tablegen -*-===//

#ifndef TESSERA_CONVERSION_PASSES_TD
#define TESSERA_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def LowerToRTPass : Pass<"tessera-lower-to-rt", "mlir::ModuleOp"> {
  let summary = "bufferize into a per-rank arena and lower to rt kernels";
  let description = [{
    Persistent buffers (parameters, gradients, optimizer state, inputs, loss,
    iteration) are laid out first, 64-byte aligned; every other tensor gets
    a transient buffer from a static memory plan (liveness intervals, linear
    scan in program order, first-fit free list, or greedy by size where that
    packs tighter), shared by the phases since they run
    one after another. A cast between f32 and a 16-bit format beside an
    activation kernel that loads or stores any float format is folded into
    it (`fold-casts`): no Cast kernel, no f32 copy. Gradients returned by the microbatch phase
    accumulate into their buffers (GEMM with beta = 1 where possible).
  }];
  let dependentDialects = ["::tessera::rt::RTDialect", "::mlir::func::FuncDialect"];
  let options = [
    Option<"foldCasts", "fold-casts", "bool", /*default=*/"true",
           "fold a cast to or from 16 bits into the activation kernel beside "
           "it, which then loads or stores the 16-bit value itself (the "
           "`h` operands of Add, BiasAdd, BiasGelu(Grad), LayerNorm(Grad), "
           "RMSNorm(Grad), SwiGLU(Grad), AddLayerNorm's and AddRMSNorm's "
           "Y); =false keeps the Cast kernels, "
           "for comparison">
  ];
  let statistics = [
    Statistic<"arenaBytes", "arena-bytes", "bytes of the per-rank arena">,
    Statistic<"transientBytes", "transient-bytes", "bytes of the transient region">
  ];
}

def FuseBucketOptimizerPass : Pass<"tessera-fuse-bucket-optimizer", "mlir::ModuleOp"> {
  let summary = "one optimizer kernel per gradient bucket";
  let description = [{
    On the rt program: the `rt.adam` (or `rt.sgd`) of every parameter of a
    bucket of a grad buffer becomes one over the whole bucket, on views of
    the regions where tessera-lower-to-rt laid out the gradients, the
    (main) parameters and the Adam state in the same layout (apex's
    multi-tensor Adam, one kernel for many parameters; the distributed
    optimizer already updates one shard per bucket). A bucket is fused only
    when every operand lies in bucket layout, its parameters' updates share
    their hyper-parameters, nothing between them touches the bucket's
    tensors and the parameters fill the bucket (no padding, as in every
    buffer without the distributed optimizer). The
    update is elementwise, so results are bit-identical. The pipeline's
    `fuse-bucket-optimizer` option turns it off.
  }];
  let dependentDialects = ["::tessera::rt::RTDialect"];
  let statistics = [
    Statistic<"numFusedBuckets", "fused-buckets",
              "buckets updated by one optimizer kernel">
  ];
}

def SerializePass : Pass<"tessera-serialize", "mlir::ModuleOp"> {
  let summary = "write the rt module as a .tsr artifact";
  let description = [{
    Translates rt buffers and kernels into the artifact schema
    (runtime/schema/artifact.fbs), with the mesh, every rank group the
    program uses, the batch and optimizer settings.
  }];
  let options = [
    Option<"output", "output", "std::string", "\"\"", "artifact file to write">
  ];
}

def OnnxToNNPass : Pass<"tessera-onnx-to-nn", "mlir::ModuleOp"> {
  let summary = "raise an imported, simplified ONNX graph to the nn model";
  let description = [{
    Rewrite patterns (lib/Conversion/OnnxToNN/Patterns.cpp), one per
    construct a PyTorch export decomposes, raise the onnx graph to the nn
    ops tessera-gen emits: RMSNorm, linear layers, SwiGLU, word
    embeddings, causal self-attention (multi-head or grouped-query, with
    RoPE and QK-norm; eager and SDPA forms), residual adds and the token
    cross-entropy (Hugging Face's shifted labels become Tessera's labels
    input). Activations become sequence-major. Then the nn function is
    built: token and label inputs `[seq, batch]` i32 with a dynamic batch,
    one argument per parameter (named from the exporter's module scopes:
    `<module>.weight`, `<attention>.linear_qkv.weight` for q, k and v fused
    in Megatron's per-group layout, `<mlp>.linear_fc1.weight` for gate and
    up stacked), their values in `tessera.weights` (`load-weights`). A
    node no pattern raised is an error naming it, its op type and module.
  }];
  let options = [
    Option<"loss", "loss", "std::string", "\"\"",
           "for a graph that returns logits: cross-entropy adds a labels "
           "input and the mean token cross-entropy">,
    Option<"loadWeights", "load-weights", "bool", "true",
           "initialise the parameters from the initializers' data">,
  ];
  let dependentDialects = ["::tessera::nn::NNDialect", "::mlir::func::FuncDialect"];
}

#endif // TESSERA_CONVERSION_PASSES_TD
