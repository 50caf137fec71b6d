//===- OnnxGraph.h - ONNX model -> onnx dialect, node for node ----*- C++ -*-===//
//
// The first step of the ONNX frontend: the model's graph as MLIR, one
// onnx.node per ONNX node, with the graph inputs as the function's
// arguments, the initializers as onnx.initializer ops (named, their inline
// bytes held once as dense resources, external data referenced) and every
// value typed (the model's value infos and ONNX shape inference, else the
// onnx dialect's type rules). Nothing is recognised or dropped here; an
// operator of any opset imports. tessera-onnx-simplify then folds shape
// arithmetic and constants.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_IMPORT_ONNXGRAPH_H
#define TESSERA_IMPORT_ONNXGRAPH_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace tessera {

namespace onnx_model {
struct Model;
}

struct OnnxGraphOptions {
  /// Keep the values of float initializers of more than 1,024 elements out
  /// of the module (types and names only), for reading the IR. Smaller
  /// ones (scalars, small tables) and integer and bool initializers (shapes,
  /// indices, masks) keep their values, which folding needs.
  bool noWeights = false;
  /// A graph input's dynamic first dimension (a dynamic-axes export's
  /// batch) becomes this size when positive, so its shape arithmetic folds;
  /// the nn model makes the batch dynamic again.
  int64_t fixedBatch = 0;
};

/// Imports the ONNX model at `path` node for node. Errors are emitted on
/// the context (naming the node and the value); returns null after one.
mlir::OwningOpRef<mlir::ModuleOp>
importOnnxGraph(mlir::MLIRContext *context, llvm::StringRef path,
                const OnnxGraphOptions &options = {});
/// The same for a model already read (its inline bytes move into the
/// module).
mlir::OwningOpRef<mlir::ModuleOp>
importOnnxGraph(mlir::MLIRContext *context, onnx_model::Model &model,
                const OnnxGraphOptions &options = {});

} // namespace tessera

#endif // TESSERA_IMPORT_ONNXGRAPH_H
