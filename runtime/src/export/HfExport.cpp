//===- HfExport.cpp - Trained weights out as a Hugging Face model ---------===//
//
// See tessera/rt/Export.h. Three steps: gather every parameter whole from
// the checkpoint's shard files (each shard from one of its holders, placed
// by its box in the global tensor, as the resharding loader does), map the
// Megatron-named parameters to the Hugging Face architecture the
// checkpoint's architecture record describes, and write safetensors and
// config.json.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Export.h"

#include "ExportTensors.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/CommandLine.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace tessera::rt {
namespace {

using json = nlohmann::ordered_json;
using namespace exporting;

/// The safetensors and torch_dtype names of a float dtype.
const char *safetensorsDtype(fb::DType dtype) {
  return dtype == fb::DType::BF16  ? "BF16"
         : dtype == fb::DType::F16 ? "F16"
                                   : "F32";
}
const char *torchDtype(fb::DType dtype) {
  return dtype == fb::DType::BF16  ? "bfloat16"
         : dtype == fb::DType::F16 ? "float16"
                                   : "float32";
}


//===----------------------------------------------------------------------===//
// Megatron to Hugging Face
//===----------------------------------------------------------------------===//

/// The architecture record's fields, with the defaults of models recorded
/// before a field existed.
struct Architecture {
  int64_t layers = 0, hidden = 0, heads = 0, groups = 0, headDim = 0,
          ffn = 0, vocab = 0, maxPositions = 0;
  std::string normalization, positions, activation;
  double normEps = 1e-5, rotaryBase = 10000, rotaryPercent = 1,
         ropeScaling = 0, initStd = 0.02;
  bool swiglu = false, bias = true, untied = true, qkNorm = false;
  bool maskedVocab = false; ///< "mask_padded_vocab" (--mask-padded-vocab)
  int64_t experts = 0, topk = 2, moeFfn = 0, moeFreq = 1;
  double auxCoeff = 0, capacity = 0;
};

StatusOr<Architecture> parseArchitecture(const std::string &text,
                                         const std::string &where) {
  if (text.empty())
    return invalidArgument(
        where, ": the checkpoint records no architecture (its artifact was "
               "compiled from a model tessera-gen did not build, or by a "
               "tessera-compile before format 15); tessera-export writes "
               "tessera-gen's GPT and Llama-family models");
  json j = json::parse(text, nullptr, false);
  if (!j.is_object())
    return invalidArgument(where, ": the architecture record is not a JSON "
                                  "object");
  Architecture a;
  try {
    a.layers = j.at("num_layers").get<int64_t>();
    a.hidden = j.at("hidden_size").get<int64_t>();
    a.heads = j.at("num_attention_heads").get<int64_t>();
    a.groups = j.value("num_query_groups", a.heads);
    a.headDim = j.value("kv_channels", a.heads ? a.hidden / a.heads : 0);
    a.ffn = j.at("ffn_hidden_size").get<int64_t>();
    a.vocab = j.at("vocab_size").get<int64_t>();
    a.maskedVocab = j.value("mask_padded_vocab", false);
    a.maxPositions = j.at("max_position_embeddings").get<int64_t>();
    a.normalization = j.at("normalization").get<std::string>();
    a.normEps = j.at("norm_epsilon").get<double>();
    a.positions = j.at("position_embedding_type").get<std::string>();
    a.rotaryBase = j.value("rotary_base", 10000.0);
    a.rotaryPercent = j.value("rotary_percent", 1.0);
    a.ropeScaling = j.value("rope_scaling_factor", 0.0);
    a.swiglu = j.at("swiglu").get<bool>();
    a.activation = j.value("activation", std::string("gelu"));
    a.bias = j.at("add_bias_linear").get<bool>();
    a.untied = j.at("untie_embeddings_and_output_weights").get<bool>();
    a.qkNorm = j.value("qk_layernorm", false);
    a.initStd = j.value("init_method_std", 0.02);
    a.experts = j.value("num_experts", int64_t(0));
    a.topk = j.value("moe_router_topk", int64_t(2));
    a.moeFfn = j.value("moe_ffn_hidden_size", a.ffn);
    a.moeFreq = j.value("moe_layer_freq", int64_t(1));
    a.auxCoeff = j.value("moe_aux_loss_coeff", 0.0);
    a.capacity = j.value("moe_expert_capacity_factor", 0.0);
  } catch (const std::exception &e) {
    return invalidArgument(where, ": the architecture record lacks a field "
                                  "or has one of the wrong type: ",
                           e.what());
  }
  if (a.layers < 1 || a.hidden < 1 || a.heads < 1 || a.groups < 1 ||
      a.heads % a.groups != 0 || a.headDim < 1 || a.vocab < 1)
    return invalidArgument(where, ": the architecture record's sizes are not "
                                  "a model's");
  return a;
}

/// Builds the Hugging Face tensors and config of one architecture, taking
/// each Megatron parameter once; a parameter left over is an error (it
/// would be lost).
class HfModel {
public:
  HfModel(std::map<std::string, Tensor> params, const Architecture &a,
          std::string where)
      : params(std::move(params)), a(a), where(std::move(where)) {}

  /// Chooses the architecture and maps every parameter.
  Status build();

  std::string architecture;
  json config;
  std::vector<std::pair<std::string, Tensor>> tensors;

private:
  StatusOr<Tensor> take(const std::string &name) {
    auto it = params.find(name);
    if (it == params.end())
      return invalidArgument(where, ": no parameter '", name, "', which ",
                             architecture, " needs");
    Tensor t = std::move(it->second);
    params.erase(it);
    return t;
  }
  void put(std::string name, Tensor t) {
    tensors.emplace_back(std::move(name), std::move(t));
  }
  /// Parameter `from` as it is, named `to`.
  Status move(const std::string &from, std::string to) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, take(from));
    put(std::move(to), std::move(t));
    return Status();
  }
  /// linear_qkv's weight or bias (`what`) as q/k/v_proj's.
  Status qkvProjections(const std::string &from, const std::string &to,
                        const std::string &what) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, take(from + "." + what));
    auto [q, k, v] = splitQkv(t);
    put(to + "q_proj." + what, std::move(q));
    put(to + "k_proj." + what, std::move(k));
    put(to + "v_proj." + what, std::move(v));
    return Status();
  }
  Status unsupported(const std::string &why) {
    return invalidArgument(where, ": no Hugging Face architecture for this "
                                  "model: ",
                           why);
  }
  /// linear_qkv's rows (a weight [rows, H] or a bias [rows]) in Megatron's
  /// per-group layout [q (heads/G x d) | k (d) | v (d)] as q [heads d],
  /// k [G d], v [G d].
  std::array<Tensor, 3> splitQkv(const Tensor &w) {
    const int64_t d = a.headDim, perGroup = a.heads / a.groups;
    std::vector<Tensor> q, k, v;
    for (int64_t g = 0; g < a.groups; ++g) {
      const int64_t at = g * (perGroup + 2) * d;
      q.push_back(slice0(w, at, at + perGroup * d));
      k.push_back(slice0(w, at + perGroup * d, at + (perGroup + 1) * d));
      v.push_back(slice0(w, at + (perGroup + 1) * d, at + (perGroup + 2) * d));
    }
    return {concat0(q), concat0(k), concat0(v)};
  }
  /// The vocabulary's rows (the padding cut off).
  StatusOr<Tensor> vocabRows(const std::string &name) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, take(name));
    if (t.shape.size() != 2 || t.shape[0] < a.vocab)
      return invalidArgument(where, ": parameter '", name, "' ",
                             shapeText(t.shape), " has fewer than the ",
                             a.vocab, " rows of the vocabulary");
    paddedVocab = std::max(paddedVocab, t.shape[0]);
    return slice0(t, 0, a.vocab);
  }

public:
  /// The rows of the largest vocabulary-indexed parameter (the padded
  /// vocabulary).
  int64_t paddedVocab = 0;

private:
  Status gpt2();
  Status llama();

  std::map<std::string, Tensor> params;
  const Architecture &a;
  std::string where;
};

Status HfModel::build() {
  const bool gpt2Shaped = a.normalization == "LayerNorm" && !a.swiglu &&
                          a.positions == "learned_absolute";
  const bool llamaShaped = a.normalization == "RMSNorm" && a.swiglu &&
                           a.positions == "rope";
  if (gpt2Shaped)
    TESSERA_RETURN_IF_ERROR(gpt2());
  else if (llamaShaped)
    TESSERA_RETURN_IF_ERROR(llama());
  else
    return unsupported(
        "GPT2LMHeadModel needs LayerNorm, GELU and learned absolute "
        "positions, the Llama family RMSNorm, SwiGLU and RoPE; this one has " +
        a.normalization + ", " + (a.swiglu ? "SwiGLU" : "GELU") + " and " +
        a.positions + " positions");
  if (!params.empty())
    return invalidArgument(where, ": parameter '", params.begin()->first,
                           "' has no place in ", architecture,
                           " (it would be lost)");
  return Status();
}

Status HfModel::gpt2() {
  architecture = "GPT2LMHeadModel";
  if (!a.bias)
    return unsupported("GPT-2 has biases in every linear "
                       "(--disable-bias-linear removed them)");
  if (a.groups != a.heads || a.headDim * a.heads != a.hidden)
    return unsupported("GPT-2 has multi-head attention over the hidden size "
                       "(no query groups, no --kv-channels)");
  if (a.experts > 0)
    return unsupported("GPT-2 has no experts");
  if (a.qkNorm)
    return unsupported("GPT-2 has no QK-norm");
  TESSERA_ASSIGN_OR_RETURN(Tensor wte,
                           vocabRows("embedding.word_embeddings.weight"));
  put("transformer.wte.weight", std::move(wte));
  TESSERA_RETURN_IF_ERROR(move("embedding.position_embeddings.weight", "transformer.wpe.weight"));
  for (int64_t i = 0; i < a.layers; ++i) {
    const std::string m = "decoder.layers." + std::to_string(i) + ".";
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const char *p : {"weight", "bias"}) {
      TESSERA_RETURN_IF_ERROR(move(m + "input_layernorm." + p, h + "ln_1." + p));
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor qkv,
                             take(m + "self_attention.linear_qkv.weight"));
    auto [q, k, v] = splitQkv(qkv);
    put(h + "attn.c_attn.weight", transpose(concat0({q, k, v})));
    TESSERA_ASSIGN_OR_RETURN(Tensor qkvBias,
                             take(m + "self_attention.linear_qkv.bias"));
    auto [qb, kb, vb] = splitQkv(qkvBias);
    put(h + "attn.c_attn.bias", concat0({qb, kb, vb}));
    TESSERA_ASSIGN_OR_RETURN(Tensor proj,
                             take(m + "self_attention.linear_proj.weight"));
    put(h + "attn.c_proj.weight", transpose(proj));
    TESSERA_RETURN_IF_ERROR(move(m + "self_attention.linear_proj.bias", h + "attn.c_proj.bias"));
    for (const char *p : {"weight", "bias"}) {
      TESSERA_RETURN_IF_ERROR(move(m + "pre_mlp_layernorm." + p, h + "ln_2." + p));
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor fc1, take(m + "mlp.linear_fc1.weight"));
    put(h + "mlp.c_fc.weight", transpose(fc1));
    TESSERA_RETURN_IF_ERROR(move(m + "mlp.linear_fc1.bias", h + "mlp.c_fc.bias"));
    TESSERA_ASSIGN_OR_RETURN(Tensor fc2, take(m + "mlp.linear_fc2.weight"));
    put(h + "mlp.c_proj.weight", transpose(fc2));
    TESSERA_RETURN_IF_ERROR(move(m + "mlp.linear_fc2.bias", h + "mlp.c_proj.bias"));
  }
  for (const char *p : {"weight", "bias"}) {
    TESSERA_RETURN_IF_ERROR(move(std::string("decoder.final_layernorm.") + p, std::string("transformer.ln_f.") + p));
  }
  if (a.untied) {
    TESSERA_ASSIGN_OR_RETURN(Tensor head, vocabRows("output_layer.weight"));
    put("lm_head.weight", std::move(head));
  }
  config = {{"architectures", {architecture}},
            {"model_type", "gpt2"},
            {"vocab_size", a.vocab},
            {"n_positions", a.maxPositions},
            {"n_embd", a.hidden},
            {"n_layer", a.layers},
            {"n_head", a.heads},
            {"n_inner", a.ffn},
            // Megatron's --openai-gelu is GPT-2's gelu_new (tanh).
            {"activation_function",
             a.activation == "openai_gelu" ? "gelu_new" : "gelu"},
            {"layer_norm_epsilon", a.normEps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", a.initStd},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", !a.untied}};
  return Status();
}

Status HfModel::llama() {
  const bool moe = a.experts > 0;
  architecture = moe        ? "MixtralForCausalLM"
                 : a.qkNorm ? "Qwen3ForCausalLM"
                            : "LlamaForCausalLM";
  if (a.rotaryPercent != 1.0)
    return unsupported("Hugging Face's Llama family rotates every feature of "
                       "a head (--rotary-percent " +
                       std::to_string(a.rotaryPercent) + ")");
  if (moe) {
    if (a.qkNorm)
      return unsupported("Mixtral has no QK-norm");
    if (a.bias)
      return unsupported("Mixtral has no linear biases");
    if (a.moeFreq != 1)
      return unsupported("Mixtral has experts in every layer (--moe-layer-freq "
                         "1)");
    if (a.capacity != 0.0)
      return unsupported("Mixtral's experts drop no tokens (no "
                         "--moe-expert-capacity-factor)");
  }
  if (a.qkNorm && a.bias)
    return unsupported("Qwen3's MLP has no biases");
  TESSERA_ASSIGN_OR_RETURN(Tensor embed,
                           vocabRows("embedding.word_embeddings.weight"));
  put("model.embed_tokens.weight", std::move(embed));
  for (int64_t i = 0; i < a.layers; ++i) {
    const std::string m = "decoder.layers." + std::to_string(i) + ".";
    const std::string h = "model.layers." + std::to_string(i) + ".";
    TESSERA_RETURN_IF_ERROR(move(m + "input_layernorm.weight", h + "input_layernorm.weight"));
    TESSERA_RETURN_IF_ERROR(qkvProjections(
        m + "self_attention.linear_qkv", h + "self_attn.", "weight"));
    if (a.bias)
      TESSERA_RETURN_IF_ERROR(qkvProjections(
          m + "self_attention.linear_qkv", h + "self_attn.", "bias"));
    if (a.qkNorm) {
      TESSERA_RETURN_IF_ERROR(move(m + "self_attention.q_layernorm.weight", h + "self_attn.q_norm.weight"));
      TESSERA_RETURN_IF_ERROR(move(m + "self_attention.k_layernorm.weight", h + "self_attn.k_norm.weight"));
    }
    TESSERA_RETURN_IF_ERROR(move(m + "self_attention.linear_proj.weight", h + "self_attn.o_proj.weight"));
    if (a.bias) {
      TESSERA_RETURN_IF_ERROR(move(m + "self_attention.linear_proj.bias", h + "self_attn.o_proj.bias"));
    }
    TESSERA_RETURN_IF_ERROR(move(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight"));
    if (moe) {
      TESSERA_RETURN_IF_ERROR(move(m + "mlp.router.weight", h + "block_sparse_moe.gate.weight"));
      TESSERA_ASSIGN_OR_RETURN(Tensor w13,
                               take(m + "mlp.experts.linear_fc1.weight"));
      TESSERA_ASSIGN_OR_RETURN(Tensor w2,
                               take(m + "mlp.experts.linear_fc2.weight"));
      if (w13.shape.size() != 4 || w13.shape[1] != 2)
        return invalidArgument(where, ": the experts' linear_fc1 ",
                               shapeText(w13.shape),
                               " is not SwiGLU's stacked [experts, 2, ffn, "
                               "hidden]");
      for (int64_t e = 0; e < a.experts; ++e) {
        const std::string x =
            h + "block_sparse_moe.experts." + std::to_string(e) + ".";
        Tensor gateUp = index0(w13, e);
        put(x + "w1.weight", index0(gateUp, 0));
        put(x + "w3.weight", index0(gateUp, 1));
        put(x + "w2.weight", index0(w2, e));
      }
    } else {
      TESSERA_ASSIGN_OR_RETURN(Tensor fc1, take(m + "mlp.linear_fc1.weight"));
      if (fc1.shape.size() != 3 || fc1.shape[0] != 2)
        return invalidArgument(where, ": linear_fc1 ",
                               shapeText(fc1.shape),
                               " is not SwiGLU's stacked [2, ffn, hidden]");
      put(h + "mlp.gate_proj.weight", index0(fc1, 0));
      put(h + "mlp.up_proj.weight", index0(fc1, 1));
      if (a.bias) {
        TESSERA_ASSIGN_OR_RETURN(Tensor b, take(m + "mlp.linear_fc1.bias"));
        put(h + "mlp.gate_proj.bias", index0(b, 0));
        put(h + "mlp.up_proj.bias", index0(b, 1));
      }
      TESSERA_RETURN_IF_ERROR(move(m + "mlp.linear_fc2.weight", h + "mlp.down_proj.weight"));
      if (a.bias) {
        TESSERA_RETURN_IF_ERROR(move(m + "mlp.linear_fc2.bias", h + "mlp.down_proj.bias"));
      }
    }
  }
  TESSERA_RETURN_IF_ERROR(move("decoder.final_layernorm.weight", "model.norm.weight"));
  if (a.untied) {
    TESSERA_ASSIGN_OR_RETURN(Tensor head, vocabRows("output_layer.weight"));
    put("lm_head.weight", std::move(head));
  }
  json rope = nullptr;
  if (a.ropeScaling != 0.0)
    // Megatron's apply_rope_scaling constants (Llama 3.1's).
    rope = {{"rope_type", "llama3"},
            {"factor", a.ropeScaling},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}};
  config = {{"architectures", {architecture}},
            {"model_type", moe        ? "mixtral"
                           : a.qkNorm ? "qwen3"
                                      : "llama"},
            {"vocab_size", a.vocab},
            {"hidden_size", a.hidden},
            {"intermediate_size", moe ? a.moeFfn : a.ffn},
            {"num_hidden_layers", a.layers},
            {"num_attention_heads", a.heads},
            {"num_key_value_heads", a.groups},
            {"head_dim", a.headDim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", a.maxPositions},
            {"rms_norm_eps", a.normEps},
            {"rope_theta", a.rotaryBase},
            {"rope_scaling", rope},
            {"attention_dropout", 0.0},
            {"initializer_range", a.initStd},
            {"tie_word_embeddings", !a.untied}};
  if (moe) {
    config["num_local_experts"] = a.experts;
    config["num_experts_per_tok"] = a.topk;
    config["router_aux_loss_coef"] = a.auxCoeff;
    config["output_router_logits"] = false;
    config["sliding_window"] = nullptr;
  } else if (a.qkNorm) {
    config["attention_bias"] = a.bias;
    config["use_sliding_window"] = false;
    config["sliding_window"] = nullptr;
    config["max_window_layers"] = a.layers;
  } else {
    config["attention_bias"] = a.bias;
    config["mlp_bias"] = a.bias;
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

/// Writes the safetensors file of `tensors` to `path` atomically: an 8-byte
/// little-endian header size, the JSON header (names, dtypes, shapes, data
/// offsets; padded with spaces to 8 bytes), then the data in header order,
/// straight from the tensors (no second copy of the model in memory).
Status writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, Tensor>> &tensors) {
  json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t at = 0;
  for (const auto &[name, t] : tensors) {
    const int64_t bytes = int64_t(t.data.size());
    header[name] = {{"dtype", safetensorsDtype(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    head[size_t(i)] = char((n >> (8 * i)) & 0xff);
  head += text;
  std::vector<FilePiece> pieces = {{head.data(), head.size()}};
  for (const auto &entry : tensors)
    pieces.push_back({entry.second.data.data(), entry.second.data.size()});
  return writeFileAtomic(path, pieces);
}

} // namespace

StatusOr<ExportSummary> exportHuggingFace(const ExportOptions &options) {
  if (options.format != "safetensors")
    return invalidArgument("--format ", options.format,
                           ": tessera-export writes safetensors or onnx");
  if (options.dtype != "auto" && options.dtype != "fp32" &&
      options.dtype != "bf16" && options.dtype != "fp16")
    return invalidArgument("--dtype must be auto, fp32, bf16 or fp16, got '",
                           options.dtype, "'");
  if (options.output.empty())
    return invalidArgument("give the output directory (-o OUT)");
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation location,
                           locateCheckpoint(options.checkpoint));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest manifest, readManifest(location));
  const std::string where = location.dir + "/manifest.json";
  TESSERA_ASSIGN_OR_RETURN(Architecture arch,
                           parseArchitecture(manifest.architecture, where));
  TESSERA_ASSIGN_OR_RETURN(auto params, gatherParameters(location, manifest));
  HfModel model(std::move(params), arch, where);
  TESSERA_RETURN_IF_ERROR(model.build());

  // One dtype for the file: as trained (the parameters', bf16 under
  // --bf16, f16 under --fp16), or as asked.
  fb::DType dtype = fb::DType::F32;
  if (options.dtype == "bf16")
    dtype = fb::DType::BF16;
  else if (options.dtype == "fp16")
    dtype = fb::DType::F16;
  else if (options.dtype == "auto")
    for (const auto &entry : model.tensors)
      if (entry.second.dtype != fb::DType::F32)
        dtype = entry.second.dtype;
  ExportSummary summary;
  for (auto &entry : model.tensors) {
    if (entry.second.dtype != dtype)
      entry.second = convert(entry.second, dtype);
    summary.parameters += entry.second.numel();
  }
  summary.tensors = int64_t(model.tensors.size());
  summary.architecture = model.architecture;
  summary.iteration = manifest.iteration;
  summary.dtype = safetensorsDtype(dtype);
  summary.layout = manifest.configString();
  summary.vocab = arch.vocab;
  summary.paddedVocab = model.paddedVocab;
  summary.maskedVocab = arch.maskedVocab;
  model.config["torch_dtype"] = torchDtype(dtype);
  model.config["tessera_checkpoint_iteration"] = manifest.iteration;

  TESSERA_RETURN_IF_ERROR(makeDirectories(options.output));
  TESSERA_RETURN_IF_ERROR(
      writeSafetensors(options.output + "/model.safetensors", model.tensors));
  TESSERA_RETURN_IF_ERROR(writeFileAtomic(options.output + "/config.json",
                                          model.config.dump(2) + "\n"));
  return summary;
}

static const char *kUsage =
    "usage: tessera-export CKPT_DIR -o OUT [--format safetensors|onnx] "
    "[--dtype auto|fp32|bf16|fp16]\n"
    "                      [--onnx-model FILE.onnx] [--external-data]\n"
    "\n"
    "Writes the parameters of a tessera-run checkpoint (any layout) as a "
    "Hugging Face\n"
    "model: OUT/model.safetensors and OUT/config.json (GPT2LMHeadModel, "
    "LlamaForCausalLM,\n"
    "Qwen3ForCausalLM or MixtralForCausalLM), which "
    "AutoModelForCausalLM.from_pretrained\n"
    "loads; or, for a model imported from ONNX, as its ONNX graph with the "
    "trained\n"
    "initializers: OUT/model.onnx (and OUT/model.onnx.<hash>.data over 2 GiB), "
    "which onnxruntime\n"
    "loads.\n"
    "\n"
    "  CKPT_DIR        a --save directory (its latest iteration) or an "
    "iter_ directory\n"
    "  -o OUT          the output directory (made if missing)\n"
    "  --format F      safetensors (default) or onnx\n"
    "  --dtype D       safetensors: auto (as trained: bf16 under --bf16, "
    "fp16 under\n"
    "                  --fp16), fp32, bf16 or fp16 (onnx: the model's own "
    "f32)\n"
    "  --onnx-model F  onnx: the source model, when it moved since "
    "tessera-compile read it\n"
    "  --external-data onnx: the initializers in OUT/model.onnx.<hash>.data (ONNX "
    "external data;\n"
    "                  always over 2 GiB)\n";

/// The vocabulary padding note both formats print.
static void printVocabNote(int64_t vocab, int64_t padded, bool masked) {
  if (padded > vocab && masked)
    std::printf("tessera-export: the vocabulary of %lld was padded to %lld "
                "rows, whose logits were kept out of the loss "
                "(--mask-padded-vocab): cut off, the model is the trained "
                "one\n",
                (long long)vocab, (long long)padded);
  else if (padded > vocab)
    std::printf(
        "tessera-export: note: the vocabulary of %lld was padded to %lld "
        "rows (--make-vocab-size-divisible-by); as in Megatron-LM the padded "
        "rows' logits entered the softmax in training, and they are cut off "
        "here, so the exported model's loss differs from the trained one's "
        "(compile with --make-vocab-size-divisible-by 1 or "
        "--mask-padded-vocab for an exact export)\n",
        (long long)vocab, (long long)padded);
}

int runExport(int argc, char **argv, const OnnxRewriter &rewrite) {
  ExportOptions options;
  ArgReader args(argc, argv);
  auto fail = [](const std::string &message) {
    std::fprintf(stderr, "tessera-export: error: %s\n", message.c_str());
    return 1;
  };
  while (args.next()) {
    const std::string &flag = args.arg();
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "-o" || flag == "--output" || flag == "--format" ||
        flag == "--dtype" || flag == "--onnx-model") {
      StatusOr<std::string> value = args.value();
      if (!value.ok())
        return fail(value.status().message());
      (flag == "--format"       ? options.format
       : flag == "--dtype"      ? options.dtype
       : flag == "--onnx-model" ? options.onnxModel
                                : options.output) = *value;
      continue;
    }
    if (flag == "--external-data") {
      options.externalData = true;
      continue;
    }
    if (flag.rfind("-", 0) == 0)
      return fail("unknown flag " + flag + "\n" + kUsage);
    if (!options.checkpoint.empty())
      return fail("one checkpoint directory, got '" + options.checkpoint +
                  "' and '" + flag + "'");
    options.checkpoint = flag;
  }
  if (options.checkpoint.empty())
    return fail(std::string("give a checkpoint directory\n") + kUsage);
  if (options.format == "onnx") {
    StatusOr<OnnxExportSummary> summary = exportOnnx(options, rewrite);
    if (!summary.ok())
      return fail(summary.status().message());
    std::printf("tessera-export: ONNX %s, iteration %lld of %s: %lld "
                "initializers (%lld split between parameters), %lld "
                "parameters (F32) -> %s/model.onnx%s%s\n",
                summary->source.c_str(), (long long)summary->iteration,
                summary->layout.c_str(), (long long)summary->initializers,
                (long long)summary->split, (long long)summary->parameters,
                options.output.c_str(), summary->external ? " + " : "",
                summary->dataFile.c_str());
    printVocabNote(summary->vocab, summary->paddedVocab, summary->maskedVocab);
    return 0;
  }
  if (!options.onnxModel.empty() || options.externalData)
    return fail(std::string(options.externalData ? "--external-data" : "--onnx-model") +
                " is for --format onnx");
  StatusOr<ExportSummary> summary = exportHuggingFace(options);
  if (!summary.ok())
    return fail(summary.status().message());
  std::printf("tessera-export: %s, iteration %lld of %s: %lld tensors, %lld "
              "parameters (%s) -> %s/model.safetensors, %s/config.json\n",
              summary->architecture.c_str(), (long long)summary->iteration,
              summary->layout.c_str(), (long long)summary->tensors,
              (long long)summary->parameters, summary->dtype.c_str(),
              options.output.c_str(), options.output.c_str());
  printVocabNote(summary->vocab, summary->paddedVocab, summary->maskedVocab);
  return 0;
}

} // namespace tessera::rt
