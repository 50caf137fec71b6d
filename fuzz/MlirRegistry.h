//===- MlirRegistry.h - The compiler fuzzers' dialect registry ---*- C++ -*-===//
//
// Every Tessera dialect, registered once per process: the contexts the
// mlir_pipeline and onnx_import targets create for each input share it.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_FUZZ_MLIRREGISTRY_H
#define TESSERA_FUZZ_MLIRREGISTRY_H

#include "tessera/InitAll.h"

#include "mlir/IR/DialectRegistry.h"

namespace tessera::fuzz {
inline const mlir::DialectRegistry &registry() {
  static const mlir::DialectRegistry r = [] {
    mlir::DialectRegistry reg;
    tessera::registerAllDialects(reg);
    return reg;
  }();
  return r;
}
} // namespace tessera::fuzz

#endif // TESSERA_FUZZ_MLIRREGISTRY_H
