//===- TesseraDialect.cpp - tessera dialect: attribute contracts ----------===//
//
// The contracts of the `tessera.*` attributes, and the table-driven
// verification of discardable attributes that the nn and dist dialects use
// for theirs.
//
//===----------------------------------------------------------------------===//

#include "dialects/tessera/IR/TesseraDialect.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Interfaces/FunctionInterfaces.h"

using namespace mlir;
using namespace tessera;

#include "dialects/tessera/IR/TesseraDialect.cpp.inc"
#include "dialects/tessera/IR/TesseraEnums.cpp.inc"

void TesseraDialect::initialize() {}

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

/// The value of a signless (or index) integer attribute of at most 64 bits
/// other than a bool: what the passes read with getInt().
static std::optional<int64_t> intValue(Attribute attr) {
  auto i = dyn_cast_if_present<IntegerAttr>(attr);
  if (!i)
    return std::nullopt;
  Type type = i.getType();
  if (!type.isIndex() &&
      !(type.isSignlessInteger() && type.getIntOrFloatBitWidth() > 1 &&
        type.getIntOrFloatBitWidth() <= 64))
    return std::nullopt;
  return i.getInt();
}

std::string attr_check::string(Attribute attr, Type) {
  return isa_and_present<StringAttr>(attr) ? "" : "a string";
}

std::string attr_check::nonEmptyString(Attribute attr, Type) {
  auto s = dyn_cast_if_present<StringAttr>(attr);
  return s && !s.getValue().empty() ? "" : "a non-empty string";
}

std::string attr_check::unit(Attribute attr, Type) {
  return isa_and_present<UnitAttr>(attr) ? "" : "a unit attribute";
}

std::string attr_check::nonNegativeInt(Attribute attr, Type) {
  std::optional<int64_t> i = intValue(attr);
  return i && *i >= 0 ? "" : "a non-negative integer";
}

std::string attr_check::positiveInt(Attribute attr, Type) {
  std::optional<int64_t> i = intValue(attr);
  return i && *i > 0 ? "" : "a positive integer";
}

std::string attr_check::floatValue(Attribute attr, Type) {
  return isa_and_present<FloatAttr>(attr) ? "" : "a float";
}

std::string attr_check::dimensionOf(Attribute attr, Type type) {
  auto ranked = dyn_cast_if_present<RankedTensorType>(type);
  if (!ranked)
    return nonNegativeInt(attr, type);
  std::optional<int64_t> i = intValue(attr);
  if (i && *i >= 0 && *i < ranked.getRank())
    return "";
  std::string text;
  llvm::raw_string_ostream(text) << "a dimension of " << type << " (0 <= dim < "
                                 << ranked.getRank() << ")";
  return text;
}

std::string attr_check::flatSymbolRef(Attribute attr, Type) {
  return isa_and_present<FlatSymbolRefAttr>(attr) ? "" : "a symbol reference";
}

std::string attr_check::i64Array(Attribute attr, Type) {
  return isa_and_present<DenseI64ArrayAttr>(attr) ? "" : "an array<i64: ...>";
}

std::string attr_check::dictionary(Attribute attr, Type type,
                                   ArrayRef<FieldContract> fields) {
  auto dict = dyn_cast_if_present<DictionaryAttr>(attr);
  bool valid = bool(dict);
  if (dict) {
    for (const FieldContract &f : fields) {
      Attribute value = dict.get(f.name);
      if (value ? !f.check(value, type).empty() : !f.optional)
        valid = false;
    }
    for (NamedAttribute entry : dict)
      if (!llvm::any_of(fields, [&](const FieldContract &f) {
            return f.name == entry.getName().getValue();
          }))
        valid = false;
  }
  if (valid)
    return "";
  // What it must be: the expectation of each entry (for a null value).
  std::string expected = "{";
  for (auto [i, f] : llvm::enumerate(fields)) {
    std::string what = f.check(Attribute(), type);
    expected +=
        (i ? ", " : "") + f.name.str() + (f.optional ? "?" : "") + " = " + what;
  }
  return expected + "}";
}

//===----------------------------------------------------------------------===//
// verifyAttr
//===----------------------------------------------------------------------===//

static std::string sitesText(unsigned sites) {
  SmallVector<std::string> names;
  if (sites & attr_site::AnyOp)
    names.push_back("an operation");
  if (sites & attr_site::Module)
    names.push_back("a builtin.module");
  if (sites & attr_site::Function)
    names.push_back("a function");
  if (sites & attr_site::Argument)
    names.push_back("a function argument");
  if (sites & attr_site::Result)
    names.push_back("a function result");
  return llvm::join(names, " or ");
}

LogicalResult tessera::verifyAttr(ArrayRef<AttrContract> contracts,
                                  Operation *op, NamedAttribute attr,
                                  unsigned site, unsigned index) {
  StringRef name = attr.getName().getValue();
  std::string where;
  Type type;
  if (site == attr_site::Argument || site == attr_site::Result) {
    where = (site == attr_site::Argument ? "argument #" : "result #") +
            std::to_string(index) + " ";
    if (auto func = dyn_cast<FunctionOpInterface>(op)) {
      ArrayRef<Type> types = site == attr_site::Argument
                                 ? func.getArgumentTypes()
                                 : func.getResultTypes();
      if (index < types.size())
        type = types[index];
    }
  } else {
    site = isa<ModuleOp>(op)              ? attr_site::Module
           : isa<FunctionOpInterface>(op) ? attr_site::Function
                                          : attr_site::AnyOp;
  }
  const AttrContract *contract = llvm::find_if(
      contracts, [&](const AttrContract &c) { return c.name == name; });
  if (contract == contracts.end())
    return op->emitOpError()
           << where << "has an unknown attribute '" << name << "'";
  bool placed = (contract->sites & site) ||
                (site != attr_site::Argument && site != attr_site::Result &&
                 (contract->sites & attr_site::AnyOp));
  if (!placed)
    return op->emitOpError()
           << where << "has '" << name << "', an attribute of "
           << sitesText(contract->sites);
  std::string expected = contract->check(attr.getValue(), type);
  if (!expected.empty()) {
    // The value as written, shortened: a model's weights would fill pages.
    std::string got;
    llvm::raw_string_ostream os(got);
    os << attr.getValue();
    constexpr size_t kShown = 200;
    if (got.size() > kShown)
      got = got.substr(0, kShown) + "... (" + std::to_string(got.size()) +
            " characters)";
    return op->emitOpError() << where << "attribute '" << name << "' must be "
                             << expected << ", got " << got;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// tessera.* attributes
//===----------------------------------------------------------------------===//

Type tessera::floatDtypeType(MLIRContext *context, FloatDtype dtype) {
  Builder b(context);
  switch (dtype) {
  case FloatDtype::BF16:
    return b.getBF16Type();
  case FloatDtype::F16:
    return b.getF16Type();
  case FloatDtype::F32:
    break;
  }
  return b.getF32Type();
}

std::optional<FloatDtype> tessera::floatDtypeOf(Type element) {
  if (element.isF32())
    return FloatDtype::F32;
  if (element.isBF16())
    return FloatDtype::BF16;
  if (element.isF16())
    return FloatDtype::F16;
  return std::nullopt;
}

namespace {
using namespace attr_check;
using attr_site::Argument;
using attr_site::Function;
using attr_site::Module;
using attr_site::Result;

std::string dtype(Attribute a, Type t) {
  return enumString<FloatDtype, symbolizeFloatDtype,
                    getMaxEnumValForFloatDtype>(a, t);
}

const AttrContract kTesseraAttrs[] = {
    {kPhaseAttr, Function,
     enumString<Phase, symbolizePhase, getMaxEnumValForPhase>},
    {kLastMicrobatchAttr, Function, unit},
    {kBufferAttr, Argument | Result, nonEmptyString},
    {kGradOfAttr, Result, nonEmptyString},
    {kStashAttr, Argument | Result, nonNegativeInt},
    {kGradShardAttr, Result,
     [](Attribute a, Type t) {
       return dictionary(
           a, t, {{"buffer", flatSymbolRef}, {"bucket", nonNegativeInt}});
     }},
    {kBatchAttr, Module,
     [](Attribute a, Type t) {
       return dictionary(a, t,
                         {{"micro_batch_size", positiveInt},
                          {"global_batch_size", positiveInt},
                          {"num_microbatches", positiveInt}});
     }},
    {kOptimizerAttr, Module,
     [](Attribute a, Type t) {
       return dictionary(
           a, t,
           {{"kind", enumString<OptimizerKind, symbolizeOptimizerKind,
                                getMaxEnumValForOptimizerKind>},
            {"lr", floatValue},
            {"beta1", floatValue},
            {"beta2", floatValue},
            {"eps", floatValue},
            {"weight_decay", floatValue},
            {"clip_grad", floatValue, /*optional=*/true},
            {"momentum", floatValue, /*optional=*/true},
            {"lr_warmup_iters", nonNegativeInt, /*optional=*/true},
            {"lr_decay_iters", nonNegativeInt, /*optional=*/true},
            {"lr_decay_style",
             enumString<LrDecayStyle, symbolizeLrDecayStyle,
                        getMaxEnumValForLrDecayStyle>,
             /*optional=*/true},
            {"min_lr", floatValue, /*optional=*/true},
            // fp16's loss scaler (Megatron's flags)
            {"loss_scale", floatValue, /*optional=*/true},
            {"initial_loss_scale", floatValue, /*optional=*/true},
            {"min_loss_scale", floatValue, /*optional=*/true},
            {"loss_scale_window", positiveInt, /*optional=*/true},
            {"hysteresis", positiveInt, /*optional=*/true}});
     }},
    {kMixedPrecisionAttr, Module,
     [](Attribute a, Type t) {
       return dictionary(a, t,
                         {{"params", dtype},
                          {"grads", dtype},
                          // tessera-bf16-activations
                          {"activations", dtype, /*optional=*/true}});
     }},
    {kVocabAttr, Module,
     [](Attribute a, Type t) {
       return dictionary(a, t,
                         {{"size", positiveInt},
                          {"padded", positiveInt},
                          {"masked", unit, /*optional=*/true}});
     }},
    {kWeightsAttr, Module,
     [](Attribute a, Type t) -> std::string {
       std::string expected =
           "a dictionary from parameter names to f32 elements or {dir = "
           "<directory>, file = <path relative to it>, offset = <bytes>, "
           "shape = <the data's shape>}";
       auto dict = dyn_cast_if_present<DictionaryAttr>(a);
       if (!dict)
         return expected;
       // A bad entry is named, with what it should be.
       for (NamedAttribute entry : dict) {
         std::string entryName = entry.getName().str();
         if (auto elements = dyn_cast<ElementsAttr>(entry.getValue())) {
           if (!elements.getElementType().isF32())
             return expected + "; the value of '" + entryName +
                    "' is not f32";
           continue;
         }
         std::string why = dictionary(entry.getValue(), t,
                                      {{"dir", string},
                                       {"file", string},
                                       {"offset", nonNegativeInt},
                                       {"shape", i64Array}});
         if (!why.empty())
           return expected + "; the entry of '" + entryName + "' must be " +
                  why;
       }
       return "";
     }},
    {kOnnxSourceAttr, Module,
     [](Attribute a, Type t) -> std::string {
       const std::string expected =
           "{model = <the .onnx file>, parameters = [{param, kind, shape, "
           "sources = [{initializer, shape, readers}], ...}]}";
       auto dict = dyn_cast_if_present<DictionaryAttr>(a);
       if (!dict)
         return expected;
       if (Attribute m = dict.get("model"); m && !isa<StringAttr>(m))
         return expected + "; 'model' is not a string";
       auto params = dyn_cast_if_present<ArrayAttr>(dict.get("parameters"));
       if (!params)
         return expected + "; 'parameters' is not an array";
       for (Attribute p : params) {
         auto entry = dyn_cast<DictionaryAttr>(p);
         if (!entry || !isa_and_present<StringAttr>(entry.get("param")) ||
             !isa_and_present<StringAttr>(entry.get("kind")) ||
             !isa_and_present<DenseI64ArrayAttr>(entry.get("shape")) ||
             !isa_and_present<ArrayAttr>(entry.get("sources")))
           return expected + "; a parameter entry lacks param, kind, shape "
                             "or sources";
       }
       return "";
     }},
    {kCompileFlagsAttr, Module, string},
    {kModelNameAttr, Module, string},
    {kArchitectureAttr, Module,
     [](Attribute a, Type) -> std::string {
       const std::string expected =
           "a dictionary of integers, floats, bools and strings (Megatron-LM's "
           "argument names)";
       auto dict = dyn_cast_if_present<DictionaryAttr>(a);
       if (!dict)
         return expected;
       for (NamedAttribute entry : dict)
         if (!isa<IntegerAttr, FloatAttr, BoolAttr, StringAttr>(
                 entry.getValue()))
           return expected + "; '" + entry.getName().str() + "' is not one";
       return "";
     }},
};
} // namespace

LogicalResult TesseraDialect::verifyOperationAttribute(Operation *op,
                                                       NamedAttribute attr) {
  return verifyAttr(kTesseraAttrs, op, attr);
}

LogicalResult TesseraDialect::verifyRegionArgAttribute(Operation *op, unsigned,
                                                       unsigned argIndex,
                                                       NamedAttribute attr) {
  return verifyAttr(kTesseraAttrs, op, attr, attr_site::Argument, argIndex);
}

LogicalResult TesseraDialect::verifyRegionResultAttribute(Operation *op,
                                                          unsigned,
                                                          unsigned resultIndex,
                                                          NamedAttribute attr) {
  return verifyAttr(kTesseraAttrs, op, attr, attr_site::Result, resultIndex);
}
