//===- DistOps.h - dist dialect -----------------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_DIST_IR_DISTOPS_H
#define TESSERA_DIALECTS_DIST_IR_DISTOPS_H

#include "dialects/tessera/IR/TesseraDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "tessera/Buckets/GradBuckets.h"
#include "tessera/Interfaces/TesseraInterfaces.h"
#include "tessera/Mesh/RankGroups.h"

#include "dialects/dist/IR/DistEnums.h.inc"
#include "dialects/dist/IR/DistOpsDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/dist/IR/DistOpsTypes.h.inc"

#define GET_OP_CLASSES
#include "dialects/dist/IR/DistOps.h.inc"

namespace tessera::dist {
/// The name of the mesh symbol that passes create and look up.
constexpr llvm::StringLiteral kMeshName = "mesh";
/// Returns the module's `dist.mesh` op, or null.
MeshOp lookupMesh(mlir::Operation *from);
} // namespace tessera::dist

#endif // TESSERA_DIALECTS_DIST_IR_DISTOPS_H
