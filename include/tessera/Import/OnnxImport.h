//===- OnnxImport.h - ONNX model -> nn dialect ---------------------*- C++ -*-===//
//
// Imports a PyTorch ONNX export (torch.onnx.export, opset >= 17) as an nn
// function: the decomposed ONNX patterns become nn.linear, nn.gelu,
// nn.attention, nn.embedding + nn.add_position_embedding, nn.layer_norm and
// the token loss, in Tessera's sequence-major layout, with the layer marks
// (nn.layer) the pipeline split needs. Initializers become the parameters,
// named as in the ONNX file (so checkpoints map back to the PyTorch state
// dict), initialised from their data (nn.init = "data"; the values are the
// root module's tessera.weights).
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

namespace onnx_model {
struct Model;
}
/// Whether the pattern matcher of OnnxImport.cpp imports `model` (opset 17
/// within the onnx library's knowledge, every op type one it knows);
/// otherwise importOnnxModel raises the graph with tessera-onnx-to-nn.
bool onnxMatcherHandles(const onnx_model::Model &model);

/// Imports the ONNX model at `path`. Errors are emitted on the context (each
/// names the ONNX node, its op type and what was expected); returns null
/// after an error.
mlir::OwningOpRef<mlir::ModuleOp>
importOnnxModel(mlir::MLIRContext *context, llvm::StringRef path,
                const OnnxImportOptions &options = {});

} // namespace tessera

#endif // TESSERA_IMPORT_ONNXIMPORT_H
