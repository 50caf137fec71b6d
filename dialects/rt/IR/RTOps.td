//===- RTOps.td - rt dialect: the executable per-rank program --*- tablegen -*-===//
//
// The output level: explicit buffers at fixed offsets of a per-rank arena
// (the static memory plan), kernel calls, collectives and events. Each
// instruction op names its artifact opcode (runtime/schema/artifact.fbs) and
// is verified against that opcode's row of the instruction contract,
// runtime/include/tessera/rt/Opcodes.def: what the runtime's loader accepts
// is exactly what verifies here.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_RT_IR_RTOPS_TD
#define TESSERA_DIALECTS_RT_IR_RTOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "dialects/rt/IR/RTEnums.td"

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

def RT_BufferKindAttr : Tessera_StrEnumAttr<RT_BufferKind>;
def RT_ReductionAttr : Tessera_StrEnumAttr<RT_Reduction>;

def RT_InstructionOpInterface : OpInterface<"InstructionOpInterface"> {
  let cppNamespace = "::tessera::rt";
  let description = [{
    An op that is one artifact instruction. Its memref operands, in order,
    are the instruction's operands; an `!rt.event` result starts an event
    and an `!rt.event` operand waits for one. The op's opcode selects its
    row of the instruction contract (tessera/rt/Opcodes.def), against which
    the interface verifies the operand count and dtypes, the attribute
    counts and the group, and tessera-serialize writes every such op in one
    generic case.
  }];
  let methods = [
    StaticInterfaceMethod<"The artifact opcode.",
      "::tessera::artifact::Opcode", "getOpcode", (ins), [{}],
      [{ return ConcreteOp::kOpcode; }]>,
    InterfaceMethod<"The instruction's attributes as the artifact stores them.",
      "::tessera::rt::InstrAttrs", "getInstrAttrs", (ins), [{}],
      [{ return ::tessera::rt::kernelInstrAttrs($_op); }]>,
  ];
  let verify = [{ return ::tessera::rt::verifyInstruction($_op); }];
}

/// An instruction op of artifact opcode `opcode` (an fb::Opcode enumerator;
/// a misspelt one does not compile). `explicitAttrs`: the op defines
/// getInstrAttrs itself (ops with named attributes) instead of the generic
/// kernel form.
class RT_InstrOp<string mnemonic, string opcode, list<Trait> traits = [],
                 bit explicitAttrs = 1>
    : RT_Op<mnemonic, !listconcat(traits, [
          !if(explicitAttrs,
              DeclareOpInterfaceMethods<RT_InstructionOpInterface, ["getInstrAttrs"]>,
              DeclareOpInterfaceMethods<RT_InstructionOpInterface>)])> {
  code opcodeDecl = "static constexpr ::tessera::artifact::Opcode kOpcode = "
                    "::tessera::artifact::Opcode::" # opcode # ";";
  let extraClassDeclaration = opcodeDecl;
}

def RT_EventType : TypeDef<RT_Dialect, "Event"> {
  let mnemonic = "event";
  let summary = "completion of an asynchronous collective";
}

def RT_F32Buf : MemRefOf<[F32]>;
/// Collectives move parameters and gradients, which may be bf16.
def RT_FloatBuf : MemRefOf<[F32, BF16, F16]>;
def RT_AnyBuf : MemRefOf<[F32, BF16, F16, I32, I64]>;

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
    over `shard_axis` (or -1), a second split `shard2_dim` over
    `shard2_axis` where there is one (the experts over "ep" and their FFN
    over "etp"), and their init spec (`normal:<std>`, `zeros`, `ones`).
    Gradients and optimizer state name their parameter in `of`. An input
    that lies in a pipeline chunk's slot region names that chunk in
    `chunk`: the runtime fills it, at the slot's copy, before each forward
    of that chunk (the chunks of an interleaved schedule share their slots,
    so no other chunk's forward may write there). An activation with
    `for_weight_grad` is what a split backward's input-gradient phase saves
    in the slot for its weight-gradient phase (the zero-bubble schedule;
    tessera-plan tells those bytes from the forward's). ZeRO-3: a
    `param_shard` is this rank's shard of a parameter bucket, the
    parameters' only device copy (`of` names the bucket's view,
    `rank_group` the group that splits it); the bucket's parameters and
    view are `staged`: their `offset` is into the program's staging space
    (`rt.staging_bytes`), the runtime's host copy of the whole parameters
    for initialisation and checkpoints, not into the arena.

    ```mlir
    rt.buffer @"fc1.weight" : memref<512x256xf32> {kind = "param", offset = 0 : i64,
        global_shape = array<i64: 1024, 256>, shard_dim = 0 : i64,
        shard_axis = "tp", init = "normal:0.02"}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$type,
                       RT_BufferKindAttr:$kind, I64Attr:$offset,
                       OptionalAttr<DenseI64ArrayAttr>:$global_shape,
                       DefaultValuedAttr<I64Attr, "-1">:$shard_dim,
                       OptionalAttr<StrAttr>:$shard_axis,
                       DefaultValuedAttr<I64Attr, "-1">:$shard2_dim,
                       OptionalAttr<StrAttr>:$shard2_axis,
                       OptionalAttr<StrAttr>:$init,
                       OptionalAttr<FlatSymbolRefAttr>:$of,
                       OptionalAttr<I64Attr>:$num_classes,
                       OptionalAttr<I64Attr>:$vocab_size,
                       OptionalAttr<StrAttr>:$rank_group,
                       OptionalAttr<I64Attr>:$rank_stride,
                       OptionalAttr<I64Attr>:$chunk,
                       UnitAttr:$for_weight_grad,
                       UnitAttr:$staged);
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

def RT_GemmOp : RT_InstrOp<"gemm", "Gemm"> {
  let summary = "c = alpha * op(a) @ op(b) + beta * c";
  let description = [{
    `beta = 1` accumulates into `c` (gradient accumulation over microbatches).
    `a` and `b` are both f32, or both bf16 or f16 (mixed precision's GEMMs:
    the products accumulate in f32). `c` is f32, or in `a` and `b`'s 16-bit
    format with `beta = 0`: the f32 result rounded once to nearest even, as
    an f32 `c` and an `rt.cast` would (a GEMM writing a bf16 activation).

    ```mlir
    rt.gemm %a, %b, %c {trans_b, alpha = 1.0 : f32, beta = 0.0 : f32} : memref<8x256xf32>, memref<512x256xf32>, memref<8x512xf32>
    rt.gemm %x, %w, %y {trans_b} : memref<8x256xbf16>, memref<512x256xbf16>, memref<8x512xbf16>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$a, RT_FloatBuf:$b, RT_FloatBuf:$c,
                       UnitAttr:$trans_a, UnitAttr:$trans_b,
                       DefaultValuedAttr<F32Attr, "1.0f">:$alpha,
                       DefaultValuedAttr<F32Attr, "0.0f">:$beta);
  let assemblyFormat = "$a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c)";
  let hasVerifier = 1;
}

/// The generic kernel form: operands and semantics as the artifact opcode
/// (runtime/schema/artifact.fbs); `value` is its one float attribute where
/// it has one (Fill's value, layer norm's eps, dropout's rate), `iattrs`
/// its integer attributes and `group` its shard or pipeline group.
class RT_KernelOp<string mnemonic, string opcode, string sum>
    : RT_InstrOp<mnemonic, opcode, [], 0> {
  let summary = sum;
  let description = "Operands and semantics as the artifact opcode `" # opcode #
                    "` (runtime/schema/artifact.fbs).";
  let arguments = (ins Variadic<RT_AnyBuf>:$buffers,
                       DefaultValuedAttr<F32Attr, "1.0f">:$alpha,
                       DefaultValuedAttr<F32Attr, "0.0f">:$beta,
                       OptionalAttr<F32Attr>:$value,
                       OptionalAttr<DenseI64ArrayAttr>:$iattrs,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = "$buffers attr-dict `:` type($buffers)";
}

def RT_BiasAddOp : RT_KernelOp<"bias_add", "BiasAdd", "y = x + b (rows)">;
def RT_AddOp : RT_KernelOp<"add", "Add", "c = a + b">;
def RT_GeluOp : RT_KernelOp<"gelu", "Gelu", "y = gelu(x)">;
def RT_GeluGradOp : RT_KernelOp<"gelu_grad", "GeluGrad", "dx = dy * gelu'(x)">;
def RT_ReluOp : RT_KernelOp<"relu", "Relu", "y = relu(x)">;
def RT_SwiGLUOp : RT_KernelOp<"swiglu", "SwiGLU", "y = silu(gate) * up, x = [gate | up] by rows">;
def RT_SwiGLUGradOp : RT_KernelOp<"swiglu_grad", "SwiGLUGrad", "backward of swiglu">;
def RT_RepeatKVOp : RT_KernelOp<"repeat_kv", "RepeatKV", "grouped QKV to head-major, K/V repeated per head">;
def RT_RepeatKVGradOp : RT_KernelOp<"repeat_kv_grad", "RepeatKVGrad", "backward of repeat_kv: dK, dV summed per group">;
def RT_QKNormOp : RT_KernelOp<"qk_norm", "QKNorm", "RMSNorm of each query and key head">;
def RT_QKNormGradOp : RT_KernelOp<"qk_norm_grad", "QKNormGrad", "backward of qk_norm">;
def RT_BiasGeluOp : RT_KernelOp<"bias_gelu", "BiasGelu", "y = gelu(x + b)">;
def RT_BiasGeluGradOp : RT_KernelOp<"bias_gelu_grad", "BiasGeluGrad",
    "dx = dy * gelu'(x + b), db = beta * db + sum_rows(dx)">;
def RT_ReluGradOp : RT_KernelOp<"relu_grad", "ReluGrad", "dx = dy * (x > 0)">;
def RT_ReduceRowsOp : RT_KernelOp<"reduce_rows", "ReduceRows", "y = alpha * sum_rows(x) + beta * y">;
def RT_CrossEntropyOp : RT_KernelOp<"cross_entropy", "CrossEntropy", "per-sample softmax cross-entropy">;
def RT_CrossEntropyGradOp : RT_KernelOp<"cross_entropy_grad", "CrossEntropyGrad", "backward of cross_entropy">;
def RT_MeanOp : RT_KernelOp<"mean", "Mean", "y = mean(x)">;
def RT_MeanGradOp : RT_KernelOp<"mean_grad", "MeanGrad", "dx = dy / numel(dx)">;
def RT_FillOp : RT_KernelOp<"fill", "Fill", "y = value">;
def RT_ScaleOp : RT_KernelOp<"scale", "Scale", "y = alpha * x">;
// Gradient clipping: `iattrs` the opcode's Runs, `group` the shard group;
// `value` ClipGradNorm's max_norm.
def RT_SumSquaresOp : RT_KernelOp<"sum_squares", "SumSquares", "y = sum of x^2 (over runs)">;
def RT_ClipGradNormOp : RT_KernelOp<"clip_grad_norm", "ClipGradNorm",
    "norm = sqrt(sumsq), coeff = min(1, max_norm / (norm + 1e-6))">;
def RT_ScaleByOp : RT_KernelOp<"scale_by", "ScaleBy", "y = x * s[0]">;
def RT_LossSeedOp : RT_KernelOp<"loss_seed", "LossSeed", "y = value * the loss scale (fp16)">;
def RT_MaskColumnsOp : RT_KernelOp<"mask_columns", "MaskColumns", "y = x, padded vocabulary columns = value">;
def RT_CopyOp : RT_KernelOp<"copy", "Copy", "y = x">;
def RT_AxpyOp : RT_KernelOp<"axpy", "Axpy", "y += alpha * x">;
def RT_CastOp : RT_KernelOp<"cast", "Cast", "y = convert(x + beta * y) between f32, bf16 and f16"> {
  let hasVerifier = 1;
}

// Transformer kernels: `value` is eps for layer norm; `iattrs` and `group`
// as the artifact opcode documents (vocab shard group, ignore_index, heads).
def RT_LayerNormOp : RT_KernelOp<"layer_norm", "LayerNorm", "layer norm over the last dim">;
def RT_LayerNormGradOp : RT_KernelOp<"layer_norm_grad", "LayerNormGrad", "layer norm backward">;
def RT_AddLayerNormOp : RT_KernelOp<"add_layer_norm", "AddLayerNorm", "s = a + b, layer norm of s">;
def RT_AddLayerNormGradOp : RT_KernelOp<"add_layer_norm_grad", "AddLayerNormGrad", "layer norm backward plus the residual gradient">;
def RT_RMSNormOp : RT_KernelOp<"rms_norm", "RMSNorm", "RMS norm over the last dim">;
def RT_RMSNormGradOp : RT_KernelOp<"rms_norm_grad", "RMSNormGrad", "RMS norm backward">;
def RT_AddRMSNormOp : RT_KernelOp<"add_rms_norm", "AddRMSNorm", "s = a + b, RMS norm of s">;
def RT_AddRMSNormGradOp : RT_KernelOp<"add_rms_norm_grad", "AddRMSNormGrad", "RMS norm backward plus the residual gradient">;
def RT_EmbeddingOp : RT_KernelOp<"embedding", "Embedding", "embedding lookup">;
def RT_EmbeddingGradOp : RT_KernelOp<"embedding_grad", "EmbeddingGrad", "embedding scatter-add">;
def RT_AddPositionEmbeddingOp : RT_KernelOp<"add_position_embedding", "AddPositionEmbedding", "x + P[s]">;
def RT_PositionEmbeddingGradOp : RT_KernelOp<"position_embedding_grad", "PositionEmbeddingGrad", "sum over batch">;
def RT_AttentionOp : RT_KernelOp<"attention", "Attention", "causal multi-head attention">;
def RT_AttentionGradOp : RT_KernelOp<"attention_grad", "AttentionGrad", "attention backward">;
def RT_LogitsStatsOp : RT_KernelOp<"logits_stats", "LogitsStats",
    "row max, sum of exponentials and label logit">;
def RT_LogitsMaxOp : RT_KernelOp<"logits_max", "LogitsMax", "row max">;
def RT_CrossEntropyStatsOp : RT_KernelOp<"cross_entropy_stats", "CrossEntropyStats", "sum-exp and target logit of a shard">;
def RT_CrossEntropyFromStatsOp : RT_KernelOp<"cross_entropy_from_stats", "CrossEntropyFromStats", "loss from statistics">;
def RT_CrossEntropyStatsGradOp : RT_KernelOp<"cross_entropy_stats_grad", "CrossEntropyStatsGrad", "softmax minus one-hot">;
def RT_TokenMeanOp : RT_KernelOp<"token_mean", "TokenMean", "mean over non-ignored tokens">;
def RT_TokenMeanGradOp : RT_KernelOp<"token_mean_grad", "TokenMeanGrad", "backward of token_mean">;
def RT_DropoutOp : RT_KernelOp<"dropout", "Dropout", "dropout keyed by global position (value = rate)">;
// Context parallelism (group "cp").
def RT_TokenCountOp : RT_KernelOp<"token_count", "TokenCount", "count of non-ignored tokens">;
def RT_TokenMeanOverOp : RT_KernelOp<"token_mean_over", "TokenMeanOver", "sum over non-ignored tokens / a given count">;
def RT_TokenMeanOverGradOp : RT_KernelOp<"token_mean_over_grad", "TokenMeanOverGrad", "backward of token_mean_over">;
def RT_RingAttentionOp : RT_KernelOp<"ring_attention", "RingAttention", "attention with K/V passed around the cp ring">;
def RT_RingAttentionGradOp : RT_KernelOp<"ring_attention_grad", "RingAttentionGrad", "ring attention backward">;
// Mixture of experts.
def RT_MoERouterOp : RT_KernelOp<"moe_router", "MoERouter", "top-k experts and their softmax">;
def RT_MoERouterGradOp : RT_KernelOp<"moe_router_grad", "MoERouterGrad", "router backward">;
def RT_MoEAuxLossOp : RT_KernelOp<"moe_aux_loss", "MoEAuxLoss", "load-balancing loss (value = coeff)">;
def RT_MoEAuxLossGradOp : RT_KernelOp<"moe_aux_loss_grad", "MoEAuxLossGrad", "load-balancing loss backward">;
def RT_MoEDispatchOp : RT_KernelOp<"moe_dispatch", "MoEDispatch", "permute tokens into expert order">;
def RT_MoEDispatchGradOp : RT_KernelOp<"moe_dispatch_grad", "MoEDispatchGrad", "sum permuted rows back per token">;
def RT_GroupedLinearOp : RT_KernelOp<"grouped_linear", "GroupedLinear", "one GEMM per expert's rows">;
def RT_GroupedLinearGradOp : RT_KernelOp<"grouped_linear_grad", "GroupedLinearGrad", "grouped GEMM backward">;
def RT_MoECombineOp : RT_KernelOp<"moe_combine", "MoECombine", "unpermute, weighted by the router">;
def RT_MoECombineGradOp : RT_KernelOp<"moe_combine_grad", "MoECombineGrad", "unpermute backward">;
def RT_AllToAllOp : RT_KernelOp<"all_to_all", "AllToAll", "equal-split all-to-all over a group">;
def RT_ExpertDispatchOp : RT_KernelOp<"expert_dispatch", "ExpertDispatch", "MoE rows to their experts' ranks">;
def RT_ExpertCombineOp : RT_KernelOp<"expert_combine", "ExpertCombine", "MoE rows back to their ranks">;
def RT_MoECapacityDropOp : RT_KernelOp<"moe_capacity_drop", "MoECapacityDrop", "drop the choices past each expert's capacity (value = factor)">;
def RT_MoECapacityDropGradOp : RT_KernelOp<"moe_capacity_drop_grad", "MoECapacityDropGrad", "zero the dropped choices' gradient">;
def RT_MoETokenCountsOp : RT_KernelOp<"moe_token_counts", "MoETokenCounts", "choices per expert, as f32">;
def RT_MoEAuxLossOverOp : RT_KernelOp<"moe_aux_loss_over", "MoEAuxLossOver", "load-balancing loss with all ranks' counts (value = coeff)">;
def RT_MoEAuxLossOverGradOp : RT_KernelOp<"moe_aux_loss_over_grad", "MoEAuxLossOverGrad", "backward of moe_aux_loss_over">;
// Pipeline p2p over group "pp", iattrs = [peer (+1 next, -1 prev), tag]; they
// join the open batch, completed before the next other instruction.
def RT_SendOp : RT_KernelOp<"send", "Send", "isend to a pipeline neighbour">;
def RT_RecvOp : RT_KernelOp<"recv", "Recv", "irecv from a pipeline neighbour">;

def RT_AdamOp : RT_InstrOp<"adam", "Adam"> {
  let summary = "in-place Adam step on a parameter and its fp32 state";
  let description = [{
    ```mlir
    rt.adam %p, %g, %m, %v, %t {lr = 1.0e-03 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32,
        eps = 1.0e-08 : f32, weight_decay = 0.0 : f32}
        : memref<512x256xf32>, memref<512x256xf32>, memref<512x256xf32>, memref<512x256xf32>, memref<i64>
    ```
  }];
  // `runs`: the elements with no weight decay, as the opcode's Runs (in
  // the coordinates of the bucket `param` is a shard of over `group`).
  let arguments = (ins RT_F32Buf:$param, RT_F32Buf:$grad, RT_F32Buf:$exp_avg,
                       RT_F32Buf:$exp_avg_sq, MemRefOf<[I64]>:$iteration,
                       F32Attr:$lr, F32Attr:$beta1, F32Attr:$beta2,
                       F32Attr:$eps, F32Attr:$weight_decay,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $iteration attr-dict `:`
    type($param) `,` type($grad) `,` type($exp_avg) `,` type($exp_avg_sq) `,` type($iteration)
  }];
}

def RT_SgdOp : RT_InstrOp<"sgd", "Sgd"> {
  let summary = "in-place SGD step";
  let description = [{
    ```mlir
    rt.sgd %p, %g {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : memref<16x256xf32>, memref<16x256xf32>
    ```
  }];
  let arguments = (ins RT_F32Buf:$param, RT_F32Buf:$grad, F32Attr:$lr,
                       F32Attr:$weight_decay,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($param) `,` type($grad)";
}

def RT_RotaryEmbeddingOp : RT_InstrOp<"rotary_embedding", "RotaryEmbedding"> {
  let summary = "rotary position embedding of the q and k of a fused QKV";
  let description = [{
    As nn.rotary_embedding: iattrs [num_heads, rotary_dim, inverse], fattrs
    [base, scaling_factor (0: none)], `group` the sequence's shard group.
    Input and result in any float format (bf16 activations rotate in
    place in bf16, each pair computed in f32 and rounded once).
    ```mlir
    rt.rotary_embedding %x, %y {num_heads = 4 : i64, rotary_dim = 32 : i64, base = 1.0e+04 : f32, group = "cp"}
        : memref<64x4x384xf32>, memref<64x4x384xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$result,
                       I64Attr:$num_heads, I64Attr:$rotary_dim,
                       DefaultValuedAttr<BoolAttr, "false">:$inverse,
                       F32Attr:$base,
                       DefaultValuedAttr<F32Attr, "0.0f">:$scaling_factor,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = [{
    $input `,` $result attr-dict `:` type($input) `,` type($result)
  }];
}

def RT_SgdMomentumOp : RT_InstrOp<"sgd_momentum", "SgdMomentum"> {
  let summary = "SGD with momentum: b = momentum * b + (g + wd * p), p -= lr * b";
  let description = [{
    torch.optim.SGD's update (dampening 0, not Nesterov), which Megatron's
    `--optimizer sgd --sgd-momentum` runs; `runs` and `group` as rt.sgd's.
    ```mlir
    rt.sgd_momentum %p, %g, %b {lr = 1.0e-02 : f32, weight_decay = 1.0e-02 : f32, momentum = 0.9 : f32}
        : memref<512x256xf32>, memref<512x256xf32>, memref<512x256xf32>
    ```
  }];
  let arguments = (ins RT_F32Buf:$param, RT_F32Buf:$grad, RT_F32Buf:$momentum_buffer,
                       F32Attr:$lr, F32Attr:$weight_decay, F32Attr:$momentum,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let assemblyFormat = [{
    $param `,` $grad `,` $momentum_buffer attr-dict `:` type($param) `,` type($grad) `,` type($momentum_buffer)
  }];
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def RT_AllReduceOp : RT_InstrOp<"all_reduce", "AllReduce"> {
  let summary = "in-place all-reduce on a communicator";
  let description = [{
    ```mlir
    rt.all_reduce %g {group = "dp", reduction = "sum"} : memref<1024xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$buffer, StrAttr:$group,
                       DefaultValuedAttr<RT_ReductionAttr,
                         "::tessera::rt::Reduction::Sum">:$reduction);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def RT_AllReduceStartOp : RT_InstrOp<"all_reduce_start", "AllReduceStart"> {
  let summary = "start an in-place all-reduce; complete with rt.wait";
  let description = [{
    ```mlir
    %e = rt.all_reduce_start %g {group = "dp"} : memref<1024xf32>
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_FloatBuf:$buffer, StrAttr:$group,
                       DefaultValuedAttr<RT_ReductionAttr,
                         "::tessera::rt::Reduction::Sum">:$reduction);
  let results = (outs RT_EventType:$event);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def RT_ReduceScatterStartOp : RT_InstrOp<"reduce_scatter_start", "ReduceScatterStart"> {
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

def RT_AllGatherStartOp : RT_InstrOp<"all_gather_start", "AllGatherStart"> {
  let summary = "start an all-gather; complete with rt.wait";
  let description = [{
    ZeRO-3's prefetch: the next parameter bucket's gather runs under the
    current one's readers.

    ```mlir
    %e = rt.all_gather_start %shard, %bucket {group = "dp"} : memref<512xf32>, memref<1024xf32>
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let results = (outs RT_EventType:$event);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_WaitOp : RT_InstrOp<"wait", "Wait"> {
  let summary = "wait for an asynchronous collective";
  let description = [{
    ```mlir
    rt.wait %e
    ```
  }];
  let arguments = (ins RT_EventType:$event);
  let assemblyFormat = "$event attr-dict";
}

def RT_ParamSyncStartOp : RT_InstrOp<"param_sync_start", "ParamSyncStart"> {
  let summary = "start a parameter bucket's all-gather, finished in a later function";
  let description = [{
    Megatron's `overlap_param_gather` (`start_param_sync`): the step's
    all-gather of the distributed optimizer's updated parameter bucket (the
    same layouts as `rt.all_gather`, in place when `input` is this rank's
    block of `output`) is left in flight when the step returns; the next
    forward's `rt.param_sync_wait` of the same `sync` id completes it right
    before the bucket's first reader. `sync` is the bucket's id in the
    program (its position among the grad buffers' buckets), not a
    function-local event.

    ```mlir
    rt.param_sync_start %shard, %bucket {group = "dp", sync = 3 : i64} : memref<512xbf16>, memref<1024xbf16>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group,
                       I64Attr:$sync);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_ParamSyncWaitOp : RT_InstrOp<"param_sync_wait", "ParamSyncWait"> {
  let summary = "finish a parameter bucket's all-gather if it is in flight";
  let description = [{
    Megatron's `finish_param_sync`: completes the `rt.param_sync_start` of
    `sync` when it is in flight (the first microbatch's forward after a
    step); nothing otherwise (the later microbatches, or before the first
    step).

    ```mlir
    rt.param_sync_wait {sync = 3 : i64}
    ```
  }];
  let arguments = (ins I64Attr:$sync);
  let assemblyFormat = "attr-dict";
}

def RT_AllGatherOp : RT_InstrOp<"all_gather", "AllGather"> {
  let summary = "all-gather along dim 0 into `output`";
  let description = [{
    ```mlir
    rt.all_gather %x, %y {group = "dp"} : memref<4xf32>, memref<8xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_ReduceScatterOp : RT_InstrOp<"reduce_scatter", "ReduceScatter"> {
  let summary = "sum over the group, this rank's dim-0 slice into `output`";
  let description = [{
    ```mlir
    rt.reduce_scatter %x, %y {group = "dp"} : memref<8xf32>, memref<4xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$output, StrAttr:$group);
  let assemblyFormat = "$input `,` $output attr-dict `:` type($input) `,` type($output)";
}

def RT_AllGatherGemmOp : RT_InstrOp<"all_gather_gemm", "AllGatherGemm"> {
  let summary = "all-gather along dim 0 pipelined with the GEMM of its rows";
  let description = [{
    `gathered` = the group's `input` blocks along dim 0 and `c` =
    `gathered @ op(b)` (dist.all_gather_matmul): the blocks travel around
    the group's ring, and the GEMM of each block's rows runs while the next
    one travels.

    ```mlir
    rt.all_gather_gemm %x, %w, %xg, %y {group = "tp", trans_b} : memref<4x2x32xf32>, memref<48x32xf32>, memref<8x2x32xf32>, memref<8x2x48xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$input, RT_FloatBuf:$b, RT_FloatBuf:$gathered,
                       RT_F32Buf:$c, StrAttr:$group, UnitAttr:$trans_b);
  let assemblyFormat = "$input `,` $b `,` $gathered `,` $c attr-dict `:` type($input) `,` type($b) `,` type($gathered) `,` type($c)";
  let hasVerifier = 1;
}

def RT_GemmReduceScatterOp : RT_InstrOp<"gemm_reduce_scatter", "GemmReduceScatter"> {
  let summary = "a GEMM's blocks of rows reduce-scattered along dim 0 around the ring";
  let description = [{
    `output` = this rank's dim-0 block of the sum over the group of
    `a @ op(b)` (dist.matmul_reduce_scatter): each step computes one block's
    product into `workspace` (three blocks of f32) and adds the running sum
    that arrived from the previous rank, which travels on while the next
    block is computed.

    ```mlir
    rt.gemm_reduce_scatter %a, %w, %ws, %y {group = "tp", trans_b} : memref<8x2x16xf32>, memref<32x16xf32>, memref<768xf32>, memref<4x2x32xf32>
    ```
  }];
  let arguments = (ins RT_FloatBuf:$a, RT_FloatBuf:$b, RT_F32Buf:$workspace,
                       RT_F32Buf:$output, StrAttr:$group, UnitAttr:$trans_b);
  let assemblyFormat = "$a `,` $b `,` $workspace `,` $output attr-dict `:` type($a) `,` type($b) `,` type($workspace) `,` type($output)";
  let hasVerifier = 1;
}

#endif // TESSERA_DIALECTS_RT_IR_RTOPS_TD
