//===- GPT.h - GPT model generator --------------------------------*- C++ -*-===//
//
// Builds a Megatron-style GPT (pre-norm decoder: LayerNorm or RMSNorm) in
// the nn dialect with Megatron's parameter names; `tessera-gen gpt` prints it.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_FRONTEND_GPT_H
#define TESSERA_FRONTEND_GPT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace tessera {

struct GPTConfig {
  int64_t layers = 2;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t vocab = 257;
  int64_t seq = 64;
  int64_t ffn = 0;             ///< 0: ffnHidden's default
  int64_t maxPositions = 0;    ///< 0: seq
  bool tieEmbeddings = false;  ///< share the word embedding with the LM head
  double initStd = 0.02;
  /// Megatron's --normalization (LayerNorm or RMSNorm) and --norm-epsilon.
  std::string normalization = "LayerNorm";
  double layerNormEps = 1e-5;
  /// Megatron's --position-embedding-type (learned_absolute, rope or none),
  /// --rotary-base and --rotary-percent (RoPE over that fraction of each
  /// head's features).
  std::string positionEmbeddingType = "learned_absolute";
  double rotaryBase = 10000.0;
  double rotaryPercent = 1.0;
  /// Megatron's --use-rope-scaling and --rope-scaling-factor (Llama 3.1's
  /// frequency scaling; 0: none).
  double ropeScalingFactor = 0.0;
  /// Megatron's --disable-bias-linear: no biases in the attention and MLP
  /// linears (the Llama family's).
  bool disableBiasLinear = false;
  /// Megatron's --swiglu: the MLP is linear_fc1 with a stacked [2, ffn,
  /// hidden] weight (gate, up), silu(gate) * up, then linear_fc2 (the Llama
  /// family's, Hugging Face's gate_proj / up_proj / down_proj).
  bool swiglu = false;
  /// Megatron's --openai-gelu: the GELU MLP's tanh approximation (GPT-2's,
  /// Hugging Face's gelu_new) instead of the exact erf form.
  bool openaiGelu = false;
  /// Megatron's --group-query-attention --num-query-groups: G key/value
  /// heads, each shared by heads/G query heads; linear_qkv's output is laid
  /// out per group [q (heads/G x d) | k (d) | v (d)]. 0: multi-head
  /// attention (G = heads).
  int64_t numQueryGroups = 0;
  /// Megatron's --qk-layernorm (Qwen 3, OLMo 2): each query and key head
  /// RMS-normalised over its features before RoPE (q_layernorm,
  /// k_layernorm; RMSNorm models only).
  bool qkLayernorm = false;
  /// Megatron's --kv-channels: each head's features (0: hidden / heads);
  /// attention then works on heads x kv-channels features, projected back
  /// to hidden by linear_proj.
  int64_t kvChannels = 0;
  double dropout = 0.0;        ///< embedding and hidden dropout (Megatron's)
  int64_t ignoreIndex = -100;
  /// Mixture of experts (Megatron's MoELayer in place of the MLP): experts
  /// per MoE layer (0: dense), experts per token, the experts' hidden size
  /// (0: ffn), every moeLayerFreq-th layer from layer 0, and the
  /// load-balancing loss coefficient (0: no auxiliary loss).
  int64_t numExperts = 0;
  int64_t moeTopk = 2;
  int64_t moeFfn = 0;
  int64_t moeLayerFreq = 1;
  double moeAuxLossCoeff = 0.0;
  /// Expert capacity (0: dropless) and which choices it drops ("probs" or
  /// "position").
  double moeCapacityFactor = 0.0;
  std::string moeDropPolicy = "probs";
};

/// A published model's shapes and architecture as Megatron-LM's flags set
/// them (its examples and Megatron-Bridge's model providers): "llama3-8b",
/// "llama3-70b", "llama3.1-405b", "qwen3-8b", "mistral-7b", "mixtral-8x7b";
/// nullopt for another name.
/// The sequence is the pretraining length (8192 for Llama 3, 4096 for
/// Mistral 7B, whose 4096-token sliding window then covers the sequence).
std::optional<GPTConfig> gptPreset(llvm::StringRef name);
/// The names gptPreset knows, in order.
llvm::ArrayRef<llvm::StringRef> gptPresetNames();

/// The MLP's hidden size: `ffn`, or Megatron's default, 4 x hidden, and
/// under --swiglu int(4 x hidden x 2/3 / 64) x 64 (the same parameters as
/// the GELU MLP, rounded down to a multiple of 64).
int64_t ffnHidden(const GPTConfig &config);

/// Each attention head's features: --kv-channels, or hidden / heads.
inline int64_t headDim(const GPTConfig &config) {
  return config.kvChannels ? config.kvChannels : config.hidden / config.heads;
}

/// Checks the configuration; returns an error message or an empty string.
std::string validateGPTConfig(const GPTConfig &config);

/// The model: `@gpt(tokens [seq, ?] i32, labels [seq, ?] i32, params...)`
/// returning the mean token loss. Every op of decoder layer i carries
/// `nn.layer = i` so the pipeline split can find the layers.
mlir::OwningOpRef<mlir::ModuleOp> buildGPT(mlir::MLIRContext *context,
                                           const GPTConfig &config);

} // namespace tessera

#endif // TESSERA_FRONTEND_GPT_H
