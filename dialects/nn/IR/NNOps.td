//===- NNOps.td - nn dialect: tensor-level training ops --------*- tablegen -*-===//
//
// The input level of Tessera: a single-device model as one function over
// ranked f32 tensors. Each op knows its backward (DifferentiableOpInterface)
// and how it splits along the tensor-parallel axis (TPSplitOpInterface).
// Gradient and optimizer ops appear after autodiff and the optimizer pass.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_NN_IR_NNOPS_TD
#define TESSERA_DIALECTS_NN_IR_NNOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "tessera/Interfaces/TesseraInterfaces.td"
include "dialects/nn/IR/NNEnums.td"

def NN_Dialect : Dialect {
  let name = "nn";
  let cppNamespace = "::tessera::nn";
  let summary = "Tensor-level neural-network training ops";
  let description = [{
    The model a user writes: a function whose arguments are parameters
    (`nn.param = "<name>"`, `nn.init = "normal:<std>" | "uniform:<a>" |
    "zeros" | "ones"`) and inputs (`nn.input = "features" | "labels" |
    "tokens"`, `nn.batch_dim` when the batch is not dimension 0) and whose
    result is the scalar loss; ops may carry their transformer layer
    (`nn.layer`). The batch dimension may be dynamic (`?`); the
    tessera-set-batch pass fixes it to the micro-batch size. The dialect
    verifies its attributes (names in include/tessera/Support/Model.h) and
    loads the tessera dialect, which verifies the `tessera.*` ones.
  }];
  let dependentDialects = ["::tessera::TesseraDialect"];
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
}

/// Every nn op has a cost; ops whose FLOPs are not one per result element
/// pass their own `cost` trait (DeclareOpInterfaceMethods<..., ["getFlops"]>).
class NN_Op<string mnemonic, list<Trait> traits = [],
            list<Trait> cost = [Tessera_CostOpInterface]>
    : Op<NN_Dialect, mnemonic, !listconcat(traits, [Pure], cost)>;

defvar NN_CustomFlops = [DeclareOpInterfaceMethods<Tessera_CostOpInterface, ["getFlops"]>];

def NN_F32Tensor : RankedTensorOf<[F32]>;
/// Stored parameters and gradients under mixed precision.
def NN_FloatTensor : RankedTensorOf<[F32, BF16, F16]>;
def NN_I32Tensor : RankedTensorOf<[I32]>;
def NN_I64Tensor : RankedTensorOf<[I64]>;

//===----------------------------------------------------------------------===//
// Forward ops
//===----------------------------------------------------------------------===//

def NN_LinearOp : NN_Op<"linear", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface>], NN_CustomFlops> {
  let summary = "fully connected layer y = x W^T + b";
  let description = [{
    `input` is `[..., in]` (e.g. `[batch, in]` or Megatron's `[seq, batch,
    in]`), `weight` is `[out, in]` (PyTorch and Megatron layout) and the
    optional `bias` is `[out]`; the result is `[..., out]`.
    Under a column split the weight and bias are sharded along `out`; under a
    row split the weight is sharded along `in`, the input along its last
    dimension, and the result is a partial sum (the bias stays replicated and
    tp-partition moves it after the reduction).

    A stacked weight `[k, out, in]` (bias `[k, out]`) holds k projections
    of the same input as one GEMM of `k * out` features, in the order
    stacked: SwiGLU's gate and up projections (Megatron's `linear_fc1` under
    `--swiglu`). A column split shards `out`, so each rank computes
    `[proj0 shard | proj1 shard | ...]` (Megatron's per-rank
    `[gate_shard; up_shard]`), which only an op that takes the k blocks
    apart (nn.swiglu) may consume.

    ```mlir
    %gu = nn.linear %x, %w : (tensor<8x256xf32>, tensor<2x512x256xf32>) -> tensor<8x1024xf32>
    ```

    ```mlir
    %y = nn.linear %x, %w, %b : (tensor<8x256xf32>, tensor<1024x256xf32>, tensor<1024xf32>) -> tensor<8x1024xf32>
    ```

    Under mixed precision with bf16 GEMMs (tessera-mixed-precision) the
    input and the weight are both bf16 and the product accumulates in f32
    (Megatron's bf16 linear layers); the bias and the result stay f32.

    ```mlir
    %y = nn.linear %x16, %w16, %b : (tensor<8x256xbf16>, tensor<1024x256xbf16>, tensor<1024xf32>) -> tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$weight,
                       Optional<NN_F32Tensor>:$bias);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def NN_MatmulOp : NN_Op<"matmul", [InferTypeOpAdaptor], NN_CustomFlops> {
  let summary = "2-D matrix product with optional transposes";
  let description = [{
    `result = op(lhs) @ op(rhs)` where each operand is viewed as a matrix
    by flattening all leading dimensions into rows (`[..., k]` -> `[M, k]`)
    and `op` transposes when the matching flag is set. Without
    `transpose_lhs` the result keeps lhs's leading dimensions
    (`[..., n]`); with it the result is 2-d. Produced by autodiff for the
    backward of `nn.linear`. The operands are both f32 or both bf16; the
    result is f32 (a bf16 product accumulates in f32). A result may be given
    any shape of the same matrix view (`[..., n]` flattened to the same rows
    and columns): a stacked weight's gradient `[k, out, in]`.

    ```mlir
    %dw = nn.matmul %dy, %x {transpose_lhs} : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<16x256xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$lhs, NN_FloatTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    static bool isCompatibleReturnTypes(::mlir::TypeRange inferred,
                                        ::mlir::TypeRange actual);
  }];
}

class NN_UnaryOp<string mnemonic, list<Trait> traits = []>
    : NN_Op<mnemonic, !listconcat(traits, [SameOperandsAndResultType,
        DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
        DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                                  ["propagateShardedDim"]>])> {
  let arguments = (ins NN_F32Tensor:$input);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def NN_GeluOp : NN_UnaryOp<"gelu"> {
  let summary = "GELU activation, exact erf form or tanh approximation";
  let description = [{
    `x * Phi(x)` elementwise (Megatron's default), or with
    `approximate = "tanh"` PyTorch's `gelu(approximate='tanh')` (GPT-2's
    `gelu_new`): `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.

    ```mlir
    %h = nn.gelu %z : tensor<8x1024xf32>
    %t = nn.gelu %z {approximate = "tanh"} : tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let hasVerifier = 1;
}

def NN_BiasGeluOp : NN_Op<"bias_gelu", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "gelu(x + bias) in one pass (Megatron's bias_gelu_impl)";
  let description = [{
    Adds a `[n]` bias to every row of a `[..., n]` input and applies GELU
    (`approximate` as in nn.gelu), as Megatron's fused bias-GELU does for
    the first MLP projection (`bias_gelu_impl` after a linear with
    `skip_bias_add`). Created by tessera-fuse-bias-gelu; the backward
    (nn.bias_gelu_grad) reads the input without the bias, so the saved
    activation is the same size.

    ```mlir
    %h = nn.bias_gelu %z, %b : (tensor<8x1024xf32>, tensor<1024xf32>) -> tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$bias,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_SwiGLUOp : NN_Op<"swiglu", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim", "checkShard"]>], NN_CustomFlops> {
  let summary = "SwiGLU: silu(gate) * up from the stacked gate and up projections";
  let description = [{
    Megatron's `--swiglu` activation (its `swiglu`, and Hugging Face's
    LlamaMLP `act_fn(gate_proj(x)) * up_proj(x)`): the `[..., 2n]` input is
    the output of a linear with a stacked `[2, n, in]` weight, gate first;
    the result is `silu(x[..., :n]) * x[..., n:]`, `[..., n]`, in one pass.
    On a column-parallel shard the input is `[gate shard | up shard]`
    (Megatron's per-rank layout of linear_fc1), so the op runs unchanged on
    it and its result is the rank's contiguous shard.

    ```mlir
    %h = nn.swiglu %gu : (tensor<8x1024xf32>) -> tensor<8x512xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_ReluOp : NN_UnaryOp<"relu"> {
  let summary = "ReLU activation";
  let description = [{
    `max(x, 0)` elementwise.

    ```mlir
    %h = nn.relu %z : tensor<8x1024xf32>
    ```
  }];
}

def NN_AddOp : NN_Op<"add", [SameOperandsAndResultType, Commutative,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim"]>]> {
  let summary = "elementwise sum (residual add, gradient accumulation)";
  let description = [{
    ```mlir
    %s = nn.add %a, %b : tensor<8x256xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$lhs, NN_F32Tensor:$rhs);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def NN_BiasAddOp : NN_Op<"bias_add", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "adds a [n] bias to every row of a [..., n] tensor";
  let description = [{
    Created by tp-partition when a row-parallel linear's bias moves after the
    reduction, so that it is added once.

    ```mlir
    %y = nn.bias_add %x, %b : (tensor<8x256xf32>, tensor<256xf32>) -> tensor<8x256xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$bias);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_SoftmaxCrossEntropyOp : NN_Op<"softmax_cross_entropy", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "per-sample softmax cross-entropy over class logits";
  let description = [{
    `loss[i] = logsumexp(logits[i, :]) - logits[i, labels[i]]` for `logits`
    `[..., classes]` and integer `labels` `[...]`. With `ignore_index`, rows
    whose label equals it have loss 0 (and no gradient).

    ```mlir
    %l = nn.softmax_cross_entropy %logits, %labels : (tensor<8x16xf32>, tensor<8xi32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_MeanOp : NN_Op<"mean", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "mean of all elements, a 0-d tensor";
  let description = [{
    ```mlir
    %loss = nn.mean %l : (tensor<8xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Backward ops (created by autodiff)
//===----------------------------------------------------------------------===//

class NN_ActivationGradOp<string mnemonic> : NN_Op<mnemonic,
    [AllTypesMatch<["input", "result_grad", "result"]>]> {
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$result_grad);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $result_grad attr-dict `:` type($result)";
}

def NN_GeluGradOp : NN_ActivationGradOp<"gelu_grad"> {
  let summary = "backward of nn.gelu: dy * gelu'(x)";
  let description = [{
    `approximate` as in nn.gelu.

    ```mlir
    %dz = nn.gelu_grad %z, %dh : tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$result_grad,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let hasVerifier = 1;
}

def NN_BiasGeluGradOp : NN_Op<"bias_gelu_grad", [InferTypeOpAdaptor]> {
  let summary = "backward of nn.bias_gelu: the input and bias gradients";
  let description = [{
    `input_grad = result_grad * gelu'(input + bias)` and `bias_grad` its
    sum over the rows, in one pass.

    ```mlir
    %dz, %db = nn.bias_gelu_grad %z, %b, %dh : (tensor<8x1024xf32>, tensor<1024xf32>, tensor<8x1024xf32>) -> (tensor<8x1024xf32>, tensor<1024xf32>)
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$bias,
                       NN_F32Tensor:$result_grad,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$bias_grad);
  let assemblyFormat = "$input `,` $bias `,` $result_grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_SwiGLUGradOp : NN_Op<"swiglu_grad", [AllTypesMatch<["input", "result"]>]> {
  let summary = "backward of nn.swiglu: the gate and up gradients in one pass";
  let description = [{
    From the forward's `[..., 2n]` input and the `[..., n]` result gradient
    `dy`: `d gate = dy * up * silu'(gate)` and `d up = dy * silu(gate)`,
    stacked as the input is (`[..., 2n]`, gate first).

    ```mlir
    %dgu = nn.swiglu_grad %gu, %dh : (tensor<8x1024xf32>, tensor<8x512xf32>) -> tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$result_grad);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $result_grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_ReluGradOp : NN_ActivationGradOp<"relu_grad"> {
  let summary = "backward of nn.relu: dy * (x > 0)";
  let description = [{
    ```mlir
    %dz = nn.relu_grad %z, %dh : tensor<8x1024xf32>
    ```
  }];
}

def NN_ReduceRowsOp : NN_Op<"reduce_rows", [InferTypeOpAdaptor]> {
  let summary = "sum over all leading dimensions: [..., n] -> [n]";
  let description = [{
    The bias gradient of `nn.linear` and `nn.bias_add`. The result may be
    given any shape of `n` elements: a stacked bias's gradient `[k, out]`.

    ```mlir
    %db = nn.reduce_rows %dy : (tensor<8x16xf32>) -> tensor<16xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    static bool isCompatibleReturnTypes(::mlir::TypeRange inferred,
                                        ::mlir::TypeRange actual);
  }];
}

def NN_SoftmaxCrossEntropyGradOp : NN_Op<"softmax_cross_entropy_grad",
    [InferTypeOpAdaptor]> {
  let summary = "backward of nn.softmax_cross_entropy";
  let description = [{
    `dlogits[i, :] = dloss[i] * (softmax(logits[i, :]) - onehot(labels[i]))`.

    ```mlir
    %dz = nn.softmax_cross_entropy_grad %logits, %labels, %dl : (tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>) -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels, NN_F32Tensor:$loss_grad,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits `,` $labels `,` $loss_grad attr-dict `:` functional-type(operands, results)";
}

def NN_MeanGradOp : NN_Op<"mean_grad"> {
  let summary = "backward of nn.mean: broadcast dy / numel";
  let description = [{
    ```mlir
    %dl = nn.mean_grad %dloss : (tensor<f32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$result_grad);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$result_grad attr-dict `:` functional-type(operands, results)";
}

def NN_FillOp : NN_Op<"fill"> {
  let summary = "a tensor with every element set to `value`";
  let description = [{
    Seeds the backward sweep (`1 / num_microbatches`, as Megatron scales the
    loss) and zero gradients.

    ```mlir
    %seed = nn.fill 2.500000e-01 : tensor<f32>
    ```
  }];
  let arguments = (ins F32Attr:$value);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def NN_LossSeedOp : NN_Op<"loss_seed"> {
  let summary = "the backward's seed times the iteration's loss scale (fp16)";
  let description = [{
    Under fp16 (tessera-mixed-precision with params-dtype=f16) the backward
    sweep starts from `value` (`1 / num_microbatches`) times the loss scale
    the runtime holds for the iteration, as Megatron's
    MegatronOptimizer.scale_loss scales the loss before the backward: the
    gradients come out scaled, and `nn.clip_grad_norm {unscale}` unscales
    them before the update.

    ```mlir
    %seed = nn.loss_seed 2.500000e-01 : tensor<f32>
    ```
  }];
  let arguments = (ins F32Attr:$value);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def NN_ScaleOp : NN_Op<"scale", [SameOperandsAndResultType]> {
  let summary = "multiplies every element by a constant";
  let description = [{
    ```mlir
    %g = nn.scale %g0 {factor = 5.000000e-01 : f32} : tensor<1024x256xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, F32Attr:$factor);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def NN_CastOp : NN_Op<"cast", [
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "converts between f32, bf16 and f16 (round to nearest even)";
  let description = [{
    Mixed precision (tessera-mixed-precision): a bf16 parameter is cast to
    f32 where an op other than a GEMM reads it, and a GEMM's f32 operand to
    bf16, so the stored copy is bf16; the optimizer casts its fp32 main
    parameters back. Adjoints are f32 whatever the value's dtype (a bf16
    value's gradient is accumulated in f32), so the adjoint of a cast is
    its result's adjoint itself; autodiff rounds a parameter's gradient to
    the grad dtype once, at the end.

    ```mlir
    %w32 = nn.cast %w : tensor<1024x256xbf16> to tensor<1024x256xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Optimizer ops (created by the optimizer pass)
//===----------------------------------------------------------------------===//

def NN_SgdOp : NN_Op<"sgd", [AllTypesMatch<["param", "grad", "result"]>]> {
  let summary = "SGD step: p - lr * (g + weight_decay * p)";
  let description = [{
    ```mlir
    %p1 = nn.sgd %p, %g {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : tensor<16x256xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$param, NN_F32Tensor:$grad, F32Attr:$lr,
                       F32Attr:$weight_decay,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def NN_SgdMomentumOp : NN_Op<"sgd_momentum", [AllTypesMatch<["param", "grad",
    "momentum_buffer", "new_param", "new_momentum_buffer"]>]> {
  let summary = "SGD with momentum: b = momentum b + (g + wd p), p - lr b";
  let description = [{
    torch.optim.SGD's update (dampening 0, not Nesterov), Megatron's
    `--optimizer sgd` with `--sgd-momentum`: the weight decay is added to
    the gradient, the buffer (fp32, zero before the first step) keeps the
    velocity. `runs` and `group` as nn.adam's.

    ```mlir
    %p1, %b1 = nn.sgd_momentum %p, %g, %b {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32,
        momentum = 0.9 : f32} : tensor<16x256xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$param, NN_F32Tensor:$grad,
                       NN_F32Tensor:$momentum_buffer, F32Attr:$lr,
                       F32Attr:$weight_decay, F32Attr:$momentum,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs NN_F32Tensor:$new_param, NN_F32Tensor:$new_momentum_buffer);
  let assemblyFormat = "$param `,` $grad `,` $momentum_buffer attr-dict `:` type($param)";
  let hasVerifier = 1;
}

def NN_AdamOp : NN_Op<"adam", [AllTypesMatch<["param", "grad", "exp_avg",
    "exp_avg_sq", "new_param", "new_exp_avg", "new_exp_avg_sq"]>], NN_CustomFlops> {
  let summary = "Adam step (decoupled weight decay, bias-corrected)";
  let description = [{
    With `t` the 1-based iteration: `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g^2`,
    `p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * p)`.
    Optimizer state is fp32. `runs` (with nn.sgd's): the elements with no
    weight decay (biases and norm weights inside a gradient bucket), as
    [shard_elements, start0, end0, ...] in the bucket's coordinates, `param`
    being the shard of index (this rank's index in `group`); see the
    artifact opcode SumSquares.

    ```mlir
    %p1, %m1, %v1 = nn.adam %p, %g, %m, %v, %t {lr = 1.0e-03 : f32, beta1 = 0.9 : f32,
        beta2 = 0.999 : f32, eps = 1.0e-08 : f32, weight_decay = 0.0 : f32}
        : tensor<16x256xf32>, tensor<i64>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$param, NN_F32Tensor:$grad, NN_F32Tensor:$exp_avg,
                       NN_F32Tensor:$exp_avg_sq, 0DTensorOf<[I64]>:$iteration,
                       F32Attr:$lr, F32Attr:$beta1, F32Attr:$beta2,
                       F32Attr:$eps, F32Attr:$weight_decay,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs NN_F32Tensor:$new_param, NN_F32Tensor:$new_exp_avg,
                      NN_F32Tensor:$new_exp_avg_sq);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $iteration attr-dict
    `:` type($param) `,` type($iteration)
  }];
  let hasVerifier = 1;
}

def NN_SumSquaresOp : NN_Op<"sum_squares", []> {
  let summary = "sum of squares of a gradient (or of runs of a bucket shard)";
  let description = [{
    `y = sum x^2`, summed in f64, over all of `x`, or over the `runs` of the
    bucket `x` is the shard of (as nn.adam's `runs`, with `group`). The
    pieces of Megatron's global gradient norm (clip_grad_norm_fp32).

    ```mlir
    %s = nn.sum_squares %g : tensor<16x256xf32> -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$x,
                       OptionalAttr<DenseI64ArrayAttr>:$runs,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$x attr-dict `:` type($x) `->` type($result)";
  let hasVerifier = 1;
}

def NN_ClipGradNormOp : NN_Op<"clip_grad_norm", []> {
  let summary = "global gradient norm and the clipping coefficient";
  let description = [{
    From the sum of squares of every gradient: `norm = sqrt(sumsq)` and
    `coeff = min(1, max_norm / (norm + 1e-6))` (1 when `max_norm` is 0), as
    Megatron's clip_grad_norm_fp32.

    With `unscale` (fp16) the gradients are those of the scaled loss
    (nn.loss_seed): the norm is divided by the iteration's loss scale and
    the coefficient carries the division too, so one scaling unscales and
    clips (Megatron's _unscale_main_grads_and_check_for_nan, then
    clip_grad_norm_fp32); a norm that is not finite (inf or NaN gradients
    on some rank: every rank sums the same squares) skips the iteration's
    optimizer updates everywhere, as Megatron skips the step on found_inf.

    ```mlir
    %norm, %coeff = nn.clip_grad_norm %sumsq {max_norm = 1.0 : f32} : tensor<f32> -> tensor<f32>, tensor<f32>
    %norm16, %coeff16 = nn.clip_grad_norm %sumsq {max_norm = 1.0 : f32, unscale} : tensor<f32> -> tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$sumsq, F32Attr:$max_norm,
                       UnitAttr:$unscale);
  let results = (outs 0DTensorOf<[F32]>:$norm, 0DTensorOf<[F32]>:$coeff);
  let assemblyFormat = "$sumsq attr-dict `:` type($sumsq) `->` type($norm) `,` type($coeff)";
  let hasVerifier = 1;
}

def NN_MaskColumnsOp : NN_Op<"mask_columns", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "columns at or past `valid` set to `fill` (padded vocabulary)";
  let description = [{
    Keeps a padded vocabulary out of the loss (tessera-pad-vocab with
    `mask-padding`): the logits of the padding rows become `fill` (the
    lowest f32, so that they take no part in the softmax: their
    probabilities are exactly 0 and so their gradients), and the backward
    (the same op with `fill = 0`) zeroes their adjoints. Over a
    vocabulary-parallel shard (`group`, set by tessera-tp-partition) the
    column index is global: this rank's shard of the last dim starts at its
    index in the group times the shard's width.

    ```mlir
    %m = nn.mask_columns %z {valid = 257 : i64, fill = -3.40282347E+38 : f32} : tensor<64x384xf32>
    %g = nn.mask_columns %dz {valid = 257 : i64, fill = 0.0 : f32, group = "tp"} : tensor<64x192xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, I64Attr:$valid, F32Attr:$fill,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def NN_ScaleByOp : NN_Op<"scale_by", [AllTypesMatch<["x", "result"]>]> {
  let summary = "y = x * s (s a scalar tensor: the clipping coefficient)";
  let description = [{
    ```mlir
    %g1 = nn.scale_by %g, %coeff : tensor<16x256xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$x, 0DTensorOf<[F32]>:$scale);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$x `,` $scale attr-dict `:` type($x) `,` type($scale)";
}

//===----------------------------------------------------------------------===//
// Transformer ops (activations are sequence-major [seq, batch, hidden])
//===----------------------------------------------------------------------===//

def NN_EmbeddingOp : NN_Op<"embedding", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface>]> {
  let summary = "token embedding lookup";
  let description = [{
    `result[..., :] = table[ids[...], :]`. `vocab_size` is the real
    vocabulary (ids at or above it are a data error at run time); the
    table may have more rows (Megatron pads the vocabulary). With
    `vocab_shard_group`, the table holds one shard of the vocabulary rows
    along that rank group and ids outside the shard give zero rows
    (Megatron's `VocabParallelEmbedding`); tp-partition sets it.

    ```mlir
    %h = nn.embedding %ids, %wte {vocab_size = 257 : i64} : (tensor<64x4xi32>, tensor<384x128xf32>) -> tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_I32Tensor:$ids, NN_F32Tensor:$table, I64Attr:$vocab_size,
                       OptionalAttr<StrAttr>:$vocab_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$ids `,` $table attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_EmbeddingGradOp : NN_Op<"embedding_grad"> {
  let summary = "backward of nn.embedding: scatter-add rows into the table";
  let description = [{
    ```mlir
    %dwte = nn.embedding_grad %ids, %dh : (tensor<64x4xi32>, tensor<64x4x128xf32>) -> tensor<384x128xf32>
    ```
  }];
  let arguments = (ins NN_I32Tensor:$ids, NN_F32Tensor:$result_grad,
                       OptionalAttr<StrAttr>:$vocab_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$ids `,` $result_grad attr-dict `:` functional-type(operands, results)";
}

def NN_AddPositionEmbeddingOp : NN_Op<"add_position_embedding", [
    InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "adds learned position embeddings: x[s, b, :] + table[s, :]";
  let description = [{
    Under context parallelism `sequence_shard_group = "cp"` says that the
    input holds this cp rank's load-balanced share of the sequence (chunks
    r and 2 cp - 1 - r of 2 cp), so row s adds the table row of its global
    position.

    ```mlir
    %h1 = nn.add_position_embedding %h, %wpe : tensor<64x4x128xf32>, tensor<64x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$table,
                       OptionalAttr<StrAttr>:$sequence_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $table attr-dict `:` type($input) `,` type($table)";
  let hasVerifier = 1;
}

def NN_PositionEmbeddingGradOp : NN_Op<"position_embedding_grad"> {
  let summary = "backward of nn.add_position_embedding for the table";
  let description = [{
    `result[s, :] = sum_b result_grad[s, b, :]`; rows past the sequence
    length are zero.

    ```mlir
    %dwpe = nn.position_embedding_grad %dh : (tensor<64x4x128xf32>) -> tensor<64x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$result_grad,
                       OptionalAttr<StrAttr>:$sequence_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$result_grad attr-dict `:` functional-type(operands, results)";
}

def NN_LayerNormOp : NN_Op<"layer_norm", [InferTypeOpAdaptor,
    AllTypesMatch<["weight", "bias"]>,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>], NN_CustomFlops> {
  let summary = "layer normalisation over the last dimension";
  let description = [{
    ```mlir
    %y = nn.layer_norm %x, %g, %b {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       NN_F32Tensor:$bias, DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $weight `,` $bias attr-dict `:` type($input) `,` type($weight)";
  let hasVerifier = 1;
}

def NN_LayerNormGradOp : NN_Op<"layer_norm_grad", [
    AllTypesMatch<["input", "result_grad", "input_grad"]>,
    AllTypesMatch<["weight", "weight_grad", "bias_grad"]>], NN_CustomFlops> {
  let summary = "backward of nn.layer_norm: input, weight and bias gradients";
  let description = [{
    ```mlir
    %dx, %dg, %db = nn.layer_norm_grad %x, %g, %dy {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       NN_F32Tensor:$result_grad, DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$weight_grad,
                      NN_F32Tensor:$bias_grad);
  let assemblyFormat = "$input `,` $weight `,` $result_grad attr-dict `:` type($input) `,` type($weight)";
}

def NN_AddLayerNormOp : NN_Op<"add_layer_norm", [InferTypeOpAdaptor,
    AllTypesMatch<["lhs", "rhs", "sum"]>, AllTypesMatch<["weight", "bias"]>,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>], NN_CustomFlops> {
  let summary = "residual add and the layer norm of the sum, in one pass";
  let description = [{
    `sum = lhs + rhs` and `result = layer_norm(sum)` (as nn.layer_norm),
    both returned: the sum is the residual stream the next block adds to.
    Created by tessera-fuse-add-layer-norm (Megatron's fused
    residual-add + LayerNorm). Its adjoint, nn.add_layer_norm_grad, adds
    the sum's own gradient to the layer norm's input gradient in the same
    pass.

    ```mlir
    %s, %y = nn.add_layer_norm %x, %h, %g, %b {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$lhs, NN_F32Tensor:$rhs,
                       NN_F32Tensor:$weight, NN_F32Tensor:$bias,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$sum, NN_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs `,` $weight `,` $bias attr-dict `:` type($lhs) `,` type($weight)";
  let hasVerifier = 1;
}

def NN_AddLayerNormGradOp : NN_Op<"add_layer_norm_grad", [
    AllTypesMatch<["input", "result_grad", "sum_grad", "input_grad"]>,
    AllTypesMatch<["weight", "weight_grad", "bias_grad"]>], NN_CustomFlops> {
  let summary = "backward of nn.add_layer_norm";
  let description = [{
    As nn.layer_norm_grad on `input` (the sum), with `sum_grad` (the
    gradient the sum receives from its other readers) added to the input
    gradient: `input_grad` is the whole gradient of the sum, that is of
    both addends.

    ```mlir
    %ds, %dg, %db = nn.add_layer_norm_grad %s, %g, %dy, %dr {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       NN_F32Tensor:$result_grad, NN_F32Tensor:$sum_grad,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$weight_grad,
                      NN_F32Tensor:$bias_grad);
  let assemblyFormat = "$input `,` $weight `,` $result_grad `,` $sum_grad attr-dict `:` type($input) `,` type($weight)";
}

def NN_RMSNormOp : NN_Op<"rms_norm", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>], NN_CustomFlops> {
  let summary = "RMS normalisation over the last dimension";
  let description = [{
    `result = input / sqrt(mean(input^2) + eps) * weight` over the last
    dimension, statistics in f32: Megatron's RMSNorm (`--normalization
    RMSNorm`), Hugging Face's LlamaRMSNorm. No bias and no mean subtraction.

    ```mlir
    %y = nn.rms_norm %x, %g {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $weight attr-dict `:` type($input) `,` type($weight)";
  let hasVerifier = 1;
}

def NN_RMSNormGradOp : NN_Op<"rms_norm_grad", [
    AllTypesMatch<["input", "result_grad", "input_grad"]>,
    AllTypesMatch<["weight", "weight_grad"]>], NN_CustomFlops> {
  let summary = "backward of nn.rms_norm: input and weight gradients";
  let description = [{
    With `r = 1 / sqrt(mean(x^2) + eps)` and `xhat = x * r`:
    `input_grad = r * (dy * weight - xhat * mean(dy * weight * xhat))`,
    `weight_grad = sum over rows of dy * xhat`.

    ```mlir
    %dx, %dg = nn.rms_norm_grad %x, %g, %dy {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       NN_F32Tensor:$result_grad, DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$weight_grad);
  let assemblyFormat = "$input `,` $weight `,` $result_grad attr-dict `:` type($input) `,` type($weight)";
}

def NN_AddRMSNormOp : NN_Op<"add_rms_norm", [InferTypeOpAdaptor,
    AllTypesMatch<["lhs", "rhs", "sum"]>,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>], NN_CustomFlops> {
  let summary = "residual add and the RMS norm of the sum, in one pass";
  let description = [{
    `sum = lhs + rhs` and `result = rms_norm(sum)` (as nn.rms_norm), both
    returned, as nn.add_layer_norm for LayerNorm. Created by
    tessera-fuse-add-layer-norm.

    ```mlir
    %s, %y = nn.add_rms_norm %x, %h, %g {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$lhs, NN_F32Tensor:$rhs,
                       NN_F32Tensor:$weight,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$sum, NN_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs `,` $weight attr-dict `:` type($lhs) `,` type($weight)";
  let hasVerifier = 1;
}

def NN_AddRMSNormGradOp : NN_Op<"add_rms_norm_grad", [
    AllTypesMatch<["input", "result_grad", "sum_grad", "input_grad"]>,
    AllTypesMatch<["weight", "weight_grad"]>], NN_CustomFlops> {
  let summary = "backward of nn.add_rms_norm";
  let description = [{
    As nn.rms_norm_grad on `input` (the sum), with `sum_grad` added to the
    input gradient.

    ```mlir
    %ds, %dg = nn.add_rms_norm_grad %s, %g, %dy, %dr {eps = 1.0e-05 : f32} : tensor<64x4x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$weight,
                       NN_F32Tensor:$result_grad, NN_F32Tensor:$sum_grad,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$weight_grad);
  let assemblyFormat = "$input `,` $weight `,` $result_grad `,` $sum_grad attr-dict `:` type($input) `,` type($weight)";
}

def NN_AttentionOp : NN_Op<"attention", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim", "checkShard", "adjustForShard"]>], NN_CustomFlops> {
  let summary = "causal multi-head self-attention from fused QKV";
  let description = [{
    `qkv` is `[seq, batch, heads * 3 * head_dim]`, head-major (Megatron's
    linear_qkv layout: feature `h*3*D + {q,k,v}*D + d`), so splitting the
    last dimension into tp contiguous blocks gives each rank whole heads.
    The result is the context `[seq, batch, heads * head_dim]`:
    `softmax(q k^T / sqrt(D) + causal mask) v` per head.

    ```mlir
    %ctx = nn.attention %qkv {num_heads = 4 : i64} : (tensor<64x4x384xf32>) -> tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$qkv, I64Attr:$num_heads,
                       DefaultValuedAttr<BoolAttr, "true">:$causal);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$qkv attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_RepeatKVOp : NN_Op<"repeat_kv", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim", "checkShard", "adjustForShard"]>]> {
  let summary = "grouped-query attention's keys and values repeated for every query head";
  let description = [{
    Megatron's grouped-query attention (`--group-query-attention
    --num-query-groups G`): the fused QKV of its linear_qkv is laid out per
    query group, `[q (heads/G x head_dim) | k (head_dim) | v (head_dim)]`
    for each of the G groups. The result is nn.attention's head-major
    `[seq, batch, heads * 3 * head_dim]`, each group's key and value
    repeated for its heads/G query heads, as Megatron's
    DotProductAttention repeats them (`repeat_interleave`) and Hugging
    Face's `repeat_kv` does. The adjoint (nn.repeat_kv_grad) sums the keys'
    and values' gradients over each group's heads. Tensor parallelism
    splits whole groups: G must divide by tp.

    ```mlir
    %qkv = nn.repeat_kv %x {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<64x4x192xf32>) -> tensor<64x4x384xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, I64Attr:$num_heads,
                       I64Attr:$num_query_groups);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_RepeatKVGradOp : NN_Op<"repeat_kv_grad", [InferTypeOpAdaptor]> {
  let summary = "backward of nn.repeat_kv: key and value gradients summed per group";
  let description = [{
    From the head-major `[seq, batch, heads * 3 * head_dim]` gradient, the
    grouped `[seq, batch, G * (heads/G + 2) * head_dim]` one: the queries'
    gradients moved back, each group's key and value gradients summed over
    its heads in head order.

    ```mlir
    %dx = nn.repeat_kv_grad %dqkv {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<64x4x384xf32>) -> tensor<64x4x192xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, I64Attr:$num_heads,
                       I64Attr:$num_query_groups);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_QKNormOp : NN_Op<"qk_norm", [AllTypesMatch<["input", "result"]>,
    AllTypesMatch<["q_weight", "k_weight"]>,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim", "checkShard", "adjustForShard"]>]> {
  let summary = "RMSNorm of every query and key head in a fused, grouped QKV";
  let description = [{
    Megatron's `--qk-layernorm` with RMSNorm (its q_layernorm and
    k_layernorm; Qwen 3's and OLMo 2's q_norm and k_norm): on linear_qkv's
    output, laid out per query group `[q (heads/G x head_dim) | k | v]`
    (G = num_heads without grouped-query attention), each query head's
    head_dim features are RMS-normalised with `q_weight` and each key
    head's with `k_weight` (both `[head_dim]`); values pass through.
    Statistics in f32. Before RoPE, as Megatron and Hugging Face apply it.
    Tensor parallelism splits whole groups; the weights stay whole, their
    gradients summed over tp.

    ```mlir
    %n = nn.qk_norm %qkv, %wq, %wk {num_heads = 8 : i64, num_query_groups = 2 : i64, eps = 1.0e-06 : f32} : tensor<64x4x96xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$q_weight,
                       NN_F32Tensor:$k_weight, I64Attr:$num_heads,
                       I64Attr:$num_query_groups,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $q_weight `,` $k_weight attr-dict `:` type($input) `,` type($q_weight)";
  let hasVerifier = 1;
}

def NN_QKNormGradOp : NN_Op<"qk_norm_grad", [
    AllTypesMatch<["input", "result_grad", "input_grad"]>,
    AllTypesMatch<["q_weight", "k_weight", "q_weight_grad", "k_weight_grad"]>]> {
  let summary = "backward of nn.qk_norm: the input's and both weights' gradients";
  let description = [{
    Each normalised head as nn.rms_norm_grad's row; `q_weight_grad` and
    `k_weight_grad` sum over every query (key) head of every row, in row
    order.

    ```mlir
    %dx, %dwq, %dwk = nn.qk_norm_grad %qkv, %wq, %wk, %dy {num_heads = 8 : i64, num_query_groups = 2 : i64, eps = 1.0e-06 : f32} : tensor<64x4x96xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$q_weight,
                       NN_F32Tensor:$k_weight, NN_F32Tensor:$result_grad,
                       I64Attr:$num_heads, I64Attr:$num_query_groups,
                       DefaultValuedAttr<F32Attr, "1.0e-5f">:$eps);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$q_weight_grad,
                      NN_F32Tensor:$k_weight_grad);
  let assemblyFormat = "$input `,` $q_weight `,` $k_weight `,` $result_grad attr-dict `:` type($input) `,` type($q_weight)";
}

def NN_RotaryEmbeddingOp : NN_Op<"rotary_embedding", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Tessera_TPSplitOpInterface,
                              ["propagateShardedDim", "checkShard", "adjustForShard"]>], NN_CustomFlops> {
  let summary = "rotary position embedding of the queries and keys in a fused QKV";
  let description = [{
    Megatron's RoPE (`--position-embedding-type rope`, non-interleaved:
    Hugging Face's `rotate_half`) on nn.attention's fused, head-major
    `[seq, batch, heads * 3 * head_dim]` input: the first `rotary_dim`
    features of every head's query and key rotate by the angle
    `position * base^(-2i / rotary_dim)` of their pair i (features i and
    i + rotary_dim / 2), values and the other features pass through:
    `y1 = x1 cos - x2 sin`, `y2 = x2 cos + x1 sin`, computed in f32 as
    Megatron's RotaryEmbedding does. `inverse` rotates by minus the angle
    (the op's own adjoint). Positions are global: under context
    parallelism (`sequence_shard_group` "cp") each row takes its position
    in Megatron's load-balanced layout. A `scaling_factor` applies Llama
    3.1's frequency scaling (Megatron's `apply_rope_scaling`, with its
    low/high frequency factors 1 and 4 over an original context of 8192):
    wavelengths past 8192 divide their frequency by the factor, those under
    2048 keep it, and the band between interpolates.

    ```mlir
    %r = nn.rotary_embedding %qkv {num_heads = 4 : i64, rotary_dim = 32 : i64, base = 1.0e+04 : f32} : tensor<64x4x384xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, I64Attr:$num_heads,
                       I64Attr:$rotary_dim,
                       DefaultValuedAttr<F32Attr, "10000.0f">:$base,
                       DefaultValuedAttr<BoolAttr, "false">:$inverse,
                       OptionalAttr<StrAttr>:$sequence_shard_group,
                       OptionalAttr<F32Attr>:$scaling_factor);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def NN_AttentionGradOp : NN_Op<"attention_grad", [AllTypesMatch<["qkv", "result"]>], NN_CustomFlops> {
  let summary = "backward of nn.attention (recomputes the probabilities)";
  let description = [{
    ```mlir
    %dqkv = nn.attention_grad %qkv, %dctx {num_heads = 4 : i64} : tensor<64x4x384xf32>, tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$qkv, NN_F32Tensor:$result_grad,
                       I64Attr:$num_heads, DefaultValuedAttr<BoolAttr, "true">:$causal);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$qkv `,` $result_grad attr-dict `:` type($qkv) `,` type($result_grad)";
}

def NN_DropoutOp : NN_Op<"dropout", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "dropout with masks keyed by global position";
  let description = [{
    `y = x * keep / (1 - rate)` on `[seq, batch, hidden]` activations, where
    `keep` comes from the counter-based RNG keyed by (seed, `stream`, global
    sample, global sequence position, hidden index), so every parallel
    configuration drops the same elements. Its backward is the same op on
    the gradient. `sequence_shard_group` names the axes that shard the
    sequence: `"tp"` (sequence parallelism: a contiguous shard), `"cp"`
    (context parallelism: the rank's load-balanced share) or `"tp-cp"`
    (both: a contiguous tp shard of the cp share).

    ```mlir
    %y = nn.dropout %x {rate = 1.000000e-01 : f32, stream = 1 : i64} : tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, F32Attr:$rate, I64Attr:$stream,
                       OptionalAttr<StrAttr>:$sequence_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def NN_TokenMeanOp : NN_Op<"token_mean", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "mean of per-token losses over tokens whose label is not ignored";
  let description = [{
    Megatron's `sum(loss * loss_mask) / sum(loss_mask)`. With `count`, the
    divisor is that scalar instead of the local count: under context
    parallelism, the count of the whole sequence (`nn.token_count` summed
    over the cp group), so the cp ranks' results add up to the mean.

    ```mlir
    %loss = nn.token_mean %l, %labels {ignore_index = -100 : i64} : (tensor<64x4xf32>, tensor<64x4xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_I32Tensor:$labels,
                       Optional<0DTensorOf<[F32]>>:$count,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$input `,` $labels (`,` $count^)? attr-dict `:` functional-type(operands, results)";
}

def NN_TokenCountOp : NN_Op<"token_count", [InferTypeOpAdaptor, Tessera_NonDifferentiable]> {
  let summary = "number of tokens whose label is not ignored, as f32";
  let description = [{
    ```mlir
    %n = nn.token_count %labels {ignore_index = -100 : i64} : (tensor<64x4xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_I32Tensor:$labels,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$labels attr-dict `:` functional-type(operands, results)";
}

def NN_TokenMeanGradOp : NN_Op<"token_mean_grad"> {
  let summary = "backward of nn.token_mean";
  let description = [{
    ```mlir
    %dl = nn.token_mean_grad %dloss, %labels {ignore_index = -100 : i64} : (tensor<f32>, tensor<64x4xi32>) -> tensor<64x4xf32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$result_grad, NN_I32Tensor:$labels,
                       Optional<0DTensorOf<[F32]>>:$count,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$result_grad `,` $labels (`,` $count^)? attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy),
// created by tp-partition
//===----------------------------------------------------------------------===//

def NN_LogitsMaxOp : NN_Op<"logits_max", [InferTypeOpAdaptor, Tessera_NonDifferentiable]> {
  let summary = "row maximum of the local logits (no gradient)";
  let description = [{
    Only stabilises the softmax, so autodiff treats it as a constant.

    ```mlir
    %m = nn.logits_max %z : (tensor<64x4x192xf32>) -> tensor<64x4xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits attr-dict `:` functional-type(operands, results)";
}

def NN_LogitsStatsOp : NN_Op<"logits_stats", [InferTypeOpAdaptor,
    Tessera_NonDifferentiable]> {
  let summary = "row max, sum of exponentials and label logit in one pass";
  let description = [{
    For logits whose vocabulary is not sharded: `max[r]`, `sum_exp[r] =
    sum_j exp(logits[r, j] - max[r])` and `predicted[r] = logits[r,
    label]` (0 where the label is `ignore_index`), each row read once.
    Created by tessera-fuse-cross-entropy in place of
    nn.softmax_cross_entropy, feeding nn.cross_entropy_from_stats, whose
    adjoint reuses `max` and `sum_exp` instead of recomputing them.
    Labels outside the classes (other than `ignore_index`) are an error at
    run time.

    ```mlir
    %m, %se, %pl = nn.logits_stats %z, %t : (tensor<64x4x384xf32>, tensor<64x4xi32>) -> (tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>)
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs NN_F32Tensor:$max, NN_F32Tensor:$sum_exp,
                      NN_F32Tensor:$predicted);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_CrossEntropyStatsOp : NN_Op<"cross_entropy_stats", [InferTypeOpAdaptor]> {
  let summary = "local sum of exponentials and predicted logit of a vocabulary shard";
  let description = [{
    With `max` the global row maximum: `sum_exp[r] = sum_j exp(logits[r, j]
    - max[r])` over this shard and `predicted[r] = logits[r, label - offset]`
    when the label falls into this shard (offset = index in
    `vocab_shard_group` times the shard's vocabulary), else 0. Summed over
    the group they give the full softmax denominator and the target logit.

    ```mlir
    %se, %pl = nn.cross_entropy_stats %z, %t, %m {vocab_shard_group = "tp"} : (tensor<64x4x192xf32>, tensor<64x4xi32>, tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xf32>)
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels, NN_F32Tensor:$max,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<StrAttr>:$vocab_shard_group);
  let results = (outs NN_F32Tensor:$sum_exp, NN_F32Tensor:$predicted);
  let assemblyFormat = "$logits `,` $labels `,` $max attr-dict `:` functional-type(operands, results)";
}

def NN_CrossEntropyFromStatsOp : NN_Op<"cross_entropy_from_stats", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "per-token loss from the all-reduced statistics";
  let description = [{
    `loss = log(sum_exp) + max - predicted` (0 where the label is ignored).
    `logits` is not read by the forward: it is the operand the gradient is
    for. The adjoint is the softmax minus one-hot on the local shard, as in
    Megatron's `_VocabParallelCrossEntropy.backward`,
    `dlogits = dloss * (exp(logits - max) / sum_exp - onehot)`, and
    accounts for every path from `logits` through the statistics, so
    `sum_exp` and `predicted` receive no adjoint (no backward collective).

    ```mlir
    %l = nn.cross_entropy_from_stats %z, %t, %m, %se, %pl {vocab_shard_group = "tp"} : (tensor<64x4x192xf32>, tensor<64x4xi32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>) -> tensor<64x4xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels, NN_F32Tensor:$max,
                       NN_F32Tensor:$sum_exp, NN_F32Tensor:$predicted,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<StrAttr>:$vocab_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits `,` $labels `,` $max `,` $sum_exp `,` $predicted attr-dict `:` functional-type(operands, results)";
}

def NN_CrossEntropyStatsGradOp : NN_Op<"cross_entropy_stats_grad",
    [AllTypesMatch<["logits", "result"]>,
     AllTypesMatch<["max", "sum_exp", "loss_grad"]>]> {
  let summary = "softmax minus one-hot on a vocabulary shard, times the loss gradient";
  let description = [{
    ```mlir
    %dz = nn.cross_entropy_stats_grad %z, %t, %m, %se, %dl {vocab_shard_group = "tp"} : tensor<64x4x192xf32>, tensor<64x4xi32>, tensor<64x4xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$labels, NN_F32Tensor:$max,
                       NN_F32Tensor:$sum_exp, NN_F32Tensor:$loss_grad,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<StrAttr>:$vocab_shard_group);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits `,` $labels `,` $max `,` $sum_exp `,` $loss_grad attr-dict `:` type($logits) `,` type($labels) `,` type($max)";
}

//===----------------------------------------------------------------------===//
// Mixture of experts (Megatron's MoELayer: TopKRouter, the token dispatcher's
// permute/unpermute, GroupedMLP), on [tokens..., features] activations
//===----------------------------------------------------------------------===//

def NN_MoERouterOp : NN_Op<"moe_router", [InferTypeOpAdaptor,
    
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "top-k routing: indices of the k largest logits, softmax over them";
  let description = [{
    Megatron's TopKRouter with `moe_router_pre_softmax = False` (the
    default): per token, the k largest router logits (ties to the lower
    expert index) and the softmax over those k, in descending order.
    `indices` has no gradient.

    ```mlir
    %probs, %idx = nn.moe_router %logits {topk = 2 : i64} : tensor<64x4x8xf32> -> tensor<64x4x2xf32>, tensor<64x4x2xi32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, I64Attr:$topk);
  let results = (outs NN_F32Tensor:$probs, NN_I32Tensor:$indices);
  let assemblyFormat = "$logits attr-dict `:` type($logits) `->` type($probs) `,` type($indices)";
  let hasVerifier = 1;
}

def NN_MoERouterGradOp : NN_Op<"moe_router_grad", [
    AllTypesMatch<["probs", "probs_grad"]>]> {
  let summary = "backward of nn.moe_router for the logits";
  let description = [{
    `dlogits[t, indices[t, j]] = probs[t, j] * (dprobs[t, j] - sum_i
    probs[t, i] * dprobs[t, i])`, zero for the experts not chosen.

    ```mlir
    %dl = nn.moe_router_grad %probs, %idx, %dprobs : tensor<64x4x2xf32>, tensor<64x4x2xi32> -> tensor<64x4x8xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$probs, NN_I32Tensor:$indices,
                       NN_F32Tensor:$probs_grad);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$probs `,` $indices `,` $probs_grad attr-dict `:` type($probs) `,` type($indices) `->` type($result)";
}

def NN_MoECapacityDropOp : NN_Op<"moe_capacity_drop", [
    AllTypesMatch<["probs", "kept_probs"]>, AllTypesMatch<["indices", "kept_indices"]>,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "drop the routing choices past each expert's capacity";
  let description = [{
    Megatron's expert capacity (`topk_softmax_with_capacity` with
    `moe_expert_capacity_factor`): each expert takes at most
    C = ceil(tokens * k / experts * capacity_factor) of the choices routed
    to it; with `drop_policy = "probs"` (Megatron's default) those with the
    highest probabilities (ties to the earlier token), with `"position"`
    the first in token order. A dropped choice gets index -1 and
    probability 0, so nn.moe_dispatch leaves it out and nn.moe_combine adds
    nothing for it.

    ```mlir
    %p, %i = nn.moe_capacity_drop %probs, %idx {num_experts = 8 : i64, capacity_factor = 1.0 : f32, drop_policy = "probs"} : tensor<64x4x2xf32>, tensor<64x4x2xi32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$probs, NN_I32Tensor:$indices,
                       I64Attr:$num_experts, F32Attr:$capacity_factor,
                       DefaultValuedStrAttr<StrAttr, "probs">:$drop_policy);
  let results = (outs NN_F32Tensor:$kept_probs, NN_I32Tensor:$kept_indices);
  let assemblyFormat = "$probs `,` $indices attr-dict `:` type($probs) `,` type($indices)";
  let hasVerifier = 1;
}

def NN_MoECapacityDropGradOp : NN_Op<"moe_capacity_drop_grad", [
    AllTypesMatch<["result_grad", "result"]>]> {
  let summary = "backward of nn.moe_capacity_drop: zero for dropped choices";
  let description = [{
    ```mlir
    %dp = nn.moe_capacity_drop_grad %dkept, %kept_idx : tensor<64x4x2xf32>, tensor<64x4x2xi32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$result_grad, NN_I32Tensor:$kept_indices);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$result_grad `,` $kept_indices attr-dict `:` type($result_grad) `,` type($kept_indices)";
}

def NN_MoEAuxLossOp : NN_Op<"moe_aux_loss", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "the load-balancing loss of a router";
  let description = [{
    Megatron's `switch_load_balancing_loss_func`: with `p` the softmax of
    the logits over all E experts, `T` the tokens and `c_e` how many of
    them chose expert e (from `indices`),
    `coeff * E / (k * T * T) * sum_e (sum_t p[t, e]) * c_e`.

    With `counts` (f32 [E]: nn.moe_token_counts all-reduced over the ranks
    that split the tokens, Megatron's sequence_partition_group) `c_e` are
    those counts and `T = sum_e c_e / k` all ranks' tokens, while `p` sums
    this rank's: the result is this rank's share of the loss of all the
    tokens, and the shares add up to it.

    ```mlir
    %aux = nn.moe_aux_loss %logits, %idx {coeff = 1.0e-02 : f32} : (tensor<64x4x8xf32>, tensor<64x4x2xi32>) -> tensor<f32>
    %share = nn.moe_aux_loss %logits, %idx, %counts {coeff = 1.0e-02 : f32} : (tensor<32x4x8xf32>, tensor<32x4x2xi32>, tensor<8xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$indices,
                       Optional<1DTensorOf<[F32]>>:$counts, F32Attr:$coeff);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$logits `,` $indices (`,` $counts^)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_MoETokenCountsOp : NN_Op<"moe_token_counts", [InferTypeOpAdaptor,
    Tessera_NonDifferentiable]> {
  let summary = "the routing choices per expert, as f32";
  let description = [{
    `result[e]` counts the entries of `indices` equal to e (a dropped
    choice, -1, counts for none): the counts the load-balancing loss
    all-reduces when ranks split the tokens.

    ```mlir
    %c = nn.moe_token_counts %idx {num_experts = 8 : i64} : (tensor<32x4x2xi32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_I32Tensor:$indices, I64Attr:$num_experts);
  let results = (outs 1DTensorOf<[F32]>:$result);
  let assemblyFormat = "$indices attr-dict `:` functional-type(operands, results)";
}

def NN_MoEAuxLossGradOp : NN_Op<"moe_aux_loss_grad", [
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "backward of nn.moe_aux_loss for the logits";
  let description = [{
    ```mlir
    %dl = nn.moe_aux_loss_grad %logits, %idx, %daux {coeff = 1.0e-02 : f32} : tensor<64x4x8xf32>, tensor<64x4x2xi32>, tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$logits, NN_I32Tensor:$indices,
                       0DTensorOf<[F32]>:$result_grad,
                       Optional<1DTensorOf<[F32]>>:$counts, F32Attr:$coeff);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$logits `,` $indices `,` $result_grad (`,` $counts^)? attr-dict `:` type($logits) `,` type($indices) `,` type($result_grad) (`,` type($counts)^)?";
}

def NN_AddAuxLossOp : NN_Op<"add_aux_loss", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "attach an auxiliary loss to an activation";
  let description = [{
    Megatron's MoEAuxLossAutoScaler: the result is `input`; the backward
    passes the gradient through and gives `aux` the gradient the loss
    itself gets (1 / the number of microbatches), so the auxiliary loss is
    optimised without being added to the reported loss.

    ```mlir
    %y = nn.add_aux_loss %x, %aux : tensor<64x4x128xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, 0DTensorOf<[F32]>:$aux);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $aux attr-dict `:` type($input) `,` type($aux)";
}

def NN_MoEDispatchOp : NN_Op<"moe_dispatch", [InferTypeOpAdaptor,
    
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "permute tokens into expert order";
  let description = [{
    Megatron's token permutation (`permute`, the dispatcher's first step):
    each token's row is copied once per chosen expert into `[tokens * k,
    features]`, grouped by expert (expert 0's rows first) and, within an
    expert, in token order; `counts[e]` is the number of rows of expert e.
    Dropless: every choice keeps its row.

    ```mlir
    %xp, %counts = nn.moe_dispatch %x, %idx {num_experts = 8 : i64} : tensor<64x4x128xf32>, tensor<64x4x2xi32> -> tensor<512x128xf32>, tensor<8xi32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_I32Tensor:$indices,
                       I64Attr:$num_experts);
  let results = (outs NN_F32Tensor:$result, NN_I32Tensor:$counts);
  let assemblyFormat = "$input `,` $indices attr-dict `:` type($input) `,` type($indices) `->` type($result) `,` type($counts)";
  let hasVerifier = 1;
}

def NN_MoEDispatchGradOp : NN_Op<"moe_dispatch_grad"> {
  let summary = "backward of nn.moe_dispatch: sum each token's rows back";
  let description = [{
    ```mlir
    %dx = nn.moe_dispatch_grad %dxp, %idx {num_experts = 8 : i64} : tensor<512x128xf32>, tensor<64x4x2xi32> -> tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$result_grad, NN_I32Tensor:$indices,
                       I64Attr:$num_experts);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$result_grad `,` $indices attr-dict `:` type($result_grad) `,` type($indices) `->` type($result)";
}

def NN_GroupedLinearOp : NN_Op<"grouped_linear", [InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>], NN_CustomFlops> {
  let summary = "one linear per expert over its rows";
  let description = [{
    Megatron's GroupedMLP GEMMs (no bias): rows are grouped by expert as
    nn.moe_dispatch leaves them (`counts[e]` rows of expert e, in order);
    group e is `x_e @ weight[e]^T`. Weights are `[experts, out, in]`, or
    stacked `[experts, k, out, in]` as nn.linear's (SwiGLU experts: gate
    and up, `k * out` features; expert tensor parallelism splits `out`).

    ```mlir
    %h = nn.grouped_linear %xp, %counts, %w1 : (tensor<512x128xf32>, tensor<8xi32>, tensor<8x512x128xf32>) -> tensor<512x512xf32>
    ```

    Rows and weights are both f32 or both bf16 (mixed precision's GEMMs,
    accumulating in f32); the result is f32.

    `expected_rows` (optional): how many of the input's rows hold routed
    tokens under balanced routing, when the input is sized for the worst
    case (expert parallelism receives into room for every rank's rows):
    the FLOP count (CostOpInterface) uses it. Without it every row counts.
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_I32Tensor:$counts,
                       NN_FloatTensor:$weight,
                       OptionalAttr<I64Attr>:$expected_rows);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $counts `,` $weight attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_GroupedLinearGradOp : NN_Op<"grouped_linear_grad", [InferTypeOpAdaptor],
    NN_CustomFlops> {
  let summary = "backward of nn.grouped_linear";
  let description = [{
    Per expert: `dx_e = dy_e @ weight[e]` and `dweight[e] = dy_e^T @ x_e`.
    The gradients are f32 and shaped as the input and the weights; the
    three operands are all f32 or all bf16 (mixed precision's GEMMs).
    `expected_rows` as nn.grouped_linear's (its forward's, for the FLOPs).

    ```mlir
    %dx, %dw = nn.grouped_linear_grad %xp, %counts, %w1, %dh : tensor<512x128xf32>, tensor<8xi32>, tensor<8x512x128xf32>, tensor<512x512xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_I32Tensor:$counts,
                       NN_FloatTensor:$weight, NN_FloatTensor:$result_grad,
                       OptionalAttr<I64Attr>:$expected_rows);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$weight_grad);
  let assemblyFormat = "$input `,` $counts `,` $weight `,` $result_grad attr-dict `:` type($input) `,` type($counts) `,` type($weight) `,` type($result_grad)";
  let hasVerifier = 1;
}

def NN_MoECombineOp : NN_Op<"moe_combine", [InferTypeOpAdaptor,
    
    DeclareOpInterfaceMethods<Tessera_DifferentiableOpInterface>]> {
  let summary = "unpermute expert outputs and weight them by the router";
  let description = [{
    Megatron's `unpermute` with the routing probabilities:
    `result[t] = sum_j probs[t, j] * input[row of (t, j)]`, rows as
    nn.moe_dispatch placed them.

    ```mlir
    %y = nn.moe_combine %h, %probs, %idx {num_experts = 8 : i64} : tensor<512x128xf32>, tensor<64x4x2xf32>, tensor<64x4x2xi32> -> tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$probs,
                       NN_I32Tensor:$indices, I64Attr:$num_experts);
  let results = (outs NN_F32Tensor:$result);
  let assemblyFormat = "$input `,` $probs `,` $indices attr-dict `:` type($input) `,` type($probs) `,` type($indices) `->` type($result)";
  let hasVerifier = 1;
}

def NN_MoECombineGradOp : NN_Op<"moe_combine_grad", [
    AllTypesMatch<["input", "input_grad"]>, AllTypesMatch<["probs", "probs_grad"]>]> {
  let summary = "backward of nn.moe_combine";
  let description = [{
    `input_grad[row of (t, j)] = probs[t, j] * result_grad[t]` and
    `probs_grad[t, j] = input[row of (t, j)] . result_grad[t]`.

    ```mlir
    %dh, %dp = nn.moe_combine_grad %h, %probs, %idx, %dy {num_experts = 8 : i64} : tensor<512x128xf32>, tensor<64x4x2xf32>, tensor<64x4x2xi32>, tensor<64x4x128xf32>
    ```
  }];
  let arguments = (ins NN_F32Tensor:$input, NN_F32Tensor:$probs,
                       NN_I32Tensor:$indices, NN_F32Tensor:$result_grad,
                       I64Attr:$num_experts);
  let results = (outs NN_F32Tensor:$input_grad, NN_F32Tensor:$probs_grad);
  let assemblyFormat = "$input `,` $probs `,` $indices `,` $result_grad attr-dict `:` type($input) `,` type($probs) `,` type($indices) `,` type($result_grad)";
}

#endif // TESSERA_DIALECTS_NN_IR_NNOPS_TD
