//===- tessera-export.cpp - Checkpoint to Hugging Face or ONNX model ------===//
//
// tessera::rt::runExport (see tessera/rt/Export.h) with the ONNX rewriter
// of the compiler's ONNX library (tessera/Import/OnnxModel.h): the runtime
// itself links no ONNX.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Export.h"

#ifdef TESSERA_EXPORT_ONNX
#include "tessera/Import/OnnxModel.h"

namespace {

std::string rewriteOnnx(const std::string &source,
                        std::vector<tessera::rt::OnnxInitializer> &values,
                        const std::string &dataFile, bool external,
                        std::string &model, std::string &data) {
  std::vector<tessera::onnx_model::InitializerUpdate> updates;
  updates.reserve(values.size());
  for (tessera::rt::OnnxInitializer &v : values)
    updates.push_back({std::move(v.initializer), std::move(v.name),
                       std::move(v.readers), std::move(v.shape), std::move(v.data)});
  return tessera::onnx_model::rewriteModel(source, updates, dataFile, external, model, data);
}

} // namespace

int main(int argc, char **argv) {
  return tessera::rt::runExport(argc, argv, rewriteOnnx);
}
#else
int main(int argc, char **argv) { return tessera::rt::runExport(argc, argv); }
#endif
