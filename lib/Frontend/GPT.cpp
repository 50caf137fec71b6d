//===- GPT.cpp - GPT model generator --------------------------------------===//

#include "tessera/Frontend/GPT.h"
#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

using namespace mlir;
using namespace tessera;

/// `v` as %g writes it ("0.1", "nan", "inf").
static std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

llvm::ArrayRef<llvm::StringRef> tessera::gptPresetNames() {
  static const llvm::StringRef names[] = {"llama3-8b",  "llama3-70b",
                                          "llama3.1-405b", "qwen3-8b",
                                          "mistral-7b", "mixtral-8x7b"};
  return names;
}

std::optional<GPTConfig> tessera::gptPreset(llvm::StringRef name) {
  // The Llama family's common architecture: RMSNorm, SwiGLU, RoPE,
  // grouped-query attention, no biases, an untied output layer.
  auto llama = [](int64_t layers, int64_t hidden, int64_t heads,
                  int64_t groups, int64_t ffn) {
    GPTConfig c;
    c.layers = layers;
    c.hidden = hidden;
    c.heads = heads;
    c.numQueryGroups = groups;
    c.ffn = ffn;
    c.normalization = "RMSNorm";
    c.layerNormEps = 1e-5;
    c.disableBiasLinear = true;
    c.swiglu = true;
    c.positionEmbeddingType = "rope";
    c.tieEmbeddings = false;
    c.initStd = 0.02;
    return c;
  };
  std::optional<GPTConfig> c;
  if (name == "llama3-8b" || name == "llama3-70b" || name == "llama3.1-405b") {
    if (name == "llama3-8b")
      c = llama(32, 4096, 32, 8, 14336);
    else if (name == "llama3-70b")
      c = llama(80, 8192, 64, 8, 28672);
    else
      c = llama(126, 16384, 128, 8, 53248);
    c->vocab = 128256;
    c->seq = 8192;
    c->rotaryBase = 500000;
    if (name == "llama3.1-405b")
      c->ropeScalingFactor = 8.0;
  } else if (name == "qwen3-8b") {
    // Qwen 3 8B: Llama's architecture with QK-norm, head dim 128.
    c = llama(36, 4096, 32, 8, 12288);
    c->vocab = 151936;
    c->seq = 4096;
    c->rotaryBase = 1000000;
    c->layerNormEps = 1e-6;
    c->qkLayernorm = true;
  } else if (name == "mistral-7b") {
    c = llama(32, 4096, 32, 8, 14336);
    c->vocab = 32000;
    c->seq = 4096;
    c->rotaryBase = 10000;
  } else if (name == "mixtral-8x7b") {
    // Mistral 7B's attention with 8 SwiGLU experts a layer, 2 per token
    // (Megatron's Mixtral example: top-2, load-balancing loss 1e-2).
    c = llama(32, 4096, 32, 8, 14336);
    c->vocab = 32000;
    c->seq = 4096;
    c->rotaryBase = 1000000;
    c->numExperts = 8;
    c->moeTopk = 2;
    c->moeAuxLossCoeff = 1e-2;
  }
  return c;
}

int64_t tessera::ffnHidden(const GPTConfig &c) {
  if (c.ffn)
    return c.ffn;
  if (c.swiglu)
    return int64_t(double(4 * c.hidden) * 2.0 / 3.0 / 64.0) * 64;
  return 4 * c.hidden;
}

std::string tessera::validateGPTConfig(const GPTConfig &c) {
  auto positive = [](const char *name, int64_t v) -> std::string {
    return v < 1 ? std::string("--") + name + " must be positive, got " +
                       std::to_string(v)
                 : "";
  };
  for (auto [name, v] : {std::pair<const char *, int64_t>{"layers", c.layers},
                         {"hidden", c.hidden},
                         {"heads", c.heads},
                         {"vocab", c.vocab},
                         {"seq", c.seq}})
    if (std::string e = positive(name, v); !e.empty())
      return e;
  // Sizes past any model trained: a dimension up to 2^31, a sequence up to
  // 2^24 tokens (16M, past every trained context), and no parameter or
  // activation of a microbatch sample over 2^48 elements, so that nothing
  // downstream overflows or plans terabytes.
  constexpr int64_t kMaxDim = int64_t(1) << 31, kMaxSeq = int64_t(1) << 24,
                    kMaxElements = int64_t(1) << 48;
  for (auto [name, v] : {std::pair<const char *, int64_t>{"layers", c.layers},
                         {"hidden", c.hidden},
                         {"heads", c.heads},
                         {"vocab", c.vocab},
                         {"ffn", c.ffn},
                         {"max-position-embeddings", c.maxPositions},
                         {"num-experts", c.numExperts},
                         {"moe-ffn-hidden", c.moeFfn}})
    if (v > kMaxDim)
      return std::string("--") + name + " " + std::to_string(v) +
             " exceeds the largest supported size of 2^31";
  if (c.seq > kMaxSeq)
    return "--seq " + std::to_string(c.seq) +
           " exceeds the longest supported sequence of 2^24 tokens";
  const int64_t ffn = std::max<int64_t>(ffnHidden(c), 1);
  const int64_t moeFfn = c.moeFfn ? c.moeFfn : ffn;
  for (auto [what, a, b] :
       {std::tuple<const char *, int64_t, int64_t>{"--vocab x --hidden",
                                                   c.vocab, c.hidden},
        {"--ffn x --hidden", ffn, c.hidden},
        {"--seq x --hidden", std::max(c.seq, c.maxPositions), c.hidden},
        {"--seq x --seq (attention scores)", c.seq, c.seq},
        {"--num-experts x --moe-ffn-hidden", std::max<int64_t>(c.numExperts, 1),
         moeFfn}}) {
    if (a > kMaxElements / b)
      return std::string(what) + " = " + std::to_string(a) + " x " +
             std::to_string(b) +
             " elements exceeds the largest supported tensor of 2^48";
  }
  if (c.kvChannels < 0)
    return "--kv-channels must be positive, got " + std::to_string(c.kvChannels);
  if (c.kvChannels > kMaxDim)
    return "--kv-channels " + std::to_string(c.kvChannels) +
           " exceeds the largest supported size of 2^31";
  if (c.kvChannels == 0 && c.hidden % c.heads != 0)
    return "--hidden " + std::to_string(c.hidden) +
           " is not divisible by --heads " + std::to_string(c.heads);
  if (c.maxPositions != 0 && c.maxPositions < c.seq)
    return "--max-position-embeddings " + std::to_string(c.maxPositions) +
           " is smaller than --seq " + std::to_string(c.seq);
  if (c.ffn < 0)
    return "--ffn must be positive";
  if (ffnHidden(c) < 1)
    return "--swiglu's default FFN size int(4 x hidden x 2/3 / 64) x 64 is 0 "
           "for --hidden " +
           std::to_string(c.hidden) + "; give --ffn";
  if (c.qkLayernorm && c.normalization != "RMSNorm")
    return "--qk-layernorm is supported with --normalization RMSNorm (Qwen 3's "
           "and OLMo 2's), not " +
           c.normalization;
  if (c.numQueryGroups < 0 || (c.numQueryGroups > 0 &&
                                c.heads % c.numQueryGroups != 0))
    return "--num-query-groups " + std::to_string(c.numQueryGroups) +
           " must be positive and divide --heads " + std::to_string(c.heads);
  // Comparisons written so that NaN fails them.
  if (!(c.dropout >= 0 && c.dropout < 1))
    return "--dropout must be in [0, 1), got " + number(c.dropout);
  if (c.normalization != "LayerNorm" && c.normalization != "RMSNorm")
    return "--normalization must be LayerNorm or RMSNorm, got " +
           c.normalization;
  if (!(c.layerNormEps > 0 && c.layerNormEps < 1))
    return "--norm-epsilon must be in (0, 1), got " + number(c.layerNormEps);
  if (!(c.initStd > 0 && std::isfinite(c.initStd)))
    return "--init-method-std must be a finite number > 0, got " +
           number(c.initStd);
  if (c.positionEmbeddingType != "learned_absolute" &&
      c.positionEmbeddingType != "rope" && c.positionEmbeddingType != "none")
    return "--position-embedding-type must be learned_absolute, rope or "
           "none, got " +
           c.positionEmbeddingType;
  if (c.ropeScalingFactor != 0 && c.positionEmbeddingType != "rope")
    return "--use-rope-scaling needs --position-embedding-type rope";
  if (c.positionEmbeddingType == "rope") {
    if (!(c.rotaryBase > 1 && std::isfinite(c.rotaryBase)))
      return "--rotary-base must be a finite number > 1, got " +
             number(c.rotaryBase);
    if (!(c.rotaryPercent > 0 && c.rotaryPercent <= 1))
      return "--rotary-percent must be in (0, 1], got " +
             number(c.rotaryPercent);
    if (c.ropeScalingFactor != 0 &&
        !(c.ropeScalingFactor >= 1 && std::isfinite(c.ropeScalingFactor)))
      return "--rope-scaling-factor must be a finite number >= 1, got " +
             number(c.ropeScalingFactor);
    const int64_t headDim = tessera::headDim(c);
    int64_t rot = int64_t(double(headDim) * c.rotaryPercent);
    if (rot < 2 || rot % 2 != 0)
      return "--rotary-percent " + number(c.rotaryPercent) + " of head dim " +
             std::to_string(headDim) + " gives " + std::to_string(rot) +
             " rotary features; RoPE rotates an even number, at least 2";
  }
  if (c.numExperts < 0)
    return "--num-experts must not be negative";
  if (c.numExperts > 0) {
    if (c.moeTopk < 1 || c.moeTopk > c.numExperts)
      return "--moe-router-topk " + std::to_string(c.moeTopk) +
             " must be in [1, --num-experts " + std::to_string(c.numExperts) +
             "]";
    if (c.moeFfn < 0)
      return "--moe-ffn-hidden must be positive";
    if (c.moeLayerFreq < 1)
      return "--moe-layer-freq must be positive";
    if (!(c.moeAuxLossCoeff >= 0 && std::isfinite(c.moeAuxLossCoeff)))
      return "--moe-aux-loss-coeff must be a finite number >= 0, got " +
             number(c.moeAuxLossCoeff);
    if (!(c.moeCapacityFactor >= 0 && std::isfinite(c.moeCapacityFactor)))
      return "--moe-expert-capacity-factor must be a finite number >= 0, "
             "got " +
             number(c.moeCapacityFactor);
    if (c.moeDropPolicy != "probs" && c.moeDropPolicy != "position")
      return "--moe-token-drop-policy must be probs or position, got " +
             c.moeDropPolicy;
  }
  return "";
}

namespace {
/// Adds function arguments with their attributes while the body is built.
class GPTBuilder {
public:
  GPTBuilder(MLIRContext *ctx, const GPTConfig &c) : ctx(ctx), c(c), b(ctx) {}

  OwningOpRef<ModuleOp> build();
  /// The architecture record (kArchitectureAttr) of the configuration.
  DictionaryAttr architecture();

private:
  Value param(StringRef name, ArrayRef<int64_t> shape, StringRef init) {
    Value v = block->addArgument(
        RankedTensorType::get(shape, b.getF32Type()), b.getUnknownLoc());
    argAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr(kParamAttr, b.getStringAttr(name)),
         b.getNamedAttr(kInitAttr, b.getStringAttr(init))}));
    return v;
  }
  Value input(StringRef name) {
    Value v = block->addArgument(
        RankedTensorType::get({c.seq, ShapedType::kDynamic}, b.getI32Type()),
        b.getUnknownLoc());
    argAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr(kInputAttr, b.getStringAttr(name)),
         b.getNamedAttr(kBatchDimAttr, b.getI64IntegerAttr(1))}));
    return v;
  }
  std::string normal(double std) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "normal:%g", std);
    return buf;
  }
  Location loc(const Twine &name) {
    return NameLoc::get(b.getStringAttr(name));
  }
  Value layer(int64_t i, Value h);
  /// Megatron's norm (--normalization): LayerNorm's weight and bias or
  /// RMSNorm's weight, named `<name>.weight` / `.bias`.
  Value norm(const std::string &name, Value h) {
    int64_t H = c.hidden;
    auto eps = b.getF32FloatAttr(float(c.layerNormEps));
    Value g = param(name + ".weight", {H}, "ones");
    if (c.normalization == "RMSNorm")
      return nn::RMSNormOp::create(b, loc(name), h, g, eps);
    Value bias = param(name + ".bias", {H}, "zeros");
    return nn::LayerNormOp::create(b, loc(name), h, g, bias, eps);
  }
  /// A linear layer's bias, none under --disable-bias-linear.
  Value bias(const std::string &name, int64_t n) {
    return c.disableBiasLinear ? Value() : param(name, {n}, "zeros");
  }
  Value moe(int64_t i, Value x, const std::string &outInit);
  /// Megatron's hidden dropout (none at rate 0); each site its own stream.
  Value dropout(Value v, const Twine &name) {
    if (c.dropout == 0)
      return v;
    return nn::DropoutOp::create(b, loc(name), v, b.getF32FloatAttr(c.dropout),
                                 b.getI64IntegerAttr(nextStream++),
                                 StringAttr());
  }
  int64_t nextStream = 0;

  MLIRContext *ctx;
  const GPTConfig &c;
  OpBuilder b;
  Block *block = nullptr;
  SmallVector<DictionaryAttr> argAttrs;
};
} // namespace

Value GPTBuilder::layer(int64_t i, Value h) {
  std::string p = "decoder.layers." + std::to_string(i) + ".";
  int64_t H = c.hidden, F = ffnHidden(c);
  // Megatron scales the init of the residual-branch outputs by 1/sqrt(2L).
  std::string outInit = normal(c.initStd / std::sqrt(2.0 * double(c.layers)));
  auto mark = [&](Value v) {
    v.getDefiningOp()->setAttr(kLayerAttr, b.getI64IntegerAttr(i));
    return v;
  };

  Value x = mark(norm(p + "input_layernorm", h));
  // Grouped-query attention: G key/value heads; linear_qkv's features per
  // group are [q (heads/G x d) | k (d) | v (d)] (Megatron's layout), made
  // head-major for attention by nn.repeat_kv.
  const int64_t groups = c.numQueryGroups ? c.numQueryGroups : c.heads;
  const int64_t D = headDim(c);
  const int64_t qkvFeatures = (c.heads + 2 * groups) * D;
  Value wqkv = param(p + "self_attention.linear_qkv.weight", {qkvFeatures, H},
                     normal(c.initStd));
  Value bqkv = bias(p + "self_attention.linear_qkv.bias", qkvFeatures);
  Value qkv = mark(nn::LinearOp::create(b, loc(p + "self_attention.linear_qkv"),
                                        x, wqkv, bqkv));
  if (c.qkLayernorm) {
    // Megatron's q_layernorm and k_layernorm over each head's features.
    Value wq = param(p + "self_attention.q_layernorm.weight", {D}, "ones");
    Value wk = param(p + "self_attention.k_layernorm.weight", {D}, "ones");
    qkv = mark(nn::QKNormOp::create(
        b, loc(p + "self_attention.qk_layernorm"), qkv, wq, wk,
        b.getI64IntegerAttr(c.heads), b.getI64IntegerAttr(groups),
        b.getF32FloatAttr(float(c.layerNormEps))));
  }
  if (groups != c.heads)
    qkv = mark(nn::RepeatKVOp::create(
        b, loc(p + "self_attention.repeat_kv"), qkv,
        b.getI64IntegerAttr(c.heads), b.getI64IntegerAttr(groups)));
  if (c.positionEmbeddingType == "rope") {
    // Megatron's rotary_pos_emb on q and k: rotary_dim = int(kv_channels x
    // rotary_percent) features of each head.
    int64_t rot = int64_t(double(D) * c.rotaryPercent);
    qkv = mark(nn::RotaryEmbeddingOp::create(
        b, loc(p + "self_attention.rotary_pos_emb"), qkv,
        b.getI64IntegerAttr(c.heads), b.getI64IntegerAttr(rot),
        b.getF32FloatAttr(float(c.rotaryBase)), b.getBoolAttr(false),
        StringAttr(),
        c.ropeScalingFactor != 0
            ? b.getF32FloatAttr(float(c.ropeScalingFactor))
            : FloatAttr()));
  }
  Value ctxv = mark(nn::AttentionOp::create(
      b, loc(p + "self_attention.core_attention"), qkv,
      b.getI64IntegerAttr(c.heads), b.getBoolAttr(true)));
  Value wproj = param(p + "self_attention.linear_proj.weight",
                      {H, c.heads * D}, outInit);
  Value bproj = bias(p + "self_attention.linear_proj.bias", H);
  Value attn = mark(nn::LinearOp::create(b, loc(p + "self_attention.linear_proj"),
                                         ctxv, wproj, bproj));
  attn = dropout(attn, p + "self_attention.dropout");
  if (attn.getDefiningOp<nn::DropoutOp>())
    mark(attn);
  h = mark(nn::AddOp::create(b, loc(p + "self_attention.residual"), h, attn));

  x = mark(norm(p + "pre_mlp_layernorm", h));
  if (c.numExperts > 0 && i % c.moeLayerFreq == 0) {
    Value m = moe(i, x, outInit);
    m = dropout(m, p + "mlp.dropout");
    if (m.getDefiningOp<nn::DropoutOp>())
      mark(m);
    return mark(nn::AddOp::create(b, loc(p + "mlp.residual"), h, m));
  }
  Value u;
  if (c.swiglu) {
    // Megatron's linear_fc1 under --swiglu: the gate and up projections
    // stacked ([2, F, H], gate first; its [2F, H] rows are Megatron's
    // checkpoint layout and Hugging Face's gate_proj then up_proj), so
    // that a column split gives each rank [gate shard; up shard].
    Value w1 = param(p + "mlp.linear_fc1.weight", {2, F, H}, normal(c.initStd));
    Value bb1 = c.disableBiasLinear
                    ? Value()
                    : param(p + "mlp.linear_fc1.bias", {2, F}, "zeros");
    u = mark(nn::LinearOp::create(b, loc(p + "mlp.linear_fc1"), x, w1, bb1));
    u = mark(nn::SwiGLUOp::create(b, loc(p + "mlp.activation"), u));
  } else {
    Value w1 = param(p + "mlp.linear_fc1.weight", {F, H}, normal(c.initStd));
    Value bb1 = bias(p + "mlp.linear_fc1.bias", F);
    u = mark(nn::LinearOp::create(b, loc(p + "mlp.linear_fc1"), x, w1, bb1));
    u = mark(nn::GeluOp::create(b, loc(p + "mlp.activation"), u,
                                c.openaiGelu ? "tanh" : "none"));
  }
  Value w2 = param(p + "mlp.linear_fc2.weight", {H, F}, outInit);
  Value bb2 = bias(p + "mlp.linear_fc2.bias", H);
  Value m = mark(nn::LinearOp::create(b, loc(p + "mlp.linear_fc2"), u, w2, bb2));
  m = dropout(m, p + "mlp.dropout");
  if (m.getDefiningOp<nn::DropoutOp>())
    mark(m);
  return mark(nn::AddOp::create(b, loc(p + "mlp.residual"), h, m));
}

/// Megatron's MoELayer: TopKRouter (a linear without bias, top-k then
/// softmax, the load-balancing loss on the probabilities through
/// MoEAuxLossAutoScaler), the token permutation, GroupedMLP (two grouped
/// GEMMs without bias around GELU) and the weighted unpermutation.
Value GPTBuilder::moe(int64_t i, Value x, const std::string &outInit) {
  std::string p = "decoder.layers." + std::to_string(i) + ".mlp.";
  int64_t H = c.hidden, E = c.numExperts;
  int64_t F = c.moeFfn ? c.moeFfn : ffnHidden(c);
  auto mark = [&](Value v) {
    v.getDefiningOp()->setAttr(kLayerAttr, b.getI64IntegerAttr(i));
    return v;
  };
  Value wr = param(p + "router.weight", {E, H}, normal(c.initStd));
  Value logits = mark(nn::LinearOp::create(b, loc(p + "router"), x, wr, Value()));
  auto route = nn::MoERouterOp::create(b, loc(p + "router.topk"), logits,
                                       b.getI64IntegerAttr(c.moeTopk));
  mark(route.getProbs());
  Value probs = route.getProbs(), indices = route.getIndices();
  if (c.moeAuxLossCoeff > 0) {
    Value aux = mark(nn::MoEAuxLossOp::create(
        b, loc(p + "router.aux_loss"), logits, indices, /*counts=*/Value(),
        b.getF32FloatAttr(float(c.moeAuxLossCoeff))));
    probs = mark(nn::AddAuxLossOp::create(b, loc(p + "router.aux_loss_scaler"),
                                          probs, aux));
  }
  auto experts = b.getI64IntegerAttr(E);
  // Expert capacity: the choices past it are dropped (after the
  // load-balancing loss, which counts every choice, as Megatron's does).
  if (c.moeCapacityFactor > 0) {
    auto drop = nn::MoECapacityDropOp::create(
        b, loc(p + "router.capacity"), probs, indices, experts,
        b.getF32FloatAttr(float(c.moeCapacityFactor)),
        b.getStringAttr(c.moeDropPolicy));
    mark(drop.getKeptProbs());
    probs = drop.getKeptProbs();
    indices = drop.getKeptIndices();
  }
  auto dispatch = nn::MoEDispatchOp::create(
      b, loc(p + "token_dispatcher.permute"), x, indices, experts);
  mark(dispatch.getResult());
  // SwiGLU experts (Mixtral's): each expert's linear_fc1 stacks its gate
  // and up projections as the dense MLP's does.
  Value w1 = c.swiglu ? param(p + "experts.linear_fc1.weight", {E, 2, F, H},
                              normal(c.initStd))
                      : param(p + "experts.linear_fc1.weight", {E, F, H},
                              normal(c.initStd));
  Value w2 = param(p + "experts.linear_fc2.weight", {E, H, F}, outInit);
  Value u = mark(nn::GroupedLinearOp::create(b, loc(p + "experts.linear_fc1"),
                                             dispatch.getResult(),
                                             dispatch.getCounts(), w1,
                                             IntegerAttr()));
  if (c.swiglu)
    u = mark(nn::SwiGLUOp::create(b, loc(p + "experts.activation"), u));
  else
    u = mark(nn::GeluOp::create(b, loc(p + "experts.activation"), u,
                                c.openaiGelu ? "tanh" : "none"));
  Value y = mark(nn::GroupedLinearOp::create(b, loc(p + "experts.linear_fc2"),
                                             u, dispatch.getCounts(), w2,
                                             IntegerAttr()));
  return mark(nn::MoECombineOp::create(b, loc(p + "token_dispatcher.unpermute"),
                                       y, probs, indices, experts));
}

OwningOpRef<ModuleOp> GPTBuilder::build() {
  OwningOpRef<ModuleOp> module = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(module->getBody());
  auto func = func::FuncOp::create(b, loc("gpt"), "gpt",
                                   b.getFunctionType({}, {}));
  block = func.addEntryBlock();
  b.setInsertionPointToStart(block);

  int64_t H = c.hidden;
  Value tokens = input("tokens");
  Value labels = input("labels");
  Value wte = param("embedding.word_embeddings.weight", {c.vocab, H},
                    normal(c.initStd));
  Value h = nn::EmbeddingOp::create(b, loc("embedding.word_embeddings"), tokens,
                                    wte, b.getI64IntegerAttr(c.vocab),
                                    StringAttr());
  if (c.positionEmbeddingType == "learned_absolute") {
    Value wpe = param("embedding.position_embeddings.weight",
                      {c.maxPositions ? c.maxPositions : c.seq, H},
                      normal(c.initStd));
    h = nn::AddPositionEmbeddingOp::create(
        b, loc("embedding.position_embeddings"), h, wpe, StringAttr());
  }
  h = dropout(h, "embedding.dropout");
  for (int64_t i = 0; i < c.layers; ++i)
    h = layer(i, h);
  h = norm("decoder.final_layernorm", h);
  Value out = c.tieEmbeddings ? wte
                              : param("output_layer.weight", {c.vocab, H},
                                      normal(c.initStd));
  Value logits = nn::LinearOp::create(b, loc("output_layer"), h, out, Value());
  Value losses = nn::SoftmaxCrossEntropyOp::create(
      b, loc("loss"), logits, labels, b.getI64IntegerAttr(c.ignoreIndex));
  Value loss = nn::TokenMeanOp::create(b, loc("loss.mean"), losses, labels,
                                       Value(),
                                       b.getI64IntegerAttr(c.ignoreIndex));
  func::ReturnOp::create(b, loc("gpt"), loss);
  func.setType(b.getFunctionType(block->getArgumentTypes(), {loss.getType()}));
  func.setAllArgAttrs(argAttrs);
  (*module)->setAttr(kArchitectureAttr, architecture());
  return module;
}

DictionaryAttr GPTBuilder::architecture() {
  SmallVector<NamedAttribute> a;
  auto i = [&](StringRef n, int64_t v) {
    a.push_back(b.getNamedAttr(n, b.getI64IntegerAttr(v)));
  };
  auto f = [&](StringRef n, double v) {
    a.push_back(b.getNamedAttr(n, b.getF64FloatAttr(v)));
  };
  auto flag = [&](StringRef n, bool v) {
    a.push_back(b.getNamedAttr(n, b.getBoolAttr(v)));
  };
  auto s = [&](StringRef n, StringRef v) {
    a.push_back(b.getNamedAttr(n, b.getStringAttr(v)));
  };
  i("num_layers", c.layers);
  i("hidden_size", c.hidden);
  i("num_attention_heads", c.heads);
  i("num_query_groups", c.numQueryGroups ? c.numQueryGroups : c.heads);
  i("kv_channels", headDim(c));
  i("ffn_hidden_size", ffnHidden(c));
  i("vocab_size", c.vocab);
  i("seq_length", c.seq);
  i("max_position_embeddings", c.maxPositions ? c.maxPositions : c.seq);
  s("normalization", c.normalization);
  f("norm_epsilon", c.layerNormEps);
  s("position_embedding_type", c.positionEmbeddingType);
  f("rotary_base", c.rotaryBase);
  f("rotary_percent", c.rotaryPercent);
  f("rope_scaling_factor", c.ropeScalingFactor);
  flag("swiglu", c.swiglu);
  flag("add_bias_linear", !c.disableBiasLinear);
  flag("untie_embeddings_and_output_weights", !c.tieEmbeddings);
  flag("qk_layernorm", c.qkLayernorm);
  s("activation", c.swiglu ? "swiglu" : c.openaiGelu ? "openai_gelu" : "gelu");
  f("init_method_std", c.initStd);
  i("num_experts", c.numExperts);
  if (c.numExperts > 0) {
    i("moe_router_topk", c.moeTopk);
    i("moe_ffn_hidden_size", c.moeFfn ? c.moeFfn : ffnHidden(c));
    i("moe_layer_freq", c.moeLayerFreq);
    f("moe_aux_loss_coeff", c.moeAuxLossCoeff);
    f("moe_expert_capacity_factor", c.moeCapacityFactor);
  }
  return b.getDictionaryAttr(a);
}

OwningOpRef<ModuleOp> tessera::buildGPT(MLIRContext *context,
                                        const GPTConfig &config) {
  return GPTBuilder(context, config).build();
}
