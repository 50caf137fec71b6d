//===- ShardFile.cpp - Checkpoint shard files -----------------------------===//
//
// Encoding and validated decoding of the per-rank shard files of a
// checkpoint (format in tessera/rt/checkpoint/ShardFile.h): the 32-byte
// header with its CRC-32 of the payload, the tensor index and the 64-byte
// aligned tensor data; and the names of a checkpoint's files and
// directories (iter_NNNNNNN, rank_RRRRR.bin).
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/checkpoint/ShardFile.h"

#include "Strings.h"
#include "tessera/rt/FileIO.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace tessera::rt {

using artifact::crc32;
using artifact::loadLE32;
using artifact::loadLE64;
using artifact::storeLE32;
using artifact::storeLE64;
using ckpt::hex32;
using ckpt::shapeString;

std::string iterationDirName(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", (long long)iteration);
  return buf;
}

std::string shardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.bin", rank);
  return buf;
}

const ShardTensor *ShardFile::find(const std::string &name) const {
  for (const ShardTensor &t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

namespace {

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

void put32(std::string &s, uint32_t v) {
  uint8_t b[4];
  storeLE32(b, v);
  s.append(reinterpret_cast<const char *>(b), 4);
}
void put64(std::string &s, uint64_t v) {
  uint8_t b[8];
  storeLE64(b, v);
  s.append(reinterpret_cast<const char *>(b), 8);
}

/// Bounds-checked little-endian reader over the payload.
struct Cursor {
  const uint8_t *data;
  size_t size, pos = 0;
  bool ok = true;
  bool need(size_t n) {
    if (!ok || size - pos < n)
      ok = false;
    return ok;
  }
  uint8_t u8() { return need(1) ? data[pos++] : 0; }
  uint32_t u32() {
    if (!need(4))
      return 0;
    uint32_t v = loadLE32(data + pos);
    pos += 4;
    return v;
  }
  uint64_t u64() {
    if (!need(8))
      return 0;
    uint64_t v = loadLE64(data + pos);
    pos += 8;
    return v;
  }
  std::string str(size_t n) {
    if (!need(n))
      return "";
    std::string s(reinterpret_cast<const char *>(data + pos), n);
    pos += n;
    return s;
  }
};

/// Checks the header fields in `h` (the first 32 bytes of a file of
/// `fileSize` bytes).
StatusOr<ShardHeader> checkHeader(const uint8_t *h, uint64_t fileSize,
                                  const std::string &fileName) {
  if (fileSize < ckpt::kShardHeaderSize)
    return dataLoss(fileName, ": file is truncated: expected at least a ",
                    ckpt::kShardHeaderSize,
                    "-byte checkpoint shard header, got ", fileSize, " bytes");
  if (std::memcmp(h, ckpt::kShardMagic, 4) != 0)
    return dataLoss(fileName,
                    ": not a Tessera checkpoint shard (bad magic; expected "
                    "'TSCK')");
  ShardHeader header;
  header.version = loadLE32(h + 4);
  if (header.version != ckpt::kShardFormatVersion)
    return dataLoss(fileName, ": unsupported checkpoint shard format version ",
                    header.version, " (this runtime supports version ",
                    ckpt::kShardFormatVersion, ")");
  header.payloadSize = loadLE64(h + 8);
  header.crc = loadLE32(h + 16);
  uint32_t rank = loadLE32(h + 20), world = loadLE32(h + 24);
  if (world == 0 || world > (1u << 24) || rank >= world)
    return dataLoss(fileName, ": corrupt header: rank ", rank,
                    " of world size ", world);
  header.rank = int(rank);
  header.worldSize = int(world);
  uint64_t expected = ckpt::kShardHeaderSize + header.payloadSize;
  if (header.payloadSize > fileSize || fileSize < expected)
    return dataLoss(fileName, ": file is truncated: expected ", expected,
                    " bytes, got ", fileSize);
  if (fileSize > expected)
    return dataLoss(fileName, ": ", fileSize - expected,
                    " unexpected bytes after the payload (expected ", expected,
                    " bytes)");
  return header;
}

} // namespace

std::string encodeShard(const ShardFile &shard) {
  const size_t H = ckpt::kShardHeaderSize;
  uint64_t indexSize = 8 * 3 + 4 + 4;
  for (const ShardTensor &t : shard.tensors)
    indexSize += 4 + t.name.size() + 4 + 8 * t.shape.size() + 16;
  uint64_t offset = align64(indexSize), total = offset;
  for (const ShardTensor &t : shard.tensors)
    total = align64(total + t.data.size());
  // The header's space first, then the payload (offsets from its start).
  std::string file(H, '\0');
  file.reserve(H + total);
  put64(file, uint64_t(shard.iteration));
  put64(file, uint64_t(shard.consumedSamples));
  put64(file, shard.seed);
  put32(file, uint32_t(shard.tensors.size()));
  put32(file, 0);
  for (const ShardTensor &t : shard.tensors) {
    put32(file, uint32_t(t.name.size()));
    file += t.name;
    file += char(uint8_t(t.kind));
    file += char(uint8_t(t.dtype));
    file += char(uint8_t(t.shape.size()));
    file += char(0);
    for (int64_t d : t.shape)
      put64(file, uint64_t(d));
    put64(file, offset);
    put64(file, t.data.size());
    offset = align64(offset + t.data.size());
  }
  for (const ShardTensor &t : shard.tensors) {
    file.resize(H + align64(file.size() - H), '\0');
    file.append(reinterpret_cast<const char *>(t.data.data()), t.data.size());
  }
  auto *h = reinterpret_cast<uint8_t *>(file.data());
  uint64_t payloadSize = file.size() - H;
  std::memcpy(h, ckpt::kShardMagic, 4);
  storeLE32(h + 4, ckpt::kShardFormatVersion);
  storeLE64(h + 8, payloadSize);
  storeLE32(h + 16, crc32(h + H, payloadSize));
  storeLE32(h + 20, uint32_t(shard.rank));
  storeLE32(h + 24, uint32_t(shard.worldSize));
  return file;
}

StatusOr<ShardFile> decodeShard(const std::string &bytes,
                                const std::string &fileName) {
  const auto *data = reinterpret_cast<const uint8_t *>(bytes.data());
  if (bytes.size() < ckpt::kShardHeaderSize)
    return checkHeader(data, bytes.size(), fileName).status();
  TESSERA_ASSIGN_OR_RETURN(ShardHeader header,
                           checkHeader(data, bytes.size(), fileName));
  const uint8_t *payload = data + ckpt::kShardHeaderSize;
  uint32_t actual = crc32(payload, header.payloadSize);
  if (actual != header.crc)
    return dataLoss(fileName,
                    ": payload is corrupted (CRC-32 mismatch: header says ",
                    hex32(header.crc), ", payload has ", hex32(actual), ")");
  ShardFile shard;
  shard.rank = header.rank;
  shard.worldSize = header.worldSize;
  shard.crc = header.crc;
  Cursor c{payload, size_t(header.payloadSize)};
  shard.iteration = int64_t(c.u64());
  shard.consumedSamples = int64_t(c.u64());
  shard.seed = c.u64();
  uint32_t count = c.u32();
  c.u32();
  auto malformed = [&](auto &&...args) {
    return dataLoss(fileName, ": malformed tensor index: ", args...);
  };
  if (!c.ok)
    return malformed("the payload is too short");
  if (count > header.payloadSize / 32)
    return malformed(count, " tensors cannot fit in ", header.payloadSize,
                     " bytes");
  std::set<std::string> names;
  for (uint32_t i = 0; i < count; ++i) {
    ShardTensor t;
    uint32_t nameLength = c.u32();
    if (nameLength > 4096)
      return malformed("tensor ", i, " has a name of ", nameLength, " bytes");
    t.name = c.str(nameLength);
    uint8_t kind = c.u8(), dtype = c.u8(), rank = c.u8();
    c.u8();
    if (!c.ok)
      return malformed("tensor ", i, " is cut off");
    if (kind > uint8_t(fb::BufferKind::MAX) || dtype > uint8_t(fb::DType::MAX))
      return malformed("tensor '", t.name, "' has kind ", int(kind),
                       " and dtype ", int(dtype));
    t.kind = fb::BufferKind(kind);
    t.dtype = fb::DType(dtype);
    for (uint8_t d = 0; d < rank; ++d) {
      int64_t dim = int64_t(c.u64());
      if (dim < 0)
        return malformed("tensor '", t.name, "' has a negative dimension");
      t.shape.push_back(dim);
    }
    uint64_t offset = c.u64(), size = c.u64();
    if (!c.ok)
      return malformed("tensor ", i, " is cut off");
    if (offset > header.payloadSize || size > header.payloadSize - offset)
      return malformed("tensor '", t.name, "' data [", offset, ", ",
                       offset + size, ") lies outside the payload of ",
                       header.payloadSize, " bytes");
    int64_t elems = 1;
    for (int64_t d : t.shape) {
      if (d && elems > INT64_MAX / d)
        return malformed("tensor '", t.name, "' is too large");
      elems *= d;
    }
    // elems * element size == size, without the product wrapping.
    const uint64_t es = uint64_t(dtypeSize(t.dtype));
    if (es == 0 || size % es != 0 || uint64_t(elems) != size / es)
      return malformed("tensor '", t.name, "' of shape ", shapeString(t.shape),
                       " ", fb::EnumNameDType(t.dtype), " has ", size,
                       " bytes of data");
    if (!names.insert(t.name).second)
      return malformed("tensor '", t.name, "' appears twice");
    t.data.assign(payload + offset, payload + offset + size);
    shard.tensors.push_back(std::move(t));
  }
  return shard;
}

StatusOr<ShardHeader> readShardHeader(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return notFound(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  uint8_t h[ckpt::kShardHeaderSize] = {};
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0)
    n = ::pread(fd, h, sizeof(h), 0);
  int err = errno;
  ::close(fd);
  if (n < 0)
    return dataLoss(path, ": cannot read: ", std::strerror(err));
  return checkHeader(h, uint64_t(st.st_size), path);
}

StatusOr<ShardFile> readShardFile(const std::string &path) {
  TESSERA_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path));
  return decodeShard(bytes, path);
}

} // namespace tessera::rt
