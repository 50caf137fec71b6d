//===- ShardFile.h - Checkpoint shard files ---------------------*- C++ -*-===//
//
// The file each world rank writes into a checkpoint's iter_NNNNNNN
// directory (see tessera/rt/Checkpoint.h): its persistent training state.
//
// Shard file: a 32-byte header, then the payload.
//   bytes 0..3   magic "TSCK"
//   bytes 4..7   format version (u32 LE) == kShardFormatVersion
//   bytes 8..15  payload size (u64)
//   bytes 16..19 CRC-32 (IEEE) of the payload
//   bytes 20..23 world rank (u32)          bytes 24..27 world size (u32)
//   bytes 28..31 reserved, zero
// Payload: u64 iteration, u64 consumed samples, u64 seed, u32 tensor count,
// u32 reserved; per tensor u32 name length, name, u8 kind (BufferKind),
// u8 dtype, u8 rank, u8 reserved, i64 dims[rank], u64 data offset (from the
// payload's start, 64-byte aligned), u64 data bytes; then the data.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_SHARDFILE_H
#define TESSERA_RT_CHECKPOINT_SHARDFILE_H

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Status.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::rt {

namespace ckpt {
constexpr char kShardMagic[4] = {'T', 'S', 'C', 'K'};
constexpr uint32_t kShardFormatVersion = 1;
constexpr size_t kShardHeaderSize = 32;
} // namespace ckpt

/// "iter_0000010".
std::string iterationDirName(int64_t iteration);
/// "rank_00003.bin".
std::string shardFileName(int rank);

struct ShardTensor {
  std::string name;
  fb::BufferKind kind = fb::BufferKind::Param;
  fb::DType dtype = fb::DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

struct ShardFile {
  int rank = 0, worldSize = 1;
  int64_t iteration = 0, consumedSamples = 0;
  uint64_t seed = 0;
  /// CRC-32 of the payload (set by decodeShard).
  uint32_t crc = 0;
  std::vector<ShardTensor> tensors;
  /// The tensor named `name`, or null.
  const ShardTensor *find(const std::string &name) const;
};

/// Header fields of a shard file.
struct ShardHeader {
  uint32_t version = 0;
  uint64_t payloadSize = 0;
  uint32_t crc = 0;
  int rank = 0, worldSize = 0;
};

/// Header + payload of `shard`.
std::string encodeShard(const ShardFile &shard);
/// Checks, in order: size of the header, magic, version, rank < world size,
/// payload size against the bytes present (truncation, trailing bytes), the
/// CRC-32, and the tensor index (bounds, sizes, unique names). Every message
/// starts with `fileName`.
StatusOr<ShardFile> decodeShard(const std::string &bytes,
                                const std::string &fileName);
/// The header checks of decodeShard (everything but the CRC and the index)
/// on the file's first bytes and its size, without reading the payload.
StatusOr<ShardHeader> readShardHeader(const std::string &path);
StatusOr<ShardFile> readShardFile(const std::string &path);

} // namespace tessera::rt

#endif // TESSERA_RT_CHECKPOINT_SHARDFILE_H
