//===- tessera-gen.cpp - Model generators ---------------------------------===//
//
// tessera-gen gpt|llama3-8b|llama3-70b|llama3.1-405b|qwen3-8b|mistral-7b|
//             mixtral-8x7b
//     [--layers L --hidden H --heads A --vocab V --seq S]
//     [--ffn F] [--max-position-embeddings P] [--tie-embeddings] [--dropout P]
//     [--normalization LayerNorm|RMSNorm] [--norm-epsilon E]
//     [--disable-bias-linear] [--swiglu] [--qk-layernorm] [--kv-channels D]
//     [--group-query-attention --num-query-groups G] [--init-method-std S] [--position-embedding-type
//      learned_absolute|rope|none [--rotary-base B] [--rotary-percent P]
//      [--use-rope-scaling [--rope-scaling-factor F]]]
//     [--num-experts E --moe-router-topk K [--moe-ffn-hidden F]
//      [--moe-layer-freq N] [--moe-aux-loss-coeff C]
//      [--moe-expert-capacity-factor F [--moe-token-drop-policy probs|position]]]
//     -o model.mlir
//
//===----------------------------------------------------------------------===//

#include "tessera/Frontend/GPT.h"
#include "tessera/InitAll.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"

namespace cl = llvm::cl;

static cl::opt<std::string> model(
    cl::Positional,
    cl::desc("<model: gpt (by the flags below), or a preset: llama3-8b, "
             "llama3-70b, llama3.1-405b, qwen3-8b, mistral-7b, "
             "mixtral-8x7b>"),
                                  cl::Required);
static cl::opt<std::string> output("o", cl::desc("output file"), cl::init("-"));
static cl::opt<int64_t> layers("layers", cl::desc("transformer layers"), cl::init(2));
static cl::opt<int64_t> hidden("hidden", cl::desc("hidden size"), cl::init(128));
static cl::opt<int64_t> heads("heads", cl::desc("attention heads"), cl::init(4));
static cl::opt<int64_t> vocab("vocab", cl::desc("vocabulary size"), cl::init(257));
static cl::opt<int64_t> seq("seq", cl::desc("sequence length"), cl::init(64));
static cl::opt<int64_t> ffn("ffn", cl::desc("MLP hidden size (default 4 x hidden; "
                                            "see --swiglu)"),
                            cl::init(0));
static cl::opt<int64_t> maxPositions("max-position-embeddings",
                                     cl::desc("position embeddings (default seq)"),
                                     cl::init(0));
static cl::opt<double> dropoutRate("dropout",
                                   cl::desc("embedding and hidden dropout rate "
                                            "(default 0: no dropout ops)"),
                                   cl::init(0.0));
static cl::opt<int64_t> numExperts(
    "num-experts",
    cl::desc("mixture of experts: experts per MoE layer (default 0: dense "
             "MLPs)"),
    cl::init(0));
static cl::opt<int64_t> moeTopk("moe-router-topk",
                                cl::desc("experts each token is routed to"),
                                cl::init(2));
static cl::opt<int64_t> moeFfn("moe-ffn-hidden",
                               cl::desc("expert MLP hidden size (default "
                                        "--ffn)"),
                               cl::init(0));
static cl::opt<int64_t> moeLayerFreq(
    "moe-layer-freq",
    cl::desc("every N-th layer is an MoE layer, starting with layer 0 "
             "(default 1: all)"),
    cl::init(1));
static cl::opt<double> moeAuxLossCoeff(
    "moe-aux-loss-coeff",
    cl::desc("load-balancing loss coefficient (default 0: none)"),
    cl::init(0.0));
static cl::opt<double> moeCapacityFactor(
    "moe-expert-capacity-factor",
    cl::desc("each expert takes at most ceil(tokens x topk / experts x F) "
             "choices (default 0: dropless)"),
    cl::init(0.0));
static cl::opt<std::string> moeDropPolicy(
    "moe-token-drop-policy",
    cl::desc("which choices past an expert's capacity are dropped: probs "
             "(the least probable, default) or position (the last)"),
    cl::init("probs"));
static cl::opt<bool> tie("tie-embeddings",
                         cl::desc("share the word embedding with the LM head"),
                         cl::init(false));

static cl::opt<std::string> normalization(
    "normalization",
    cl::desc("LayerNorm (default) or RMSNorm, as Megatron's --normalization"),
    cl::init("LayerNorm"));
static cl::opt<double> normEpsilon("norm-epsilon",
                                   cl::desc("the norms' epsilon (default 1e-5)"),
                                   cl::init(1e-5));
static cl::opt<bool> disableBiasLinear(
    "disable-bias-linear",
    cl::desc("no biases in the attention and MLP linear layers"),
    cl::init(false));

static cl::opt<bool> swiglu(
    "swiglu",
    cl::desc("SwiGLU MLP (Megatron's --swiglu): silu(gate) * up; the FFN "
             "size defaults to int(4 x hidden x 2/3 / 64) x 64"),
    cl::init(false));

static cl::opt<bool> openaiGelu(
    "openai-gelu",
    cl::desc("GELU's tanh approximation (Megatron's --openai-gelu, GPT-2's "
             "gelu_new) instead of the exact erf form"),
    cl::init(false));

static cl::opt<bool> groupQueryAttention(
    "group-query-attention",
    cl::desc("grouped-query attention (Megatron's): --num-query-groups "
             "key/value heads"),
    cl::init(false));
static cl::opt<int64_t> numQueryGroups(
    "num-query-groups",
    cl::desc("key/value heads of --group-query-attention (default 1)"),
    cl::init(1));

static cl::opt<bool> qkLayernorm(
    "qk-layernorm",
    cl::desc("RMSNorm of each query and key head before RoPE (Megatron's; "
             "Qwen 3's)"),
    cl::init(false));

static cl::opt<int64_t> kvChannels(
    "kv-channels",
    cl::desc("each attention head's features (Megatron's; default hidden / "
             "heads)"),
    cl::init(0));

static cl::opt<std::string> positionEmbeddingType(
    "position-embedding-type",
    cl::desc("learned_absolute (default), rope or none, as Megatron's"),
    cl::init("learned_absolute"));
static cl::opt<double> rotaryBase("rotary-base",
                                  cl::desc("RoPE's base (default 10000)"),
                                  cl::init(10000.0));
static cl::opt<double> rotaryPercent(
    "rotary-percent",
    cl::desc("the fraction of each head's features RoPE rotates (default 1)"),
    cl::init(1.0));

static cl::opt<bool> useRopeScaling(
    "use-rope-scaling",
    cl::desc("Llama 3.1's RoPE frequency scaling (Megatron's)"),
    cl::init(false));
static cl::opt<double> ropeScalingFactor(
    "rope-scaling-factor",
    cl::desc("the scaling factor of --use-rope-scaling (default 8)"),
    cl::init(8.0));
static cl::opt<double> initMethodStd(
    "init-method-std",
    cl::desc("the weights' normal init std (default 0.02, Megatron's)"),
    cl::init(0.02));

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(argc, argv, "Tessera model generator\n");
  // A preset's shapes and architecture, or the flags' defaults for "gpt";
  // every flag given on the command line overrides.
  std::optional<tessera::GPTConfig> preset = tessera::gptPreset(model);
  if (model != "gpt" && !preset) {
    std::string names = "gpt";
    for (llvm::StringRef name : tessera::gptPresetNames())
      names += ", " + name.str();
    llvm::errs() << "tessera-gen: error: unknown model '" << model
                 << "' (available: " << names << ")\n";
    return 1;
  }
  tessera::GPTConfig config;
  auto set = [&](auto &field, const auto &opt) {
    if (!preset || opt.getNumOccurrences() > 0)
      field = opt;
  };
  if (preset)
    config = *preset;
  set(config.layers, layers);
  set(config.hidden, hidden);
  set(config.heads, heads);
  set(config.vocab, vocab);
  set(config.seq, seq);
  set(config.ffn, ffn);
  set(config.maxPositions, maxPositions);
  set(config.tieEmbeddings, tie);
  set(config.dropout, dropoutRate);
  set(config.normalization, normalization);
  set(config.layerNormEps, normEpsilon);
  set(config.disableBiasLinear, disableBiasLinear);
  set(config.swiglu, swiglu);
  set(config.openaiGelu, openaiGelu);
  set(config.qkLayernorm, qkLayernorm);
  set(config.kvChannels, kvChannels);
  if ((groupQueryAttention || numQueryGroups.getNumOccurrences()) &&
      numQueryGroups < 1) {
    llvm::errs() << "tessera-gen: error: --num-query-groups must be positive, "
                    "got "
                 << numQueryGroups << "\n";
    return 1;
  }
  if (!preset || groupQueryAttention.getNumOccurrences())
    config.numQueryGroups = groupQueryAttention ? int64_t(numQueryGroups) : 0;
  else if (numQueryGroups.getNumOccurrences())
    config.numQueryGroups = numQueryGroups;
  set(config.positionEmbeddingType, positionEmbeddingType);
  set(config.rotaryBase, rotaryBase);
  set(config.rotaryPercent, rotaryPercent);
  set(config.initStd, initMethodStd);
  if (!preset || useRopeScaling.getNumOccurrences())
    config.ropeScalingFactor =
        useRopeScaling ? double(ropeScalingFactor) : 0.0;
  else if (ropeScalingFactor.getNumOccurrences() && config.ropeScalingFactor)
    config.ropeScalingFactor = ropeScalingFactor;
  set(config.numExperts, numExperts);
  set(config.moeTopk, moeTopk);
  set(config.moeFfn, moeFfn);
  set(config.moeLayerFreq, moeLayerFreq);
  set(config.moeAuxLossCoeff, moeAuxLossCoeff);
  set(config.moeCapacityFactor, moeCapacityFactor);
  set(config.moeDropPolicy, moeDropPolicy);
  if (std::string error = tessera::validateGPTConfig(config); !error.empty()) {
    llvm::errs() << "tessera-gen: error: " << error << "\n";
    return 1;
  }
  mlir::DialectRegistry registry;
  tessera::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  auto module = tessera::buildGPT(&context, config);
  if (failed(mlir::verify(*module)))
    return 1;
  std::string error;
  auto out = mlir::openOutputFile(output, &error);
  if (!out) {
    llvm::errs() << "tessera-gen: error: " << error << "\n";
    return 1;
  }
  module->print(out->os());
  out->keep();
  return 0;
}
