//===- OnnxModel.cpp - Read an ONNX model with the onnx library -----------===//
//
// The one translation unit that uses protobuf and the onnx library (both
// throw); compiled with exceptions, it catches everything at loadModel's
// boundary. It copies what the importer needs into plain structs: the
// protobuf message is gone when loadModel returns.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxModel.h"

#include "onnx/checker.h"
#include "onnx/onnx_pb.h"

#include <google/protobuf/unknown_field_set.h>
#include "onnx/shape_inference/implementation.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

namespace tessera::onnx_model {

const char *elemTypeName(int32_t type) {
  switch (type) {
  case 1: return "float";
  case 2: return "uint8";
  case 3: return "int8";
  case 4: return "uint16";
  case 5: return "int16";
  case 6: return "int32";
  case 7: return "int64";
  case 8: return "string";
  case 9: return "bool";
  case 10: return "float16";
  case 11: return "double";
  case 16: return "bfloat16";
  default: return "undefined";
  }
}

int64_t Tensor::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::vector<double> Tensor::toDoubles() const {
  std::vector<double> out;
  if (!hasData || isExternal())
    return out;
  int64_t n = numElements();
  auto read = [&](auto tag) {
    using T = decltype(tag);
    if (int64_t(data.size()) != n * int64_t(sizeof(T)))
      return;
    out.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, data.data() + i * sizeof(T), sizeof(T));
      out[size_t(i)] = double(v);
    }
  };
  switch (elemType) {
  case kFloat: read(float()); break;
  case kDouble: read(double()); break;
  case kInt32: read(int32_t()); break;
  case kInt64: read(int64_t()); break;
  case kBool: read(uint8_t()); break;
  default: break;
  }
  return out;
}

const Attribute *Node::attr(const std::string &attrName) const {
  for (const Attribute &a : attributes)
    if (a.name == attrName)
      return &a;
  return nullptr;
}

namespace {

struct LoadError {
  std::string message;
};

template <typename T, typename Field>
void appendTyped(std::string &data, const Field &field) {
  data.reserve(data.size() + size_t(field.size()) * sizeof(T));
  for (auto v : field) {
    T x = T(v);
    data.append(reinterpret_cast<const char *>(&x), sizeof(T));
  }
}

/// At most 2^48 elements, no negative dimension: the sizes the importer
/// computes (elements x 4 bytes) cannot overflow.
void checkDims(const onnx::TensorProto &t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d != 0 && n > (int64_t(1) << 48) / d))
      throw LoadError{"tensor '" + t.name() + "' has an invalid shape"};
    n *= d;
  }
}

/// A non-negative integer of an external-data entry (offset, length).
int64_t parseExternalNumber(const onnx::TensorProto &t, const std::string &key,
                            const std::string &value) {
  int64_t n = 0;
  bool ok = !value.empty() && value.size() <= 19;
  for (char c : value)
    ok = ok && c >= '0' && c <= '9';
  if (ok) {
    errno = 0;
    long long parsed = std::strtoll(value.c_str(), nullptr, 10);
    ok = errno == 0 && parsed >= 0;
    n = int64_t(parsed);
  }
  if (!ok)
    throw LoadError{"tensor '" + t.name() + "': external data " + key + " '" +
                    value + "' is not an integer in [0, 2^63)"};
  return n;
}

/// The external data of `t`, checked before anything opens a file: its
/// location is relative to the model's directory `realBase` (symlinks
/// resolved), names no parent directory, and its file (symlinks resolved)
/// is a regular file inside that directory holding the tensor's bytes. An
/// ONNX model is input: its `location` must not read files elsewhere (the
/// onnx checker only checks that a file exists, and stats `dir//abs` for an
/// absolute one).
void resolveExternalData(const onnx::TensorProto &t,
                         const std::filesystem::path &realBase, Tensor &out) {
  namespace fs = std::filesystem;
  std::string location;
  for (const onnx::StringStringEntryProto &e : t.external_data()) {
    if (e.key() == "location")
      location = e.value();
    else if (e.key() == "offset")
      out.externalOffset = parseExternalNumber(t, "offset", e.value());
    else if (e.key() == "length")
      out.externalLength = parseExternalNumber(t, "length", e.value());
  }
  auto reject = [&](const std::string &why) -> LoadError {
    return LoadError{"tensor '" + t.name() + "': external data location '" +
                     location + "' " + why};
  };
  if (location.empty())
    throw LoadError{"tensor '" + t.name() +
                    "' has external data without a location"};
  fs::path rel(location);
  if (rel.is_absolute() || location[0] == '/' || location[0] == '\\')
    throw reject("is absolute; ONNX locations are relative to the model's "
                 "directory");
  for (const fs::path &part : rel)
    if (part == "..")
      throw reject("leaves the model's directory ('..')");
  std::error_code ec;
  fs::path real = fs::canonical(realBase / rel, ec);
  if (ec)
    throw reject("cannot be opened: " + ec.message());
  // Inside the model's directory after symlinks too.
  auto [b, r] = std::mismatch(realBase.begin(), realBase.end(), real.begin(),
                              real.end());
  if (b != realBase.end())
    throw reject("resolves (through a symbolic link) to '" + real.string() +
                 "', outside the model's directory '" + realBase.string() +
                 "'");
  if (!fs::is_regular_file(real, ec))
    throw reject("is not a regular file");
  uintmax_t size = fs::file_size(real, ec);
  if (ec)
    throw reject("cannot be read: " + ec.message());
  out.externalDir = realBase.string();
  out.externalFile = real.lexically_relative(realBase).string();
  out.externalFileBytes = int64_t(size);
  if (out.externalOffset > out.externalFileBytes)
    throw reject("is " + std::to_string(size) + " bytes, less than the offset " +
                 std::to_string(out.externalOffset));
}

/// `t` with `bytes` as its inline data.
void setInlineData(onnx::TensorProto &t, std::string bytes) {
  t.clear_float_data();
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
  t.set_raw_data(std::move(bytes));
}

/// Bytes of one element of an ONNX data type, or 0 for one without a
/// fixed size (string).
int64_t elementBytes(int32_t type) {
  switch (type) {
  case onnx::TensorProto::FLOAT: case onnx::TensorProto::INT32:
  case onnx::TensorProto::UINT32: return 4;
  case onnx::TensorProto::DOUBLE: case onnx::TensorProto::INT64:
  case onnx::TensorProto::UINT64: return 8;
  case onnx::TensorProto::FLOAT16: case onnx::TensorProto::BFLOAT16:
  case onnx::TensorProto::INT16: case onnx::TensorProto::UINT16: return 2;
  case onnx::TensorProto::BOOL: case onnx::TensorProto::INT8:
  case onnx::TensorProto::UINT8: return 1;
  default: return 0;
  }
}

/// The bytes of an external-data tensor of `elemType` and `shape` (the
/// location resolved by resolveExternalData) read into `out.data`: exactly
/// the bytes its shape needs, which the entry's length (when given) and
/// the file must hold. `out` is then an inline tensor.
void readExternalData(const std::string &name, int32_t elemType,
                      const std::vector<int64_t> &shape, Tensor &out) {
  int64_t length = elementBytes(elemType);
  if (length == 0)
    throw LoadError{"tensor '" + name + "': external data of " + elemTypeName(elemType) +
                    " elements, which Tessera does not read"};
  for (int64_t d : shape)
    length *= d; // (checkDims bounds the product)
  if (out.externalLength >= 0 && out.externalLength != length)
    throw LoadError{"tensor '" + name + "': its external data is " +
                    std::to_string(out.externalLength) + " bytes, its shape needs " +
                    std::to_string(length)};
  if (out.externalOffset + length > out.externalFileBytes)
    throw LoadError{"tensor '" + name + "': its external data runs past the end of " +
                    out.externalPath()};
  std::string bytes(size_t(length), '\0');
  std::ifstream in(out.externalPath(), std::ios::binary);
  in.seekg(out.externalOffset);
  if (!in || !in.read(bytes.data(), std::streamsize(length)))
    throw LoadError{"tensor '" + name + "': cannot read " + out.externalPath()};
  out.data = std::move(bytes);
  out.externalDir.clear();
  out.externalFile.clear();
  out.externalOffset = 0;
  out.externalLength = -1;
  out.externalFileBytes = 0;
}

/// `t` as a Tensor; with `take`, its raw bytes are moved out of the
/// protobuf (weights: one copy of the model in memory, not two).
Tensor convertTensor(const onnx::TensorProto &t, bool loadData,
                     const std::filesystem::path &baseDir,
                     std::string *take = nullptr) {
  checkDims(t);
  Tensor out;
  out.name = t.name();
  out.elemType = t.data_type();
  out.shape.assign(t.dims().begin(), t.dims().end());
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    resolveExternalData(t, baseDir, out);
    out.hasData = true;
    return out;
  }
  if (!loadData)
    return out;
  out.hasData = true;
  if (t.has_raw_data()) {
    if (take)
      out.data = std::move(*take);
    else
      out.data = t.raw_data();
    return out;
  }
  switch (t.data_type()) {
  case onnx::TensorProto::FLOAT: appendTyped<float>(out.data, t.float_data()); break;
  case onnx::TensorProto::DOUBLE: appendTyped<double>(out.data, t.double_data()); break;
  case onnx::TensorProto::INT64: appendTyped<int64_t>(out.data, t.int64_data()); break;
  case onnx::TensorProto::INT32: appendTyped<int32_t>(out.data, t.int32_data()); break;
  case onnx::TensorProto::BOOL:
  case onnx::TensorProto::UINT8:
  case onnx::TensorProto::INT8: appendTyped<uint8_t>(out.data, t.int32_data()); break;
  default: out.hasData = false; break;
  }
  return out;
}

ValueInfo convertValueInfo(const onnx::ValueInfoProto &v) {
  ValueInfo out;
  out.name = v.name();
  if (!v.type().has_tensor_type())
    return out;
  const onnx::TypeProto_Tensor &t = v.type().tensor_type();
  out.elemType = t.elem_type();
  if (t.has_shape()) {
    out.hasShape = true;
    for (const onnx::TensorShapeProto_Dimension &d : t.shape().dim())
      out.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
  }
  return out;
}

/// The ModelProto at `path`.
void parseModel(const std::string &path, onnx::ModelProto &proto) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw LoadError{"cannot open the file"};
  if (!proto.ParseFromIstream(&in))
    throw LoadError{"not an ONNX model (the protobuf does not parse)"};
  if (!proto.has_graph())
    throw LoadError{"the model has no graph"};
}

void load(const std::string &path, bool loadWeights, Model &model) {
  onnx::ModelProto proto;
  parseModel(path, proto);
  // The model's directory, symlinks resolved: external data must stay
  // inside it. Checked before the onnx checker opens any location.
  std::error_code dirError;
  std::filesystem::path baseDir = std::filesystem::canonical(
      std::filesystem::absolute(std::filesystem::path(path)).parent_path(),
      dirError);
  if (dirError)
    throw LoadError{"cannot resolve the model's directory: " +
                    dirError.message()};
  for (const onnx::TensorProto &t : proto.graph().initializer())
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      Tensor scratch;
      resolveExternalData(t, baseDir, scratch);
    }
  // A Constant's value is read in now, wherever it is stored (the
  // TorchScript exporter puts large ones in external data too, which ONNX
  // shape inference cannot read).
  for (onnx::NodeProto &n : *proto.mutable_graph()->mutable_node())
    for (onnx::AttributeProto &a : *n.mutable_attribute())
      if (a.has_t() && a.t().data_location() == onnx::TensorProto::EXTERNAL) {
        checkDims(a.t());
        Tensor where;
        resolveExternalData(a.t(), baseDir, where);
        readExternalData(a.t().name().empty() ? n.name() + "." + a.name() : a.t().name(),
                         a.t().data_type(),
                         std::vector<int64_t>(a.t().dims().begin(), a.t().dims().end()),
                         where);
        setInlineData(*a.mutable_t(), std::move(where.data));
      }
  // The standard-domain opset against the newest this onnx library knows:
  // its checker and shape inference would judge a newer model by older
  // operator schemas (ReduceMean's axes moved to an input in opset 18,
  // RMSNormalization is opset 23). Such a model skips both; its exporter
  // stored the value types (the dynamo exporter stores all of them), and
  // the onnx dialect's own type rules fill the rest.
  int64_t opset = 0;
  for (const onnx::OperatorSetIdProto &o : proto.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx")
      opset = o.version();
  const auto &ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto known = ranges.find("");
  model.libraryOpset = known == ranges.end() ? 0 : known->second.second;
  model.checked = opset <= model.libraryOpset &&
                  proto.ir_version() <= int64_t(onnx::IR_VERSION);
  // The onnx checker: node input counts, attributes, topological order (no
  // cycles), external-data locations inside the model's directory.
  if (model.checked) try {
    onnx::checker::CheckerContext ctx;
    ctx.set_ir_version(int(proto.ir_version()));
    std::unordered_map<std::string, int> opsets;
    for (const onnx::OperatorSetIdProto &o : proto.opset_import())
      opsets[o.domain()] = int(o.version());
    ctx.set_opset_imports(opsets);
    ctx.set_model_dir(baseDir.string());
    onnx::checker::LexicalScopeContext lex;
    onnx::checker::check_graph(proto.graph(), ctx, lex);
  } catch (const std::exception &e) {
    throw LoadError{std::string("the ONNX checker rejects the model: ") +
                    e.what()};
  }
  model.path = path;
  model.producerName = proto.producer_name();
  model.producerVersion = proto.producer_version();
  model.irVersion = proto.ir_version();
  for (const onnx::OperatorSetIdProto &o : proto.opset_import())
    model.opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();

  // Initializer shapes before anything sizes them.
  for (const onnx::TensorProto &t : proto.graph().initializer())
    checkDims(t);
  // Attributes the checker lets through but onnx 1.12's shape inference
  // indexes with unchecked (a crash there, found by fuzzing).
  for (const onnx::NodeProto &n : proto.graph().node())
    if (n.op_type() == "Transpose" && (n.domain().empty() || n.domain() == "ai.onnx"))
      for (const onnx::AttributeProto &a : n.attribute())
        if (a.name() == "perm") {
          std::vector<bool> seen(size_t(a.ints_size()), false);
          for (int64_t p : a.ints()) {
            if (p < 0 || p >= a.ints_size() || seen[size_t(p)])
              throw LoadError{"node '" + n.name() +
                              "' (Transpose): perm is not a permutation"};
            seen[size_t(p)] = true;
          }
        }

  // Shape inference fills the intermediate values' types: exports store
  // none. Strict mode, so a node whose shapes contradict its inputs is an
  // error here rather than a wrong import later; data propagation lets it
  // follow the small shape computations feeding Reshape.
  if (model.checked) try {
    onnx::ShapeInferenceOptions options(/*check_type=*/true, /*strict=*/1,
                                        /*data_prop=*/true);
    onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(),
                                       options);
  } catch (const std::exception &e) {
    throw LoadError{std::string("ONNX shape inference failed: ") + e.what()};
  }

  const onnx::GraphProto &g = proto.graph();
  for (onnx::TensorProto &t : *proto.mutable_graph()->mutable_initializer())
    model.initializers.push_back(convertTensor(
        t, loadWeights, baseDir, t.has_raw_data() ? t.mutable_raw_data() : nullptr));
  for (const onnx::ValueInfoProto &v : g.input())
    model.inputs.push_back(convertValueInfo(v));
  for (const onnx::ValueInfoProto &v : g.output())
    model.outputs.push_back(convertValueInfo(v));
  for (const ValueInfo &v : model.inputs)
    model.values[v.name] = v;
  for (const ValueInfo &v : model.outputs)
    model.values[v.name] = v;
  for (const onnx::ValueInfoProto &v : g.value_info())
    model.values[v.name()] = convertValueInfo(v);
  for (const Tensor &t : model.initializers) {
    ValueInfo v;
    v.name = t.name;
    v.elemType = t.elemType;
    v.hasShape = true;
    v.shape = t.shape;
    model.values[t.name] = v;
  }

  int index = 0;
  for (const onnx::NodeProto &n : g.node()) {
    Node node;
    node.opType = n.op_type();
    node.name = n.name().empty() ? n.op_type() + "#" + std::to_string(index)
                                 : n.name();
    ++index;
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    // The PyTorch module that made the node: the dynamo exporter's
    // name_scopes metadata (['', 'm', 'm.layers.0', ..., 'linear']: the
    // module path before the op's own name), else the TorchScript
    // exporter's node name ("/m/layers.0/mlp/fc1/MatMul").
    // NodeProto.metadata_props (field 9, IR version 10) is newer than this
    // onnx library's schema: protobuf keeps it as an unknown field.
    const google::protobuf::UnknownFieldSet &unknown =
        n.GetReflection()->GetUnknownFields(n);
    for (int f = 0; f < unknown.field_count(); ++f) {
      const google::protobuf::UnknownField &field = unknown.field(f);
      onnx::StringStringEntryProto p;
      if (field.number() != 9 ||
          field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED ||
          !p.ParseFromString(field.length_delimited()) ||
          p.key() != "pkg.torch.onnx.name_scopes")
        continue;
      std::vector<std::string> scopes;
      const std::string &v = p.value();
      for (size_t at = v.find('\''); at != std::string::npos;) {
        size_t end = v.find('\'', at + 1);
        if (end == std::string::npos)
          break;
        scopes.push_back(v.substr(at + 1, end - at - 1));
        at = v.find('\'', end + 1);
      }
      if (scopes.size() >= 2)
        node.scope = scopes[scopes.size() - 2];
    }
    if (node.scope.empty() && !n.name().empty() && n.name()[0] == '/') {
      std::string path = n.name().substr(1);
      size_t last = path.rfind('/');
      path = last == std::string::npos ? "" : path.substr(0, last);
      std::replace(path.begin(), path.end(), '/', '.');
      node.scope = path;
    }
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    for (const onnx::AttributeProto &a : n.attribute()) {
      Attribute attr;
      attr.name = a.name();
      switch (a.type()) {
      case onnx::AttributeProto::FLOAT: attr.kind = Attribute::Float; attr.f = a.f(); break;
      case onnx::AttributeProto::INT: attr.kind = Attribute::Int; attr.i = a.i(); break;
      case onnx::AttributeProto::STRING: attr.kind = Attribute::String; attr.s = a.s(); break;
      case onnx::AttributeProto::TENSOR:
        attr.kind = Attribute::Tensor;
        attr.tensor = std::make_shared<Tensor>(
            convertTensor(a.t(), /*loadData=*/true, baseDir));
        break;
      case onnx::AttributeProto::FLOATS:
        attr.kind = Attribute::Floats;
        attr.floats.assign(a.floats().begin(), a.floats().end());
        break;
      case onnx::AttributeProto::INTS:
        attr.kind = Attribute::Ints;
        attr.ints.assign(a.ints().begin(), a.ints().end());
        break;
      case onnx::AttributeProto::STRINGS:
        attr.kind = Attribute::Strings;
        attr.strings.assign(a.strings().begin(), a.strings().end());
        break;
      case onnx::AttributeProto::GRAPH:
      case onnx::AttributeProto::GRAPHS:
        attr.kind = Attribute::Graph;
        break;
      default: attr.kind = Attribute::Other; break;
      }
      node.attributes.push_back(std::move(attr));
    }
    model.nodes.push_back(std::move(node));
  }

  // A buffer in external data that serves only as a mask (a causal mask
  // kept as a module buffer) is read in: folding needs its values. A mask
  // use is an operand of a comparison or of Not, or Where's condition, or
  // input 0 of a value-preserving op (Slice, Cast, Reshape, ...) whose
  // results are masks themselves. Parameters (read by MatMul, Gather, or
  // cast and reshaped on their way there) stay references to the file.
  std::map<std::string, std::vector<std::pair<const Node *, size_t>>> uses;
  for (const Node &node : model.nodes)
    for (size_t i = 0; i < node.inputs.size(); ++i)
      uses[node.inputs[i]].push_back({&node, i});
  static const std::set<std::string> comparisons = {
      "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not"};
  static const std::set<std::string> preserving = {
      "Slice", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose"};
  std::map<std::string, bool> memo;
  std::function<bool(const std::string &, int)> maskOnly = [&](const std::string &value,
                                                               int depth) {
    auto m = memo.find(value);
    if (m != memo.end())
      return m->second;
    bool mask = depth < 16;
    auto it = uses.find(value);
    if (mask && it != uses.end())
      for (auto [node, i] : it->second) {
        if (comparisons.count(node->opType) || (node->opType == "Where" && i == 0))
          continue;
        if (preserving.count(node->opType) && i == 0 &&
            std::all_of(node->outputs.begin(), node->outputs.end(),
                        [&](const std::string &o) { return maskOnly(o, depth + 1); }))
          continue;
        mask = false;
        break;
      }
    for (const ValueInfo &out : model.outputs)
      mask = mask && out.name != value;
    return memo[value] = mask && it != uses.end();
  };
  int64_t maskBytes = 0;
  for (Tensor &t : model.initializers) {
    int64_t bytes = t.numElements() * std::max<int64_t>(1, elementBytes(t.elemType));
    if (t.isExternal() && loadWeights && maskOnly(t.name, 0) &&
        maskBytes + bytes <= (int64_t(1) << 30)) {
      readExternalData(t.name, t.elemType, t.shape, t);
      maskBytes += bytes;
    }
  }
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}


void rewrite(const std::string &source, const std::vector<InitializerUpdate> &updates,
             const std::string &dataFile, bool external, std::string &modelBytes,
             std::string &dataBytes) {
  onnx::ModelProto proto;
  parseModel(source, proto);
  std::error_code dirError;
  std::filesystem::path baseDir = std::filesystem::canonical(
      std::filesystem::absolute(std::filesystem::path(source)).parent_path(), dirError);
  if (dirError)
    throw LoadError{"cannot resolve the model's directory: " + dirError.message()};
  onnx::GraphProto &g = *proto.mutable_graph();
  // Every tensor of the graph with its bytes inline: the source's external
  // data read in (checked as the importer checks it), float_data as
  // raw_data (so that sizes and the move to external data see it).
  std::vector<onnx::TensorProto *> tensors;
  for (onnx::TensorProto &t : *g.mutable_initializer())
    tensors.push_back(&t);
  for (onnx::NodeProto &n : *g.mutable_node())
    for (onnx::AttributeProto &a : *n.mutable_attribute())
      if (a.has_t())
        tensors.push_back(a.mutable_t());
  for (onnx::TensorProto *tp : tensors) {
    onnx::TensorProto &t = *tp;
    if (t.data_location() != onnx::TensorProto::EXTERNAL) {
      if (t.float_data_size() > 0) {
        std::string bytes;
        appendTyped<float>(bytes, t.float_data());
        setInlineData(t, std::move(bytes));
      }
      continue;
    }
    checkDims(t);
    Tensor where;
    resolveExternalData(t, baseDir, where);
    readExternalData(t.name(), t.data_type(),
                     std::vector<int64_t>(t.dims().begin(), t.dims().end()), where);
    setInlineData(t, std::move(where.data));
  }
  std::map<std::string, int> initIndex;
  for (int i = 0; i < g.initializer_size(); ++i)
    initIndex[g.initializer(i).name()] = i;
  std::map<std::string, int> nodeIndex;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    nodeIndex[n.name().empty() ? n.op_type() + "#" + std::to_string(i) : n.name()] = i;
  }
  for (const InitializerUpdate &u : updates) {
    auto it = initIndex.find(u.initializer);
    if (it == initIndex.end())
      throw LoadError{"has no initializer '" + u.initializer +
                      "', which the checkpoint's parameters were imported from "
                      "(is it the model the artifact was compiled from?)"};
    const onnx::TensorProto &from = g.initializer(it->second);
    std::vector<int64_t> dims(from.dims().begin(), from.dims().end());
    if (from.data_type() != onnx::TensorProto::FLOAT || dims != u.shape)
      throw LoadError{"initializer '" + u.initializer + "' is " +
                      elemTypeName(from.data_type()) + " " + shapeText(dims) +
                      ", not the float " + shapeText(u.shape) +
                      " the checkpoint's parameter gives (is it the model the "
                      "artifact was compiled from?)"};
    std::string bytes(reinterpret_cast<const char *>(u.data.data()), u.data.size() * 4);
    if (u.name == u.initializer) {
      setInlineData(*g.mutable_initializer(it->second), std::move(bytes));
      continue;
    }
    if (initIndex.count(u.name))
      throw LoadError{"already has an initializer named '" + u.name +
                      "' (for parameter '" + u.initializer + "', split)"};
    onnx::TensorProto copy = from;
    copy.set_name(u.name);
    setInlineData(copy, std::move(bytes));
    *g.add_initializer() = std::move(copy);
    initIndex[u.name] = g.initializer_size() - 1;
    for (const std::string &reader : u.readers) {
      auto n = nodeIndex.find(reader);
      bool rewired = false;
      if (n != nodeIndex.end())
        for (std::string &in : *g.mutable_node(n->second)->mutable_input())
          if (in == u.initializer) {
            in = u.name;
            rewired = true;
          }
      if (!rewired)
        throw LoadError{"has no node '" + reader + "' reading initializer '" +
                        u.initializer + "'"};
    }
  }
  // Within protobuf's 2 GiB (with room for the graph), or external data.
  int64_t total = 0;
  for (const onnx::TensorProto &t : g.initializer())
    total += int64_t(t.raw_data().size());
  dataBytes.clear();
  if (external || total > (int64_t(1) << 31) - (int64_t(64) << 20)) {
    for (onnx::TensorProto &t : *g.mutable_initializer()) {
      if (t.raw_data().size() < 1024)
        continue;
      dataBytes.append((64 - dataBytes.size() % 64) % 64, '\0');
      const size_t offset = dataBytes.size();
      dataBytes += t.raw_data();
      t.clear_raw_data();
      t.set_data_location(onnx::TensorProto::EXTERNAL);
      auto add = [&](const char *key, const std::string &value) {
        onnx::StringStringEntryProto *e = t.add_external_data();
        e->set_key(key);
        e->set_value(value);
      };
      add("location", dataFile);
      add("offset", std::to_string(offset));
      add("length", std::to_string(dataBytes.size() - offset));
    }
  }
  if (!proto.SerializeToString(&modelBytes))
    throw LoadError{"cannot serialize the model"};
}

} // namespace

std::string loadModel(const std::string &path, bool loadWeights, Model &model) {
  try {
    load(path, loadWeights, model);
    return "";
  } catch (const LoadError &e) {
    return e.message;
  } catch (const std::exception &e) {
    return std::string("cannot read the model: ") + e.what();
  } catch (...) {
    return "cannot read the model: unknown error";
  }
}

} // namespace tessera::onnx_model

namespace tessera::onnx_model {

std::string rewriteModel(const std::string &source,
                         const std::vector<InitializerUpdate> &updates,
                         const std::string &dataFile, bool external,
                         std::string &modelBytes, std::string &dataBytes) {
  try {
    rewrite(source, updates, dataFile, external, modelBytes, dataBytes);
    return "";
  } catch (const LoadError &e) {
    return source + ": " + e.message;
  } catch (const std::exception &e) {
    return source + ": cannot rewrite the model: " + e.what();
  } catch (...) {
    return source + ": cannot rewrite the model: unknown error";
  }
}

} // namespace tessera::onnx_model
