//===- OnnxImportFuzzer.cpp - Fuzz the ONNX importer ----------------------===//
//
// libFuzzer target `onnx_import` (built when TESSERA_BUILD_COMPILER and
// TESSERA_BUILD_FUZZERS are on): the input is an ONNX model file, imported
// with weights as tessera-translate --import-onnx does (protobuf parse, onnx
// checker, shape inference, the patterns), and a module that imports is
// verified. Diagnostics are swallowed: an error is a fine outcome, a crash,
// sanitizer report or hang is not; nor is a module whose external data
// lies outside the model's directory (the importer must refuse such a
// location), which aborts. The model is written into a directory that
// holds an external-data file of the fixtures' name (gpt-ext.onnx.data),
// beside a file outside it and a symbolic link to that file and one to
// the parent directory, so that mutated locations reach the checks for
// '..', absolute paths and links. Seeds: the committed fixtures
// (test/Import/Inputs/onnx, gpt-ext.onnx among them), written by
// fuzz/make-seeds.sh.
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

#include "tessera/Support/Model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

/// One directory per fuzzing process: root/model/ holds the model (rewritten
/// for each input) and gpt-ext.onnx.data; root/outside.data must never be
/// read, though model/link.data and model/up/ lead to it.
const fs::path &modelDir() {
  static const fs::path dir = [] {
    fs::path root = fs::temp_directory_path() /
                    ("tessera-fuzz-onnx-" + std::to_string(::getpid()));
    fs::path model = root / "model";
    fs::create_directories(model);
    std::string bytes(1 << 18, '\0');
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = char(i * 31 + 7);
    std::ofstream(model / "gpt-ext.onnx.data", std::ios::binary) << bytes;
    std::ofstream(root / "outside.data", std::ios::binary) << bytes;
    std::error_code ec;
    fs::create_symlink(root / "outside.data", model / "link.data", ec);
    fs::create_directory_symlink(root, model / "up", ec);
    return fs::canonical(model);
  }();
  return dir;
}

const std::string &modelPath() {
  static const std::string path = (modelDir() / "fuzz.onnx").string();
  return path;
}

/// Every external-data weight of `module` names the model's directory and a
/// file inside it, else the importer let a location out: abort (a finding).
void checkExternalData(mlir::ModuleOp module) {
  auto weights = module->getAttrOfType<mlir::DictionaryAttr>(
      tessera::kWeightsAttr);
  if (!weights)
    return;
  for (mlir::NamedAttribute entry : weights) {
    auto file = llvm::dyn_cast<mlir::DictionaryAttr>(entry.getValue());
    if (!file)
      continue;
    auto dir = file.getAs<mlir::StringAttr>("dir");
    auto name = file.getAs<mlir::StringAttr>("file");
    if (!dir || !name || dir.str() != modelDir().string())
      std::abort();
    fs::path real = fs::weakly_canonical(modelDir() / name.str());
    auto [d, r] = std::mismatch(modelDir().begin(), modelDir().end(),
                                real.begin(), real.end());
    if (d != modelDir().end())
      std::abort();
  }
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
    if (module) {
      (void)mlir::verify(*module);
      checkExternalData(*module);
    }
  }
  return 0;
}
