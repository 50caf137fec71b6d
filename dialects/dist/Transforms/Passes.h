//===- Passes.h - Parallelisation passes --------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_H
#define TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_H

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/IR/NNOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace tessera::dist {

#define GEN_PASS_DECL
#include "dialects/dist/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/dist/Transforms/Passes.h.inc"

/// A column-parallel linear, the elementwise ops after it and the
/// row-parallel linear that closes the region (Megatron's MLP pattern:
/// ColumnParallelLinear then RowParallelLinear).
struct TPRegion {
  mlir::Operation *column;
  llvm::SmallVector<mlir::Operation *> chain;
  mlir::Operation *row;
};

/// Finds the tensor-parallel regions of a model function through
/// TPSplitOpInterface. Used by tp-partition, and by attach-mesh to check
/// divisibility before anything is rewritten.
llvm::SmallVector<TPRegion> findTPRegions(mlir::func::FuncOp func);

/// Makes load-balancing loss `aux` count the choices of all ranks of
/// `group` (the ranks that split the tokens: Megatron's
/// sequence_partition_group): nn.moe_token_counts of its indices, summed by
/// a dist.all_reduce over `group`, become its `counts`. Used by
/// tp-partition (sequence parallelism) and cp-partition.
void sumAuxLossCounts(mlir::OpBuilder &b, nn::MoEAuxLossOp aux,
                      mlir::FlatSymbolRefAttr mesh, mlir::StringAttr group);

} // namespace tessera::dist

#endif // TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_H
