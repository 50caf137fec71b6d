//===- Patterns.h - tessera-onnx-to-nn's rewrite patterns ---------*- C++ -*-===//

#ifndef TESSERA_LIB_CONVERSION_ONNXTONN_PATTERNS_H
#define TESSERA_LIB_CONVERSION_ONNXTONN_PATTERNS_H

#include "mlir/IR/PatternMatch.h"

namespace tessera::onnx_to_nn {
/// The patterns of `phase` (0: norms; 1: attention and embeddings; 2:
/// per-token layers, the loss and the layout), applied in that order.
void populateOnnxToNNPatterns(int phase, mlir::RewritePatternSet &patterns);
inline constexpr int kNumPhases = 3;
/// Records on every initializer of `root` its uses, whether it is a tied
/// embedding table, and the nodes that read it (name and module scope),
/// before any pattern runs (the parameters' names and the export record
/// read them).
void recordUses(mlir::Operation *root);
inline constexpr llvm::StringLiteral kUsesAttr = "onnx.uses";
inline constexpr llvm::StringLiteral kTiedAttr = "onnx.tied";
/// [[node name, scope], ...]
inline constexpr llvm::StringLiteral kReadersAttr = "onnx.readers";
} // namespace tessera::onnx_to_nn

#endif // TESSERA_LIB_CONVERSION_ONNXTONN_PATTERNS_H
