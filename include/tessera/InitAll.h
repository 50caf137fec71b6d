//===- InitAll.h - Register every Tessera dialect and pass --------*- C++ -*-===//

#ifndef TESSERA_INITALL_H
#define TESSERA_INITALL_H

#include "mlir/IR/DialectRegistry.h"

namespace tessera {
/// Registers tessera, nn, dist, rt and the upstream dialects Tessera modules
/// use.
void registerAllDialects(mlir::DialectRegistry &registry);
/// Registers every Tessera pass and the `tessera-train-pipeline` pipeline.
void registerAllPasses();
} // namespace tessera

#endif // TESSERA_INITALL_H
