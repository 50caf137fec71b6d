//===- Patterns.cpp - ONNX subgraphs raised to nn ops ---------------------===//
//
// One rewrite pattern per construct a PyTorch export decomposes. Each is
// rooted at the construct's last node, checks every node back to its
// inputs (op types, attributes, constants, shapes) and replaces the root by
// the nn ops tessera-gen emits for the same model. Parameters stay
// "parameter views" (onnx.node "TesseraParam") over their initializers
// until tessera-onnx-to-nn gives them arguments.
//
// Layout. ONNX activations are batch-major [b, s, ...]; Tessera's are
// sequence-major. Per-token ops (linear, norms, activations, residual
// adds) are raised on whatever layout their operands have. The patterns
// whose result depends on positions (embedding, attention, loss) swap
// their inputs to sequence-major and their results back; the Layout
// patterns then move the swaps through the per-token ops until they cancel.
//
// Adding a construct: a pattern class here (match from the last node back,
// fail with notifyMatchFailure when anything differs), its phase in
// populateOnnxToNNPatterns, and a lit test in test/Conversion/onnx-to-nn*.
//
//===----------------------------------------------------------------------===//

#include "Matchers.h"
#include "Patterns.h"

#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/PatternMatch.h"

#include <cmath>
#include <cstring>
#include <limits>

using namespace mlir;
namespace nn = tessera::nn;
namespace onnx = tessera::onnx;
using onnx::NodeOp;

namespace tessera::onnx_to_nn {
namespace {

/// Marks `op` with the decoder layer of `scope` (when it names one).
void markLayer(Operation *op, StringRef scope) {
  int64_t layer = layerIndexOf(scope);
  if (layer >= 0)
    op->setAttr(tessera::kLayerAttr, Builder(op->getContext()).getI64IntegerAttr(layer));
}

/// The uses of an initializer by the graph, counted before any pattern ran
/// (recordUses): names must not depend on the order patterns fire in.
unsigned graphUses(onnx::InitializerOp init) {
  auto a = init->getAttrOfType<IntegerAttr>(kUsesAttr);
  return a ? unsigned(a.getInt()) : 0;
}

/// Whether the initializer is a word embedding's table (read by a Gather)
/// that another node also reads: the LM head tied to it (recordUses).
bool isTiedEmbedding(onnx::InitializerOp init) {
  return init->hasAttr(kTiedAttr);
}

/// A parameter's name: the initializer's own, when it names a parameter
/// (`<module>.<leaf>`, as the TorchScript exporter keeps them) used once,
/// or a tied embedding's; otherwise `<scope>.<leaf>` from the module that
/// reads it (the dynamo exporter renames transposed weights `val_N` and
/// merges equal initializers, which different modules then read).
std::string paramName(StringRef scope, StringRef leaf, onnx::InitializerOp init) {
  StringRef name = init.getName();
  bool named = name.ends_with(("." + leaf).str()) && !name.starts_with("val_") &&
               !name.starts_with("onnx::");
  if (named && (graphUses(init) == 1 || isTiedEmbedding(init)))
    return name.str();
  if (!scope.empty())
    return (scope + "." + leaf).str();
  return name.str();
}

/// `v` is an activation: computed from the inputs, not a constant.
bool isActivation(Value v) {
  return !onnx::getConstantValue(v) && !v.getDefiningOp<onnx::InitializerOp>() &&
         isa<RankedTensorType>(v.getType());
}

/// `v` is made by an nn op (through layout swaps).
bool isRaised(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (isBatchSeqSwap(def))
    return isRaised(def->getOperand(0));
  return isa<nn::NNDialect>(def->getDialect());
}

/// Matches a commutative binary node's operands: calls `fn(a, b)` for both
/// orders and returns the first success.
template <typename Fn>
bool eitherOrder(NodeOp n, Fn fn) {
  if (n.getInputs().size() != 2)
    return false;
  return fn(n.getInputs()[0], n.getInputs()[1]) ||
         fn(n.getInputs()[1], n.getInputs()[0]);
}

//===----------------------------------------------------------------------===//
// RMSNorm: w * (x * 1/sqrt(mean(x^2) + eps)), as LlamaRMSNorm and its
// relatives export it (Reciprocal or Div(1, .); Div(x, Sqrt) too), and
// opset 23's RMSNormalization.
//===----------------------------------------------------------------------===//

std::optional<std::pair<Value, double>> matchRms(Value sq);

/// x and eps when `r` is 1/sqrt(mean(x^2, -1) + eps) over x.
std::optional<std::pair<Value, double>> matchInvRms(Value r) {
  Value sq;
  if (NodeOp rec = producer(r, "Reciprocal"))
    sq = rec.getInputs()[0];
  else if (NodeOp div = producer(r, "Div"); div && isScalar(div.getInputs()[0], 1.0))
    sq = div.getInputs()[1];
  else
    return std::nullopt;
  return matchRms(sq);
}

/// x and eps when `sq` is sqrt(mean(x^2, -1) + eps).
std::optional<std::pair<Value, double>> matchRms(Value sq) {
  NodeOp sqrt = producer(sq, "Sqrt");
  if (!sqrt)
    return std::nullopt;
  NodeOp add = producer(sqrt.getInputs()[0], "Add");
  if (!add)
    return std::nullopt;
  std::optional<std::pair<Value, double>> result;
  eitherOrder(add, [&](Value mean, Value eps) {
    std::optional<double> e = scalarValue(eps);
    NodeOp rm = producer(mean, "ReduceMean");
    if (!e || !rm || rm.getInt("keepdims", 1) != 1)
      return false;
    std::optional<SmallVector<int64_t>> axes = rm.getInts("axes")
                                                   ? std::optional<SmallVector<int64_t>>(
                                                         SmallVector<int64_t>(*rm.getInts("axes")))
                                                   : intValues(rm.getInputOrNull(1));
    NodeOp pow = producer(rm.getInputs()[0], "Pow");
    Value x;
    if (pow && isScalar(pow.getInputs()[1], 2.0))
      x = pow.getInputs()[0];
    else if (NodeOp mul = producer(rm.getInputs()[0], "Mul");
             mul && mul.getInputs()[0] == mul.getInputs()[1])
      x = mul.getInputs()[0];
    int64_t rank = int64_t(shapeOf(x).size());
    if (!x || !axes || axes->size() != 1 ||
        ((*axes)[0] != -1 && (*axes)[0] != rank - 1))
      return false;
    result = std::make_pair(x, *e);
    return true;
  });
  return result;
}

struct RaiseRMSNorm : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() == "RMSNormalization")
      return raiseOpset23(root, rewriter);
    if (root.getOpType() != "Mul" || root.getInputs().size() != 2)
      return failure();
    Value x, weight;
    double eps = 0;
    bool ok = eitherOrder(root, [&](Value w, Value normed) {
      auto init = w.getDefiningOp<onnx::InitializerOp>();
      if (!init || init.getType().getRank() != 1)
        return false;
      // normed = x * inv_rms (either order) or x / sqrt(...)
      if (NodeOp div = producer(normed, "Div")) {
        auto m = matchRms(div.getInputs()[1]);
        if (!m || m->first != div.getInputs()[0])
          return false;
        x = m->first;
        eps = m->second;
        weight = w;
        return true;
      }
      if (NodeOp mul = producer(normed, "Mul")) {
        return eitherOrder(mul, [&](Value a, Value r) {
          auto m = matchInvRms(r);
          if (!m || m->first != a)
            return false;
          x = a;
          eps = m->second;
          weight = w;
          return true;
        });
      }
      return false;
    });
    if (!ok)
      return rewriter.notifyMatchFailure(root, "not an RMSNorm");
    auto wType = cast<RankedTensorType>(weight.getType());
    if (shapeOf(x).empty() || shapeOf(x).back() != wType.getDimSize(0))
      return rewriter.notifyMatchFailure(root, "weight does not match the features");
    StringRef scope = scopeOf(root);
    auto init = weight.getDefiningOp<onnx::InitializerOp>();
    Value w = createParamView(rewriter, root.getLoc(), wType,
                              paramName(scope, "weight", init), "identity", {weight});
    auto op = nn::RMSNormOp::create(rewriter, root.getLoc(), x, w,
                                    rewriter.getF32FloatAttr(float(eps)));
    markLayer(op, scope);
    rewriter.replaceOp(root, op.getResult());
    return success();
  }

  LogicalResult raiseOpset23(NodeOp root, PatternRewriter &rewriter) const {
    Value x = root.getInputs()[0];
    auto init = root.getInputOrNull(1)
                    ? root.getInputs()[1].getDefiningOp<onnx::InitializerOp>()
                    : nullptr;
    int64_t rank = int64_t(shapeOf(x).size());
    int64_t axis = root.getInt("axis", -1);
    if (!init || init.getType().getRank() != 1 || (axis != -1 && axis != rank - 1))
      return rewriter.notifyMatchFailure(root, "RMSNormalization over other than the last axis");
    StringRef scope = scopeOf(root);
    Value w = createParamView(rewriter, root.getLoc(), init.getType(),
                              paramName(scope, "weight", init), "identity", {init});
    auto op = nn::RMSNormOp::create(rewriter, root.getLoc(), x, w,
                                    rewriter.getF32FloatAttr(root.getFloat("epsilon", 1e-5f)));
    markLayer(op, scope);
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Linear layers
//===----------------------------------------------------------------------===//

/// The parts of MatMul(x, W) [+ bias]: x, the weight and the bias
/// initializer (or null), and the MatMul.
struct LinearParts {
  Value x;
  WeightRef weight;
  onnx::InitializerOp bias;
  NodeOp matmul;
};

/// Hugging Face's Conv1D: Reshape(Gemm(Reshape(x [b, s, in], [b s, in]),
/// W [in, out], bias), [b, s, out]) (torch.addmm on the flattened tokens).
std::optional<LinearParts> matchFlattenedGemm(Value v) {
  NodeOp outer = producer(v, "Reshape");
  NodeOp gemm = outer ? producer(outer.getInputs()[0], "Gemm") : nullptr;
  NodeOp inner = gemm ? producer(gemm.getInputs()[0], "Reshape") : nullptr;
  if (!inner || gemm.getInt("transA", 0) || gemm.getFloat("alpha", 1.0f) != 1.0f ||
      gemm.getFloat("beta", 1.0f) != 1.0f)
    return std::nullopt;
  Value x = inner.getInputs()[0];
  ArrayRef<int64_t> xs = shapeOf(x), ys = shapeOf(v);
  auto init = gemm.getInputs()[1].getDefiningOp<onnx::InitializerOp>();
  if (!init || !isActivation(x) || xs.size() != 3 || ys.size() != 3 || xs[0] != ys[0] ||
      xs[1] != ys[1])
    return std::nullopt;
  LinearParts p;
  p.x = x;
  p.weight = WeightRef{init, /*inOut=*/gemm.getInt("transB", 0) == 0};
  if (Value c = gemm.getInputOrNull(2)) {
    p.bias = c.getDefiningOp<onnx::InitializerOp>();
    if (!p.bias || p.bias.getType().getRank() != 1)
      return std::nullopt;
  }
  p.matmul = gemm;
  return p;
}

std::optional<LinearParts> matchLinear(Value v) {
  if (std::optional<LinearParts> flat = matchFlattenedGemm(v))
    return flat;
  LinearParts p;
  Value mm = v;
  if (NodeOp add = producer(v, "Add")) {
    bool ok = eitherOrder(add, [&](Value a, Value b) {
      auto init = b.getDefiningOp<onnx::InitializerOp>();
      if (!init || init.getType().getRank() != 1 || !producer(a, "MatMul"))
        return false;
      p.bias = init;
      mm = a;
      return true;
    });
    if (!ok)
      return std::nullopt;
  }
  p.matmul = producer(mm, "MatMul");
  if (!p.matmul)
    return std::nullopt;
  std::optional<WeightRef> w = matmulWeight(p.matmul.getInputs()[1]);
  if (!w || !isActivation(p.matmul.getInputs()[0]) ||
      shapeOf(p.matmul.getInputs()[0]).size() < 2)
    return std::nullopt;
  p.weight = *w;
  p.x = p.matmul.getInputs()[0];
  int64_t out = p.weight.init.getType().getDimSize(p.weight.inOut ? 1 : 0);
  if (p.bias && p.bias.getType().getDimSize(0) != out)
    return std::nullopt;
  return p;
}

/// The [out, in] parameter of a linear's weight.
Value linearWeight(OpBuilder &b, Location loc, WeightRef w, StringRef name) {
  auto t = w.init.getType();
  int64_t in = t.getDimSize(w.inOut ? 0 : 1), out = t.getDimSize(w.inOut ? 1 : 0);
  return createParamView(b, loc, RankedTensorType::get({out, in}, t.getElementType()),
                         name, w.inOut ? "transpose" : "identity", ValueRange{w.init});
}

BlockArgument tokenInput(Value v, unsigned rank = 2);

/// The word-embedding table a linear's weight is a copy of (the LM head of
/// a tied model, when the exporter folded the head's Transpose into a new
/// initializer: the TorchScript exporter with constant folding, the dynamo
/// exporter): an initializer read by a Gather of token ids whose values
/// equal the weight's, bit for bit, and are not all one value (read from
/// external data when they are there). A separately (randomly) initialised
/// head never is.
onnx::InitializerOp tiedTable(NodeOp anchor, WeightRef w) {
  auto wt = w.init.getType();
  int64_t out = wt.getDimSize(w.inOut ? 1 : 0), in = wt.getDimSize(w.inOut ? 0 : 1);
  onnx::InitializerOp found;
  anchor->getParentOp()->walk([&](NodeOp g) {
    // An embedding not raised yet (Gather of token ids), or raised (the
    // parameter view nn.embedding reads).
    bool lookup = g.getOpType() == "Gather" && g.getInt("axis", 0) == 0 &&
                  tokenInput(g.getInputs()[1]);
    bool raised = g.getOpType() == kParamView &&
                  llvm::any_of(g->getUsers(), [](Operation *u) { return isa<nn::EmbeddingOp>(u); });
    if (found || (!lookup && !raised))
      return;
    auto table = g.getInputs()[0].getDefiningOp<onnx::InitializerOp>();
    if (!table || table == w.init || table.getType().getRank() != 2 ||
        table.getType().getDimSize(0) != out || table.getType().getDimSize(1) != in)
      return;
    // The values, inline or in external data (f32: a parameter's).
    auto values = [](onnx::InitializerOp init) -> std::optional<std::vector<float>> {
      if (auto v = constValues(init))
        return std::vector<float>(v->begin(), v->end());
      if (!init.getExternalAttr() || !init.getType().getElementType().isF32())
        return std::nullopt;
      // (No diagnostic: a file that cannot be read is reported when the
      // parameter is built.)
      ScopedDiagnosticHandler quiet(init.getContext(), [](Diagnostic &) { return success(); });
      FailureOr<std::vector<float>> f = readInitializer(init);
      if (failed(f))
        return std::nullopt;
      return std::move(*f);
    };
    // A few elements first (of the first row): an untied head differs
    // there, and its two large matrices are then never read whole.
    for (int64_t c = 0; c < std::min<int64_t>(in, 16); ++c) {
      std::optional<float> x = initializerElement(table, c),
                           y = initializerElement(w.init, w.inOut ? c * out : c);
      if (!x || !y || std::memcmp(&*x, &*y, sizeof(float)) != 0)
        return;
    }
    auto a = values(table);
    if (!a)
      return;
    auto b = values(w.init);
    // Equal values say the head is a copy of the table only when they
    // vary: two tensors of one constant (zeros) are not the same parameter.
    if (!a || !b || a->size() != b->size() ||
        llvm::all_of(*a, [&](float e) { return e == a->front(); }))
      return;
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        float x = (*a)[size_t(r * in + c)];
        float y = w.inOut ? (*b)[size_t(c * out + r)] : (*b)[size_t(r * in + c)];
        if (std::memcmp(&x, &y, sizeof x) != 0)
          return;
      }
    found = table;
  });
  return found;
}

struct RaiseLinear : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Add" && root.getOpType() != "MatMul" &&
        root.getOpType() != "Reshape")
      return failure();
    if (root.getOpType() == "MatMul")
      for (Operation *user : root->getUsers())
        if (auto add = dyn_cast<NodeOp>(user); add && add.getOpType() == "Add" &&
                                               matchLinear(add.getResult(0)))
          return rewriter.notifyMatchFailure(root, "the bias Add closes this linear");
    std::optional<LinearParts> p = matchLinear(root.getResult(0));
    if (!p)
      return rewriter.notifyMatchFailure(root, "not a linear layer");
    StringRef scope = scopeOf(p->matmul);
    Location loc = root.getLoc();
    Value w;
    if (onnx::InitializerOp table = p->bias ? nullptr : tiedTable(root, p->weight)) {
      // The tied LM head reads the embedding's own parameter.
      NodeOp gather;
      for (Operation *u : table->getUsers())
        if (auto g = dyn_cast<NodeOp>(u); g && g.getOpType() == "Gather")
          gather = g;
      std::string name = paramName(gather ? scopeOf(gather) : scope, "weight", table);
      for (Operation *u : table->getUsers())
        if (auto v = dyn_cast<NodeOp>(u); v && v.getOpType() == kParamView)
          name = v.getString("name", name).str(); // the embedding's, if raised
      w = createParamView(rewriter, loc, table.getType(), name, "identity", {table});
    } else {
      w = linearWeight(rewriter, loc, p->weight, paramName(scope, "weight", p->weight.init));
    }
    Value bias;
    if (p->bias)
      bias = createParamView(rewriter, loc, p->bias.getType(),
                             paramName(scope, "bias", p->bias), "identity", {p->bias});
    auto op = nn::LinearOp::create(rewriter, loc, p->x, w, bias);
    markLayer(op, scope);
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

/// Gemm(x, W, bias) with alpha = beta = 1 and x not transposed: W is
/// [in, out], or [out, in] with transB.
struct RaiseGemm : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Gemm")
      return failure();
    for (Operation *user : root->getUsers())
      if (auto r = dyn_cast<NodeOp>(user);
          r && r.getOpType() == "Reshape" && matchFlattenedGemm(r.getResult(0)))
        return rewriter.notifyMatchFailure(root, "a Conv1D: the Reshapes around it close it");
    Value x = root.getInputs()[0];
    auto init = root.getInputs()[1].getDefiningOp<onnx::InitializerOp>();
    auto bias = root.getInputOrNull(2)
                    ? root.getInputs()[2].getDefiningOp<onnx::InitializerOp>()
                    : nullptr;
    if (!init || !isActivation(x) || shapeOf(x).size() != 2 || root.getInt("transA", 0) ||
        root.getFloat("alpha", 1.0f) != 1.0f || root.getFloat("beta", 1.0f) != 1.0f ||
        (root.getInputOrNull(2) && (!bias || bias.getType().getRank() != 1)))
      return rewriter.notifyMatchFailure(root, "not a linear layer");
    StringRef scope = scopeOf(root);
    Location loc = root.getLoc();
    WeightRef w{init, /*inOut=*/root.getInt("transB", 0) == 0};
    Value weight = linearWeight(rewriter, loc, w, paramName(scope, "weight", init));
    Value b;
    if (bias)
      b = createParamView(rewriter, loc, bias.getType(), paramName(scope, "bias", bias),
                          "identity", {bias});
    auto op = nn::LinearOp::create(rewriter, loc, x, weight, b);
    markLayer(op, scope);
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// SwiGLU: silu(x Wg) * (x Wu), SiLU as x * Sigmoid(x)
//===----------------------------------------------------------------------===//

/// g when `v` is g * Sigmoid(g) (either order).
Value matchSilu(Value v) {
  NodeOp mul = producer(v, "Mul");
  Value g;
  if (mul)
    eitherOrder(mul, [&](Value a, Value s) {
      NodeOp sig = producer(s, "Sigmoid");
      if (!sig || sig.getInputs()[0] != a)
        return false;
      g = a;
      return true;
    });
  return g;
}

struct RaiseSwiGLU : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Mul")
      return failure();
    std::optional<LinearParts> gate, up;
    bool ok = eitherOrder(root, [&](Value s, Value u) {
      Value g = matchSilu(s);
      if (!g)
        return false;
      gate = matchLinear(g);
      up = matchLinear(u);
      return gate && up && gate->x == up->x && !gate->bias && !up->bias;
    });
    if (!ok)
      return rewriter.notifyMatchFailure(root, "not a SwiGLU");
    auto gt = gate->weight.init.getType(), ut = up->weight.init.getType();
    if (gt != ut || gate->weight.inOut != up->weight.inOut)
      return rewriter.notifyMatchFailure(root, "gate and up projections differ in shape");
    int64_t ffn = gt.getDimSize(gate->weight.inOut ? 1 : 0);
    int64_t hidden = gt.getDimSize(gate->weight.inOut ? 0 : 1);
    // The MLP's scope: the gate projection's parent module.
    StringRef gateScope = scopeOf(gate->matmul);
    StringRef mlp = gateScope.rsplit('.').first;
    std::string name = gateScope.empty() ? gate->weight.init.getName().str() + ".linear_fc1"
                                         : (mlp + ".linear_fc1.weight").str();
    Location loc = root.getLoc();
    Value w = createParamView(
        rewriter, loc, RankedTensorType::get({2, ffn, hidden}, gt.getElementType()), name,
        "stack", {gate->weight.init, up->weight.init},
        {rewriter.getNamedAttr("transposed", rewriter.getBoolAttr(gate->weight.inOut))});
    auto fc1 = nn::LinearOp::create(rewriter, loc, gate->x, w, Value());
    auto act = nn::SwiGLUOp::create(rewriter, loc, fc1.getResult());
    markLayer(fc1, gateScope);
    markLayer(act, gateScope);
    rewriter.replaceOp(root, act.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// LayerNorm, GELU, ReLU, dropout
//===----------------------------------------------------------------------===//

/// LayerNormalization(x, scale, bias) over the last axis; without a bias
/// (PyTorch's bias=False) the bias is a constant zero, not a parameter.
struct RaiseLayerNorm : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "LayerNormalization")
      return failure();
    Value x = root.getInputs()[0];
    int64_t rank = int64_t(shapeOf(x).size());
    int64_t axis = root.getInt("axis", -1);
    auto scale = root.getInputs()[1].getDefiningOp<onnx::InitializerOp>();
    Value b = root.getInputOrNull(2);
    auto bias = b ? b.getDefiningOp<onnx::InitializerOp>() : nullptr;
    auto zeros = [](Value v) {
      auto values = constValues(v);
      return values && llvm::all_of(*values, [](double x) { return x == 0; });
    };
    // A constant (not an initializer) zero B is what the TorchScript
    // exporter passes for bias=False: no parameter.
    if (!scale || scale.getType().getRank() != 1 || (axis != -1 && axis != rank - 1) ||
        (b && !bias && !zeros(b)) ||
        llvm::any_of(root.getResults().drop_front(), [](Value r) { return !r.use_empty(); }))
      return rewriter.notifyMatchFailure(root, "not a LayerNorm over the last axis");
    StringRef scope = scopeOf(root);
    Location loc = root.getLoc();
    Value w = createParamView(rewriter, loc, scale.getType(),
                              paramName(scope, "weight", scale), "identity", {scale});
    Value bv;
    if (bias)
      bv = createParamView(rewriter, loc, bias.getType(), paramName(scope, "bias", bias),
                           "identity", {bias});
    else
      bv = nn::FillOp::create(rewriter, loc, scale.getType(), rewriter.getF32FloatAttr(0.0f));
    auto op = nn::LayerNormOp::create(rewriter, loc, x, w, bv,
                                      rewriter.getF32FloatAttr(root.getFloat("epsilon", 1e-5f)));
    markLayer(op, scope);
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

/// The factors of a product tree of single-use Muls rooted at `v`.
void mulFactors(Value v, SmallVectorImpl<Value> &factors, bool root, unsigned depth = 0) {
  NodeOp mul = producer(v, "Mul");
  // A GELU is a product of 3 factors: deeper trees are not one (and no
  // malformed chain exhausts the stack).
  if (mul && (root || v.hasOneUse()) && depth < 4) {
    mulFactors(mul.getInputs()[0], factors, false, depth + 1);
    mulFactors(mul.getInputs()[1], factors, false, depth + 1);
    return;
  }
  factors.push_back(v);
}

/// GELU, exact (x * 0.5 * (1 + erf(x / sqrt 2))) or tanh-approximated
/// (x * 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), the products in
/// any order; opset 20's Gelu op.
struct RaiseGelu : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;

  /// erf's or tanh's argument's x, for `onePlus` = 1 + erf(.) or 1 + tanh(.).
  static Value geluInner(Value onePlus, bool &tanhForm) {
    NodeOp add = producer(onePlus, "Add");
    Value x;
    if (add)
      eitherOrder(add, [&](Value f, Value one) {
        if (!isScalar(one, 1.0))
          return false;
        if (NodeOp erf = producer(f, "Erf")) {
          Value a = erf.getInputs()[0];
          if (NodeOp div = producer(a, "Div"); div && isScalar(div.getInputs()[1], std::sqrt(2.0), 1e-5))
            x = div.getInputs()[0];
          else if (NodeOp mul = producer(a, "Mul"))
            eitherOrder(mul, [&](Value y, Value c) {
              if (!isScalar(c, 1.0 / std::sqrt(2.0), 1e-5))
                return false;
              x = y;
              return true;
            });
          tanhForm = false;
          return bool(x);
        }
        NodeOp tanh = producer(f, "Tanh");
        NodeOp scaled = tanh ? producer(tanh.getInputs()[0], "Mul") : nullptr;
        if (!scaled)
          return false;
        return eitherOrder(scaled, [&](Value inner, Value c) {
          if (!isScalar(c, std::sqrt(2.0 / M_PI), 1e-5))
            return false;
          NodeOp sum = producer(inner, "Add");
          if (!sum)
            return false;
          return eitherOrder(sum, [&](Value y, Value cubic) {
            SmallVector<Value> fs;
            mulFactors(cubic, fs, true);
            // 0.044715 * x^3, x^3 as Pow(x, 3) or x * x * x
            Value c3;
            int xs = 0;
            bool ok = true;
            for (Value fv : fs) {
              if (isScalar(fv, 0.044715, 1e-5))
                c3 = fv;
              else if (NodeOp pw = producer(fv, "Pow");
                       pw && pw.getInputs()[0] == y && isScalar(pw.getInputs()[1], 3.0))
                xs += 3;
              else if (fv == y)
                xs += 1;
              else
                ok = false;
            }
            if (!ok || !c3 || xs != 3)
              return false;
            x = y;
            tanhForm = true;
            return true;
          });
        });
      });
    return x;
  }

  /// Whether `v` is Add(Erf(.) or Tanh(.), .).
  static bool addsErfOrTanh(Value v) {
    NodeOp add = producer(v, "Add");
    return add && llvm::any_of(add.getInputs(), [](Value in) {
             return producer(in, "Erf") || producer(in, "Tanh");
           });
  }

  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    Value x;
    bool tanhForm = false;
    if (root.getOpType() == "Gelu") {
      x = root.getInputs()[0];
      tanhForm = root.getString("approximate", "none") == "tanh";
    } else if (root.getOpType() == "Mul") {
      SmallVector<Value> fs;
      mulFactors(root.getResult(0), fs, true);
      if (fs.size() != 3)
        return failure();
      Value half, onePlus, y;
      for (Value f : fs) {
        if (isScalar(f, 0.5))
          half = f;
        else if (!onePlus && addsErfOrTanh(f))
          onePlus = f;
        else
          y = f;
      }
      if (!half || !onePlus || !y || geluInner(onePlus, tanhForm) != y)
        return rewriter.notifyMatchFailure(root, "not a GELU");
      x = y;
    } else {
      return failure();
    }
    if (!isActivation(x))
      return failure();
    auto op = nn::GeluOp::create(rewriter, root.getLoc(), x,
                                 rewriter.getStringAttr(tanhForm ? "tanh" : "none"));
    markLayer(op, scopeOf(root));
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

struct RaiseRelu : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Relu" || !isActivation(root.getInputs()[0]))
      return failure();
    auto op = nn::ReluOp::create(rewriter, root.getLoc(), root.getInputs()[0]);
    markLayer(op, scopeOf(root));
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

/// A training-mode Dropout of a constant ratio in (0, 1) on token
/// activations: Megatron's hidden dropout (nn.dropout, one stream per site
/// in graph order, numbered by the pass before raising; Tessera's
/// position-keyed masks, not PyTorch's). Ratio 0 and inference mode were
/// folded away by tessera-onnx-simplify.
struct RaiseDropout : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Dropout")
      return failure();
    std::optional<double> ratio = root.getInputOrNull(1) ? scalarValue(root.getInputs()[1])
                                                         : std::optional<double>(0.5);
    auto stream = root->getAttrOfType<IntegerAttr>("onnx.dropout_stream");
    Value x = root.getInputs()[0];
    if (!ratio || *ratio <= 0 || *ratio >= 1 || !stream || shapeOf(x).size() != 3 ||
        (root.getNumResults() > 1 && !root.getResult(1).use_empty()))
      return rewriter.notifyMatchFailure(
          root, "not a dropout of a constant ratio in (0, 1) on [b, s, h] activations");
    auto op = nn::DropoutOp::create(rewriter, root.getLoc(), x,
                                    rewriter.getF32FloatAttr(float(*ratio)), stream,
                                    StringAttr());
    markLayer(op, scopeOf(root));
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Learned position embeddings: word embedding + Gather(table, 0..s-1)
//===----------------------------------------------------------------------===//

struct RaisePositionEmbedding : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Add")
      return failure();
    Value words, table;
    NodeOp gather;
    bool ok = eitherOrder(root, [&](Value e, Value p) {
      Operation *def = e.getDefiningOp();
      if (!def || !isBatchSeqSwap(def) || !def->getOperand(0).getDefiningOp<nn::EmbeddingOp>())
        return false;
      int64_t seq = shapeOf(e)[1];
      // The exporters fold a lookup of the positions 0..s-1 into the rows
      // it reads: an initializer [s, h] or [1, s, h] added to the tokens'
      // embeddings is the position table of the trained positions.
      if (auto rows = p.getDefiningOp<onnx::InitializerOp>()) {
        ArrayRef<int64_t> rs = rows.getType().getShape();
        if (rows.getType().getElementType().isF32() &&
            ((rs.size() == 2 && rs[0] == seq) ||
             (rs.size() == 3 && rs[0] == 1 && rs[1] == seq)) &&
            rs.back() == shapeOf(e).back()) {
          words = def->getOperand(0);
          table = rows;
          return true;
        }
      }
      gather = producer(p, "Gather");
      if (!gather || gather.getInt("axis", 0) != 0)
        return false;
      auto init = gather.getInputs()[0].getDefiningOp<onnx::InitializerOp>();
      auto positions = intValues(gather.getInputs()[1]);
      if (!init || init.getType().getRank() != 2 || !positions ||
          int64_t(positions->size()) != seq || init.getType().getDimSize(0) < seq)
        return false;
      for (int64_t i = 0; i < seq; ++i)
        if ((*positions)[size_t(i)] != i)
          return false;
      words = def->getOperand(0);
      table = init;
      return true;
    });
    if (!ok)
      return rewriter.notifyMatchFailure(root, "not word plus position embeddings");
    Location loc = root.getLoc();
    auto init = table.getDefiningOp<onnx::InitializerOp>();
    Value t;
    if (gather) {
      t = createParamView(rewriter, loc, init.getType(),
                          paramName(scopeOf(gather), "weight", init), "identity", {init});
    } else {
      // The folded rows, [s, h]: named for what they are, in the module
      // that adds them (the exporter's name for them is generated).
      StringRef scope = scopeOf(root);
      ArrayRef<int64_t> rs = init.getType().getShape();
      auto type = RankedTensorType::get({rs[rs.size() - 2], rs.back()},
                                        init.getType().getElementType());
      std::string name = scope.empty() ? std::string("position_embeddings.weight")
                                       : (scope + ".position_embeddings.weight").str();
      t = createParamView(rewriter, loc, type, name, "identity", {init});
    }
    auto op = nn::AddPositionEmbeddingOp::create(rewriter, loc, words.getType(), words, t,
                                                 StringAttr());
    rewriter.replaceOp(root, swapBatchSeq(rewriter, loc, op.getResult()));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Residual adds
//===----------------------------------------------------------------------===//

struct RaiseAdd : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Add" || root.getInputs().size() != 2)
      return failure();
    Value a = root.getInputs()[0], b = root.getInputs()[1];
    if (!isActivation(a) || !isActivation(b) || a.getType() != b.getType() ||
        a.getType() != root.getResult(0).getType() ||
        !cast<RankedTensorType>(a.getType()).getElementType().isF32())
      return rewriter.notifyMatchFailure(root, "not a residual add");
    // Only between raised values: an Add inside a construct another
    // pattern owns (RoPE's) must wait for it.
    if (!isRaised(a) || !isRaised(b))
      return rewriter.notifyMatchFailure(root, "operands not raised yet");
    auto op = nn::AddOp::create(rewriter, root.getLoc(), a, b);
    markLayer(op, scopeOf(root));
    rewriter.replaceOp(root, op.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Token inputs
//===----------------------------------------------------------------------===//

/// The graph input (a [b, s] integer argument) `v` reads, through Casts.
BlockArgument tokenInput(Value v, unsigned rank) {
  while (NodeOp cast = producer(v, "Cast"))
    v = cast.getInputs()[0];
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg || shapeOf(arg).size() != rank ||
      !isa<IntegerType>(cast<RankedTensorType>(arg.getType()).getElementType()))
    return nullptr;
  return arg;
}

/// The sequence-major i32 form of token input `arg`: Cast(swap(arg)) of a
/// [b, s] input, Cast(arg) of a [b] one (class labels), which
/// tessera-onnx-to-nn turns into the nn function's own argument.
Value tokensSeqMajor(OpBuilder &b, Location loc, BlockArgument arg) {
  Value swapped = shapeOf(arg).size() == 2 ? swapBatchSeq(b, loc, arg) : Value(arg);
  auto t = cast<RankedTensorType>(swapped.getType());
  auto op = NodeOp::create(
      b, loc, TypeRange{RankedTensorType::get(t.getShape(), b.getI32Type())},
      b.getStringAttr("Cast"), b.getStringAttr(""),
      b.getDictionaryAttr(b.getNamedAttr("to", b.getI64IntegerAttr(6))),
      ValueRange{swapped});
  return op.getResult(0);
}

//===----------------------------------------------------------------------===//
// Word embeddings: Gather(table [V, H], ids [b, s])
//===----------------------------------------------------------------------===//

struct RaiseEmbedding : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Gather" || root.getInt("axis", 0) != 0)
      return failure();
    auto table = root.getInputs()[0].getDefiningOp<onnx::InitializerOp>();
    BlockArgument ids = tokenInput(root.getInputs()[1]);
    if (!table || table.getType().getRank() != 2 || !ids)
      return rewriter.notifyMatchFailure(root, "not a word embedding");
    Location loc = root.getLoc();
    StringRef scope = scopeOf(root);
    Value t = createParamView(rewriter, loc, table.getType(),
                              paramName(scope, "weight", table), "identity", {table});
    Value tokens = tokensSeqMajor(rewriter, loc, ids);
    auto emb = nn::EmbeddingOp::create(
        rewriter, loc, tokens, t, table.getType().getDimSize(0), StringAttr());
    rewriter.replaceOp(root, swapBatchSeq(rewriter, loc, emb.getResult()));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Causal self-attention (Hugging Face's eager and SDPA forms, MHA and GQA,
// with RoPE and QK-norm)
//===----------------------------------------------------------------------===//

/// A projection split into heads: Transpose(Reshape(linear, [b, s, h, D]),
/// [0, 2, 1, 3]), with an RMSNorm of each head (QK-norm) between them.
/// How a projection's heads were made:
/// - Separate: its own linear (q_proj, k_proj, v_proj);
/// - PerHead: output `index` of a Split of one linear reshaped to [b, s, h,
///   3 D] (Megatron's fused QKV, per head [q k v]);
/// - Blocks: output `index` of a Split of one linear's [b, s, 3 h D] into
///   [q][k][v] blocks (GPT-2's c_attn), then reshaped.
enum class HeadSource { Separate, PerHead, Blocks };

struct Heads {
  LinearParts lin;
  int64_t heads = 0, headDim = 0;
  nn::RMSNormOp norm; ///< QK-norm, raised already
  HeadSource source = HeadSource::Separate;
  NodeOp split;
  unsigned index = 0;
};

/// The three-way Split over the last axis whose result `v` is (its result
/// index in `index`), when the parts are equal.
NodeOp equalSplit(Value v, unsigned &index) {
  auto r = dyn_cast<OpResult>(v);
  NodeOp split = r ? dyn_cast<NodeOp>(r.getOwner()) : nullptr;
  if (!split || split.getOpType() != "Split" || split.getNumResults() != 3)
    return nullptr;
  int64_t rank = int64_t(shapeOf(split.getInputs()[0]).size());
  int64_t axis = split.getInt("axis", 0);
  if ((axis < 0 ? axis + rank : axis) != rank - 1)
    return nullptr;
  for (Value out : split.getResults())
    if (out.getType() != split.getResult(0).getType())
      return nullptr;
  index = r.getResultNumber();
  return split;
}

/// The heads of `v`: Transpose(heads, [0, 2, 1, 3]), or with `keyT` a key
/// transposed at once (Transpose(heads, [0, 2, 3, 1])).
std::optional<Heads> matchHeads(Value v, bool keyT = false) {
  NodeOp tr = producer(v, "Transpose");
  if (!tr)
    return std::nullopt;
  auto perm = tr.getInts("perm");
  if (!perm || !llvm::equal(*perm, keyT ? ArrayRef<int64_t>{0, 2, 3, 1}
                                        : ArrayRef<int64_t>{0, 2, 1, 3}))
    return std::nullopt;
  Heads h;
  Value src = tr.getInputs()[0];
  if (auto norm = src.getDefiningOp<nn::RMSNormOp>()) {
    h.norm = norm;
    src = norm.getInput();
  }
  ArrayRef<int64_t> s4 = shapeOf(src);
  if (s4.size() != 4)
    return std::nullopt;
  h.heads = s4[2];
  h.headDim = s4[3];
  // Megatron's fused QKV: Split(Reshape(linear, [b, s, h, 3 D]), last axis).
  if (NodeOp split = equalSplit(src, h.index)) {
    NodeOp reshape = producer(split.getInputs()[0], "Reshape");
    std::optional<LinearParts> lin = reshape ? matchLinear(reshape.getInputs()[0])
                                             : std::nullopt;
    ArrayRef<int64_t> s3 = lin ? shapeOf(reshape.getInputs()[0]) : ArrayRef<int64_t>();
    if (!lin || s3.size() != 3 || s3[2] != 3 * h.heads * h.headDim)
      return std::nullopt;
    h.lin = *lin;
    h.source = HeadSource::PerHead;
    h.split = split;
    return h;
  }
  NodeOp reshape = producer(src, "Reshape");
  if (!reshape)
    return std::nullopt;
  Value flat = reshape.getInputs()[0];
  ArrayRef<int64_t> s3 = shapeOf(flat);
  if (s3.size() != 3 || s4[0] != s3[0] || s4[1] != s3[1] || s4[2] * s4[3] != s3[2])
    return std::nullopt;
  // GPT-2's c_attn: Split(linear [b, s, 3 H], last axis) into q, k, v blocks.
  if (NodeOp split = equalSplit(flat, h.index)) {
    std::optional<LinearParts> lin = matchLinear(split.getInputs()[0]);
    if (!lin)
      return std::nullopt;
    h.lin = *lin;
    h.source = HeadSource::Blocks;
    h.split = split;
    return h;
  }
  std::optional<LinearParts> lin = matchLinear(flat);
  if (!lin)
    return std::nullopt;
  h.lin = *lin;
  return h;
}

/// Hugging Face's rotate_half(x): Concat(-x[..., D/2:], x[..., :D/2]).
Value matchRotateHalf(Value v) {
  NodeOp cat = producer(v, "Concat");
  if (!cat || cat.getInputs().size() != 2)
    return nullptr;
  int64_t rank = int64_t(shapeOf(v).size());
  int64_t axis = cat.getInt("axis", 0);
  if (axis != -1 && axis != rank - 1)
    return nullptr;
  NodeOp neg = producer(cat.getInputs()[0], "Neg");
  NodeOp hi = neg ? producer(neg.getInputs()[0], "Slice") : nullptr;
  NodeOp lo = producer(cat.getInputs()[1], "Slice");
  if (!hi || !lo || hi.getInputs()[0] != lo.getInputs()[0])
    return nullptr;
  Value x = lo.getInputs()[0];
  int64_t d = shapeOf(x).empty() ? 0 : shapeOf(x).back();
  auto bounds = [&](NodeOp sl, int64_t start, int64_t end) {
    auto st = intValues(sl.getInputOrNull(1)), en = intValues(sl.getInputOrNull(2));
    auto ax = intValues(sl.getInputOrNull(3));
    auto sp = sl.getInputOrNull(4) ? intValues(sl.getInputs()[4])
                                   : std::optional<SmallVector<int64_t>>(SmallVector<int64_t>{1});
    if (!st || !en || !ax || !sp || st->size() != 1 || en->size() != 1 || ax->size() != 1 ||
        sp->size() != 1 || (*sp)[0] != 1)
      return false;
    int64_t a = (*ax)[0] < 0 ? (*ax)[0] + rank : (*ax)[0];
    int64_t e = std::min((*en)[0], d);
    return a == rank - 1 && (*st)[0] == start && e == end;
  };
  if (d % 2 || !bounds(lo, 0, d / 2) || !bounds(hi, d / 2, d))
    return nullptr;
  return x;
}

/// x * cos + rotate_half(x) * sin: x, cos and sin. The tables are [..., p,
/// cols] with cols the head dim (Hugging Face's: both halves the same) or
/// half of it (opset 23's RotaryEmbedding caches); `period` positions per
/// repeat of the leading dims.
struct Rope {
  Value x, cos, sin;
  bool half = false;
  int64_t period = 0; ///< 0: the sequence
};

/// Opset 23's RotaryEmbedding(x [b, h, s, D], cos_cache, sin_cache[,
/// position_ids]) rotating whole heads, non-interleaved (rotate-half).
std::optional<Rope> matchRotaryOp(NodeOp re) {
  ArrayRef<int64_t> xs = shapeOf(re.getInputs()[0]);
  if (xs.size() != 4 || re.getInt("interleaved", 0) != 0 || xs[2] <= 0 || xs[3] < 4)
    return std::nullopt;
  int64_t dim = xs[3], rd = re.getInt("rotary_embedding_dim", 0);
  if ((rd != 0 && rd != dim) || re.getInputs().size() < 3 ||
      !onnx::getConstantValue(re.getInputs()[1]) || !onnx::getConstantValue(re.getInputs()[2]))
    return std::nullopt;
  ArrayRef<int64_t> cs = shapeOf(re.getInputs()[1]);
  if (cs.empty() || cs.back() != dim / 2)
    return std::nullopt;
  Rope r{re.getInputs()[0], re.getInputs()[1], re.getInputs()[2], /*half=*/true, 0};
  if (Value ids = re.getInputOrNull(3)) {
    // Positions 0..s-1 for every sample; the cache rows are the positions.
    auto pos = intValues(ids);
    if (!pos || cs.size() != 2 || int64_t(pos->size()) % xs[2])
      return std::nullopt;
    for (size_t k = 0; k < pos->size(); ++k)
      if ((*pos)[k] != int64_t(k) % xs[2])
        return std::nullopt;
    r.period = cs[0];
  }
  return r;
}

std::optional<Rope> matchRope(Value v) {
  if (NodeOp re = producer(v, "RotaryEmbedding"))
    return matchRotaryOp(re);
  NodeOp add = producer(v, "Add");
  if (!add)
    return std::nullopt;
  std::optional<Rope> r;
  eitherOrder(add, [&](Value a, Value b) {
    NodeOp mc = producer(a, "Mul"), ms = producer(b, "Mul");
    if (!mc || !ms)
      return false;
    return eitherOrder(mc, [&](Value x, Value cos) {
      if (!onnx::getConstantValue(cos))
        return false;
      return eitherOrder(ms, [&](Value rot, Value sin) {
        if (!onnx::getConstantValue(sin) || matchRotateHalf(rot) != x)
          return false;
        r = Rope{x, cos, sin, false, 0};
        return true;
      });
    });
  });
  return r;
}

/// Hugging Face's repeat_kv: Reshape(Expand(Unsqueeze(x, 2), [b, G, n, s,
/// D]), [b, G n, s, D]). Returns x, or `v` itself (no repeat).
Value stripRepeat(Value v, int64_t &repeats) {
  repeats = 1;
  // The 5-D Expand itself (SDPA's decomposition reshapes it to [b h, s, D]
  // in one step), or its reshape to [b, G n, s, D].
  NodeOp expand = producer(v, "Expand");
  ArrayRef<int64_t> r = shapeOf(v);
  if (!expand) {
    NodeOp reshape = producer(v, "Reshape");
    expand = reshape ? producer(reshape.getInputs()[0], "Expand") : nullptr;
  }
  NodeOp unsq = expand ? producer(expand.getInputs()[0], "Unsqueeze") : nullptr;
  if (!unsq)
    return v;
  auto axes = unsq.getInts("axes") ? std::optional<SmallVector<int64_t>>(
                                         SmallVector<int64_t>(*unsq.getInts("axes")))
                                   : intValues(unsq.getInputOrNull(1));
  ArrayRef<int64_t> e = shapeOf(expand.getResult(0));
  bool fiveD = r.size() == 5 && r == e;
  bool fourD = r.size() == 4 && e.size() == 5 && r[1] == e[1] * e[2] && r[2] == e[3] &&
               r[3] == e[4];
  if (!axes || axes->size() != 1 || (*axes)[0] != 2 || e.size() != 5 || !(fiveD || fourD))
    return v;
  repeats = e[2];
  return unsq.getInputs()[0];
}

/// K^T of `v`: Transpose(K, [0, 1, 3, 2]), or SDPA's Reshape(Transpose(
/// Reshape(K, [b h, s, D]), [0, 2, 1]), [b, h, D, s]).
Value stripKeyTranspose(Value v) {
  if (NodeOp tr = producer(v, "Transpose")) {
    auto perm = tr.getInts("perm");
    if (perm && llvm::equal(*perm, ArrayRef<int64_t>{0, 1, 3, 2}))
      return tr.getInputs()[0];
  }
  NodeOp r2 = producer(v, "Reshape");
  NodeOp tr = r2 ? producer(r2.getInputs()[0], "Transpose") : nullptr;
  NodeOp r1 = tr ? producer(tr.getInputs()[0], "Reshape") : nullptr;
  if (!r1)
    return nullptr;
  auto perm = tr.getInts("perm");
  ArrayRef<int64_t> k = shapeOf(r1.getInputs()[0]), out = shapeOf(v);
  if (!perm || !llvm::equal(*perm, ArrayRef<int64_t>{0, 2, 1}) || out.size() != 4)
    return nullptr;
  // K [b, h, s, D], or the repeat's 5-D [b, G, n, s, D] reshaped at once.
  bool fourD = k.size() == 4 && out[0] == k[0] && out[1] == k[1] && out[2] == k[3] &&
               out[3] == k[2];
  bool fiveD = k.size() == 5 && out[0] == k[0] && out[1] == k[1] * k[2] &&
               out[2] == k[4] && out[3] == k[3];
  if (!fourD && !fiveD)
    return nullptr;
  return r1.getInputs()[0];
}

/// Whether `mask` (constant, [..., s, s]) is causal: additive (0 kept, at
/// most -1e4 masked) or, for a Where, a boolean `keep` or `drop` matrix.
bool isCausalMask(Value mask, int64_t seq, bool boolean, bool keepWhenTrue) {
  auto values = constValues(mask);
  ArrayRef<int64_t> shape = shapeOf(mask);
  if (!values || shape.size() < 2 || shape[shape.size() - 1] != seq ||
      shape[shape.size() - 2] != seq)
    return false;
  for (size_t k = 0; k < values->size(); ++k) {
    int64_t j = int64_t(k) % seq, i = (int64_t(k) / seq) % seq;
    double v = (*values)[k];
    bool keep = j <= i;
    if (boolean) {
      if ((v != 0) != (keep == keepWhenTrue))
        return false;
    } else if (keep ? v != 0 : v > -1e4) {
      return false;
    }
  }
  return true;
}

/// The rotary base of tables cos/sin [..., s, D] (rotate-half layout:
/// cos(p * base^(-2i/D)) in both halves), when they are exactly that.
std::optional<double> rotaryBase(const Rope &rope, int64_t seq, int64_t dim) {
  int64_t cols = rope.half ? dim / 2 : dim;
  int64_t period = rope.period ? rope.period : seq;
  if (period < 2 || dim < 4 || dim % 2)
    return std::nullopt;
  // The tables' last two dims are positions and features; the others
  // broadcast (batch at most).
  ArrayRef<int64_t> ts = shapeOf(rope.cos);
  if (ts.size() < 2 || shapeOf(rope.sin) != ts || ts[ts.size() - 2] != period ||
      ts.back() != cols)
    return std::nullopt;
  for (size_t d = 1; d + 2 < ts.size(); ++d)
    if (ts[d] != 1)
      return std::nullopt;
  auto c = constValues(rope.cos), s = constValues(rope.sin);
  if (!c || !s || c->size() != s->size() || int64_t(c->size()) % (period * cols))
    return std::nullopt;
  // Position 1, pair 1: the angle base^(-2/D).
  double angle = std::atan2((*s)[size_t(cols + 1)], (*c)[size_t(cols + 1)]);
  if (angle <= 0 || angle >= 1)
    return std::nullopt;
  double base = std::pow(angle, -double(dim) / 2.0);
  size_t reps = c->size() / size_t(period * cols);
  for (size_t r = 0; r < reps; ++r)
    for (int64_t p = 0; p < period; ++p)
      for (int64_t i = 0; i < cols; ++i) {
        double inv = std::pow(base, -2.0 * double(i % (dim / 2)) / double(dim));
        double a = double(p) * double(float(inv));
        size_t k = r * size_t(period * cols) + size_t(p * cols + i);
        double tol = 2e-6 * (1.0 + double(p));
        if (std::abs((*c)[k] - std::cos(a)) > tol || std::abs((*s)[k] - std::sin(a)) > tol)
          return std::nullopt;
      }
  return base;
}

/// The core of an attention: softmax(q k^T * scale + causal mask) v, as
/// Hugging Face's eager and SDPA modules decompose it (`ctx` is the
/// probabilities-times-values product), or opset 23's Attention op.
struct AttentionCore {
  Value q, k, v; ///< [b, h, s, D] each, k and v repeated for every head
  bool keyT = false; ///< k is the keys already transposed ([b, h, D, s])
  double scale = 1.0;
  int64_t seq = 0;
};

LogicalResult matchDecomposedCore(Value ctx, AttentionCore &c, std::string &why) {
  auto failWith = [&](const char *w) {
    why = w;
    return failure();
  };
  NodeOp pv = producer(ctx, "MatMul");
  if (!pv)
    return failWith("not an attention output");
  // Probabilities: Softmax, possibly SDPA's Where(IsNaN(p), 0, p).
  Value probs = pv.getInputs()[0];
  if (NodeOp guard = producer(probs, "Where")) {
    NodeOp isnan = producer(guard.getInputs()[0], "IsNaN");
    if (!isnan || isnan.getInputs()[0] != guard.getInputs()[2] ||
        !isScalar(guard.getInputs()[1], 0.0))
      return failWith("unexpected Where after the softmax");
    probs = guard.getInputs()[2];
  }
  NodeOp softmax = producer(probs, "Softmax");
  // Before opset 13 a Softmax's axis defaulted to 1 (over the flattened
  // trailing dims): only an explicit last axis is the keys'.
  int64_t smAxis = softmax ? softmax.getInt("axis", onnx::getOpset(softmax) < 13 ? 1 : -1) : 0;
  if (!softmax || (smAxis != -1 && smAxis != 3))
    return failWith("no softmax over the keys");
  ArrayRef<int64_t> sShape = shapeOf(softmax.getResult(0));
  if (sShape.size() != 4)
    return failWith("scores are not [b, h, s, s]");
  int64_t seq = sShape[2];
  // The causal mask.
  Value scores;
  Value masked = softmax.getInputs()[0];
  // The masks in front of the softmax: additive ones (0 where a key is
  // seen; all zero: transformers' padding mask without padding) and
  // Where(condition, scores, fill); together they must be causal.
  bool causal = false;
  auto fill = [](Value v) {
    std::optional<double> f = scalarValue(v);
    return f && *f <= -1e4;
  };
  while (true) {
    if (NodeOp add = producer(masked, "Add")) {
      Value rest;
      eitherOrder(add, [&](Value x, Value m) {
        auto v = constValues(m);
        if (!v || x.getType() != add.getResult(0).getType())
          return false;
        bool zeros = llvm::all_of(*v, [](double e) { return e == 0; });
        if (!zeros && !isCausalMask(m, seq, /*boolean=*/false, true))
          return false;
        causal |= !zeros;
        rest = x;
        return true;
      });
      if (!rest)
        break;
      masked = rest;
      continue;
    }
    if (NodeOp where = producer(masked, "Where")) {
      Value cond = where.getInputs()[0], a = where.getInputs()[1], b = where.getInputs()[2];
      if (fill(b) && isCausalMask(cond, seq, true, /*keepWhenTrue=*/true))
        masked = a;
      else if (fill(a) && isCausalMask(cond, seq, true, /*keepWhenTrue=*/false))
        masked = b;
      else
        break;
      causal = true;
      continue;
    }
    break;
  }
  if (causal)
    scores = masked;
  if (!scores)
    return failWith("attention without a causal mask (Tessera's attention is causal)");
  // Scaled scores.
  double scale = 1.0;
  Value qk = scores;
  if (NodeOp mul = producer(scores, "Mul")) {
    eitherOrder(mul, [&](Value x, Value c) {
      std::optional<double> s = scalarValue(c);
      if (!s || !producer(x, "MatMul"))
        return false;
      scale = *s;
      qk = x;
      return true;
    });
  } else if (NodeOp div = producer(scores, "Div")) {
    if (std::optional<double> s = scalarValue(div.getInputs()[1])) {
      scale = 1.0 / *s;
      qk = div.getInputs()[0];
    }
  }
  NodeOp qkMul = producer(qk, "MatMul");
  if (!qkMul)
    return failWith("no q k^T product");
  Value q = qkMul.getInputs()[0], kt = qkMul.getInputs()[1];
  // SDPA scales q and k^T by sqrt(scale) each.
  auto unscale = [&](Value &v) {
    if (NodeOp m = producer(v, "Mul"))
      if (std::optional<double> s = scalarValue(m.getInputs()[1])) {
        scale *= *s;
        v = m.getInputs()[0];
      }
  };
  unscale(q);
  unscale(kt);
  c.k = stripKeyTranspose(kt);
  if (!c.k) {
    c.k = kt; // transposed at once from the heads (Megatron's, GPT-2's)
    c.keyT = true;
  }
  c.q = q;
  c.v = pv.getInputs()[1];
  c.scale = scale;
  c.seq = seq;
  return success();
}

LogicalResult matchOpsetCore(NodeOp att, AttentionCore &c, std::string &why) {
  // Opset 23's Attention(Q, K, V, mask) on [b, h, s, D] inputs.
  ArrayRef<int64_t> q = shapeOf(att.getInputs()[0]);
  if (q.size() != 4 || shapeOf(att.getInputs()[1]).size() != 4 ||
      (att.getNumResults() > 1 && llvm::any_of(att.getResults().drop_front(),
                                               [](Value r) { return !r.use_empty(); }))) {
    why = "an Attention op other than on [b, h, s, D] inputs";
    return failure();
  }
  if (att.getInputOrNull(4) || att.getInputOrNull(5) || att.getFloat("softcap", 0) != 0) {
    why = "an Attention op with a KV cache or softcap";
    return failure();
  }
  c.seq = q[2];
  Value mask = att.getInputOrNull(3);
  bool causal = att.getInt("is_causal", 0) != 0;
  bool boolMask = mask && cast<TensorType>(mask.getType()).getElementType().isInteger(1);
  if (!causal && !(mask && isCausalMask(mask, c.seq, /*boolean=*/boolMask, true))) {
    why = "attention without a causal mask (Tessera's attention is causal)";
    return failure();
  }
  if (causal && mask) {
    why = "an Attention op with both is_causal and a mask";
    return failure();
  }
  c.q = att.getInputs()[0];
  c.k = att.getInputs()[1];
  c.v = att.getInputs()[2];
  c.scale = att.getFloat("scale", 0) ? double(att.getFloat("scale", 0))
                                     : 1.0 / std::sqrt(double(q[3]));
  return success();
}

struct RaiseAttention : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "Reshape")
      return failure();
    auto fail = [&](const char *why) { return rewriter.notifyMatchFailure(root, why); };
    NodeOp outT = producer(root.getInputs()[0], "Transpose");
    auto outPerm = outT ? outT.getInts("perm") : std::nullopt;
    if (!outT || !outPerm || !llvm::equal(*outPerm, ArrayRef<int64_t>{0, 2, 1, 3}))
      return fail("not an attention output");
    AttentionCore core;
    std::string why;
    NodeOp att = producer(outT.getInputs()[0], "Attention");
    if (failed(att ? matchOpsetCore(att, core, why)
                   : matchDecomposedCore(outT.getInputs()[0], core, why)))
      return rewriter.notifyMatchFailure(root, why);
    Value q = core.q, k4 = core.k;
    double scale = core.scale;
    int64_t seq = core.seq;
    int64_t kRep = 1, vRep = 1;
    Value k = core.keyT ? k4 : stripRepeat(k4, kRep);
    Value v = stripRepeat(core.v, vRep);
    std::optional<Rope> qRope = matchRope(q),
                        kRope = core.keyT ? std::nullopt : matchRope(k);
    if (bool(qRope) != bool(kRope))
      return fail("RoPE on only one of q and k");
    std::optional<Heads> qh = matchHeads(qRope ? qRope->x : q);
    std::optional<Heads> kh = matchHeads(kRope ? kRope->x : k, core.keyT);
    std::optional<Heads> vh = matchHeads(v);
    if (!qh || !kh || !vh)
      return fail("q, k or v is not a projection split into heads");
    if (qh->source != kh->source || qh->source != vh->source ||
        (qh->source != HeadSource::Separate &&
         (qh->split != kh->split || qh->split != vh->split || qh->index != 0 ||
          kh->index != 1 || vh->index != 2)))
      return fail("q, k and v are not the three parts of one projection");
    int64_t heads = qh->heads, groups = kh->heads, dim = qh->headDim;
    if (heads <= 0 || groups <= 0 || dim <= 0 || kRep <= 0)
      return fail("heads, groups or head size not positive");
    if (vh->heads != groups || kh->headDim != dim || vh->headDim != dim ||
        kRep != vRep || groups * kRep != heads || heads % groups)
      return fail("heads, key/value groups or head sizes disagree");
    if (qh->lin.x != kh->lin.x || qh->lin.x != vh->lin.x)
      return fail("q, k and v project different inputs");
    if (std::abs(scale * std::sqrt(double(dim)) - 1.0) > 1e-5)
      return fail("scores not scaled by 1/sqrt(head_dim)");
    if (bool(qh->norm) != bool(kh->norm) || vh->norm)
      return fail("QK-norm on only one of q and k");
    bool qBias = bool(qh->lin.bias), kBias = bool(kh->lin.bias), vBias = bool(vh->lin.bias);
    if (qBias != kBias || qBias != vBias)
      return fail("biases on some of q, k and v only");
    if (qh->lin.weight.inOut != kh->lin.weight.inOut ||
        qh->lin.weight.inOut != vh->lin.weight.inOut)
      return fail("q, k and v weights stored differently");
    std::optional<double> base;
    if (qRope) {
      if (constValues(qRope->cos) != constValues(kRope->cos) ||
          constValues(qRope->sin) != constValues(kRope->sin))
        return fail("q and k rotate by different tables");
      if (qRope->half != kRope->half || qRope->period != kRope->period)
        return fail("q and k rotate by different tables");
      base = rotaryBase(*qRope, seq, dim);
      // Tables computed in f32 give the base to about 1e-6: a whole base
      // (10000, 500000, 1e6) is what the model was configured with.
      if (base && std::abs(*base - std::round(*base)) <= 1e-5 * *base)
        base = std::round(*base);
      if (!base)
        return fail("rotary tables are not position * base^(-2i/head_dim) over the "
                    "whole head (partial rotary and Llama 3.1 scaling are not imported yet)");
    }

    // Every check before anything is built: a pattern that fails must
    // leave the IR as it found it.
    if (qh->norm && (qh->norm.getWeight().getType() != kh->norm.getWeight().getType() ||
                     qh->norm.getEps() != kh->norm.getEps()))
      return fail("q and k norms differ");
    ArrayRef<int64_t> out = shapeOf(root.getResult(0));
    ArrayRef<int64_t> xs = shapeOf(qh->lin.x);
    if (out.empty() || out.back() != heads * dim ||
        !((out.size() == 3 && out[0] == xs[0] && out[1] == xs[1]) ||
          (out.size() == 2 && out[0] == xs[0] * xs[1])))
      return fail("the context is not reshaped to [b, s, heads * head_dim] or "
                  "[b s, heads * head_dim]");
    Location loc = root.getLoc();
    StringRef qScope = scopeOf(qh->lin.matmul);
    StringRef attnScope = qScope.rsplit('.').first;
    auto named = [&](StringRef leaf, onnx::InitializerOp init) {
      return attnScope.empty() ? (init.getName() + "." + leaf).str()
                               : (attnScope + "." + leaf).str();
    };
    int64_t hidden = shapeOf(qh->lin.x).back();
    int64_t rows = groups * (heads / groups + 2) * dim;
    Type f32 = rewriter.getF32Type();
    SmallVector<NamedAttribute> qkvAttrs{
        rewriter.getNamedAttr("num_heads", rewriter.getI64IntegerAttr(heads)),
        rewriter.getNamedAttr("num_query_groups", rewriter.getI64IntegerAttr(groups)),
        rewriter.getNamedAttr("head_dim", rewriter.getI64IntegerAttr(dim)),
        rewriter.getNamedAttr("transposed", rewriter.getBoolAttr(qh->lin.weight.inOut))};
    Value w, bias;
    if (qh->source == HeadSource::Separate) {
      w = createParamView(rewriter, loc, RankedTensorType::get({rows, hidden}, f32),
                          named("linear_qkv.weight", qh->lin.weight.init), "qkv",
                          {qh->lin.weight.init, kh->lin.weight.init, vh->lin.weight.init},
                          qkvAttrs);
      if (qBias)
        bias = createParamView(rewriter, loc, RankedTensorType::get({rows}, f32),
                               named("linear_qkv.bias", qh->lin.bias), "qkv",
                               {qh->lin.bias, kh->lin.bias, vh->lin.bias}, qkvAttrs);
    } else {
      // One fused projection: Megatron's per-head layout as it is, or
      // GPT-2's [q][k][v] blocks reordered per head.
      StringRef linScope = scopeOf(qh->lin.matmul);
      bool blocks = qh->source == HeadSource::Blocks;
      StringRef kind = blocks ? "blocks" : (qh->lin.weight.inOut ? "transpose" : "identity");
      w = createParamView(rewriter, loc, RankedTensorType::get({rows, hidden}, f32),
                          paramName(linScope, "weight", qh->lin.weight.init), kind,
                          {qh->lin.weight.init}, qkvAttrs);
      if (qBias)
        bias = createParamView(rewriter, loc, RankedTensorType::get({rows}, f32),
                               paramName(linScope, "bias", qh->lin.bias),
                               blocks ? "blocks" : "identity", {qh->lin.bias}, qkvAttrs);
    }
    SmallVector<Operation *> made;
    Value x = swapBatchSeq(rewriter, loc, qh->lin.x);
    Value h = nn::LinearOp::create(rewriter, loc, x, w, bias);
    made.push_back(h.getDefiningOp());
    if (qh->norm) {
      auto wq = qh->norm.getWeight(), wk = kh->norm.getWeight();
      auto op = nn::QKNormOp::create(rewriter, loc, h.getType(), h, wq, wk,
                                     rewriter.getI64IntegerAttr(heads),
                                     rewriter.getI64IntegerAttr(groups),
                                     qh->norm.getEpsAttr());
      made.push_back(op);
      h = op.getResult();
    }
    if (groups != heads) {
      auto op = nn::RepeatKVOp::create(rewriter, loc, h, rewriter.getI64IntegerAttr(heads),
                                       rewriter.getI64IntegerAttr(groups));
      made.push_back(op);
      h = op.getResult();
    }
    if (base) {
      auto op = nn::RotaryEmbeddingOp::create(
          rewriter, loc, h.getType(), h, rewriter.getI64IntegerAttr(heads),
          rewriter.getI64IntegerAttr(dim), rewriter.getF32FloatAttr(float(*base)),
          rewriter.getBoolAttr(false), StringAttr(), FloatAttr());
      made.push_back(op);
      h = op.getResult();
    }
    auto attn = nn::AttentionOp::create(rewriter, loc, h, rewriter.getI64IntegerAttr(heads),
                                        rewriter.getBoolAttr(true));
    made.push_back(attn);
    for (Operation *op : made)
      markLayer(op, qScope);
    Value context = swapBatchSeq(rewriter, loc, attn.getResult());
    if (out.size() == 2) // flattened for the next Conv1D: [b s, heads * head_dim]
      context = NodeOp::create(rewriter, loc, root.getResultTypes(),
                               rewriter.getStringAttr("Reshape"), rewriter.getStringAttr(""),
                               rewriter.getDictionaryAttr({}),
                               ValueRange{context, root.getInputs()[1]})
                    .getResult(0);
    rewriter.replaceOp(root, context);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// The loss: SoftmaxCrossEntropyLoss over Reshape(logits, [-1, V]), with the
// labels as given or shifted by Hugging Face's causal-LM loss
//===----------------------------------------------------------------------===//

/// The labels input when `v` is Reshape(labels, [-1]) of the labels or of
/// Hugging Face's shift (Slice(Pad(labels, [0, 0, 0, 1], -100), 1:)): the
/// next token's label at every position, which Tessera's data gives as the
/// labels input itself.
BlockArgument matchLabels(Value v, bool &shifted) {
  shifted = false;
  NodeOp flat = producer(v, "Reshape");
  if (!flat || shapeOf(v).size() != 1)
    return nullptr;
  Value l = flat.getInputs()[0];
  if (NodeOp slice = producer(l, "Slice")) {
    NodeOp pad = producer(slice.getInputs()[0], "Pad");
    auto pads = pad ? intValues(pad.getInputOrNull(1)) : std::nullopt;
    auto st = intValues(slice.getInputOrNull(1)), en = intValues(slice.getInputOrNull(2));
    auto ax = intValues(slice.getInputOrNull(3));
    auto sp = slice.getInputOrNull(4) ? intValues(slice.getInputs()[4])
                                      : std::optional<SmallVector<int64_t>>(SmallVector<int64_t>{1});
    ArrayRef<int64_t> ps = pad ? shapeOf(pad.getResult(0)) : ArrayRef<int64_t>();
    int64_t padded = ps.size() == 2 ? ps[1] : -1;
    // Labels padded with -100 at the end of every sequence, then the
    // first dropped: constant mode, over the sequence axis only.
    if (!pad || pad.getString("mode", "constant") != "constant" || pad.getInputOrNull(3) ||
        !pads || !llvm::equal(*pads, ArrayRef<int64_t>{0, 0, 0, 1}) ||
        !isScalar(pad.getInputOrNull(2), -100.0) || !st || st->size() != 1 ||
        (*st)[0] != 1 || !en || en->size() != 1 || padded < 0 || (*en)[0] < padded || !sp ||
        sp->size() != 1 || (*sp)[0] != 1 || !ax || ax->size() != 1 ||
        ((*ax)[0] != 1 && (*ax)[0] != -1))
      return nullptr;
    shifted = true;
    l = pad.getInputs()[0];
  }
  return tokenInput(l);
}

struct RaiseLoss : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (root.getOpType() != "SoftmaxCrossEntropyLoss")
      return failure();
    if (root.getString("reduction", "mean") != "mean" || root.getInputOrNull(2))
      return rewriter.notifyMatchFailure(root, "not a mean loss without weights");
    if (root.getNumResults() > 1 && !root.getResult(1).use_empty())
      return rewriter.notifyMatchFailure(root, "its log-probabilities are used");
    Location loc = root.getLoc();
    Value logits;
    BlockArgument labels;
    if (shapeOf(root.getInputs()[0]).size() == 2 && isRaised(root.getInputs()[0]) &&
        (labels = tokenInput(root.getInputs()[1], /*rank=*/1))) {
      // Classification: logits [b, classes], a label per sample.
      logits = root.getInputs()[0];
    } else {
      NodeOp flat = producer(root.getInputs()[0], "Reshape");
      ArrayRef<int64_t> ls = flat ? shapeOf(flat.getInputs()[0]) : ArrayRef<int64_t>();
      bool shifted;
      labels = matchLabels(root.getInputs()[1], shifted);
      if (!flat || ls.size() != 3 || !labels || !isRaised(flat.getInputs()[0]))
        return rewriter.notifyMatchFailure(root, "not the token loss over raised logits");
      logits = swapBatchSeq(rewriter, loc, flat.getInputs()[0]);
    }
    Value lab = tokensSeqMajor(rewriter, loc, labels);
    // Without ignore_index ONNX ignores no label: a value no label has.
    int64_t ignore = root.getInt("ignore_index", std::numeric_limits<int32_t>::min());
    auto ce = nn::SoftmaxCrossEntropyOp::create(rewriter, loc, logits, lab,
                                                rewriter.getI64IntegerAttr(ignore));
    auto mean = nn::TokenMeanOp::create(rewriter, loc, ce.getResult(), lab, nullptr,
                                        rewriter.getI64IntegerAttr(ignore));
    rewriter.replaceOp(root, mean.getResult());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Layout: batch-seq swaps moved through per-token ops until they cancel
//===----------------------------------------------------------------------===//

struct CancelSwaps : OpRewritePattern<NodeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NodeOp root, PatternRewriter &rewriter) const override {
    if (!isBatchSeqSwap(root) || !isBatchSeqSwap(root.getInputs()[0].getDefiningOp()))
      return failure();
    Value inner = root.getInputs()[0].getDefiningOp()->getOperand(0);
    if (inner.getType() != root.getResult(0).getType())
      return failure();
    rewriter.replaceOp(root, inner);
    return success();
  }
};

/// A per-token nn op whose activation operands are all swaps runs on the
/// unswapped values; its result is swapped instead.
struct SinkSwaps : RewritePattern {
  SinkSwaps(MLIRContext *ctx) : RewritePattern(MatchAnyOpTypeTag(), 1, ctx) {}
  LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rewriter) const override {
    if (!isa<nn::LinearOp, nn::AddOp, nn::RMSNormOp, nn::LayerNormOp, nn::SwiGLUOp,
             nn::GeluOp, nn::ReluOp, nn::DropoutOp>(op))
      return failure();
    int64_t rank = int64_t(shapeOf(op->getResult(0)).size());
    if (rank < 3)
      return failure();
    // The activation operands: both of an add, the first of the others
    // (the rest are parameters).
    unsigned activations = isa<nn::AddOp>(op) ? 2 : 1;
    SmallVector<Value> operands(op->getOperands());
    for (unsigned i = 0; i < activations; ++i) {
      Operation *def = operands[i].getDefiningOp();
      if (!isBatchSeqSwap(def))
        return failure();
      operands[i] = def->getOperand(0);
    }
    Operation *moved = rewriter.clone(*op);
    moved->setOperands(operands);
    auto t = cast<RankedTensorType>(op->getResult(0).getType());
    SmallVector<int64_t> shape(t.getShape());
    std::swap(shape[0], shape[1]);
    moved->getResult(0).setType(RankedTensorType::get(shape, t.getElementType()));
    rewriter.replaceOp(op, swapBatchSeq(rewriter, op->getLoc(), moved->getResult(0)));
    return success();
  }
};

} // namespace

void recordUses(Operation *root) {
  Builder b(root->getContext());
  root->walk([&](onnx::InitializerOp init) {
    unsigned uses = 0;
    bool gather = false, other = false;
    SmallVector<NodeOp> readerNodes;
    for (Operation *user : init->getUsers()) {
      ++uses;
      auto node = dyn_cast<NodeOp>(user);
      if (node && !llvm::is_contained(readerNodes, node))
        readerNodes.push_back(node);
      if (node && node.getOpType() == "Gather" && node.getInputs()[0] == init.getResult())
        gather = true;
      else
        other = true;
    }
    init->setAttr(kUsesAttr, b.getI64IntegerAttr(uses));
    // In graph order (a fused view's sources come in the order its
    // projections run).
    llvm::sort(readerNodes, [](NodeOp a, NodeOp c) {
      return a->getBlock() == c->getBlock() && a->isBeforeInBlock(c);
    });
    SmallVector<Attribute> readers;
    for (NodeOp node : readerNodes)
      readers.push_back(b.getStrArrayAttr({node.getNodeName(), scopeOf(node)}));
    init->setAttr(kReadersAttr, b.getArrayAttr(readers));
    if (gather && other)
      init->setAttr(kTiedAttr, b.getUnitAttr());
  });
}

void populateOnnxToNNPatterns(int phase, RewritePatternSet &patterns) {
  MLIRContext *ctx = patterns.getContext();
  switch (phase) {
  case 0: // norms inside other constructs (QK-norm) first
    patterns.add<RaiseRMSNorm>(ctx);
    break;
  case 1: // constructs that read positions, and own their projections
    patterns.add<RaiseAttention, RaiseEmbedding>(ctx);
    break;
  case 2: // per-token constructs, the loss, and the layout
    patterns.add<RaiseSwiGLU, RaisePositionEmbedding>(ctx, /*benefit=*/2);
    patterns.add<RaiseLinear, RaiseGemm, RaiseLayerNorm, RaiseGelu, RaiseRelu,
                 RaiseDropout, RaiseAdd, RaiseLoss, CancelSwaps, SinkSwaps>(ctx);
    break;
  default: break;
  }
}

} // namespace tessera::onnx_to_nn
