//===- ExportTensors.h - Whole parameters of a checkpoint -------*- C++ -*-===//
//
// tessera-export's common part: the parameters of a checkpoint gathered
// whole from its shard files, as dense row-major tensors, and the layout
// operations the exporters (HfExport.cpp, OnnxExport.cpp) map them with.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RUNTIME_SRC_EXPORT_EXPORTTENSORS_H
#define TESSERA_RUNTIME_SRC_EXPORT_EXPORTTENSORS_H

#include "tessera/rt/Checkpoint.h"

#include <map>
#include <string>
#include <vector>

namespace tessera::rt::exporting {

/// A dense row-major tensor of F32, BF16 or F16 elements.
struct Tensor {
  fb::DType dtype = fb::DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t elementSize() const { return dtypeSize(dtype); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  /// Bytes of one index of dimension 0.
  int64_t rowBytes() const {
    return shape.empty() || shape[0] == 0
               ? 0
               : int64_t(data.size()) / shape[0];
  }
};

/// "[2, 64, 16]".
std::string shapeText(const std::vector<int64_t> &shape);
/// Rows [begin, end) of dimension 0.
Tensor slice0(const Tensor &t, int64_t begin, int64_t end);
/// t[i]: dimension 0 indexed away.
Tensor index0(const Tensor &t, int64_t i);
/// The tensors one after another along dimension 0.
Tensor concat0(const std::vector<Tensor> &parts);
/// The transpose of a matrix.
Tensor transpose(const Tensor &t);
/// `t` in `dtype` (to bf16 or f16 rounded to nearest even; to f32
/// exactly).
Tensor convert(const Tensor &t, fb::DType dtype);
/// Every parameter of the checkpoint, whole: each shard read from one of
/// its holders' shard files (one file in memory at a time).
StatusOr<std::map<std::string, Tensor>>
gatherParameters(const CheckpointLocation &location, const CheckpointManifest &m);

} // namespace tessera::rt::exporting

#endif // TESSERA_RUNTIME_SRC_EXPORT_EXPORTTENSORS_H
