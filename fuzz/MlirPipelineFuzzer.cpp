//===- MlirPipelineFuzzer.cpp - Fuzz the compiler's parse/verify/pipeline -===//
//
// libFuzzer target `mlir_pipeline` (built when TESSERA_BUILD_COMPILER and
// TESSERA_BUILD_FUZZERS are on): the input is MLIR text, parsed with every
// Tessera dialect registered and verified; a module that verifies is run
// through tessera-train-pipeline (attach-mesh ... lower-to-rt) with the
// default options and micro-batch-size 2. Diagnostics are swallowed: an
// error is a fine outcome, a crash, sanitizer report or hang is not.
// Seeds: the lit inputs (test/**/*.mlir split at `// -----`, and
// examples/mlp.mlir), written by fuzz/make-seeds.sh.
// Run: scripts/fuzz.sh mlir_pipeline SECONDS.
//
//===----------------------------------------------------------------------===//

#include "MlirRegistry.h"
#include "tessera/InitAll.h"
#include "tessera/Pipeline/Pipeline.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <cstdlib>
#include <string>


extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::MLIRContext context(tessera::fuzz::registry(),
                            mlir::MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler quiet(
      &context, [](mlir::Diagnostic &) { return mlir::success(); });
  // MLIR's lexer reads up to a terminating NUL, which libFuzzer's input
  // lacks (reading past it is the harness's overflow, not the parser's).
  std::string text(reinterpret_cast<const char *>(data), size);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, &context);
  if (!module || mlir::failed(mlir::verify(*module)))
    return 0;
  tessera::TrainPipelineOptions options;
  options.microBatchSize = 2;
  if (!tessera::checkTrainPipelineOptions(options).empty())
    std::abort();
  mlir::PassManager pm(&context);
  tessera::buildTrainPipeline(pm, options);
  (void)pm.run(*module);
  return 0;
}
