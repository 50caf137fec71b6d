//===- Matchers.h - Reading onnx IR in the raising patterns -------*- C++ -*-===//
//
// Small queries the patterns of tessera-onnx-to-nn share: the node that
// produces a value (by ONNX op type), known constant values, and the
// "parameter view" that stands for a model parameter until the pass gives
// it a function argument.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_LIB_CONVERSION_ONNXTONN_MATCHERS_H
#define TESSERA_LIB_CONVERSION_ONNXTONN_MATCHERS_H

#include "dialects/onnx/IR/OnnxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/PatternMatch.h"

#include <optional>
#include <vector>

namespace tessera::onnx_to_nn {

/// The onnx.node of `opType` producing `v`, or null.
inline onnx::NodeOp producer(mlir::Value v, llvm::StringRef opType) {
  auto n = v ? v.getDefiningOp<onnx::NodeOp>() : nullptr;
  if (!n || n.getOpType() != opType || !n.getDomain().empty())
    return nullptr;
  return n;
}

/// The elements of a known value as doubles (any element type), or none.
std::optional<llvm::SmallVector<double>> constValues(mlir::Value v);
/// An initializer's f32 values: inline (a dense or resource value) or read
/// from its external-data file; an error at the initializer otherwise.
mlir::FailureOr<std::vector<float>> readInitializer(onnx::InitializerOp init);
/// Element `index` (row major) of an f32 initializer, inline or read alone
/// from its external data; none when it cannot be read.
std::optional<float> initializerElement(onnx::InitializerOp init, int64_t index);
/// A known single-element value.
std::optional<double> scalarValue(mlir::Value v);
/// Whether `v` is a known scalar within `rtol` of `expect`.
bool isScalar(mlir::Value v, double expect, double rtol = 1e-6);
/// The integer values of a known value.
std::optional<llvm::SmallVector<int64_t>> intValues(mlir::Value v);

/// The shape of a ranked tensor value (empty for others).
llvm::ArrayRef<int64_t> shapeOf(mlir::Value v);

/// The module path of the node (onnx.scope), or "".
llvm::StringRef scopeOf(mlir::Operation *op);
/// The decoder layer of a scope or a name ("m.model.layers.3.mlp",
/// "/h.3/attn"), or -1.
int64_t layerIndexOf(llvm::StringRef name);

/// Kinds of parameter views (onnx.node "TesseraParam"): how the parameter's
/// value comes from its source initializers.
/// - "identity": the initializer as it is;
/// - "transpose": a [in, out] initializer stored [out, in];
/// - "qkv": q, k, v projections (each [in, out], or [out, in] with
///   `transposed`) fused into Megatron's per-group linear_qkv rows, with
///   `num_heads`, `num_query_groups`, `head_dim`;
/// - "stack": gate and up projections stacked into [2, F, H].
inline constexpr llvm::StringLiteral kParamView = "TesseraParam";

/// A parameter view of `sources` named `name`, of `type`.
mlir::Value createParamView(mlir::OpBuilder &b, mlir::Location loc,
                            mlir::Type type, llvm::StringRef name,
                            llvm::StringRef kind, mlir::ValueRange sources,
                            llvm::ArrayRef<mlir::NamedAttribute> extra = {});

/// Swaps dims 0 and 1 (batch-major <-> sequence-major) of `v`.
mlir::Value swapBatchSeq(mlir::OpBuilder &b, mlir::Location loc, mlir::Value v);
/// Whether `op` is such a swap.
bool isBatchSeqSwap(mlir::Operation *op);

/// A weight `w` of a MatMul(x, w): an initializer stored [in, out], or a
/// Transpose of one stored [out, in] (a TorchScript export). Returns the
/// initializer and whether it is stored [in, out].
struct WeightRef {
  onnx::InitializerOp init;
  bool inOut = false;
};
std::optional<WeightRef> matmulWeight(mlir::Value w);

} // namespace tessera::onnx_to_nn

#endif // TESSERA_LIB_CONVERSION_ONNXTONN_MATCHERS_H
