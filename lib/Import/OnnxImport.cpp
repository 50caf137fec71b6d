//===- OnnxImport.cpp - ONNX model -> nn dialect --------------------------===//
//
// The importer is demand driven: it starts from the graph's output and
// materialises each value by matching the pattern whose last node produces
// it (a bias Add closes a linear, the final Reshape closes an attention, the
// outer Mul closes a GELU, ...). Every node a pattern covers is checked:
// op type, attributes, constants and the shapes ONNX shape inference gave.
// A value whose producer closes no pattern is an error naming that node, so
// nothing is imported that the nn function would compute differently.
//
// Layout. PyTorch activations are batch-major ([b, s, h]); Tessera's are
// Megatron's sequence-major [s, b, h]. Every recognised pattern works per
// token (or, for attention, per sequence), so the importer emits the nn ops
// on sequence-major values and makes the token inputs [s, b]; the baked
// batch size of the export (Reshape shape constants) is checked against the
// traced batch and replaced by the dynamic batch.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxImport.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/Import/OnnxGraph.h"
#include "tessera/Import/OnnxModel.h"
#include "tessera/Support/Model.h"

#include "dialects/onnx/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include "dialects/nn/IR/NNOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Path.h"

#include <array>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

using namespace mlir;
namespace nn = tessera::nn;
namespace onnx_model = tessera::onnx_model;
using OnnxAttr = tessera::onnx_model::Attribute;
using tessera::onnx_model::Model;
using tessera::onnx_model::Node;
using tessera::onnx_model::Tensor;
using tessera::onnx_model::ValueInfo;

bool tessera::isOnnxFile(llvm::StringRef path) {
  return llvm::sys::path::extension(path).equals_insensitive(".onnx");
}

namespace {

/// The minimum standard-domain opset: LayerNormalization is opset 17.
constexpr int64_t kMinOpset = 17;

/// Op types the importer knows, inside the patterns that use them.
const std::set<std::string> kSupportedOps = {
    "Add",       "Cast",     "Concat",  "Constant",   "Div",
    "Dropout",   "Erf",      "Gather",  "Gemm",       "Identity",
    "LayerNormalization",    "MatMul",  "Mul",        "Not",
    "Relu",      "Reshape",  "Shape",   "Softmax",    "SoftmaxCrossEntropyLoss",
    "Split",     "Squeeze",  "Transpose", "Trilu",    "Unsqueeze",
    "Where",     "Pow",      "ConstantOfShape", "Sub", "Sqrt", "Tanh",
    "Range"};

/// The decoder-layer index in a parameter or node-scope name
/// ("layers.3.mlp.linear_fc1.weight", "/layers.3/mlp/Add", "h.3.attn"), or
/// -1.
int64_t layerIndexOf(llvm::StringRef name) {
  llvm::SmallVector<llvm::StringRef> parts;
  while (!name.empty()) {
    size_t cut = name.find_first_of("./");
    parts.push_back(name.take_front(cut));
    name = cut == llvm::StringRef::npos ? llvm::StringRef() : name.drop_front(cut + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    llvm::StringRef p = parts[i];
    if (p != "layers" && p != "layer" && p != "h" && p != "blocks" &&
        p != "block")
      continue;
    int64_t index;
    if (!parts[i + 1].getAsInteger(10, index) && index >= 0)
      return index;
  }
  return -1;
}

/// Row r (head r / D, index r % D) of projection t (0 q, 1 k, 2 v) in
/// Megatron's fused QKV, whose rows are per head [q k v]: h * 3D + t * D + d.
int64_t perHeadRow(int64_t t, int64_t r, int64_t headDim) {
  return (r / headDim) * 3 * headDim + t * headDim + r % headDim;
}

/// An imported activation: its nn value and the decoder layer that made it.
struct Act {
  Value value;
  int64_t layer = -1;
};

/// A constant the patterns read (mask, scale, split sizes, positions).
struct Const {
  std::vector<int64_t> shape;
  std::vector<double> values;
};

/// How a parameter is used, for the one sharing Tessera supports (a word
/// embedding tied to the LM head).
enum class ParamUse { Embedding, Linear, Other };

class Importer {
public:
  Importer(MLIRContext *ctx, Model &model,
           const tessera::OnnxImportOptions &options)
      : ctx(ctx), model(model), options(options), b(ctx),
        fileLoc(FileLineColLoc::get(ctx, model.path, 0, 0)) {}

  OwningOpRef<ModuleOp> run();

private:
  // Errors ------------------------------------------------------------------
  InFlightDiagnostic error(const Node &n) {
    hadError = true;
    return emitError(loc(n)) << "node '" << n.name << "' (" << n.opType
                             << "): ";
  }
  InFlightDiagnostic error() {
    hadError = true;
    return emitError(fileLoc);
  }
  Location loc(const Node &n) {
    return NameLoc::get(b.getStringAttr(n.name), fileLoc);
  }

  // Graph queries -----------------------------------------------------------
  const Node *producerOf(const std::string &v) const {
    auto it = producers.find(v);
    return it == producers.end() ? nullptr : it->second;
  }
  /// The producer of `v` when it has `opType` (and, with `single`, `v` has
  /// no other user).
  const Node *producedBy(const std::string &v, llvm::StringRef opType,
                         bool single = true) const {
    const Node *p = producerOf(v);
    if (!p || p->opType != opType)
      return nullptr;
    if (single && numUsers(v) != 1)
      return nullptr;
    return p;
  }
  size_t numUsers(const std::string &v) const {
    auto it = users.find(v);
    return it == users.end() ? 0 : it->second.size();
  }
  const Tensor *initializer(const std::string &v) const {
    auto it = inits.find(v);
    return it == inits.end() ? nullptr : it->second;
  }
  std::vector<int64_t> shapeOf(const std::string &v) const {
    auto it = model.values.find(v);
    if (it == model.values.end() || !it->second.hasShape)
      return {};
    return it->second.shape;
  }
  int64_t intAttr(const Node &n, const char *name, int64_t dflt) const {
    const OnnxAttr *a = n.attr(name);
    return a && a->kind == OnnxAttr::Int ? a->i : dflt;
  }
  /// The value of `v` when constants alone compute it (memoised).
  std::optional<Const> constant(const std::string &v);
  std::optional<Const> evaluate(const std::string &v);
  std::optional<double> scalar(const std::string &v) {
    std::optional<Const> c = constant(v);
    if (!c || c->values.size() != 1)
      return std::nullopt;
    return c->values[0];
  }
  bool isScalar(const std::string &v, double expect, double rtol = 1e-6) {
    std::optional<double> s = scalar(v);
    return s && std::abs(*s - expect) <= rtol * std::abs(expect);
  }
  std::vector<int64_t> perm(const Node &n) const {
    const OnnxAttr *a = n.attr("perm");
    return a ? a->ints : std::vector<int64_t>();
  }
  void cover(const Node *n) { covered.insert(n); }

  // Values ------------------------------------------------------------------
  FailureOr<Act> materialise(const std::string &v, const Node &user);
  FailureOr<Act> matchNode(const Node &n, const std::string &v);
  FailureOr<Act> matchAdd(const Node &n);
  FailureOr<Act> matchLinear(const Node &matmul, const std::string *bias,
                             const Node &root);
  FailureOr<Act> matchGemm(const Node &n, const std::string &x,
                           const Node &root);
  FailureOr<Act> matchFlattenedGemm(const Node &gemm, const Node &root);
  FailureOr<Act> matchGelu(const Node &n);
  FailureOr<Act> matchLayerNorm(const Node &n);
  FailureOr<Act> matchAttention(const Node &n);
  /// A linear layer producing `v`, inspected without importing it.
  struct LinearParts {
    std::string x, weight, bias;
    bool transposed = false; ///< weight stored [in, out]
    SmallVector<const Node *> nodes;
  };
  std::optional<LinearParts> linearParts(const std::string &v);
  FailureOr<Act> matchSeparateQKV(ArrayRef<const Node *> headReshapes,
                                  int64_t heads, int64_t headDim);
  FailureOr<Act> matchEmbedding(const Node &gather, const Node *posGather,
                                const Node &root);
  FailureOr<Act> matchLoss(const Node &n);
  FailureOr<Act> addLoss(Act logits, std::optional<int64_t> ignoreIndex,
                         Location at);

  FailureOr<Value> param(const std::string &name, const Node &user,
                         ParamUse use, bool transposed = false,
                         llvm::StringRef noWeightsInit = "");
  FailureOr<Value> input(const std::string &name, llvm::StringRef kind,
                         const Node &user);
  Value labelsArg(ArrayRef<int64_t> shape);
  int64_t operandLayer(ArrayRef<Act> acts) const {
    int64_t l = -1;
    for (const Act &a : acts)
      l = std::max(l, a.layer);
    return l;
  }
  Act mark(Value v, int64_t layer) {
    if (layer >= 0)
      v.getDefiningOp()->setAttr(tessera::kLayerAttr,
                                 b.getI64IntegerAttr(layer));
    return Act{v, layer};
  }
  /// The layer of a node that holds no parameter: its scope, else the
  /// latest layer among its operands.
  int64_t layerOf(const Node &n, ArrayRef<Act> operands) const {
    int64_t l = layerIndexOf(n.name);
    return l >= 0 ? l : operandLayer(operands);
  }
  /// The layer of a node with a parameter: its scope or the parameter's
  /// name; -1 (outside the decoder layers) when neither names one.
  int64_t paramLayerOf(const Node &n, const std::string &paramName) const {
    int64_t l = layerIndexOf(n.name);
    return l >= 0 ? l : layerIndexOf(paramName);
  }
  Attribute weightsAttr();

  MLIRContext *ctx;
  /// Not const: weightsAttr() releases each initializer's bytes once they
  /// are in the module.
  Model &model;
  const tessera::OnnxImportOptions &options;
  OpBuilder b;
  Location fileLoc;
  bool hadError = false;

  std::unordered_map<std::string, const Node *> producers;
  std::unordered_map<std::string, std::vector<const Node *>> users;
  std::unordered_map<std::string, const Tensor *> inits;
  std::set<std::string> graphInputs;
  std::unordered_map<std::string, Act> acts;
  std::set<const Node *> covered;
  std::unordered_map<std::string, std::optional<Const>> constants;
  std::set<std::string> inProgress;
  /// QKV projections whose output features are [q][k][v] blocks (GPT-2's
  /// c_attn): parameter name -> (heads, head_dim), permuted at import to
  /// Megatron's per-head [q k v] order.
  std::map<std::string, std::pair<int64_t, int64_t>> qkvBlocks;
  /// Parameters fused from separate q, k and v projections: fused name ->
  /// the three initializers (and whether each is stored [in, out]).
  struct FusedQKV {
    std::array<std::string, 3> sources;
    std::array<bool, 3> transposed;
    int64_t heads, headDim;
  };
  std::map<std::string, FusedQKV> fused;

  Block *block = nullptr;
  SmallVector<DictionaryAttr> argAttrs;
  struct ParamInfo {
    Value arg;
    ParamUse use;
    bool transposed;
    const Node *user;
  };
  std::map<std::string, ParamInfo> params;
  std::vector<std::string> paramOrder;
  std::map<std::string, Value> inputArgs;
  Value labels; ///< the labels argument, once made
  int64_t tracedBatch = -1;
};

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

std::optional<Const> Importer::constant(const std::string &v) {
  auto cached = constants.find(v);
  if (cached != constants.end())
    return cached->second;
  constants[v] = std::nullopt; // a cycle evaluates to "not a constant"
  std::optional<Const> c = evaluate(v);
  constants[v] = c;
  return c;
}

std::optional<Const> Importer::evaluate(const std::string &v) {
  // Constants are small (scales, shapes, positions, masks): a weight is
  // never one, and is never converted.
  constexpr int64_t kMaxConstant = int64_t(1) << 24;
  if (const Tensor *t = initializer(v)) {
    if (t->numElements() > (t->elemType == onnx_model::kFloat ? 1024 : kMaxConstant))
      return std::nullopt;
    std::vector<double> values = t->toDoubles();
    if (values.empty() && t->numElements() != 0)
      return std::nullopt;
    return Const{t->shape, values};
  }
  const Node *p = producerOf(v);
  if (!p)
    return std::nullopt;
  if (p->opType == "Constant") {
    const OnnxAttr *a = p->attr("value");
    if (a && a->tensor && a->tensor->numElements() <= kMaxConstant) {
      std::vector<double> values = a->tensor->toDoubles();
      if (values.empty() && a->tensor->numElements() != 0)
        return std::nullopt;
      cover(p);
      return Const{a->tensor->shape, values};
    }
    if (const OnnxAttr *f = p->attr("value_float")) {
      cover(p);
      return Const{{}, {double(f->f)}};
    }
    if (const OnnxAttr *i = p->attr("value_int")) {
      cover(p);
      return Const{{}, {double(i->i)}};
    }
    return std::nullopt;
  }
  if (p->opType == "Cast" || p->opType == "Identity" || p->opType == "Not") {
    std::optional<Const> c = constant(p->inputs[0]);
    if (!c)
      return std::nullopt;
    int64_t to = intAttr(*p, "to", 0);
    for (double &x : c->values) {
      if (p->opType == "Not")
        x = x == 0 ? 1 : 0;
      else if (to == onnx_model::kBool)
        x = x != 0 ? 1 : 0;
      else if (to == onnx_model::kInt32 || to == onnx_model::kInt64)
        x = std::trunc(x);
    }
    cover(p);
    return c;
  }
  // Shape computations (dynamic-axes exports compute positions and mask
  // sizes from Shape): static dimensions are constants, unknown ones -1.
  if (p->opType == "Shape") {
    auto info = model.values.find(p->inputs[0]);
    if (info == model.values.end() || !info->second.hasShape)
      return std::nullopt;
    std::vector<int64_t> dims = info->second.shape;
    int64_t rank = int64_t(dims.size());
    int64_t start = intAttr(*p, "start", 0), end = intAttr(*p, "end", rank);
    start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
    end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
    Const c;
    for (int64_t d = start; d < end; ++d)
      c.values.push_back(double(dims[size_t(d)]));
    c.shape = {int64_t(c.values.size())};
    cover(p);
    return c;
  }
  if (p->opType == "Gather") {
    if (shapeOf(p->inputs[0]).size() != 1)
      return std::nullopt;
    std::optional<Const> data = constant(p->inputs[0]);
    std::optional<Const> index = data ? constant(p->inputs[1]) : std::nullopt;
    if (!data || !index || data->shape.size() != 1 || intAttr(*p, "axis", 0) != 0)
      return std::nullopt;
    Const c{index->shape, {}};
    int64_t n = int64_t(data->values.size());
    for (double i : index->values) {
      int64_t k = int64_t(i) < 0 ? int64_t(i) + n : int64_t(i);
      if (k < 0 || k >= n)
        return std::nullopt;
      c.values.push_back(data->values[size_t(k)]);
    }
    cover(p);
    return c;
  }
  if (p->opType == "Unsqueeze" || p->opType == "Squeeze") {
    std::optional<Const> c = constant(p->inputs[0]);
    std::vector<int64_t> out = shapeOf(p->outputs[0]);
    if (!c || int64_t(c->values.size()) != [&] {
          int64_t n = 1;
          for (int64_t d : out)
            n *= d;
          return n;
        }())
      return std::nullopt;
    c->shape = out;
    cover(p);
    return c;
  }
  if (p->opType == "Concat") {
    if (intAttr(*p, "axis", 0) != 0)
      return std::nullopt;
    Const c;
    for (const std::string &in : p->inputs) {
      std::optional<Const> part = constant(in);
      if (!part || part->shape.size() > 1)
        return std::nullopt;
      c.values.insert(c.values.end(), part->values.begin(), part->values.end());
    }
    c.shape = {int64_t(c.values.size())};
    cover(p);
    return c;
  }
  if (p->opType == "Range") {
    std::optional<double> start = scalar(p->inputs[0]);
    std::optional<double> limit = scalar(p->inputs[1]);
    std::optional<double> delta = scalar(p->inputs[2]);
    if (!start || !limit || !delta || *delta == 0 || *limit < 0)
      return std::nullopt;
    Const c;
    for (double v = *start; *delta > 0 ? v < *limit : v > *limit; v += *delta) {
      c.values.push_back(v);
      if (c.values.size() > (1u << 24))
        return std::nullopt;
    }
    c.shape = {int64_t(c.values.size())};
    cover(p);
    return c;
  }
  if (p->opType == "ConstantOfShape") {
    std::optional<Const> shape = constant(p->inputs[0]);
    const OnnxAttr *value = p->attr("value");
    double fill = 0;
    if (value && value->tensor) {
      std::vector<double> v = value->tensor->toDoubles();
      if (v.size() != 1)
        return std::nullopt;
      fill = v[0];
    }
    if (!shape)
      return std::nullopt;
    Const c;
    int64_t n = 1;
    for (double d : shape->values) {
      c.shape.push_back(int64_t(d));
      n *= int64_t(d);
    }
    if (n < 0 || n > (1 << 20))
      return std::nullopt;
    c.values.assign(size_t(n), fill);
    cover(p);
    return c;
  }
  if (p->opType == "Sqrt") {
    std::optional<Const> c = constant(p->inputs[0]);
    if (!c)
      return std::nullopt;
    for (double &x : c->values)
      x = std::sqrt(x);
    cover(p);
    return c;
  }
  if (p->opType == "Add" || p->opType == "Sub" || p->opType == "Mul" ||
      p->opType == "Div" || p->opType == "Pow") {
    // Element-wise on constants of one shape, or with a one-element side
    // (what scalar arithmetic such as torch.full([], d ** 0.5) exports).
    std::optional<Const> a = constant(p->inputs[0]);
    std::optional<Const> c = a ? constant(p->inputs[1]) : std::nullopt;
    if (!a || !c)
      return std::nullopt;
    size_t n = std::max(a->values.size(), c->values.size());
    if ((a->values.size() != n && a->values.size() != 1) ||
        (c->values.size() != n && c->values.size() != 1))
      return std::nullopt;
    Const r{a->values.size() == n ? a->shape : c->shape, {}};
    r.values.resize(n);
    for (size_t i = 0; i < n; ++i) {
      double x = a->values[a->values.size() == 1 ? 0 : i];
      double y = c->values[c->values.size() == 1 ? 0 : i];
      r.values[i] = p->opType == "Add"   ? x + y
                    : p->opType == "Sub" ? x - y
                    : p->opType == "Mul" ? x * y
                    : p->opType == "Div" ? x / y
                                         : std::pow(x, y);
    }
    cover(p);
    return r;
  }
  if (p->opType == "Trilu") {
    std::optional<Const> c = constant(p->inputs[0]);
    int64_t k = 0;
    if (p->inputs.size() > 1 && !p->inputs[1].empty()) {
      std::optional<double> kv = scalar(p->inputs[1]);
      if (!kv)
        return std::nullopt;
      k = int64_t(*kv);
    }
    if (!c || c->shape.size() < 2)
      return std::nullopt;
    bool upper = intAttr(*p, "upper", 1) != 0;
    int64_t rows = c->shape[c->shape.size() - 2], cols = c->shape.back();
    for (size_t i = 0; i < c->values.size(); ++i) {
      int64_t r = int64_t(i / size_t(cols)) % rows, col = int64_t(i % size_t(cols));
      bool keep = upper ? col - r >= k : col - r <= k;
      if (!keep)
        c->values[i] = 0;
    }
    cover(p);
    return c;
  }
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// Arguments
//===----------------------------------------------------------------------===//

FailureOr<Value> Importer::param(const std::string &name, const Node &user,
                                 ParamUse use, bool transposed,
                                 llvm::StringRef noWeightsInit) {
  const Tensor *t = initializer(name);
  if (!t) {
    error(user) << "expected the initializer of a parameter as input '" << name
                << "', got a computed value";
    return failure();
  }
  if (t->elemType != onnx_model::kFloat) {
    error(user) << "parameter '" << name << "' is "
                << onnx_model::elemTypeName(t->elemType)
                << "; expected float (export the model in fp32)";
    return failure();
  }
  auto it = params.find(name);
  if (it != params.end()) {
    ParamInfo &prev = it->second;
    bool tied = prev.use != use && !transposed && !prev.transposed &&
                ((prev.use == ParamUse::Embedding && use == ParamUse::Linear) ||
                 (prev.use == ParamUse::Linear && use == ParamUse::Embedding));
    if (!tied) {
      error(user) << "initializer '" << name << "' is also used by node '"
                  << prev.user->name << "' (" << prev.user->opType
                  << "); Tessera shares a parameter only between the word "
                     "embedding and the LM head (a tied embedding). Re-export "
                     "with separate parameters (clone the tensor in the "
                     "module before torch.onnx.export)";
      return failure();
    }
    return prev.arg;
  }
  SmallVector<int64_t> shape(t->shape.begin(), t->shape.end());
  if (transposed)
    std::swap(shape[0], shape[1]);
  Value arg = block->addArgument(RankedTensorType::get(shape, b.getF32Type()),
                                 loc(user));
  SmallVector<NamedAttribute> attrs = {
      b.getNamedAttr(tessera::kParamAttr, b.getStringAttr(name))};
  if (options.loadWeights && t->hasData)
    attrs.push_back(b.getNamedAttr(tessera::kInitAttr, b.getStringAttr("data")));
  else if (!noWeightsInit.empty())
    attrs.push_back(
        b.getNamedAttr(tessera::kInitAttr, b.getStringAttr(noWeightsInit)));
  argAttrs.push_back(b.getDictionaryAttr(attrs));
  params[name] = ParamInfo{arg, use, transposed, &user};
  paramOrder.push_back(name);
  return arg;
}

FailureOr<Value> Importer::input(const std::string &name, llvm::StringRef kind,
                                 const Node &user) {
  auto it = inputArgs.find(name);
  if (it != inputArgs.end())
    return it->second;
  std::vector<int64_t> shape = shapeOf(name);
  auto info = model.values.find(name);
  int32_t elem = info == model.values.end() ? 0 : info->second.elemType;
  Type type;
  SmallVector<NamedAttribute> attrs = {
      b.getNamedAttr(tessera::kInputAttr, b.getStringAttr(kind))};
  if (kind == "tokens") {
    if (shape.size() != 2 ||
        (elem != onnx_model::kInt64 && elem != onnx_model::kInt32)) {
      error(user) << "expected token ids [batch, seq] of int64 or int32 as "
                     "input '" << name << "'";
      return failure();
    }
    if (shape[1] < 0) {
      error(user) << "input '" << name << "' has no fixed sequence length";
      return failure();
    }
    // Megatron's sequence-major [s, b].
    type = RankedTensorType::get({shape[1], ShapedType::kDynamic},
                                 b.getI32Type());
    attrs.push_back(b.getNamedAttr(tessera::kBatchDimAttr, b.getI64IntegerAttr(1)));
  } else { // features [b, F]
    if (shape.size() != 2 || shape[1] < 0 || elem != onnx_model::kFloat) {
      error(user) << "expected float features [batch, features] as input '"
                  << name << "'";
      return failure();
    }
    type = RankedTensorType::get({ShapedType::kDynamic, shape[1]},
                                 b.getF32Type());
  }
  if (!shape.empty())
    tracedBatch = shape[0];
  Value arg = block->addArgument(type, loc(user));
  argAttrs.push_back(b.getDictionaryAttr(attrs));
  inputArgs[name] = arg;
  return arg;
}

Value Importer::labelsArg(ArrayRef<int64_t> shape) {
  if (labels)
    return labels;
  SmallVector<NamedAttribute> attrs = {
      b.getNamedAttr(tessera::kInputAttr, b.getStringAttr("labels"))};
  if (shape.size() == 2)
    attrs.push_back(b.getNamedAttr(tessera::kBatchDimAttr, b.getI64IntegerAttr(1)));
  labels = block->addArgument(RankedTensorType::get(shape, b.getI32Type()),
                              fileLoc);
  argAttrs.push_back(b.getDictionaryAttr(attrs));
  return labels;
}

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

FailureOr<Act> Importer::materialise(const std::string &v, const Node &user) {
  auto it = acts.find(v);
  if (it != acts.end())
    return it->second;
  if (!inProgress.insert(v).second) {
    error(user) << "input '" << v << "' depends on itself (a cycle)";
    return failure();
  }
  llvm::scope_exit done([&] { inProgress.erase(v); });
  if (initializer(v)) {
    error(user) << "initializer '" << v
                << "' is used as an activation; expected it as the weight of a "
                   "recognised pattern";
    return failure();
  }
  if (graphInputs.count(v)) {
    FailureOr<Value> arg = input(v, "features", user);
    if (failed(arg))
      return failure();
    return acts[v] = Act{*arg, -1};
  }
  const Node *p = producerOf(v);
  if (!p) {
    error(user) << "input '" << v << "' is not produced by any node";
    return failure();
  }
  FailureOr<Act> act = matchNode(*p, v);
  if (failed(act))
    return failure();
  cover(p);
  return acts[v] = *act;
}

FailureOr<Act> Importer::matchNode(const Node &n, const std::string &v) {
  if (n.outputs.empty() || n.outputs[0] != v) {
    error(n) << "output '" << v << "' is not its first output";
    return failure();
  }
  llvm::StringRef op = n.opType;
  if (op == "Add")
    return matchAdd(n);
  if (op == "MatMul")
    return matchLinear(n, nullptr, n);
  if (op == "Gemm")
    return matchGemm(n, n.inputs[0], n);
  if (op == "Mul")
    return matchGelu(n);
  if (op == "LayerNormalization")
    return matchLayerNorm(n);
  if (op == "Reshape") {
    if (const Node *gemm = producedBy(n.inputs[0], "Gemm"))
      return matchFlattenedGemm(*gemm, n);
    return matchAttention(n);
  }
  if (op == "SoftmaxCrossEntropyLoss")
    return matchLoss(n);
  if (op == "Gather")
    return matchEmbedding(n, nullptr, n);
  if (op == "Relu") {
    FailureOr<Act> x = materialise(n.inputs[0], n);
    if (failed(x))
      return failure();
    return mark(nn::ReluOp::create(b, loc(n), x->value), layerOf(n, {*x}));
  }
  if (op == "Identity")
    return materialise(n.inputs[0], n);
  if (op == "Dropout") {
    double ratio = 0.5;
    if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
      std::optional<double> r = scalar(n.inputs[1]);
      if (!r) {
        error(n) << "expected a constant ratio";
        return failure();
      }
      ratio = *r;
    }
    bool training = false;
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      std::optional<double> mode = scalar(n.inputs[2]);
      if (!mode) {
        error(n) << "expected a constant training_mode";
        return failure();
      }
      training = *mode != 0;
    }
    if (!training || ratio == 0)
      return materialise(n.inputs[0], n);
    // Megatron's hidden dropout on [s, b, h] activations, with Tessera's
    // counter-based masks (keyed by global position, so every parallel
    // layout drops the same elements; they are not PyTorch's masks).
    if (ratio < 0 || ratio >= 1) {
      error(n) << "expected a dropout ratio in [0, 1), got " << ratio;
      return failure();
    }
    FailureOr<Act> x = materialise(n.inputs[0], n);
    if (failed(x))
      return failure();
    if (cast<RankedTensorType>(x->value.getType()).getRank() != 3) {
      error(n) << "dropout on activations of rank "
               << cast<RankedTensorType>(x->value.getType()).getRank()
               << " is not imported; expected token activations [b, s, h]";
      return failure();
    }
    int64_t stream = 0;
    for (const Node &other : model.nodes) {
      if (&other == &n)
        break;
      stream += other.opType == "Dropout";
    }
    Value y = nn::DropoutOp::create(b, loc(n), x->value,
                                    b.getF32FloatAttr(float(ratio)),
                                    b.getI64IntegerAttr(stream), StringAttr());
    return mark(y, layerOf(n, {*x}));
  }
  error(n) << "not part of a recognised pattern (expected it inside a linear, "
              "GELU, attention, embedding or loss pattern)";
  return failure();
}

/// A linear layer: MatMul(x, W) with W = Transpose(weight [out, in]) (what
/// nn.Linear exports) or W = weight [in, out] (Conv1D-style, transposed at
/// import), plus an optional bias.
FailureOr<Act> Importer::matchLinear(const Node &matmul, const std::string *bias,
                                     const Node &root) {
  const std::string &w = matmul.inputs[1];
  std::string weight;
  bool transposed = false;
  if (const Node *t = producedBy(w, "Transpose", /*single=*/false)) {
    std::vector<int64_t> p = perm(*t);
    const Tensor *init = initializer(t->inputs[0]);
    if (!init || init->shape.size() != 2 ||
        !(p.empty() || p == std::vector<int64_t>{1, 0})) {
      error(*t) << "expected the transpose of a 2-d weight initializer";
      return failure();
    }
    weight = t->inputs[0];
    cover(t);
  } else if (const Tensor *init = initializer(w)) {
    if (init->shape.size() != 2) {
      error(matmul) << "expected a 2-d weight, got '" << w << "'";
      return failure();
    }
    weight = w;
    transposed = true;
  } else {
    error(matmul) << "expected a weight: an initializer, or Transpose(initializer, "
                     "perm [1, 0]); got a computed value (a matmul of two "
                     "activations outside the attention pattern)";
    return failure();
  }
  FailureOr<Act> x = materialise(matmul.inputs[0], matmul);
  if (failed(x))
    return failure();
  if (cast<RankedTensorType>(x->value.getType()).getRank() < 2) {
    error(matmul) << "expected an input of rank >= 2";
    return failure();
  }
  FailureOr<Value> W = param(weight, matmul, ParamUse::Linear, transposed);
  if (failed(W))
    return failure();
  Value B;
  if (bias) {
    const Tensor *bt = initializer(*bias);
    int64_t out = cast<RankedTensorType>(W->getType()).getDimSize(0);
    if (!bt || bt->shape != std::vector<int64_t>{out}) {
      error(root) << "expected a bias initializer of shape [" << out << "]";
      return failure();
    }
    FailureOr<Value> bv = param(*bias, root, ParamUse::Other, false, "zeros");
    if (failed(bv))
      return failure();
    B = *bv;
  }
  cover(&matmul);
  Value y = nn::LinearOp::create(b, loc(root), x->value, *W, B);
  return mark(y, paramLayerOf(root, weight));
}

/// Hugging Face's Conv1D: Reshape(Gemm(Reshape(x [b, s, in], [b * s, in]),
/// W [in, out], bias), [b, s, out]) (torch.addmm on the flattened tokens).
FailureOr<Act> Importer::matchFlattenedGemm(const Node &gemm, const Node &root) {
  const Node *flat = producedBy(gemm.inputs[0], "Reshape");
  std::vector<int64_t> in = flat ? shapeOf(flat->inputs[0]) : std::vector<int64_t>();
  std::vector<int64_t> mid = shapeOf(gemm.inputs[0]), out = shapeOf(root.outputs[0]);
  std::vector<int64_t> g = shapeOf(gemm.outputs[0]);
  bool ok = flat && in.size() >= 2 && mid.size() == 2 && g.size() == 2 &&
            out.size() == in.size() && mid[1] == in.back() && g[1] == out.back();
  for (size_t d = 0; ok && d + 1 < in.size(); ++d)
    ok = in[d] == out[d] && in[d] >= 0;
  if (!ok) {
    error(root) << "expected a linear layer on flattened tokens: Reshape(Gemm("
                   "Reshape(x [..., in], [-1, in]), W, bias), [..., out])";
    return failure();
  }
  cover(flat);
  cover(&gemm);
  return matchGemm(gemm, flat->inputs[0], root);
}

FailureOr<Act> Importer::matchGemm(const Node &n, const std::string &xValue,
                                   const Node &root) {
  if (intAttr(n, "transA", 0) != 0 ||
      (n.attr("alpha") && n.attr("alpha")->f != 1.0f) ||
      (n.attr("beta") && n.attr("beta")->f != 1.0f)) {
    error(n) << "expected transA = 0, alpha = 1 and beta = 1 (a linear layer)";
    return failure();
  }
  bool transB = intAttr(n, "transB", 0) != 0;
  const Tensor *w = initializer(n.inputs[1]);
  if (!w || w->shape.size() != 2) {
    error(n) << "expected a 2-d weight initializer as input B";
    return failure();
  }
  FailureOr<Act> x = materialise(xValue, n);
  if (failed(x))
    return failure();
  FailureOr<Value> W = param(n.inputs[1], n, ParamUse::Linear, !transB);
  if (failed(W))
    return failure();
  Value B;
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    int64_t out = cast<RankedTensorType>(W->getType()).getDimSize(0);
    const Tensor *bt = initializer(n.inputs[2]);
    if (!bt || bt->shape != std::vector<int64_t>{out}) {
      error(n) << "expected a bias initializer of shape [" << out << "] as input C";
      return failure();
    }
    FailureOr<Value> bv = param(n.inputs[2], n, ParamUse::Other, false, "zeros");
    if (failed(bv))
      return failure();
    B = *bv;
  }
  Value y = nn::LinearOp::create(b, loc(root), x->value, *W, B);
  return mark(y, paramLayerOf(root, n.inputs[1]));
}

FailureOr<Act> Importer::matchAdd(const Node &n) {
  const std::string &a = n.inputs[0], &c = n.inputs[1];
  // Bias add closing a linear: Add(bias, MatMul(...)) in either order.
  for (int i = 0; i < 2; ++i) {
    const std::string &bias = i == 0 ? a : c, &other = i == 0 ? c : a;
    const Tensor *bt = initializer(bias);
    if (bt && bt->shape.size() == 1)
      if (const Node *mm = producedBy(other, "MatMul"))
        return matchLinear(*mm, &bias, n);
  }
  // Word + position embedding.
  const Node *ga = producedBy(a, "Gather"), *gc = producedBy(c, "Gather");
  if (ga && gc) {
    bool aIsWord = graphInputs.count(ga->inputs[1]) != 0;
    const Node *word = aIsWord ? ga : gc, *pos = aIsWord ? gc : ga;
    return matchEmbedding(*word, pos, n);
  }
  if (initializer(a) || initializer(c) || constant(a) || constant(c)) {
    error(n) << "expected a bias add after a MatMul, the word + position "
                "embedding, or a residual add of two activations; got an add "
                "of a constant";
    return failure();
  }
  if (shapeOf(a).empty() || shapeOf(a) != shapeOf(c)) {
    error(n) << "expected two activations of the same shape (a residual add); "
                "broadcasting adds are not imported";
    return failure();
  }
  FailureOr<Act> x = materialise(a, n);
  if (failed(x))
    return failure();
  FailureOr<Act> y = materialise(c, n);
  if (failed(y))
    return failure();
  return mark(nn::AddOp::create(b, loc(n), x->value, y->value),
              layerOf(n, {*x, *y}));
}

FailureOr<Act> Importer::matchEmbedding(const Node &gather, const Node *posGather,
                                        const Node &root) {
  const Tensor *table = initializer(gather.inputs[0]);
  const std::string &ids = gather.inputs[1];
  if (!table || table->shape.size() != 2 || !graphInputs.count(ids) ||
      intAttr(gather, "axis", 0) != 0) {
    error(gather) << "expected an embedding lookup: Gather(table initializer "
                     "[vocab, hidden], token ids input) on axis 0";
    return failure();
  }
  FailureOr<Value> tokens = input(ids, "tokens", gather);
  if (failed(tokens))
    return failure();
  FailureOr<Value> W = param(gather.inputs[0], gather, ParamUse::Embedding, false,
                             "normal:0.02");
  if (failed(W))
    return failure();
  cover(&gather);
  Value h = nn::EmbeddingOp::create(b, loc(gather), *tokens, *W,
                                    b.getI64IntegerAttr(table->shape[0]),
                                    StringAttr());
  if (!posGather)
    return Act{h, -1};
  int64_t seq = cast<RankedTensorType>(tokens->getType()).getDimSize(0);
  const Tensor *pt = initializer(posGather->inputs[0]);
  std::optional<Const> positions = constant(posGather->inputs[1]);
  bool arange = positions && int64_t(positions->values.size()) == seq;
  for (int64_t i = 0; arange && i < seq; ++i)
    arange = positions->values[size_t(i)] == double(i);
  if (!pt || pt->shape.size() != 2 || pt->shape[1] != table->shape[1] ||
      pt->shape[0] < seq || !arange || intAttr(*posGather, "axis", 0) != 0) {
    error(*posGather) << "expected a position embedding: Gather(table "
                         "initializer [positions >= " << seq << ", "
                      << table->shape[1] << "], the constant 0.." << seq - 1
                      << ")";
    return failure();
  }
  FailureOr<Value> P = param(posGather->inputs[0], *posGather, ParamUse::Other,
                             false, "normal:0.02");
  if (failed(P))
    return failure();
  cover(posGather);
  Value y =
      nn::AddPositionEmbeddingOp::create(b, loc(root), h, *P, StringAttr());
  return Act{y, -1};
}

/// GELU with the exact erf: x * 0.5 * (1 + erf(x / sqrt(2))), or its tanh
/// approximation (nn.gelu {approximate = "tanh"}), in any order
/// of the multiplications (torch exports Mul(Mul(x, Add(Erf(Div(x, 1.414..)),
/// 1)), 0.5)); the division may be a multiplication by 1 / sqrt(2).
FailureOr<Act> Importer::matchGelu(const Node &root) {
  // Flatten the product into its factors.
  SmallVector<std::string> factors;
  SmallVector<const Node *> muls;
  std::function<void(const Node &)> flatten = [&](const Node &m) {
    muls.push_back(&m);
    for (const std::string &in : m.inputs) {
      if (const Node *inner = producedBy(in, "Mul"))
        flatten(*inner);
      else
        factors.push_back(in);
    }
  };
  flatten(root);
  // 1 + erf(x / sqrt(2)) (or erf(x * (1 / sqrt(2)))): returns x and the
  // nodes of the chain.
  auto onePlusErfOf = [&](const std::string &f)
      -> std::optional<std::pair<std::string, SmallVector<const Node *>>> {
    const Node *add = producedBy(f, "Add");
    if (!add)
      return std::nullopt;
    for (int i = 0; i < 2; ++i) {
      const Node *erf = producedBy(add->inputs[i], "Erf");
      if (!erf || !isScalar(add->inputs[1 - i], 1.0))
        continue;
      const std::string &e = erf->inputs[0];
      if (const Node *div = producedBy(e, "Div"))
        if (isScalar(div->inputs[1], std::sqrt(2.0)))
          return std::make_pair(div->inputs[0],
                                SmallVector<const Node *>{add, erf, div});
      if (const Node *mul = producedBy(e, "Mul"))
        for (int j = 0; j < 2; ++j)
          if (isScalar(mul->inputs[j], 1.0 / std::sqrt(2.0)))
            return std::make_pair(mul->inputs[1 - j],
                                  SmallVector<const Node *>{add, erf, mul});
    }
    return std::nullopt;
  };
  // 1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)) (PyTorch's approximate='tanh'
  // and GPT-2's gelu_new; x^3 as Pow(x, 3) or x * (x * x)), the factors of
  // each product in either order.
  auto onePlusTanhOf = [&](const std::string &f)
      -> std::optional<std::pair<std::string, SmallVector<const Node *>>> {
    const Node *add = producedBy(f, "Add");
    if (!add)
      return std::nullopt;
    auto product = [&](const Node *mul, double c) -> std::optional<std::string> {
      for (int j = 0; mul && j < 2; ++j)
        if (isScalar(mul->inputs[j], c))
          return mul->inputs[1 - j];
      return std::nullopt;
    };
    for (int i = 0; i < 2; ++i) {
      const Node *tanh = producedBy(add->inputs[i], "Tanh");
      if (!tanh || !isScalar(add->inputs[1 - i], 1.0))
        continue;
      const Node *scaleMul = producedBy(tanh->inputs[0], "Mul");
      std::optional<std::string> inner =
          product(scaleMul, std::sqrt(2.0 / M_PI));
      const Node *sum = inner ? producedBy(*inner, "Add") : nullptr;
      for (int j = 0; sum && j < 2; ++j) {
        const std::string &x = sum->inputs[j];
        const Node *cubicMul = producedBy(sum->inputs[1 - j], "Mul");
        std::optional<std::string> cube = product(cubicMul, 0.044715);
        if (!cube)
          continue;
        SmallVector<const Node *> nodes = {add, tanh, scaleMul, sum, cubicMul};
        if (const Node *pow = producedBy(*cube, "Pow")) {
          if (pow->inputs[0] == x && isScalar(pow->inputs[1], 3.0)) {
            nodes.push_back(pow);
            return std::make_pair(x, nodes);
          }
        } else if (const Node *m = producedBy(*cube, "Mul")) {
          for (int k = 0; k < 2; ++k) {
            const Node *sq = producedBy(m->inputs[k], "Mul");
            if (m->inputs[1 - k] == x && sq && sq->inputs[0] == x &&
                sq->inputs[1] == x) {
              nodes.append({m, sq});
              return std::make_pair(x, nodes);
            }
          }
        }
      }
    }
    return std::nullopt;
  };
  std::optional<std::string> x;
  std::string erfArg;
  SmallVector<const Node *> chain;
  bool half = false, onePlusErf = false, tanhForm = false, extra = false;
  for (const std::string &f : factors) {
    if (!half && isScalar(f, 0.5)) {
      half = true;
    } else if (auto e = !onePlusErf ? onePlusErfOf(f) : std::nullopt) {
      onePlusErf = true;
      erfArg = e->first;
      chain = e->second;
    } else if (auto t = !onePlusErf ? onePlusTanhOf(f) : std::nullopt) {
      onePlusErf = tanhForm = true;
      erfArg = t->first;
      chain = t->second;
    } else if (!x) {
      x = f;
    } else {
      extra = true;
    }
  }
  if (!half || !onePlusErf || !x || extra || *x != erfArg) {
    error(root) << "not part of a recognised pattern (expected the GELU "
                   "x * 0.5 * (1 + erf(x / sqrt(2))) or its tanh form x * 0.5 * "
                   "(1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))))";
    return failure();
  }
  for (const Node *n : muls)
    cover(n);
  for (const Node *n : chain)
    cover(n);
  FailureOr<Act> in = materialise(*x, root);
  if (failed(in))
    return failure();
  return mark(nn::GeluOp::create(b, loc(root), in->value,
                                 tanhForm ? "tanh" : "none"),
              layerOf(root, {*in}));
}

FailureOr<Act> Importer::matchLayerNorm(const Node &n) {
  std::vector<int64_t> shape = shapeOf(n.inputs[0]);
  int64_t axis = intAttr(n, "axis", -1);
  if (n.inputs.size() < 3 || n.inputs[2].empty() ||
      (axis != -1 && axis != int64_t(shape.size()) - 1)) {
    error(n) << "expected a layer norm over the last axis with a scale and a "
                "bias";
    return failure();
  }
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty() && numUsers(n.outputs[i])) {
      error(n) << "its mean and inverse standard deviation outputs are used; "
                  "expected only the normalised output";
      return failure();
    }
  FailureOr<Act> x = materialise(n.inputs[0], n);
  if (failed(x))
    return failure();
  FailureOr<Value> g = param(n.inputs[1], n, ParamUse::Other, false, "ones");
  if (failed(g))
    return failure();
  FailureOr<Value> beta = param(n.inputs[2], n, ParamUse::Other, false, "zeros");
  if (failed(beta))
    return failure();
  const OnnxAttr *eps = n.attr("epsilon");
  Value y = nn::LayerNormOp::create(b, loc(n), x->value, *g, *beta,
                                    b.getF32FloatAttr(eps ? eps->f : 1e-5f));
  return mark(y, paramLayerOf(n, n.inputs[1]));
}

/// Causal multi-head self-attention with the QKV fused per head (Megatron's
/// layout, [b, s, heads, 3 * head_dim]):
///   Reshape(qkv, [b, s, A, 3D]) -> Split(last axis, [D, D, D]) ->
///   q, v: Transpose [0, 2, 1, 3]; k: Transpose [0, 2, 3, 1] ->
///   MatMul(q, k) -> Div sqrt(D) (or Mul 1/sqrt(D)) -> [Where(causal mask,
///   -inf, .)] -> Softmax(last axis) -> MatMul(., v) -> Transpose [0, 2, 1, 3]
///   -> Reshape [b, s, A * D]   (this Reshape is the root).
FailureOr<Act> Importer::matchAttention(const Node &root) {
  auto fail = [&](const Node &n, const Twine &what) -> FailureOr<Act> {
    error(n) << "not part of a recognised pattern: expected " << what
             << " (in the attention pattern Reshape/Split/Transpose/MatMul/"
                "scale/mask/Softmax/MatMul/Transpose/Reshape)";
    return failure();
  };
  const Node *t3 = producedBy(root.inputs[0], "Transpose");
  if (!t3 || perm(*t3) != std::vector<int64_t>{0, 2, 1, 3})
    return fail(root, "a Reshape of the attention context, Transpose [0, 2, 1, 3]");
  const Node *pv = producedBy(t3->inputs[0], "MatMul");
  if (!pv)
    return fail(*t3, "the product of the probabilities and V");
  if (const Node *drop = producedBy(pv->inputs[0], "Dropout")) {
    error(*drop) << "dropout on the attention probabilities is not imported "
                    "(Tessera's attention has none): export with attention "
                    "dropout 0";
    return failure();
  }
  const Node *sm = producedBy(pv->inputs[0], "Softmax");
  std::vector<int64_t> smShape = sm ? shapeOf(sm->inputs[0]) : std::vector<int64_t>();
  if (!sm || smShape.size() != 4 || smShape[2] != smShape[3] ||
      (intAttr(*sm, "axis", -1) != -1 && intAttr(*sm, "axis", -1) != 3))
    return fail(*pv, "a Softmax over the last axis of [b, heads, s, s] scores");
  // Optional causal mask.
  std::string scores = sm->inputs[0];
  bool causal = false;
  if (const Node *where = producedBy(scores, "Where")) {
    // Where(mask, -inf, scores) with mask[i][j] = j > i (masked_fill), or
    // Where(keep, scores, min) with keep[i][j] = j <= i (GPT-2's tril buffer).
    std::optional<Const> cond = constant(where->inputs[0]);
    int64_t s = smShape[2];
    bool ok = cond && cond->shape.size() >= 2 &&
              cond->shape[cond->shape.size() - 1] == s &&
              cond->shape[cond->shape.size() - 2] == s &&
              int64_t(cond->values.size()) == s * s;
    bool keep = ok && cond->values[0] != 0;
    std::optional<double> fill = scalar(where->inputs[keep ? 2 : 1]);
    ok = ok && fill && *fill <= -1e4;
    for (int64_t i = 0; ok && i < s; ++i)
      for (int64_t j = 0; ok && j < s; ++j)
        ok = (cond->values[size_t(i * s + j)] != 0) == (keep ? j <= i : j > i);
    if (!ok)
      return fail(*where, "a causal mask: Where(mask[i][j] = j > i, -inf, "
                          "scores) or Where(keep[i][j] = j <= i, scores, -inf)");
    cover(where);
    scores = where->inputs[keep ? 1 : 2];
    causal = true;
  }
  const Node *scale = producedBy(scores, "Div");
  const Node *qk = nullptr;
  int64_t headDim = 0;
  std::string scaleConst;
  if (scale) {
    qk = producedBy(scale->inputs[0], "MatMul");
    scaleConst = scale->inputs[1];
  } else if ((scale = producedBy(scores, "Mul"))) {
    for (int i = 0; i < 2 && !qk; ++i)
      if ((qk = producedBy(scale->inputs[i], "MatMul")))
        scaleConst = scale->inputs[1 - i];
  }
  if (!qk)
    return fail(*sm, "scaled scores MatMul(q, k^T) / sqrt(head_dim)");
  // q, k and v reach the products through Transposes (one, or a chain the
  // exporter did not fuse): their composition must be [0, 2, 1, 3] for q
  // and v, [0, 2, 3, 1] for k. y = Transpose(x, p1), z = Transpose(y, p2)
  // is z = Transpose(x, p) with p[i] = p1[p2[i]].
  struct TransposeChain {
    std::string source;
    std::vector<int64_t> perm;
    SmallVector<const Node *> nodes;
  };
  auto chainOf = [&](const std::string &v) -> std::optional<TransposeChain> {
    TransposeChain c;
    std::string cur = v;
    // Besides the next step, only Shape may read a link (dynamic-axes
    // exports take q's dimensions from it).
    auto soleUser = [&](const std::string &value) {
      size_t n = 0;
      for (const Node *u : users[value])
        n += u->opType != "Shape";
      return n == 1;
    };
    for (const Node *t = producerOf(cur);
         t && t->opType == "Transpose" && soleUser(cur); t = producerOf(cur)) {
      std::vector<int64_t> p = perm(*t);
      if (p.size() != 4)
        return std::nullopt;
      if (c.perm.empty()) {
        c.perm = p;
      } else {
        std::vector<int64_t> composed(4);
        for (size_t i = 0; i < 4; ++i) {
          if (c.perm[i] < 0 || c.perm[i] > 3)
            return std::nullopt;
          composed[i] = p[size_t(c.perm[i])];
        }
        c.perm = composed;
      }
      c.nodes.push_back(t);
      cur = t->inputs[0];
    }
    if (c.nodes.empty())
      return std::nullopt;
    c.source = cur;
    return c;
  };
  std::optional<TransposeChain> cq = chainOf(qk->inputs[0]);
  std::optional<TransposeChain> ck = chainOf(qk->inputs[1]);
  std::optional<TransposeChain> cv = chainOf(pv->inputs[1]);
  if (!cq || !ck || !cv || cq->perm != std::vector<int64_t>{0, 2, 1, 3} ||
      ck->perm != std::vector<int64_t>{0, 2, 3, 1} ||
      cv->perm != std::vector<int64_t>{0, 2, 1, 3})
    return fail(*qk, "q and v transposed [0, 2, 1, 3] and k [0, 2, 3, 1] from "
                     "[b, s, heads, head_dim]");
  const Node *tq = cq->nodes.back(), *tk = ck->nodes.back(),
             *tv = cv->nodes.back();
  const std::string *sources[3] = {&cq->source, &ck->source, &cv->source};
  // q, k, v come in one of three layouts:
  //  fused per head (Megatron): Split(Reshape(qkv, [b, s, A, 3D]), last axis)
  //  [q][k][v] blocks (GPT-2's c_attn): Reshape(Split(qkv, last axis), [b, s,
  //  A, D]) each, whose projection is permuted to the first at import;
  //  separate projections (q_proj, k_proj, v_proj): Reshape(linear_t(x), [b,
  //  s, A, D]) each, fused into one projection in the first layout.
  SmallVector<const Node *> headReshapes;
  const Node *split = producerOf(cq->source);
  bool blocks = false;
  if (split && split->opType == "Reshape") {
    blocks = true;
    for (int i = 0; i < 3; ++i) {
      const Node *r = producedBy(*sources[i], "Reshape");
      if (!r)
        return fail(i == 0 ? *tq : i == 1 ? *tk : *tv,
                    "q, k and v each a Reshape of one Split's output");
      headReshapes.push_back(r);
    }
    split = producerOf(headReshapes[0]->inputs[0]);
  }
  std::vector<int64_t> ctx4 = shapeOf(qk->inputs[0]); // [b, A, s, D]
  if (ctx4.size() != 4 || ctx4[0] != smShape[0] || ctx4[1] != smShape[1] ||
      ctx4[2] != smShape[2])
    return fail(*tq, "q as [b, heads, s, head_dim] for scores [b, heads, s, s]");
  int64_t heads = ctx4[1];
  headDim = ctx4[3];
  if (!isScalar(scaleConst, scale->opType == "Div"
                                ? std::sqrt(double(headDim))
                                : 1.0 / std::sqrt(double(headDim)),
                1e-5))
    return fail(*scale, "the scale 1 / sqrt(" + Twine(headDim) + ")");
  std::vector<int64_t> out = shapeOf(root.outputs[0]);
  auto checkOutput = [&](ArrayRef<int64_t> qkvShape) -> LogicalResult {
    for (const Node *r : headReshapes) {
      std::vector<int64_t> h = shapeOf(r->outputs[0]);
      if (h != std::vector<int64_t>{qkvShape[0], qkvShape[1], heads, headDim})
      {
        (void)fail(*r, "a Reshape to [b, s, heads, head_dim]");
        return failure();
      }
    }
    if (out.size() != 3 || out[0] != qkvShape[0] || out[1] != qkvShape[1] ||
        out[2] != heads * headDim)
    {
      (void)fail(root, "a Reshape of the context to [b, s, heads * head_dim]");
      return failure();
    }
    if (tracedBatch >= 0 && qkvShape[0] != tracedBatch)
    {
      (void)fail(root, "the traced batch size " + Twine(tracedBatch));
      return failure();
    }
    return success();
  };
  auto coverCore = [&]() {
    for (const Node *n : {qk, scale, sm, pv, t3})
      cover(n);
    for (const TransposeChain *c : {&*cq, &*ck, &*cv})
      for (const Node *n : c->nodes)
        cover(n);
    for (const Node *n : headReshapes)
      cover(n);
  };
  FailureOr<Act> qkv = failure();
  if (blocks && (!split || split->opType != "Split")) {
    FailureOr<Act> fusedQkv = matchSeparateQKV(headReshapes, heads, headDim);
    if (failed(fusedQkv))
      return failure();
    std::vector<int64_t> x3 = shapeOf(headReshapes[0]->inputs[0]);
    if (x3.size() != 3 || failed(checkOutput({x3[0], x3[1], 3 * heads * headDim})))
      return failure();
    coverCore();
    qkv = *fusedQkv;
  } else {
    auto splitOutput = [&](int i) {
      return blocks ? headReshapes[size_t(i)]->inputs[0]
                    : *sources[i];
    };
    if (!split || split->opType != "Split" || split->outputs.size() != 3 ||
        splitOutput(0) != split->outputs[0] ||
        splitOutput(1) != split->outputs[1] ||
        splitOutput(2) != split->outputs[2])
      return fail(*tq, "q, k and v as the three outputs of one Split");
    std::vector<int64_t> splitIn = shapeOf(split->inputs[0]);
    int64_t part = blocks ? heads * headDim : headDim;
    int64_t axis = intAttr(*split, "axis", 0);
    bool lastAxis = axis == -1 || axis == int64_t(splitIn.size()) - 1;
    bool equalParts = true;
    if (split->inputs.size() > 1 && !split->inputs[1].empty()) {
      std::optional<Const> sizes = constant(split->inputs[1]);
      equalParts =
          sizes && sizes->values == std::vector<double>(3, double(part));
    } else if (const OnnxAttr *a = split->attr("split")) {
      equalParts = a->ints == std::vector<int64_t>(3, part);
    }
    if (!lastAxis || !equalParts)
      return fail(*split, blocks ? "a split of the last axis into q, k and v "
                                   "of hidden each ([q][k][v] blocks)"
                                 : "a split of the last axis into q, k, v of "
                                   "head_dim each (the QKV fused per head)");
    const Node *r0 = blocks ? nullptr : producedBy(split->inputs[0], "Reshape");
    std::string qkvValue = blocks ? split->inputs[0]
                                  : (r0 ? r0->inputs[0] : std::string());
    std::vector<int64_t> qkv3 = shapeOf(qkvValue);
    if ((!blocks && !r0) || qkv3.size() != 3 || qkv3[2] != 3 * heads * headDim)
      return fail(*split, "the QKV projection [b, s, 3 * hidden] split into "
                          "heads");
    if (!blocks && splitIn != std::vector<int64_t>{qkv3[0], qkv3[1], heads,
                                                    3 * headDim})
      return fail(*split, "a split of [b, s, heads, 3 * head_dim]");
    if (failed(checkOutput(qkv3)))
      return failure();
    if (blocks && numUsers(qkvValue) != 1)
      return fail(*split, "the QKV projection used by the attention alone (its "
                          "output features are reordered)");
    coverCore();
    cover(split);
    if (r0)
      cover(r0);
    // The reshape shape computations (Shape/Gather/Unsqueeze/Concat or
    // constants holding the traced batch) are covered with their Reshapes:
    // the nn op has a dynamic batch.
    qkv = materialise(qkvValue, blocks ? *split : *r0);
    if (failed(qkv))
      return failure();
    if (blocks) {
      auto linear = qkv->value.getDefiningOp<nn::LinearOp>();
      if (!linear) {
        error(*split) << "expected the QKV as the output of a linear layer (its "
                         "[q][k][v] blocks are reordered per head at import)";
        return failure();
      }
      for (Value p : {linear.getWeight(), linear.getBias()})
        for (auto &[name, info] : params)
          if (p && info.arg == p)
            qkvBlocks[name] = {heads, headDim};
    }
  }
  Value y = nn::AttentionOp::create(b, loc(root), qkv->value,
                                    b.getI64IntegerAttr(heads),
                                    b.getBoolAttr(causal));
  return mark(y, layerOf(root, {*qkv}));
}

std::optional<Importer::LinearParts>
Importer::linearParts(const std::string &v) {
  LinearParts parts;
  const Node *p = producerOf(v);
  if (!p || numUsers(v) != 1)
    return std::nullopt;
  auto weightOf = [&](const std::string &w) -> bool {
    if (const Node *t = producedBy(w, "Transpose", /*single=*/false)) {
      std::vector<int64_t> pm = perm(*t);
      const Tensor *init = initializer(t->inputs[0]);
      if (!init || init->shape.size() != 2 ||
          !(pm.empty() || pm == std::vector<int64_t>{1, 0}))
        return false;
      parts.weight = t->inputs[0];
      parts.nodes.push_back(t);
      return true;
    }
    const Tensor *init = initializer(w);
    if (!init || init->shape.size() != 2)
      return false;
    parts.weight = w;
    parts.transposed = true;
    return true;
  };
  if (p->opType == "Add") {
    for (int i = 0; i < 2; ++i) {
      const Tensor *bt = initializer(p->inputs[i]);
      const Node *mm = producedBy(p->inputs[1 - i], "MatMul");
      if (bt && bt->shape.size() == 1 && mm && weightOf(mm->inputs[1])) {
        parts.x = mm->inputs[0];
        parts.bias = p->inputs[i];
        parts.nodes.append({p, mm});
        return parts;
      }
    }
    return std::nullopt;
  }
  if (p->opType == "MatMul" && weightOf(p->inputs[1])) {
    parts.x = p->inputs[0];
    parts.nodes.push_back(p);
    return parts;
  }
  const Node *gemm = p->opType == "Gemm" ? p : nullptr;
  if (p->opType == "Reshape")
    if (const Node *g = producedBy(p->inputs[0], "Gemm"))
      if (const Node *flat = producedBy(g->inputs[0], "Reshape")) {
        gemm = g;
        parts.nodes.append({p, flat});
      }
  if (!gemm || gemm->inputs.size() < 2 || intAttr(*gemm, "transA", 0) != 0 ||
      (gemm->attr("alpha") && gemm->attr("alpha")->f != 1.0f) ||
      (gemm->attr("beta") && gemm->attr("beta")->f != 1.0f))
    return std::nullopt;
  const Tensor *w = initializer(gemm->inputs[1]);
  if (!w || w->shape.size() != 2)
    return std::nullopt;
  parts.x = p == gemm ? gemm->inputs[0] : parts.nodes.back()->inputs[0];
  parts.weight = gemm->inputs[1];
  parts.transposed = intAttr(*gemm, "transB", 0) == 0;
  if (gemm->inputs.size() > 2 && !gemm->inputs[2].empty()) {
    const Tensor *c = initializer(gemm->inputs[2]);
    if (!c || c->shape.size() != 1)
      return std::nullopt;
    parts.bias = gemm->inputs[2];
  }
  parts.nodes.push_back(gemm);
  return parts;
}

/// Attention whose q, k and v come from three projections of the same input
/// (q_proj, k_proj, v_proj): one fused projection in Megatron's per-head
/// layout, named <scope>.linear_qkv.{weight,bias} (the ONNX names of the
/// three are not parameters of the imported model).
FailureOr<Act> Importer::matchSeparateQKV(ArrayRef<const Node *> headReshapes,
                                          int64_t heads, int64_t headDim) {
  std::array<LinearParts, 3> parts;
  for (int t = 0; t < 3; ++t) {
    std::optional<LinearParts> lp = linearParts(headReshapes[size_t(t)]->inputs[0]);
    if (!lp) {
      error(*headReshapes[size_t(t)])
          << "expected " << "qkv"[t]
          << " from a linear layer (or q, k and v split from one fused "
             "projection)";
      return failure();
    }
    parts[size_t(t)] = *lp;
  }
  int64_t hidden = heads * headDim;
  for (int t = 0; t < 3; ++t) {
    const LinearParts &lp = parts[size_t(t)];
    const Tensor *w = initializer(lp.weight);
    int64_t outDim = lp.transposed ? w->shape[1] : w->shape[0];
    int64_t inDim = lp.transposed ? w->shape[0] : w->shape[1];
    const Tensor *bias = lp.bias.empty() ? nullptr : initializer(lp.bias);
    bool usable = w->elemType == onnx_model::kFloat &&
                  (!bias || bias->elemType == onnx_model::kFloat) &&
                  numUsers(lp.weight) == 1 &&
                  (lp.bias.empty() || numUsers(lp.bias) == 1) &&
                  (t == 0 || lp.weight != parts[0].weight);
    bool sameForm = usable && lp.x == parts[0].x &&
                    lp.bias.empty() == parts[0].bias.empty() &&
                    inDim == (parts[0].transposed ? initializer(parts[0].weight)->shape[0]
                                                  : initializer(parts[0].weight)->shape[1]);
    if (outDim != hidden || !sameForm || (!lp.bias.empty() && !bias) ||
        (bias && bias->shape != std::vector<int64_t>{hidden}) ||
        params.count(lp.weight) || (!lp.bias.empty() && params.count(lp.bias))) {
      error(*headReshapes[size_t(t)])
          << "expected q, k and v projections of the same input, each "
          << hidden << " wide, float, with or without biases alike, their "
                       "weights distinct and used by nothing else";
      return failure();
    }
  }
  for (const LinearParts &lp : parts)
    for (const Node *n : lp.nodes)
      cover(n);
  FailureOr<Act> x = materialise(parts[0].x, *headReshapes[0]);
  if (failed(x))
    return failure();
  // <scope>.linear_qkv.<weight|bias>, the scope the q weight's name shares
  // with k's and v's.
  auto fusedName = [&](auto member) {
    std::string q = parts[0].*member, k = parts[1].*member;
    size_t common = 0;
    while (common < q.size() && common < k.size() && q[common] == k[common])
      ++common;
    size_t dot = q.rfind('.', common ? common - 1 : 0);
    std::string scope = dot == std::string::npos ? "" : q.substr(0, dot + 1);
    if (common == 0 || dot == std::string::npos)
      scope.clear();
    std::string leaf = q.substr(q.rfind('.') + 1);
    return scope + "linear_qkv." + leaf;
  };
  auto makeParam = [&](const std::string &name, SmallVector<int64_t> shape,
                       auto member, llvm::StringRef noWeightsInit) -> Value {
    bool haveData = true;
    FusedQKV f{{parts[0].*member, parts[1].*member, parts[2].*member},
               {member == &LinearParts::weight && parts[0].transposed,
                member == &LinearParts::weight && parts[1].transposed,
                member == &LinearParts::weight && parts[2].transposed},
               heads, headDim};
    for (const std::string &src : f.sources)
      haveData &= initializer(src)->hasData;
    Value arg = block->addArgument(RankedTensorType::get(shape, b.getF32Type()),
                                   loc(*headReshapes[0]));
    SmallVector<NamedAttribute> attrs = {
        b.getNamedAttr(tessera::kParamAttr, b.getStringAttr(name))};
    if (options.loadWeights && haveData)
      attrs.push_back(b.getNamedAttr(tessera::kInitAttr, b.getStringAttr("data")));
    else if (!noWeightsInit.empty())
      attrs.push_back(b.getNamedAttr(tessera::kInitAttr,
                                     b.getStringAttr(noWeightsInit)));
    argAttrs.push_back(b.getDictionaryAttr(attrs));
    params[name] = ParamInfo{arg, ParamUse::Linear, false, headReshapes[0]};
    paramOrder.push_back(name);
    fused[name] = f;
    return arg;
  };
  const Tensor *w0 = initializer(parts[0].weight);
  int64_t inDim = parts[0].transposed ? w0->shape[0] : w0->shape[1];
  std::string wName = fusedName(&LinearParts::weight);
  if (params.count(wName) || inits.count(wName)) {
    error(*headReshapes[0]) << "the fused QKV parameter name '" << wName
                            << "' is taken";
    return failure();
  }
  Value W = makeParam(wName, {3 * hidden, inDim}, &LinearParts::weight, "");
  Value B;
  if (!parts[0].bias.empty())
    B = makeParam(fusedName(&LinearParts::bias), {3 * hidden},
                  &LinearParts::bias, "zeros");
  Value y = nn::LinearOp::create(b, loc(*parts[0].nodes.front()), x->value, W, B);
  return mark(y, paramLayerOf(*headReshapes[0], parts[0].weight));
}

FailureOr<Act> Importer::addLoss(Act logits, std::optional<int64_t> ignoreIndex,
                                 Location at) {
  auto lt = cast<RankedTensorType>(logits.value.getType());
  SmallVector<int64_t> shape(lt.getShape().drop_back());
  Value lab = labelsArg(shape);
  Value ce = nn::SoftmaxCrossEntropyOp::create(
      b, at, logits.value, lab,
      ignoreIndex ? b.getI64IntegerAttr(*ignoreIndex) : IntegerAttr());
  Value loss;
  if (ignoreIndex)
    loss = nn::TokenMeanOp::create(b, at, ce, lab, Value(),
                                   b.getI64IntegerAttr(*ignoreIndex));
  else
    loss = nn::MeanOp::create(b, at, ce);
  return Act{loss, -1};
}

/// SoftmaxCrossEntropyLoss with the mean reduction over the logits, either
/// [b, classes] with labels [b], or Reshape(logits [b, s, V], [-1, V]) with
/// Reshape(labels [b, s], [-1]).
FailureOr<Act> Importer::matchLoss(const Node &n) {
  const OnnxAttr *red = n.attr("reduction");
  std::string reduction = red ? red->s : "mean";
  if (reduction != "mean") {
    error(n) << "expected the mean reduction, got '" << reduction << "'";
    return failure();
  }
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    error(n) << "class weights are not imported; expected (scores, labels)";
    return failure();
  }
  if (n.outputs.size() > 1 && !n.outputs[1].empty() && numUsers(n.outputs[1])) {
    error(n) << "its log-probability output is used; expected only the loss";
    return failure();
  }
  std::optional<int64_t> ignore;
  if (const OnnxAttr *a = n.attr("ignore_index"))
    ignore = a->i;
  std::string scores = n.inputs[0], labelsValue = n.inputs[1];
  if (const Node *r = producedBy(scores, "Reshape")) {
    std::vector<int64_t> from = shapeOf(r->inputs[0]), to = shapeOf(scores);
    const Node *rl = producedBy(labelsValue, "Reshape");
    if (from.size() != 3 || to.size() != 2 || to[1] != from[2] || !rl ||
        !graphInputs.count(rl->inputs[0]) ||
        shapeOf(rl->inputs[0]) != std::vector<int64_t>{from[0], from[1]}) {
      error(*r) << "expected the logits [b, s, vocab] flattened to [b * s, "
                   "vocab] and the labels [b, s] input flattened alike";
      return failure();
    }
    cover(r);
    cover(rl);
    scores = r->inputs[0];
    labelsValue = rl->inputs[0];
  } else if (!graphInputs.count(labelsValue)) {
    error(n) << "expected the labels as a graph input";
    return failure();
  } else if (shapeOf(scores).size() != 2) {
    error(n) << "expected scores [batch, classes] (ONNX puts the classes on "
                "axis 1), or logits [b, s, vocab] reshaped to [b * s, vocab]";
    return failure();
  }
  FailureOr<Act> logits = materialise(scores, n);
  if (failed(logits))
    return failure();
  auto lt = cast<RankedTensorType>(logits->value.getType());
  std::vector<int64_t> labShape = shapeOf(labelsValue);
  if (labShape.size() + 1 != size_t(lt.getRank())) {
    error(n) << "expected labels of rank " << lt.getRank() - 1 << ", got '"
             << labelsValue << "' of rank " << labShape.size();
    return failure();
  }
  return addLoss(*logits, ignore, loc(n));
}

//===----------------------------------------------------------------------===//
// The module
//===----------------------------------------------------------------------===//

Attribute Importer::weightsAttr() {
  SmallVector<NamedAttribute> entries;
  for (const std::string &name : paramOrder) {
    const ParamInfo &info = params[name];
    auto type = cast<RankedTensorType>(info.arg.getType());
    if (auto f = fused.find(name); f != fused.end()) {
      // Rows h * 3D + t * D + d of the fused projection are row h * D + d
      // of projection t (q, k, v), each stored [out, in] or [in, out].
      const FusedQKV &q = f->second;
      if (!llvm::all_of(q.sources, [&](const std::string &src) {
            return initializer(src)->hasData;
          }))
        continue;
      int64_t cols = type.getRank() == 2 ? type.getDimSize(1) : 1;
      std::vector<float> values(size_t(type.getNumElements()));
      for (int t = 0; t < 3; ++t) {
        const Tensor *src = initializer(q.sources[size_t(t)]);
        if (src->isExternal() ||
            int64_t(src->data.size()) != src->numElements() * 4) {
          error() << "parameter '" << q.sources[size_t(t)]
                  << "' is fused into '" << name
                  << "', which needs its data inline (not in an "
                     "external-data file)";
          return {};
        }
        const float *data = reinterpret_cast<const float *>(src->data.data());
        int64_t rows = q.heads * q.headDim;
        for (int64_t r = 0; r < rows; ++r) {
          int64_t to = perHeadRow(t, r, q.headDim);
          for (int64_t c = 0; c < cols; ++c)
            values[size_t(to * cols + c)] =
                q.transposed[size_t(t)] ? data[c * rows + r] : data[r * cols + c];
        }
      }
      auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign<float>(values);
      entries.push_back(b.getNamedAttr(
          name, DenseResourceElementsAttr::get(type, name, std::move(blob))));
      continue;
    }
    const Tensor *t = initializer(name);
    if (!t->hasData)
      continue;
    if (t->isExternal()) {
      if (qkvBlocks.count(name)) {
        error() << "parameter '" << name
                << "' is a QKV projection in [q][k][v] blocks stored in an "
                   "external-data file; Tessera reorders it per head, which "
                   "it does for inline weights only";
        return {};
      }
      if (info.transposed) {
        error() << "parameter '" << name
                << "' is stored [in, out] in an external-data file; Tessera "
                   "needs [out, in] there (re-export through nn.Linear)";
        return {};
      }
      int64_t bytes = t->numElements() * 4;
      if (t->externalLength >= 0 && t->externalLength != bytes) {
        error() << "parameter '" << name << "': external data length "
                << t->externalLength << " != " << bytes << " bytes of "
                << "its shape";
        return {};
      }
      if (t->externalOffset > t->externalFileBytes - bytes) {
        error() << "parameter '" << name << "': its " << bytes
                << " bytes at offset " << t->externalOffset << " run past the "
                << "end of " << t->externalPath() << " ("
                << t->externalFileBytes << " bytes)";
        return {};
      }
      entries.push_back(b.getNamedAttr(
          name, b.getDictionaryAttr(
                    {b.getNamedAttr("dir", b.getStringAttr(t->externalDir)),
                     b.getNamedAttr("file", b.getStringAttr(t->externalFile)),
                     b.getNamedAttr("offset",
                                    b.getI64IntegerAttr(t->externalOffset)),
                     b.getNamedAttr("shape", b.getDenseI64ArrayAttr(
                                                 type.getShape()))})));
      continue;
    }
    int64_t n = t->numElements();
    if (int64_t(t->data.size()) != n * 4) {
      error() << "parameter '" << name << "' holds " << t->data.size()
              << " bytes; its shape needs " << n * 4;
      return {};
    }
    // The model's bytes are released as soon as the module holds them, so
    // a model is in memory once, not twice.
    auto release = [&] { std::string().swap(const_cast<Tensor *>(t)->data); };
    auto qkv = qkvBlocks.find(name);
    if (!info.transposed && qkv == qkvBlocks.end()) {
      auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign<float>(
          ArrayRef<float>(reinterpret_cast<const float *>(t->data.data()),
                          size_t(n)));
      release();
      entries.push_back(b.getNamedAttr(
          name, DenseResourceElementsAttr::get(type, name, std::move(blob))));
      continue;
    }
    std::vector<float> values(static_cast<size_t>(n));
    std::memcpy(values.data(), t->data.data(), size_t(n) * 4);
    release();
    if (info.transposed) { // [in, out] -> [out, in]
      int64_t rows = t->shape[0], cols = t->shape[1];
      std::vector<float> tr(values.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          tr[size_t(c * rows + r)] = values[size_t(r * cols + c)];
      values.swap(tr);
    }
    if (qkv != qkvBlocks.end()) {
      // Rows (or elements) t * H + h * D + d ([q][k][v] blocks) move to
      // h * 3D + t * D + d (per head, Megatron's fused QKV).
      auto [heads, headDim] = qkv->second;
      int64_t cols = type.getRank() == 2 ? type.getDimSize(1) : 1;
      int64_t hidden = heads * headDim;
      std::vector<float> perm(values.size());
      for (int64_t from = 0; from < 3 * hidden; ++from)
        std::memcpy(&perm[size_t(perHeadRow(from / hidden, from % hidden,
                                            headDim) * cols)],
                    &values[size_t(from * cols)], size_t(cols) * 4);
      values.swap(perm);
    }
    auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign<float>(values);
    entries.push_back(b.getNamedAttr(
        name, DenseResourceElementsAttr::get(type, name, std::move(blob))));
  }
  return b.getDictionaryAttr(entries);
}

OwningOpRef<ModuleOp> Importer::run() {
  // The opset and domains first: nothing else is meaningful if they differ.
  auto std = model.opsets.find("");
  if (std == model.opsets.end() || std->second < kMinOpset) {
    error() << "the model imports opset "
            << (std == model.opsets.end() ? 0 : std->second)
            << " of the standard domain (ai.onnx); expected " << kMinOpset
            << " or later (re-export with torch.onnx.export(..., "
               "opset_version=17))";
    return nullptr;
  }
  if (!model.checked) {
    error() << "the model (opset " << std->second << ", IR version "
            << model.irVersion << ") is newer than the onnx library's shape "
            << "inference (opset " << model.libraryOpset << ", IR version 8), "
            << "which this importer needs; export with opset_version=17 and "
               "dynamo=False, or read the graph with --import-onnx-graph";
    return nullptr;
  }
  for (const Node &n : model.nodes) {
    if (!n.domain.empty()) {
      error(n) << "domain '" << n.domain
               << "' is not supported; expected the standard ONNX domain "
                  "(ai.onnx)";
      return nullptr;
    }
    if (!kSupportedOps.count(n.opType)) {
      error(n) << "unsupported op type; the importer handles linear layers "
                  "(MatMul, Gemm), GELU (erf or tanh), ReLU, attention, embeddings, "
                  "LayerNormalization and SoftmaxCrossEntropyLoss";
      return nullptr;
    }
  }
  for (const Node &n : model.nodes) {
    for (const std::string &o : n.outputs)
      if (!o.empty())
        producers[o] = &n;
    for (const std::string &i : n.inputs)
      if (!i.empty())
        users[i].push_back(&n);
  }
  for (const Tensor &t : model.initializers)
    inits[t.name] = &t;
  for (const ValueInfo &v : model.inputs)
    if (!inits.count(v.name))
      graphInputs.insert(v.name);
  if (model.outputs.size() != 1) {
    error() << "the graph has " << model.outputs.size()
            << " outputs; expected one (the loss, or the logits)";
    return nullptr;
  }

  OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
  b.setInsertionPointToEnd(module->getBody());
  std::string fname;
  for (char c : llvm::sys::path::stem(model.path))
    fname += llvm::isAlnum(c) || c == '_' ? c : '_';
  if (fname.empty() || llvm::isDigit(fname[0]))
    fname = "model_" + fname;
  auto func = func::FuncOp::create(b, fileLoc, fname, b.getFunctionType({}, {}));
  block = func.addEntryBlock();
  b.setInsertionPointToStart(block);

  const ValueInfo &out = model.outputs[0];
  const Node *outNode = producerOf(out.name);
  if (!outNode) {
    error() << "the graph output '" << out.name << "' is not computed";
    return nullptr;
  }
  FailureOr<Act> result;
  if (out.hasShape && out.shape.empty()) {
    if (!options.loss.empty()) {
      error() << "--loss " << options.loss
              << " given, but the model already returns a scalar (its loss)";
      return nullptr;
    }
    result = materialise(out.name, *outNode);
  } else if (out.shape.size() == 3 && out.elemType == onnx_model::kFloat) {
    if (options.loss != "cross-entropy") {
      error() << "the model returns '" << out.name
              << "' [batch, seq, vocab], not a loss: give --loss cross-entropy "
                 "to train it with the mean token cross-entropy";
      return nullptr;
    }
    FailureOr<Act> logits = materialise(out.name, *outNode);
    if (succeeded(logits))
      result = addLoss(*logits, int64_t(-100), loc(*outNode));
  } else {
    error() << "the graph output '" << out.name
            << "' is neither a scalar loss nor logits [batch, seq, vocab]";
    return nullptr;
  }
  if (failed(result) || hadError)
    return nullptr;
  if (auto t = cast<RankedTensorType>(result->value.getType()); t.getRank() != 0) {
    error() << "the graph output '" << out.name << "' is not a scalar loss";
    return nullptr;
  }
  func::ReturnOp::create(b, fileLoc, result->value);
  func.setType(b.getFunctionType(block->getArgumentTypes(),
                                 {result->value.getType()}));
  func.setAllArgAttrs(argAttrs);
  if (options.loadWeights) {
    Attribute weights = weightsAttr();
    if (!weights)
      return nullptr;
    if (!cast<DictionaryAttr>(weights).empty())
      (*module)->setAttr(tessera::kWeightsAttr, weights);
  }
  // Every node must belong to the imported computation or to the shape
  // computations of the Reshapes the patterns covered.
  // Shape computations: small integer arithmetic whose results only feed
  // Reshape shapes, other shape computations, or nodes a pattern covered
  // (the constant folder evaluated them), found from the last node back.
  static const std::set<std::string> kShapeOps = {
      "Constant", "Shape",  "Gather", "Unsqueeze", "Concat", "Squeeze",
      "Cast",     "Mul",    "Add",    "Sub",       "Div",    "Range",
      "ConstantOfShape"};
  std::set<const Node *> shapeOnly;
  for (auto it = model.nodes.rbegin(); it != model.nodes.rend(); ++it) {
    const Node &n = *it;
    if (covered.count(&n) || !kShapeOps.count(n.opType))
      continue;
    auto info = model.values.find(n.outputs.empty() ? "" : n.outputs[0]);
    bool integral = info != model.values.end() &&
                    (info->second.elemType == onnx_model::kInt64 ||
                     info->second.elemType == onnx_model::kInt32 ||
                     info->second.elemType == onnx_model::kBool);
    bool feedsShapes = integral || n.opType == "Constant";
    for (const std::string &o : n.outputs)
      for (const Node *u : users[o])
        feedsShapes &= shapeOnly.count(u) || covered.count(u) ||
                       (u->opType == "Reshape" && u->inputs.size() > 1 &&
                        u->inputs[1] == o);
    if (feedsShapes)
      shapeOnly.insert(&n);
  }
  // Every other node must belong to the imported computation.
  for (const Node &n : model.nodes) {
    if (covered.count(&n) || shapeOnly.count(&n))
      continue;
    bool used = false;
    for (const std::string &o : n.outputs)
      used |= numUsers(o) != 0;
    if (!used && n.outputs.size() && n.outputs[0] != out.name) {
      // Dead code: nothing reads it.
      continue;
    }
    error(n) << "not part of a recognised pattern (its result does not reach "
                "the imported computation the way the patterns expect)";
    return nullptr;
  }
  return module;
}

} // namespace

bool tessera::onnxMatcherHandles(const Model &model) {
  if (!model.checked)
    return false;
  for (const Node &n : model.nodes)
    if (n.domain.empty() && !kSupportedOps.count(n.opType))
      return false;
  return true;
}

OwningOpRef<ModuleOp> tessera::importOnnxModel(MLIRContext *context,
                                               llvm::StringRef path,
                                               const OnnxImportOptions &options) {
  context->loadDialect<nn::NNDialect, func::FuncDialect>();
  Model model;
  // The weights are read here even without loadWeights when the patterns
  // raise the model: folding reads buffers (masks, rotary tables).
  std::string error = onnx_model::loadModel(path.str(), /*loadWeights=*/true, model);
  if (!error.empty()) {
    emitError(FileLineColLoc::get(context, path, 0, 0)) << error;
    return nullptr;
  }
  if (onnxMatcherHandles(model)) {
    if (!options.loadWeights)
      for (onnx_model::Tensor &t : model.initializers)
        if (t.elemType == onnx_model::kFloat && !t.isExternal()) {
          std::string().swap(t.data);
          t.hasData = false;
        }
    Importer importer(context, model, options);
    return importer.run();
  }
  // The pattern importer: the graph node for node, simplified, raised.
  OwningOpRef<ModuleOp> module = importOnnxGraph(context, model);
  if (!module)
    return nullptr;
  // Errors name the ONNX node; the op's printed form would repeat it.
  bool printOp = context->shouldPrintOpOnDiagnostic();
  context->printOpOnDiagnostic(false);
  auto restore = llvm::make_scope_exit([&] { context->printOpOnDiagnostic(printOp); });
  PassManager pm(context);
  pm.addPass(onnx::createOnnxSimplifyPass());
  pm.addPass(createCSEPass());
  OnnxToNNPassOptions raise;
  raise.loss = options.loss;
  raise.loadWeights = options.loadWeights;
  pm.addPass(createOnnxToNNPass(raise));
  if (failed(pm.run(*module)))
    return nullptr;
  (*module)->removeAttr(onnx::kOpsetsAttr);
  return module;
}
