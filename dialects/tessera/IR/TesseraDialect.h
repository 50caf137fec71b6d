//===- TesseraDialect.h - tessera dialect, attribute contracts --*- C++ -*-===//
//
// The tessera dialect (no ops: the owner of the `tessera.*` attributes), the
// enums shared by the Tessera dialects, and the table-driven verification
// of discardable attributes that the nn, dist and tessera dialects use.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_TESSERA_IR_TESSERADIALECT_H
#define TESSERA_DIALECTS_TESSERA_IR_TESSERADIALECT_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OperationSupport.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringExtras.h"

#include <optional>
#include <string>

#include "dialects/tessera/IR/TesseraDialect.h.inc"
#include "dialects/tessera/IR/TesseraEnums.h.inc"

namespace tessera {

/// The string attribute of an enum case, for an operand of a builder whose
/// attribute is a Tessera_StrEnumAttr (`enumAttr(b, dist::Peer::Next)`).
template <typename Enum>
mlir::StringAttr enumAttr(mlir::Builder &b, Enum value) {
  return b.getStringAttr(stringifyEnum(value));
}

/// The element type of a stored float dtype (f32, bf16 or f16).
mlir::Type floatDtypeType(mlir::MLIRContext *context, FloatDtype dtype);
/// The stored float dtype of an element type, if it is one.
std::optional<FloatDtype> floatDtypeOf(mlir::Type element);
/// Bytes per element of a stored float dtype.
inline int64_t floatDtypeBytes(FloatDtype dtype) {
  return dtype == FloatDtype::F32 ? 4 : 2;
}

//===----------------------------------------------------------------------===//
// Contracts of discardable attributes
//===----------------------------------------------------------------------===//

/// Where a discardable attribute may appear (a set of these bits).
namespace attr_site {
enum : unsigned {
  Module = 1,   ///< on a builtin.module
  Function = 2, ///< on a function (FunctionOpInterface)
  AnyOp = 4,    ///< on any operation
  Argument = 8, ///< on a function argument
  Result = 16,  ///< on a function result
};
} // namespace attr_site

/// Checks a discardable attribute's value. Returns "" when it is valid,
/// else what it must be ("a non-negative integer"). `type` is the type of
/// the argument or result that carries it; null on an operation.
using AttrCheck = std::string (*)(mlir::Attribute attr, mlir::Type type);

/// One discardable attribute: its name, where it may appear (attr_site
/// bits) and its value's check.
struct AttrContract {
  llvm::StringLiteral name;
  unsigned sites;
  AttrCheck check;
};

/// Verifies `attr` against the contract of its name among `contracts`, a
/// dialect's complete list: an unknown name, a wrong site or a wrong value
/// is an error on `op`. `site` is attr_site::Argument or attr_site::Result
/// with `index` the argument's or result's number, or 0 for an attribute
/// of `op` itself.
mlir::LogicalResult verifyAttr(llvm::ArrayRef<AttrContract> contracts,
                               mlir::Operation *op, mlir::NamedAttribute attr,
                               unsigned site = 0, unsigned index = 0);

/// Checks for AttrContract (and FieldContract). Given a null attribute,
/// each returns its description.
namespace attr_check {
std::string string(mlir::Attribute attr, mlir::Type);
std::string nonEmptyString(mlir::Attribute attr, mlir::Type);
std::string unit(mlir::Attribute attr, mlir::Type);
std::string nonNegativeInt(mlir::Attribute attr, mlir::Type);
std::string positiveInt(mlir::Attribute attr, mlir::Type);
std::string floatValue(mlir::Attribute attr, mlir::Type);
/// A non-negative integer below the rank of `type` when it is ranked.
std::string dimensionOf(mlir::Attribute attr, mlir::Type type);
std::string flatSymbolRef(mlir::Attribute attr, mlir::Type);
std::string i64Array(mlir::Attribute attr, mlir::Type);

/// A string naming a case of an ODS enum whose cases are numbered 0..max
/// (`symbolize` and `max` are the enum's generated functions).
template <typename Enum, std::optional<Enum> (*symbolize)(llvm::StringRef),
          unsigned (*max)()>
std::string enumString(mlir::Attribute attr, mlir::Type) {
  auto s = llvm::dyn_cast_if_present<mlir::StringAttr>(attr);
  if (s && symbolize(s.getValue()))
    return "";
  std::string cases;
  for (unsigned i = 0, e = max(); i <= e; ++i)
    cases += (i == 0   ? "\""
              : i == e ? " or \""
                       : ", \"") +
             stringifyEnum(Enum(i)).str() + "\"";
  return cases;
}

/// One entry of a dictionary attribute.
struct FieldContract {
  llvm::StringLiteral name;
  AttrCheck check;
  bool optional = false;
};
/// A dictionary with exactly these entries (the optional ones may be left
/// out).
std::string dictionary(mlir::Attribute attr, mlir::Type type,
                       llvm::ArrayRef<FieldContract> fields);
} // namespace attr_check

} // namespace tessera

#endif // TESSERA_DIALECTS_TESSERA_IR_TESSERADIALECT_H
