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
// tessera-export CKPT_DIR -o OUT --format onnx: a model imported from ONNX
// written back as the same ONNX graph with its trained initializers,
// OUT/model.onnx (plus OUT/model.onnx.<hash>.data, external data, for
// models over 2 GiB), which onnxruntime loads. The artifact's ONNX record (the
// manifest's "onnx_source": the .onnx file and, for every parameter, the
// initializers it was computed from and how: as is, transposed, Megatron's
// per-group QKV rows from q/k/v, per-head rows from [q][k][v] blocks,
// gate/up stacked) is inverted: each initializer gets its parameter's
// trained value in its own layout. An initializer the exporter merged for
// several parameters (equal initial values, such as every norm's ones) is
// split, one initializer per parameter, rewired to the nodes of its module.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_EXPORT_H
#define TESSERA_RT_EXPORT_H

#include "tessera/rt/Status.h"

#include <functional>
#include <string>
#include <vector>

namespace tessera::rt {

struct ExportOptions {
  /// A checkpoint directory (its `latest` iteration) or an iter_ directory.
  std::string checkpoint;
  std::string output;
  /// safetensors or onnx.
  std::string format = "safetensors";
  /// --format onnx: the source model (default: the path the artifact
  /// recorded when it was compiled).
  std::string onnxModel;
  /// --format onnx: the initializers in OUT/model.onnx.<hash>.data even under
  /// 2 GiB (over it they always are).
  bool externalData = false;
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

/// A trained value for an initializer of the source ONNX model.
struct OnnxInitializer {
  std::string initializer; ///< the source's initializer
  /// The written initializer: `initializer`, or a new one (a split) that
  /// the nodes `readers` read instead.
  std::string name;
  std::vector<std::string> readers;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
/// Writes the ONNX model `source` with `values` applied into `model` (the
/// serialized ModelProto) and `data` (the bytes of the external-data file
/// `dataFile`, used over 2 GiB or when `external`, else empty); returns ""
/// or the error. The ONNX library lives
/// in the compiler (lib/Import/OnnxModel), not the runtime: tessera-export
/// passes its rewriter in.
using OnnxRewriter = std::function<std::string(
    const std::string &source, std::vector<OnnxInitializer> &values,
    const std::string &dataFile, bool external, std::string &model,
    std::string &data)>;

/// What exportOnnx wrote.
struct OnnxExportSummary {
  std::string source; ///< the source .onnx
  int64_t iteration = 0;
  std::string layout;
  int64_t initializers = 0, parameters = 0;
  int64_t split = 0;  ///< initializers split between parameters
  bool external = false;
  std::string dataFile; ///< the external-data file (in OUT), or ""
  int64_t vocab = 0, paddedVocab = 0;
  bool maskedVocab = false;
};

StatusOr<OnnxExportSummary> exportOnnx(const ExportOptions &options,
                                       const OnnxRewriter &rewrite);

/// tessera-export's main; `rewrite` enables --format onnx.
int runExport(int argc, char **argv, const OnnxRewriter &rewrite = nullptr);

} // namespace tessera::rt

#endif // TESSERA_RT_EXPORT_H
