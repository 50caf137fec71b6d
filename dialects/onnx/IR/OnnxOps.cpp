//===- OnnxOps.cpp - onnx dialect operations ------------------------------===//

#include "dialects/onnx/IR/OnnxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace tessera::onnx;

#include "dialects/onnx/IR/OnnxOpsDialect.cpp.inc"

void OnnxDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/onnx/IR/OnnxOps.cpp.inc"
      >();
}

Operation *OnnxDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                            Type type, Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return ConstantOp::create(builder, loc, elements);
}

ElementsAttr tessera::onnx::getConstantValue(Value v) {
  if (auto c = v.getDefiningOp<ConstantOp>())
    return c.getValue();
  if (auto i = v.getDefiningOp<InitializerOp>())
    return i.getValueAttr();
  return nullptr;
}

int64_t tessera::onnx::getOpset(Operation *op) {
  for (; op; op = op->getParentOp())
    if (auto d = op->getAttrOfType<DictionaryAttr>(kOpsetsAttr))
      if (auto v = dyn_cast_or_null<IntegerAttr>(d.get("ai.onnx")))
        return v.getInt();
  return 0;
}

//===----------------------------------------------------------------------===//
// NodeOp
//===----------------------------------------------------------------------===//

LogicalResult NodeOp::verify() {
  if (getOpType().empty())
    return emitOpError() << "needs an ONNX op type";
  for (Type t : getResultTypes())
    if (!isa<TensorType>(t))
      return emitOpError() << "results must be tensors, got " << t;
  for (Type t : getInputs().getTypes())
    if (!isa<TensorType, NoneType>(t))
      return emitOpError() << "inputs must be tensors or none, got " << t;
  return success();
}

std::string NodeOp::getNodeName() {
  Location l = getLoc();
  if (auto fused = dyn_cast<FusedLoc>(l))
    l = fused.getLocations().front();
  if (auto name = dyn_cast<NameLoc>(l))
    return name.getName().str();
  return getOpType().str();
}

int64_t NodeOp::getInt(StringRef name, int64_t dflt) {
  auto a = dyn_cast_or_null<IntegerAttr>(getAttrs().get(name));
  return a ? a.getInt() : dflt;
}

float NodeOp::getFloat(StringRef name, float dflt) {
  auto a = dyn_cast_or_null<FloatAttr>(getAttrs().get(name));
  return a ? float(a.getValueAsDouble()) : dflt;
}

StringRef NodeOp::getString(StringRef name, StringRef dflt) {
  auto a = dyn_cast_or_null<StringAttr>(getAttrs().get(name));
  return a ? a.getValue() : dflt;
}

std::optional<ArrayRef<int64_t>> NodeOp::getInts(StringRef name) {
  auto a = dyn_cast_or_null<DenseI64ArrayAttr>(getAttrs().get(name));
  if (!a)
    return std::nullopt;
  return a.asArrayRef();
}

Value NodeOp::getInputOrNull(unsigned i) {
  if (i >= getInputs().size() || isa<NoneType>(getInputs()[i].getType()))
    return nullptr;
  return getInputs()[i];
}

//===----------------------------------------------------------------------===//
// InitializerOp, ConstantOp
//===----------------------------------------------------------------------===//

LogicalResult InitializerOp::verify() {
  if (getValueAttr() && getExternalAttr())
    return emitOpError() << "has both inline and external data";
  if (getValueAttr() && getValueAttr().getType() != getType())
    return emitOpError() << "value type " << getValueAttr().getType()
                         << " differs from the result type " << getType();
  if (DictionaryAttr ext = getExternalAttr())
    if (!isa_and_nonnull<StringAttr>(ext.get("file")) ||
        !isa_and_nonnull<IntegerAttr>(ext.get("offset")))
      return emitOpError() << "external data needs 'file' (a string) and "
                              "'offset' (an integer)";
  return success();
}

LogicalResult ConstantOp::verify() {
  if (getValue().getType() != getType())
    return emitOpError() << "value type " << getValue().getType()
                         << " differs from the result type " << getType();
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

#define GET_OP_CLASSES
#include "dialects/onnx/IR/OnnxOps.cpp.inc"
