//===- OnnxOps.h - onnx dialect -----------------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_ONNX_IR_ONNXOPS_H
#define TESSERA_DIALECTS_ONNX_IR_ONNXOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/onnx/IR/OnnxOpsDialect.h.inc"

#define GET_OP_CLASSES
#include "dialects/onnx/IR/OnnxOps.h.inc"

namespace tessera::onnx {
/// The argument attribute naming a graph input or output.
inline constexpr llvm::StringLiteral kNameAttr = "onnx.name";
/// A node's PyTorch module path ("m.layers.0.self_attn.q_proj"), when the
/// exporter recorded it.
inline constexpr llvm::StringLiteral kScopeAttr = "onnx.scope";
/// The module attribute holding the model's opsets ({domain: version},
/// "ai.onnx" the standard domain).
inline constexpr llvm::StringLiteral kOpsetsAttr = "onnx.opsets";
/// The standard-domain opset recorded on the module of `op`, or 0.
int64_t getOpset(mlir::Operation *op);

/// The value of `v` when it is known at compile time: an onnx.constant, or
/// an onnx.initializer with inline data. Null otherwise.
mlir::ElementsAttr getConstantValue(mlir::Value v);
} // namespace tessera::onnx

#endif // TESSERA_DIALECTS_ONNX_IR_ONNXOPS_H
