//===- OnnxExport.cpp - Trained weights out as the imported ONNX model ----===//
//
// See tessera/rt/Export.h. The inverse of the ONNX import's parameter
// views (lib/Conversion/OnnxToNN): each checkpoint parameter, gathered
// whole and cut to the imported vocabulary, is mapped back row by row into
// the initializers it was computed from.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Export.h"

#include "ExportTensors.h"

#include "tessera/rt/ArtifactFormat.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/FileIO.h"

#include <nlohmann/json.hpp>

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

namespace tessera::rt {
namespace {

using json = nlohmann::json;
using namespace exporting;

/// One initializer a parameter view read.
struct ViewSource {
  std::string initializer;
  std::vector<int64_t> shape;
  std::vector<std::string> readers;
};

/// One parameter view of the import record.
struct View {
  std::string param, kind;
  std::vector<int64_t> shape;
  bool transposed = false;
  int64_t heads = 0, groups = 0, headDim = 0;
  std::vector<ViewSource> sources;
};

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// The record's views, checked enough that inverting them cannot index out
/// of range.
StatusOr<std::vector<View>> parseViews(const json &record, const std::string &where) {
  auto bad = [&](const std::string &why) {
    return invalidArgument(where, ": \"onnx_source\": ", why);
  };
  if (!record.contains("parameters") || !record.at("parameters").is_array())
    return bad("no \"parameters\" array");
  std::vector<View> views;
  try {
    for (const json &e : record.at("parameters")) {
      View v;
      v.param = e.at("param").get<std::string>();
      v.kind = e.at("kind").get<std::string>();
      v.shape = e.at("shape").get<std::vector<int64_t>>();
      v.transposed = e.value("transposed", false);
      v.heads = e.value("num_heads", int64_t(0));
      v.groups = e.value("num_query_groups", int64_t(0));
      v.headDim = e.value("head_dim", int64_t(0));
      for (const json &s : e.at("sources")) {
        ViewSource src;
        src.initializer = s.at("initializer").get<std::string>();
        src.shape = s.at("shape").get<std::vector<int64_t>>();
        src.readers = s.at("readers").get<std::vector<std::string>>();
        v.sources.push_back(std::move(src));
      }
      views.push_back(std::move(v));
    }
  } catch (const json::exception &e) {
    return bad(std::string("a parameter entry is malformed: ") + e.what());
  }
  for (const View &v : views) {
    static const std::map<std::string, size_t> arity = {
        {"identity", 1}, {"transpose", 1}, {"blocks", 1}, {"stack", 2}, {"qkv", 3}};
    auto it = arity.find(v.kind);
    if (it == arity.end())
      return bad("parameter '" + v.param + "' has the unknown view '" + v.kind + "'");
    if (v.sources.size() != it->second)
      return bad("parameter '" + v.param + "' (" + v.kind + ") reads " +
                 std::to_string(v.sources.size()) + " initializers");
    if (v.shape.empty() || v.shape.size() > 3)
      return bad("parameter '" + v.param + "' has the shape " + shapeText(v.shape));
    int64_t sum = 0;
    for (const ViewSource &s : v.sources) {
      if (s.shape.empty() || s.shape.size() > 2)
        return bad("initializer '" + s.initializer + "' has the shape " +
                   shapeText(s.shape));
      sum += numel(s.shape);
    }
    if (sum != numel(v.shape))
      return bad("parameter '" + v.param + "' " + shapeText(v.shape) +
                 " is not the size of its initializers");
    if (v.kind == "qkv" && (v.groups <= 0 || v.heads % v.groups || v.headDim <= 0))
      return bad("parameter '" + v.param + "': bad num_heads / num_query_groups / head_dim");
    if (v.kind == "blocks" && (v.heads <= 0 || v.headDim <= 0))
      return bad("parameter '" + v.param + "': bad num_heads / head_dim");
  }
  return views;
}

/// The parameter row that row `r` of source `i` became (the import's
/// computeParam, lib/Conversion/OnnxToNN/OnnxToNN.cpp).
int64_t paramRow(const View &v, size_t i, int64_t r) {
  if (v.kind == "stack")
    return int64_t(i) * v.shape[1] + r;
  if (v.kind == "qkv") {
    const int64_t per = v.heads / v.groups, dim = v.headDim,
                  rowsPerGroup = (per + 2) * dim;
    if (i == 0)
      return (r / (per * dim)) * rowsPerGroup + r % (per * dim);
    return (r / dim) * rowsPerGroup + (per + int64_t(i) - 1) * dim + r % dim;
  }
  if (v.kind == "blocks") {
    const int64_t dim = v.headDim, hidden = v.heads * dim;
    const int64_t t = r / hidden, h = r % hidden;
    return (h / dim) * 3 * dim + t * dim + h % dim;
  }
  return r; // identity
}

/// The rows and columns source `i` of the view is stored in (a rank-1
/// source is one column).
std::pair<int64_t, int64_t> sourceRowsCols(const View &v, size_t i) {
  const std::vector<int64_t> &s = v.sources[i].shape;
  if (s.size() == 1)
    return {s[0], 1};
  const bool transposed = v.transposed && v.kind != "identity";
  return transposed ? std::pair(s[1], s[0]) : std::pair(s[0], s[1]);
}

/// Whether inverting the view stays inside the parameter: every source row
/// maps to a parameter row, with the parameter's row length.
std::string checkRows(const View &v) {
  if (v.kind == "identity")
    return v.sources[0].shape == v.shape
               ? ""
               : "its initializer is " + shapeText(v.sources[0].shape);
  if (v.kind == "transpose") {
    const std::vector<int64_t> &s = v.sources[0].shape;
    return s.size() == 2 && v.shape == std::vector<int64_t>{s[1], s[0]}
               ? ""
               : "its initializer " + shapeText(s) + " is not its transpose";
  }
  if (v.kind == "stack" && (v.shape.size() != 3 || v.shape[0] != 2))
    return "a stack is [2, rows, columns]";
  if (v.kind != "stack" && v.shape.size() > 2)
    return "a " + v.kind + " view is a matrix or a vector";
  const int64_t rows = v.kind == "stack" ? 2 * v.shape[1] : v.shape[0];
  const int64_t cols = numel(v.shape) / rows;
  for (size_t i = 0; i < v.sources.size(); ++i) {
    auto [r, c] = sourceRowsCols(v, i);
    if (c != cols)
      return "initializer '" + v.sources[i].initializer + "' has rows of " +
             std::to_string(c) + ", the parameter of " + std::to_string(cols);
    for (int64_t k = 0; k < r; ++k) {
      int64_t to = paramRow(v, i, k);
      if (to < 0 || to >= rows)
        return "row " + std::to_string(k) + " of initializer '" +
               v.sources[i].initializer + "' maps outside the parameter";
    }
  }
  return "";
}

/// Source `i` of the view from the trained parameter `p` (f32, the view's
/// shape): its rows placed back, stored [rows, cols] or transposed.
std::vector<float> invert(const View &v, size_t i, const Tensor &p) {
  const ViewSource &s = v.sources[i];
  std::vector<float> out(size_t(numel(s.shape)));
  const float *w = reinterpret_cast<const float *>(p.data.data());
  if (v.kind == "transpose") {
    // The parameter is [out, in], the source [in, out].
    const int64_t in = s.shape[0], o = s.shape[1];
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < o; ++c)
        out[size_t(r * o + c)] = w[c * in + r];
    return out;
  }
  // (An identity view ignores `transposed`, as the import does.)
  const bool transposed = v.transposed && v.kind != "identity" && s.shape.size() == 2;
  const auto [rows, cols] = sourceRowsCols(v, i);
  for (int64_t r = 0; r < rows; ++r) {
    const float *from = w + paramRow(v, i, r) * cols;
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(transposed ? c * rows + r : r * cols + c)] = from[c];
  }
  return out;
}

} // namespace

StatusOr<OnnxExportSummary> exportOnnx(const ExportOptions &options,
                                       const OnnxRewriter &rewrite) {
  if (!rewrite)
    return failedPrecondition("--format onnx: this tessera-export was built without "
                              "the ONNX library");
  if (options.dtype != "auto" && options.dtype != "fp32")
    return invalidArgument("--format onnx writes the model's own f32 initializers; "
                           "--dtype ", options.dtype, " is for safetensors");
  if (options.output.empty())
    return invalidArgument("give the output directory (-o OUT)");
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation location, locateCheckpoint(options.checkpoint));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest manifest, readManifest(location));
  const std::string where = location.dir + "/manifest.json";
  if (manifest.onnxSource.empty())
    return invalidArgument(
        where, ": the checkpoint's model was not imported from ONNX (its artifact "
               "records no ONNX source); --format onnx writes an imported model's "
               "graph back with its trained initializers, --format safetensors a "
               "tessera-gen or --hf-checkpoint model");
  json record = json::parse(manifest.onnxSource, nullptr, false);
  if (!record.is_object())
    return invalidArgument(where, ": \"onnx_source\" is not a JSON object");
  TESSERA_ASSIGN_OR_RETURN(std::vector<View> views, parseViews(record, where));
  for (const View &v : views)
    if (std::string why = checkRows(v); !why.empty())
      return invalidArgument(where, ": \"onnx_source\": parameter '", v.param, "' (",
                             v.kind, " ", shapeText(v.shape), "): ", why);
  OnnxExportSummary summary;
  if (options.onnxModel.empty() && record.contains("model")) {
    if (!record["model"].is_string())
      return invalidArgument(where, ": \"onnx_source\": \"model\" is not a string");
    summary.source = record["model"].get<std::string>();
  } else {
    summary.source = options.onnxModel;
  }
  if (summary.source.empty())
    return invalidArgument(where, ": the ONNX record names no model file; give it "
                                  "with --onnx-model");
  if (!pathExists(summary.source))
    return invalidArgument(summary.source,
                           ": no such file (the ONNX model the artifact was compiled "
                           "from; give its new place with --onnx-model)");
  if (record.contains("vocab")) {
    try {
      const json &vocab = record.at("vocab");
      summary.vocab = vocab.value("size", int64_t(0));
      summary.paddedVocab = vocab.value("padded", int64_t(0));
      summary.maskedVocab = vocab.value("masked", false);
    } catch (const json::exception &e) {
      return invalidArgument(where, ": \"onnx_source\": \"vocab\" is malformed: ",
                             e.what());
    }
  }
  TESSERA_ASSIGN_OR_RETURN(auto params, gatherParameters(location, manifest));

  // Every view's initializers, from its trained parameter.
  struct Value {
    const View *view;
    size_t source;
    std::vector<float> data;
  };
  std::map<std::string, std::vector<Value>> byInitializer;
  std::map<std::string, bool> counted;
  for (const View &v : views) {
    auto it = params.find(v.param);
    if (it == params.end())
      return invalidArgument(where, ": no parameter '", v.param,
                             "', which the ONNX record maps initializers from");
    Tensor p = convert(it->second, fb::DType::F32);
    // The vocabulary's padding rows (dimension 0) are cut off.
    bool fits = p.shape.size() == v.shape.size() && !p.shape.empty() &&
                std::equal(p.shape.begin() + 1, p.shape.end(), v.shape.begin() + 1);
    if (!fits || p.shape[0] < v.shape[0] ||
        (p.shape[0] > v.shape[0] && p.shape[0] != summary.paddedVocab))
      return invalidArgument(where, ": parameter '", v.param, "' is ", shapeText(p.shape),
                             " in the checkpoint, but its ONNX initializers make ",
                             shapeText(v.shape));
    if (p.shape[0] > v.shape[0])
      p = slice0(p, 0, v.shape[0]);
    if (!counted[v.param]) {
      counted[v.param] = true;
      summary.parameters += numel(v.shape);
    }
    for (size_t i = 0; i < v.sources.size(); ++i)
      byInitializer[v.sources[i].initializer].push_back({&v, i, invert(v, i, p)});
  }

  // One value per initializer; where parameters that differ read one
  // (merged by the exporter), one initializer each, read by its nodes.
  std::vector<OnnxInitializer> values;
  for (auto &entry : byInitializer) {
    // (Named, not a structured binding: C++17 lambdas cannot capture one,
    // which clang refuses.)
    const auto &init = entry.first;
    auto &list = entry.second;
    // Groups of equal values (a tied parameter read twice is one).
    std::vector<std::vector<Value *>> groups;
    for (Value &value : list) {
      auto same = [&](const std::vector<Value *> &g) { return g.front()->data == value.data; };
      auto g = std::find_if(groups.begin(), groups.end(), same);
      if (g == groups.end())
        groups.push_back({&value});
      else
        g->push_back(&value);
    }
    // The group of the parameter named as the initializer keeps it.
    std::stable_partition(groups.begin(), groups.end(), [&](const auto &g) {
      return std::any_of(g.begin(), g.end(),
                         [&](const Value *x) { return x->view->param == init; });
    });
    for (size_t k = 0; k < groups.size(); ++k) {
      const Value &first = *groups[k].front();
      OnnxInitializer out;
      out.initializer = init;
      out.name = init;
      out.shape = first.view->sources[first.source].shape;
      out.data = first.data;
      if (k > 0) {
        // A new initializer, named by its parameter (and source, for a view
        // that reads this initializer twice).
        out.name = first.view->param;
        if (std::count_if(first.view->sources.begin(), first.view->sources.end(),
                          [&](const ViewSource &s) { return s.initializer == init; }) > 1)
          out.name += "." + std::to_string(first.source);
        for (const Value *x : groups[k]) {
          const std::vector<std::string> &readers = x->view->sources[x->source].readers;
          if (readers.empty())
            return invalidArgument(
                where, ": initializer '", init, "' is read by parameters '",
                groups[0].front()->view->param, "' and '", x->view->param,
                "', which trained to different values, and the import recorded no "
                "node that reads it for the second: it cannot be split");
          for (const std::string &r : readers)
            if (std::find(out.readers.begin(), out.readers.end(), r) == out.readers.end())
              out.readers.push_back(r);
        }
        ++summary.split;
      }
      values.push_back(std::move(out));
    }
  }
  summary.initializers = int64_t(values.size());

  // External data goes to a file named by its contents: a new export never
  // overwrites the data an earlier model.onnx still names (that model is
  // replaced last, whole).
  uint32_t crc = uint32_t(manifest.iteration);
  for (const OnnxInitializer &v : values)
    crc ^= artifact::crc32(reinterpret_cast<const uint8_t *>(v.data.data()),
                           v.data.size() * 4) +
           0x9e3779b9u + (crc << 6) + (crc >> 2);
  char name[64];
  std::snprintf(name, sizeof(name), "model.onnx.%08x.data", crc);
  std::string model, data;
  const std::string dataFile = name;
  std::string error = rewrite(summary.source, values, dataFile, options.externalData, model, data);
  if (!error.empty())
    return invalidArgument(error);
  summary.external = !data.empty();
  TESSERA_RETURN_IF_ERROR(makeDirectories(options.output));
  // The data first: the model that names it appears only once it is whole.
  if (summary.external)
    TESSERA_RETURN_IF_ERROR(writeFileAtomic(options.output + "/" + dataFile, data));
  TESSERA_RETURN_IF_ERROR(writeFileAtomic(options.output + "/model.onnx", model));
  summary.dataFile = summary.external ? dataFile : "";
  // Earlier exports' data files, which the new model.onnx does not name.
  if (DIR *dir = opendir(options.output.c_str())) {
    while (dirent *e = readdir(dir)) {
      std::string file = e->d_name;
      if (file.rfind("model.onnx.", 0) == 0 && file.size() > 16 &&
          file.compare(file.size() - 5, 5, ".data") == 0 && file != summary.dataFile)
        std::remove((options.output + "/" + file).c_str());
    }
    closedir(dir);
  }
  summary.iteration = manifest.iteration;
  summary.layout = manifest.configString();
  return summary;
}

} // namespace tessera::rt
