//===- OnnxImport.cpp - ONNX model -> nn dialect --------------------------===//
//
// The ONNX frontend's driver: the model node for node in the onnx dialect
// (OnnxGraph.cpp), its constants and shape arithmetic folded
// (tessera-onnx-simplify, then CSE), raised to the nn model by rewrite
// patterns (tessera-onnx-to-nn, lib/Conversion/OnnxToNN).
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxImport.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/Import/OnnxGraph.h"
#include "tessera/Import/OnnxModel.h"
#include "tessera/Support/Model.h"

#include "dialects/nn/IR/NNOps.h"
#include "dialects/onnx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace mlir;
namespace nn = tessera::nn;
namespace onnx = tessera::onnx;
namespace onnx_model = tessera::onnx_model;

bool tessera::isOnnxFile(llvm::StringRef path) {
  return llvm::sys::path::extension(path).equals_insensitive(".onnx");
}

OwningOpRef<ModuleOp> tessera::importOnnxModel(MLIRContext *context,
                                               llvm::StringRef path,
                                               const OnnxImportOptions &options) {
  context->loadDialect<nn::NNDialect, func::FuncDialect>();
  onnx_model::Model model;
  // The weights are read even without loadWeights: folding reads buffers
  // (masks, rotary tables); loadWeights decides the parameters' init.
  std::string error = onnx_model::loadModel(path.str(), /*loadWeights=*/true, model);
  if (!error.empty()) {
    emitError(FileLineColLoc::get(context, path, 0, 0)) << error;
    return nullptr;
  }
  OnnxGraphOptions graph;
  graph.fixedBatch = 2;
  OwningOpRef<ModuleOp> module = importOnnxGraph(context, model, graph);
  if (!module)
    return nullptr;
  // Errors name the ONNX node; the op's printed form would repeat it.
  bool printOp = context->shouldPrintOpOnDiagnostic();
  context->printOpOnDiagnostic(false);
  llvm::scope_exit restore([&] { context->printOpOnDiagnostic(printOp); });
  PassManager pm(context);
  pm.addPass(onnx::createOnnxSimplifyPass());
  pm.addPass(createCSEPass());
  OnnxToNNPassOptions raise;
  raise.loss = options.loss;
  raise.loadWeights = options.loadWeights;
  pm.addPass(createOnnxToNNPass(raise));
  if (failed(pm.run(*module)))
    return nullptr;
  (*module)->removeAttr(onnx::kOpsetsAttr);
  // The export record names the model file (tessera-export --format onnx
  // writes it again with the trained initializers).
  if (auto record = (*module)->getAttrOfType<DictionaryAttr>(tessera::kOnnxSourceAttr)) {
    SmallString<256> real;
    if (llvm::sys::fs::real_path(path, real)) {
      real = path;
      llvm::sys::fs::make_absolute(real);
    }
    NamedAttrList attrs(record);
    attrs.set("model", StringAttr::get(context, real));
    (*module)->setAttr(tessera::kOnnxSourceAttr, attrs.getDictionary(context));
  }
  return module;
}
