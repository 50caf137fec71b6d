//===- OnnxModel.h - An ONNX model as plain C++ data --------------*- C++ -*-===//
//
// The ONNX graph the importer reads: nodes, initializers, the graph's inputs
// and outputs and every value's type after ONNX shape inference. loadModel()
// is the only code that touches protobuf or the onnx library; it is compiled
// with exceptions (LLVM and MLIR are not) and returns errors as text, so the
// MLIR importer (OnnxImport.h) sees plain structs and never an exception.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_IMPORT_ONNXMODEL_H
#define TESSERA_IMPORT_ONNXMODEL_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::onnx_model {

/// ONNX TensorProto.DataType values the importer names.
enum ElemType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 9,
  kDouble = 11,
};

/// "float", "int64", ... for messages.
const char *elemTypeName(int32_t type);

/// An initializer or a constant. Inline data is held in `data` (raw little
/// endian, row major); external data (ONNX's external-data files) is named
/// by `externalDir` (the model's directory, symlinks resolved),
/// `externalFile` (its `location`: a path relative to that directory that
/// stays inside it, symlinks resolved), `externalOffset` and
/// `externalLength`, and not read.
struct Tensor {
  std::string name;
  int32_t elemType = kUndefined;
  std::vector<int64_t> shape;
  std::string data;
  bool hasData = false;
  std::string externalDir;
  std::string externalFile;
  int64_t externalOffset = 0;
  int64_t externalLength = -1;
  /// The file's size in bytes (external data).
  int64_t externalFileBytes = 0;
  /// externalDir/externalFile.
  std::string externalPath() const { return externalDir + "/" + externalFile; }

  int64_t numElements() const;
  bool isExternal() const { return !externalFile.empty(); }
  /// The elements as doubles (float, double, int32, int64, bool tensors
  /// with inline data); empty when the type or storage is other.
  std::vector<double> toDoubles() const;
};

struct Attribute {
  enum Kind { Float, Int, String, Tensor, Floats, Ints, Strings, Graph, Other };
  std::string name;
  Kind kind = Other;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::shared_ptr<onnx_model::Tensor> tensor;
};

struct Node {
  std::string name;   ///< the node's name, or "<OpType>#<index>" when empty
  std::string opType;
  std::string domain; ///< "" for the standard domain (ai.onnx)
  /// The PyTorch module path that made the node ("m.layers.0.mlp.fc1"), or
  /// "" (from the dynamo exporter's name_scopes or the TorchScript
  /// exporter's node name).
  std::string scope;
  std::vector<std::string> inputs, outputs; ///< "" for an omitted input
  std::vector<Attribute> attributes;

  const Attribute *attr(const std::string &name) const;
};

/// A value's type: element type and shape, -1 for a dimension shape
/// inference could not fix (a symbolic or unknown one).
struct ValueInfo {
  std::string name;
  int32_t elemType = kUndefined;
  bool hasShape = false;
  std::vector<int64_t> shape;
};

struct Model {
  std::string path;
  std::string producerName, producerVersion;
  int64_t irVersion = 0;
  std::map<std::string, int64_t> opsets; ///< domain ("" = ai.onnx) -> version
  std::vector<Node> nodes;               ///< in the graph's (topological) order
  std::vector<Tensor> initializers;
  std::vector<ValueInfo> inputs, outputs;
  std::map<std::string, ValueInfo> values; ///< every typed value, by name
  /// The newest standard-domain opset the onnx library knows, and whether
  /// the model's is within it: only then did the onnx checker and shape
  /// inference run (a newer model's value types are its exporter's).
  int64_t libraryOpset = 0;
  bool checked = false;
};

/// Reads the ONNX model at `path` and runs ONNX shape inference on it.
/// Without `loadWeights` the initializers keep their types and shapes but
/// no data. Returns an empty string, or the error.
std::string loadModel(const std::string &path, bool loadWeights, Model &model);

/// A trained value for an initializer of a model (tessera-export --format
/// onnx).
struct InitializerUpdate {
  std::string initializer; ///< the source model's initializer
  /// The written initializer's name: `initializer`, or a new name when
  /// several parameters share the source's initializer and each gets its
  /// own (the nodes `readers` then read it).
  std::string name;
  std::vector<std::string> readers;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// The model at `source` with `updates` applied (an f32 initializer's data
/// replaced, or a new initializer added for the nodes `readers`, by Node
/// name), serialized: `modelBytes` is the ModelProto. Every initializer is
/// inline when the model's tensors fit in protobuf's 2 GiB and not
/// `external`; otherwise those of 1 KiB and more go to the external-data
/// file `dataFile` (a name in the model's directory), whose bytes are
/// `dataBytes`. The source's own
/// external data is read (and checked as loadModel checks it). Returns an
/// empty string, or the error.
std::string rewriteModel(const std::string &source,
                         const std::vector<InitializerUpdate> &updates,
                         const std::string &dataFile, bool external,
                         std::string &modelBytes, std::string &dataBytes);

} // namespace tessera::onnx_model

#endif // TESSERA_IMPORT_ONNXMODEL_H
