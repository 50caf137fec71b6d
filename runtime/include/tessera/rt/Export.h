//===- Export.h - Trained weights out as a Hugging Face model ---*- C++ -*-===//
//
// tessera-export CKPT_DIR -o OUT: the parameters of a checkpoint of any
// layout (tp, pp, vpp, dp, ep / etp, the distributed optimizer, fp32 or
// bf16) gathered whole and written as a Hugging Face model directory,
// OUT/model.safetensors with Hugging Face's names and layouts plus
// OUT/config.json, which `AutoModelForCausalLM.from_pretrained(OUT)` loads
// (the inverse of Megatron-Bridge's import):
//   - GPT (LayerNorm, GELU, learned positions, biases) as GPT2LMHeadModel:
//     Conv1D weights ([in, out]), c_attn [q | k | v] from linear_qkv's
//     per-head [q_h | k_h | v_h] rows;
//   - the Llama family (RMSNorm, SwiGLU, RoPE, grouped-query attention) as
//     LlamaForCausalLM (Qwen3ForCausalLM with QK-norm, MixtralForCausalLM
//     with experts): q/k/v_proj from linear_qkv's per-group [q (heads/G) |
//     k | v] rows, gate/up_proj from linear_fc1's stacked [2, F, H], the
//     experts' w1/w3/w2 from the grouped [E, 2, F, H] and [E, H, F];
//     Llama 3.1's RoPE scaling as rope_scaling {"rope_type": "llama3"}.
// The architecture comes from the checkpoint's record (the manifest's
// "architecture", from the artifact of a tessera-gen model). Vocabulary
// padding is cut off; as in Megatron-LM the padded rows' logits enter the
// softmax in training, so only a model compiled without padding
// (--make-vocab-size-divisible-by 1) exports exactly (tessera-export says
// so when it cuts). The weights are the parameters as trained (bf16
// under --bf16, f16 under --fp16, as Megatron's own exports), or
// converted with --dtype.
// Each file is written atomically (FileIO.h): never a half-written one.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXPORT_H
#define TESSERA_RT_EXPORT_H

#include "tessera/rt/Status.h"

#include <string>

namespace tessera::rt {

struct ExportOptions {
  /// A checkpoint directory (its `latest` iteration) or an iter_ directory.
  std::string checkpoint;
  std::string output;
  /// safetensors (the only one yet).
  std::string format = "safetensors";
  /// auto (as stored), fp32, bf16 or fp16.
  std::string dtype = "auto";
};

/// What exportHuggingFace wrote.
struct ExportSummary {
  std::string architecture; ///< "LlamaForCausalLM", ...
  int64_t iteration = 0;
  int64_t tensors = 0, parameters = 0;
  std::string dtype;  ///< "F32", "BF16" or "F16"
  std::string layout; ///< the checkpoint's "tp=2 pp=2 dp=2 (world 8)"
  /// The vocabulary and the rows its padding gave the embedding and the
  /// output layer (cut off in the export).
  int64_t vocab = 0, paddedVocab = 0;
  /// The padded rows' logits were kept out of the loss in training
  /// (--mask-padded-vocab): cutting them off leaves the trained model.
  bool maskedVocab = false;
};

StatusOr<ExportSummary> exportHuggingFace(const ExportOptions &options);

/// tessera-export's main.
int runExport(int argc, char **argv);

} // namespace tessera::rt

#endif // TESSERA_RT_EXPORT_H
