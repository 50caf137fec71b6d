//===- TesseraInterfaces.h - Op interfaces shared by dialects ----*- C++ -*-===//

#ifndef TESSERA_INTERFACES_TESSERAINTERFACES_H
#define TESSERA_INTERFACES_TESSERAINTERFACES_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

namespace tessera {

/// The ways an op can be split along the tensor-parallel axis.
enum class TPSplitKind {
  /// Output features sharded: Y_i = X W_i (Megatron's ColumnParallelLinear).
  Column,
  /// Input features sharded: Y = sum_i X_i W_i (Megatron's RowParallelLinear).
  Row,
  /// A table sharded along the vocabulary; indices replicated, the result a
  /// partial sum (Megatron's VocabParallelEmbedding).
  Vocab,
};

/// Marks ops whose results carry no gradient (stop-gradient), e.g. the row
/// max that only stabilises a softmax: autodiff treats them as constants.
template <typename ConcreteType>
class NonDifferentiable
    : public mlir::OpTrait::TraitBase<ConcreteType, NonDifferentiable> {};

} // namespace tessera

#include "tessera/Interfaces/TesseraInterfaces.h.inc"

#endif // TESSERA_INTERFACES_TESSERAINTERFACES_H
