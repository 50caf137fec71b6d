//===- Model.h - Conventions of a Tessera training module ---------*- C++ -*-===//
//
// Attribute names and helpers shared by the passes: how a model function
// marks parameters and inputs, how phase functions bind their arguments and
// results to persistent buffers, and type re-inference after a shape change.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_SUPPORT_MODEL_H
#define TESSERA_SUPPORT_MODEL_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace tessera {

// Model function argument attributes.
constexpr llvm::StringLiteral kParamAttr = "nn.param";   // parameter name
constexpr llvm::StringLiteral kInitAttr = "nn.init";     // "normal:<std>", "zeros", "ones"
constexpr llvm::StringLiteral kInputAttr = "nn.input";   // "features", "labels", "tokens"
constexpr llvm::StringLiteral kBatchDimAttr = "nn.batch_dim"; // default 0
constexpr llvm::StringLiteral kShardingAttr = "dist.sharding"; // {axis, dim}

// Phase functions and their bindings.
constexpr llvm::StringLiteral kPhaseAttr = "tessera.phase"; // "microbatch", "step"
constexpr llvm::StringLiteral kBufferAttr = "tessera.buffer";
constexpr llvm::StringLiteral kGradOfAttr = "tessera.grad_of";
constexpr llvm::StringLiteral kBatchAttr = "tessera.batch";
constexpr llvm::StringLiteral kOptimizerAttr = "tessera.optimizer";
constexpr llvm::StringLiteral kMicrobatchPhase = "microbatch";
constexpr llvm::StringLiteral kStepPhase = "step";

/// The model function: the one func.func without a phase, or the
/// microbatch phase once autodiff ran. Emits an error and returns null when
/// there is none or more than one.
mlir::func::FuncOp getModelFunc(mlir::ModuleOp module);

/// The function of the given phase, or null.
mlir::func::FuncOp getPhaseFunc(mlir::ModuleOp module, llvm::StringRef phase);

/// Recomputes the result types of `op` from its operands (InferTypeOpInterface
/// or SameOperandsAndResultType). Returns failure if the op can do neither.
mlir::LogicalResult reinferResultTypes(mlir::Operation *op);

/// Makes the function type match its block arguments and returned values.
void updateFunctionType(mlir::func::FuncOp func);

/// Number of microbatches recorded by tessera-set-batch (1 if absent).
int64_t getNumMicrobatches(mlir::ModuleOp module);

} // namespace tessera

#endif // TESSERA_SUPPORT_MODEL_H
