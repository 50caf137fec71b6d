//===- Passes.h - Lowering and serialisation passes ---------------*- C++ -*-===//

#ifndef TESSERA_CONVERSION_PASSES_H
#define TESSERA_CONVERSION_PASSES_H

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/IR/NNOps.h"
#include "dialects/rt/IR/RTOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "llvm/Support/raw_ostream.h"

namespace tessera {

#define GEN_PASS_DECL
#include "tessera/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "tessera/Conversion/Passes.h.inc"

/// Writes an rt-level module as a .tsr artifact (header and FlatBuffer).
mlir::LogicalResult writeArtifact(mlir::ModuleOp module, llvm::raw_ostream &os);

} // namespace tessera

#endif // TESSERA_CONVERSION_PASSES_H
