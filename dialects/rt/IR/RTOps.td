//===- RTOps.td - rt dialect: the executable per-rank program --*- tablegen -*-===//
//
// The output level: explicit buffers at fixed offsets of a per-rank arena
// (the static memory plan), kernel calls, collectives and events. Each op
// maps one to one onto an artifact instruction (runtime/schema/artifact.fbs).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_RT_IR_RTOPS_TD
#define TESSERA_DIALECTS_RT_IR_RTOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def RT_Dialect : Dialect {
  let name = "rt";
  let cppNamespace = "::tessera::rt";
  let summary = "Per-rank executable program: arena buffers, kernels, collectives";
  let useDefaultTypePrinterParser = 1;
  let description = [{
    A module at this level holds `rt.buffer` declarations (the persistent
    part of the arena: parameters, gradients, optimizer state, inputs) and
    entry functions (`func.func` with the `rt.entry` attribute) whose bodies
    are kernel calls on memref views of the arena. The module attribute
    `rt.arena_bytes` is the arena's size.
  }];
}

class RT_Op<string mnemonic, list<Trait> traits = []>
    : Op<RT_Dialect, mnemonic, traits>;

def RT_EventType : TypeDef<RT_Dialect, "Event"> {
  let mnemonic = "event";
  let summary = "completion of an asynchronous collective";
}

def RT_F32Buf : MemRefOf<[F32]>;
/// Collectives move parameters and gradients, which may be bf16.
def RT_FloatBuf : MemRefOf<[F32, BF16]>;
def RT_AnyBuf : MemRefOf<[F32, BF16, I32, I64]>;

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

def RT_BufferOp : RT_Op<"buffer", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a persistent arena buffer and its manifest entry";
  let description = [{
    `kind` is one of `param`, `grad`, `main_param` (fp32 copies of bf16
    parameters), `opt_state`, `input`, `loss`, `iteration`, `activation`
    (pipelines: saved activations and p2p staging) and `view` (a bucket of
    a grad buffer). A view with `rank_group` is rank-relative: this rank's
    block at `offset + i * rank_stride`, i its index in its `rank_group`
    instance (the distributed optimizer's shard of a bucket). Parameters carry their global shape, the dimension split
    over `shard_axis` (or -1) and their init spec (`normal:<std>`, `zeros`,
    `ones`). Gradients and optimizer state name their parameter in `of`.

    ```mlir
    rt.buffer @"fc1.weight" : memref<512x256xf32> {kind = "param", offset = 0 : i64,
        global_shape = array<i64: 1024, 256>, shard_dim = 0 : i64,
        shard_axis = "tp", init = "normal:0.02"}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$type,
                       StrAttr:$kind, I64Attr:$offset,
                       OptionalAttr<DenseI64ArrayAttr>:$global_shape,
                       DefaultValuedAttr<I64Attr, "-1">:$shard_dim,
                       OptionalAttr<StrAttr>:$shard_axis,
                       OptionalAttr<StrAttr>:$init,
                       OptionalAttr<FlatSymbolRefAttr>:$of,
                       OptionalAttr<I64Attr>:$num_classes,
                       OptionalAttr<I64Attr>:$vocab_size,
                       OptionalAttr<StrAttr>:$rank_group,
                       OptionalAttr<I64Attr>:$rank_stride);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
}

def RT_GetOp : RT_Op<"get", [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a view of a persistent buffer";
  let description = [{
    ```mlir
    %w = rt.get @"fc1.weight" : memref<512x256xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer);
  let results = (outs RT_AnyBuf:$result);
  let assemblyFormat = "$buffer attr-dict `:` type($result)";
}

def RT_AllocOp : RT_Op<"alloc", [Pure]> {
  let summary = "a transient buffer at a planned arena offset";
  let description = [{
    Offsets come from the static memory plan: two allocs whose live ranges
    overlap never overlap in the arena.

    ```mlir
    %h = rt.alloc offset 1048576 : memref<8x512xf32>
    ```
  }];
  let arguments = (ins I64Attr:$offset);
  let results = (outs RT_AnyBuf:$result);
  let assemblyFormat = "`offset` $offset attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

def RT_GemmOp : RT_Op<"gemm"> {
  let summary = "c = alpha * op(a) @ op(b) + beta * c";
  let description = [{
    `beta = 1` accumulates into `c` (gradient accumulation over microbatches).

    ```mlir
    rt.gemm %a, %b, %c {trans_b, alpha = 1.0 : f32, beta = 0.0 : f32} : memref<8x256xf32>, memref<512x256xf32>, memref<8x512xf32>
    ```
  }];
  let arguments = (ins RT_F32Buf:$a, RT_F32Buf:$b, RT_F32Buf:$c,
                       UnitAttr:$trans_a, UnitAttr:$trans_b,
                       DefaultValuedAttr<F32Attr, "1.0f">:$alpha,
                       DefaultValuedAttr<F32Attr, "0.0f">:$beta);
  let assemblyFormat = "$a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c)";
  let hasVerifier = 1;
}

class RT_KernelOp<string mnemonic, string sum, int n> : RT_Op<mnemonic> {
  let summary = sum;
  let description = [{
    Operands and semantics as the artifact opcode of the same name
    (runtime/schema/artifact.fbs).
  }];
  let arguments = (ins Variadic<RT_AnyBuf>:$buffers,
                       DefaultValuedAttr<F32Attr, "1.0f">:$alpha,
                       DefaultValuedAttr<F32Attr, "0.0f">:$beta,
                       OptionalAttr<F32Attr>:$value,
                       OptionalAttr<DenseI64ArrayAttr>:$iattrs,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = "$buffers attr-dict `:` type($buffers)";
  int numBuffers = n;
  let hasVerifier = 1;
  let extraClassDeclaration = "static constexpr unsigned kNumBuffers = " # n # ";";
}

def RT_BiasAddOp : RT_KernelOp<"bias_add", "y = x + b (rows)", 3>;
def RT_AddOp : RT_KernelOp<"add", "c = a + b", 3>;
def RT_GeluOp : RT_KernelOp<"gelu", "y = gelu(x)", 2>;
def RT_GeluGradOp : RT_KernelOp<"gelu_grad", "dx = dy * gelu'(x)", 3>;
def RT_ReluOp : RT_KernelOp<"relu", "y = relu(x)", 2>;
def RT_ReluGradOp : RT_KernelOp<"relu_grad", "dx = dy * (x > 0)", 3>;
def RT_ReduceRowsOp : RT_KernelOp<"reduce_rows", "y = alpha * sum_rows(x) + beta * y", 2>;
def RT_CrossEntropyOp : RT_KernelOp<"cross_entropy", "per-sample softmax cross-entropy", 3>;
def RT_CrossEntropyGradOp : RT_KernelOp<"cross_entropy_grad", "backward of cross_entropy", 4>;
def RT_MeanOp : RT_KernelOp<"mean", "y = mean(x)", 2>;
def RT_MeanGradOp : RT_KernelOp<"mean_grad", "dx = dy / numel(dx)", 2>;
def RT_FillOp : RT_KernelOp<"fill", "y = value", 1>;
def RT_ScaleOp : RT_KernelOp<"scale", "y = alpha * x", 2>;
def RT_CopyOp : RT_KernelOp<"copy", "y = x", 2>;
def RT_AxpyOp : RT_KernelOp<"axpy", "y += alpha * x", 2>;
def RT_CastOp : RT_KernelOp<"cast", "y = convert(x + beta * y) between f32 and bf16", 2>;

// Transformer kernels: `value` is eps for layer norm; `iattrs` and `group`
// as the artifact opcode documents (vocab shard group, ignore_index, heads).
def RT_LayerNormOp : RT_KernelOp<"layer_norm", "layer norm over the last dim", 4>;
def RT_LayerNormGradOp : RT_KernelOp<"layer_norm_grad", "layer norm backward", 6>;
def RT_EmbeddingOp : RT_KernelOp<"embedding", "embedding lookup", 3>;
def RT_EmbeddingGradOp : RT_KernelOp<"embedding_grad", "embedding scatter-add", 3>;
def RT_AddPositionEmbeddingOp : RT_KernelOp<"add_position_embedding", "x + P[s]", 3>;
def RT_PositionEmbeddingGradOp : RT_KernelOp<"position_embedding_grad", "sum over batch", 2>;
def RT_AttentionOp : RT_KernelOp<"attention", "causal multi-head attention", 2>;
def RT_AttentionGradOp : RT_KernelOp<"attention_grad", "attention backward", 3>;
def RT_LogitsMaxOp : RT_KernelOp<"logits_max", "row max", 2>;
def RT_CrossEntropyStatsOp : RT_KernelOp<"cross_entropy_stats", "sum-exp and target logit of a shard", 5>;
def RT_CrossEntropyFromStatsOp : RT_KernelOp<"cross_entropy_from_stats", "loss from statistics", 5>;
def RT_CrossEntropyStatsGradOp : RT_KernelOp<"cross_entropy_stats_grad", "softmax minus one-hot", 6>;
def RT_TokenMeanOp : RT_KernelOp<"token_mean", "mean over non-ignored tokens", 3>;
def RT_TokenMeanGradOp : RT_KernelOp<"token_mean_grad", "backward of token_mean", 3>;
def RT_DropoutOp : RT_KernelOp<"dropout", "dropout keyed by global position (value = rate)", 2>;
// Pipeline p2p over group "pp", iattrs = [peer (+1 next, -1 prev), tag]; they
// join the open batch, completed before the next other instruction.
def RT_SendOp : RT_KernelOp<"send", "isend to a pipeline neighbour", 1>;
def RT_RecvOp : RT_KernelOp<"recv", "irecv from a pipeline neighbour", 1>;

def RT_AdamOp : RT_Op<"adam"> {
  let summary = "in-place Adam step on a parameter and its fp32 state";
  let description = [{
    ```mlir
    rt.adam %p, %g, %m, %v, %t {lr = 1.0e-03 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32,
        eps = 1.0e-08 : f32, weight_decay = 0.0 : f32}
        : memref<512x256xf32>, memref<512x256xf32>, memref<512x256xf32>, memref<512x256xf32>, memref<i64>
    ```
  }];
  let arguments = (ins RT_F32Buf:$param, RT_F32Buf:$grad, RT_F32Buf:$exp_avg,
                       RT_F32Buf:$exp_avg_sq, MemRefOf<[I64]>:$iteration,
                       F32Attr:$lr, F32Attr:$beta1, F32Attr:$beta2,
                       F32Attr:$eps, F32Attr:$weight_decay);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $iteration attr-dict `:`
    type($param) `,` type($grad) `,` type($exp_avg) `,` type($exp_avg_sq) `,` type($iteration)
  }];
}

def RT_SgdOp : RT_Op<"sgd"> {
  let summary = "in-place SGD step";
  let description = [{
    ```mlir
    rt.sgd %p, %g {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : memref<16x256xf32>, memref<16x256xf32>
    ```
  }];
  let arguments = (ins RT_F32Buf:$param, RT_F32Buf:$grad, F32Attr:$lr,
                       F32Attr:$weight_decay);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($param) `,` type($grad)";
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def RT_AllReduceOp : RT_Op<"all_reduce"> {
  let summary = "in-place all-reduce on a communicator";
  let description = [{
    ```mlir
    rt.all_reduce %g {group = "dp", reduction = "sum"} : memref<1024xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$buffer, StrAttr:$group,
                       DefaultValuedStrAttr<StrAttr, "sum">:$reduction);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def RT_AllReduceStartOp : RT_Op<"all_reduce_start"> {
  let summary = "start an in-place all-reduce; complete with rt.wait";
  let description = [{
    ```mlir
    %e = rt.all_reduce_start %g {group = "dp"} : memref<1024xf32>
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_FloatBuf:$buffer, StrAttr:$group,
                       DefaultValuedStrAttr<StrAttr, "sum">:$reduction);
  let results = (outs RT_EventType:$event);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def RT_ReduceScatterStartOp : RT_Op<"reduce_scatter_start"> {
  let summary = "start a reduce-scatter (this rank's block of the sum); complete with rt.wait";
  let description = [{
    ```mlir
    %e = rt.reduce_scatter_start %bucket, %shard {group = "dp"} : memref<1024xf32>, memref<512xf32>
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let results = (outs RT_EventType:$event);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_WaitOp : RT_Op<"wait"> {
  let summary = "wait for an asynchronous collective";
  let description = [{
    ```mlir
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_EventType:$event);
  let assemblyFormat = "$event attr-dict";
}

def RT_AllGatherOp : RT_Op<"all_gather"> {
  let summary = "all-gather along dim 0 into `output`";
  let description = [{
    ```mlir
    rt.all_gather %x, %y {group = "dp"} : memref<4xf32>, memref<8xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_ReduceScatterOp : RT_Op<"reduce_scatter"> {
  let summary = "sum over the group, this rank's dim-0 slice into `output`";
  let description = [{
    ```mlir
    rt.reduce_scatter %x, %y {group = "dp"} : memref<8xf32>, memref<4xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

#endif // TESSERA_DIALECTS_RT_IR_RTOPS_TD
