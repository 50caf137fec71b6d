//===- ExportTensors.cpp - Whole parameters of a checkpoint ---------------===//
//
// See ExportTensors.h.
//
//===----------------------------------------------------------------------===//

#include "ExportTensors.h"

#include "tessera/rt/BF16.h"

#include <cstring>

namespace tessera::rt::exporting {

/// "[2, 64, 16]".
std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}


/// Rows [begin, end) of dimension 0.
Tensor slice0(const Tensor &t, int64_t begin, int64_t end) {
  Tensor r;
  r.dtype = t.dtype;
  r.shape = t.shape;
  r.shape[0] = end - begin;
  const int64_t row = t.rowBytes();
  r.data.assign(t.data.begin() + begin * row, t.data.begin() + end * row);
  return r;
}

/// t[i]: dimension 0 indexed away.
Tensor index0(const Tensor &t, int64_t i) {
  Tensor r = slice0(t, i, i + 1);
  r.shape.erase(r.shape.begin());
  return r;
}

/// The tensors one after another along dimension 0.
Tensor concat0(const std::vector<Tensor> &parts) {
  Tensor r;
  r.dtype = parts.front().dtype;
  r.shape = parts.front().shape;
  r.shape[0] = 0;
  for (const Tensor &p : parts) {
    r.shape[0] += p.shape[0];
    r.data.insert(r.data.end(), p.data.begin(), p.data.end());
  }
  return r;
}

/// The transpose of a matrix (a Conv1D weight from a Linear one).
Tensor transpose(const Tensor &t) {
  Tensor r;
  r.dtype = t.dtype;
  const int64_t rows = t.shape[0], cols = t.shape[1], es = t.elementSize();
  r.shape = {cols, rows};
  r.data.resize(t.data.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::memcpy(&r.data[size_t((j * rows + i) * es)],
                  &t.data[size_t((i * cols + j) * es)], size_t(es));
  return r;
}

/// `t` in `dtype` (to bf16 or f16 rounded to nearest even; to f32
/// exactly).
Tensor convert(const Tensor &t, fb::DType dtype) {
  if (t.dtype == dtype)
    return t;
  Tensor r;
  r.dtype = dtype;
  r.shape = t.shape;
  const int64_t n = t.numel();
  r.data.resize(size_t(n * dtypeSize(dtype)));
  const FloatFormat from = floatFormatOf(t.dtype), to = floatFormatOf(dtype);
  for (int64_t i = 0; i < n; ++i) {
    float f;
    if (from == FloatFormat::F32) {
      std::memcpy(&f, &t.data[size_t(4 * i)], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &t.data[size_t(2 * i)], 2);
      f = halfToFloat(from, h);
    }
    if (to == FloatFormat::F32) {
      std::memcpy(&r.data[size_t(4 * i)], &f, 4);
    } else {
      uint16_t h = floatToHalf(to, f);
      std::memcpy(&r.data[size_t(2 * i)], &h, 2);
    }
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Gathering the parameters
//===----------------------------------------------------------------------===//

/// Every parameter of the checkpoint, whole: each shard read from one of
/// its holders' shard files (one file in memory at a time).
StatusOr<std::map<std::string, Tensor>>
gatherParameters(const CheckpointLocation &location,
                 const CheckpointManifest &m) {
  std::map<std::string, Tensor> whole;
  std::map<int, std::vector<std::pair<const ManifestTensor *, int>>> byRank;
  const std::string manifest = location.dir + "/manifest.json";
  for (const ManifestTensor &t : m.tensors) {
    if (t.kind != fb::BufferKind::Param)
      continue;
    if (!isFloatDType(t.dtype))
      return invalidArgument(manifest, ": parameter '", t.name, "' is ",
                             fb::EnumNameDType(t.dtype),
                             ", not F32, BF16 or F16");
    Tensor &w = whole[t.name];
    w.dtype = t.dtype;
    w.shape = t.globalShape;
    w.data.assign(size_t(w.numel() * w.elementSize()), 0);
    std::vector<bool> found(size_t(t.numShards), false);
    for (auto [rank, j] : t.holders)
      if (j >= 0 && j < t.numShards && !found[size_t(j)]) {
        found[size_t(j)] = true;
        byRank[rank].push_back({&t, j});
      }
    for (int j = 0; j < t.numShards; ++j)
      if (!found[size_t(j)])
        return invalidArgument(manifest, ": no rank holds shard ", j, " of ",
                               t.numShards, " of parameter '", t.name, "'");
  }
  for (const auto &[rank, pieces] : byRank) {
    const std::string path = location.dir + "/" + shardFileName(rank);
    TESSERA_ASSIGN_OR_RETURN(ShardFile file, readShardFile(path));
    for (auto [t, j] : pieces) {
      const ShardTensor *s = file.find(t->name);
      if (!s)
        return invalidArgument(path, ": no tensor '", t->name,
                               "', which the manifest says rank ", rank,
                               " holds");
      TensorBox box = shardBox(*t, j);
      Tensor &w = whole[t->name];
      std::vector<int64_t> extent;
      for (size_t d = 0; d < box.lo.size(); ++d)
        extent.push_back(box.hi[d] - box.lo[d]);
      if (s->dtype != t->dtype || s->shape != extent ||
          int64_t(s->data.size()) != box.volume() * w.elementSize())
        return invalidArgument(path, ": tensor '", t->name, "' is ",
                               fb::EnumNameDType(s->dtype),
                               shapeText(s->shape), ", not the ",
                               fb::EnumNameDType(t->dtype),
                               shapeText(extent), " of shard ", j,
                               " the manifest describes");
      TensorBox all;
      all.lo.assign(w.shape.size(), 0);
      all.hi = w.shape;
      copyTensorBox(s->data.data(), box, w.data.data(), all, box,
                    w.elementSize());
    }
  }
  return whole;
}

} // namespace tessera::rt::exporting
