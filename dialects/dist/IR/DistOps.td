//===- DistOps.td - dist dialect: mesh, regions, collectives ---*- tablegen -*-===//
//
// The custom dialect of Tessera. It carries the device mesh (`dist.mesh`),
// the tensor-parallel region ops with defined adjoints (Megatron's f and g,
// megatron/core/tensor_parallel/mappings.py), and collectives over a rank
// group named by kind, in sync and async form. Every rank group is derived
// from the mesh, never written by hand.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_DIST_IR_DISTOPS_TD
#define TESSERA_DIALECTS_DIST_IR_DISTOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "tessera/Interfaces/TesseraInterfaces.td"
include "dialects/tessera/IR/TesseraBase.td"
include "dialects/dist/IR/DistEnums.td"

def Dist_Dialect : Dialect {
  let name = "dist";
  let cppNamespace = "::tessera::dist";
  let summary = "Sharding, collectives and parallel structure";
  let useDefaultTypePrinterParser = 1;
  let description = [{
    Ops of this dialect name a mesh (`@mesh`) and a rank-group kind (`"tp"`,
    `"dp"`, or a composite such as `"tp-dp"`); the group a rank takes part
    in follows from the mesh's sizes and order string (Megatron's
    `RankGenerator` in megatron/core/parallel_state.py).

    The dialect verifies its discardable attributes (names in
    include/tessera/Support/Model.h): `dist.sharding = {axis, dim}` and
    `dist.tied` on parameters, `dist.pp_rank` on a pipeline-rank module,
    `dist.stage = {stage, chunk, layers}` and `dist.chunk` on its functions,
    `dist.chunk_slot` on a `dist.run`, `dist.single_bucket_group` on a
    module. It loads the tessera dialect.
  }];
  let dependentDialects = ["::tessera::TesseraDialect"];
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
}

class Dist_Op<string mnemonic, list<Trait> traits = []>
    : Op<Dist_Dialect, mnemonic, traits>;

// Closed sets of strings: the IR keeps the string, the accessors return the
// enum (DistEnums.td).
def Dist_ReductionAttr : Tessera_StrEnumAttr<Dist_Reduction>;
def Dist_PeerAttr : Tessera_StrEnumAttr<Dist_Peer>;
def Dist_ScheduleKindAttr : Tessera_StrEnumAttr<Dist_ScheduleKind>;
def Dist_RunPartAttr : Tessera_StrEnumAttr<Dist_RunPart>;
def Dist_BucketDataAttr : Tessera_StrEnumAttr<Dist_BucketData>;
def Dist_BucketReduceKindAttr : Tessera_StrEnumAttr<Dist_BucketReduceKind>;
def Dist_FloatDtypeAttr : Tessera_StrEnumAttr<Tessera_FloatDtype>;

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

def Dist_AsyncType : TypeDef<Dist_Dialect, "Async"> {
  let mnemonic = "async";
  let summary = "the pending result of an asynchronous collective";
  let description = [{
    Produced by a `*_start` collective and consumed by `dist.wait`, which
    yields the tensor. Work between start and wait overlaps communication.
  }];
  let parameters = (ins "::mlir::Type":$valueType);
  let assemblyFormat = "`<` $valueType `>`";
}

def Dist_RankedTensor : RankedTensorOf<[F32, BF16, F16, I32, I64]>;

//===----------------------------------------------------------------------===//
// Mesh
//===----------------------------------------------------------------------===//

def Dist_MeshOp : Dist_Op<"mesh", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "the device mesh: parallel sizes and rank order";
  let description = [{
    Sizes of the parallel axes and the order string that fixes how global
    ranks map onto them (Megatron's `RankGenerator` and
    `generate_masked_orthogonal_rank_groups`). Dense ranks follow the order
    without ep (tp-cp-dp-pp by default), expert ranks follow it without cp,
    reading tp as etp and dp as edp = tp*cp*dp / (etp*ep) (MoE folding:
    attention and MLP use different groups over the same ranks). The order
    names the axes from fastest to slowest varying; vpp is the number of
    virtual pipeline chunks per pp rank.

    ```mlir
    dist.mesh @mesh {tp = 2, dp = 2}
    dist.mesh @mesh {tp = 4, pp = 2, dp = 2, order = "tp-cp-ep-dp-pp"}
    ```

    Constraints: every size is at least 1; `order` is a permutation of
    `tp`, `cp`, `ep`, `dp` and `pp`; `ep * etp` divides `tp * cp * dp`; the
    dense and expert layouts give the same pp groups.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       DefaultValuedAttr<I64Attr, "1">:$tp,
                       DefaultValuedAttr<I64Attr, "1">:$cp,
                       DefaultValuedAttr<I64Attr, "1">:$ep,
                       DefaultValuedAttr<I64Attr, "1">:$etp,
                       DefaultValuedAttr<I64Attr, "1">:$dp,
                       DefaultValuedAttr<I64Attr, "1">:$pp,
                       DefaultValuedAttr<I64Attr, "1">:$vpp,
                       DefaultValuedStrAttr<StrAttr, "tp-cp-ep-dp-pp">:$order);
  let assemblyFormat = "$sym_name attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The sizes and order as the LLVM-free rank-group library sees them.
    ::tessera::mesh::MeshConfig getConfig();
    /// Number of ranks, tp * cp * dp * pp (= etp * ep * edp * pp).
    int64_t getWorldSize();
    /// Size of each group of a kind such as "tp", "dp-cp", "etp-ep" or
    /// "embedding"; fails with `error` set on an invalid kind.
    ::llvm::FailureOr<int64_t> getGroupSize(::llvm::StringRef kind,
                                            std::string &error);
    /// The group the data-parallel gradients are reduced and the
    /// distributed optimizer is sharded over: "dp", or "dp-cp" under context
    /// parallelism (Megatron's data-parallel group with context parallel
    /// ranks), and its size dp * cp.
    ::llvm::StringRef getGradReduceGroup() { return getCp() > 1 ? "dp-cp" : "dp"; }
    int64_t getGradReduceSize() { return getDp() * getCp(); }
  }];
}

//===----------------------------------------------------------------------===//
// Tensor-parallel region ops (Megatron's f and g: the autograd functions of
// megatron/core/tensor_parallel/mappings.py)
//===----------------------------------------------------------------------===//

class Dist_GroupOp<string mnemonic, list<Trait> traits = []>
    : Dist_Op<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  code groupClassDecl = [{
    /// The mesh op this op refers to; valid after verification.
    ::tessera::dist::MeshOp getMeshOp();
  }];
  let extraClassDeclaration = groupClassDecl;
}

def Dist_CopyToRegionOp : Dist_GroupOp<"copy_to_region", [Pure,
    SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "enter a tensor-parallel region: identity forward, all-reduce backward";
  let description = [{
    Megatron's `f` before a column-parallel linear
    (`copy_to_tensor_model_parallel_region`): every rank of the group
    already holds the whole input; the adjoint sums the input gradients of
    the group.

    ```mlir
    %x1 = dist.copy_to_region %x on @mesh "tp" : tensor<8x256xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input)";
}

def Dist_ReduceFromRegionOp : Dist_GroupOp<"reduce_from_region", [Pure,
    SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "leave a tensor-parallel region: all-reduce forward, identity backward";
  let description = [{
    Megatron's `g` after a row-parallel linear
    (`reduce_from_tensor_model_parallel_region`): sums the partial results of
    the group; the adjoint passes the gradient through unchanged.

    ```mlir
    %y = dist.reduce_from_region %yp on @mesh "tp" : tensor<8x256xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input)";
}

def Dist_ScatterToRegionOp : Dist_GroupOp<"scatter_to_region", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "keep this rank's slice of a dimension; all-gather backward";
  let description = [{
    Megatron's `f` before a row-parallel linear whose input is replicated
    (`scatter_to_tensor_model_parallel_region`, as `RowParallelLinear` uses
    it without `input_is_parallel`).

    ```mlir
    %xs = dist.scatter_to_region %x on @mesh "tp" : tensor<8x1024xf32> -> tensor<8x512xf32>
    ```

    The result's split dimension (`dim`, default the last; dim 0 for a
    sequence shard under sequence parallelism) is the input's divided by
    the group size.
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, OptionalAttr<I64Attr>:$dim);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input) `->` qualified(type($result))";
}

def Dist_GatherFromRegionOp : Dist_GroupOp<"gather_from_region", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "all-gather along a dimension; slice backward";
  let description = [{
    Megatron's `g` after a column-parallel linear with `gather_output`
    (`gather_from_tensor_model_parallel_region`).

    ```mlir
    %y = dist.gather_from_region %ys on @mesh "tp" : tensor<8x512xf32> -> tensor<8x1024xf32>
    ```

    The result's gathered dimension (`dim`, default the last) is the
    input's times the group size.
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, OptionalAttr<I64Attr>:$dim);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input) `->` qualified(type($result))";
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def Dist_AllReduceOp : Dist_GroupOp<"all_reduce", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "all-reduce over a rank group";
  let description = [{
    ```mlir
    %g = dist.all_reduce %g0 on @mesh "dp" : tensor<1024x256xf32>
    %m = dist.all_reduce %x on @mesh "tp" {reduction = "max"} : tensor<8xf32>
    ```

    `reduction` is `sum` (default) or `max`.
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group,
                       DefaultValuedAttr<Dist_ReductionAttr,
                         "::tessera::dist::Reduction::Sum">:$reduction);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input)";
}

def Dist_AllGatherOp : Dist_GroupOp<"all_gather", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "all-gather along a dimension over a rank group";
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, I64Attr:$dim, UnitAttr:$param_sync);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group `dim` $dim attr-dict `:` type($input) `->` qualified(type($result))";
  let extraClassDeclaration = groupClassDecl # [{
    /// With `param_sync`: the parameter bucket it gathers (its dist.unpack).
    ::tessera::dist::UnpackOp getParamSyncUnpack();
  }];
  let hasVerifier = 1;
  let description = [{
    Concatenates the group's tensors along `dim` in group-rank order.

    With `param_sync` (Megatron's `overlap_param_gather`; only on the step's
    gather of a distributed-optimizer parameter bucket, whose one user is the
    `dist.unpack` of the bucket's parameters): the gather is left in flight
    when the step returns, and the next forward's `dist.param_sync_wait` of
    the bucket finishes it before the parameters are read.

    ```mlir
    %y = dist.all_gather %x on @mesh "tp" dim 0 : tensor<4x256xf32> -> tensor<8x256xf32>
    ```
  }];
}

def Dist_ReduceScatterOp : Dist_GroupOp<"reduce_scatter", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "sum over a rank group, keeping this rank's slice along a dimension";
  let description = [{
    ```mlir
    %y = dist.reduce_scatter %x on @mesh "dp" dim 0 : tensor<8x256xf32> -> tensor<4x256xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, I64Attr:$dim);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group `dim` $dim attr-dict `:` type($input) `->` qualified(type($result))";
}

//===----------------------------------------------------------------------===//
// Tensor-parallel communication overlapped with GEMMs
//===----------------------------------------------------------------------===//

def Dist_AllGatherMatmulOp : Dist_GroupOp<"all_gather_matmul", [Pure,
    DeclareOpInterfaceMethods<Tessera_CostOpInterface, ["getFlops"]>]> {
  let summary = "all-gather along dim 0 pipelined with the GEMM that reads it";
  let description = [{
    Megatron-LM's `--tp-comm-overlap` for the all-gather before a
    column-parallel GEMM under sequence parallelism (TransformerEngine's
    userbuffers ring exchange; PyTorch's `fused_all_gather_matmul`):
    `gathered` is `dist.all_gather` of `input` along dim 0 over `group`, and
    `result` is `gathered @ op(rhs) (+ bias)` with the operands viewed as
    matrices as nn.matmul views them (leading dimensions flattened into rows;
    `op` transposes `rhs` when `transpose_rhs` is set: a linear's `[out, in]`
    weight, or a stacked `[k, out, in]` one as `[k * out, in]`). The rank's
    rows travel around the group's ring in tp steps; each step's GEMM of the
    block that arrived runs while the next block travels. Every row of
    `result` is the same product as the unfused GEMM's.

    Made by tessera-tp-comm-overlap from `dist.all_gather` feeding
    `nn.linear` or `nn.matmul`; `gathered` keeps the gather's other readers
    (the weight gradient's GEMM).

    ```mlir
    %xg, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, Dist_RankedTensor:$rhs,
                       Optional<Dist_RankedTensor>:$bias,
                       FlatSymbolRefAttr:$mesh, StrAttr:$group,
                       UnitAttr:$transpose_rhs);
  let results = (outs Dist_RankedTensor:$gathered, Dist_RankedTensor:$result);
  let assemblyFormat = "$input `,` $rhs (`,` $bias^)? `on` $mesh $group attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dist_MatmulReduceScatterOp : Dist_GroupOp<"matmul_reduce_scatter", [Pure,
    DeclareOpInterfaceMethods<Tessera_CostOpInterface, ["getFlops"]>]> {
  let summary = "a GEMM's partial sums reduce-scattered along dim 0, pipelined";
  let description = [{
    Megatron-LM's `--tp-comm-overlap` for the reduce-scatter after a
    row-parallel GEMM under sequence parallelism (PyTorch's
    `fused_matmul_reduce_scatter`): `result` is `dist.reduce_scatter` along
    dim 0 over `group` of `lhs @ op(rhs)` (operands viewed as nn.matmul
    views them). The product is computed one block of rows at a time; each
    block's running sum travels around the ring to the next rank, which adds
    its own block's product to it while the following one is computed.
    After tp steps every rank holds its block summed over the group, in ring
    order (another order of the same sum than the unfused reduce-scatter's;
    at tp = 2 the same two terms, so the same bits).

    ```mlir
    %y = dist.matmul_reduce_scatter %a, %w on @mesh "tp" {transpose_rhs} : (tensor<8x2x16xf32>, tensor<32x16xf32>) -> tensor<4x2x32xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$lhs, Dist_RankedTensor:$rhs,
                       FlatSymbolRefAttr:$mesh, StrAttr:$group,
                       UnitAttr:$transpose_rhs);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs `on` $mesh $group attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Context parallelism
//===----------------------------------------------------------------------===//

def Dist_RingAttentionOp : Dist_GroupOp<"ring_attention", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_CostOpInterface, ["getFlops"]>]> {
  let summary = "causal attention over a sequence split by context parallelism";
  let description = [{
    Megatron's context-parallel attention (TransformerEngine's ring
    attention, `cp_comm_type = "p2p"`): `qkv` is this rank's share of the
    sequence in the load-balanced layout (chunks r and 2 cp - 1 - r of
    2 cp, cp = the size of `group`), as nn.attention's operand. The keys and
    values travel around the group's ring; each rank accumulates its queries
    against every block with the online softmax and the causal mask of the
    global positions. `lse` is the log-sum-exp of each query's scaled scores
    `[seq, batch, num_heads]`, which the backward reuses.

    ```mlir
    %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 4 : i64} : tensor<32x4x384xf32> -> tensor<32x4x128xf32>, tensor<32x4x4xf32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[F32]>:$qkv, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, I64Attr:$num_heads,
                       DefaultValuedAttr<BoolAttr, "true">:$causal);
  let results = (outs 3DTensorOf<[F32]>:$result, 3DTensorOf<[F32]>:$lse);
  let assemblyFormat = "$qkv `on` $mesh $group attr-dict `:` type($qkv) `->` type($result) `,` type($lse)";
  let hasVerifier = 1;
}

def Dist_RingAttentionGradOp : Dist_GroupOp<"ring_attention_grad", [Pure,
    AllTypesMatch<["qkv", "result"]>, AllTypesMatch<["output", "result_grad"]>,
    DeclareOpInterfaceMethods<Tessera_CostOpInterface, ["getFlops"]>]> {
  let summary = "backward of dist.ring_attention";
  let description = [{
    The QKV gradient of this rank's share: K/V blocks go around the ring
    again, each followed by its gradient, which every rank adds its
    queries' share to; after a full turn each block's gradient is back with
    its owner.

    ```mlir
    %dqkv = dist.ring_attention_grad %qkv, %ctx, %lse, %dctx on @mesh "cp" {num_heads = 4 : i64} : tensor<32x4x384xf32>, tensor<32x4x128xf32>, tensor<32x4x4xf32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[F32]>:$qkv, 3DTensorOf<[F32]>:$output,
                       3DTensorOf<[F32]>:$lse, 3DTensorOf<[F32]>:$result_grad,
                       FlatSymbolRefAttr:$mesh, StrAttr:$group,
                       I64Attr:$num_heads,
                       DefaultValuedAttr<BoolAttr, "true">:$causal);
  let results = (outs 3DTensorOf<[F32]>:$result);
  let assemblyFormat = "$qkv `,` $output `,` $lse `,` $result_grad `on` $mesh $group attr-dict `:` type($qkv) `,` type($output) `,` type($lse)";
  let hasVerifier = 1;
}

def Dist_AllToAllOp : Dist_GroupOp<"all_to_all", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "equal-split all-to-all over a rank group (dim 0)";
  let description = [{
    Megatron's `all_to_all` with equal splits (`_AllToAll` in
    megatron/core/tensor_parallel/mappings.py, the token exchange of expert
    parallelism): dim 0 holds one block per rank of the group; block i goes
    to rank i, and block j of the result comes from rank j. Its adjoint is
    the same exchange of the gradient.

    ```mlir
    %y = dist.all_to_all %x on @mesh "ep" : tensor<8x128xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input)";
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

def Dist_ExpertDispatchOp : Dist_GroupOp<"expert_dispatch", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "send each expert's rows to the rank that holds the expert";
  let description = [{
    Megatron's MoEAlltoAllTokenDispatcher (dropless): `rows` are this
    rank's routed tokens in expert order with `counts` per expert (as
    nn.moe_dispatch leaves them); the experts are split evenly over the
    group, rank j holding experts [j E / ep, (j + 1) E / ep). The counts go
    to their owners first (an all-to-all), then the rows (an all-to-all
    with per-rank counts). `result` holds the rows this rank's experts
    received, expert by expert and, within an expert, by source rank (the
    dispatcher's sort_chunks_by_idxs), in a buffer sized for the worst case
    (every rank's every row); `local_counts` are its experts' row counts
    and `splits[i][e]` the rows source rank i sent to local expert e.

    With expert tensor parallelism (`etp` > 1) the group is "etp-ep": each
    run of `etp` consecutive ranks holds the same experts, each a 1/etp
    slice of their FFN, so a rank sends its rows for those experts to all
    `etp` of them (Megatron's all-to-all over ep followed by the all-gather
    over etp); the experts are split over the group's size / etp runs.

    ```mlir
    %recv, %lc, %splits = dist.expert_dispatch %rows, %counts on @mesh "ep" : tensor<64x32xf32>, tensor<4xi32> -> tensor<128x32xf32>, tensor<2xi32>, tensor<2x2xi32>
    ```
  }];
  let arguments = (ins 2DTensorOf<[F32, BF16]>:$input, 1DTensorOf<[I32]>:$counts,
                       FlatSymbolRefAttr:$mesh, StrAttr:$group,
                       DefaultValuedAttr<I64Attr, "1">:$etp);
  let results = (outs 2DTensorOf<[F32, BF16]>:$result, 1DTensorOf<[I32]>:$local_counts,
                      2DTensorOf<[I32]>:$splits);
  let assemblyFormat = "$input `,` $counts `on` $mesh $group attr-dict `:` type($input) `,` type($counts) `->` type($result) `,` type($local_counts) `,` type($splits)";
}

def Dist_ExpertCombineOp : Dist_GroupOp<"expert_combine", [Pure,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "return the experts' rows to the ranks that sent them";
  let description = [{
    The inverse of dist.expert_dispatch: `input` holds this rank's experts'
    output rows as dist.expert_dispatch ordered them, `splits` and `counts`
    are that dispatch's; the result is this rank's rows back in their
    original (expert) order. With `etp` > 1 each row comes back from the
    `etp` ranks that hold slices of its expert, and the result is their sum
    (Megatron's reduce-scatter over etp before the all-to-all over ep).

    ```mlir
    %back = dist.expert_combine %y, %splits, %counts on @mesh "ep" : tensor<128x32xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins 2DTensorOf<[F32, BF16]>:$input, 2DTensorOf<[I32]>:$splits,
                       1DTensorOf<[I32]>:$counts, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, DefaultValuedAttr<I64Attr, "1">:$etp);
  let results = (outs 2DTensorOf<[F32, BF16]>:$result);
  let assemblyFormat = "$input `,` $splits `,` $counts `on` $mesh $group attr-dict `:` type($input) `,` type($splits) `,` type($counts) `->` type($result)";
}

def Dist_AllReduceStartOp : Dist_GroupOp<"all_reduce_start"> {
  let summary = "start an asynchronous all-reduce";
  let description = [{
    ```mlir
    %f = dist.all_reduce_start %g on @mesh "dp" : tensor<1024xf32> -> !dist.async<tensor<1024xf32>>
    %r = dist.wait %f : !dist.async<tensor<1024xf32>> -> tensor<1024xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group,
                       DefaultValuedAttr<Dist_ReductionAttr,
                         "::tessera::dist::Reduction::Sum">:$reduction);
  let results = (outs Dist_AsyncType:$result);
  let assemblyFormat = "$input `on` $mesh $group attr-dict `:` type($input) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def Dist_AllGatherStartOp : Dist_GroupOp<"all_gather_start"> {
  let summary = "start an asynchronous all-gather";
  let description = [{
    ```mlir
    %f = dist.all_gather_start %x on @mesh "dp" dim 0 : tensor<4xf32> -> !dist.async<tensor<8xf32>>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, I64Attr:$dim);
  let results = (outs Dist_AsyncType:$result);
  let assemblyFormat = "$input `on` $mesh $group `dim` $dim attr-dict `:` type($input) `->` qualified(type($result))";
}

def Dist_ReduceScatterStartOp : Dist_GroupOp<"reduce_scatter_start"> {
  let summary = "start an asynchronous reduce-scatter";
  let description = [{
    ```mlir
    %f = dist.reduce_scatter_start %x on @mesh "dp" dim 0 : tensor<8xf32> -> !dist.async<tensor<4xf32>>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$group, I64Attr:$dim);
  let results = (outs Dist_AsyncType:$result);
  let assemblyFormat = "$input `on` $mesh $group `dim` $dim attr-dict `:` type($input) `->` qualified(type($result))";
}

def Dist_WaitOp : Dist_Op<"wait"> {
  let summary = "wait for an asynchronous collective and take its result";
  let description = [{
    ```mlir
    %r = dist.wait %f : !dist.async<tensor<1024xf32>> -> tensor<1024xf32>
    ```
  }];
  let arguments = (ins Dist_AsyncType:$future);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$future attr-dict `:` qualified(type($future)) `->` qualified(type($result))";
  let hasVerifier = 1;
}


//===----------------------------------------------------------------------===//
// Pipeline parallelism
//===----------------------------------------------------------------------===//

def Dist_SendOp : Dist_Op<"send"> {
  let summary = "send a tensor to the next or previous pipeline rank";
  let description = [{
    Point-to-point over the `pp` group: `peer` is `"next"` or `"prev"`,
    wrapping around the group (with virtual stages the last rank's chunk c
    feeds the first rank's chunk c + 1). `tag` names the channel; the
    matching `dist.recv` on the peer has the same tag, shape and element
    type. tessera-pp-split creates the forward pair, tessera-autodiff the
    backward pair (tag + 1). Sends and receives that follow each other are
    posted and completed together (Megatron's batched `_communicate`).

    ```mlir
    dist.send %h to "next" {tag = 0 : i64} : tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins Dist_RankedTensor:$input, Dist_PeerAttr:$peer,
                       I64Attr:$tag);
  let assemblyFormat = "$input `to` $peer attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Dist_RecvOp : Dist_Op<"recv"> {
  let summary = "receive a tensor from the previous or next pipeline rank";
  let description = [{
    ```mlir
    %h = dist.recv from "prev" {tag = 0 : i64} : tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins Dist_PeerAttr:$peer, I64Attr:$tag);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "`from` $peer attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Dist_ScheduleOp : Dist_Op<"schedule", [HasParent<"::mlir::ModuleOp">,
    SingleBlock, NoTerminator]> {
  let summary = "a pipeline rank's order of forward and backward steps";
  let description = [{
    One per pipeline-rank module (from tessera-pp-schedule): `dist.run` ops
    in execution order for one training iteration. `kind` is the schedule
    (`none`, `1f1b`, `interleaved`), `warmup` the number of forward steps
    before the first backward.

    ```mlir
    dist.schedule {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
    ```
  }];
  let arguments = (ins Dist_ScheduleKindAttr:$kind, I64Attr:$warmup);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "attr-dict-with-keyword $body";
}

def Dist_RunOp : Dist_Op<"run", [HasParent<"ScheduleOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "run a chunk's forward or backward for one microbatch";
  let description = [{
    `slot` picks the copy of the chunk's saved activations and inputs that
    this microbatch uses while it is in flight; a backward uses the slot
    of its forward. A phase is its leading receives, its computation and
    its trailing sends; `part` (`"recv"`, `"compute"` or `"send"`) runs one
    of them, so that a schedule can batch communication the way Megatron's
    interleaved schedule does (the sends of a forward and a backward and
    the receives of the next two in one batch). Without `part` the whole
    phase runs.

    ```mlir
    dist.run @forward_c1 microbatch 2 slot 0 part "compute"
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee, I64Attr:$microbatch,
                       I64Attr:$slot, OptionalAttr<Dist_RunPartAttr>:$part);
  let assemblyFormat = "$callee `microbatch` $microbatch `slot` $slot (`part` $part^)? attr-dict";
}


//===----------------------------------------------------------------------===//
// Data parallelism: gradient buffers and buckets
//===----------------------------------------------------------------------===//

def Dist_GradBufferOp : Dist_Op<"grad_buffer", [Symbol,
    HasParent<"::mlir::ModuleOp">]> {
  let summary = "the layout of a Megatron param-and-grad buffer";
  let description = [{
    Megatron's `_ParamAndGradBuffer` for the parameters of one (param dtype,
    grad dtype) on one pipeline rank: where each parameter's gradient (and,
    with the distributed optimizer, the parameter itself) lives in one flat
    buffer of `numel` elements, and how the buffer is cut into buckets, each
    reduced by one collective. `params` lists `{name, start, end, bucket}`
    in the model's order; `buckets` lists `[start, end, numel_unpadded]`.
    The verifier checks the layout's invariants: buckets contiguous and
    covering the buffer, parameters inside their bucket and disjoint, and
    with `distributed` (the distributed optimizer) 64-element parameter
    starts and bucket sizes divisible by `dp` (ends padded to lcm(dp, 128),
    or lcm(dp, 128, 2^16) with `pad_for_high_busbw`); without it, no
    padding. `group` is the rank group the buffer is reduced (and, with
    `distributed`, sharded) over, of `dp` ranks: "dp", "dp-cp" under
    context parallelism, "edp" for the experts' buffer under expert
    parallelism. `shard_grads` (ZeRO-2, Megatron's
    `--data-parallel-sharding-strategy optim_grads`; needs `distributed`):
    the gradients are kept only as this rank's shard of each bucket
    (`gshard:<buffer>:<k>`); a bucket's full gradients exist only within a
    backward, which reduce-scatters them and adds its shard in.
    `shard_params` (ZeRO-3, Megatron's `optim_grads_params`; needs
    `shard_grads`): the parameters too are kept only as this rank's shard of
    each bucket (`pshard:<buffer>:<k>`); a phase all-gathers a bucket before
    the ops that read its parameters (tessera-gather-params) and the step
    updates the shard without gathering it.

    ```mlir
    dist.grad_buffer @gbuf0 {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
        distributed = true, numel = 256 : i64, numel_unpadded = 138 : i64,
        params = [{name = "a", start = 128 : i64, end = 138 : i64, bucket = 0 : i64},
                  {name = "b", start = 0 : i64, end = 100 : i64, bucket = 0 : i64} ],
        buckets = [array<i64: 0, 256, 138>]}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       Dist_FloatDtypeAttr:$param_dtype,
                       Dist_FloatDtypeAttr:$grad_dtype, I64Attr:$dp, BoolAttr:$distributed,
                       DefaultValuedAttr<BoolAttr, "false">:$pad_for_high_busbw,
                       I64Attr:$numel, I64Attr:$numel_unpadded,
                       ArrayAttr:$params, ArrayAttr:$buckets,
                       DefaultValuedStrAttr<StrAttr, "dp">:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$shard_grads,
                       DefaultValuedAttr<BoolAttr, "false">:$shard_params);
  let assemblyFormat = "$sym_name attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The layout as the LLVM-free library sees it.
    ::tessera::buckets::Buffer getLayout();
    /// Names of the parameters in bucket `bucket`, in buffer order.
    ::llvm::SmallVector<::llvm::StringRef> getBucketParams(int64_t bucket);
    /// Bucket `bucket`'s range, and its parameters' ranges in buffer order
    /// (without building the whole layout: per-bucket callers stay linear).
    ::tessera::buckets::Bucket getBucket(int64_t bucket);
    ::llvm::SmallVector<::tessera::buckets::ParamRange>
    getBucketParamRanges(int64_t bucket);
  }];
}

def Dist_PackOp : Dist_Op<"pack", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a bucket of a grad buffer as one flat tensor";
  let description = [{
    The flat view of bucket `bucket` of `buffer`: each operand (the bucket's
    parameters' gradients, `data = "grad"`, or values, `data = "param"`, in
    buffer order) at its offset, padding zero. lower-to-rt places the
    gradients (and with the distributed optimizer the parameters) inside
    their buffer, so packing costs nothing: the collectives run on the
    buffer's memory.

    ```mlir
    %flat = dist.pack @gbuf0 bucket 0 "grad" (%gb, %ga) : tensor<100xf32>, tensor<10xf32> -> tensor<256xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer, I64Attr:$bucket,
                       Dist_BucketDataAttr:$data, Variadic<Dist_RankedTensor>:$inputs);
  let results = (outs Dist_RankedTensor:$result);
  let assemblyFormat = "$buffer `bucket` $bucket $data `(` $inputs `)` attr-dict `:` type($inputs) `->` type($result)";
}

def Dist_UnpackOp : Dist_Op<"unpack", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the parameters' parts of a flat bucket";
  let description = [{
    The inverse of `dist.pack`: the tensors of the bucket's parameters (in
    buffer order) read from their offsets.

    ```mlir
    %gb, %ga = dist.unpack @gbuf0 bucket 0 "grad" %flat : tensor<256xf32> -> tensor<100xf32>, tensor<10xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer, I64Attr:$bucket,
                       Dist_BucketDataAttr:$data, Dist_RankedTensor:$input);
  let results = (outs Variadic<Dist_RankedTensor>:$results);
  let assemblyFormat = "$buffer `bucket` $bucket $data $input attr-dict `:` type($input) `->` type($results)";
}


def Dist_BucketReduceStartOp : Dist_Op<"bucket_reduce_start", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "start a bucket's gradient reduction during the backward";
  let description = [{
    Megatron's overlap_grad_reduce: in the last microbatch's backward, once
    the gradients given as operands (the bucket's last ones to be produced)
    have been accumulated into the grad buffer, scale bucket `bucket` of
    `buffer` by `scale` and start summing it over `group`; the rest of the
    backward runs while it is in flight. `dist.bucket_reduce_wait` completes
    it. `kind = "reduce_scatter"` (the distributed optimizer) leaves this
    rank's shard of the sum in the bucket's shard buffer
    (`gshard:<buffer>:<bucket>`) for the step. With `accumulate` (a
    `shard_grads` buffer, ZeRO-2: every microbatch's backward reduces) the
    operands are this microbatch's gradients of the bucket, gathered into a
    bucket of their own that lives from this op to the wait, and the wait
    adds this rank's shard of the sum into the shard buffer.

    ```mlir
    dist.bucket_reduce_start @gbuf bucket 1 over @mesh "dp" scale 5.000000e-01 (%g1, %g2) : tensor<16xf32>, tensor<4x4xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer, I64Attr:$bucket,
                       FlatSymbolRefAttr:$mesh, StrAttr:$group, F32Attr:$scale,
                       DefaultValuedAttr<Dist_BucketReduceKindAttr,
                         "::tessera::dist::BucketReduceKind::AllReduce">:$kind,
                       UnitAttr:$accumulate,
                       Variadic<Dist_RankedTensor>:$grads);
  let assemblyFormat = "$buffer `bucket` $bucket `over` $mesh $group `scale` $scale `(` $grads `)` attr-dict `:` type($grads)";
}

def Dist_BucketReduceWaitOp : Dist_Op<"bucket_reduce_wait", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "wait for a bucket reduction started by bucket_reduce_start";
  let arguments = (ins FlatSymbolRefAttr:$buffer, I64Attr:$bucket);
  let assemblyFormat = "$buffer `bucket` $bucket attr-dict";
}

def Dist_ParamSyncWaitOp : Dist_Op<"param_sync_wait", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "finish the step's gather of a parameter bucket (overlap_param_gather)";
  let description = [{
    Megatron's `finish_param_sync` (its forward pre-hook): the step's
    `dist.all_gather {param_sync}` of bucket `bucket` of `buffer`, still in
    flight, completes here; tessera-optimizer places it right before the
    first op of a forward phase that reads one of the bucket's parameters.
    The later microbatches find nothing in flight and go on.

    ```mlir
    dist.param_sync_wait @gbuf bucket 1
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer, I64Attr:$bucket);
  let assemblyFormat = "$buffer `bucket` $bucket attr-dict";
}

#endif // TESSERA_DIALECTS_DIST_IR_DISTOPS_TD
