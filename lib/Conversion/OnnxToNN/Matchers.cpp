//===- Matchers.cpp - Reading onnx IR in the raising patterns -------------===//

#include "Matchers.h"

#include <cstring>
#include <fstream>

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"

#include <cstring>

using namespace mlir;
namespace onnx = tessera::onnx;

namespace tessera::onnx_to_nn {

std::optional<SmallVector<double>> constValues(Value v) {
  ElementsAttr attr = v ? onnx::getConstantValue(v) : nullptr;
  if (!attr)
    return std::nullopt;
  Type elem = attr.getElementType();
  SmallVector<double> out;
  if (auto dense = dyn_cast<DenseElementsAttr>(attr)) {
    if (isa<FloatType>(elem)) {
      for (APFloat f : dense.getValues<APFloat>()) {
        bool lost;
        f.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &lost);
        out.push_back(f.convertToDouble());
      }
    } else {
      for (APInt i : dense.getValues<APInt>())
        out.push_back(elem.isInteger(1) ? double(i.getBoolValue())
                                        : double(i.getSExtValue()));
    }
    return out;
  }
  auto res = dyn_cast<DenseResourceElementsAttr>(attr);
  if (!res || !res.getRawHandle().getBlob())
    return std::nullopt;
  ArrayRef<char> bytes = res.getRawHandle().getBlob()->getData();
  size_t n = size_t(attr.getNumElements());
  unsigned width = elem.isInteger(1) ? 1 : elem.getIntOrFloatBitWidth() / 8;
  if (bytes.size() != n * width)
    return std::nullopt;
  out.resize(n);
  const char *p = bytes.data();
  for (size_t k = 0; k < n; ++k, p += width) {
    if (elem.isF32()) {
      float f;
      std::memcpy(&f, p, 4);
      out[k] = f;
    } else if (elem.isF64()) {
      std::memcpy(&out[k], p, 8);
    } else if (elem.isInteger(1) || elem.isInteger(8)) {
      out[k] = double(int8_t(*p));
    } else if (elem.isInteger(32)) {
      int32_t v;
      std::memcpy(&v, p, 4);
      out[k] = v;
    } else if (elem.isInteger(64)) {
      int64_t v;
      std::memcpy(&v, p, 8);
      out[k] = double(v);
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::optional<double> scalarValue(Value v) {
  ElementsAttr attr = v ? onnx::getConstantValue(v) : nullptr;
  if (!attr || attr.getNumElements() != 1)
    return std::nullopt; // no weight is converted to find out
  auto values = constValues(v);
  if (!values || values->size() != 1)
    return std::nullopt;
  return (*values)[0];
}

bool isScalar(Value v, double expect, double rtol) {
  std::optional<double> s = scalarValue(v);
  return s && std::abs(*s - expect) <= rtol * std::max(1.0, std::abs(expect));
}

std::optional<SmallVector<int64_t>> intValues(Value v) {
  ElementsAttr attr = v ? onnx::getConstantValue(v) : nullptr;
  auto dense = dyn_cast_or_null<DenseElementsAttr>(attr);
  if (!dense || !isa<IntegerType>(dense.getElementType()))
    return std::nullopt;
  SmallVector<int64_t> out;
  for (APInt i : dense.getValues<APInt>())
    out.push_back(i.getSExtValue());
  return out;
}

ArrayRef<int64_t> shapeOf(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? t.getShape() : ArrayRef<int64_t>();
}

StringRef scopeOf(Operation *op) {
  auto s = op ? op->getAttrOfType<StringAttr>(onnx::kScopeAttr) : nullptr;
  return s ? s.getValue() : StringRef();
}

int64_t layerIndexOf(StringRef name) {
  SmallVector<StringRef> parts;
  while (!name.empty()) {
    size_t cut = name.find_first_of("./");
    parts.push_back(name.take_front(cut));
    name = cut == StringRef::npos ? StringRef() : name.drop_front(cut + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    StringRef p = parts[i];
    if (p != "layers" && p != "layer" && p != "h" && p != "blocks" && p != "block")
      continue;
    int64_t index;
    if (!parts[i + 1].getAsInteger(10, index) && index >= 0)
      return index;
  }
  return -1;
}

Value createParamView(OpBuilder &b, Location loc, Type type, StringRef name,
                      StringRef kind, ValueRange sources,
                      ArrayRef<NamedAttribute> extra) {
  SmallVector<NamedAttribute> attrs{b.getNamedAttr("name", b.getStringAttr(name)),
                                    b.getNamedAttr("kind", b.getStringAttr(kind))};
  llvm::append_range(attrs, extra);
  auto op = onnx::NodeOp::create(b, loc, TypeRange{type}, b.getStringAttr(kParamView),
                                 b.getStringAttr(""), b.getDictionaryAttr(attrs),
                                 sources);
  return op.getResult(0);
}

Value swapBatchSeq(OpBuilder &b, Location loc, Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  SmallVector<int64_t> shape(t.getShape()), perm;
  std::swap(shape[0], shape[1]);
  for (int64_t d = 0; d < t.getRank(); ++d)
    perm.push_back(d);
  std::swap(perm[0], perm[1]);
  auto op = onnx::NodeOp::create(
      b, loc, TypeRange{RankedTensorType::get(shape, t.getElementType())},
      b.getStringAttr("Transpose"), b.getStringAttr(""),
      b.getDictionaryAttr(b.getNamedAttr("perm", b.getDenseI64ArrayAttr(perm))),
      ValueRange{v});
  return op.getResult(0);
}

bool isBatchSeqSwap(Operation *op) {
  auto n = dyn_cast_or_null<onnx::NodeOp>(op);
  if (!n || n.getOpType() != "Transpose" || n.getInputs().size() != 1)
    return false;
  std::optional<ArrayRef<int64_t>> perm = n.getInts("perm");
  if (!perm || perm->size() < 2 || (*perm)[0] != 1 || (*perm)[1] != 0)
    return false;
  for (size_t d = 2; d < perm->size(); ++d)
    if ((*perm)[d] != int64_t(d))
      return false;
  return true;
}

std::optional<WeightRef> matmulWeight(Value w) {
  if (auto init = w.getDefiningOp<onnx::InitializerOp>())
    if (init.getType().getRank() == 2)
      return WeightRef{init, /*inOut=*/true};
  if (onnx::NodeOp t = producer(w, "Transpose")) {
    std::optional<ArrayRef<int64_t>> perm = t.getInts("perm");
    auto init = t.getInputs()[0].getDefiningOp<onnx::InitializerOp>();
    if (init && init.getType().getRank() == 2 &&
        (!perm || (perm->size() == 2 && (*perm)[0] == 1 && (*perm)[1] == 0)))
      return WeightRef{init, /*inOut=*/false};
  }
  return std::nullopt;
}

/// An initializer's f32 values: inline (a dense or resource value) or read
/// from its external-data file.
/// Where an external initializer's f32 elements lie: its file and byte
/// offset, checked against the entry's length and the file's size before
/// anything is allocated or read.
static FailureOr<std::pair<std::string, int64_t>> externalPlace(onnx::InitializerOp init) {
  DictionaryAttr ext = init.getExternalAttr();
  int64_t bytes = init.getType().getNumElements() * 4;
  std::string path = (cast<StringAttr>(ext.get("dir")).getValue() + "/" +
                      cast<StringAttr>(ext.get("file")).getValue())
                         .str();
  int64_t offset = cast<IntegerAttr>(ext.get("offset")).getInt();
  if (auto length = dyn_cast_or_null<IntegerAttr>(ext.get("length"));
      length && length.getInt() >= 0 && length.getInt() != bytes) {
    init.emitError() << "initializer '" << init.getName() << "': its external data is "
                     << length.getInt() << " bytes, its shape needs " << bytes;
    return failure();
  }
  if (auto size = dyn_cast_or_null<IntegerAttr>(ext.get("file_bytes"));
      size && offset > size.getInt() - bytes) {
    init.emitError() << "initializer '" << init.getName() << "': its " << bytes
                     << " bytes at offset " << offset << " run past the end of " << path;
    return failure();
  }
  return std::pair(path, offset);
}

FailureOr<std::vector<float>> readInitializer(onnx::InitializerOp init) {
  auto type = init.getType();
  if (!type.getElementType().isF32()) {
    init.emitError() << "initializer '" << init.getName()
                     << "' is a parameter but not f32";
    return failure();
  }
  size_t n = size_t(type.getNumElements());
  if (ElementsAttr v = init.getValueAttr()) {
    std::vector<float> out(n);
    if (auto res = dyn_cast<DenseResourceElementsAttr>(v)) {
      ArrayRef<char> bytes = res.getRawHandle().getBlob()->getData();
      if (bytes.size() != n * 4)
        return failure();
      std::memcpy(out.data(), bytes.data(), n * 4);
      return out;
    }
    auto dense = cast<DenseElementsAttr>(v);
    size_t k = 0;
    for (APFloat f : dense.getValues<APFloat>())
      out[k++] = f.convertToFloat();
    return out;
  }
  if (!init.getExternalAttr()) {
    init.emitError() << "initializer '" << init.getName() << "' has no data";
    return failure();
  }
  FailureOr<std::pair<std::string, int64_t>> place = externalPlace(init);
  if (failed(place))
    return failure();
  std::vector<float> out(n);
  std::ifstream in(place->first, std::ios::binary);
  in.seekg(place->second);
  if (!in || !in.read(reinterpret_cast<char *>(out.data()), std::streamsize(n * 4))) {
    init.emitError() << "cannot read initializer '" << init.getName() << "' from "
                     << place->first;
    return failure();
  }
  return out;
}

std::optional<float> initializerElement(onnx::InitializerOp init, int64_t index) {
  auto type = init.getType();
  if (!type.getElementType().isF32() || index < 0 || index >= type.getNumElements())
    return std::nullopt;
  if (ElementsAttr v = init.getValueAttr()) {
    if (auto res = dyn_cast<DenseResourceElementsAttr>(v)) {
      ArrayRef<char> bytes = res.getRawHandle().getBlob()->getData();
      if (int64_t(bytes.size()) != type.getNumElements() * 4)
        return std::nullopt;
      float f;
      std::memcpy(&f, bytes.data() + index * 4, 4);
      return f;
    }
    if (auto dense = dyn_cast<DenseElementsAttr>(v))
      return (*(dense.getValues<APFloat>().begin() + index)).convertToFloat();
    return std::nullopt;
  }
  if (!init.getExternalAttr())
    return std::nullopt;
  ScopedDiagnosticHandler quiet(init.getContext(), [](Diagnostic &) { return success(); });
  FailureOr<std::pair<std::string, int64_t>> place = externalPlace(init);
  if (failed(place))
    return std::nullopt;
  std::ifstream in(place->first, std::ios::binary);
  in.seekg(place->second + index * 4);
  float f;
  if (!in || !in.read(reinterpret_cast<char *>(&f), 4))
    return std::nullopt;
  return f;
}

} // namespace tessera::onnx_to_nn
