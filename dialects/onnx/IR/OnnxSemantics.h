//===- OnnxSemantics.h - What ONNX ops compute, for types and folding -*- C++ -*-===//
//
// The per-op-type rules of the onnx dialect: the result types of a node from
// its inputs' types (and the values of those inputs known at compile time),
// and the results themselves when every input is known. One table
// (OnnxSemantics.cpp) holds a row per ONNX op type; the importer uses it
// where a model carries no type for a value (TorchScript exports beyond the
// opsets Debian's onnx library knows), tessera-onnx-simplify to fold.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_ONNX_IR_ONNXSEMANTICS_H
#define TESSERA_DIALECTS_ONNX_IR_ONNXSEMANTICS_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"

#include <optional>
#include <string>

namespace tessera::onnx {

/// What a rule sees of a node. `inputTypes` has NoneType for an omitted
/// input; `inputValues` a null attribute where the value is not known.
struct NodeView {
  llvm::StringRef opType;
  mlir::DictionaryAttr attrs;
  llvm::ArrayRef<mlir::Type> inputTypes;
  llvm::ArrayRef<mlir::ElementsAttr> inputValues;
  unsigned numResults = 1;
  /// The standard domain's opset version of the model (some op types
  /// moved attributes to inputs between versions).
  int64_t opset = 18;

  int64_t getInt(llvm::StringRef name, int64_t dflt) const;
  std::optional<float> getFloat(llvm::StringRef name) const;
  std::optional<llvm::SmallVector<int64_t>> getInts(llvm::StringRef name) const;
  bool has(unsigned i) const {
    return i < inputTypes.size() && !llvm::isa<mlir::NoneType>(inputTypes[i]);
  }
  /// The integer values of input i when known.
  std::optional<llvm::SmallVector<int64_t>> intsOf(unsigned i) const;
};

/// The results' types; a null entry where the rule cannot tell (or the op
/// type has no rule). An error is a message (an attribute or input the op
/// type forbids).
mlir::FailureOr<llvm::SmallVector<mlir::Type>>
inferResultTypes(mlir::MLIRContext *ctx, const NodeView &node,
                 std::string &error);

/// The results' values, when the op type has an evaluator, every input is
/// known and no result exceeds `maxElements`; otherwise empty.
llvm::SmallVector<mlir::ElementsAttr> evaluate(mlir::MLIRContext *ctx,
                                               const NodeView &node,
                                               llvm::ArrayRef<mlir::Type> resultTypes,
                                               int64_t maxElements);

/// Whether the op type has a type rule (for messages).
bool hasTypeRule(llvm::StringRef opType);

/// The MLIR element type of ONNX TensorProto data type `onnxType`, or null.
mlir::Type elementTypeOf(mlir::MLIRContext *ctx, int32_t onnxType);

} // namespace tessera::onnx

#endif // TESSERA_DIALECTS_ONNX_IR_ONNXSEMANTICS_H
