//===- OnnxSemantics.cpp - Type rules and evaluators of ONNX ops ----------===//
//
// A row per ONNX op type (kRules at the end): its type rule and, for the
// ops that shape arithmetic, masks and constant tables are made of, its
// evaluator. Values are evaluated in the op's element type (f32 results
// rounded to f32 after each op, as a runtime computes them); integers
// exactly in 64 bits.
//
//===----------------------------------------------------------------------===//

#include "dialects/onnx/IR/OnnxSemantics.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringMap.h"

#include <cmath>
#include <limits>
#include <functional>
#include <numeric>
#include <type_traits>

using namespace mlir;
using namespace tessera::onnx;

//===----------------------------------------------------------------------===//
// NodeView
//===----------------------------------------------------------------------===//

int64_t NodeView::getInt(StringRef name, int64_t dflt) const {
  auto a = attrs ? dyn_cast_or_null<IntegerAttr>(attrs.get(name)) : nullptr;
  return a ? a.getInt() : dflt;
}

std::optional<float> NodeView::getFloat(StringRef name) const {
  auto a = attrs ? dyn_cast_or_null<FloatAttr>(attrs.get(name)) : nullptr;
  if (!a)
    return std::nullopt;
  return float(a.getValueAsDouble());
}

std::optional<SmallVector<int64_t>> NodeView::getInts(StringRef name) const {
  auto a = attrs ? dyn_cast_or_null<DenseI64ArrayAttr>(attrs.get(name)) : nullptr;
  if (!a)
    return std::nullopt;
  return SmallVector<int64_t>(a.asArrayRef());
}

Type tessera::onnx::elementTypeOf(MLIRContext *ctx, int32_t onnxType) {
  Builder b(ctx);
  switch (onnxType) {
  case 1: return b.getF32Type();
  case 2: return IntegerType::get(ctx, 8, IntegerType::Unsigned);
  case 3: return b.getIntegerType(8);
  case 5: return b.getIntegerType(16);
  case 6: return b.getI32Type();
  case 7: return b.getI64Type();
  case 9: return b.getI1Type();
  case 10: return b.getF16Type();
  case 11: return b.getF64Type();
  case 16: return b.getBF16Type();
  default: return nullptr;
  }
}

//===----------------------------------------------------------------------===//
// Literals: a known value, its elements as doubles or as 64-bit integers
//===----------------------------------------------------------------------===//

namespace {

struct Lit {
  Type elem;
  SmallVector<int64_t> shape;
  std::vector<double> f;  ///< float element types
  std::vector<int64_t> i; ///< integer and bool element types

  bool isFloat() const { return isa<FloatType>(elem); }
  int64_t size() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t(1),
                           std::multiplies<int64_t>());
  }
  double asDouble(int64_t k) const {
    return isFloat() ? f[size_t(k)] : double(i[size_t(k)]);
  }
  /// Set when a value could not be represented (a non-finite or
  /// out-of-range float made an integer): the result is not folded.
  mutable bool invalid = false;

  /// A float as an integer, or `invalid` for NaN, infinities and values
  /// out of the 64-bit range (their conversion is undefined in C++).
  int64_t toInt(double v) const {
    if (!std::isfinite(v) || v < -9.2233720368547758e18 || v >= 9.2233720368547758e18) {
      invalid = true;
      return 0;
    }
    return int64_t(v);
  }
  int64_t asInt(int64_t k) const {
    return isFloat() ? toInt(f[size_t(k)]) : i[size_t(k)];
  }
  static Lit like(Type elem, ArrayRef<int64_t> shape) {
    Lit l;
    l.elem = elem;
    l.shape.assign(shape.begin(), shape.end());
    if (l.isFloat())
      l.f.resize(size_t(l.size()));
    else
      l.i.resize(size_t(l.size()));
    return l;
  }
  /// Stores `v` at k, rounded to the element type.
  void set(int64_t k, double v) {
    if (isFloat())
      f[size_t(k)] = round(v);
    else
      i[size_t(k)] = elem.isInteger(1) ? int64_t(v != 0) : toInt(v);
  }
  void setInt(int64_t k, int64_t v) {
    if (isFloat())
      f[size_t(k)] = round(double(v));
    else
      i[size_t(k)] = elem.isInteger(1) ? int64_t(v != 0) : v;
  }
  double round(double v) const {
    if (elem.isF32())
      return double(float(v));
    if (elem.isF64())
      return v;
    APFloat a(v);
    bool lost;
    a.convert(cast<FloatType>(elem).getFloatSemantics(),
              APFloat::rmNearestTiesToEven, &lost);
    a.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &lost);
    return a.convertToDouble();
  }
};

bool isSigned(Type t) {
  auto it = dyn_cast<IntegerType>(t);
  return it && !it.isUnsigned();
}

std::optional<Lit> toLit(ElementsAttr attr) {
  if (!attr)
    return std::nullopt;
  auto type = dyn_cast<RankedTensorType>(attr.getType());
  if (!type || !type.hasStaticShape())
    return std::nullopt;
  Type elem = type.getElementType();
  if (!isa<FloatType, IntegerType>(elem))
    return std::nullopt;
  Lit l = Lit::like(elem, type.getShape());
  if (auto dense = dyn_cast<DenseElementsAttr>(attr)) {
    int64_t k = 0;
    if (l.isFloat()) {
      for (APFloat v : dense.getValues<APFloat>()) {
        bool lost;
        v.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &lost);
        l.f[size_t(k++)] = v.convertToDouble();
      }
    } else {
      for (APInt v : dense.getValues<APInt>())
        l.i[size_t(k++)] = elem.isInteger(1) ? int64_t(v.getBoolValue())
                           : isSigned(elem)  ? v.getSExtValue()
                                             : int64_t(v.getZExtValue());
    }
    return l;
  }
  auto resource = dyn_cast<DenseResourceElementsAttr>(attr);
  if (!resource || !resource.getRawHandle().getBlob())
    return std::nullopt;
  ArrayRef<char> bytes = resource.getRawHandle().getBlob()->getData();
  unsigned width = elem.isInteger(1) ? 8 : elem.getIntOrFloatBitWidth();
  if (int64_t(bytes.size()) != l.size() * (width / 8))
    return std::nullopt;
  const char *p = bytes.data();
  for (int64_t k = 0; k < l.size(); ++k, p += width / 8) {
    if (elem.isF32()) {
      float v;
      std::memcpy(&v, p, 4);
      l.f[size_t(k)] = v;
    } else if (elem.isF64()) {
      std::memcpy(&l.f[size_t(k)], p, 8);
    } else if (l.isFloat()) {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      APFloat v(cast<FloatType>(elem).getFloatSemantics(), APInt(16, bits));
      bool lost;
      v.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &lost);
      l.f[size_t(k)] = v.convertToDouble();
    } else {
      int64_t v = 0;
      switch (width) {
      case 8: v = isSigned(elem) ? int64_t(int8_t(*p)) : int64_t(uint8_t(*p)); break;
      case 16: { int16_t x; std::memcpy(&x, p, 2); v = x; break; }
      case 32: { int32_t x; std::memcpy(&x, p, 4); v = x; break; }
      case 64: std::memcpy(&v, p, 8); break;
      default: return std::nullopt;
      }
      l.i[size_t(k)] = elem.isInteger(1) ? int64_t(v != 0) : v;
    }
  }
  return l;
}

ElementsAttr fromLit(const Lit &l) {
  auto type = RankedTensorType::get(l.shape, l.elem);
  if (l.elem.isF32()) {
    std::vector<float> v(l.f.begin(), l.f.end());
    return DenseElementsAttr::get(type, ArrayRef<float>(v));
  }
  if (l.elem.isF64())
    return DenseElementsAttr::get(type, ArrayRef<double>(l.f));
  if (l.isFloat()) {
    SmallVector<APFloat> v;
    for (double x : l.f) {
      APFloat a(x);
      bool lost;
      a.convert(cast<FloatType>(l.elem).getFloatSemantics(),
                APFloat::rmNearestTiesToEven, &lost);
      v.push_back(a);
    }
    return DenseElementsAttr::get(type, v);
  }
  if (l.elem.isInteger(1)) {
    SmallVector<bool> v(l.i.begin(), l.i.end());
    return DenseElementsAttr::get(type, ArrayRef<bool>(v));
  }
  unsigned width = l.elem.getIntOrFloatBitWidth();
  SmallVector<APInt> v;
  for (int64_t x : l.i)
    v.push_back(APInt(width, uint64_t(x), /*isSigned=*/true, /*implicitTrunc=*/true));
  return DenseElementsAttr::get(type, v);
}

SmallVector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> s(shape.size(), 1);
  for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d)
    s[size_t(d)] = s[size_t(d + 1)] * shape[size_t(d + 1)];
  return s;
}

/// Numpy broadcasting of shapes (dynamic dims allowed); nullopt when they
/// do not broadcast.
std::optional<SmallVector<int64_t>> broadcast(ArrayRef<ArrayRef<int64_t>> shapes) {
  size_t rank = 0;
  for (ArrayRef<int64_t> s : shapes)
    rank = std::max(rank, s.size());
  SmallVector<int64_t> out(rank, 1);
  for (ArrayRef<int64_t> s : shapes)
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t &o = out[rank - s.size() + k];
      int64_t d = s[k];
      if (d == 1)
        continue;
      if (o == 1 || o == d)
        o = d;
      else if (ShapedType::isDynamic(o))
        o = d;
      else if (!ShapedType::isDynamic(d))
        return std::nullopt;
    }
  return out;
}

/// For each element of `out`, the index into a broadcast operand of
/// `shape`.
std::vector<int64_t> broadcastIndex(ArrayRef<int64_t> shape, ArrayRef<int64_t> out) {
  int64_t n = std::accumulate(out.begin(), out.end(), int64_t(1),
                              std::multiplies<int64_t>());
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  SmallVector<int64_t> inStrides = stridesOf(shape);
  size_t off = out.size() - shape.size();
  SmallVector<int64_t> counter(out.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t at = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1)
        at += counter[off + d] * inStrides[d];
    idx[size_t(k)] = at;
    for (int64_t d = int64_t(out.size()) - 1; d >= 0; --d) {
      if (++counter[size_t(d)] < out[size_t(d)])
        break;
      counter[size_t(d)] = 0;
    }
  }
  return idx;
}

RankedTensorType ranked(Type t) { return dyn_cast_or_null<RankedTensorType>(t); }

Type elemOf(Type t) {
  auto tt = dyn_cast_or_null<TensorType>(t);
  return tt ? tt.getElementType() : nullptr;
}

/// A tensor type of `elem` with `shape`, or unranked without one.
Type tensorOf(Type elem, std::optional<ArrayRef<int64_t>> shape) {
  if (!elem)
    return nullptr;
  if (!shape)
    return UnrankedTensorType::get(elem);
  // A negative size (a malformed model) has no type; the caller reports it.
  if (llvm::any_of(*shape, [](int64_t d) { return d < 0 && !ShapedType::isDynamic(d); }))
    return nullptr;
  return RankedTensorType::get(*shape, elem);
}

int64_t normAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

/// The largest rank a value may have (a malformed model's shape input of a
/// billion elements must not size a vector).
constexpr int64_t kMaxRank = 64;

//===----------------------------------------------------------------------===//
// Rules
//===----------------------------------------------------------------------===//

using TypeRule = std::function<LogicalResult(MLIRContext *, const NodeView &,
                                             SmallVector<Type> &, std::string &)>;
using Evaluator = std::function<std::optional<SmallVector<Lit>>(
    MLIRContext *, const NodeView &, ArrayRef<Lit>, ArrayRef<Type>)>;

struct Rule {
  TypeRule types;
  Evaluator eval;
};

/// Result 0 has input 0's type.
LogicalResult sameAsInput(MLIRContext *, const NodeView &n, SmallVector<Type> &out,
                          std::string &) {
  out[0] = n.inputTypes.empty() ? nullptr : n.inputTypes[0];
  return success();
}

/// Result 0 is the broadcast of every input; element type of input
/// `elemFrom`, or `elem` when given.
LogicalResult broadcastRule(const NodeView &n, SmallVector<Type> &out,
                            unsigned elemFrom, Type elem, std::string &error) {
  SmallVector<ArrayRef<int64_t>> shapes;
  bool allRanked = true;
  for (Type t : n.inputTypes) {
    if (auto r = ranked(t))
      shapes.push_back(r.getShape());
    else
      allRanked = false;
  }
  if (!elem && elemFrom < n.inputTypes.size())
    elem = elemOf(n.inputTypes[elemFrom]);
  if (!allRanked) {
    out[0] = tensorOf(elem, std::nullopt);
    return success();
  }
  std::optional<SmallVector<int64_t>> shape = broadcast(shapes);
  if (!shape) {
    error = "its inputs' shapes do not broadcast";
    return failure();
  }
  out[0] = tensorOf(elem, ArrayRef<int64_t>(*shape));
  return success();
}

std::optional<SmallVector<Lit>> one(Lit l) { return SmallVector<Lit>{std::move(l)}; }

/// Elementwise evaluation over broadcast operands.
/// The most elements an evaluation computes (a broadcast of two known
/// values can be far larger than either).
constexpr int64_t kEvalCap = int64_t(1) << 27;

bool withinCap(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > kEvalCap / d))
      return false;
    n *= d;
  }
  return n <= kEvalCap;
}

/// Elementwise evaluation over broadcast operands, in doubles (float
/// element types) or exactly in 64-bit integers.
template <typename T>
std::optional<SmallVector<Lit>> elementwiseOf(ArrayRef<Lit> in, Type resultElem,
                                              const std::function<T(ArrayRef<T>)> &fn) {
  SmallVector<ArrayRef<int64_t>> shapes;
  for (const Lit &l : in)
    shapes.push_back(l.shape);
  std::optional<SmallVector<int64_t>> shape = broadcast(shapes);
  if (!shape || !withinCap(*shape))
    return std::nullopt;
  Lit out = Lit::like(resultElem, *shape);
  std::vector<std::vector<int64_t>> idx;
  for (const Lit &l : in)
    idx.push_back(broadcastIndex(l.shape, *shape));
  SmallVector<T> args(in.size());
  for (int64_t k = 0; k < out.size(); ++k) {
    for (size_t a = 0; a < in.size(); ++a) {
      int64_t at = idx[a][size_t(k)];
      if constexpr (std::is_same_v<T, double>)
        args[a] = in[a].asDouble(at);
      else
        args[a] = in[a].asInt(at);
    }
    if constexpr (std::is_same_v<T, double>)
      out.set(k, fn(args));
    else
      out.setInt(k, fn(args));
  }
  return one(std::move(out));
}

std::optional<SmallVector<Lit>>
elementwise(ArrayRef<Lit> in, Type resultElem,
            const std::function<double(ArrayRef<double>)> &fn) {
  return elementwiseOf<double>(in, resultElem, fn);
}

std::optional<SmallVector<Lit>>
elementwiseInt(ArrayRef<Lit> in, Type resultElem,
               const std::function<int64_t(ArrayRef<int64_t>)> &fn) {
  return elementwiseOf<int64_t>(in, resultElem, fn);
}

Rule unary(std::function<double(double)> fn) {
  return Rule{sameAsInput, [fn](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
                                ArrayRef<Type>) {
                return elementwise(in.take_front(1), in[0].elem,
                                   [&](ArrayRef<double> a) { return fn(a[0]); });
              }};
}

Rule arith(std::function<double(double, double)> f,
           std::function<int64_t(int64_t, int64_t)> i) {
  return Rule{
      [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
        return broadcastRule(n, out, 0, nullptr, e);
      },
      [f, i](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
             ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
        if (in.size() != 2 || in[0].elem != in[1].elem)
          return std::nullopt;
        if (in[0].isFloat())
          return elementwise(in, in[0].elem,
                             [&](ArrayRef<double> a) { return f(a[0], a[1]); });
        if (!i)
          return std::nullopt;
        return elementwiseInt(in, in[0].elem,
                              [&](ArrayRef<int64_t> a) { return i(a[0], a[1]); });
      }};
}

Rule compare(std::function<bool(double, double)> fn) {
  return Rule{
      [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &e) {
        return broadcastRule(n, out, 0, IntegerType::get(ctx, 1), e);
      },
      [fn](MLIRContext *ctx, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
        if (in.size() != 2)
          return std::nullopt;
        if (!in[0].isFloat() && !in[1].isFloat())
          return elementwiseInt(in, IntegerType::get(ctx, 1), [&](ArrayRef<int64_t> a) {
            return int64_t(fn(double(a[0] > a[1]) - double(a[0] < a[1]), 0));
          });
        return elementwise(in, IntegerType::get(ctx, 1),
                           [&](ArrayRef<double> a) { return double(fn(a[0], a[1])); });
      }};
}

Rule logical(std::function<bool(bool, bool)> fn) {
  return Rule{
      [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &e) {
        return broadcastRule(n, out, 0, IntegerType::get(ctx, 1), e);
      },
      [fn](MLIRContext *ctx, const NodeView &, ArrayRef<Lit> in, ArrayRef<Type>) {
        return elementwiseInt(in, IntegerType::get(ctx, 1), [&](ArrayRef<int64_t> a) {
          return int64_t(fn(a[0] != 0, a.size() > 1 && a[1] != 0));
        });
      }};
}

/// The axes a Reduce*/Squeeze/Unsqueeze node names: the `axes` attribute
/// (older opsets) or input 1; nullopt when not known.
std::optional<SmallVector<int64_t>> axesOf(const NodeView &n) {
  if (auto a = n.getInts("axes"))
    return a;
  if (n.has(1))
    return n.intsOf(1);
  return SmallVector<int64_t>();
}

LogicalResult reduceRule(MLIRContext *, const NodeView &n, SmallVector<Type> &out,
                         std::string &) {
  auto in = ranked(n.inputTypes[0]);
  Type elem = elemOf(n.inputTypes[0]);
  std::optional<SmallVector<int64_t>> axes = axesOf(n);
  if (!in || !axes) {
    out[0] = tensorOf(elem, std::nullopt);
    return success();
  }
  bool keep = n.getInt("keepdims", 1) != 0;
  if (axes->empty() && n.getInt("noop_with_empty_axes", 0)) {
    out[0] = in;
    return success();
  }
  SmallVector<bool> reduced(size_t(in.getRank()), axes->empty());
  for (int64_t a : *axes)
    reduced[size_t(normAxis(a, in.getRank()))] = true;
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (!reduced[size_t(d)])
      shape.push_back(in.getDimSize(d));
    else if (keep)
      shape.push_back(1);
  out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
  return success();
}

/// Reshape's output shape for input shape `in` and target `target`.
std::optional<SmallVector<int64_t>> reshapeTo(ArrayRef<int64_t> in,
                                              ArrayRef<int64_t> target,
                                              bool allowZero) {
  SmallVector<int64_t> shape;
  int64_t known = 1, inferAt = -1;
  for (size_t k = 0; k < target.size(); ++k) {
    int64_t d = target[k];
    if (d == 0 && !allowZero) {
      if (k >= in.size())
        return std::nullopt;
      d = in[k];
    }
    if (d == -1) {
      if (inferAt >= 0)
        return std::nullopt;
      inferAt = int64_t(k);
      shape.push_back(ShapedType::kDynamic);
      continue;
    }
    if (ShapedType::isDynamic(d))
      known = -1;
    else if (known >= 0)
      known *= d;
    shape.push_back(d);
  }
  bool staticIn = llvm::none_of(in, [](int64_t d) { return ShapedType::isDynamic(d); });
  int64_t total = std::accumulate(in.begin(), in.end(), int64_t(1),
                                  std::multiplies<int64_t>());
  if (inferAt >= 0 && known > 0 && staticIn) {
    if (total % known != 0)
      return std::nullopt;
    shape[size_t(inferAt)] = total / known;
  }
  // Both sides static: the same number of elements.
  if (inferAt < 0 && known >= 0 && staticIn && known != total)
    return std::nullopt;
  return shape;
}

/// Slice's per-axis (start, end, step), clamped as ONNX does, for a
/// static dim.
void sliceBounds(int64_t dim, int64_t &start, int64_t &end, int64_t step) {
  auto clamp = [&](int64_t v, int64_t lo, int64_t hi) {
    return std::max(lo, std::min(hi, v));
  };
  if (start < 0)
    start += dim;
  if (end < 0)
    end += dim;
  if (step > 0) {
    start = clamp(start, 0, dim);
    end = clamp(end, 0, dim);
  } else {
    start = clamp(start, 0, dim - 1);
    end = clamp(end, -1, dim - 1);
  }
}

int64_t sliceLength(int64_t start, int64_t end, int64_t step) {
  // start and end are clamped to [-1, dim]: only the step can be extreme.
  if (step > 0)
    return end <= start ? 0 : 1 + (end - start - 1) / step;
  return start <= end ? 0 : 1 + (start - end - 1) / -step;
}

struct SliceSpec {
  SmallVector<int64_t> starts, ends, axes, steps;
};

std::optional<SliceSpec> sliceSpecOf(const NodeView &n, int64_t rank) {
  SliceSpec s;
  auto starts = n.intsOf(1), ends = n.intsOf(2);
  if (!starts || !ends || starts->size() != ends->size())
    return std::nullopt;
  s.starts = *starts;
  s.ends = *ends;
  if (n.has(3)) {
    auto axes = n.intsOf(3);
    if (!axes)
      return std::nullopt;
    s.axes = *axes;
  } else {
    for (size_t k = 0; k < starts->size(); ++k)
      s.axes.push_back(int64_t(k));
  }
  if (n.has(4)) {
    auto steps = n.intsOf(4);
    if (!steps)
      return std::nullopt;
    s.steps = *steps;
  } else {
    s.steps.assign(starts->size(), 1);
  }
  if (s.axes.size() != s.starts.size() || s.steps.size() != s.starts.size())
    return std::nullopt;
  SmallVector<bool> seen(size_t(rank), false);
  for (int64_t &a : s.axes) {
    a = normAxis(a, rank);
    if (a < 0 || a >= rank || seen[size_t(a)])
      return std::nullopt;
    seen[size_t(a)] = true;
  }
  for (int64_t st : s.steps)
    if (st == 0 || st == std::numeric_limits<int64_t>::min())
      return std::nullopt;
  return s;
}

/// Gathers elements of `in` at the multi-index `fn(outIndex)` for every
/// element of an output of `shape`.
Lit gatherBy(const Lit &in, ArrayRef<int64_t> shape,
             const std::function<int64_t(ArrayRef<int64_t>)> &source) {
  Lit out = Lit::like(in.elem, shape);
  SmallVector<int64_t> counter(shape.size(), 0);
  for (int64_t k = 0; k < out.size(); ++k) {
    int64_t from = source(counter);
    if (in.isFloat())
      out.f[size_t(k)] = in.f[size_t(from)];
    else
      out.i[size_t(k)] = in.i[size_t(from)];
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      if (++counter[size_t(d)] < shape[size_t(d)])
        break;
      counter[size_t(d)] = 0;
    }
  }
  return out;
}

Lit reshaped(Lit l, ArrayRef<int64_t> shape) {
  l.shape.assign(shape.begin(), shape.end());
  return l;
}

const llvm::StringMap<Rule> &rules() {
  static const llvm::StringMap<Rule> table = [] {
    llvm::StringMap<Rule> r;
    auto rem = [](int64_t a, int64_t b) -> int64_t {
      return !b || (b == -1 && a == std::numeric_limits<int64_t>::min()) ? 0 : a % b;
    };
    r["Add"] = arith([](double a, double b) { return a + b; },
                     [](int64_t a, int64_t b) { return a + b; });
    r["Sub"] = arith([](double a, double b) { return a - b; },
                     [](int64_t a, int64_t b) { return a - b; });
    r["Mul"] = arith([](double a, double b) { return a * b; },
                     [](int64_t a, int64_t b) { return a * b; });
    r["Div"] = arith([](double a, double b) { return a / b; },
                     [](int64_t a, int64_t b) -> int64_t {
                       // ONNX integer Div truncates toward zero, as C++ does.
                       if (!b || (b == -1 && a == std::numeric_limits<int64_t>::min()))
                         return 0;
                       return a / b;
                     });
    r["Mod"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          return broadcastRule(n, out, 0, nullptr, e);
        },
        [rem](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
              ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          if (in.size() != 2 || in[0].elem != in[1].elem)
            return std::nullopt;
          bool fmod = n.getInt("fmod", 0) != 0;
          if (in[0].isFloat()) {
            if (!fmod) // float Mod needs fmod=1
              return std::nullopt;
            return elementwise(in, in[0].elem,
                               [](ArrayRef<double> a) { return std::fmod(a[0], a[1]); });
          }
          // fmod=0: the remainder takes the divisor's sign (Python's %).
          return elementwiseInt(in, in[0].elem, [&](ArrayRef<int64_t> a) {
            int64_t r = rem(a[0], a[1]);
            if (!fmod && r != 0 && ((r < 0) != (a[1] < 0)))
              r += a[1];
            return r;
          });
        }};
    r["Pow"] = Rule{[](MLIRContext *, const NodeView &n, SmallVector<Type> &out,
                       std::string &e) { return broadcastRule(n, out, 0, nullptr, e); },
                    [](MLIRContext *, const NodeView &, ArrayRef<Lit> in, ArrayRef<Type>) {
                      return elementwise(in, in[0].elem, [](ArrayRef<double> a) {
                        return std::pow(a[0], a[1]);
                      });
                    }};
    r["Max"] = arith([](double a, double b) { return std::max(a, b); },
                     [](int64_t a, int64_t b) { return std::max(a, b); });
    r["Min"] = arith([](double a, double b) { return std::min(a, b); },
                     [](int64_t a, int64_t b) { return std::min(a, b); });
    r["Equal"] = compare([](double a, double b) { return a == b; });
    r["Less"] = compare([](double a, double b) { return a < b; });
    r["LessOrEqual"] = compare([](double a, double b) { return a <= b; });
    r["Greater"] = compare([](double a, double b) { return a > b; });
    r["GreaterOrEqual"] = compare([](double a, double b) { return a >= b; });
    r["And"] = logical([](bool a, bool b) { return a && b; });
    r["Or"] = logical([](bool a, bool b) { return a || b; });
    r["Xor"] = logical([](bool a, bool b) { return a != b; });
    r["Not"] = logical([](bool a, bool) { return !a; });
    r["Neg"] = unary([](double x) { return -x; });
    r["Abs"] = unary([](double x) { return std::abs(x); });
    r["Sqrt"] = unary([](double x) { return std::sqrt(x); });
    r["Reciprocal"] = unary([](double x) { return 1.0 / x; });
    r["Exp"] = unary([](double x) { return std::exp(x); });
    r["Log"] = unary([](double x) { return std::log(x); });
    r["Cos"] = unary([](double x) { return std::cos(x); });
    r["Sin"] = unary([](double x) { return std::sin(x); });
    r["Floor"] = unary([](double x) { return std::floor(x); });
    r["Ceil"] = unary([](double x) { return std::ceil(x); });
    r["Tanh"] = unary([](double x) { return std::tanh(x); });
    r["Erf"] = unary([](double x) { return std::erf(x); });
    r["Sigmoid"] = unary([](double x) { return 1.0 / (1.0 + std::exp(-x)); });
    r["Relu"] = unary([](double x) { return x > 0 ? x : 0.0; });
    r["Identity"] = Rule{sameAsInput, [](MLIRContext *, const NodeView &,
                                         ArrayRef<Lit> in, ArrayRef<Type>) {
                           return one(in[0]);
                         }};
    for (const char *op : {"Softmax", "LogSoftmax", "Trilu", "CumSum", "Gelu",
                           "RMSNormalization", "RotaryEmbedding", "SimplifiedLayerNormalization"})
      r[op] = Rule{sameAsInput, nullptr};
    r["Trilu"].eval = [](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
                         ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
      const Lit &x = in[0];
      if (x.shape.size() < 2)
        return std::nullopt;
      int64_t k = in.size() > 1 && in[1].size() == 1 ? in[1].asInt(0) : 0;
      bool upper = n.getInt("upper", 1) != 0;
      int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
      Lit out = x;
      for (int64_t e = 0; e < x.size(); ++e) {
        int64_t c = e % cols, rr = (e / cols) % rows;
        bool keep = upper ? c - rr >= k : c - rr <= k;
        if (!keep)
          out.setInt(e, 0);
      }
      return one(std::move(out));
    };
    for (const char *op : {"Clip", "Softplus", "HardSigmoid", "LeakyRelu", "Elu",
                           "Selu", "ScatterND", "ScatterElements", "Round", "Sign",
                           "Mish", "HardSwish", "Celu", "ThresholdedRelu"})
      r[op] = Rule{sameAsInput, nullptr};
    for (const char *op : {"IsNaN", "IsInf"})
      r[op] = Rule{[](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out,
                      std::string &) {
                     auto in = ranked(n.inputTypes[0]);
                     out[0] = tensorOf(IntegerType::get(ctx, 1),
                                       in ? std::optional<ArrayRef<int64_t>>(in.getShape())
                                          : std::nullopt);
                     return success();
                   },
                   nullptr};
    for (const char *op : {"Sum", "Mean"})
      r[op] = Rule{[](MLIRContext *, const NodeView &n, SmallVector<Type> &out,
                      std::string &e) { return broadcastRule(n, out, 0, nullptr, e); },
                   nullptr};
    r["GatherElements"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          Type elem = elemOf(n.inputTypes[0]);
          auto idx = ranked(n.inputTypes[1]);
          out[0] = tensorOf(elem, idx ? std::optional<ArrayRef<int64_t>>(idx.getShape())
                                      : std::nullopt);
          return success();
        },
        nullptr};
    r["TopK"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          Type i64 = IntegerType::get(ctx, 64);
          if (!in) {
            out[0] = tensorOf(elem, std::nullopt);
            if (out.size() > 1)
              out[1] = tensorOf(i64, std::nullopt);
            return success();
          }
          SmallVector<int64_t> shape(in.getShape());
          int64_t axis = normAxis(n.getInt("axis", -1), in.getRank());
          auto k = n.intsOf(1);
          shape[size_t(axis)] = k && k->size() == 1 ? (*k)[0] : ShapedType::kDynamic;
          out[0] = RankedTensorType::get(shape, elem);
          if (out.size() > 1)
            out[1] = RankedTensorType::get(shape, i64);
          return success();
        },
        nullptr};
    for (const char *op : {"ArgMax", "ArgMin"})
      r[op] = Rule{
          [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
            auto in = ranked(n.inputTypes[0]);
            Type i64 = IntegerType::get(ctx, 64);
            if (!in) {
              out[0] = tensorOf(i64, std::nullopt);
              return success();
            }
            int64_t axis = normAxis(n.getInt("axis", 0), in.getRank());
            SmallVector<int64_t> shape;
            for (int64_t d = 0; d < in.getRank(); ++d)
              if (d != axis)
                shape.push_back(in.getDimSize(d));
              else if (n.getInt("keepdims", 1))
                shape.push_back(1);
            out[0] = RankedTensorType::get(shape, i64);
            return success();
          },
          nullptr};
    r["OneHot"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto idx = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[2]);
          auto depth = n.intsOf(1);
          if (!idx) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          int64_t rank = idx.getRank() + 1;
          int64_t axis = normAxis(n.getInt("axis", -1), rank);
          SmallVector<int64_t> shape(idx.getShape());
          shape.insert(shape.begin() + axis,
                       depth && depth->size() == 1 ? (*depth)[0] : ShapedType::kDynamic);
          out[0] = RankedTensorType::get(shape, elem);
          return success();
        },
        nullptr};
    r["NonZero"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          out[0] = RankedTensorType::get(
              {in ? in.getRank() : ShapedType::kDynamic, ShapedType::kDynamic},
              IntegerType::get(ctx, 64));
          return success();
        },
        nullptr};
    r["Cast"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          Type elem = elementTypeOf(ctx, int32_t(n.getInt("to", 0)));
          if (!elem) {
            e = "casts to an unsupported element type (ONNX data type " +
                std::to_string(n.getInt("to", 0)) + ")";
            return failure();
          }
          auto in = ranked(n.inputTypes[0]);
          out[0] = tensorOf(elem, in ? std::optional<ArrayRef<int64_t>>(in.getShape())
                                     : std::nullopt);
          return success();
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          Type elem = elemOf(results[0]);
          Lit out = Lit::like(elem, in[0].shape);
          for (int64_t k = 0; k < out.size(); ++k) {
            if (in[0].isFloat())
              out.set(k, out.isFloat() ? in[0].f[size_t(k)]
                                       : std::trunc(in[0].f[size_t(k)]));
            else
              out.setInt(k, in[0].i[size_t(k)]);
          }
          return one(std::move(out));
        }};
    // CastLike(x, like): x in like's element type.
    r["CastLike"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          if (!n.has(1)) {
            e = "expected the tensor whose type to cast to";
            return failure();
          }
          auto in = ranked(n.inputTypes[0]);
          out[0] = tensorOf(elemOf(n.inputTypes[1]),
                            in ? std::optional<ArrayRef<int64_t>>(in.getShape()) : std::nullopt);
          return success();
        },
        [](MLIRContext *ctx, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          return rules().lookup("Cast").eval(ctx, n, in.take_front(1), results);
        }};
    r["Shape"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          Type i64 = IntegerType::get(ctx, 64);
          if (!in) {
            out[0] = RankedTensorType::get({ShapedType::kDynamic}, i64);
            return success();
          }
          int64_t rank = in.getRank();
          int64_t start = std::clamp<int64_t>(normAxis(n.getInt("start", 0), rank), 0, rank);
          int64_t end = std::clamp<int64_t>(normAxis(n.getInt("end", rank), rank), 0, rank);
          out[0] = RankedTensorType::get({std::max<int64_t>(0, end - start)}, i64);
          return success();
        },
        nullptr}; // evaluated from the input's type (evaluate() below)
    r["Size"] = Rule{[](MLIRContext *ctx, const NodeView &, SmallVector<Type> &out,
                        std::string &) {
                       out[0] = RankedTensorType::get({}, IntegerType::get(ctx, 64));
                       return success();
                     },
                     nullptr};
    r["Reshape"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          Type elem = elemOf(n.inputTypes[0]);
          auto in = ranked(n.inputTypes[0]);
          std::optional<SmallVector<int64_t>> target = n.intsOf(1);
          if (!target) {
            auto st = ranked(n.inputTypes[1]);
            if (st && st.hasStaticShape() && st.getRank() == 1 && st.getDimSize(0) <= kMaxRank)
              out[0] = RankedTensorType::get(
                  SmallVector<int64_t>(size_t(st.getDimSize(0)), ShapedType::kDynamic),
                  elem);
            else
              out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          SmallVector<int64_t> inShape;
          if (in)
            inShape.assign(in.getShape().begin(), in.getShape().end());
          else
            inShape.assign(target->size(), ShapedType::kDynamic);
          auto shape = reshapeTo(inShape, *target, n.getInt("allowzero", 0) != 0);
          if (!shape) {
            e = "its target shape does not fit its input";
            return failure();
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(*shape));
          return success();
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          auto t = ranked(results[0]);
          if (!t || !t.hasStaticShape())
            return std::nullopt;
          return one(reshaped(in[0], t.getShape()));
        }};
    auto reshapeEval = [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
                          ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
      auto t = ranked(results[0]);
      if (!t || !t.hasStaticShape())
        return std::nullopt;
      return one(reshaped(in[0], t.getShape()));
    };
    r["Unsqueeze"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          auto axes = axesOf(n);
          if (!in || !axes) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          int64_t rank = in.getRank() + int64_t(axes->size());
          SmallVector<bool> inserted(size_t(rank), false);
          for (int64_t a : *axes) {
            int64_t d = normAxis(a, rank);
            if (d < 0 || d >= rank || inserted[size_t(d)]) {
              e = "its axes repeat or are out of range";
              return failure();
            }
            inserted[size_t(d)] = true;
          }
          SmallVector<int64_t> shape;
          int64_t from = 0;
          for (int64_t d = 0; d < rank; ++d)
            shape.push_back(inserted[size_t(d)] ? 1 : in.getDimSize(from++));
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        reshapeEval};
    r["Squeeze"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          auto axes = axesOf(n);
          if (!in || !axes) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          SmallVector<bool> drop(size_t(in.getRank()), false);
          for (int64_t a : *axes) {
            int64_t d = normAxis(a, in.getRank());
            if (d < 0 || d >= in.getRank() ||
                (!in.isDynamicDim(d) && in.getDimSize(d) != 1)) {
              e = "it squeezes a dimension that is not 1";
              return failure();
            }
            drop[size_t(d)] = true;
          }
          SmallVector<int64_t> shape;
          for (int64_t d = 0; d < in.getRank(); ++d) {
            bool gone = axes->empty() ? in.getDimSize(d) == 1 : drop[size_t(d)];
            if (!gone)
              shape.push_back(in.getDimSize(d));
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        reshapeEval};
    r["Flatten"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!in) {
            out[0] = RankedTensorType::get({ShapedType::kDynamic, ShapedType::kDynamic}, elem);
            return success();
          }
          int64_t axis = normAxis(n.getInt("axis", 1), in.getRank());
          int64_t a = 1, b = 1;
          for (int64_t d = 0; d < in.getRank(); ++d) {
            int64_t &p = d < axis ? a : b;
            p = ShapedType::isDynamic(in.getDimSize(d)) || ShapedType::isDynamic(p)
                    ? ShapedType::kDynamic
                    : p * in.getDimSize(d);
          }
          out[0] = RankedTensorType::get({a, b}, elem);
          return success();
        },
        reshapeEval};
    r["Concat"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          Type elem = elemOf(n.inputTypes[0]);
          SmallVector<RankedTensorType> ins;
          for (Type t : n.inputTypes) {
            auto rt = ranked(t);
            if (!rt) {
              out[0] = tensorOf(elem, std::nullopt);
              return success();
            }
            ins.push_back(rt);
          }
          int64_t rank = ins[0].getRank();
          int64_t axis = normAxis(n.getInt("axis", 0), rank);
          SmallVector<int64_t> shape(ins[0].getShape());
          if (axis < 0 || axis >= rank) {
            e = "its axis is out of range";
            return failure();
          }
          shape[size_t(axis)] = 0;
          for (RankedTensorType t : ins) {
            if (t.getRank() != rank || t.getElementType() != elem) {
              e = "its inputs differ in rank or element type";
              return failure();
            }
            for (int64_t d = 0; d < rank; ++d)
              if (d != axis && !t.isDynamicDim(d) && !ins[0].isDynamicDim(d) &&
                  t.getDimSize(d) != ins[0].getDimSize(d)) {
                e = "its inputs differ in a dimension other than the axis";
                return failure();
              }
            int64_t d = t.getDimSize(axis);
            int64_t &s = shape[size_t(axis)];
            s = ShapedType::isDynamic(d) || ShapedType::isDynamic(s) ? ShapedType::kDynamic
                                                                     : s + d;
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        [](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          int64_t rank = int64_t(in[0].shape.size());
          int64_t axis = normAxis(n.getInt("axis", 0), rank);
          SmallVector<int64_t> shape = in[0].shape;
          shape[size_t(axis)] = 0;
          for (const Lit &l : in)
            shape[size_t(axis)] += l.shape[size_t(axis)];
          Lit out = Lit::like(in[0].elem, shape);
          int64_t outer = 1;
          for (int64_t d = 0; d < axis; ++d)
            outer *= shape[size_t(d)];
          int64_t k = 0;
          for (int64_t o = 0; o < outer; ++o)
            for (const Lit &l : in) {
              int64_t chunk = l.size() / std::max<int64_t>(outer, 1);
              for (int64_t c = 0; c < chunk; ++c, ++k)
                if (out.isFloat())
                  out.f[size_t(k)] = l.asDouble(o * chunk + c);
                else
                  out.i[size_t(k)] = l.asInt(o * chunk + c);
            }
          return one(std::move(out));
        }};
    r["Gather"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto data = ranked(n.inputTypes[0]);
          auto idx = ranked(n.inputTypes[1]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!data || !idx) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          int64_t axis = normAxis(n.getInt("axis", 0), data.getRank());
          SmallVector<int64_t> shape(data.getShape().take_front(size_t(axis)));
          llvm::append_range(shape, idx.getShape());
          llvm::append_range(shape, data.getShape().drop_front(size_t(axis + 1)));
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        [](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          const Lit &data = in[0], &idx = in[1];
          int64_t rank = int64_t(data.shape.size());
          int64_t axis = normAxis(n.getInt("axis", 0), rank);
          SmallVector<int64_t> shape(ArrayRef<int64_t>(data.shape).take_front(size_t(axis)));
          llvm::append_range(shape, idx.shape);
          llvm::append_range(shape, ArrayRef<int64_t>(data.shape).drop_front(size_t(axis + 1)));
          SmallVector<int64_t> strides = stridesOf(data.shape);
          int64_t idxRank = int64_t(idx.shape.size());
          SmallVector<int64_t> idxStrides = stridesOf(idx.shape);
          bool bad = false;
          Lit out = gatherBy(data, shape, [&](ArrayRef<int64_t> c) {
            int64_t at = 0;
            for (int64_t d = 0; d < axis; ++d)
              at += c[size_t(d)] * strides[size_t(d)];
            int64_t ii = 0;
            for (int64_t d = 0; d < idxRank; ++d)
              ii += c[size_t(axis + d)] * idxStrides[size_t(d)];
            int64_t v = idx.asInt(ii);
            int64_t dim = data.shape[size_t(axis)];
            if (v < 0)
              v += dim;
            if (v < 0 || v >= dim) {
              bad = true;
              v = 0;
            }
            at += v * strides[size_t(axis)];
            for (int64_t d = axis + 1; d < rank; ++d)
              at += c[size_t(d - 1 + idxRank)] * strides[size_t(d)];
            return at;
          });
          if (bad)
            return std::nullopt;
          return one(std::move(out));
        }};
    r["Transpose"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!in) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          SmallVector<int64_t> perm;
          if (auto p = n.getInts("perm"))
            perm = *p;
          else
            for (int64_t d = in.getRank() - 1; d >= 0; --d)
              perm.push_back(d);
          SmallVector<bool> seen(size_t(in.getRank()), false);
          if (int64_t(perm.size()) != in.getRank()) {
            e = "perm is not a permutation of its input's dimensions";
            return failure();
          }
          SmallVector<int64_t> shape;
          for (int64_t p : perm) {
            if (p < 0 || p >= in.getRank() || seen[size_t(p)]) {
              e = "perm is not a permutation of its input's dimensions";
              return failure();
            }
            seen[size_t(p)] = true;
            shape.push_back(in.getDimSize(p));
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        [](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          const Lit &x = in[0];
          int64_t rank = int64_t(x.shape.size());
          SmallVector<int64_t> perm;
          if (auto p = n.getInts("perm"))
            perm = *p;
          else
            for (int64_t d = rank - 1; d >= 0; --d)
              perm.push_back(d);
          SmallVector<int64_t> shape, strides = stridesOf(x.shape);
          for (int64_t p : perm)
            shape.push_back(x.shape[size_t(p)]);
          return one(gatherBy(x, shape, [&](ArrayRef<int64_t> c) {
            int64_t at = 0;
            for (int64_t d = 0; d < rank; ++d)
              at += c[size_t(d)] * strides[size_t(perm[size_t(d)])];
            return at;
          }));
        }};
    r["Slice"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!in) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          std::optional<SliceSpec> s = sliceSpecOf(n, in.getRank());
          SmallVector<int64_t> shape(in.getShape());
          if (!s) {
            // Which axes are sliced may be unknown: any dim may change.
            for (int64_t &d : shape)
              d = ShapedType::kDynamic;
            out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
            return success();
          }
          for (size_t k = 0; k < s->axes.size(); ++k) {
            int64_t a = s->axes[k];
            int64_t dim = shape[size_t(a)];
            if (ShapedType::isDynamic(dim)) {
              continue;
            }
            int64_t st = s->starts[k], en = s->ends[k];
            sliceBounds(dim, st, en, s->steps[k]);
            shape[size_t(a)] = sliceLength(st, en, s->steps[k]);
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        [](MLIRContext *, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          const Lit &x = in[0];
          int64_t rank = int64_t(x.shape.size());
          std::optional<SliceSpec> s = sliceSpecOf(n, rank);
          if (!s)
            return std::nullopt;
          SmallVector<int64_t> start(size_t(rank), 0), step(size_t(rank), 1),
              shape = x.shape;
          for (size_t k = 0; k < s->axes.size(); ++k) {
            int64_t a = s->axes[k];
            if (s->steps[k] == 0)
              return std::nullopt;
            int64_t st = s->starts[k], en = s->ends[k];
            sliceBounds(x.shape[size_t(a)], st, en, s->steps[k]);
            start[size_t(a)] = st;
            step[size_t(a)] = s->steps[k];
            shape[size_t(a)] = sliceLength(st, en, s->steps[k]);
          }
          SmallVector<int64_t> strides = stridesOf(x.shape);
          return one(gatherBy(x, shape, [&](ArrayRef<int64_t> c) {
            int64_t at = 0;
            for (int64_t d = 0; d < rank; ++d)
              at += (start[size_t(d)] + c[size_t(d)] * step[size_t(d)]) * strides[size_t(d)];
            return at;
          }));
        }};
    r["Expand"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          auto target = n.intsOf(1);
          if (!in || !target) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          auto shape = broadcast({in.getShape(), ArrayRef<int64_t>(*target)});
          if (!shape) {
            e = "its shape does not broadcast with its input";
            return failure();
          }
          out[0] = tensorOf(elem, ArrayRef<int64_t>(*shape));
          return success();
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          auto t = ranked(results[0]);
          if (!t || !t.hasStaticShape() || in[0].shape.size() > size_t(t.getRank()) ||
              broadcast({ArrayRef<int64_t>(in[0].shape), t.getShape()}) !=
                  std::optional<SmallVector<int64_t>>(SmallVector<int64_t>(t.getShape())))
            return std::nullopt;
          std::vector<int64_t> idx = broadcastIndex(in[0].shape, t.getShape());
          return one(gatherBy(in[0], t.getShape(), [&](ArrayRef<int64_t> c) {
            int64_t k = 0;
            SmallVector<int64_t> strides = stridesOf(t.getShape());
            for (size_t d = 0; d < c.size(); ++d)
              k += c[d] * strides[d];
            return idx[size_t(k)];
          }));
        }};
    r["Where"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          return broadcastRule(n, out, 1, nullptr, e);
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type>) -> std::optional<SmallVector<Lit>> {
          if (in[1].elem != in[2].elem)
            return std::nullopt;
          if (in[1].isFloat())
            return elementwise(in, in[1].elem, [](ArrayRef<double> a) {
              return a[0] != 0 ? a[1] : a[2];
            });
          return elementwiseInt(in, in[1].elem, [](ArrayRef<int64_t> a) {
            return a[0] != 0 ? a[1] : a[2];
          });
        }};
    r["Range"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          Type elem = elemOf(n.inputTypes[0]);
          int64_t len = ShapedType::kDynamic;
          auto s = n.intsOf(0), l = n.intsOf(1), d = n.intsOf(2);
          if (s && l && d && s->size() == 1 && l->size() == 1 && d->size() == 1 &&
              (*d)[0] != 0)
            len = std::max<int64_t>(
                0, ((*l)[0] - (*s)[0] + (*d)[0] - ((*d)[0] > 0 ? 1 : -1)) / (*d)[0]);
          out[0] = RankedTensorType::get({len}, elem);
          return success();
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          if (in.size() != 3 || in[0].size() != 1 || in[1].size() != 1 || in[2].size() != 1)
            return std::nullopt;
          double start = in[0].asDouble(0), limit = in[1].asDouble(0),
                 delta = in[2].asDouble(0);
          auto t = ranked(results[0]);
          double count = std::ceil((limit - start) / delta);
          if (delta == 0 || !std::isfinite(count) || !t || !t.hasStaticShape() ||
              std::max(0.0, count) != double(t.getDimSize(0)))
            return std::nullopt;
          int64_t n = t.getDimSize(0);
          Lit out = Lit::like(in[0].elem, {n});
          for (int64_t k = 0; k < n; ++k) {
            if (out.isFloat())
              out.set(k, start + double(k) * delta);
            else
              out.setInt(k, in[0].asInt(0) + k * in[2].asInt(0));
          }
          return one(std::move(out));
        }};
    r["ConstantOfShape"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          Type elem = Float32Type::get(ctx);
          if (auto v = n.attrs ? dyn_cast_or_null<ElementsAttr>(n.attrs.get("value"))
                               : nullptr)
            elem = v.getElementType();
          auto shape = n.intsOf(0);
          auto st = ranked(n.inputTypes[0]);
          if (shape && int64_t(shape->size()) <= kMaxRank)
            out[0] = RankedTensorType::get(*shape, elem);
          else if (st && st.hasStaticShape() && st.getRank() == 1 &&
                   st.getDimSize(0) <= kMaxRank)
            out[0] = RankedTensorType::get(
                SmallVector<int64_t>(size_t(st.getDimSize(0)), ShapedType::kDynamic), elem);
          else
            out[0] = UnrankedTensorType::get(elem);
          return success();
        },
        [](MLIRContext *ctx, const NodeView &n, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          auto t = ranked(results[0]);
          if (!t || !t.hasStaticShape())
            return std::nullopt;
          Lit out = Lit::like(t.getElementType(), t.getShape());
          if (auto v = n.attrs ? dyn_cast_or_null<ElementsAttr>(n.attrs.get("value"))
                               : nullptr) {
            std::optional<Lit> fill = toLit(v);
            if (!fill || fill->size() != 1 || fill->elem != out.elem)
              return std::nullopt;
            for (int64_t k = 0; k < out.size(); ++k)
              if (out.isFloat())
                out.f[size_t(k)] = fill->asDouble(0);
              else
                out.i[size_t(k)] = fill->asInt(0);
          }
          (void)ctx;
          (void)in;
          return one(std::move(out));
        }};
    r["MatMul"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto a = ranked(n.inputTypes[0]), b = ranked(n.inputTypes[1]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!a || !b) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          if (a.getRank() < 1 || b.getRank() < 1) {
            e = "MatMul of a scalar";
            return failure();
          }
          SmallVector<int64_t> as(a.getShape()), bs(b.getShape());
          bool aVec = as.size() == 1, bVec = bs.size() == 1;
          if (aVec)
            as.insert(as.begin(), 1);
          if (bVec)
            bs.push_back(1);
          int64_t k1 = as.back(), k2 = bs[bs.size() - 2];
          if (!ShapedType::isDynamic(k1) && !ShapedType::isDynamic(k2) && k1 != k2) {
            e = "its inputs' inner dimensions differ (" + std::to_string(k1) +
                " and " + std::to_string(k2) + ")";
            return failure();
          }
          auto batch = broadcast({ArrayRef<int64_t>(as).drop_back(2),
                                  ArrayRef<int64_t>(bs).drop_back(2)});
          if (!batch) {
            e = "its inputs' batch dimensions do not broadcast";
            return failure();
          }
          SmallVector<int64_t> shape = *batch;
          if (!aVec)
            shape.push_back(as[as.size() - 2]);
          if (!bVec)
            shape.push_back(bs.back());
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        [](MLIRContext *, const NodeView &, ArrayRef<Lit> in,
           ArrayRef<Type> results) -> std::optional<SmallVector<Lit>> {
          // Small constant products (rotary tables from inv_freq and the
          // positions); 2-D and batched with equal batch shapes.
          auto t = ranked(results[0]);
          const Lit &a = in[0], &b = in[1];
          if (!t || !t.hasStaticShape() || a.shape.size() < 2 || b.shape.size() < 2 ||
              !a.isFloat() || !b.isFloat())
            return std::nullopt;
          int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = b.shape.back();
          if (m <= 0 || k <= 0 || n <= 0 || b.shape[b.shape.size() - 2] != k)
            return std::nullopt;
          int64_t batches = t.getNumElements() / std::max<int64_t>(m * n, 1);
          int64_t aBatch = a.size() / (m * k), bBatch = b.size() / (k * n);
          if ((aBatch != 1 && aBatch != batches) || (bBatch != 1 && bBatch != batches))
            return std::nullopt;
          Lit out = Lit::like(a.elem, t.getShape());
          for (int64_t bt = 0; bt < batches; ++bt)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t p = 0; p < k; ++p)
                  acc += a.f[size_t((aBatch == 1 ? 0 : bt) * m * k + i * k + p)] *
                         b.f[size_t((bBatch == 1 ? 0 : bt) * k * n + p * n + j)];
                out.set(bt * m * n + i * n + j, acc);
              }
          return one(std::move(out));
        }};
    r["Gemm"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto a = ranked(n.inputTypes[0]), b = ranked(n.inputTypes[1]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!a || !b || a.getRank() != 2 || b.getRank() != 2) {
            out[0] = tensorOf(elem, std::nullopt);
            return success();
          }
          int64_t m = n.getInt("transA", 0) ? a.getDimSize(1) : a.getDimSize(0);
          int64_t nn = n.getInt("transB", 0) ? b.getDimSize(0) : b.getDimSize(1);
          out[0] = RankedTensorType::get({m, nn}, elem);
          return success();
        },
        nullptr};
    for (const char *op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                           "ReduceProd", "ReduceL2", "ReduceSumSquare"})
      r[op] = Rule{reduceRule, nullptr};
    r["Split"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &e) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          if (!in) {
            for (Type &t : out)
              t = tensorOf(elem, std::nullopt);
            return success();
          }
          int64_t axis = normAxis(n.getInt("axis", 0), in.getRank());
          std::optional<SmallVector<int64_t>> sizes = n.getInts("split");
          if (!sizes && n.has(1))
            sizes = n.intsOf(1);
          int64_t dim = in.getDimSize(axis);
          int64_t parts = int64_t(out.size());
          if (!sizes && !ShapedType::isDynamic(dim)) {
            // Equal parts; the last one smaller (num_outputs, opset 18).
            int64_t each = (dim + parts - 1) / parts;
            sizes = SmallVector<int64_t>();
            for (int64_t p = 0; p < parts; ++p)
              sizes->push_back(std::min(each, dim - p * each));
          }
          if (sizes && int64_t(sizes->size()) != parts) {
            e = "its split sizes do not match its outputs";
            return failure();
          }
          for (int64_t p = 0; p < parts; ++p) {
            SmallVector<int64_t> shape(in.getShape());
            shape[size_t(axis)] = sizes ? (*sizes)[size_t(p)] : ShapedType::kDynamic;
            out[size_t(p)] = tensorOf(elem, ArrayRef<int64_t>(shape));
          }
          return success();
        },
        nullptr};
    r["Dropout"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          out[0] = n.inputTypes[0];
          if (out.size() > 1) {
            auto in = ranked(n.inputTypes[0]);
            out[1] = tensorOf(IntegerType::get(ctx, 1),
                              in ? std::optional<ArrayRef<int64_t>>(in.getShape())
                                 : std::nullopt);
          }
          return success();
        },
        nullptr};
    r["LayerNormalization"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          out[0] = n.inputTypes[0];
          auto in = ranked(n.inputTypes[0]);
          for (size_t k = 1; k < out.size(); ++k) {
            if (!in) {
              out[k] = UnrankedTensorType::get(Float32Type::get(ctx));
              continue;
            }
            int64_t axis = normAxis(n.getInt("axis", -1), in.getRank());
            SmallVector<int64_t> shape(in.getShape());
            for (int64_t d = axis; d < in.getRank(); ++d)
              shape[size_t(d)] = 1;
            out[k] = RankedTensorType::get(shape, Float32Type::get(ctx));
          }
          return success();
        },
        nullptr};
    r["SoftmaxCrossEntropyLoss"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          Type elem = elemOf(n.inputTypes[0]);
          StringRef reduction = "mean";
          if (auto s = n.attrs ? dyn_cast_or_null<StringAttr>(n.attrs.get("reduction"))
                               : nullptr)
            reduction = s.getValue();
          if (reduction == "none") {
            auto labels = ranked(n.inputTypes[1]);
            out[0] = tensorOf(elem, labels ? std::optional<ArrayRef<int64_t>>(
                                                 labels.getShape())
                                           : std::nullopt);
          } else {
            out[0] = RankedTensorType::get({}, elem);
          }
          if (out.size() > 1)
            out[1] = n.inputTypes[0];
          return success();
        },
        nullptr};
    r["Pad"] = Rule{
        [](MLIRContext *, const NodeView &n, SmallVector<Type> &out, std::string &) {
          auto in = ranked(n.inputTypes[0]);
          Type elem = elemOf(n.inputTypes[0]);
          auto pads = n.has(1) ? n.intsOf(1) : n.getInts("pads");
          if (!in || !pads || n.has(3) ||
              int64_t(pads->size()) != 2 * in.getRank()) {
            out[0] = in ? RankedTensorType::get(
                              SmallVector<int64_t>(size_t(in.getRank()),
                                                   ShapedType::kDynamic),
                              elem)
                        : tensorOf(elem, std::nullopt);
            return success();
          }
          SmallVector<int64_t> shape(in.getShape());
          for (int64_t d = 0; d < in.getRank(); ++d)
            if (!ShapedType::isDynamic(shape[size_t(d)]))
              shape[size_t(d)] += (*pads)[size_t(d)] + (*pads)[size_t(d + in.getRank())];
          out[0] = tensorOf(elem, ArrayRef<int64_t>(shape));
          return success();
        },
        nullptr};
    r["Attention"] = Rule{
        [](MLIRContext *ctx, const NodeView &n, SmallVector<Type> &out, std::string &) {
          // Opset 23: Q [B, Sq, Hq*D] or [B, Hq, Sq, D]; V gives the value dim.
          auto q = ranked(n.inputTypes[0]), v = ranked(n.inputTypes[2]);
          Type elem = elemOf(n.inputTypes[0]);
          for (Type &t : out)
            t = UnrankedTensorType::get(elem ? elem : Float32Type::get(ctx));
          if (!q || !v)
            return success();
          if (q.getRank() == 4 && v.getRank() == 4) {
            out[0] = RankedTensorType::get(
                {q.getDimSize(0), q.getDimSize(1), q.getDimSize(2), v.getDimSize(3)}, elem);
          } else if (q.getRank() == 3 && v.getRank() == 3) {
            int64_t qh = n.getInt("q_num_heads", 0), kvh = n.getInt("kv_num_heads", 0);
            int64_t vd = ShapedType::kDynamic;
            if (qh > 0 && kvh > 0 && !ShapedType::isDynamic(v.getDimSize(2)))
              vd = v.getDimSize(2) / kvh * qh;
            out[0] = RankedTensorType::get({q.getDimSize(0), q.getDimSize(1), vd}, elem);
          }
          return success();
        },
        nullptr};
    return r;
  }();
  return table;
}

} // namespace

std::optional<SmallVector<int64_t>> NodeView::intsOf(unsigned i) const {
  if (!has(i) || i >= inputValues.size() || !inputValues[i])
    return std::nullopt;
  std::optional<Lit> l = toLit(inputValues[i]);
  if (!l || l->isFloat())
    return std::nullopt;
  return SmallVector<int64_t>(l->i.begin(), l->i.end());
}

bool tessera::onnx::hasTypeRule(StringRef opType) {
  return rules().count(opType) || opType == "Constant";
}

/// Axes the node names that are out of range for its input (a malformed
/// model must be an error, not an out-of-bounds index).
LogicalResult checkAxes(const NodeView &n, std::string &error) {
  auto in = n.inputTypes.empty() ? RankedTensorType() : ranked(n.inputTypes[0]);
  if (!in)
    return success();
  int64_t rank = in.getRank();
  auto outOfRange = [&](int64_t a, int64_t r) { return a < -r || a >= r; };
  // Unsqueeze's axes index its output, OneHot's its output too.
  int64_t extra = 0;
  std::optional<SmallVector<int64_t>> axes = n.getInts("axes");
  if (!axes && n.has(1) &&
      llvm::is_contained({"Unsqueeze", "Squeeze", "ReduceMean", "ReduceSum", "ReduceMax",
                          "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare"},
                         n.opType))
    axes = n.intsOf(1);
  if (n.opType == "Unsqueeze")
    extra = axes ? int64_t(axes->size()) : 0;
  if (n.opType == "OneHot")
    extra = 1;
  if (axes)
    for (int64_t a : *axes)
      if (outOfRange(a, rank + extra)) {
        error = "axis " + std::to_string(a) + " is out of range for rank " +
                std::to_string(rank + extra);
        return failure();
      }
  // The axis an op uses, given or by default, must exist (a scalar input
  // has none).
  static const llvm::StringMap<int64_t> defaultAxis = {
      {"Split", 0},      {"Gather", 0},     {"GatherElements", 0}, {"Softmax", -1},
      {"LogSoftmax", -1}, {"TopK", -1},      {"ArgMax", 0},         {"ArgMin", 0},
      {"LayerNormalization", -1},           {"RMSNormalization", -1}, {"OneHot", -1},
      {"Flatten", 1},    {"Concat", 0}};
  auto def = defaultAxis.find(n.opType);
  if (def != defaultAxis.end() || (n.attrs && n.attrs.get("axis") && n.opType != "Range")) {
    int64_t a = n.getInt("axis", def != defaultAxis.end() ? def->second : 0);
    // Flatten's axis may be the rank itself.
    int64_t limit = rank + extra + (n.opType == "Flatten" ? 1 : 0);
    if (outOfRange(a, limit) || (rank + extra == 0 && n.opType != "Flatten")) {
      error = "axis " + std::to_string(a) + " is out of range for rank " +
              std::to_string(rank + extra);
      return failure();
    }
  }
  if (n.opType == "Slice")
    if (auto steps = n.intsOf(4); steps && llvm::is_contained(*steps, 0)) {
      error = "a Slice step is 0";
      return failure();
    }
  if (n.opType == "Reshape")
    if (auto target = n.intsOf(1);
        target && llvm::any_of(*target, [](int64_t d) { return d < -1; })) {
      error = "its target shape has a dimension below -1";
      return failure();
    }
  return success();
}

FailureOr<SmallVector<Type>>
tessera::onnx::inferResultTypes(MLIRContext *ctx, const NodeView &node,
                                std::string &error) {
  SmallVector<Type> out(node.numResults, nullptr);
  auto it = rules().find(node.opType);
  if (it == rules().end())
    return out;
  if (node.inputTypes.empty() || node.numResults == 0) {
    error = "expected inputs and outputs";
    return failure();
  }
  if (llvm::any_of(node.inputTypes, [](Type t) { return !t; }))
    return out;
  // The inputs and outputs the rules read (the onnx checker does not run
  // on models newer than its opsets).
  static const llvm::StringMap<std::pair<unsigned, unsigned>> counts = {
      {"Gather", {2, 1}}, {"GatherElements", {2, 1}}, {"MatMul", {2, 1}},
      {"Gemm", {2, 1}}, {"Where", {3, 1}}, {"OneHot", {3, 1}}, {"Attention", {3, 1}},
      {"Range", {3, 1}}, {"Reshape", {2, 1}}, {"Expand", {2, 1}}, {"Add", {2, 1}},
      {"Sub", {2, 1}}, {"Mul", {2, 1}}, {"Div", {2, 1}}, {"Pow", {2, 1}},
      {"Mod", {2, 1}}, {"Equal", {2, 1}}, {"Less", {2, 1}}, {"LessOrEqual", {2, 1}},
      {"Greater", {2, 1}}, {"GreaterOrEqual", {2, 1}}, {"And", {2, 1}}, {"Or", {2, 1}},
      {"Xor", {2, 1}}, {"LayerNormalization", {2, 1}}, {"RMSNormalization", {2, 1}},
      {"SoftmaxCrossEntropyLoss", {2, 1}}, {"RotaryEmbedding", {3, 1}},
      {"TopK", {2, 1}}, {"Slice", {3, 1}}, {"ConstantOfShape", {1, 1}},
      {"Split", {1, 1}}};
  unsigned minInputs = 1, minOutputs = 1;
  if (auto c = counts.find(node.opType); c != counts.end()) {
    minInputs = c->second.first;
    minOutputs = c->second.second;
  }
  if (node.opType == "Slice" && node.opset < 10)
    minInputs = 1; // starts and ends were attributes
  unsigned present = 0;
  for (unsigned i = 0; i < node.inputTypes.size(); ++i)
    present += i < minInputs && node.has(i);
  if (present < minInputs || node.numResults < minOutputs) {
    error = "expected at least " + std::to_string(minInputs) + " input(s) and " +
            std::to_string(minOutputs) + " output(s)";
    return failure();
  }
  if (failed(checkAxes(node, error)) || failed(it->second.types(ctx, node, out, error)))
    return failure();
  for (Type t : out)
    if (auto r = ranked(t); r && llvm::any_of(r.getShape(), [](int64_t d) {
                              return d < 0 && !ShapedType::isDynamic(d);
                            })) {
      error = "its result would have a negative dimension";
      return failure();
    } else if (r && r.getRank() > kMaxRank) {
      error = "its result would have more than 64 dimensions";
      return failure();
    }
  return out;
}

SmallVector<ElementsAttr> tessera::onnx::evaluate(MLIRContext *ctx,
                                                  const NodeView &node,
                                                  ArrayRef<Type> resultTypes,
                                                  int64_t maxElements) {
  for (Type t : resultTypes) {
    auto r = ranked(t);
    if (!r || !r.hasStaticShape())
      return {};
    int64_t n = 1;
    for (int64_t d : r.getShape())
      if (d < 0 || (d > 0 && n > maxElements / d))
        return {};
      else
        n *= d;
    if (n > maxElements)
      return {};
  }
  if (resultTypes.empty() || node.inputTypes.empty())
    return {};
  // Shape and Size need only the input's (static) type.
  if (node.opType == "Shape" || node.opType == "Size") {
    auto in = ranked(node.inputTypes[0]);
    if (!in || !in.hasStaticShape())
      return {};
    Lit out = Lit::like(IntegerType::get(ctx, 64), cast<RankedTensorType>(resultTypes[0]).getShape());
    if (node.opType == "Size") {
      out.i[0] = in.getNumElements();
    } else {
      int64_t rank = in.getRank();
      int64_t start = std::clamp<int64_t>(normAxis(node.getInt("start", 0), rank), 0, rank);
      for (int64_t k = 0; k < out.size(); ++k)
        out.i[size_t(k)] = in.getDimSize(start + k);
    }
    return {fromLit(out)};
  }
  auto it = rules().find(node.opType);
  if (it == rules().end() || !it->second.eval)
    return {};
  SmallVector<Lit> in;
  for (size_t k = 0; k < node.inputTypes.size(); ++k) {
    if (!node.has(unsigned(k))) {
      continue;
    }
    if (k >= node.inputValues.size() || !node.inputValues[k] ||
        node.inputValues[k].getNumElements() > maxElements)
      return {};
    std::optional<Lit> l = toLit(node.inputValues[k]);
    if (!l || l->size() > maxElements)
      return {};
    in.push_back(std::move(*l));
  }
  if (in.empty())
    return {};
  std::optional<SmallVector<Lit>> out = it->second.eval(ctx, node, in, resultTypes);
  if (!out || out->size() != resultTypes.size())
    return {};
  SmallVector<ElementsAttr> values;
  for (size_t k = 0; k < out->size(); ++k) {
    const Lit &l = (*out)[k];
    auto r = ranked(resultTypes[k]);
    size_t stored = l.isFloat() ? l.f.size() : l.i.size();
    // A value that is not what its type says (a malformed model's shapes)
    // or could not be represented is not folded.
    if (r.getElementType() != l.elem || r.getShape() != ArrayRef<int64_t>(l.shape) ||
        int64_t(stored) != r.getNumElements() || l.invalid)
      return {};
    values.push_back(fromLit(l));
  }
  for (const Lit &l : in)
    if (l.invalid)
      return {};
  return values;
}
