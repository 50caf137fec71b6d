//===- TesseraEnumBase.td - ODS enums over strings ---------*- tablegen -*-===//
//
// What the Tessera dialects share for closed sets of strings: an ODS enum
// (Tessera_Enum: a C++ enum class with the generated stringify and
// symbolize functions) and a string attribute restricted to its cases
// (Tessera_StrEnumAttr). Classes only, so that -gen-enum-decls on a file
// that includes this one emits that file's enums alone.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_TESSERA_IR_TESSERAENUMBASE_TD
#define TESSERA_DIALECTS_TESSERA_IR_TESSERAENUMBASE_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

//===----------------------------------------------------------------------===//
// String-backed enum attributes
//===----------------------------------------------------------------------===//

/// A string attribute restricted to the cases of an ODS enum: the IR keeps
/// the string (`"next"`), the accessor returns the C++ enum (the enum's
/// symbolize function) and the builder takes it (stringify). A string that
/// is not a case fails the op's verifier with the enum's summary.
class Tessera_StrEnumAttr<EnumInfo enumInfo> : StringBasedAttr<
    CPred<"::llvm::isa<::mlir::StringAttr>($_self) && " #
          enumInfo.cppNamespace # "::" # enumInfo.stringToSymbolFnName #
          "(::llvm::cast<::mlir::StringAttr>($_self).getValue())">,
    enumInfo.summary> {
  let returnType = enumInfo.cppNamespace # "::" # enumInfo.className;
  let convertFromStorage = "*" # enumInfo.cppNamespace # "::" #
                           enumInfo.stringToSymbolFnName # "($_self.getValue())";
  let constBuilderCall = "$_builder.getStringAttr(" # enumInfo.cppNamespace #
                         "::" # enumInfo.symbolToStringFnName # "($0))";
}

/// An ODS enum over strings, cases numbered from 0, in C++ namespace `ns`.
/// The summary goes into generated C++ strings and error messages: no
/// double quotes.
class Tessera_Enum<string name, string summary, list<string> strings,
                   list<string> symbols, string ns = "::tessera">
    : I32Enum<name, summary,
              !foreach(i, !range(!size(strings)),
                       I32EnumCase<symbols[i], i, strings[i]>)> {
  let cppNamespace = ns;
}

#endif // TESSERA_DIALECTS_TESSERA_IR_TESSERAENUMBASE_TD
