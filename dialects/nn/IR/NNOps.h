//===- NNOps.h - nn dialect ---------------------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_NN_IR_NNOPS_H
#define TESSERA_DIALECTS_NN_IR_NNOPS_H

#include "dialects/tessera/IR/TesseraDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "tessera/Interfaces/TesseraInterfaces.h"

#include "dialects/nn/IR/NNEnums.h.inc"
#include "dialects/nn/IR/NNOpsDialect.h.inc"

#define GET_OP_CLASSES
#include "dialects/nn/IR/NNOps.h.inc"

namespace tessera::nn {
/// A GEMM's two operands `a` and `b` (nn.linear, nn.matmul,
/// nn.grouped_linear): both f32, or both bf16 (a bf16 x bf16 product
/// accumulated in f32, as cuBLASLt and Megatron compute it). Emits the
/// error on `op` otherwise.
mlir::LogicalResult verifyGemmOperands(mlir::Operation *op, mlir::Type a,
                                       mlir::Type b);
/// `v` with elements of type `element`: `v` itself when they already are,
/// else an nn.cast of it (mixed precision's one conversion).
/// The backward's seed `value` (1 / the number of microbatches) for a loss
/// of type `type`: under fp16 (the module's parameters f16) an
/// nn.loss_seed, which the runtime multiplies by the loss scale (Megatron's
/// scale_loss, and MoEAuxLossAutoScaler's scale for auxiliary losses),
/// otherwise an nn.fill. `anchor` is any op of the module.
mlir::Value createLossSeed(mlir::OpBuilder &b, mlir::Location loc,
                           mlir::Type type, float value,
                           mlir::Operation *anchor);

mlir::Value castElements(mlir::OpBuilder &b, mlir::Location loc, mlir::Value v,
                         mlir::Type element);
/// nn.linear's out-features for `weight`: `out` of `[out, in]`, `k * out` of
/// a stacked `[k, out, in]` (dynamic if any leading dim is).
int64_t linearOutFeatures(mlir::RankedTensorType weight);
/// nn.grouped_linear's out-features for `weight`: `out` of `[experts, out,
/// in]`, `k * out` of a stacked `[experts, k, out, in]` (SwiGLU experts).
int64_t groupedOutFeatures(mlir::RankedTensorType weight);
} // namespace tessera::nn

#endif // TESSERA_DIALECTS_NN_IR_NNOPS_H
