//===- RTOps.h - rt dialect ---------------------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_RT_IR_RTOPS_H
#define TESSERA_DIALECTS_RT_IR_RTOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"

#include "dialects/rt/IR/RTOpsDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/rt/IR/RTOpsTypes.h.inc"

#define GET_OP_CLASSES
#include "dialects/rt/IR/RTOps.h.inc"

#endif // TESSERA_DIALECTS_RT_IR_RTOPS_H
