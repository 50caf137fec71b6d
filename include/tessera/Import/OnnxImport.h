//===- OnnxImport.h - ONNX model -> nn dialect ---------------------*- C++ -*-===//
//
// Imports a PyTorch ONNX export (torch.onnx.export, TorchScript or dynamo)
// as an nn function: the graph node for node in the onnx dialect, folded,
// then raised by rewrite patterns to the nn ops tessera-gen emits (embeddings,
// linear layers, LayerNorm and RMSNorm, GELU, ReLU and SwiGLU, causal
// self-attention with RoPE, GQA and QK-norm, dropout, the loss), in
// Tessera's sequence-major layout, with the layer marks (nn.layer) the
// pipeline split needs. Parameters are named after their initializers or
// the PyTorch modules that read them, initialised from their data
// (nn.init = "data"; the values are the root module's tessera.weights).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_IMPORT_ONNXIMPORT_H
#define TESSERA_IMPORT_ONNXIMPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>

namespace tessera {

struct OnnxImportOptions {
  /// Read the initializers' values (nn.init = "data"). Without, the
  /// parameters keep Tessera's default initialisation (--no-weights: for
  /// reading the IR, or training from scratch).
  bool loadWeights = true;
  /// For a model that returns logits: "" (an error) or "cross-entropy"
  /// (adds a labels input and the mean token cross-entropy).
  std::string loss;
};

/// True when `path` names an ONNX model (by its extension).
bool isOnnxFile(llvm::StringRef path);

/// Imports the ONNX model at `path`. Errors are emitted on the context (each
/// names the ONNX node, its op type and what was expected); returns null
/// after an error.
mlir::OwningOpRef<mlir::ModuleOp>
importOnnxModel(mlir::MLIRContext *context, llvm::StringRef path,
                const OnnxImportOptions &options = {});

} // namespace tessera

#endif // TESSERA_IMPORT_ONNXIMPORT_H
