//===- OnnxImportFuzzer.cpp - Fuzz the ONNX importer ----------------------===//
//
// libFuzzer target `onnx_import` (built when TESSERA_BUILD_COMPILER and
// TESSERA_BUILD_FUZZERS are on): the input is an ONNX model file, imported
// with weights as tessera-translate --import-onnx does (protobuf parse, onnx
// checker, shape inference, the patterns), and a module that imports is
// verified. Diagnostics are swallowed: an error is a fine outcome, a crash,
// sanitizer report or hang is not. Seeds: the committed fixtures
// (test/Import/Inputs/onnx), written by fuzz/make-seeds.sh.
// Run: scripts/fuzz.sh onnx_import SECONDS.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxImport.h"
#include "MlirRegistry.h"
#include "tessera/InitAll.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <cstdio>
#include <string>
#include <unistd.h>

namespace {

/// The importer reads a path (external data lies next to the model): one
/// file per fuzzing process, rewritten for each input.
const std::string &modelPath() {
  static const std::string path =
      "/tmp/tessera-fuzz-onnx-" + std::to_string(::getpid()) + ".onnx";
  return path;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  {
    FILE *f = std::fopen(modelPath().c_str(), "wb");
    if (!f)
      return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  mlir::MLIRContext context(tessera::fuzz::registry(),
                            mlir::MLIRContext::Threading::DISABLED);
  mlir::ScopedDiagnosticHandler quiet(
      &context, [](mlir::Diagnostic &) { return mlir::success(); });
  for (const char *loss : {"", "cross-entropy"}) {
    tessera::OnnxImportOptions options;
    options.loss = loss;
    mlir::OwningOpRef<mlir::ModuleOp> module =
        tessera::importOnnxModel(&context, modelPath(), options);
    if (module)
      (void)mlir::verify(*module);
  }
  return 0;
}
