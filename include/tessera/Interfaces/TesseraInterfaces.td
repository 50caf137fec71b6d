//===- TesseraInterfaces.td - Op interfaces shared by dialects -*- tablegen -*-===//
//
// Behaviour that many ops share across the nn and dist dialects: how an op
// builds its backward (autodiff) and how it splits along a tensor-parallel
// mesh axis (tp-partition). Passes query these interfaces instead of
// switching over op kinds.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_INTERFACES_TESSERAINTERFACES_TD
#define TESSERA_INTERFACES_TESSERAINTERFACES_TD

include "mlir/IR/OpBase.td"

def Tessera_NonDifferentiable : NativeOpTrait<"NonDifferentiable"> {
  let cppNamespace = "::tessera";
}

def Tessera_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::tessera";
  let description = [{
    An op that knows its vector-Jacobian product. Given the adjoints of its
    results (null where a result's adjoint is zero) it builds, at the
    builder's insertion point, the adjoints of the operands for which
    `needed[i]` is true and stores them in `operandAdjoints[i]` (null for
    operands without a gradient, e.g. integer labels). Ops reached by the
    reverse sweep after their results' adjoints are known.
  }];
  let methods = [
    InterfaceMethod<"Builds the adjoints of the operands.",
      "::llvm::LogicalResult", "buildAdjoint",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultAdjoints,
           "::llvm::ArrayRef<bool>":$needed,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandAdjoints)>
  ];
}

def Tessera_TPSplitOpInterface : OpInterface<"TPSplitOpInterface"> {
  let cppNamespace = "::tessera";
  let description = [{
    How an op splits along the tensor-parallel axis (Megatron's
    ColumnParallelLinear, RowParallelLinear and VocabParallelEmbedding in
    megatron/core/tensor_parallel/layers.py). An op may support several split
    kinds (`TPSplitKind`): for each kind it declares which dimension of each
    operand and of its result is sharded (-1: replicated), and whether the
    result is a partial sum that needs a reduce-from-region. Elementwise ops
    propagate a sharded dimension from their operands to their result
    (`propagateShardedDim`).
  }];
  let methods = [
    InterfaceMethod<[{
        Fills `operandDims` with the sharded dim of each operand under split
        kind `kind` and returns the result's sharded dim (-1: replicated);
        sets `partialResult` when the result holds partial sums. Fails if the
        op does not support the kind.
      }],
      "::llvm::FailureOr<int64_t>", "getSplitDims",
      (ins "::tessera::TPSplitKind":$kind,
           "::llvm::SmallVectorImpl<int64_t> &":$operandDims,
           "bool &":$partialResult)>,
    InterfaceMethod<[{
        For an op applied to an operand sharded along `dim`, returns the
        dimension of the result that is then sharded, or failure when the op
        cannot run on the shard locally.
      }],
      "::llvm::FailureOr<int64_t>", "propagateShardedDim",
      (ins "unsigned":$operandIndex, "int64_t":$dim),
      /*methodBody=*/"", /*defaultImplementation=*/[{
        return ::mlir::failure();
      }]>,
    InterfaceMethod<[{
        Checks, without changing anything, that the op can run on one of
        `parts` shards of dimension `dim`; emits an error on the op if not.
      }],
      "::llvm::LogicalResult", "checkShard",
      (ins "int64_t":$dim, "int64_t":$parts),
      /*methodBody=*/"", /*defaultImplementation=*/[{
        return ::mlir::success();
      }]>,
    InterfaceMethod<[{
        Called when the op is rewritten to run on one of `parts` shards of
        dimension `dim` (of its operands for propagating ops): updates
        attributes that count sharded things (attention heads) and fails,
        with an error on the op, when they do not divide.
      }],
      "::llvm::LogicalResult", "adjustForShard",
      (ins "int64_t":$dim, "int64_t":$parts),
      /*methodBody=*/"", /*defaultImplementation=*/[{
        return ::mlir::success();
      }]>
  ];
}

def Tessera_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::tessera";
  let description = [{
    The cost of an op on its (local, static) shapes: floating-point
    operations and bytes moved (operands read plus results written). The
    compiler sums it into the per-rank FLOPs of a training step, which the
    runtime turns into TFLOP/s. Elementwise ops count one FLOP per result
    element unless they say otherwise.
  }];
  let methods = [
    InterfaceMethod<"Floating-point operations of one execution.",
      "int64_t", "getFlops", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        int64_t flops = 0;
        for (::mlir::Type t : $_op->getResultTypes())
          if (auto s = ::llvm::dyn_cast<::mlir::ShapedType>(t))
            if (s.hasStaticShape())
              flops += s.getNumElements();
        return flops;
      }]>,
    InterfaceMethod<"Bytes read from operands plus bytes written to results.",
      "int64_t", "getBytes", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        int64_t bytes = 0;
        auto add = [&](::mlir::Type t) {
          if (auto s = ::llvm::dyn_cast<::mlir::ShapedType>(t))
            if (s.hasStaticShape())
              bytes += s.getNumElements() *
                       (s.getElementType().getIntOrFloatBitWidth() / 8);
        };
        for (::mlir::Type t : $_op->getOperandTypes())
          add(t);
        for (::mlir::Type t : $_op->getResultTypes())
          add(t);
        return bytes;
      }]>
  ];
}

#endif // TESSERA_INTERFACES_TESSERAINTERFACES_TD
