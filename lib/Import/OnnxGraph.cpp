//===- OnnxGraph.cpp - ONNX model -> onnx dialect, node for node ----------===//
//
// Every ONNX node becomes one onnx.node (a Constant node an onnx.constant),
// in the graph's order, named by its location. Value types come from the
// model (its value infos, or ONNX shape inference where the onnx library
// knows the model's opset) and otherwise from the dialect's type rules,
// evaluated with the small constants computed so far (the shape
// arithmetic a Reshape reads). A value whose type nothing gives is an error
// naming the node, as is a node reading a value no earlier node made.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxGraph.h"
#include "tessera/Import/OnnxModel.h"

#include "dialects/onnx/IR/OnnxOps.h"
#include "dialects/onnx/IR/OnnxSemantics.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Path.h"

#include <cstring>
#include <set>
#include <unordered_map>

using namespace mlir;
namespace onnx_model = tessera::onnx_model;
namespace onnx = tessera::onnx;

namespace {

/// Import-time evaluation is for shape arithmetic: small values only.
constexpr int64_t kImportFoldLimit = 1 << 16;

class GraphImporter {
public:
  GraphImporter(MLIRContext *ctx, onnx_model::Model &model,
                const tessera::OnnxGraphOptions &options)
      : ctx(ctx), model(model), options(options), b(ctx),
        fileLoc(FileLineColLoc::get(ctx, model.path, 0, 0)) {}

  OwningOpRef<ModuleOp> run();

private:
  InFlightDiagnostic error(const onnx_model::Node &n) {
    return emitError(loc(n)) << "node '" << n.name << "' (" << n.opType << "): ";
  }
  Location loc(const onnx_model::Node &n) {
    return NameLoc::get(b.getStringAttr(n.name), fileLoc);
  }
  /// The model's type for value `name`, or null.
  Type modelType(const std::string &name) {
    auto it = model.values.find(name);
    if (it == model.values.end())
      return nullptr;
    Type elem = onnx::elementTypeOf(ctx, it->second.elemType);
    if (!elem)
      return nullptr;
    if (!it->second.hasShape)
      return UnrankedTensorType::get(elem);
    SmallVector<int64_t> shape;
    for (int64_t d : it->second.shape)
      shape.push_back(d < 0 ? ShapedType::kDynamic : d);
    return RankedTensorType::get(shape, elem);
  }
  /// A tensor's elements as a dense resource named `name`, taking its bytes
  /// (the model holds them no longer). Null when they do not fit the type.
  ElementsAttr takeData(onnx_model::Tensor &t, RankedTensorType type,
                        llvm::StringRef name);
  FailureOr<Attribute> convertAttr(const onnx_model::Node &n,
                                   onnx_model::Attribute &a);
  LogicalResult importNode(onnx_model::Node &n);

  MLIRContext *ctx;
  onnx_model::Model &model;
  const tessera::OnnxGraphOptions &options;
  OpBuilder b;
  Location fileLoc;
  std::unordered_map<std::string, Value> values;
  /// Small values known at import, for the type rules.
  DenseMap<Value, ElementsAttr> known;
  Value none;
  int64_t opset = 0;
  int64_t dropoutSites = 0;
};

/// Small raw little-endian data as a dense elements attribute (printed as
/// values).
ElementsAttr denseFromBytes(RankedTensorType type, llvm::StringRef bytes) {
  Type elem = type.getElementType();
  int64_t n = type.getNumElements();
  const char *p = bytes.data();
  auto read = [&](auto tag, int64_t k) {
    decltype(tag) v;
    std::memcpy(&v, p + k * int64_t(sizeof(v)), sizeof(v));
    return v;
  };
  if (elem.isF32()) {
    SmallVector<float> v;
    for (int64_t k = 0; k < n; ++k)
      v.push_back(read(float(), k));
    return DenseElementsAttr::get(type, ArrayRef<float>(v));
  }
  if (elem.isF64()) {
    SmallVector<double> v;
    for (int64_t k = 0; k < n; ++k)
      v.push_back(read(double(), k));
    return DenseElementsAttr::get(type, ArrayRef<double>(v));
  }
  if (elem.isInteger(1)) {
    SmallVector<bool> v;
    for (int64_t k = 0; k < n; ++k)
      v.push_back(p[k] != 0);
    return DenseElementsAttr::get(type, ArrayRef<bool>(v));
  }
  unsigned width = elem.getIntOrFloatBitWidth();
  SmallVector<APInt> bits;
  for (int64_t k = 0; k < n; ++k) {
    uint64_t v = 0;
    std::memcpy(&v, p + k * (width / 8), width / 8);
    bits.push_back(APInt(width, v));
  }
  if (auto f = dyn_cast<FloatType>(elem)) {
    SmallVector<APFloat> v;
    for (const APInt &x : bits)
      v.push_back(APFloat(f.getFloatSemantics(), x));
    return DenseElementsAttr::get(type, v);
  }
  return DenseElementsAttr::get(type, bits);
}

/// Values up to this many elements are printed; larger ones are blobs.
constexpr int64_t kDenseLimit = 1024;

ElementsAttr GraphImporter::takeData(onnx_model::Tensor &t,
                                     RankedTensorType type, llvm::StringRef name) {
  Type elem = type.getElementType();
  int64_t width = elem.isInteger(1) ? 1 : elem.getIntOrFloatBitWidth() / 8;
  if (int64_t(t.data.size()) != type.getNumElements() * width)
    return nullptr;
  if (type.getNumElements() <= kDenseLimit && !name.empty())
    return denseFromBytes(type, t.data);
  // The blob owns the bytes moved out of the model: one copy in memory.
  auto *owned = new std::string(std::move(t.data));
  t.data.clear();
  AsmResourceBlob blob(ArrayRef<char>(owned->data(), owned->size()),
                       size_t(width),
                       [owned](void *, size_t, size_t) { delete owned; },
                       /*dataIsMutable=*/false);
  return DenseResourceElementsAttr::get(type, name, std::move(blob));
}

FailureOr<Attribute> GraphImporter::convertAttr(const onnx_model::Node &n,
                                                onnx_model::Attribute &a) {
  using Kind = onnx_model::Attribute::Kind;
  switch (a.kind) {
  case Kind::Float: return Attribute(b.getF32FloatAttr(a.f));
  case Kind::Int: return Attribute(b.getI64IntegerAttr(a.i));
  case Kind::String: return Attribute(b.getStringAttr(a.s));
  case Kind::Floats: return Attribute(b.getDenseF32ArrayAttr(a.floats));
  case Kind::Ints: return Attribute(b.getDenseI64ArrayAttr(a.ints));
  case Kind::Strings: {
    SmallVector<Attribute> s;
    for (const std::string &v : a.strings)
      s.push_back(b.getStringAttr(v));
    return Attribute(b.getArrayAttr(s));
  }
  case Kind::Tensor: {
    onnx_model::Tensor &t = *a.tensor;
    Type elem = onnx::elementTypeOf(ctx, t.elemType);
    if (!elem || !t.hasData || t.isExternal()) {
      error(n) << "attribute '" << a.name << "' holds a tensor of "
               << onnx_model::elemTypeName(t.elemType)
               << (t.isExternal() ? " in external data" : "")
               << ", which Tessera does not read";
      return failure();
    }
    SmallVector<int64_t> shape(t.shape.begin(), t.shape.end());
    auto type = RankedTensorType::get(shape, elem);
    ElementsAttr v = takeData(t, type, n.name + "." + a.name);
    if (!v) {
      error(n) << "attribute '" << a.name << "': its data does not match its "
               << "shape";
      return failure();
    }
    return Attribute(v);
  }
  case Kind::Graph:
    error(n) << "attribute '" << a.name
             << "' is a subgraph (control flow); Tessera imports graphs "
                "without If, Loop or Scan";
    return failure();
  case Kind::Other: break;
  }
  error(n) << "attribute '" << a.name << "' has a kind Tessera does not read";
  return failure();
}

LogicalResult GraphImporter::importNode(onnx_model::Node &n) {
  Location at = loc(n);
  SmallVector<NamedAttribute> attrs;
  for (onnx_model::Attribute &a : n.attributes) {
    FailureOr<Attribute> v = convertAttr(n, a);
    if (failed(v))
      return failure();
    attrs.push_back(b.getNamedAttr(a.name, *v));
  }
  if (n.opType == "Constant" && n.domain.empty()) {
    if (attrs.size() != 1 || n.outputs.size() != 1) {
      error(n) << "expected one value attribute and one output";
      return failure();
    }
    Attribute v = attrs[0].getValue();
    StringRef kind = attrs[0].getName().getValue();
    ElementsAttr value;
    // Each kind must hold what its name says (a malformed model's may not).
    if (kind == "value" && isa<ElementsAttr>(v)) {
      value = cast<ElementsAttr>(v);
    } else if (kind == "value_float" && isa<FloatAttr>(v)) {
      value = DenseElementsAttr::get(RankedTensorType::get({}, b.getF32Type()),
                                     cast<FloatAttr>(v).getValue());
    } else if (kind == "value_int" && isa<IntegerAttr>(v)) {
      value = DenseElementsAttr::get(RankedTensorType::get({}, b.getI64Type()),
                                     cast<IntegerAttr>(v).getValue());
    } else if (kind == "value_ints" && isa<DenseI64ArrayAttr>(v)) {
      ArrayRef<int64_t> ints = cast<DenseI64ArrayAttr>(v).asArrayRef();
      value = DenseElementsAttr::get(
          RankedTensorType::get({int64_t(ints.size())}, b.getI64Type()), ints);
    } else if (kind == "value_floats" && isa<DenseF32ArrayAttr>(v)) {
      ArrayRef<float> fs = cast<DenseF32ArrayAttr>(v).asArrayRef();
      value = DenseElementsAttr::get(
          RankedTensorType::get({int64_t(fs.size())}, b.getF32Type()), fs);
    } else {
      error(n) << "attribute '" << kind << "' is a kind of constant Tessera "
               << "does not read";
      return failure();
    }
    auto c = onnx::ConstantOp::create(b, at, value);
    values[n.outputs[0]] = c;
    known[c] = value;
    return success();
  }

  SmallVector<Value> inputs;
  SmallVector<Type> inputTypes;
  SmallVector<ElementsAttr> inputValues;
  for (const std::string &name : n.inputs) {
    if (name.empty()) {
      if (!none)
        none = onnx::NoneOp::create(b, fileLoc, b.getNoneType());
      inputs.push_back(none);
    } else {
      auto it = values.find(name);
      if (it == values.end()) {
        error(n) << "input '" << name << "' is not a graph input, an "
                 << "initializer or an earlier node's output (the graph is "
                 << "not in topological order, or names an unknown value)";
        return failure();
      }
      inputs.push_back(it->second);
    }
    inputTypes.push_back(inputs.back().getType());
    inputValues.push_back(known.lookup(inputs.back()));
  }
  DictionaryAttr dict = b.getDictionaryAttr(attrs);
  onnx::NodeView view{n.opType, dict, inputTypes, inputValues,
                      unsigned(n.outputs.size()), opset};
  std::string ruleError;
  FailureOr<SmallVector<Type>> inferred =
      n.domain.empty() ? onnx::inferResultTypes(ctx, view, ruleError)
                       : FailureOr<SmallVector<Type>>(
                             SmallVector<Type>(n.outputs.size(), nullptr));
  if (failed(inferred)) {
    error(n) << ruleError;
    return failure();
  }
  SmallVector<Type> resultTypes;
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Type t = n.outputs[k].empty() ? nullptr : modelType(n.outputs[k]);
    // The model's type, or the rule's where it knows more (shape inference
    // leaves symbolic dims and the dynamo exporter's value infos may lack a
    // rank).
    Type rule = (*inferred)[k];
    // A stored type the inputs contradict is the model's error: folding on
    // it would read values of one shape as another.
    if (auto mt = dyn_cast_or_null<RankedTensorType>(t)) {
      auto rt = dyn_cast_or_null<RankedTensorType>(rule);
      if (rt && (mt.getElementType() != rt.getElementType() ||
                 failed(verifyCompatibleShape(mt, rt)))) {
        error(n) << "output '" << n.outputs[k] << "' is stored as " << mt
                 << " but its inputs make it " << rt;
        return failure();
      }
    }
    if (!t || (isa<UnrankedTensorType>(t) && rule && isa<RankedTensorType>(rule)))
      t = rule;
    if (!t && n.outputs[k].empty())
      t = UnrankedTensorType::get(b.getF32Type()); // an unused optional output
    if (!t) {
      error(n) << "no type for output '" << n.outputs[k] << "': the model "
               << "stores none and "
               << (onnx::hasTypeRule(n.opType)
                       ? "the type rule cannot tell it from the inputs"
                       : "Tessera has no type rule for this op type");
      return failure();
    }
    resultTypes.push_back(t);
  }
  auto op = onnx::NodeOp::create(b, at, resultTypes, b.getStringAttr(n.opType),
                                 b.getStringAttr(n.domain), dict, inputs);
  if (!n.scope.empty())
    op->setAttr(onnx::kScopeAttr, b.getStringAttr(n.scope));
  // Dropout sites are numbered in graph order here, before anything could
  // merge two of them (CSE would: the ops are pure).
  if (n.opType == "Dropout" && n.domain.empty())
    op->setAttr("onnx.dropout_stream", b.getI64IntegerAttr(dropoutSites++));
  if (n.domain.empty()) {
    SmallVector<ElementsAttr> folded =
        onnx::evaluate(ctx, view, resultTypes, kImportFoldLimit);
    for (size_t k = 0; k < folded.size(); ++k)
      known[op.getResult(k)] = folded[k];
  }
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (!n.outputs[k].empty())
      values[n.outputs[k]] = op.getResult(k);
  return success();
}

OwningOpRef<ModuleOp> GraphImporter::run() {
  OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
  SmallVector<NamedAttribute> opsets;
  for (const auto &[domain, version] : model.opsets)
    opsets.push_back(b.getNamedAttr(domain.empty() ? "ai.onnx" : domain,
                                    b.getI64IntegerAttr(version)));
  (*module)->setAttr(onnx::kOpsetsAttr, b.getDictionaryAttr(opsets));
  auto std = model.opsets.find("");
  opset = std == model.opsets.end() ? 0 : std->second;

  b.setInsertionPointToEnd(module->getBody());
  std::string fname;
  for (char c : llvm::sys::path::stem(model.path))
    fname += llvm::isAlnum(c) || c == '_' ? c : '_';
  if (fname.empty() || llvm::isDigit(fname[0]))
    fname = "model_" + fname;
  auto func = func::FuncOp::create(b, fileLoc, fname, b.getFunctionType({}, {}));
  Block *block = func.addEntryBlock();
  b.setInsertionPointToStart(block);

  std::set<std::string> initNames;
  for (const onnx_model::Tensor &t : model.initializers)
    initNames.insert(t.name);
  SmallVector<DictionaryAttr> argAttrs;
  for (const onnx_model::ValueInfo &in : model.inputs) {
    if (initNames.count(in.name))
      continue; // an initializer listed as an input (older exports)
    Type t = modelType(in.name);
    if (auto r = dyn_cast_or_null<RankedTensorType>(t);
        r && options.fixedBatch > 0 && r.getRank() > 0 && r.isDynamicDim(0)) {
      SmallVector<int64_t> shape(r.getShape());
      shape[0] = options.fixedBatch;
      t = RankedTensorType::get(shape, r.getElementType());
    }
    if (!t) {
      emitError(fileLoc) << "graph input '" << in.name << "' has no tensor "
                         << "type Tessera reads ("
                         << onnx_model::elemTypeName(in.elemType) << ")";
      return nullptr;
    }
    values[in.name] = block->addArgument(t, fileLoc);
    argAttrs.push_back(b.getDictionaryAttr(
        b.getNamedAttr(onnx::kNameAttr, b.getStringAttr(in.name))));
  }

  for (onnx_model::Tensor &t : model.initializers) {
    Type elem = onnx::elementTypeOf(ctx, t.elemType);
    if (!elem) {
      emitError(fileLoc) << "initializer '" << t.name << "' has element type "
                         << onnx_model::elemTypeName(t.elemType)
                         << ", which Tessera does not read";
      return nullptr;
    }
    SmallVector<int64_t> shape(t.shape.begin(), t.shape.end());
    auto type = RankedTensorType::get(shape, elem);
    auto init = onnx::InitializerOp::create(b, fileLoc, type,
                                            b.getStringAttr(t.name),
                                            ElementsAttr(), DictionaryAttr());
    if (t.isExternal()) {
      init.setExternalAttr(b.getDictionaryAttr(
          {b.getNamedAttr("dir", b.getStringAttr(t.externalDir)),
           b.getNamedAttr("file", b.getStringAttr(t.externalFile)),
           b.getNamedAttr("offset", b.getI64IntegerAttr(t.externalOffset)),
           b.getNamedAttr("length", b.getI64IntegerAttr(t.externalLength)),
           b.getNamedAttr("file_bytes", b.getI64IntegerAttr(t.externalFileBytes))}));
    } else if (t.hasData && !(options.noWeights && isa<FloatType>(elem) &&
                              type.getNumElements() > kDenseLimit)) {
      ElementsAttr v = takeData(t, type, t.name);
      if (!v) {
        emitError(fileLoc) << "initializer '" << t.name << "' holds "
                           << t.data.size() << " bytes; its shape and type "
                           << "need " << type.getNumElements() << " elements";
        return nullptr;
      }
      init.setValueAttr(v);
      if (type.getNumElements() <= kImportFoldLimit)
        known[init] = v;
    }
    values[t.name] = init;
  }

  for (onnx_model::Node &n : model.nodes)
    if (failed(importNode(n)))
      return nullptr;

  SmallVector<Value> results;
  SmallVector<DictionaryAttr> resultAttrs;
  for (const onnx_model::ValueInfo &out : model.outputs) {
    auto it = values.find(out.name);
    if (it == values.end()) {
      emitError(fileLoc) << "the graph output '" << out.name
                         << "' is not computed by any node";
      return nullptr;
    }
    results.push_back(it->second);
    resultAttrs.push_back(b.getDictionaryAttr(
        b.getNamedAttr(onnx::kNameAttr, b.getStringAttr(out.name))));
  }
  func::ReturnOp::create(b, fileLoc, results);
  func.setType(b.getFunctionType(block->getArgumentTypes(),
                                 ValueRange(results).getTypes()));
  func.setAllArgAttrs(argAttrs);
  func.setAllResultAttrs(resultAttrs);
  return module;
}

} // namespace

OwningOpRef<ModuleOp> tessera::importOnnxGraph(MLIRContext *context,
                                               onnx_model::Model &model,
                                               const OnnxGraphOptions &options) {
  context->loadDialect<onnx::OnnxDialect, func::FuncDialect>();
  GraphImporter importer(context, model, options);
  return importer.run();
}

OwningOpRef<ModuleOp> tessera::importOnnxGraph(MLIRContext *context,
                                               llvm::StringRef path,
                                               const OnnxGraphOptions &options) {
  onnx_model::Model model;
  std::string error = onnx_model::loadModel(path.str(), /*loadWeights=*/true, model);
  if (!error.empty()) {
    emitError(FileLineColLoc::get(context, path, 0, 0)) << error;
    return nullptr;
  }
  return importOnnxGraph(context, model, options);
}
