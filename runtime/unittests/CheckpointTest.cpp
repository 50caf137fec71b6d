//===- CheckpointTest.cpp - Shard files, manifests, planning, save/load ---===//

#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Checkpoint.h"
#include "tessera/rt/Executor.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

class TempDir {
public:
  TempDir() {
    char tmpl[] = "/tmp/tessera-checkpoint-test-XXXXXX";
    path = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() {
    if (!path.empty())
      (void)std::system(("rm -rf '" + path + "'").c_str());
  }
  std::string path;
};

std::vector<std::string> listDir(const std::string &dir) {
  std::vector<std::string> names;
  if (DIR *d = opendir(dir.c_str())) {
    while (dirent *e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
        names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

ShardFile sampleShard() {
  ShardFile s;
  s.rank = 1;
  s.worldSize = 4;
  s.iteration = 10;
  s.consumedSamples = 80;
  s.seed = 1234;
  ShardTensor w;
  w.name = "fc.weight";
  w.kind = fb::BufferKind::Param;
  w.dtype = fb::DType::F32;
  w.shape = {3, 5};
  w.data.resize(15 * 4);
  for (size_t i = 0; i < w.data.size(); ++i)
    w.data[i] = uint8_t(i * 7 + 1);
  ShardTensor m = w;
  m.name = "adam.exp_avg:fc.weight";
  m.kind = fb::BufferKind::OptState;
  m.data.assign(m.data.size(), 0x5a);
  ShardTensor it;
  it.name = "iteration";
  it.kind = fb::BufferKind::Iteration;
  it.dtype = fb::DType::I64;
  it.data.assign(8, 0);
  it.data[0] = 10;
  ShardTensor empty;
  empty.name = "empty";
  empty.shape = {0, 4};
  s.tensors = {w, m, it, empty};
  return s;
}

void expectError(const Status &st, const std::string &needle) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

/// A model of one parameter "w" (global [rows, 3]) split by rows over tp,
/// plus a replicated bias "b" [3], Adam state for both and the iteration;
/// world = tp * dp (tp innermost). Functions are empty: only the layout
/// matters to the planner. `mixed`: w and b are bf16 with fp32 main params
/// "main:w" (w's layout) and "main:b".
ArtifactDesc shardedModel(int tp, int dp, int64_t rows = 4,
                          const std::string &optimizer = "adam",
                          int64_t globalBatch = 8, bool extraParam = false,
                          bool mixed = false) {
  using K = fb::BufferKind;
  ArtifactDesc a;
  a.worldSize = tp * dp;
  a.mesh = {{"tp", tp}, {"dp", dp}, {"pp", 1}};
  addTpDpGroups(a, tp, dp);
  for (int r = 0; r < tp * dp; ++r)
    a.groups.push_back({"pp", {r}});
  a.microBatch = globalBatch / dp;
  a.numMicrobatches = 1;
  a.globalBatch = globalBatch;
  a.optimizer = optimizer;
  ProgramDesc p;
  const fb::DType pt = mixed ? fb::DType::BF16 : fb::DType::F32;
  int w = p.add("w", K::Param, {rows / tp, 3}, pt, fb::InitKind::Normal, 1.0f);
  p.buffers[size_t(w)].globalShape = {rows, 3};
  p.buffers[size_t(w)].shardDim = 0;
  p.buffers[size_t(w)].shardAxis = "tp";
  int b = p.add("b", K::Param, {3}, pt, fb::InitKind::Normal, 1.0f);
  if (extraParam)
    p.add("extra", K::Param, {2});
  if (mixed) {
    int mw = p.add("main:w", K::MainParam, {rows / tp, 3}, fb::DType::F32,
                   fb::InitKind::Zeros, 0.0f, w);
    p.buffers[size_t(mw)].globalShape = {rows, 3};
    p.buffers[size_t(mw)].shardDim = 0;
    p.buffers[size_t(mw)].shardAxis = "tp";
    p.add("main:b", K::MainParam, {3}, fb::DType::F32, fb::InitKind::Zeros,
          0.0f, b);
  }
  p.add("grad:w", K::Grad, {rows / tp, 3}, fb::DType::F32, fb::InitKind::Zeros,
        0.0f, w);
  if (optimizer == "adam")
    for (const char *state : {"adam.exp_avg:", "adam.exp_avg_sq:"}) {
      p.add(std::string(state) + "w", K::OptState, {rows / tp, 3},
            fb::DType::F32, fb::InitKind::Zeros, 0.0f, w);
      p.add(std::string(state) + "b", K::OptState, {3}, fb::DType::F32,
            fb::InitKind::Zeros, 0.0f, b);
    }
  p.iterationBuffer = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  p.function("microbatch");
  p.function("step");
  a.programs.push_back(std::move(p));
  return a;
}

/// The distributed optimizer over dp: bf16 "w" [4, 3] and "b" [3] in one
/// parameter bucket "pbuf:gb:0" of 16 elements (a view of the parameters'
/// memory), with this rank's 16/dp-element shards of its Adam state (with
/// `adam`) and fp32 main params "main:pbuf:gb:0".
ArtifactDesc distOptModel(int dp, bool adam = true) {
  using K = fb::BufferKind;
  ArtifactDesc a;
  a.worldSize = dp;
  a.mesh = {{"tp", 1}, {"dp", dp}, {"pp", 1}};
  addTpDpGroups(a, 1, dp);
  for (int r = 0; r < dp; ++r)
    a.groups.push_back({"pp", {r}});
  a.microBatch = 8 / dp;
  a.globalBatch = 8;
  a.optimizer = adam ? "adam" : "sgd";
  ProgramDesc p;
  // w at 0 (24 bytes), b right after it: the bucket's 16 elements.
  int w =
      p.add("w", K::Param, {4, 3}, fb::DType::BF16, fb::InitKind::Normal, 1.0f);
  BufferDesc b = p.buffers[size_t(w)];
  b.name = "b";
  b.shape = b.globalShape = {3};
  b.offset = 24;
  p.buffers.push_back(b);
  BufferDesc view = b;
  view.name = "pbuf:gb:0";
  view.kind = K::View;
  view.init = fb::InitKind::Zeros;
  view.shape = view.globalShape = {16};
  view.offset = 0;
  p.buffers.push_back(view);
  int v = int(p.buffers.size()) - 1;
  p.arenaBytes = 64;
  if (adam)
    for (const char *state : {"adam.exp_avg:", "adam.exp_avg_sq:"})
      p.add(std::string(state) + "pbuf:gb:0", K::OptState, {16 / dp},
            fb::DType::F32, fb::InitKind::Zeros, 0.0f, v);
  p.add("main:pbuf:gb:0", K::MainParam, {16 / dp}, fb::DType::F32);
  p.iterationBuffer = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  p.function("microbatch");
  p.function("step");
  a.programs.push_back(std::move(p));
  return a;
}

std::shared_ptr<const LoadedArtifact> load(const ArtifactDesc &desc,
                                           const std::string &name = "m.tsr") {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  return loaded.ok() ? *loaded : nullptr;
}

CheckpointManifest manifestOf(const LoadedArtifact &artifact,
                              int64_t iteration = 5, uint64_t seed = 1234) {
  CheckpointRunInfo info;
  info.iteration = iteration;
  info.seed = seed;
  auto m = describeCheckpoint(artifact, info);
  EXPECT_TRUE(m.ok()) << m.status().toString();
  CheckpointManifest out = *m;
  for (int r = 0; r < out.worldSize; ++r)
    out.files.push_back({r, shardFileName(r), 100, 0});
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Shard file format
//===----------------------------------------------------------------------===//

TEST(ShardFormatTest, RoundTrip) {
  ShardFile s = sampleShard();
  std::string bytes = encodeShard(s);
  ASSERT_GE(bytes.size(), ckpt::kShardHeaderSize);
  EXPECT_EQ(std::memcmp(bytes.data(), "TSCK", 4), 0);
  auto d = decodeShard(bytes, "r.bin");
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(d->rank, 1);
  EXPECT_EQ(d->worldSize, 4);
  EXPECT_EQ(d->iteration, 10);
  EXPECT_EQ(d->consumedSamples, 80);
  EXPECT_EQ(d->seed, 1234u);
  ASSERT_EQ(d->tensors.size(), s.tensors.size());
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    EXPECT_EQ(d->tensors[i].name, s.tensors[i].name);
    EXPECT_EQ(d->tensors[i].kind, s.tensors[i].kind);
    EXPECT_EQ(d->tensors[i].dtype, s.tensors[i].dtype);
    EXPECT_EQ(d->tensors[i].shape, s.tensors[i].shape);
    EXPECT_EQ(d->tensors[i].data, s.tensors[i].data);
  }
  ASSERT_TRUE(d->find("iteration"));
  EXPECT_EQ(d->find("missing"), nullptr);
  // Deterministic: the same contents give the same bytes.
  EXPECT_EQ(encodeShard(s), bytes);
}

TEST(ShardFormatTest, Truncated) {
  std::string bytes = encodeShard(sampleShard());
  expectError(decodeShard(bytes.substr(0, 10), "r.bin").status(),
              "r.bin: file is truncated: expected at least a 32-byte "
              "checkpoint shard header, got 10 bytes");
  expectError(decodeShard(bytes.substr(0, 100), "r.bin").status(),
              "r.bin: file is truncated: expected " +
                  std::to_string(bytes.size()) + " bytes, got 100");
  expectError(decodeShard(bytes + "xy", "r.bin").status(),
              "r.bin: 2 unexpected bytes after the payload");
}

TEST(ShardFormatTest, CorruptPayloadFailsCrc) {
  std::string bytes = encodeShard(sampleShard());
  bytes[bytes.size() - 3] ^= 0x10;
  expectError(decodeShard(bytes, "r.bin").status(),
              "r.bin: payload is corrupted (CRC-32 mismatch: header says 0x");
}

TEST(ShardFormatTest, WrongMagicAndVersion) {
  std::string bytes = encodeShard(sampleShard());
  std::string magic = bytes;
  magic[0] = 'X';
  expectError(decodeShard(magic, "r.bin").status(),
              "r.bin: not a Tessera checkpoint shard (bad magic");
  std::string version = bytes;
  version[4] = 9;
  expectError(decodeShard(version, "r.bin").status(),
              "r.bin: unsupported checkpoint shard format version 9 (this "
              "runtime supports version 1)");
  std::string rank = bytes;
  rank[20] = 7; // rank 7 of world 4
  expectError(decodeShard(rank, "r.bin").status(),
              "r.bin: corrupt header: rank 7 of world size 4");
}

TEST(ShardFormatTest, MalformedIndexWithValidCrc) {
  ShardFile s = sampleShard();
  std::string bytes = encodeShard(s);
  // The first tensor's data size lies (index entry: after the 32-byte
  // payload prologue, name length, name, 4 bytes, 2 dims, offset, size).
  size_t sizeField =
      ckpt::kShardHeaderSize + 32 + 4 + s.tensors[0].name.size() + 4 + 16 + 8;
  bytes[sizeField] = char(bytes[sizeField] + 4);
  const auto *payload =
      reinterpret_cast<const uint8_t *>(bytes.data()) + ckpt::kShardHeaderSize;
  ::tessera::artifact::storeLE32(
      reinterpret_cast<uint8_t *>(bytes.data()) + 16,
      ::tessera::artifact::crc32(payload,
                                 bytes.size() - ckpt::kShardHeaderSize));
  expectError(decodeShard(bytes, "r.bin").status(),
              "r.bin: malformed tensor index: tensor 'fc.weight' of shape [3, "
              "5] F32 has 64 bytes of data");
}

// Found by the checkpoint_shard fuzzer (fuzz/): a shape whose byte size
// wraps 2^64 (here 2^62 F32 elements: 0 bytes) matched a tensor's data size.
TEST(ShardFormatTest, ShapeWhoseByteSizeWrapsIsRejected) {
  ShardFile s = sampleShard();
  ShardTensor huge;
  huge.name = "huge";
  huge.shape = {int64_t(1) << 62};
  s.tensors.push_back(huge);
  expectError(decodeShard(encodeShard(s), "r.bin").status(),
              "r.bin: malformed tensor index: tensor 'huge' of shape "
              "[4611686018427387904] F32 has 0 bytes of data");
}

TEST(ShardFormatTest, FilesAndHeaders) {
  TempDir dir;
  std::string path = dir.path + "/" + shardFileName(3);
  EXPECT_EQ(shardFileName(3), "rank_00003.bin");
  EXPECT_EQ(iterationDirName(10), "iter_0000010");
  std::string bytes = encodeShard(sampleShard());
  ASSERT_TRUE(writeFileAtomic(path, bytes).ok());
  auto h = readShardHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().toString();
  EXPECT_EQ(h->rank, 1);
  EXPECT_EQ(h->worldSize, 4);
  EXPECT_EQ(h->payloadSize + ckpt::kShardHeaderSize, bytes.size());
  auto f = readShardFile(path);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  EXPECT_EQ(f->tensors.size(), 4u);
  writeBytes(path, bytes.substr(0, 200));
  expectError(readShardHeader(path).status(), path + ": file is truncated");
  expectError(readShardFile(path).status(), path + ": file is truncated");
  expectError(readShardFile(dir.path + "/none.bin").status(),
              dir.path + "/none.bin: cannot open");
}

//===----------------------------------------------------------------------===//
// Atomic writes
//===----------------------------------------------------------------------===//

TEST(AtomicWriteTest, WritesReplacesAndLeavesNoTemporaries) {
  TempDir dir;
  std::string path = dir.path + "/latest";
  ASSERT_TRUE(writeFileAtomic(path, std::string("5\n")).ok());
  auto text = readWholeFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "5\n");
  ASSERT_TRUE(writeFileAtomic(path, std::string("10\n")).ok());
  EXPECT_EQ(*readWholeFile(path), "10\n");
  EXPECT_EQ(listDir(dir.path), std::vector<std::string>{"latest"});
  // Large contents.
  std::string big(3 << 20, 'x');
  ASSERT_TRUE(writeFileAtomic(dir.path + "/big", big).ok());
  EXPECT_EQ(readWholeFile(dir.path + "/big")->size(), big.size());
}

TEST(AtomicWriteTest, FailureLeavesTheOldFile) {
  TempDir dir;
  Status st = writeFileAtomic(dir.path + "/missing/file", std::string("x"));
  expectError(st, dir.path + "/missing/file: cannot create");
  // A directory in the way of the rename: the old contents stay and the
  // temporary file is removed.
  std::string blocked = dir.path + "/blocked";
  ASSERT_EQ(mkdir(blocked.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((blocked + "/child").c_str(), 0755), 0);
  st = writeFileAtomic(blocked, std::string("data"));
  expectError(st, blocked + ": rename of ");
  EXPECT_EQ(listDir(dir.path), std::vector<std::string>{"blocked"});
}

TEST(AtomicWriteTest, MakeDirectories) {
  TempDir dir;
  std::string nested = dir.path + "/a/b/iter_0000001";
  ASSERT_TRUE(makeDirectories(nested).ok());
  ASSERT_TRUE(makeDirectories(nested).ok());
  struct stat st;
  ASSERT_EQ(stat(nested.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_TRUE(writeFileAtomic(dir.path + "/file", std::string("x")).ok());
  expectError(makeDirectories(dir.path + "/file/sub"), "/file");
  EXPECT_TRUE(syncDirectory(dir.path).ok());
}

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

TEST(TensorBoxTest, ReassemblesAcrossLayouts) {
  // A global [6, 4, 3] tensor saved as 2 shards along dim 1, rebuilt as 3
  // shards along dim 0.
  std::vector<int64_t> global = {6, 4, 3};
  std::vector<float> whole(72);
  std::iota(whole.begin(), whole.end(), 0.0f);
  auto slice = [&](const TensorBox &box) {
    std::vector<float> out;
    for (int64_t i = box.lo[0]; i < box.hi[0]; ++i)
      for (int64_t j = box.lo[1]; j < box.hi[1]; ++j)
        for (int64_t k = box.lo[2]; k < box.hi[2]; ++k)
          out.push_back(whole[size_t((i * 4 + j) * 3 + k)]);
    return out;
  };
  std::vector<TensorBox> saved = {shardBox(global, 1, 0, 2),
                                  shardBox(global, 1, 1, 2)};
  EXPECT_EQ(saved[1].lo, (std::vector<int64_t>{0, 2, 0}));
  EXPECT_EQ(saved[1].hi, (std::vector<int64_t>{6, 4, 3}));
  for (int t = 0; t < 3; ++t) {
    TensorBox target = shardBox(global, 0, t, 3);
    std::vector<float> out(size_t(target.volume()), -1.0f);
    for (const TensorBox &src : saved) {
      std::vector<float> data = slice(src);
      TensorBox region;
      region.lo = {std::max(src.lo[0], target.lo[0]), src.lo[1], src.lo[2]};
      region.hi = {std::min(src.hi[0], target.hi[0]), src.hi[1], src.hi[2]};
      copyTensorBox(reinterpret_cast<const uint8_t *>(data.data()), src,
                    reinterpret_cast<uint8_t *>(out.data()), target, region, 4);
    }
    EXPECT_EQ(out, slice(target)) << "target shard " << t;
  }
  // A saved tensor split along two dims numbers its shards together: shard
  // j is block j / 2 of dim 0 and, within it, block j % 2 of dim 1.
  ManifestTensor two;
  two.globalShape = global;
  two.shardDim = 0;
  two.numShards = 4;
  two.shard2Dim = 1;
  two.numShards2 = 2;
  TensorBox b3 = shardBox(two, 3);
  EXPECT_EQ(b3.lo, (std::vector<int64_t>{3, 2, 0}));
  EXPECT_EQ(b3.hi, (std::vector<int64_t>{6, 4, 3}));
  TensorBox b1 = shardBox(two, 1);
  EXPECT_EQ(b1.lo, (std::vector<int64_t>{0, 2, 0}));
  EXPECT_EQ(b1.hi, (std::vector<int64_t>{3, 4, 3}));
  // Scalars and identical boxes.
  TensorBox scalar = shardBox({}, -1, 0, 1);
  int64_t a = 42, b = 0;
  copyTensorBox(reinterpret_cast<const uint8_t *>(&a), scalar,
                reinterpret_cast<uint8_t *>(&b), scalar, scalar, 8);
  EXPECT_EQ(b, 42);
}

//===----------------------------------------------------------------------===//
// Manifest
//===----------------------------------------------------------------------===//

TEST(ManifestTest, DescribesShardsAndRoundTrips) {
  auto art = load(shardedModel(2, 2));
  ASSERT_TRUE(art);
  CheckpointManifest m = manifestOf(*art, 7, 99);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.pp, 1);
  EXPECT_EQ(m.worldSize, 4);
  EXPECT_EQ(m.consumedSamples, 56);
  EXPECT_EQ(m.configString(), "tp=2 pp=1 dp=2, world 4");
  const ManifestTensor *w = nullptr, *mw = nullptr, *it = nullptr;
  for (const ManifestTensor &t : m.tensors) {
    EXPECT_NE(t.kind, fb::BufferKind::Grad) << t.name;
    if (t.name == "w")
      w = &t;
    if (t.name == "adam.exp_avg:w")
      mw = &t;
    if (t.name == "iteration")
      it = &t;
  }
  ASSERT_TRUE(w && mw && it);
  EXPECT_EQ(w->globalShape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->shardDim, 0);
  EXPECT_EQ(w->shardAxis, "tp");
  EXPECT_EQ(w->numShards, 2);
  std::vector<std::pair<int, int>> holders = {{0, 0}, {1, 1}, {2, 0}, {3, 1}};
  EXPECT_EQ(w->holders, holders);
  // Optimizer state follows its parameter's layout.
  EXPECT_EQ(mw->globalShape, w->globalShape);
  EXPECT_EQ(mw->holders, holders);
  EXPECT_EQ(mw->param, "w");
  EXPECT_EQ(it->numShards, 1);

  std::string json = manifestToJson(m);
  auto parsed = parseManifest(json, "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
  EXPECT_EQ(parsed->iteration, 7);
  EXPECT_EQ(parsed->seed, 99u);
  EXPECT_EQ(parsed->mesh, m.mesh);
  EXPECT_EQ(parsed->groups, m.groups);
  ASSERT_EQ(parsed->tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    EXPECT_EQ(parsed->tensors[i].name, m.tensors[i].name);
    EXPECT_EQ(parsed->tensors[i].globalShape, m.tensors[i].globalShape);
    EXPECT_EQ(parsed->tensors[i].holders, m.tensors[i].holders);
  }
  EXPECT_EQ(manifestToJson(*parsed), json);
}

TEST(ManifestTest, ParseErrors) {
  expectError(parseManifest("{not json", "m.json").status(),
              "m.json: invalid manifest: ");
  expectError(parseManifest("{\"format\": \"other\"}", "m.json").status(),
              "m.json: invalid manifest: not a Tessera checkpoint manifest");
  auto art = load(shardedModel(1, 1));
  std::string json = manifestToJson(manifestOf(*art));
  std::string v2 = json;
  v2.replace(v2.find("\"format_version\": 1"), 19, "\"format_version\": 2");
  expectError(
      parseManifest(v2, "m.json").status(),
      "m.json: invalid manifest: unsupported manifest format version 2");
  std::string noBuffers = json;
  noBuffers.replace(noBuffers.find("\"buffers\""), 9, "\"buffer5\"");
  expectError(parseManifest(noBuffers, "m.json").status(),
              "m.json: invalid manifest: ");
}

// Found by the checkpoint_manifest fuzzer (fuzz/): nlohmann's get<int>()
// converted a float out of int's range (undefined behaviour) and wrapped
// integers out of range; every integer field is now checked.
TEST(ManifestTest, IntegerFieldsMustBeIntegersInRange) {
  auto art = load(shardedModel(1, 1));
  const std::string json = manifestToJson(manifestOf(*art));
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string out = json;
    size_t at = out.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? out : out.replace(at, from.size(), to);
  };
  expectError(
      parseManifest(replaced("\"world_size\": 1", "\"world_size\": 1e300"),
                    "m.json")
          .status(),
      "m.json: invalid manifest: world_size is 1e+300, not an integer in "
      "[-2147483648, 2147483647]");
  expectError(parseManifest(replaced("{\"name\":\"tp\",\"size\":1}",
                                     "{\"name\":\"tp\",\"size\":4294967297}"),
                            "m.json")
                  .status(),
              "m.json: invalid manifest: mesh axis size is 4294967297, not an "
              "integer in [-2147483648, 2147483647]");
  expectError(
      parseManifest(replaced("\"tp\":1,", "\"tp\":1.5,"), "m.json").status(),
      "m.json: invalid manifest: parallel.tp is 1.5, not an integer");
  expectError(parseManifest(replaced("\"iteration\": 5",
                                     "\"iteration\": 1e19"),
                            "m.json")
                  .status(),
              "m.json: invalid manifest: iteration is 1e+19, not an integer");
  expectError(
      parseManifest(replaced("\"seed\":1234", "\"seed\":-1"), "m.json")
          .status(),
      "m.json: invalid manifest: data.seed is -1, not an integer in [0, "
      "18446744073709551615]");
  // The unchanged manifest parses.
  EXPECT_TRUE(parseManifest(json, "m.json").ok());
}

// Found by the checkpoint_manifest fuzzer: "eps": -1e80 parsed, and the
// manifest written back held null (the nearest float is -inf).
TEST(ManifestTest, HyperParametersMustBeFiniteFloats) {
  auto art = load(shardedModel(1, 1));
  const std::string json = manifestToJson(manifestOf(*art));
  auto withEps = [&](const std::string &value) {
    std::string out = json;
    size_t at = out.find("\"eps\":");
    EXPECT_NE(at, std::string::npos);
    size_t end = out.find_first_of(",}", at);
    return out.replace(at, end - at, "\"eps\":" + value);
  };
  expectError(parseManifest(withEps("-1e80"), "m.json").status(),
              "m.json: invalid manifest: optimizer.eps is -1e+80, not a "
              "finite float");
  expectError(parseManifest(withEps("\"small\""), "m.json").status(),
              "m.json: invalid manifest: optimizer.eps is \"small\", not a "
              "finite float");
  auto parsed = parseManifest(withEps("1e-30"), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
  EXPECT_TRUE(parseManifest(manifestToJson(*parsed), "again").ok());
}

// Found by the artifact_loader fuzzer: a name that is not UTF-8 made
// manifestToJson throw (nlohmann's dump), ending tessera-run --save; the
// manifest cannot hold it, so describeCheckpoint names it instead.
TEST(ManifestTest, NamesMustBeUtf8) {
  auto art = load(shardedModel(1, 1));
  CheckpointRunInfo info;
  info.datasetPrefix = "data/caf\xe9_text_document"; // Latin-1
  auto m = describeCheckpoint(*art, info);
  expectError(m.status(), "m.tsr: dataset prefix \"data/caf\\ufffd_text_"
                          "document\" is not valid UTF-8, which a checkpoint "
                          "manifest (JSON) cannot hold");
  info.datasetPrefix = "data/caf\xc3\xa9_text_document"; // UTF-8
  m = describeCheckpoint(*art, info);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_NE(manifestToJson(*m).find("caf\xc3\xa9"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

TEST(PlanTest, SameLayoutReadsOwnShard) {
  auto art = load(shardedModel(2, 2));
  CheckpointManifest m = manifestOf(*art);
  CheckpointLoadOptions o;
  for (int r = 0; r < 4; ++r) {
    auto plan = planCheckpointLoad(m, *art, r, o, "ckpt");
    ASSERT_TRUE(plan.ok()) << plan.status().toString();
    EXPECT_FALSE(plan->resharded);
    EXPECT_EQ(plan->sourceRanks, std::vector<int>{r});
    // w, b, iteration and four Adam states.
    EXPECT_EQ(plan->buffers.size(), 7u);
  }
  o.loadOptimizer = false;
  auto plan = planCheckpointLoad(m, *art, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->buffers.size(), 3u);
}

TEST(PlanTest, ReshardsAcrossTensorParallelSizes) {
  auto tp2 = load(shardedModel(2, 1));
  CheckpointManifest m = manifestOf(*tp2);
  CheckpointLoadOptions o;
  // tp 2 -> 1: both shards of w from ranks 0 and 1.
  auto one = load(shardedModel(1, 1));
  auto plan = planCheckpointLoad(m, *one, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_TRUE(plan->resharded);
  EXPECT_EQ(plan->sourceRanks, (std::vector<int>{0, 1}));
  for (const BufferRestore &br : plan->buffers)
    if (br.name == "w") {
      ASSERT_EQ(br.pieces.size(), 2u);
      EXPECT_EQ(br.pieces[1].sourceRank, 1);
      EXPECT_EQ(br.pieces[1].region.lo, (std::vector<int64_t>{2, 0}));
    }
  // tp 2 -> 4 (x dp 2): rank 7 (tp index 3) needs rows [3, 4) from rank 1.
  auto tp4 = load(shardedModel(4, 2));
  plan = planCheckpointLoad(m, *tp4, 7, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_EQ(plan->sourceRanks, std::vector<int>{1});
  for (const BufferRestore &br : plan->buffers)
    if (br.name == "adam.exp_avg_sq:w") {
      ASSERT_EQ(br.pieces.size(), 1u);
      EXPECT_EQ(br.box.lo, (std::vector<int64_t>{3, 0}));
      EXPECT_EQ(br.pieces[0].sourceBox.lo, (std::vector<int64_t>{2, 0}));
    }
}

TEST(PlanTest, Refusals) {
  auto tp2 = load(shardedModel(2, 1), "tp2.tsr");
  CheckpointManifest m = manifestOf(*tp2);
  CheckpointLoadOptions o;
  auto refuse = [&](const ArtifactDesc &desc, const std::string &needle,
                    CheckpointLoadOptions options) {
    auto art = load(desc, "other.tsr");
    ASSERT_TRUE(art);
    expectError(planCheckpointLoad(m, *art, 0, options, "ckpt").status(),
                needle);
  };
  refuse(shardedModel(2, 1, 8),
         "parameter 'w' has global shape [4, 3] in "
         "checkpoint ckpt but [8, 3] in other.tsr",
         o);
  refuse(shardedModel(2, 1, 4, "adam", 8, true),
         "checkpoint ckpt has no parameter 'extra' of other.tsr", o);
  refuse(shardedModel(2, 1, 4, "sgd"),
         "checkpoint ckpt was saved with optimizer 'adam', but other.tsr uses "
         "'sgd'",
         o);
  refuse(shardedModel(2, 1, 4, "adam", 16),
         "checkpoint ckpt was saved with global batch size 8, other.tsr has 16",
         o);
  // Parameters only: a different optimizer is fine.
  CheckpointLoadOptions paramsOnly;
  paramsOnly.loadOptimizer = false;
  auto sgd = load(shardedModel(1, 1, 4, "sgd"));
  EXPECT_TRUE(planCheckpointLoad(m, *sgd, 0, paramsOnly, "ckpt").ok());
  // The extra checkpoint parameter is refused the other way round too.
  auto extra = load(shardedModel(2, 1, 4, "adam", 8, true));
  CheckpointManifest mx = manifestOf(*extra);
  expectError(planCheckpointLoad(mx, *tp2, 0, o, "ckpt").status(),
              "checkpoint ckpt holds parameter 'extra', which tp2.tsr does not "
              "have");
}

TEST(PlanTest, SeedMattersForSyntheticData) {
  auto art = load(softmaxRegression());
  CheckpointManifest m = manifestOf(*art, 3, 1234);
  CheckpointLoadOptions o;
  o.seed = 5;
  expectError(planCheckpointLoad(m, *art, 0, o, "ckpt").status(),
              "--seed 5 differs from the seed 1234 of checkpoint ckpt, and the "
              "seed matters after loading: the synthetic input 'features' is "
              "drawn from it; resume with --seed 1234");
  // Without seed-dependent inputs or dropout, a different seed is harmless.
  auto plain = load(shardedModel(1, 1));
  CheckpointManifest mp = manifestOf(*plain, 3, 1234);
  auto plan = planCheckpointLoad(mp, *plain, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  ASSERT_EQ(plan->notes.size(), 1u);
  EXPECT_NE(plan->notes[0].find("harmless"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Mixed precision: main params and dtype changes
//===----------------------------------------------------------------------===//

namespace {

const ManifestTensor *findTensor(const CheckpointManifest &m,
                                 const std::string &name, int holder = -1) {
  for (const ManifestTensor &t : m.tensors)
    if (t.name == name)
      for (const auto &h : t.holders)
        if (holder < 0 || h.first == holder)
          return &t;
  return nullptr;
}

const BufferRestore *findRestore(const CheckpointLoadPlan &plan,
                                 const std::string &name) {
  for (const BufferRestore &br : plan.buffers)
    if (br.name == name)
      return &br;
  return nullptr;
}

bool hasNote(const std::vector<std::string> &notes, const std::string &needle) {
  for (const std::string &n : notes)
    if (n.find(needle) != std::string::npos)
      return true;
  return false;
}

std::string allNotes(const std::vector<std::string> &notes) {
  std::string out;
  for (const std::string &n : notes)
    out += n + "\n";
  return out;
}

} // namespace

TEST(MainParamTest, ManifestGivesMainParamsTheirParameterLayout) {
  auto art = load(shardedModel(2, 2, 4, "adam", 8, false, true));
  ASSERT_TRUE(art);
  CheckpointManifest m = manifestOf(*art);
  const ManifestTensor *w = findTensor(m, "w"), *mw = findTensor(m, "main:w"),
                       *mb = findTensor(m, "main:b");
  ASSERT_TRUE(w && mw && mb);
  EXPECT_EQ(w->dtype, fb::DType::BF16);
  EXPECT_EQ(mw->kind, fb::BufferKind::MainParam);
  EXPECT_EQ(mw->dtype, fb::DType::F32);
  EXPECT_EQ(mw->param, "w");
  EXPECT_TRUE(mw->reshardable);
  EXPECT_EQ(mw->globalShape, w->globalShape);
  EXPECT_EQ(mw->shardDim, 0);
  EXPECT_EQ(mw->holders, w->holders);
  EXPECT_EQ(mb->numShards, 1);
  // Kinds and dtypes survive the JSON.
  std::string json = manifestToJson(m);
  EXPECT_NE(json.find("\"kind\":\"MainParam\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"dtype\":\"BF16\""), std::string::npos) << json;
  auto parsed = parseManifest(json, "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
  const ManifestTensor *pm = findTensor(*parsed, "main:w");
  ASSERT_TRUE(pm);
  EXPECT_EQ(pm->kind, fb::BufferKind::MainParam);
  EXPECT_EQ(findTensor(*parsed, "w")->dtype, fb::DType::BF16);
  EXPECT_EQ(manifestToJson(*parsed), json);
}

TEST(MainParamTest, PerParameterMainParamsReshard) {
  auto tp2 = load(shardedModel(2, 1, 4, "adam", 8, false, true));
  CheckpointManifest m = manifestOf(*tp2);
  CheckpointLoadOptions o;
  // tp 2 -> 1: main:w from both shards, like w and its Adam state.
  auto one = load(shardedModel(1, 1, 4, "adam", 8, false, true));
  auto plan = planCheckpointLoad(m, *one, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_TRUE(plan->resharded);
  const BufferRestore *mw = findRestore(*plan, "main:w");
  ASSERT_TRUE(mw);
  EXPECT_EQ(mw->kind, fb::BufferKind::MainParam);
  ASSERT_EQ(mw->pieces.size(), 2u);
  EXPECT_EQ(mw->pieces[1].sourceRank, 1);
  EXPECT_EQ(mw->pieces[1].sourceName, "main:w");
  EXPECT_EQ(mw->pieces[1].region.lo, (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(findRestore(*plan, "main:b"));
  // tp 2 -> 4 (x dp 2): rank 7 needs rows [3, 4) from rank 1.
  auto tp4 = load(shardedModel(4, 2, 4, "adam", 8, false, true));
  plan = planCheckpointLoad(m, *tp4, 7, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  mw = findRestore(*plan, "main:w");
  ASSERT_TRUE(mw);
  ASSERT_EQ(mw->pieces.size(), 1u);
  EXPECT_EQ(mw->box.lo, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(mw->pieces[0].sourceRank, 1);
  // --no-load-optim: main params are optimizer state.
  o.loadOptimizer = false;
  plan = planCheckpointLoad(m, *one, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(findRestore(*plan, "main:w"));
  EXPECT_TRUE(hasNote(plan->notes, "fp32 main params 2 ('main:w', ...) are "
                                   "optimizer state, not loaded: 'init' "
                                   "computes them"))
      << allNotes(plan->notes);
}

TEST(MainParamTest, BucketMainParamsBehaveLikeDistributedOptimizerState) {
  auto dp2 = load(distOptModel(2), "dp2.tsr");
  ASSERT_TRUE(dp2);
  CheckpointManifest m = manifestOf(*dp2);
  EXPECT_TRUE(m.distributedOptimizer);
  const ManifestTensor *main1 = findTensor(m, "main:pbuf:gb:0", 1);
  ASSERT_TRUE(main1);
  EXPECT_FALSE(main1->reshardable);
  EXPECT_TRUE(main1->distributedOptimizer);
  EXPECT_EQ(main1->kind, fb::BufferKind::MainParam);
  EXPECT_EQ(main1->globalShape, std::vector<int64_t>{16});
  EXPECT_EQ(main1->param, "pbuf:gb:0");
  EXPECT_EQ(main1->holders, (std::vector<std::pair<int, int>>{{1, 1}}));
  ASSERT_EQ(m.buckets.size(), 1u);
  EXPECT_EQ(m.buckets[0].params.size(), 2u);
  // The same configuration: each rank its own shard.
  CheckpointLoadOptions o;
  for (int r = 0; r < 2; ++r) {
    auto plan = planCheckpointLoad(m, *dp2, r, o, "ckpt");
    ASSERT_TRUE(plan.ok()) << plan.status().toString();
    const BufferRestore *br = findRestore(*plan, "main:pbuf:gb:0");
    ASSERT_TRUE(br);
    ASSERT_EQ(br->pieces.size(), 1u);
    EXPECT_EQ(br->pieces[0].sourceRank, r);
  }
  // Another dp: the shard of dp = 1 is the whole bucket, w at [0, 12) and
  // b at [12, 15), each assembled from the runs of both saved shards of
  // [0, 8) and [8, 16).
  auto dp1 = load(distOptModel(1), "dp1.tsr");
  auto plan1 = planCheckpointLoad(m, *dp1, 0, o, "ckpt");
  ASSERT_TRUE(plan1.ok()) << plan1.status().toString();
  EXPECT_TRUE(plan1->resharded);
  EXPECT_EQ(plan1->sourceRanks, (std::vector<int>{0, 1}));
  const BufferRestore *whole = findRestore(*plan1, "main:pbuf:gb:0");
  ASSERT_TRUE(whole);
  EXPECT_TRUE(whole->pieces.empty());
  ASSERT_EQ(whole->segments.size(), 2u);
  const RestoreSegment &sw = whole->segments[0], &sb = whole->segments[1];
  EXPECT_EQ(sw.param, "w");
  EXPECT_EQ(sw.box.hi, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(std::make_tuple(sw.begin, sw.end, sw.offset),
            std::make_tuple(int64_t(0), int64_t(12), int64_t(0)));
  ASSERT_EQ(sw.pieces.size(), 1u);
  EXPECT_EQ(sw.pieces[0].sourceName, "main:w");
  EXPECT_EQ(sw.pieces[0].runs,
            (std::vector<FlatRun>{{0, "main:pbuf:gb:0", 0, 0, 8},
                                  {1, "main:pbuf:gb:0", 0, 8, 4}}));
  EXPECT_EQ(sb.param, "b");
  EXPECT_EQ(std::make_tuple(sb.begin, sb.end, sb.offset),
            std::make_tuple(int64_t(0), int64_t(3), int64_t(12)));
  ASSERT_EQ(sb.pieces.size(), 1u);
  EXPECT_EQ(sb.pieces[0].runs,
            (std::vector<FlatRun>{{1, "main:pbuf:gb:0", 4, 0, 3}}));
  // Main-param shards alone (SGD keeps no Adam state) into per-parameter
  // main params: main:w from both ranks' shards.
  auto sgd = load(distOptModel(2, false), "sgd.tsr");
  CheckpointManifest ms = manifestOf(*sgd);
  ArtifactDesc perParam = shardedModel(1, 2, 4, "sgd", 8, false, true);
  auto pp = load(perParam, "pp.tsr");
  auto planPp = planCheckpointLoad(ms, *pp, 1, o, "ckpt");
  ASSERT_TRUE(planPp.ok()) << planPp.status().toString();
  const BufferRestore *mw = findRestore(*planPp, "main:w");
  ASSERT_TRUE(mw);
  ASSERT_EQ(mw->pieces.size(), 1u);
  EXPECT_EQ(mw->pieces[0].sourceRank, -1);
  EXPECT_EQ(mw->pieces[0].runs,
            (std::vector<FlatRun>{{0, "main:pbuf:gb:0", 0, 0, 8},
                                  {1, "main:pbuf:gb:0", 0, 8, 4}}));
  // Without the bucket layouts in the manifest: refused.
  CheckpointManifest noLayout = m;
  noLayout.buckets.clear();
  expectError(planCheckpointLoad(noLayout, *dp1, 0, o, "ckpt").status(),
              "checkpoint ckpt was saved with the distributed optimizer (tp=1 "
              "pp=1 dp=2, world 2, distributed optimizer), but its manifest "
              "records no layout of bucket 'pbuf:gb:0' of stage 0 (16 "
              "elements), which its state 'adam.exp_avg:pbuf:gb:0' shards");
  // Parameters only: fine, and "init" recomputes the shards.
  o.loadOptimizer = false;
  auto plan = planCheckpointLoad(m, *dp1, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_TRUE(hasNote(plan->notes, "'main:pbuf:gb:0') are optimizer state"))
      << allNotes(plan->notes);
}

TEST(MainParamTest, ParameterDtypeChangesConvert) {
  CheckpointLoadOptions o, paramsOnly;
  paramsOnly.loadOptimizer = false;
  auto f32 = load(shardedModel(2, 1), "f32.tsr");
  auto bf16 = load(shardedModel(2, 1, 4, "adam", 8, false, true), "bf16.tsr");
  // F32 checkpoint into bf16 parameters: rounded; the main params are the
  // checkpoint's F32 parameters.
  CheckpointManifest m32 = manifestOf(*f32);
  auto plan = planCheckpointLoad(m32, *bf16, 0, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_TRUE(hasNote(plan->notes, "2 parameters ('b', ...) converted from F32 "
                                   "in the checkpoint to BF16 (rounded to "
                                   "nearest even)"))
      << allNotes(plan->notes);
  EXPECT_TRUE(hasNote(plan->notes, "fp32 main params 2 ('main:w', ...) "
                                   "restored from the checkpoint's F32 "
                                   "parameters"))
      << allNotes(plan->notes);
  const BufferRestore *w = findRestore(*plan, "w"),
                      *mw = findRestore(*plan, "main:w");
  ASSERT_TRUE(w && mw);
  EXPECT_EQ(w->dtype, fb::DType::BF16);
  EXPECT_EQ(w->pieces[0].dtype, fb::DType::F32);
  EXPECT_EQ(mw->pieces[0].sourceName, "w");
  EXPECT_EQ(mw->pieces[0].dtype, fb::DType::F32);
  // Without optimizer state "init" computes them.
  plan = planCheckpointLoad(m32, *bf16, 0, paramsOnly, "ckpt");
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(findRestore(*plan, "main:w"));
  // A bf16 checkpoint into F32 parameters: from its main params (exact), or
  // widened without optimizer state.
  CheckpointManifest m16 = manifestOf(*bf16);
  plan = planCheckpointLoad(m16, *f32, 1, o, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  w = findRestore(*plan, "w");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->pieces[0].sourceName, "main:w");
  EXPECT_EQ(w->pieces[0].dtype, fb::DType::F32);
  EXPECT_TRUE(hasNote(plan->notes, "F32 parameters 2 ('w', ...) restored from "
                                   "the checkpoint's fp32 main params"))
      << allNotes(plan->notes);
  EXPECT_FALSE(hasNote(plan->notes, "converted")) << allNotes(plan->notes);
  plan = planCheckpointLoad(m16, *f32, 1, paramsOnly, "ckpt");
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(hasNote(plan->notes, "2 parameters ('b', ...) converted from "
                                   "BF16 in the checkpoint to F32 (exact)"))
      << allNotes(plan->notes);
  w = findRestore(*plan, "w");
  EXPECT_EQ(w->pieces[0].sourceName, "w");
  EXPECT_EQ(w->pieces[0].dtype, fb::DType::BF16);
  // Other dtypes do not convert.
  for (ManifestTensor &t : m32.tensors)
    if (t.name == "w")
      t.dtype = fb::DType::I32;
  expectError(planCheckpointLoad(m32, *bf16, 0, o, "ckpt").status(),
              "parameter 'w' is I32 in checkpoint ckpt but BF16 in bf16.tsr: "
              "only float (F32, BF16, F16) parameters convert into each "
              "other");
}

//===----------------------------------------------------------------------===//
// Save and load on one rank
//===----------------------------------------------------------------------===//

namespace {

std::unique_ptr<Executor> makeExecutor(std::shared_ptr<const LoadedArtifact> a,
                                       uint64_t seed) {
  auto backend = BackendRegistry::global().create("cpu", {});
  EXPECT_TRUE(backend.ok());
  ExecutorOptions options;
  options.seed = seed;
  auto ex =
      Executor::create(a, std::move(*backend), CommunicatorSet(), 0, options);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  EXPECT_TRUE((*ex)->initializeParameters().ok());
  return std::move(*ex);
}

} // namespace

TEST(SaveLoadTest, ResumedRunIsBitIdentical) {
  TempDir dir;
  auto art = load(softmaxRegression(8, 4, 16, 2));
  auto reference = makeExecutor(art, 1234);
  std::vector<double> expected;
  for (int it = 1; it <= 6; ++it)
    expected.push_back(*reference->runIteration(it));

  auto first = makeExecutor(art, 1234);
  for (int it = 1; it <= 3; ++it)
    ASSERT_TRUE(first->runIteration(it).ok());
  CheckpointSaveOptions so;
  so.dir = dir.path + "/ckpt";
  so.info.iteration = 3;
  so.info.seed = 1234;
  auto saved = saveCheckpoint(*first, so, nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status().toString();
  EXPECT_EQ(saved->dir, so.dir + "/iter_0000003");
  EXPECT_EQ(listDir(saved->dir),
            (std::vector<std::string>{"manifest.json", "rank_00000.bin"}));
  EXPECT_EQ(*readWholeFile(so.dir + "/latest"), "3\n");

  // A fresh executor with another init seed would differ; loading wins.
  auto resumed = makeExecutor(art, 1234);
  CheckpointLoadOptions lo;
  auto loaded = loadCheckpoint(*resumed, so.dir, lo, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_EQ(loaded->iteration, 3);
  EXPECT_FALSE(loaded->resharded);
  for (const char *name : {"fc.weight", "fc.bias", "adam.m:fc.weight",
                           "adam.v:fc.bias", "iteration"})
    EXPECT_EQ(*resumed->readBuffer(name), *first->readBuffer(name)) << name;
  for (int it = 4; it <= 6; ++it) {
    auto loss = resumed->runIteration(it);
    ASSERT_TRUE(loss.ok());
    EXPECT_EQ(*loss, expected[size_t(it - 1)]) << "iteration " << it;
  }

  // Loading the iter_ directory itself works; a broken one is refused.
  auto again = makeExecutor(art, 1234);
  EXPECT_TRUE(loadCheckpoint(*again, saved->dir, lo, nullptr).ok());
  std::string shard = saved->dir + "/rank_00000.bin";
  std::string bytes = *readWholeFile(shard);
  bytes[bytes.size() / 2] ^= 1;
  writeBytes(shard, bytes);
  expectError(loadCheckpoint(*again, so.dir, lo, nullptr).status(),
              shard + ": payload is corrupted (CRC-32 mismatch");
  ASSERT_EQ(unlink((saved->dir + "/manifest.json").c_str()), 0);
  expectError(loadCheckpoint(*again, so.dir, lo, nullptr).status(),
              saved->dir + "/manifest.json: missing");
}

TEST(LocateTest, LatestAndIterDirectories) {
  TempDir dir;
  expectError(locateCheckpoint(dir.path + "/none").status(),
              "/none: no checkpoint directory");
  auto empty = locateCheckpoint(dir.path);
  EXPECT_EQ(empty.status().getCode(), StatusCode::NotFound);
  ASSERT_TRUE(writeFileAtomic(dir.path + "/latest", std::string("12\n")).ok());
  expectError(locateCheckpoint(dir.path).status(),
              "/latest names iteration 12, but " + dir.path +
                  "/iter_0000012 does not exist");
  ASSERT_TRUE(makeDirectories(dir.path + "/iter_0000012").ok());
  auto loc = locateCheckpoint(dir.path);
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->iteration, 12);
  EXPECT_EQ(loc->dir, dir.path + "/iter_0000012");
  expectError(readManifest(*loc).status(),
              "/iter_0000012/manifest.json: missing");
  expectError(locateCheckpoint(dir.path + "/iter_0000012").status(),
              "/iter_0000012/manifest.json: missing");
  ASSERT_TRUE(writeFileAtomic(dir.path + "/latest", std::string("x")).ok());
  expectError(locateCheckpoint(dir.path).status(),
              "/latest: expected an iteration number, got 'x'");
}

//===----------------------------------------------------------------------===//
// Mixed precision save and load on one rank
//===----------------------------------------------------------------------===//

TEST(SaveLoadTest, MixedPrecisionResumeRestoresMainParams) {
  TempDir dir;
  auto art = load(mixedPrecisionRegression(8, 4, 16, 2, 1, true));
  auto reference = makeExecutor(art, 1234);
  std::vector<double> expected;
  for (int it = 1; it <= 6; ++it)
    expected.push_back(*reference->runIteration(it));

  auto first = makeExecutor(art, 1234);
  for (int it = 1; it <= 3; ++it)
    ASSERT_TRUE(first->runIteration(it).ok());
  CheckpointSaveOptions so;
  so.dir = dir.path + "/ckpt";
  so.info.iteration = 3;
  so.info.seed = 1234;
  auto saved = saveCheckpoint(*first, so, nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status().toString();
  auto shard = readShardFile(saved->dir + "/rank_00000.bin");
  ASSERT_TRUE(shard.ok());
  const ShardTensor *main = shard->find("main:fc.weight");
  ASSERT_TRUE(main);
  EXPECT_EQ(main->kind, fb::BufferKind::MainParam);
  EXPECT_EQ(main->dtype, fb::DType::F32);
  EXPECT_EQ(shard->find("fc.weight")->dtype, fb::DType::BF16);
  EXPECT_FALSE(shard->find("grad:fc.weight"));

  // Everything restored: "init" is skipped and the run continues bit for
  // bit (the main params keep the precision the bf16 params lost).
  auto resumed = makeExecutor(art, 1234);
  CheckpointLoadOptions lo;
  auto loaded = loadCheckpoint(*resumed, so.dir, lo, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_TRUE(loaded->notes.empty()) << allNotes(loaded->notes);
  auto ran = resumed->runInit();
  ASSERT_TRUE(ran.ok());
  EXPECT_FALSE(*ran);
  for (const char *name :
       {"fc.weight", "main:fc.weight", "main:fc.bias", "adam.v:fc.weight"})
    EXPECT_EQ(*resumed->readBuffer(name), *first->readBuffer(name)) << name;
  for (int it = 4; it <= 6; ++it) {
    auto loss = resumed->runIteration(it);
    ASSERT_TRUE(loss.ok());
    EXPECT_EQ(*loss, expected[size_t(it - 1)]) << "iteration " << it;
  }

  // --no-load-optim: "init" recomputes the main params from the params.
  auto paramsOnly = makeExecutor(art, 1234);
  lo.loadOptimizer = false;
  loaded = loadCheckpoint(*paramsOnly, so.dir, lo, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_TRUE(hasNote(loaded->notes, "'init' computes them"))
      << allNotes(loaded->notes);
  EXPECT_TRUE(*paramsOnly->runInit());
  EXPECT_EQ(*paramsOnly->readFloatBuffer("main:fc.weight"),
            *first->readFloatBuffer("fc.weight"));
  EXPECT_NE(*paramsOnly->readFloatBuffer("main:fc.weight"),
            *first->readFloatBuffer("main:fc.weight"));
}

TEST(SaveLoadTest, F32AndBf16CheckpointsLoadIntoEachOther) {
  TempDir dir;
  auto f32 = load(softmaxRegression(8, 4, 16, 2), "f32.tsr");
  auto bf16 = load(mixedPrecisionRegression(8, 4, 16, 2), "bf16.tsr");
  auto save = [&](Executor &ex, const std::string &path) {
    for (int it = 1; it <= 2; ++it)
      EXPECT_TRUE(ex.runIteration(it).ok());
    CheckpointSaveOptions so;
    so.dir = path;
    so.info.iteration = 2;
    so.info.seed = 1234;
    EXPECT_TRUE(saveCheckpoint(ex, so, nullptr).ok());
  };
  auto f32Run = makeExecutor(f32, 1234);
  save(*f32Run, dir.path + "/f32");
  auto bf16Run = makeExecutor(bf16, 1234);
  save(*bf16Run, dir.path + "/bf16");
  CheckpointLoadOptions lo, paramsOnly;
  paramsOnly.loadOptimizer = false;

  // F32 into bf16: parameters rounded, main params exact, init skipped.
  auto a = makeExecutor(bf16, 1234);
  auto loaded = loadCheckpoint(*a, dir.path + "/f32", lo, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  std::vector<float> w32 = *f32Run->readFloatBuffer("fc.weight");
  std::vector<uint8_t> wBits = *a->readBuffer("fc.weight");
  for (size_t i = 0; i < w32.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, wBits.data() + 2 * i, 2);
    EXPECT_EQ(h, floatToBf16(w32[i])) << "element " << i;
  }
  EXPECT_EQ(*a->readFloatBuffer("main:fc.weight"), w32);
  EXPECT_EQ(*a->readBuffer("adam.m:fc.weight"),
            *f32Run->readBuffer("adam.m:fc.weight"));
  EXPECT_FALSE(*a->runInit());
  EXPECT_TRUE(a->runIteration(3).ok());

  // bf16 into F32: from the main params, or widened without optimizer
  // state.
  auto b = makeExecutor(f32, 1234);
  ASSERT_TRUE(loadCheckpoint(*b, dir.path + "/bf16", lo, nullptr).ok());
  EXPECT_EQ(*b->readFloatBuffer("fc.weight"),
            *bf16Run->readFloatBuffer("main:fc.weight"));
  auto c = makeExecutor(f32, 1234);
  ASSERT_TRUE(loadCheckpoint(*c, dir.path + "/bf16", paramsOnly, nullptr).ok());
  EXPECT_EQ(*c->readFloatBuffer("fc.weight"),
            *bf16Run->readFloatBuffer("fc.weight"));
  EXPECT_TRUE(c->runIteration(3).ok());
}

// The watchdog's view of a step: nothing until it has lasted the timeout,
// then the step, how long it made no progress and what it waits on.
TEST(WaitMonitorTest, ReportsAStepOnceItLastsTheTimeout) {
  using On = WaitMonitor::On;
  WaitMonitor m;
  EXPECT_EQ(m.stalled(0), "");
  m.begin("saving checkpoint iteration 5 to D: waiting for X", On::Peers);
  EXPECT_EQ(m.stalled(3600), "");
  On on = On::FileSystem;
  EXPECT_EQ(m.stalled(0, &on), "saving checkpoint iteration 5 to D: waiting "
                               "for X made no progress for 0 s");
  EXPECT_EQ(on, On::Peers);
  {
    WaitMonitor::Step step(&m, "writing F", On::FileSystem);
    EXPECT_EQ(m.stalled(0, &on), "writing F made no progress for 0 s");
    EXPECT_EQ(on, On::FileSystem);
    WaitMonitor::Step none(nullptr, "untracked", On::Peers);
  }
  EXPECT_EQ(m.stalled(0), "");
  EXPECT_STREQ(WaitMonitor::likelyCause(On::Peers),
               "a peer rank may have died or stalled");
  EXPECT_STREQ(WaitMonitor::likelyCause(On::FileSystem),
               "the file system may have stalled");
}

// Save and load leave no step marked when they return, successfully or
// with an error, so the watchdog never reports a finished checkpoint.
TEST(SaveLoadTest, StepsEndWhenSaveAndLoadReturn) {
  TempDir dir;
  auto art = load(softmaxRegression(8, 4, 16, 2));
  auto ex = makeExecutor(art, 1234);
  WaitMonitor monitor;
  CheckpointSaveOptions so;
  so.dir = dir.path + "/ckpt";
  so.info.iteration = 1;
  so.info.seed = 1234;
  so.monitor = &monitor;
  ASSERT_TRUE(saveCheckpoint(*ex, so, nullptr).ok());
  EXPECT_EQ(monitor.stalled(0), "");
  CheckpointLoadOptions lo;
  lo.monitor = &monitor;
  ASSERT_TRUE(loadCheckpoint(*ex, so.dir, lo, nullptr).ok());
  EXPECT_EQ(monitor.stalled(0), "");
  std::string shard = so.dir + "/iter_0000001/rank_00000.bin";
  std::string bytes = *readWholeFile(shard);
  bytes[bytes.size() / 2] ^= 1;
  writeBytes(shard, bytes);
  EXPECT_FALSE(loadCheckpoint(*ex, so.dir, lo, nullptr).ok());
  EXPECT_EQ(monitor.stalled(0), "");
  EXPECT_FALSE(loadCheckpoint(*ex, dir.path + "/none", lo, nullptr).ok());
  EXPECT_EQ(monitor.stalled(0), "");
}

// What interrupted saves leave in --save DIR goes at the next start: iter_
// directories without a manifest (but the one `latest` names) and atomic
// writes' temporary files; nothing else.
TEST(CleanInterruptedSavesTest, RemovesOnlyWhatSavesLeft) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 ("tessera-clean-saves-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto touch = [](const fs::path &p) { std::ofstream(p) << "x"; };
  fs::create_directories(dir / "iter_0000001");
  touch(dir / "iter_0000001/manifest.json");
  touch(dir / "iter_0000001/rank_00000.bin");
  touch(dir / "iter_0000001/rank_00001.bin.tmp.77");
  fs::create_directories(dir / "iter_0000002"); // latest names it: kept
  touch(dir / "iter_0000002/rank_00000.bin");
  fs::create_directories(dir / "iter_0000003"); // interrupted
  touch(dir / "iter_0000003/rank_00000.bin");
  fs::create_directories(dir / "iter_other"); // not a checkpoint's name
  std::ofstream(dir / "latest") << "2\n";
  touch(dir / "latest.tmp.12");
  touch(dir / "notes.tmp.txt");
  touch(dir / "data.tmp.1x");

  auto cleaned = cleanInterruptedSaves(dir.string());
  ASSERT_TRUE(cleaned.ok()) << cleaned.status().toString();
  ASSERT_EQ(cleaned->iterDirs.size(), 1u);
  EXPECT_EQ(cleaned->iterDirs[0], (dir / "iter_0000003").string());
  EXPECT_EQ(cleaned->tempFiles, 2);
  EXPECT_FALSE(fs::exists(dir / "iter_0000003"));
  EXPECT_FALSE(fs::exists(dir / "latest.tmp.12"));
  EXPECT_FALSE(fs::exists(dir / "iter_0000001/rank_00001.bin.tmp.77"));
  for (const char *kept :
       {"iter_0000001/manifest.json", "iter_0000001/rank_00000.bin",
        "iter_0000002/rank_00000.bin", "iter_other", "latest",
        "notes.tmp.txt", "data.tmp.1x"})
    EXPECT_TRUE(fs::exists(dir / kept)) << kept;

  // Nothing left to clean; a directory that does not exist is fine.
  cleaned = cleanInterruptedSaves(dir.string());
  ASSERT_TRUE(cleaned.ok());
  EXPECT_TRUE(cleaned->iterDirs.empty());
  EXPECT_EQ(cleaned->tempFiles, 0);
  EXPECT_TRUE(cleanInterruptedSaves((dir / "none").string()).ok());
  fs::remove_all(dir);
}
