//===- RTOps.h - rt dialect -------------------------------------*- C++ -*-===//
//
// The rt dialect: arena buffers and the instruction ops, each of which names
// its artifact opcode and is verified against that opcode's row of the
// instruction contract (tessera/rt/Opcodes.def) through
// InstructionOpInterface.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_RT_IR_RTOPS_H
#define TESSERA_DIALECTS_RT_IR_RTOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SmallVector.h"

#include "tessera/rt/Opcodes.h"

#include "dialects/rt/IR/RTEnums.h.inc"

namespace tessera::rt {

/// An instruction's attributes as the artifact stores them (its operands
/// are the op's memref operands, its event the op's !rt.event value or
/// `event`).
struct InstrAttrs {
  bool transA = false, transB = false;
  float alpha = 1.0f, beta = 0.0f;
  llvm::SmallVector<float, 5> fattrs;
  llvm::SmallVector<int64_t, 2> iattrs;
  /// The rank-group kind of a collective, a sharded kernel or a p2p op.
  llvm::StringRef group;
  artifact::ReduceOp reduce = artifact::ReduceOp::Sum;
  /// A program-wide event id (the parameter syncs of overlap_param_gather,
  /// which outlive their function); -1: the op's !rt.event value, if any.
  int64_t event = -1;
};

/// The generic kernel form's attributes: alpha, beta, `value` as the one
/// float attribute, `iattrs`, `group`.
template <typename KernelOp> InstrAttrs kernelInstrAttrs(KernelOp op) {
  InstrAttrs attrs;
  attrs.alpha = op.getAlpha().convertToFloat();
  attrs.beta = op.getBeta().convertToFloat();
  if (auto value = op.getValueAttr())
    attrs.fattrs.push_back(float(value.getValueAsDouble()));
  if (auto iattrs = op.getIattrsAttr())
    attrs.iattrs.assign(iattrs.asArrayRef().begin(), iattrs.asArrayRef().end());
  if (auto group = op.getGroupAttr())
    attrs.group = group.getValue();
  return attrs;
}

/// Checks an instruction op against its opcode's row of Opcodes.def: the
/// number of buffers and their element types, the attribute counts and
/// what its group may hold.
llvm::LogicalResult verifyInstruction(mlir::Operation *op);

} // namespace tessera::rt

#include "dialects/rt/IR/RTOpsDialect.h.inc"
#include "dialects/rt/IR/RTOpsInterfaces.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/rt/IR/RTOpsTypes.h.inc"

#define GET_OP_CLASSES
#include "dialects/rt/IR/RTOps.h.inc"

#endif // TESSERA_DIALECTS_RT_IR_RTOPS_H
