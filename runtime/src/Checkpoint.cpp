//===- Checkpoint.cpp - Distributed training checkpoints ------------------===//
//
// Shard files, the JSON manifest, atomic file writes, the load planner
// (compatibility checks and resharding through global shapes) and the
// collective save / per-rank load of tessera-run --save / --load.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Checkpoint.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/Data.h"
#include "tessera/rt/Executor.h"

#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace tessera::rt {

using artifact::crc32;
using artifact::loadLE32;
using artifact::loadLE64;
using artifact::storeLE32;
using artifact::storeLE64;

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

static std::string parentDirectory(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

static bool pathExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

static bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return dataLoss(
        dir, ": cannot open the directory to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync directories (EINVAL); nothing to do there.
  if (rc != 0 && err != EINVAL)
    return dataLoss(dir,
                    ": fsync of the directory failed: ", std::strerror(err));
  return Status();
}

Status makeDirectories(const std::string &dir) {
  if (dir.empty())
    return invalidArgument("empty directory name");
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = dir.find('/', pos + 1);
    path = dir.substr(0, next);
    pos = next;
    if (path.empty() || path == "/" || isDirectory(path))
      continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      return dataLoss(path,
                      ": cannot create the directory: ", std::strerror(errno));
    if (!isDirectory(path))
      return dataLoss(path, ": exists and is not a directory");
  }
  return Status();
}

Status writeFileAtomic(const std::string &path, const void *data, size_t size) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return dataLoss(path, ": cannot create ", tmp, ": ", std::strerror(errno));
  auto fail = [&](const std::string &what) {
    int err = errno;
    if (fd >= 0)
      ::close(fd);
    ::unlink(tmp.c_str());
    return dataLoss(path, ": ", what, ": ", std::strerror(err));
  };
  const auto *p = static_cast<const uint8_t *>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, p + done, size - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return fail("write failed");
    done += size_t(n);
  }
  if (::fsync(fd) != 0)
    return fail("fsync failed");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0)
    return fail("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail("rename of " + tmp + " failed");
  return syncDirectory(parentDirectory(path));
}

StatusOr<std::string> readWholeFile(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return notFound(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return dataLoss(path, ": cannot stat: ", std::strerror(errno));
  }
  std::string bytes(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return dataLoss(path, ": read failed: ", std::strerror(err));
    }
    if (n == 0)
      break;
    done += size_t(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

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

//===----------------------------------------------------------------------===//
// Shard files
//===----------------------------------------------------------------------===//

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

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

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
    if (uint64_t(elems) * uint64_t(dtypeSize(t.dtype)) != size)
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

//===----------------------------------------------------------------------===//
// Layouts
//===----------------------------------------------------------------------===//

namespace {

bool isSavedKind(fb::BufferKind k) {
  return k == fb::BufferKind::Param || k == fb::BufferKind::OptState ||
         k == fb::BufferKind::MainParam || k == fb::BufferKind::Iteration;
}

/// Optimizer state in the --no-load-optim sense: Adam moments and the fp32
/// main params of mixed precision.
bool isOptimizerKind(fb::BufferKind k) {
  return k == fb::BufferKind::OptState || k == fb::BufferKind::MainParam;
}

/// Main params of a parameter bucket of the distributed optimizer are named
/// "main:" + the bucket's parameter view ("pbuf:<grad buffer>:<bucket>").
constexpr std::string_view kMainPrefix = "main:";
constexpr std::string_view kBucketMainPrefix = "main:pbuf:";

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::vector<int64_t> toVector(const flatbuffers::Vector<int64_t> *v) {
  return v ? std::vector<int64_t>(v->begin(), v->end())
           : std::vector<int64_t>();
}

std::string nameOf(const fb::Buffer &b) {
  return b.name() ? b.name()->str() : std::string();
}

/// Where a saved buffer of one rank sits in its global tensor.
struct TensorLayout {
  std::vector<int64_t> local, global;
  int shardDim = -1;
  std::string axis;
  int index = 0, count = 1;
  bool reshardable = true, distOpt = false;
  std::string param;
};

StatusOr<TensorLayout> paramLayout(const LoadedArtifact &artifact,
                                   const fb::Buffer &b, int rank) {
  TensorLayout l;
  l.local = toVector(b.shape());
  l.global = b.global_shape() && b.global_shape()->size()
                 ? toVector(b.global_shape())
                 : l.local;
  auto error = [&](auto &&...args) {
    return invalidArgument(artifact.name(), ": parameter '", nameOf(b),
                           "': ", args...);
  };
  if (l.global.size() != l.local.size())
    return error("shape and global_shape have different ranks");
  l.shardDim = b.shard_dim();
  if (l.shardDim >= int(l.global.size()))
    return error("shard_dim ", l.shardDim, " out of range");
  if (l.shardDim >= 0) {
    l.axis = b.shard_axis() ? b.shard_axis()->str() : "";
    GroupPosition pos = findGroupPosition(*artifact.root(), l.axis, rank);
    if (!pos.group)
      return error("no rank group of shard axis '", l.axis, "' contains rank ",
                   rank);
    l.index = pos.index;
    l.count = pos.size;
  }
  for (size_t d = 0; d < l.local.size(); ++d) {
    bool split = int(d) == l.shardDim;
    if ((split && l.global[d] % l.count) ||
        l.local[d] != (split ? l.global[d] / l.count : l.global[d]))
      return error("local shape ", shapeString(l.local), " is not a 1/",
                   l.count, " shard along dim ", l.shardDim,
                   " of global shape ", shapeString(l.global));
  }
  if (l.count == 1) {
    l.shardDim = -1;
    l.index = 0;
  }
  return l;
}

/// Buffer `index` of `program`, or null when out of range (-1: none).
const fb::Buffer *bufferAt(const fb::Program &program, int index) {
  return index >= 0 && index < int(program.buffers()->size())
             ? program.buffers()->Get(flatbuffers::uoffset_t(index))
             : nullptr;
}

/// A flat 1/dp shard of `viewNumel` elements (a bucket) of this rank's dp
/// group: distributed-optimizer state, loadable only where it was saved.
TensorLayout bucketShardLayout(const LoadedArtifact &artifact,
                               std::vector<int64_t> local, int64_t viewNumel,
                               std::string bucket, int rank) {
  TensorLayout l;
  l.local = l.global = std::move(local);
  l.reshardable = false;
  l.distOpt = true;
  l.param = std::move(bucket);
  if (l.local.size() == 1) {
    GroupPosition dp = findGroupPosition(*artifact.root(), "dp", rank);
    if (viewNumel == l.local[0] * dp.size) {
      l.global = {viewNumel};
      l.shardDim = 0;
      l.axis = "dp";
      l.index = dp.index;
      l.count = dp.size;
    }
  }
  return l;
}

StatusOr<TensorLayout> layoutOf(const LoadedArtifact &artifact,
                                const fb::Program &program, const fb::Buffer &b,
                                int rank) {
  switch (b.kind()) {
  case fb::BufferKind::Param:
    return paramLayout(artifact, b, rank);
  case fb::BufferKind::MainParam: {
    std::vector<int64_t> local = toVector(b.shape());
    const fb::Buffer *of = bufferAt(program, b.of());
    if (of && of->kind() == fb::BufferKind::Param &&
        toVector(of->shape()) == local) {
      // Per-parameter main params take their parameter's layout (and
      // reshard with it), like per-parameter Adam state.
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               paramLayout(artifact, *of, rank));
      l.param = nameOf(*of);
      return l;
    }
    std::string name = nameOf(b);
    if (startsWith(name, kBucketMainPrefix) && local.size() == 1) {
      // This rank's 1/dp of a parameter bucket: the same layout as the
      // distributed optimizer's Adam state of the bucket. It is that by
      // construction, so the bucket's view need not exist.
      GroupPosition dp = findGroupPosition(*artifact.root(), "dp", rank);
      return bucketShardLayout(artifact, local, local[0] * dp.size,
                               name.substr(kMainPrefix.size()), rank);
    }
    TensorLayout l;
    l.local = l.global = local;
    l.reshardable = false;
    l.param = of ? nameOf(*of) : "";
    return l;
  }
  case fb::BufferKind::OptState: {
    const fb::Buffer *of = bufferAt(program, b.of());
    std::vector<int64_t> local = toVector(b.shape());
    // State kept per main param: the main param's layout.
    if (of && of->kind() == fb::BufferKind::MainParam) {
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               layoutOf(artifact, program, *of, rank));
      if (l.local == local)
        return l;
    }
    if (of && of->kind() == fb::BufferKind::Param &&
        toVector(of->shape()) == local) {
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l,
                               paramLayout(artifact, *of, rank));
      l.param = nameOf(*of);
      return l;
    }
    // A flat shard of a bucket view (the distributed optimizer) or state of
    // an unknown layout: only loadable where it was saved.
    if (of && of->kind() == fb::BufferKind::View)
      return bucketShardLayout(artifact, local, numElements(of->shape()),
                               nameOf(*of), rank);
    TensorLayout l;
    l.local = l.global = local;
    l.reshardable = false;
    l.param = of ? nameOf(*of) : "";
    return l;
  }
  default: {
    TensorLayout l;
    l.local = l.global = toVector(b.shape());
    return l;
  }
  }
}

/// The bucket views the optimizer state of `program` shards, with the
/// parameters laid out in each.
std::vector<ManifestBucket> bucketLayouts(const fb::Program &program) {
  std::vector<ManifestBucket> out;
  std::set<int> views;
  const auto &buffers = *program.buffers();
  for (const fb::Buffer *b : buffers)
    if (b->kind() == fb::BufferKind::OptState && b->of() >= 0 &&
        b->of() < int(buffers.size()) &&
        buffers.Get(flatbuffers::uoffset_t(b->of()))->kind() ==
            fb::BufferKind::View)
      views.insert(b->of());
  // Main params of parameter buckets name their bucket's view.
  for (const fb::Buffer *b : buffers)
    if (b->kind() == fb::BufferKind::MainParam &&
        startsWith(nameOf(*b), kBucketMainPrefix))
      for (flatbuffers::uoffset_t v = 0; v < buffers.size(); ++v)
        if (buffers.Get(v)->kind() == fb::BufferKind::View &&
            nameOf(*buffers.Get(v)) == nameOf(*b).substr(kMainPrefix.size()))
          views.insert(int(v));
  for (int v : views) {
    const fb::Buffer &view = *buffers.Get(flatbuffers::uoffset_t(v));
    ManifestBucket bucket;
    bucket.stage = program.pp_rank();
    bucket.name = nameOf(view);
    bucket.numel = numElements(view.shape());
    int64_t es = dtypeSize(view.dtype());
    int64_t begin = view.offset(), end = begin + bucket.numel * es;
    for (const fb::Buffer *p : buffers) {
      if (p->kind() != fb::BufferKind::Param)
        continue;
      int64_t bytes = numElements(p->shape()) * dtypeSize(p->dtype());
      if (p->offset() >= begin && p->offset() + bytes <= end)
        bucket.params.emplace_back(nameOf(*p), (p->offset() - begin) / es,
                                   numElements(p->shape()));
    }
    std::sort(bucket.params.begin(), bucket.params.end(),
              [](const auto &a, const auto &b) {
                return std::get<1>(a) < std::get<1>(b);
              });
    out.push_back(std::move(bucket));
  }
  return out;
}

int meshSize(const fb::Artifact &a, std::string_view axis, int fallback) {
  if (a.mesh())
    for (const fb::MeshAxis *m : *a.mesh())
      if (m->name() && m->name()->string_view() == axis)
        return m->size();
  return fallback;
}

int ppStage(const fb::Artifact &a, int rank) {
  GroupPosition pp = findGroupPosition(a, "pp", rank);
  return pp.group ? pp.index : 0;
}

} // namespace

std::string CheckpointManifest::configString() const {
  std::string s = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                  " dp=" + std::to_string(dp);
  if (cp > 1)
    s += " cp=" + std::to_string(cp);
  if (vpp > 1)
    s += " vpp=" + std::to_string(vpp);
  s += ", world " + std::to_string(worldSize);
  if (distributedOptimizer)
    s += ", distributed optimizer";
  return s;
}

StatusOr<CheckpointManifest> describeCheckpoint(const LoadedArtifact &artifact,
                                                const CheckpointRunInfo &info) {
  const fb::Artifact &a = *artifact.root();
  CheckpointManifest m;
  m.iteration = info.iteration;
  m.seed = info.seed;
  m.datasetPrefix = info.datasetPrefix;
  m.datasetTokens = info.datasetTokens;
  m.model = a.model() ? a.model()->str() : "";
  m.artifact = artifact.name();
  m.producer = a.producer() ? a.producer()->str() : "";
  m.compileFlags = a.compile_flags() ? a.compile_flags()->str() : "";
  m.worldSize = a.world_size();
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      m.mesh.emplace_back(axis->name() ? axis->name()->str() : "",
                          axis->size());
  m.order = a.order() ? a.order()->str() : "";
  m.tp = meshSize(a, "tp", findGroupPosition(a, "tp", 0).size);
  m.dp = meshSize(a, "dp", findGroupPosition(a, "dp", 0).size);
  m.pp = meshSize(a, "pp", findGroupPosition(a, "pp", 0).size);
  m.cp = meshSize(a, "cp", 1);
  m.vpp = a.programs() && a.programs()->size()
              ? std::max(1, a.programs()->Get(0)->num_chunks())
              : 1;
  if (const fb::Batch *b = a.batch()) {
    m.microBatch = b->micro_batch_size();
    m.globalBatch = b->global_batch_size();
    m.numMicrobatches = b->num_microbatches();
  }
  m.consumedSamples = m.iteration * m.globalBatch;
  if (const fb::Optimizer *o = a.optimizer()) {
    m.optimizer = o->kind() ? o->kind()->str() : "";
    m.lr = o->lr();
    m.beta1 = o->beta1();
    m.beta2 = o->beta2();
    m.eps = o->eps();
    m.weightDecay = o->weight_decay();
  }
  if (a.groups())
    for (const fb::RankGroup *g : *a.groups())
      m.groups[g->kind() ? g->kind()->str() : ""].push_back(
          g->ranks() ? std::vector<int>(g->ranks()->begin(), g->ranks()->end())
                     : std::vector<int>());

  std::map<std::string, size_t> byName;
  for (int r = 0; r < a.world_size(); ++r) {
    const fb::Program *p = artifact.programForWorldRank(r);
    if (!p)
      return invalidArgument(artifact.name(), ": no program for rank ", r);
    for (const fb::Buffer *b : *p->buffers()) {
      if (!isSavedKind(b->kind()))
        continue;
      TESSERA_ASSIGN_OR_RETURN(TensorLayout l, layoutOf(artifact, *p, *b, r));
      std::string name = nameOf(*b);
      ManifestTensor *t = nullptr;
      if (l.reshardable) {
        auto it = byName.find(name);
        if (it != byName.end()) {
          t = &m.tensors[it->second];
          if (t->globalShape != l.global || t->dtype != b->dtype() ||
              t->kind != b->kind() || t->numShards != l.count ||
              t->shardDim != l.shardDim)
            return invalidArgument(
                artifact.name(), ": buffer '", name,
                "' has different layouts on different ranks (global shape ",
                shapeString(t->globalShape), " vs ", shapeString(l.global),
                ")");
        }
      }
      if (!t) {
        ManifestTensor nt;
        nt.name = name;
        nt.kind = b->kind();
        nt.dtype = b->dtype();
        nt.shape = l.local;
        nt.globalShape = l.global;
        nt.shardDim = l.shardDim;
        nt.shardAxis = l.shardDim >= 0 ? l.axis : "";
        nt.numShards = l.count;
        nt.param = l.param;
        nt.reshardable = l.reshardable;
        nt.distributedOptimizer = l.distOpt;
        nt.stage = l.reshardable ? -1 : ppStage(a, r);
        m.distributedOptimizer |= l.distOpt;
        if (l.reshardable)
          byName[name] = m.tensors.size();
        m.tensors.push_back(std::move(nt));
        t = &m.tensors.back();
      }
      t->holders.emplace_back(r, l.index);
    }
  }
  for (const fb::Program *p : *a.programs())
    for (ManifestBucket &bucket : bucketLayouts(*p))
      m.buckets.push_back(std::move(bucket));
  return m;
}

//===----------------------------------------------------------------------===//
// Manifest JSON
//===----------------------------------------------------------------------===//

/// The double nearest to the float `v` printed shortest (0.001, not
/// 0.0010000000474974513).
static double shortest(double v) {
  float f = float(v);
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, double(f));
    if (float(std::strtod(buf, nullptr)) == f)
      break;
  }
  return std::strtod(buf, nullptr);
}

std::string manifestToJson(const CheckpointManifest &m) {
  using json = nlohmann::ordered_json;
  json j;
  j["format"] = "tessera-checkpoint";
  j["format_version"] = m.formatVersion;
  j["iteration"] = m.iteration;
  j["model"] = m.model;
  j["artifact"] = m.artifact;
  j["producer"] = m.producer;
  j["compile_flags"] = m.compileFlags;
  j["world_size"] = m.worldSize;
  json mesh = json::array();
  for (const auto &[name, size] : m.mesh)
    mesh.push_back({{"name", name}, {"size", size}});
  j["mesh"] = mesh;
  j["order"] = m.order;
  j["parallel"] = {
      {"tp", m.tp},   {"pp", m.pp},
      {"dp", m.dp},   {"cp", m.cp},
      {"vpp", m.vpp}, {"distributed_optimizer", m.distributedOptimizer}};
  j["batch"] = {{"micro_batch_size", m.microBatch},
                {"global_batch_size", m.globalBatch},
                {"num_microbatches", m.numMicrobatches}};
  j["optimizer"] = {
      {"kind", m.optimizer},        {"lr", shortest(m.lr)},
      {"beta1", shortest(m.beta1)}, {"beta2", shortest(m.beta2)},
      {"eps", shortest(m.eps)},     {"weight_decay", shortest(m.weightDecay)}};
  j["data"] = {{"iteration", m.iteration},
               {"consumed_samples", m.consumedSamples},
               {"seed", m.seed},
               {"dataset", m.datasetPrefix},
               {"dataset_tokens", m.datasetTokens}};
  json groups = json::object();
  for (const auto &[kind, instances] : m.groups)
    groups[kind] = instances;
  j["groups"] = groups;
  json files = json::array();
  for (const ManifestShardFile &f : m.files)
    files.push_back({{"rank", f.rank},
                     {"file", f.file},
                     {"bytes", f.bytes},
                     {"crc32", f.crc}});
  j["shard_files"] = files;
  json buffers = json::array();
  for (const ManifestTensor &t : m.tensors) {
    json b;
    b["name"] = t.name;
    b["kind"] = fb::EnumNameBufferKind(t.kind);
    b["dtype"] = fb::EnumNameDType(t.dtype);
    b["shape"] = t.shape;
    b["global_shape"] = t.globalShape;
    b["shard_dim"] = t.shardDim;
    b["shard_axis"] = t.shardAxis;
    b["num_shards"] = t.numShards;
    if (!t.param.empty())
      b["param"] = t.param;
    b["reshardable"] = t.reshardable;
    if (t.distributedOptimizer)
      b["distributed_optimizer"] = true;
    if (t.stage >= 0)
      b["stage"] = t.stage;
    json holders = json::array();
    for (const auto &[rank, index] : t.holders)
      holders.push_back({rank, index});
    b["shards"] = holders;
    buffers.push_back(std::move(b));
  }
  j["buffers"] = buffers;
  json buckets = json::array();
  for (const ManifestBucket &bucket : m.buckets) {
    json params = json::array();
    for (const auto &[name, offset, numel] : bucket.params)
      params.push_back({name, offset, numel});
    buckets.push_back({{"stage", bucket.stage},
                       {"name", bucket.name},
                       {"numel", bucket.numel},
                       {"params", params}});
  }
  j["buckets"] = buckets;
  // One line per key, and per element of the long lists.
  std::string out = "{\n";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out += std::string(first ? "" : ",\n") + " " + json(it.key()).dump() + ": ";
    first = false;
    const json &v = it.value();
    if (v.is_array() && !v.empty() &&
        (it.key() == "shard_files" || it.key() == "buffers" ||
         it.key() == "buckets")) {
      out += "[\n";
      for (size_t i = 0; i < v.size(); ++i)
        out += "  " + v[i].dump() + (i + 1 < v.size() ? ",\n" : "\n");
      out += " ]";
    } else {
      out += v.dump();
    }
  }
  return out + "\n}\n";
}

namespace {

template <typename Enum>
bool enumFromName(const std::string &name, const Enum *values,
                  const char *const *names, size_t count, Enum &out) {
  for (size_t i = 0; i < count; ++i)
    if (name == names[i]) {
      out = values[i];
      return true;
    }
  return false;
}

struct ManifestError {
  std::string message;
};

} // namespace

StatusOr<CheckpointManifest> parseManifest(const std::string &text,
                                           const std::string &fileName) {
  using json = nlohmann::json;
  CheckpointManifest m;
  try {
    json j = json::parse(text);
    auto fail = [](auto &&...args) {
      throw ManifestError{detail::concat(args...)};
    };
    if (!j.is_object() || j.value("format", "") != "tessera-checkpoint")
      fail("not a Tessera checkpoint manifest (no \"format\": "
           "\"tessera-checkpoint\")");
    m.formatVersion = j.at("format_version").get<int>();
    if (m.formatVersion != ckpt::kManifestFormatVersion)
      fail("unsupported manifest format version ", m.formatVersion,
           " (this runtime supports version ", ckpt::kManifestFormatVersion,
           ")");
    m.iteration = j.at("iteration").get<int64_t>();
    m.model = j.at("model").get<std::string>();
    m.artifact = j.value("artifact", "");
    m.producer = j.value("producer", "");
    m.compileFlags = j.value("compile_flags", "");
    m.worldSize = j.at("world_size").get<int>();
    for (const json &axis : j.at("mesh"))
      m.mesh.emplace_back(axis.at("name").get<std::string>(),
                          axis.at("size").get<int>());
    m.order = j.value("order", "");
    const json &par = j.at("parallel");
    m.tp = par.at("tp").get<int>();
    m.pp = par.at("pp").get<int>();
    m.dp = par.at("dp").get<int>();
    m.cp = par.value("cp", 1);
    m.vpp = par.value("vpp", 1);
    m.distributedOptimizer = par.value("distributed_optimizer", false);
    const json &batch = j.at("batch");
    m.microBatch = batch.at("micro_batch_size").get<int64_t>();
    m.globalBatch = batch.at("global_batch_size").get<int64_t>();
    m.numMicrobatches = batch.at("num_microbatches").get<int64_t>();
    const json &opt = j.at("optimizer");
    m.optimizer = opt.at("kind").get<std::string>();
    m.lr = opt.value("lr", 0.0);
    m.beta1 = opt.value("beta1", 0.0);
    m.beta2 = opt.value("beta2", 0.0);
    m.eps = opt.value("eps", 0.0);
    m.weightDecay = opt.value("weight_decay", 0.0);
    const json &data = j.at("data");
    m.consumedSamples = data.at("consumed_samples").get<int64_t>();
    m.seed = data.at("seed").get<uint64_t>();
    m.datasetPrefix = data.value("dataset", "");
    m.datasetTokens = data.value("dataset_tokens", int64_t(-1));
    if (j.contains("groups"))
      for (const auto &[kind, instances] : j.at("groups").items())
        m.groups[kind] = instances.get<std::vector<std::vector<int>>>();
    if (m.worldSize < 1)
      fail("world_size ", m.worldSize, " < 1");
    for (const json &f : j.at("shard_files")) {
      ManifestShardFile sf;
      sf.rank = f.at("rank").get<int>();
      sf.file = f.at("file").get<std::string>();
      sf.bytes = f.at("bytes").get<uint64_t>();
      sf.crc = f.at("crc32").get<uint32_t>();
      if (sf.rank != int(m.files.size()) || sf.file != shardFileName(sf.rank))
        fail("shard_files entry ", m.files.size(), " is rank ", sf.rank,
             " file '", sf.file, "' (expected rank ", m.files.size(), " file '",
             shardFileName(int(m.files.size())), "')");
      m.files.push_back(sf);
    }
    if (int(m.files.size()) != m.worldSize)
      fail("lists ", m.files.size(), " shard files for world size ",
           m.worldSize);
    for (const json &b : j.at("buffers")) {
      ManifestTensor t;
      t.name = b.at("name").get<std::string>();
      std::string kind = b.at("kind").get<std::string>();
      std::string dtype = b.at("dtype").get<std::string>();
      if (!enumFromName(kind, fb::EnumValuesBufferKind(),
                        fb::EnumNamesBufferKind(),
                        size_t(fb::BufferKind::MAX) + 1, t.kind))
        fail("buffer '", t.name, "' has unknown kind '", kind, "'");
      if (!enumFromName(dtype, fb::EnumValuesDType(), fb::EnumNamesDType(),
                        size_t(fb::DType::MAX) + 1, t.dtype))
        fail("buffer '", t.name, "' has unknown dtype '", dtype, "'");
      t.shape = b.at("shape").get<std::vector<int64_t>>();
      t.globalShape = b.at("global_shape").get<std::vector<int64_t>>();
      t.shardDim = b.at("shard_dim").get<int>();
      t.shardAxis = b.value("shard_axis", "");
      t.numShards = b.at("num_shards").get<int>();
      t.param = b.value("param", "");
      t.reshardable = b.value("reshardable", true);
      t.distributedOptimizer = b.value("distributed_optimizer", false);
      t.stage = b.value("stage", -1);
      for (const json &h : b.at("shards"))
        t.holders.emplace_back(h.at(0).get<int>(), h.at(1).get<int>());
      if (t.numShards < 1 || t.shardDim >= int(t.globalShape.size()) ||
          t.shape.size() != t.globalShape.size() ||
          (t.numShards > 1 && t.shardDim < 0))
        fail("buffer '", t.name, "' has an inconsistent layout");
      for (int64_t d : t.globalShape)
        if (d < 0)
          fail("buffer '", t.name, "' has a negative dimension");
      if (t.numShards > 1 && t.globalShape[size_t(t.shardDim)] % t.numShards)
        fail("buffer '", t.name, "': dimension ", t.shardDim, " of ",
             shapeString(t.globalShape), " is not divisible by ", t.numShards,
             " shards");
      for (const auto &[rank, index] : t.holders)
        if (rank < 0 || rank >= m.worldSize || index < 0 ||
            index >= t.numShards)
          fail("buffer '", t.name, "' lists shard ", index, " on rank ", rank);
      m.tensors.push_back(std::move(t));
    }
    if (j.contains("buckets"))
      for (const json &b : j.at("buckets")) {
        ManifestBucket bucket;
        bucket.stage = b.at("stage").get<int>();
        bucket.name = b.at("name").get<std::string>();
        bucket.numel = b.at("numel").get<int64_t>();
        for (const json &p : b.at("params"))
          bucket.params.emplace_back(p.at(0).get<std::string>(),
                                     p.at(1).get<int64_t>(),
                                     p.at(2).get<int64_t>());
        m.buckets.push_back(std::move(bucket));
      }
  } catch (const ManifestError &e) {
    return dataLoss(fileName, ": invalid manifest: ", e.message);
  } catch (const std::exception &e) {
    return dataLoss(fileName, ": invalid manifest: ", e.what());
  }
  return m;
}

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

int64_t TensorBox::volume() const {
  int64_t v = 1;
  for (size_t d = 0; d < lo.size(); ++d)
    v *= std::max<int64_t>(0, hi[d] - lo[d]);
  return v;
}

TensorBox shardBox(const std::vector<int64_t> &globalShape, int dim, int index,
                   int count) {
  TensorBox box;
  box.lo.assign(globalShape.size(), 0);
  box.hi = globalShape;
  if (dim >= 0 && dim < int(globalShape.size()) && count > 1) {
    int64_t size = globalShape[size_t(dim)] / count;
    box.lo[size_t(dim)] = size * index;
    box.hi[size_t(dim)] = size * (index + 1);
  }
  return box;
}

static bool intersectBoxes(const TensorBox &a, const TensorBox &b,
                           TensorBox &out) {
  out.lo.resize(a.lo.size());
  out.hi.resize(a.lo.size());
  for (size_t d = 0; d < a.lo.size(); ++d) {
    out.lo[d] = std::max(a.lo[d], b.lo[d]);
    out.hi[d] = std::min(a.hi[d], b.hi[d]);
    if (out.lo[d] >= out.hi[d])
      return false;
  }
  return true;
}

void copyTensorBox(const uint8_t *src, const TensorBox &srcBox, uint8_t *dst,
                   const TensorBox &dstBox, const TensorBox &region,
                   int64_t elementSize) {
  size_t rank = region.lo.size();
  if (srcBox == region && dstBox == region) {
    std::memcpy(dst, src, size_t(region.volume() * elementSize));
    return;
  }
  if (rank == 0) {
    std::memcpy(dst, src, size_t(elementSize));
    return;
  }
  // Row-major strides (elements) of both boxes.
  std::vector<int64_t> srcStride(rank, 1), dstStride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    srcStride[d - 1] = srcStride[d] * (srcBox.hi[d] - srcBox.lo[d]);
    dstStride[d - 1] = dstStride[d] * (dstBox.hi[d] - dstBox.lo[d]);
  }
  int64_t run = (region.hi[rank - 1] - region.lo[rank - 1]) * elementSize;
  std::vector<int64_t> idx(region.lo.begin(), region.lo.end());
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      s += (idx[d] - srcBox.lo[d]) * srcStride[d];
      t += (idx[d] - dstBox.lo[d]) * dstStride[d];
    }
    std::memcpy(dst + t * elementSize, src + s * elementSize, size_t(run));
    // Next index over the leading dimensions.
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < region.hi[d])
        break;
      idx[d] = region.lo[d];
      if (d == 0)
        return;
    }
    if (rank == 1)
      return;
  }
}

//===----------------------------------------------------------------------===//
// Locating
//===----------------------------------------------------------------------===//

StatusOr<CheckpointLocation> locateCheckpoint(const std::string &dirIn) {
  std::string dir = dirIn;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (!isDirectory(dir))
    return notFound(dir, ": no checkpoint directory (", std::strerror(ENOENT),
                    ")");
  CheckpointLocation loc;
  if (pathExists(dir + "/manifest.json")) {
    loc.dir = dir;
    return loc;
  }
  std::string latest = dir + "/latest";
  if (pathExists(latest)) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, readWholeFile(latest));
    while (!text.empty() &&
           std::isspace(static_cast<unsigned char>(text.back())))
      text.pop_back();
    char *end = nullptr;
    errno = 0;
    long long it = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || it < 0)
      return dataLoss(latest, ": expected an iteration number, got '", text,
                      "'");
    loc.iteration = it;
    loc.dir = dir + "/" + iterationDirName(it);
    if (!isDirectory(loc.dir))
      return dataLoss(latest, " names iteration ", it, ", but ", loc.dir,
                      " does not exist");
    return loc;
  }
  std::string base = dir.substr(dir.find_last_of('/') + 1);
  if (base.rfind("iter_", 0) == 0)
    return dataLoss(dir, "/manifest.json: missing: the checkpoint is "
                         "incomplete (its save was interrupted?)");
  return notFound(dir, ": no checkpoint (neither ", latest, " nor ", dir,
                  "/manifest.json exists)");
}

StatusOr<CheckpointManifest> readManifest(const CheckpointLocation &loc) {
  std::string path = loc.dir + "/manifest.json";
  if (!pathExists(path))
    return dataLoss(path, ": missing: the checkpoint is incomplete (its save "
                          "was interrupted?)");
  TESSERA_ASSIGN_OR_RETURN(std::string text, readWholeFile(path));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, parseManifest(text, path));
  if (loc.iteration >= 0 && m.iteration != loc.iteration)
    return dataLoss(path, ": records iteration ", m.iteration, ", but ",
                    parentDirectory(loc.dir), "/latest names ", loc.iteration);
  return m;
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

namespace {

/// Why the seed still matters once the checkpoint is loaded ("" if it does
/// not).
std::string seedDependence(const LoadedArtifact &artifact, bool loadOptimizer) {
  for (const fb::Program *p : *artifact.root()->programs()) {
    if (p->inputs())
      for (const fb::InputSpec *spec : *p->inputs())
        if (!isTokenInput(*spec))
          return "the synthetic input '" +
                 (spec->name() ? spec->name()->str() : std::string()) +
                 "' is drawn from it";
    if (p->functions())
      for (const fb::Function *fn : *p->functions())
        if (fn->instrs())
          for (const fb::Instr *in : *fn->instrs())
            if (in->op() == fb::Opcode::Dropout)
              return "the model has dropout, whose masks are keyed by it";
    for (const fb::Buffer *b : *p->buffers()) {
      bool restored = b->kind() == fb::BufferKind::Param ||
                      b->kind() == fb::BufferKind::Iteration ||
                      (loadOptimizer && b->kind() == fb::BufferKind::OptState);
      if (!restored && (b->init() == fb::InitKind::Normal ||
                        b->init() == fb::InitKind::Uniform))
        return "buffer '" + nameOf(*b) +
               "' is initialised from it and not restored";
    }
  }
  return "";
}

/// The members of the instance of group `kind` holding `rank` in the
/// manifest and the rank's index in it (null when no instance holds it).
const std::vector<int> *manifestGroup(const CheckpointManifest &m,
                                      const std::string &kind, int rank,
                                      int *index = nullptr) {
  auto it = m.groups.find(kind);
  if (it == m.groups.end())
    return nullptr;
  for (const std::vector<int> &members : it->second)
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank) {
        if (index)
          *index = int(i);
        return &members;
      }
  return nullptr;
}

int manifestStage(const CheckpointManifest &m, int rank) {
  int index = 0;
  return manifestGroup(m, "pp", rank, &index) ? index : 0;
}

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

/// A saved distributed-optimizer bucket shard: "<prefix><bucket>" of one
/// rank, 1/dp of the bucket's flat elements.
bool isBucketShard(const ManifestTensor &t) {
  return t.distributedOptimizer && !t.reshardable && t.holders.size() == 1 &&
         t.globalShape.size() == 1 && t.shardDim == 0 && !t.param.empty() &&
         t.name.size() > t.param.size() && endsWith(t.name, t.param);
}

/// The checkpoint's tensors by name, as the planner reshards them: the
/// reshardable ones, plus per-parameter views of the distributed
/// optimizer's state. Bucket shard "<prefix><bucket>" (prefix "adam.exp_avg:",
/// "adam.exp_avg_sq:", "main:", ...) holds, for every parameter P laid out
/// in the bucket at [start, start + numel), part of the flattened local
/// state "<prefix>P" of P's shard on that rank; the dp group of a holder of
/// P's shard j together holds all of it. The views take P's layout; the
/// runs assemble shard j from the bucket shards of one such dp group (the
/// loading rank's own, when it is one).
struct SavedTensors {
  std::map<std::string, const ManifestTensor *> byName;
  std::deque<ManifestTensor> views;
  std::map<std::pair<std::string, int>, std::vector<FlatRun>> runs;
};

SavedTensors savedTensors(const CheckpointManifest &m, int preferRank) {
  SavedTensors s;
  for (const ManifestTensor &t : m.tensors)
    if (t.reshardable)
      s.byName[t.name] = &t;
  // Bucket shards by (name, stage, rank), and the prefixes of each bucket.
  std::map<std::tuple<std::string, int, int>, const ManifestTensor *> shards;
  std::map<std::pair<int, std::string>, std::map<std::string, fb::BufferKind>>
      prefixes;
  for (const ManifestTensor &t : m.tensors)
    if (isBucketShard(t)) {
      shards[{t.name, t.stage, t.holders[0].first}] = &t;
      prefixes[{t.stage, t.param}][t.name.substr(
          0, t.name.size() - t.param.size())] = t.kind;
    }
  for (const ManifestBucket &bucket : m.buckets) {
    auto pre = prefixes.find({bucket.stage, bucket.name});
    if (pre == prefixes.end())
      continue;
    for (const auto &[param, start, numel] : bucket.params) {
      auto pit = s.byName.find(param);
      if (pit == s.byName.end() || pit->second->kind != fb::BufferKind::Param)
        continue;
      const ManifestTensor &p = *pit->second;
      for (const auto &[prefix, kind] : pre->second) {
        std::string name = prefix + param;
        // Per-parameter state saved as such, or a view made from another
        // stage's bucket (a parameter shared across stages).
        if (s.byName.count(name))
          continue;
        ManifestTensor view;
        std::map<int, std::vector<FlatRun>> runsOf;
        for (int j = 0; j < p.numShards; ++j) {
          // Holders of shard j on this bucket's stage; the one whose dp
          // group holds the loading rank first.
          std::vector<int> holders;
          for (const auto &[q, index] : p.holders)
            if (index == j && manifestStage(m, q) == bucket.stage)
              holders.push_back(q);
          std::sort(holders.begin(), holders.end());
          std::stable_partition(holders.begin(), holders.end(), [&](int q) {
            const std::vector<int> *g = manifestGroup(m, "dp", q);
            return g && std::count(g->begin(), g->end(), preferRank);
          });
          for (int q : holders) {
            const std::vector<int> *g = manifestGroup(m, "dp", q);
            std::vector<int> members = g ? *g : std::vector<int>{q};
            std::vector<FlatRun> runs;
            int64_t covered = 0;
            bool complete = true;
            for (int member : members) {
              auto sh = shards.find({prefix + bucket.name, bucket.stage,
                                     member});
              if (sh == shards.end()) {
                complete = false;
                break;
              }
              const ManifestTensor &t = *sh->second;
              int64_t n = t.globalShape[0], per = n / t.numShards;
              int64_t lo = per * t.holders[0].second, hi = lo + per;
              int64_t a = std::max(lo, start), b = std::min(hi, start + numel);
              if (n != bucket.numel) {
                complete = false;
                break;
              }
              if (a >= b)
                continue;
              runs.push_back({member, t.name, a - lo, a - start, b - a});
              covered += b - a;
              view.dtype = t.dtype;
            }
            if (complete && covered == numel) {
              runsOf[j] = std::move(runs);
              break;
            }
          }
        }
        // Only a view that has every shard of the parameter.
        if (int(runsOf.size()) != p.numShards)
          continue;
        view.name = name;
        view.kind = kind;
        view.shape = p.shape;
        view.globalShape = p.globalShape;
        view.shardDim = p.shardDim;
        view.shardAxis = p.shardAxis;
        view.numShards = p.numShards;
        view.param = param;
        view.distributedOptimizer = true;
        for (auto &[j, runs] : runsOf) {
          view.holders.emplace_back(runs.empty() ? 0 : runs[0].sourceRank, j);
          s.runs[{name, j}] = std::move(runs);
        }
        s.views.push_back(std::move(view));
        s.byName[name] = &s.views.back();
      }
    }
  }
  return s;
}

/// Same mesh and the same bucket layouts: distributed-optimizer state is
/// read back as saved, each rank its own shards.
bool sameBucketLayouts(const CheckpointManifest &m,
                       const CheckpointManifest &target) {
  bool sameMesh = m.worldSize == target.worldSize && m.mesh == target.mesh &&
                  m.order == target.order && m.vpp == target.vpp;
  if (!sameMesh)
    return false;
  auto sorted = [](std::vector<ManifestBucket> v) {
    std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
      return std::tie(a.stage, a.name) < std::tie(b.stage, b.name);
    });
    return v;
  };
  return sorted(m.buckets) == sorted(target.buckets);
}

struct ParamInfo {
  std::vector<int64_t> global;
  fb::DType dtype;
};

/// Parameter dtypes a checkpoint converts between on load.
bool convertibleDtypes(fb::DType a, fb::DType b) {
  auto isFloat = [](fb::DType t) {
    return t == fb::DType::F32 || t == fb::DType::BF16;
  };
  return isFloat(a) && isFloat(b);
}

Status checkCompatibility(const CheckpointManifest &m,
                          const CheckpointManifest &target,
                          const LoadedArtifact &artifact,
                          const CheckpointLoadOptions &o,
                          const std::string &dir,
                          std::vector<std::string> &notes) {
  const std::string ck = "checkpoint " + dir;
  const std::string art = artifact.name();
  // The parameter set and global shapes.
  std::map<std::string, ParamInfo> saved, wanted;
  for (const ManifestTensor &t : m.tensors)
    if (t.kind == fb::BufferKind::Param)
      saved[t.name] = {t.globalShape, t.dtype};
  for (const ManifestTensor &t : target.tensors)
    if (t.kind == fb::BufferKind::Param)
      wanted[t.name] = {t.globalShape, t.dtype};
  auto models = [&] {
    return " (the checkpoint's model '" + m.model + "' has " +
           std::to_string(saved.size()) + " parameters, the artifact's '" +
           target.model + "' " + std::to_string(wanted.size()) +
           "): a different model cannot be loaded";
  };
  for (const auto &[name, info] : wanted) {
    auto it = saved.find(name);
    if (it == saved.end())
      return failedPrecondition(ck, " has no parameter '", name, "' of ", art,
                                models());
    if (it->second.global != info.global)
      return failedPrecondition(
          "parameter '", name, "' has global shape ",
          shapeString(it->second.global), " in ", ck, " but ",
          shapeString(info.global), " in ", art,
          ": a different model (or vocabulary padding) cannot be loaded");
    if (it->second.dtype != info.dtype &&
        !convertibleDtypes(it->second.dtype, info.dtype))
      return failedPrecondition(
          "parameter '", name, "' is ", fb::EnumNameDType(it->second.dtype),
          " in ", ck, " but ", fb::EnumNameDType(info.dtype), " in ", art,
          ": only F32 and BF16 parameters convert into each other");
  }
  // F32 <-> BF16 (--bf16 on or off between save and load): converted, f32
  // to bf16 rounded to nearest even, bf16 to f32 exactly (see planRank for
  // the main params).
  std::set<std::string> savedMain;
  for (const auto &[name, t] : savedTensors(m, 0).byName)
    if (t->kind == fb::BufferKind::MainParam && t->dtype == fb::DType::F32)
      savedMain.insert(name);
  std::map<std::pair<fb::DType, fb::DType>, std::vector<std::string>> converted;
  for (const auto &[name, info] : wanted) {
    fb::DType from = saved.at(name).dtype;
    // BF16 -> F32 from the main params instead (noted by planRank).
    bool fromMain = from == fb::DType::BF16 && info.dtype == fb::DType::F32 &&
                    o.loadOptimizer &&
                    savedMain.count(std::string(kMainPrefix) + name);
    if (from != info.dtype && !fromMain)
      converted[{from, info.dtype}].push_back(name);
  }
  for (const auto &[types, names] : converted)
    notes.push_back(std::to_string(names.size()) + " parameter" +
                    (names.size() == 1 ? "" : "s") + " ('" + names.front() +
                    "'" + (names.size() > 1 ? ", ..." : "") +
                    ") converted from " + fb::EnumNameDType(types.first) +
                    " in the checkpoint to " + fb::EnumNameDType(types.second) +
                    (types.second == fb::DType::BF16
                         ? " (rounded to nearest even)"
                         : " (exact)"));
  for (const auto &entry : saved)
    if (!wanted.count(entry.first))
      return failedPrecondition(ck, " holds parameter '", entry.first,
                                "', which ", art, " does not have", models());
  if (m.model != target.model)
    notes.push_back("the checkpoint was saved from model '" + m.model +
                    "', the artifact's is '" + target.model +
                    "'; the parameters match");

  if (m.globalBatch != target.globalBatch)
    return failedPrecondition(
        ck, " was saved with global batch size ", m.globalBatch, ", ", art,
        " has ", target.globalBatch,
        ": the data position is addressed by iteration x global batch size, "
        "so changing it on resume is not supported");

  if (o.seed != m.seed) {
    std::string why = seedDependence(artifact, o.loadOptimizer);
    if (!why.empty())
      return failedPrecondition("--seed ", o.seed, " differs from the seed ",
                                m.seed, " of ", ck,
                                ", and the seed matters "
                                "after loading: ",
                                why, "; resume with --seed ", m.seed);
    notes.push_back("--seed " + std::to_string(o.seed) +
                    " differs from the checkpoint's " + std::to_string(m.seed) +
                    "; harmless here (token data, no dropout, every "
                    "seed-initialised buffer is restored)");
  }
  if (!o.datasetPrefix.empty() && !m.datasetPrefix.empty() &&
      o.datasetTokens >= 0 && m.datasetTokens >= 0 &&
      o.datasetTokens != m.datasetTokens)
    notes.push_back("the checkpoint was trained on " + m.datasetPrefix + " (" +
                    std::to_string(m.datasetTokens) +
                    " tokens), this run uses " + o.datasetPrefix + " (" +
                    std::to_string(o.datasetTokens) + " tokens)");

  if (!o.loadOptimizer)
    return Status();
  if (m.optimizer != target.optimizer)
    return failedPrecondition(
        ck, " was saved with optimizer '", m.optimizer, "', but ", art,
        " uses '", target.optimizer,
        "': its optimizer state cannot be loaded (pass --no-load-optim to "
        "load only the parameters)");
  // Distributed-optimizer state (Adam shards of buckets and the main params
  // of parameter buckets) reshards per parameter through the bucket layouts
  // of the manifest, which must therefore record every bucket it shards;
  // other state of an unknown layout loads only where it was saved.
  if (sameBucketLayouts(m, target))
    return Status();
  const std::string way =
      "; resume with the configuration that saved it, or pass "
      "--no-load-optim to load only the parameters";
  for (const ManifestTensor &t : m.tensors) {
    if (!isOptimizerKind(t.kind) || t.reshardable)
      continue;
    if (!isBucketShard(t))
      return failedPrecondition(
          ck, " holds optimizer state '", t.name, "' of an unknown layout (",
          m.configString(), "), which cannot be resharded to ", art, " (",
          target.configString(), ")", way);
    bool recorded = false;
    for (const ManifestBucket &b : m.buckets)
      recorded |= b.stage == t.stage && b.name == t.param &&
                  b.numel == t.globalShape[0];
    if (!recorded)
      return failedPrecondition(
          ck, " was saved with the distributed optimizer (", m.configString(),
          "), but its manifest records no layout of bucket '", t.param,
          "' of stage ", t.stage, " (", t.globalShape[0],
          " elements), which its state '", t.name,
          "' shards: it cannot be resharded to ", art, " (",
          target.configString(), ")", way);
  }
  return Status();
}

/// The plan of `rank` once the checkpoint `m` is known to be compatible
/// with `target` (the artifact's own description).
StatusOr<CheckpointLoadPlan> planRank(const CheckpointManifest &m,
                                      const CheckpointManifest &target,
                                      const LoadedArtifact &artifact, int rank,
                                      const CheckpointLoadOptions &o,
                                      const std::string &dir) {
  const fb::Artifact &a = *artifact.root();
  if (rank < 0 || rank >= a.world_size())
    return invalidArgument(artifact.name(), ": rank ", rank,
                           " outside world size ", a.world_size());
  CheckpointLoadPlan plan;
  plan.rank = rank;
  plan.targetConfig = target.configString();
  plan.resharded = m.worldSize != target.worldSize || m.mesh != target.mesh ||
                   m.vpp != target.vpp;

  const std::string ck = "checkpoint " + dir;
  const SavedTensors saved = savedTensors(m, rank);
  const std::map<std::string, const ManifestTensor *> &byName = saved.byName;
  const bool sameBuckets = sameBucketLayouts(m, target);
  const fb::Program *p = artifact.programForWorldRank(rank);
  if (!p)
    return invalidArgument(artifact.name(), ": no program for rank ", rank);
  std::set<int> sources;
  // Main params that "init" computes from the parameters instead, main
  // params taken from F32 parameters and F32 parameters taken from main
  // params (dtype changes between save and load).
  std::vector<std::string> mainFromInit, mainFromParams, paramsFromMain;

  // The pieces of saved tensor `t` (or of a view of distributed-optimizer
  // state) that make up `box`, which is `name`'s.
  auto addPieces = [&](const ManifestTensor &t, const TensorBox &box,
                       const std::string &name,
                       std::vector<RestorePiece> &pieces) -> Status {
    std::map<int, std::vector<int>> holdersOf; // shard index -> ranks
    for (const auto &[r, index] : t.holders)
      holdersOf[index].push_back(r);
    int64_t covered = 0;
    for (int j = 0; j < t.numShards; ++j) {
      auto h = holdersOf.find(j);
      if (h == holdersOf.end())
        return dataLoss(dir, "/manifest.json: no rank holds shard ", j, " of ",
                        t.numShards, " of '", name, "'");
      TensorBox src = shardBox(t.globalShape, t.shardDim, j, t.numShards);
      TensorBox region;
      if (!intersectBoxes(src, box, region))
        continue;
      covered += region.volume();
      auto runs = saved.runs.find({t.name, j});
      if (runs != saved.runs.end()) {
        // Assembled from bucket shards: always another layout.
        plan.resharded = true;
        RestorePiece piece{-1, t.name, src, region, t.dtype, {}};
        piece.runs = runs->second;
        for (const FlatRun &run : piece.runs)
          sources.insert(run.sourceRank);
        pieces.push_back(std::move(piece));
        continue;
      }
      // Prefer this rank's own file, then a file already being read.
      const std::vector<int> &ranks = h->second;
      int source = *std::min_element(ranks.begin(), ranks.end());
      for (int candidate : ranks)
        if (sources.count(candidate) && !sources.count(source))
          source = candidate;
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
        source = rank;
      if (!(src == box) || source != rank)
        plan.resharded = true;
      pieces.push_back({source, t.name, src, region, t.dtype, {}});
      sources.insert(source);
    }
    if (covered != box.volume())
      return dataLoss(dir, "/manifest.json: the shards of '", name,
                      "' do not cover ", shapeString(t.globalShape));
    return Status();
  };

  for (const fb::Buffer *b : *p->buffers()) {
    fb::BufferKind kind = b->kind();
    if (!isSavedKind(kind) || (isOptimizerKind(kind) && !o.loadOptimizer)) {
      if (kind == fb::BufferKind::MainParam)
        mainFromInit.push_back(nameOf(*b));
      continue;
    }
    BufferRestore br;
    br.name = nameOf(*b);
    br.kind = kind;
    br.dtype = b->dtype();
    if (kind == fb::BufferKind::Iteration) {
      if (b->dtype() != fb::DType::I64 || numElements(b->shape()) != 1)
        return invalidArgument(artifact.name(), ": iteration buffer '", br.name,
                               "' is not an i64 scalar");
      br.isIteration = true;
      plan.buffers.push_back(std::move(br));
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(TensorLayout l, layoutOf(artifact, *p, *b, rank));
    br.box = shardBox(l.global, l.shardDim, l.index, l.count);
    if (!l.reshardable) {
      // The same configuration and bucket layout: the same rank holds the
      // same tensor.
      const ManifestTensor *found = nullptr;
      for (const ManifestTensor &t : m.tensors)
        if (t.name == br.name && !t.reshardable)
          for (const auto &h : t.holders)
            if (h.first == rank)
              found = &t;
      bool flat = l.distOpt && l.local.size() == 1 &&
                  endsWith(br.name, l.param) && br.name.size() > l.param.size();
      if (found && (sameBuckets || !flat) && found->shape == l.local &&
          found->dtype == b->dtype() && found->stage == ppStage(a, rank)) {
        TensorBox whole = shardBox(l.local, -1, 0, 1);
        br.box = whole;
        br.pieces.push_back({rank, br.name, whole, whole, b->dtype(), {}});
        sources.insert(rank);
        plan.buffers.push_back(std::move(br));
        continue;
      }
      if (!flat)
        return failedPrecondition(
            ck, " holds no optimizer state '", br.name, "' of shape ",
            shapeString(l.local), " for rank ", rank,
            " (optimizer state of an unknown layout is only loadable into "
            "the configuration that saved it)");
      // A bucket shard of the distributed optimizer in another layout: the
      // parameters of the bucket (the target's own layout) that overlap
      // this rank's 1/dp of it, each from its per-parameter state.
      const std::string prefix =
          br.name.substr(0, br.name.size() - l.param.size());
      const ManifestBucket *bucket = nullptr;
      for (const ManifestBucket &bk : target.buckets)
        if (bk.stage == ppStage(a, rank) && bk.name == l.param)
          bucket = &bk;
      if (!bucket || l.count < 1 || bucket->numel != l.local[0] * l.count)
        return invalidArgument(artifact.name(), ": distributed-optimizer "
                               "state '", br.name, "' of rank ", rank,
                               " has no bucket layout of ", l.local[0],
                               " x ", l.count, " elements (bucket view '",
                               l.param, "')");
      const int64_t lo = l.local[0] * l.index, hi = lo + l.local[0];
      br.box = shardBox(l.local, -1, 0, 1);
      bool fromInit = false, fromParams = false;
      for (const auto &[param, start, numel] : bucket->params) {
        int64_t x = std::max(lo, start), y = std::min(hi, start + numel);
        if (x >= y)
          continue;
        const fb::Buffer *pb = nullptr;
        for (const fb::Buffer *c : *p->buffers())
          if (c->kind() == fb::BufferKind::Param && nameOf(*c) == param)
            pb = c;
        if (!pb)
          return invalidArgument(artifact.name(), ": bucket '", l.param,
                                 "' lists no parameter '", param, "'");
        TESSERA_ASSIGN_OR_RETURN(TensorLayout pl,
                                 paramLayout(artifact, *pb, rank));
        RestoreSegment seg;
        seg.param = param;
        seg.box = shardBox(pl.global, pl.shardDim, pl.index, pl.count);
        seg.begin = x - start;
        seg.end = y - start;
        seg.offset = x - lo;
        auto it = byName.find(prefix + param);
        if (it == byName.end() && kind == fb::BufferKind::MainParam) {
          // Saved without --bf16: the F32 parameter is exactly the main
          // param; otherwise "init" computes the shard.
          auto pt = byName.find(param);
          if (pt == byName.end() || pt->second->kind != fb::BufferKind::Param ||
              pt->second->dtype != fb::DType::F32) {
            fromInit = true;
            break;
          }
          it = pt;
          fromParams = true;
        }
        if (it == byName.end())
          return failedPrecondition(ck, " has no optimizer state '",
                                    prefix + param, "' (of parameter '", param,
                                    "') for '", br.name,
                                    "'; pass --no-load-optim to load only the "
                                    "parameters");
        const ManifestTensor &t = *it->second;
        if (t.dtype != b->dtype() || t.globalShape != pl.global ||
            (t.kind != kind && t.kind != fb::BufferKind::Param))
          return failedPrecondition(
              "buffer '", t.name, "' is ", fb::EnumNameBufferKind(t.kind), " ",
              fb::EnumNameDType(t.dtype), shapeString(t.globalShape), " in ",
              ck, " but the state of parameter '", param, "' in '", br.name,
              "' is ", fb::EnumNameBufferKind(kind), " ",
              fb::EnumNameDType(b->dtype()), shapeString(pl.global), " in ",
              artifact.name());
        TESSERA_RETURN_IF_ERROR(
            addPieces(t, seg.box, prefix + param, seg.pieces));
        br.segments.push_back(std::move(seg));
      }
      if (fromInit) {
        mainFromInit.push_back(br.name);
        continue;
      }
      if (fromParams)
        mainFromParams.push_back(br.name);
      plan.resharded = true;
      plan.buffers.push_back(std::move(br));
      continue;
    }
    auto it = byName.find(br.name);
    if (kind == fb::BufferKind::MainParam && it == byName.end()) {
      // Saved without --bf16: the F32 parameter is exactly the main param
      // (its rounding is the BF16 parameter); otherwise "init" computes it.
      auto param = byName.find(l.param);
      if (param == byName.end() ||
          param->second->kind != fb::BufferKind::Param ||
          param->second->dtype != fb::DType::F32) {
        mainFromInit.push_back(br.name);
        continue;
      }
      it = param;
      mainFromParams.push_back(br.name);
    }
    if (kind == fb::BufferKind::Param && it != byName.end() &&
        it->second->dtype == fb::DType::BF16 && b->dtype() == fb::DType::F32 &&
        o.loadOptimizer) {
      // Saved with --bf16, loaded without: the fp32 main param holds the
      // value the BF16 parameter was rounded from.
      auto main = byName.find(std::string(kMainPrefix) + br.name);
      if (main != byName.end() &&
          main->second->kind == fb::BufferKind::MainParam &&
          main->second->dtype == fb::DType::F32) {
        it = main;
        paramsFromMain.push_back(br.name);
      }
    }
    if (it == byName.end()) {
      if (kind == fb::BufferKind::OptState)
        return failedPrecondition(ck, " has no optimizer state '", br.name,
                                  "' (of parameter '", l.param,
                                  "'); pass --no-load-optim to load only the "
                                  "parameters");
      return failedPrecondition(ck, " has no parameter '", br.name, "'");
    }
    const ManifestTensor &t = *it->second;
    // Parameters convert between F32 and BF16; main params may come from
    // parameters and back (above).
    bool substitute = t.name != br.name;
    bool convert =
        kind == fb::BufferKind::Param && convertibleDtypes(t.dtype, b->dtype());
    if ((t.kind != kind && !substitute) ||
        (t.dtype != b->dtype() && !convert) || t.globalShape != l.global)
      return failedPrecondition(
          "buffer '", br.name, "' is ", fb::EnumNameBufferKind(t.kind), " ",
          fb::EnumNameDType(t.dtype), shapeString(t.globalShape), " in ", ck,
          " but ", fb::EnumNameBufferKind(kind), " ",
          fb::EnumNameDType(b->dtype()), shapeString(l.global), " in ",
          artifact.name());
    TESSERA_RETURN_IF_ERROR(addPieces(t, br.box, br.name, br.pieces));
    plan.buffers.push_back(std::move(br));
  }
  if (sources.count(rank))
    plan.sourceRanks.push_back(rank);
  for (int s : sources)
    if (s != rank)
      plan.sourceRanks.push_back(s);
  auto some = [](const std::vector<std::string> &names) {
    return std::to_string(names.size()) + " ('" + names.front() + "'" +
           (names.size() > 1 ? ", ..." : "") + ")";
  };
  if (!mainFromInit.empty())
    plan.notes.push_back("fp32 main params " + some(mainFromInit) +
                         (o.loadOptimizer
                              ? " are not in the checkpoint"
                              : " are optimizer state, not loaded") +
                         ": 'init' computes them from the loaded parameters");
  if (!mainFromParams.empty())
    plan.notes.push_back("fp32 main params " + some(mainFromParams) +
                         " restored from the checkpoint's F32 parameters");
  if (!paramsFromMain.empty())
    plan.notes.push_back("F32 parameters " + some(paramsFromMain) +
                         " restored from the checkpoint's fp32 main params");
  return plan;
}

/// The artifact's own description and the compatibility checks.
StatusOr<CheckpointManifest> checkedTarget(const CheckpointManifest &m,
                                           const LoadedArtifact &artifact,
                                           const CheckpointLoadOptions &o,
                                           const std::string &dir,
                                           std::vector<std::string> &notes) {
  CheckpointRunInfo info;
  info.seed = o.seed;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           describeCheckpoint(artifact, info));
  TESSERA_RETURN_IF_ERROR(
      checkCompatibility(m, target, artifact, o, dir, notes));
  return target;
}

} // namespace

StatusOr<CheckpointLoadPlan> planCheckpointLoad(const CheckpointManifest &m,
                                                const LoadedArtifact &artifact,
                                                int rank,
                                                const CheckpointLoadOptions &o,
                                                const std::string &dir) {
  std::vector<std::string> notes;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           checkedTarget(m, artifact, o, dir, notes));
  TESSERA_ASSIGN_OR_RETURN(CheckpointLoadPlan plan,
                           planRank(m, target, artifact, rank, o, dir));
  notes.insert(notes.end(), plan.notes.begin(), plan.notes.end());
  plan.notes = std::move(notes);
  return plan;
}

Status checkCheckpointForLaunch(const LoadedArtifact &artifact,
                                const std::string &dir,
                                const CheckpointLoadOptions &options) {
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation loc, locateCheckpoint(dir));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, readManifest(loc));
  std::vector<std::string> notes;
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest target,
                           checkedTarget(m, artifact, options, loc.dir, notes));
  std::set<int> needed;
  for (int r = 0; r < artifact.root()->world_size(); ++r) {
    TESSERA_ASSIGN_OR_RETURN(
        CheckpointLoadPlan plan,
        planRank(m, target, artifact, r, options, loc.dir));
    needed.insert(plan.sourceRanks.begin(), plan.sourceRanks.end());
  }
  for (int q : needed) {
    std::string path = loc.dir + "/" + shardFileName(q);
    TESSERA_ASSIGN_OR_RETURN(ShardHeader h, readShardHeader(path));
    const ManifestShardFile &f = m.files[size_t(q)];
    if (h.worldSize != m.worldSize || h.rank != q)
      return dataLoss(path, ": holds rank ", h.rank, " of world size ",
                      h.worldSize, ", but the manifest expects rank ", q,
                      " of ", m.worldSize);
    if (h.crc != f.crc || h.payloadSize + ckpt::kShardHeaderSize != f.bytes)
      return dataLoss(path, ": does not belong to this checkpoint (",
                      h.payloadSize + ckpt::kShardHeaderSize, " bytes, CRC-32 ",
                      hex32(h.crc), "; the manifest records ", f.bytes,
                      " bytes, CRC-32 ", hex32(f.crc), ")");
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Saving and loading
//===----------------------------------------------------------------------===//

StatusOr<CheckpointSaveResult> saveCheckpoint(const Executor &executor,
                                              const CheckpointSaveOptions &o,
                                              Communicator *world) {
  const LoadedArtifact &artifact = executor.artifact();
  const int rank = executor.worldRank();
  const int worldSize = artifact.root()->world_size();
  const int64_t iteration = o.info.iteration;
  std::string dir = o.dir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  const std::string iterDir = dir + "/" + iterationDirName(iteration);
  CheckpointSaveResult result;
  result.dir = iterDir;
  // Each step that waits for other ranks or the file system, for the
  // watchdog.
  using On = WaitMonitor::On;
  const std::string saving = "saving checkpoint iteration " +
                             std::to_string(iteration) + " to " + iterDir +
                             ": ";
  if (rank == 0) {
    WaitMonitor::Step step(o.monitor, saving + "preparing the directory",
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(makeDirectories(iterDir));
    // Re-saving an iteration: the old manifest goes first, so the
    // directory never looks complete with a mix of old and new shards.
    // Temporary files of a save that crashed.
    for (const std::string &d : {dir, iterDir})
      if (DIR *handle = ::opendir(d.c_str())) {
        while (dirent *e = ::readdir(handle))
          if (std::strstr(e->d_name, ".tmp."))
            ::unlink((d + "/" + e->d_name).c_str());
        ::closedir(handle);
      }
    std::string manifest = iterDir + "/manifest.json";
    if (pathExists(manifest)) {
      if (::unlink(manifest.c_str()) != 0)
        return dataLoss(manifest, ": cannot remove the previous manifest: ",
                        std::strerror(errno));
      TESSERA_RETURN_IF_ERROR(syncDirectory(iterDir));
    }
    TESSERA_RETURN_IF_ERROR(syncDirectory(dir));
  }
  if (world) {
    WaitMonitor::Step step(
        o.monitor,
        saving + (rank == 0
                      ? "waiting for every rank to begin the save (barrier)"
                      : "waiting for rank 0 to prepare the directory "
                        "(barrier)"),
        On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
  }

  ShardFile shard;
  shard.rank = rank;
  shard.worldSize = worldSize;
  shard.iteration = iteration;
  shard.consumedSamples =
      iteration * artifact.root()->batch()->global_batch_size();
  shard.seed = o.info.seed;
  for (const fb::Buffer *b : *executor.program().buffers()) {
    if (!isSavedKind(b->kind()))
      continue;
    ShardTensor t;
    t.name = nameOf(*b);
    t.kind = b->kind();
    t.dtype = b->dtype();
    t.shape = toVector(b->shape());
    if (b->kind() == fb::BufferKind::Iteration) {
      t.data.resize(8);
      storeLE64(t.data.data(), uint64_t(iteration));
    } else {
      TESSERA_ASSIGN_OR_RETURN(t.data, executor.readBuffer(t.name));
    }
    shard.tensors.push_back(std::move(t));
  }
  std::string bytes = encodeShard(shard);
  {
    WaitMonitor::Step step(o.monitor,
                           saving + "writing its shard " + shardFileName(rank),
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(
        writeFileAtomic(iterDir + "/" + shardFileName(rank), bytes));
  }
  if (o.debugExitAfterShard == iteration) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(9);
  }
  if (o.debugStallRank == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  int64_t mine[2] = {
      int64_t(bytes.size()),
      int64_t(loadLE32(reinterpret_cast<const uint8_t *>(bytes.data()) + 16))};
  std::vector<int64_t> all(size_t(2 * worldSize));
  if (world && world->size() > 1) {
    WaitMonitor::Step step(
        o.monitor,
        saving + "waiting for the shard sizes and CRCs of every rank "
                 "(all-gather)",
        On::Peers);
    TESSERA_RETURN_IF_ERROR(
        world->allGather(mine, all.data(), 2, ElementType::I64));
  } else {
    std::copy(mine, mine + 2, all.begin());
  }
  result.bytes = uint64_t(mine[0]);
  if (rank == 0) {
    TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m,
                             describeCheckpoint(artifact, o.info));
    result.bytes = 0;
    for (int r = 0; r < worldSize; ++r) {
      ManifestShardFile f;
      f.rank = r;
      f.file = shardFileName(r);
      f.bytes = uint64_t(all[size_t(2 * r)]);
      f.crc = uint32_t(all[size_t(2 * r + 1)]);
      result.bytes += f.bytes;
      m.files.push_back(f);
    }
    {
      WaitMonitor::Step step(o.monitor, saving + "writing manifest.json",
                             On::FileSystem);
      TESSERA_RETURN_IF_ERROR(
          writeFileAtomic(iterDir + "/manifest.json", manifestToJson(m)));
    }
    WaitMonitor::Step step(o.monitor, saving + "writing latest",
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(
        writeFileAtomic(dir + "/latest", std::to_string(iteration) + "\n"));
  }
  if (world) {
    WaitMonitor::Step step(
        o.monitor,
        saving + (rank == 0 ? "waiting for every rank to finish the save "
                              "(barrier)"
                            : "waiting for rank 0 to write manifest.json and "
                              "latest (barrier)"),
        On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
  }
  return result;
}

/// `data` (elements of `from`) as elements of `to`: F32 -> BF16 rounded to
/// nearest even, BF16 -> F32 exact.
static StatusOr<std::vector<uint8_t>>
convertFloats(const std::vector<uint8_t> &data, fb::DType from, fb::DType to) {
  std::vector<uint8_t> out;
  if (from == fb::DType::F32 && to == fb::DType::BF16) {
    const size_t n = data.size() / 4;
    std::vector<float> f(n);
    std::vector<uint16_t> h(n);
    std::memcpy(f.data(), data.data(), n * 4);
    floatsToBf16(f.data(), h.data(), int64_t(n));
    out.resize(n * 2);
    std::memcpy(out.data(), h.data(), n * 2);
    return out;
  }
  if (from == fb::DType::BF16 && to == fb::DType::F32) {
    const size_t n = data.size() / 2;
    std::vector<uint16_t> h(n);
    std::vector<float> f(n);
    std::memcpy(h.data(), data.data(), n * 2);
    bf16ToFloats(h.data(), f.data(), int64_t(n));
    out.resize(n * 4);
    std::memcpy(out.data(), f.data(), n * 4);
    return out;
  }
  return invalidArgument("cannot convert ", fb::EnumNameDType(from), " to ",
                         fb::EnumNameDType(to));
}

StatusOr<CheckpointLoadResult> loadCheckpoint(Executor &executor,
                                              const std::string &dir,
                                              const CheckpointLoadOptions &o,
                                              Communicator *world) {
  const LoadedArtifact &artifact = executor.artifact();
  const int rank = executor.worldRank();
  // Each step that waits for other ranks or the file system, for the
  // watchdog.
  using On = WaitMonitor::On;
  std::optional<WaitMonitor::Step> step;
  step.emplace(o.monitor,
               "loading checkpoint " + dir +
                   ": reading latest and manifest.json",
               On::FileSystem);
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation loc, locateCheckpoint(dir));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, readManifest(loc));
  step.reset();
  const std::string loading = "loading checkpoint iteration " +
                              std::to_string(m.iteration) + " from " + loc.dir +
                              ": ";
  if (o.debugStallRank == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  if (world && world->size() > 1) {
    // Every rank must load the same iteration (DIR/latest may move).
    std::vector<int64_t> all(size_t(world->size()));
    int64_t mine = m.iteration;
    step.emplace(o.monitor,
                 loading + "waiting for the iteration every rank found "
                           "(all-gather)",
                 On::Peers);
    TESSERA_RETURN_IF_ERROR(
        world->allGather(&mine, all.data(), 1, ElementType::I64));
    step.reset();
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] != mine)
        return failedPrecondition(dir, ": rank ", r, " found iteration ",
                                  all[r], " and rank ", rank, " iteration ",
                                  mine, " (was the checkpoint being written?)");
  }
  TESSERA_ASSIGN_OR_RETURN(CheckpointLoadPlan plan,
                           planCheckpointLoad(m, artifact, rank, o, loc.dir));
  // Destinations: each buffer, and each segment of a bucket shard (its
  // parameter's local box, copied into the buffer at the end).
  struct Target {
    const std::vector<RestorePiece> *pieces;
    const TensorBox *box;
    std::vector<uint8_t> *data;
    fb::DType dtype;
  };
  std::vector<std::vector<uint8_t>> host(plan.buffers.size());
  std::vector<std::vector<std::vector<uint8_t>>> segmentData(
      plan.buffers.size());
  std::vector<Target> targets;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    if (br.isIteration)
      continue;
    const int64_t es = dtypeSize(br.dtype);
    host[i].assign(size_t(br.box.volume() * es), 0);
    targets.push_back({&br.pieces, &br.box, &host[i], br.dtype});
    segmentData[i].resize(br.segments.size());
    for (size_t k = 0; k < br.segments.size(); ++k) {
      segmentData[i][k].assign(size_t(br.segments[k].box.volume() * es), 0);
      targets.push_back({&br.segments[k].pieces, &br.segments[k].box,
                         &segmentData[i][k], br.dtype});
    }
  }
  // Pieces assembled from runs of bucket shards (several files), in the
  // saved dtype, copied once every file has been read.
  std::map<const RestorePiece *, std::vector<uint8_t>> assembled;
  for (const Target &target : targets)
    for (const RestorePiece &piece : *target.pieces)
      if (!piece.runs.empty())
        assembled[&piece].assign(
            size_t(piece.sourceBox.volume() * dtypeSize(piece.dtype)), 0);
  auto place = [&](const RestorePiece &piece, const std::vector<uint8_t> &data,
                   const Target &target) -> Status {
    const fb::DType dtype = target.dtype;
    const uint8_t *src = data.data();
    std::vector<uint8_t> converted;
    if (piece.dtype != dtype) {
      TESSERA_ASSIGN_OR_RETURN(converted,
                               convertFloats(data, piece.dtype, dtype));
      src = converted.data();
    }
    copyTensorBox(src, piece.sourceBox, target.data->data(), *target.box,
                  piece.region, dtypeSize(dtype));
    return Status();
  };
  for (int q : plan.sourceRanks) {
    std::string path = loc.dir + "/" + shardFileName(q);
    if (q >= int(m.files.size()))
      return dataLoss(path, ": the manifest lists only ", m.files.size(),
                      " ranks");
    step.emplace(o.monitor, loading + "reading " + shardFileName(q),
                 On::FileSystem);
    TESSERA_ASSIGN_OR_RETURN(ShardFile f, readShardFile(path));
    step.reset();
    if (f.worldSize != m.worldSize || f.rank != q)
      return dataLoss(path, ": holds rank ", f.rank, " of world size ",
                      f.worldSize, ", but the manifest expects rank ", q,
                      " of ", m.worldSize);
    const ManifestShardFile &mf = m.files[size_t(q)];
    if (f.crc != mf.crc || f.iteration != m.iteration)
      return dataLoss(path, ": does not belong to this checkpoint (iteration ",
                      f.iteration, ", CRC-32 ", hex32(f.crc),
                      "; the manifest records iteration ", m.iteration,
                      ", CRC-32 ", hex32(mf.crc), ")");
    for (const Target &target : targets) {
      for (const RestorePiece &piece : *target.pieces) {
        if (!piece.runs.empty()) {
          std::vector<uint8_t> &dst = assembled[&piece];
          const int64_t es = dtypeSize(piece.dtype);
          for (const FlatRun &run : piece.runs) {
            if (run.sourceRank != q)
              continue;
            const ShardTensor *t = f.find(run.sourceName);
            if (!t)
              return dataLoss(path, ": has no tensor '", run.sourceName,
                              "', which the manifest says it holds");
            if (t->dtype != piece.dtype || t->shape.size() != 1 ||
                run.sourceOffset < 0 || run.count < 0 ||
                run.sourceOffset + run.count > t->shape[0] ||
                (run.offset + run.count) * es > int64_t(dst.size()))
              return dataLoss(path, ": tensor '", run.sourceName, "' is ",
                              fb::EnumNameDType(t->dtype),
                              shapeString(t->shape), ", the manifest says ",
                              fb::EnumNameDType(piece.dtype), " with [",
                              run.sourceOffset, ", ",
                              run.sourceOffset + run.count, ") of '",
                              piece.sourceName, "'");
            std::memcpy(dst.data() + run.offset * es,
                        t->data.data() + run.sourceOffset * es,
                        size_t(run.count * es));
          }
          continue;
        }
        if (piece.sourceRank != q)
          continue;
        const ShardTensor *t = f.find(piece.sourceName);
        std::vector<int64_t> extent;
        for (size_t d = 0; d < piece.sourceBox.lo.size(); ++d)
          extent.push_back(piece.sourceBox.hi[d] - piece.sourceBox.lo[d]);
        if (!t)
          return dataLoss(path, ": has no tensor '", piece.sourceName,
                          "', which the manifest says it holds");
        if (t->dtype != piece.dtype || t->shape != extent)
          return dataLoss(path, ": tensor '", piece.sourceName, "' is ",
                          fb::EnumNameDType(t->dtype), shapeString(t->shape),
                          ", the manifest says ",
                          fb::EnumNameDType(piece.dtype), shapeString(extent));
        TESSERA_RETURN_IF_ERROR(place(piece, t->data, target));
      }
    }
  }
  for (const Target &target : targets)
    for (const RestorePiece &piece : *target.pieces)
      if (!piece.runs.empty())
        TESSERA_RETURN_IF_ERROR(place(piece, assembled[&piece], target));
  // Bucket shards: each segment's part of its parameter's box.
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    const int64_t es = dtypeSize(br.dtype);
    for (size_t k = 0; k < br.segments.size(); ++k) {
      const RestoreSegment &seg = br.segments[k];
      if (seg.begin < 0 || seg.end > seg.box.volume() ||
          (seg.offset + seg.end - seg.begin) * es > int64_t(host[i].size()))
        return invalidArgument("checkpoint load plan of '", br.name,
                               "': segment of '", seg.param,
                               "' outside the buffer");
      std::memcpy(host[i].data() + seg.offset * es,
                  segmentData[i][k].data() + seg.begin * es,
                  size_t((seg.end - seg.begin) * es));
    }
  }
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    if (br.isIteration) {
      int64_t it = m.iteration;
      TESSERA_RETURN_IF_ERROR(executor.writeBuffer(br.name, &it, 8));
    } else {
      TESSERA_RETURN_IF_ERROR(executor.writeBuffer(br.name, host[i].data(),
                                                   int64_t(host[i].size())));
    }
  }
  // Every rank has its state: a rank that failed has aborted the job before
  // this barrier, so nobody reports a load that did not complete.
  if (world) {
    step.emplace(o.monitor,
                 loading + "waiting for every rank to restore its state "
                           "(barrier)",
                 On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
    step.reset();
  }
  CheckpointLoadResult result;
  result.dir = loc.dir;
  result.iteration = m.iteration;
  result.resharded = plan.resharded;
  result.savedConfig = m.configString();
  result.targetConfig = plan.targetConfig;
  result.notes = plan.notes;
  return result;
}

} // namespace tessera::rt
