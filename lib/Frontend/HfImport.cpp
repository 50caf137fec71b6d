//===- HfImport.cpp - Hugging Face checkpoints in -------------------------===//
//
// See include/tessera/Frontend/HfImport.h: config.json to a GPTConfig,
// safetensors to Megatron-layout f32 weights in one file, and the model
// tessera-gen builds with those weights as its parameters' initial values.
//
//===----------------------------------------------------------------------===//

#include "tessera/Frontend/HfImport.h"

#include "tessera/Frontend/GPT.h"
#include "tessera/Support/Model.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>
#include <optional>
#include <set>

using namespace mlir;

namespace tessera {
namespace {

/// A tensor of a safetensors file, as f32 on demand.
struct StoredTensor {
  std::string file, dtype;
  std::vector<int64_t> shape;
  const char *data = nullptr;
  int64_t bytes = 0;
};

/// The tensors of a model directory: model.safetensors, or the files a
/// model.safetensors.index.json names (each mapped once).
class Checkpoint {
public:
  explicit Checkpoint(std::string dir) : dir(std::move(dir)) {}

  /// Reads the headers; an error names the file.
  bool open(std::string &error);

  /// Tensor `name` as f32 with shape `shape`, or an error naming it.
  bool get(llvm::StringRef name, llvm::ArrayRef<int64_t> shape,
           std::vector<float> &out, std::string &error);

  bool has(llvm::StringRef name) const { return tensors.count(name); }

  /// The tensors no get() asked for.
  std::vector<std::string> unused() const {
    std::vector<std::string> names;
    for (const auto &entry : tensors)
      if (!used.count(entry.getKey()))
        names.push_back(entry.getKey().str());
    std::sort(names.begin(), names.end());
    return names;
  }

private:
  bool openFile(const std::string &file, std::string &error);

  std::string dir;
  std::vector<std::unique_ptr<llvm::MemoryBuffer>> buffers;
  llvm::StringMap<StoredTensor> tensors;
  llvm::StringMap<bool> used;
};

/// The JSON object in file `path` (config.json, a safetensors index), or
/// none with `error` naming the file and what is wrong.
std::optional<llvm::json::Object> readJsonObject(const std::string &path,
                                                 std::string &error) {
  auto text = llvm::MemoryBuffer::getFile(path);
  if (!text) {
    error = path + ": " + text.getError().message();
    return std::nullopt;
  }
  llvm::Expected<llvm::json::Value> parsed =
      llvm::json::parse((*text)->getBuffer());
  if (!parsed) {
    error = path + ": " + llvm::toString(parsed.takeError());
    return std::nullopt;
  }
  if (llvm::json::Object *o = parsed->getAsObject())
    return std::move(*o);
  error = path + ": not a JSON object";
  return std::nullopt;
}

bool Checkpoint::open(std::string &error) {
  std::string index = dir + "/model.safetensors.index.json";
  if (llvm::sys::fs::exists(index)) {
    std::optional<llvm::json::Object> j = readJsonObject(index, error);
    if (!j)
      return false;
    const llvm::json::Object *map = j->getObject("weight_map");
    if (!map) {
      error = index + ": not a safetensors index (no \"weight_map\")";
      return false;
    }
    std::set<std::string> files;
    for (const auto &entry : *map)
      if (auto f = entry.second.getAsString())
        files.insert(f->str());
    for (const std::string &f : files)
      if (!openFile(f, error))
        return false;
    return true;
  }
  return openFile("model.safetensors", error);
}

bool Checkpoint::openFile(const std::string &file, std::string &error) {
  const std::string path = dir + "/" + file;
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                            /*RequiresNullTerminator=*/false);
  if (!buffer) {
    error = path + ": " + buffer.getError().message();
    return false;
  }
  llvm::StringRef bytes = (*buffer)->getBuffer();
  uint64_t n = 0;
  if (bytes.size() < 8) {
    error = path + ": not a safetensors file (" + std::to_string(bytes.size()) +
            " bytes)";
    return false;
  }
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | uint8_t(bytes[size_t(i)]);
  if (n > bytes.size() - 8) {
    error = path + ": its header of " + std::to_string(n) +
            " bytes runs past the end of the file";
    return false;
  }
  llvm::Expected<llvm::json::Value> header =
      llvm::json::parse(bytes.substr(8, n));
  if (!header || !header->getAsObject()) {
    if (!header)
      llvm::consumeError(header.takeError());
    error = path + ": its header is not a JSON object";
    return false;
  }
  const uint64_t dataStart = 8 + n, dataBytes = bytes.size() - dataStart;
  for (const auto &entry : *header->getAsObject()) {
    if (entry.first == "__metadata__")
      continue;
    const llvm::json::Object *t = entry.second.getAsObject();
    const llvm::json::Array *shape = t ? t->getArray("shape") : nullptr;
    const llvm::json::Array *offsets = t ? t->getArray("data_offsets") : nullptr;
    std::optional<llvm::StringRef> dtype = t ? t->getString("dtype") : std::nullopt;
    StoredTensor s;
    s.file = path;
    bool ok = shape && offsets && offsets->size() == 2 && dtype;
    int64_t begin = 0, end = 0, numel = 1;
    if (ok) {
      s.dtype = dtype->str();
      for (const llvm::json::Value &d : *shape) {
        std::optional<int64_t> v = d.getAsInteger();
        ok &= v && *v >= 0;
        s.shape.push_back(v.value_or(0));
        numel *= v.value_or(0);
      }
      begin = (*offsets)[0].getAsInteger().value_or(-1);
      end = (*offsets)[1].getAsInteger().value_or(-1);
      const int64_t size = s.dtype == "F32"                         ? 4
                           : s.dtype == "BF16" || s.dtype == "F16" ? 2
                                                                   : 0;
      ok &= begin >= 0 && end >= begin && uint64_t(end) <= dataBytes &&
            end - begin == numel * size && size > 0;
    }
    if (!ok) {
      error = path + ": tensor '" + entry.first.str() +
              "' has a bad header entry (F32, BF16 or F16, a shape, and "
              "data_offsets inside the file that hold its bytes)";
      return false;
    }
    s.data = bytes.data() + dataStart + begin;
    s.bytes = end - begin;
    tensors[entry.first.str()] = std::move(s);
  }
  buffers.push_back(std::move(*buffer));
  return true;
}

/// The float of IEEE half bits `h`.
float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f,
           mant = h & 0x3ff, bits;
  if (exp == 0x1f)
    bits = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0)
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0)
    bits = sign;
  else {
    // Subnormal: normalise.
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool Checkpoint::get(llvm::StringRef name, llvm::ArrayRef<int64_t> shape,
                     std::vector<float> &out, std::string &error) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    error = dir + ": no tensor '" + name.str() + "' in the checkpoint";
    return false;
  }
  const StoredTensor &s = it->second;
  if (llvm::ArrayRef<int64_t>(s.shape) != shape) {
    std::string want, got;
    llvm::raw_string_ostream w(want), g(got);
    w << "[";
    llvm::interleaveComma(shape, w);
    w << "]";
    g << "[";
    llvm::interleaveComma(s.shape, g);
    g << "]";
    error = s.file + ": tensor '" + name.str() + "' is " + got +
            ", config.json makes it " + want;
    return false;
  }
  used[name] = true;
  const int64_t n = s.bytes / (s.dtype == "F32" ? 4 : 2);
  out.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if (s.dtype == "F32") {
      std::memcpy(&out[size_t(i)], s.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, s.data + 2 * i, 2);
      if (s.dtype == "BF16") {
        uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&out[size_t(i)], &bits, 4);
      } else {
        out[size_t(i)] = halfToFloat(h);
      }
    }
  }
  return true;
}

/// GPT-2's config.json (GPT2LMHeadModel): LayerNorm, GELU (gelu_new is
/// Megatron's --openai-gelu), learned positions, biases, tied embeddings.
bool readGpt2Config(const std::string &path, const llvm::json::Object &j,
                    const HfImportOptions &options, GPTConfig &c,
                    std::string &error) {
  auto integer = [&](llvm::StringRef key, int64_t &field) {
    if (std::optional<int64_t> v = j.getInteger(key)) {
      field = *v;
      return true;
    }
    error = path + ": needs the integer \"" + key.str() + "\"";
    return false;
  };
  if (!integer("n_layer", c.layers) || !integer("n_embd", c.hidden) ||
      !integer("n_head", c.heads) || !integer("vocab_size", c.vocab) ||
      !integer("n_positions", c.maxPositions))
    return false;
  c.ffn = j.getInteger("n_inner").value_or(4 * c.hidden);
  c.seq = options.seqLength ? options.seqLength : c.maxPositions;
  if (c.seq > c.maxPositions) {
    error = path + ": --seq-length " + std::to_string(c.seq) +
            " exceeds n_positions " + std::to_string(c.maxPositions);
    return false;
  }
  std::string act = j.getString("activation_function").value_or("gelu_new").str();
  if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    c.openaiGelu = true;
  else if (act != "gelu") {
    error = path + ": activation_function '" + act +
            "': Tessera's GPT has gelu (erf) or gelu_new (tanh)";
    return false;
  }
  for (const char *unsupported :
       {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (j.getBoolean(unsupported).value_or(false)) {
      error = path + ": " + unsupported + " is not Megatron's attention";
      return false;
    }
  if (!j.getBoolean("scale_attn_weights").value_or(true)) {
    error = path + ": scale_attn_weights false is not Megatron's attention";
    return false;
  }
  c.layerNormEps = j.getNumber("layer_norm_epsilon").value_or(1e-5);
  c.tieEmbeddings = j.getBoolean("tie_word_embeddings").value_or(true);
  c.initStd = j.getNumber("initializer_range").value_or(0.02);
  if (std::string why = validateGPTConfig(c); !why.empty()) {
    error = path + ": " + why;
    return false;
  }
  return true;
}

/// config.json to tessera-gen's configuration, or an error naming the
/// field.
bool readConfig(const std::string &path, const HfImportOptions &options,
                GPTConfig &c, std::string &error) {
  std::optional<llvm::json::Object> parsed = readJsonObject(path, error);
  if (!parsed)
    return false;
  const llvm::json::Object &j = *parsed;
  std::string type = j.getString("model_type").value_or("").str();
  if (type != "llama" && type != "mistral" && type != "qwen3" &&
      type != "mixtral" && type != "gpt2") {
    error = path + ": model_type '" + type +
            "' is not one Tessera imports (gpt2, llama, mistral, qwen3, "
            "mixtral)";
    return false;
  }
  if (type == "gpt2")
    return readGpt2Config(path, j, options, c, error);
  auto integer = [&](llvm::StringRef key, int64_t &field) {
    if (std::optional<int64_t> v = j.getInteger(key)) {
      field = *v;
      return true;
    }
    error = path + ": needs the integer \"" + key.str() + "\"";
    return false;
  };
  int64_t kvHeads = 0;
  if (!integer("num_hidden_layers", c.layers) ||
      !integer("hidden_size", c.hidden) ||
      !integer("num_attention_heads", c.heads) ||
      !integer("intermediate_size", c.ffn) ||
      !integer("vocab_size", c.vocab) ||
      !integer("max_position_embeddings", c.maxPositions))
    return false;
  kvHeads = j.getInteger("num_key_value_heads").value_or(c.heads);
  c.numQueryGroups = kvHeads == c.heads ? 0 : kvHeads;
  if (std::optional<int64_t> d = j.getInteger("head_dim");
      d && *d != c.hidden / c.heads)
    c.kvChannels = *d;
  c.seq = options.seqLength ? options.seqLength : c.maxPositions;
  if (c.seq > c.maxPositions) {
    error = path + ": --seq-length " + std::to_string(c.seq) +
            " exceeds max_position_embeddings " +
            std::to_string(c.maxPositions);
    return false;
  }
  c.normalization = "RMSNorm";
  c.layerNormEps = j.getNumber("rms_norm_eps").value_or(1e-6);
  c.swiglu = true;
  c.positionEmbeddingType = "rope";
  c.rotaryBase = j.getNumber("rope_theta").value_or(10000.0);
  c.tieEmbeddings = j.getBoolean("tie_word_embeddings").value_or(false);
  c.qkLayernorm = type == "qwen3";
  const bool attentionBias = j.getBoolean("attention_bias").value_or(false);
  const bool mlpBias = j.getBoolean("mlp_bias").value_or(false);
  if (attentionBias != mlpBias || (attentionBias && type != "llama")) {
    error = path + ": attention_bias " + (attentionBias ? "true" : "false") +
            " with mlp_bias " + (mlpBias ? "true" : "false") +
            ": Megatron's --add-bias-linear puts biases in every linear or "
            "none";
    return false;
  }
  c.disableBiasLinear = !attentionBias;
  if (std::string act = j.getString("hidden_act").value_or("silu").str();
      act != "silu") {
    error = path + ": hidden_act '" + act + "': the Llama family's MLP is "
                                            "SwiGLU (silu)";
    return false;
  }
  if (const llvm::json::Object *rope = j.getObject("rope_scaling")) {
    std::string kind = rope->getString("rope_type")
                           .value_or(rope->getString("type").value_or(""))
                           .str();
    if (kind != "llama3" ||
        rope->getNumber("low_freq_factor").value_or(0) != 1.0 ||
        rope->getNumber("high_freq_factor").value_or(0) != 4.0 ||
        rope->getInteger("original_max_position_embeddings").value_or(0) !=
            8192) {
      error = path + ": rope_scaling must be Llama 3.1's (rope_type llama3, "
                     "low_freq_factor 1, high_freq_factor 4, "
                     "original_max_position_embeddings 8192: Megatron's "
                     "apply_rope_scaling)";
      return false;
    }
    c.ropeScalingFactor = rope->getNumber("factor").value_or(8.0);
  }
  if (std::optional<int64_t> window = j.getInteger("sliding_window");
      window && *window < c.seq) {
    error = path + ": sliding_window " + std::to_string(*window) +
            " is shorter than the sequence (" + std::to_string(c.seq) +
            "); Tessera's attention is causal over the whole sequence";
    return false;
  }
  if (type == "mixtral") {
    if (!integer("num_local_experts", c.numExperts) ||
        !integer("num_experts_per_tok", c.moeTopk))
      return false;
    c.moeFfn = c.ffn;
  }
  c.initStd = j.getNumber("initializer_range").value_or(0.02);
  if (std::string why = validateGPTConfig(c); !why.empty()) {
    error = path + ": " + why;
    return false;
  }
  return true;
}

} // namespace

bool isHfCheckpoint(llvm::StringRef path) {
  return llvm::sys::fs::is_directory(path) &&
         llvm::sys::fs::exists(path + "/config.json");
}

OwningOpRef<ModuleOp> importHfCheckpoint(MLIRContext *context,
                                         llvm::StringRef dirRef,
                                         const HfImportOptions &options,
                                         std::string &error) {
  const std::string dir = dirRef.str();
  GPTConfig c;
  if (!readConfig(dir + "/config.json", options, c, error))
    return nullptr;
  Checkpoint ckpt(dir);
  if (!ckpt.open(error))
    return nullptr;
  // buildGPT creates func and nn ops (the registry holds their dialects).
  context->loadAllAvailableDialects();
  OwningOpRef<ModuleOp> module = buildGPT(context, c);
  auto func = *module->getOps<func::FuncOp>().begin();
  Builder b(context);

  // Megatron's parameters from Hugging Face's tensors, in argument order.
  const int64_t H = c.hidden, d = headDim(c), heads = c.heads,
                groups = c.numQueryGroups ? c.numQueryGroups : c.heads,
                perGroup = heads / groups, F = c.ffn, E = c.numExperts;
  std::string weightsDir = llvm::sys::path::parent_path(options.weightsPath).str();
  {
    llvm::SmallString<256> abs(weightsDir.empty() ? "." : weightsDir);
    llvm::sys::fs::make_absolute(abs);
    llvm::sys::fs::real_path(abs, abs);
    weightsDir = abs.str().str();
  }
  const std::string weightsFile =
      llvm::sys::path::filename(options.weightsPath).str();
  std::string tmp = options.weightsPath + ".tmp";
  std::error_code ec;
  llvm::raw_fd_ostream out(tmp, ec);
  if (ec) {
    error = tmp + ": " + ec.message();
    return nullptr;
  }
  SmallVector<NamedAttribute> weights;
  int64_t offset = 0;
  std::vector<float> t, u, v;
  auto fetch = [&](const std::string &name, llvm::ArrayRef<int64_t> shape,
                   std::vector<float> &into) {
    return ckpt.get(name, shape, into, error);
  };
  // GPT-2: Conv1D weights are [in, out] (a Linear's transposed); c_attn's
  // columns are [q (all heads) | k | v], Megatron's rows per head
  // [q_h | k_h | v_h]. A GPT2Model's save has no "transformer." prefix.
  const bool gpt2 = c.positionEmbeddingType == "learned_absolute";
  const std::string tr =
      gpt2 && !ckpt.has("transformer.wte.weight") && ckpt.has("wte.weight")
          ? ""
          : "transformer.";
  auto transposed = [&](const std::string &name, int64_t rows, int64_t cols,
                        std::vector<float> &into) {
    if (!fetch(name, {rows, cols}, t))
      return false;
    into.resize(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q = 0; q < cols; ++q)
        into[size_t(q * rows + r)] = t[size_t(r * cols + q)];
    return true;
  };
  // [3 H, cols] rows [q; k; v] to Megatron's per-head rows.
  auto perHead = [&](const std::vector<float> &qkv, int64_t cols,
                     std::vector<float> &into) {
    into.clear();
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t part = 0; part < 3; ++part) {
        const int64_t first = (part * heads + h) * d;
        into.insert(into.end(), qkv.begin() + first * cols,
                    qkv.begin() + (first + d) * cols);
      }
  };
  auto gpt2Parameter = [&](const std::string &p, std::vector<float> &value,
                           std::vector<int64_t> &shape, bool &ok) {
    if (p == "embedding.word_embeddings.weight") {
      shape = {c.vocab, H};
      ok = fetch(tr + "wte.weight", shape, value);
    } else if (p == "embedding.position_embeddings.weight") {
      shape = {c.maxPositions, H};
      ok = fetch(tr + "wpe.weight", shape, value);
    } else if (p == "output_layer.weight") {
      shape = {c.vocab, H};
      ok = fetch("lm_head.weight", shape, value);
    } else if (p == "decoder.final_layernorm.weight" ||
               p == "decoder.final_layernorm.bias") {
      shape = {H};
      ok = fetch(tr + "ln_f." + (p.back() == 't' ? "weight" : "bias"), shape,
                 value);
    } else {
      llvm::StringRef s(p);
      if (!s.consume_front("decoder.layers.")) {
        error = dir + ": Tessera's parameter '" + p +
                "' has no Hugging Face counterpart";
        return false;
      }
      const size_t dot = s.find('.');
      const std::string h = tr + "h." + s.substr(0, dot).str() + ".";
      const std::string what = s.substr(dot + 1).str();
      const std::string kind =
          llvm::StringRef(what).ends_with(".weight") ? "weight" : "bias";
      if (what == "input_layernorm." + kind ||
          what == "pre_mlp_layernorm." + kind) {
        shape = {H};
        ok = fetch(h + (what[0] == 'i' ? "ln_1." : "ln_2.") + kind, shape,
                   value);
      } else if (what == "self_attention.linear_qkv.weight") {
        ok = transposed(h + "attn.c_attn.weight", H, 3 * H, u);
        if (ok)
          perHead(u, H, value);
        shape = {3 * H, H};
      } else if (what == "self_attention.linear_qkv.bias") {
        ok = fetch(h + "attn.c_attn.bias", {3 * H}, u);
        if (ok)
          perHead(u, 1, value);
        shape = {3 * H};
      } else {
        // The other linears: Conv1D [in, out] weights and [out] biases.
        struct Linear {
          const char *megatron, *hf;
          int64_t in, out;
        };
        const Linear linears[] = {
            {"self_attention.linear_proj.", "attn.c_proj.", H, H},
            {"mlp.linear_fc1.", "mlp.c_fc.", H, F},
            {"mlp.linear_fc2.", "mlp.c_proj.", F, H}};
        const Linear *l = llvm::find_if(linears, [&](const Linear &x) {
          return what == x.megatron + kind;
        });
        if (l == std::end(linears)) {
          error = dir + ": Tessera's parameter '" + p +
                  "' has no Hugging Face counterpart";
          return false;
        }
        const std::string name = h + l->hf + kind;
        if (kind == "weight") {
          shape = {l->out, l->in};
          ok = transposed(name, l->in, l->out, value);
        } else {
          shape = {l->out};
          ok = fetch(name, shape, value);
        }
      }
    }
    return true;
  };
  for (unsigned i = 0; i < func.getNumArguments(); ++i) {
    auto name = func.getArgAttrOfType<StringAttr>(i, kParamAttr);
    if (!name)
      continue;
    std::string p = name.str();
    std::vector<float> value;
    std::vector<int64_t> shape;
    llvm::StringRef rest(p);
    auto layerPrefix = [&](std::string &hf) {
      // "decoder.layers.N.<x>" -> "model.layers.N."
      llvm::StringRef s(p);
      s.consume_front("decoder.layers.");
      size_t dot = s.find('.');
      hf = "model.layers." + s.substr(0, dot).str() + ".";
      return s.substr(dot + 1).str();
    };
    bool ok = true;
    if (gpt2) {
      if (!gpt2Parameter(p, value, shape, ok))
        return nullptr;
    } else if (p == "embedding.word_embeddings.weight") {
      shape = {c.vocab, H};
      ok = fetch("model.embed_tokens.weight", shape, value);
    } else if (p == "output_layer.weight") {
      shape = {c.vocab, H};
      ok = fetch("lm_head.weight", shape, value);
    } else if (p == "decoder.final_layernorm.weight") {
      shape = {H};
      ok = fetch("model.norm.weight", shape, value);
    } else if (rest.starts_with("decoder.layers.")) {
      std::string hf;
      std::string what = layerPrefix(hf);
      if (what == "input_layernorm.weight" ||
          what == "pre_mlp_layernorm.weight") {
        shape = {H};
        ok = fetch(hf + (what == "input_layernorm.weight"
                             ? "input_layernorm.weight"
                             : "post_attention_layernorm.weight"),
                   shape, value);
      } else if (what == "self_attention.q_layernorm.weight" ||
                 what == "self_attention.k_layernorm.weight") {
        shape = {d};
        ok = fetch(hf + (what[15] == 'q' ? "self_attn.q_norm.weight"
                                         : "self_attn.k_norm.weight"),
                   shape, value);
      } else if (what == "self_attention.linear_qkv.weight" ||
                 what == "self_attention.linear_qkv.bias") {
        const bool bias = what.back() == 's';
        const std::string sfx = bias ? "bias" : "weight";
        const int64_t cols = bias ? 1 : H;
        auto dims = [&](int64_t rows) {
          return bias ? std::vector<int64_t>{rows}
                      : std::vector<int64_t>{rows, H};
        };
        ok = fetch(hf + "self_attn.q_proj." + sfx, dims(heads * d), t) &&
             fetch(hf + "self_attn.k_proj." + sfx, dims(groups * d), u) &&
             fetch(hf + "self_attn.v_proj." + sfx, dims(groups * d), v);
        // Megatron's per-group rows [q (heads/G x d) | k (d) | v (d)].
        for (int64_t g = 0; ok && g < groups; ++g) {
          auto rows = [&](const std::vector<float> &src, int64_t first,
                          int64_t count) {
            value.insert(value.end(), src.begin() + first * cols,
                         src.begin() + (first + count) * cols);
          };
          rows(t, g * perGroup * d, perGroup * d);
          rows(u, g * d, d);
          rows(v, g * d, d);
        }
        shape = dims(groups * (perGroup + 2) * d);
      } else if (what == "self_attention.linear_proj.weight") {
        shape = {H, heads * d};
        ok = fetch(hf + "self_attn.o_proj.weight", shape, value);
      } else if (what == "self_attention.linear_proj.bias") {
        shape = {H};
        ok = fetch(hf + "self_attn.o_proj.bias", shape, value);
      } else if (what == "mlp.linear_fc1.weight") {
        ok = fetch(hf + "mlp.gate_proj.weight", {F, H}, value) &&
             fetch(hf + "mlp.up_proj.weight", {F, H}, t);
        value.insert(value.end(), t.begin(), t.end());
        shape = {2, F, H};
      } else if (what == "mlp.linear_fc1.bias") {
        ok = fetch(hf + "mlp.gate_proj.bias", {F}, value) &&
             fetch(hf + "mlp.up_proj.bias", {F}, t);
        value.insert(value.end(), t.begin(), t.end());
        shape = {2, F};
      } else if (what == "mlp.linear_fc2.weight") {
        shape = {H, F};
        ok = fetch(hf + "mlp.down_proj.weight", shape, value);
      } else if (what == "mlp.linear_fc2.bias") {
        shape = {H};
        ok = fetch(hf + "mlp.down_proj.bias", shape, value);
      } else if (what == "mlp.router.weight") {
        shape = {E, H};
        ok = fetch(hf + "block_sparse_moe.gate.weight", shape, value);
      } else if (what == "mlp.experts.linear_fc1.weight") {
        for (int64_t e = 0; ok && e < E; ++e) {
          const std::string x =
              hf + "block_sparse_moe.experts." + std::to_string(e) + ".";
          ok = fetch(x + "w1.weight", {F, H}, t) &&
               fetch(x + "w3.weight", {F, H}, u);
          value.insert(value.end(), t.begin(), t.end());
          value.insert(value.end(), u.begin(), u.end());
        }
        shape = {E, 2, F, H};
      } else if (what == "mlp.experts.linear_fc2.weight") {
        for (int64_t e = 0; ok && e < E; ++e) {
          ok = fetch(hf + "block_sparse_moe.experts." + std::to_string(e) +
                         ".w2.weight",
                     {H, F}, t);
          value.insert(value.end(), t.begin(), t.end());
        }
        shape = {E, H, F};
      } else {
        error = dir + ": Tessera's parameter '" + p +
                "' has no Hugging Face counterpart";
        return nullptr;
      }
    } else {
      error = dir + ": Tessera's parameter '" + p +
              "' has no Hugging Face counterpart";
      return nullptr;
    }
    if (!ok)
      return nullptr;
    out.write(reinterpret_cast<const char *>(value.data()),
              value.size() * sizeof(float));
    weights.push_back(b.getNamedAttr(
        p, b.getDictionaryAttr(
               {b.getNamedAttr("dir", b.getStringAttr(weightsDir)),
                b.getNamedAttr("file", b.getStringAttr(weightsFile)),
                b.getNamedAttr("offset", b.getI64IntegerAttr(offset)),
                b.getNamedAttr("shape", b.getDenseI64ArrayAttr(shape))})));
    offset += int64_t(value.size()) * 4;
    func.setArgAttr(i, kInitAttr, b.getStringAttr("data"));
  }
  // A tied model has no lm_head (transformers may still save one).
  std::vector<std::string> left = ckpt.unused();
  llvm::erase_if(left, [&](const std::string &n) {
    llvm::StringRef s(n);
    // GPT-2's causal-mask buffers, which older saves include.
    return (c.tieEmbeddings && n == "lm_head.weight") ||
           (gpt2 && (s.ends_with(".attn.bias") ||
                     s.ends_with(".attn.masked_bias")));
  });
  if (!left.empty()) {
    error = dir + ": tensor '" + left.front() +
            "' has no place in the model config.json describes (it would "
            "be lost)";
    return nullptr;
  }
  out.close();
  if (out.has_error()) {
    error = tmp + ": " + out.error().message();
    out.clear_error();
    return nullptr;
  }
  if (std::error_code rc = llvm::sys::fs::rename(tmp, options.weightsPath)) {
    error = options.weightsPath + ": " + rc.message();
    return nullptr;
  }
  (*module)->setAttr(kWeightsAttr, b.getDictionaryAttr(weights));
  return module;
}

} // namespace tessera
