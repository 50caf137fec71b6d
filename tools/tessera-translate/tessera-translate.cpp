//===- tessera-translate.cpp - Import models into the nn dialect ----------===//
//
// The translate tool of the design: `tessera-translate --import-onnx
// model.onnx [--no-weights] [--loss cross-entropy] -o model.mlir` prints the
// nn-level IR of a PyTorch ONNX export (lib/Import), and
// `--import-onnx-graph` the export node for node as onnx dialect IR. It is
// mlir-translate with Tessera's translations, so -verify-diagnostics and the
// usual output options work too.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxGraph.h"
#include "tessera/Import/OnnxImport.h"
#include "tessera/InitAll.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;

static llvm::cl::opt<bool>
    noWeights("no-weights",
              llvm::cl::desc("--import-onnx: leave the initializers' values "
                             "out; the parameters get Tessera's default "
                             "initialisation"),
              llvm::cl::init(false));
static llvm::cl::opt<std::string>
    loss("loss",
         llvm::cl::desc("--import-onnx, for a model that returns logits: "
                        "add the loss (cross-entropy: the mean token "
                        "cross-entropy over a labels input)"),
         llvm::cl::init(""));

/// The model's path; stdin is refused (external data lies next to the
/// model, so the importer needs its directory).
static std::optional<llvm::StringRef> modelPath(llvm::SourceMgr &sourceMgr,
                                                MLIRContext *context,
                                                llvm::StringRef flag) {
  llvm::StringRef path =
      sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())->getBufferIdentifier();
  if (path == "<stdin>" || path == "-") {
    emitError(UnknownLoc::get(context))
        << "--" << flag << " reads the model from a file (external data "
        << "lies next to it): give its path";
    return std::nullopt;
  }
  return path;
}

int main(int argc, char **argv) {
  TranslateToMLIRRegistration importOnnx(
      "import-onnx", "import an ONNX model (torch.onnx.export) as nn IR",
      [](llvm::SourceMgr &sourceMgr, MLIRContext *context) -> OwningOpRef<Operation *> {
        std::optional<llvm::StringRef> path = modelPath(sourceMgr, context, "import-onnx");
        if (!path)
          return nullptr;
        if (!loss.empty() && loss != "cross-entropy") {
          emitError(UnknownLoc::get(context))
              << "--loss must be 'cross-entropy', got '" << loss << "'";
          return nullptr;
        }
        tessera::OnnxImportOptions options;
        options.loadWeights = !noWeights;
        options.loss = loss;
        return tessera::importOnnxModel(context, *path, options);
      },
      [](DialectRegistry &registry) { tessera::registerAllDialects(registry); });
  TranslateToMLIRRegistration importOnnxGraph(
      "import-onnx-graph",
      "import an ONNX model node for node as onnx dialect IR",
      [](llvm::SourceMgr &sourceMgr, MLIRContext *context) -> OwningOpRef<Operation *> {
        std::optional<llvm::StringRef> path =
            modelPath(sourceMgr, context, "import-onnx-graph");
        if (!path)
          return nullptr;
        tessera::OnnxGraphOptions options;
        options.noWeights = noWeights;
        return tessera::importOnnxGraph(context, *path, options);
      },
      [](DialectRegistry &registry) { tessera::registerAllDialects(registry); });
  return failed(mlirTranslateMain(argc, argv, "Tessera translate tool"));
}
