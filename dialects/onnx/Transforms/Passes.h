//===- Passes.h - onnx-level passes -------------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_H
#define TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_H

#include "dialects/onnx/IR/OnnxOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace tessera::onnx {

#define GEN_PASS_DECL
#include "dialects/onnx/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/onnx/Transforms/Passes.h.inc"

} // namespace tessera::onnx

#endif // TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_H
