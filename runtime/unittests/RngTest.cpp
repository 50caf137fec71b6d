//===- RngTest.cpp - Philox RNG and sharded init --------------------------===//

#include "tessera/rt/Rng.h"
#include "tessera/rt/Data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

using namespace tessera::rt;

TEST(RngTest, PhiloxKnownAnswers) {
  // Random123 known-answer vectors for philox4x32-10.
  auto a = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(a[0], 0x6627e8d5u);
  EXPECT_EQ(a[1], 0xe169c58du);
  EXPECT_EQ(a[2], 0xbc57ac4cu);
  EXPECT_EQ(a[3], 0x9b00dbd8u);
  auto b = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                         {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(b[0], 0x408f276du);
  EXPECT_EQ(b[1], 0x41c83b0eu);
  EXPECT_EQ(b[2], 0xa20bc7c6u);
  EXPECT_EQ(b[3], 0x6d5451fdu);
  auto c = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                         {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(c[0], 0xd16cfe09u);
  EXPECT_EQ(c[1], 0x94fdccebu);
  EXPECT_EQ(c[2], 0x5001e420u);
  EXPECT_EQ(c[3], 0x24126ea1u);
}

TEST(RngTest, Fnv1a) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}

TEST(RngTest, Deterministic) {
  for (uint64_t i : {0ull, 1ull, 12345ull, (1ull << 40) + 7}) {
    EXPECT_EQ(uniform(7, "w", i), uniform(7, "w", i));
    EXPECT_EQ(normal(7, "w", i), normal(7, "w", i));
    EXPECT_EQ(PhiloxStream(7, "w").normal(i), normal(7, "w", i));
  }
  EXPECT_NE(uniform(7, "w", 3), uniform(8, "w", 3));
  EXPECT_NE(uniform(7, "w", 3), uniform(7, "v", 3));
  EXPECT_NE(uniform(7, "w", 3), uniform(7, "w", 4));
}

TEST(RngTest, DistributionSanity) {
  const int n = 100000;
  double sum = 0, sq = 0, usum = 0;
  double umin = 1, umax = 0;
  PhiloxStream s(1234, "sanity");
  for (int i = 0; i < n; ++i) {
    double z = s.normal(uint64_t(i));
    sum += z;
    sq += z * z;
    double u = s.uniform(uint64_t(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    usum += u;
    umin = std::min(umin, u);
    umax = std::max(umax, u);
  }
  double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std, 1.0, 0.02);
  EXPECT_NEAR(usum / n, 0.5, 0.01);
  EXPECT_LT(umin, 1e-3);
  EXPECT_GT(umax, 1 - 1e-3);
}

TEST(RngTest, ShardInitEqualsSliceOfFullInit) {
  std::vector<int64_t> shape = {6, 8, 3};
  std::vector<float> full(6 * 8 * 3);
  ASSERT_TRUE(initParameterShard(tessera::artifact::InitKind::Normal, 0.02f, 99,
                                 "layer.weight", shape, -1, 0, 1, full.data())
                  .ok());
  // Element g of the full tensor is 0.02 * normal(seed, name, g).
  for (size_t g = 0; g < full.size(); ++g)
    ASSERT_EQ(full[g], float(double(0.02f) * normal(99, "layer.weight", g)));
  for (int dim = 0; dim < 3; ++dim) {
    int parts = dim == 2 ? 3 : 2;
    std::vector<int64_t> local = shape;
    local[size_t(dim)] /= parts;
    for (int s = 0; s < parts; ++s) {
      std::vector<float> shard(full.size() / size_t(parts));
      ASSERT_TRUE(initParameterShard(tessera::artifact::InitKind::Normal, 0.02f,
                                     99, "layer.weight", shape, dim, s, parts,
                                     shard.data())
                      .ok());
      size_t k = 0;
      for (int64_t i = 0; i < local[0]; ++i)
        for (int64_t j = 0; j < local[1]; ++j)
          for (int64_t l = 0; l < local[2]; ++l, ++k) {
            int64_t gi[3] = {i, j, l};
            gi[dim] += s * local[size_t(dim)];
            size_t g = size_t((gi[0] * 8 + gi[1]) * 3 + gi[2]);
            ASSERT_EQ(shard[k], full[g]) << "dim " << dim << " shard " << s;
          }
    }
  }
  std::vector<float> bad(10);
  EXPECT_FALSE(initParameterShard(tessera::artifact::InitKind::Normal, 1.0f, 1,
                                  "x", {5, 4}, 0, 0, 2, bad.data())
                   .ok());
}

// A parameter split along two dims (the experts over ep, their FFN over
// etp) gets the elements of its block of the full tensor, whichever dims
// the block covers whole.
TEST(RngTest, BlockInitEqualsBlockOfFullInit) {
  std::vector<int64_t> shape = {4, 6, 5};
  std::vector<float> full(4 * 6 * 5);
  ASSERT_TRUE(initParameterShard(tessera::artifact::InitKind::Normal, 0.02f, 7,
                                 "experts.fc1", shape, -1, 0, 1, full.data())
                  .ok());
  const std::vector<TensorBlock> blocks = {
      {{2, 3, 0}, {2, 3, 5}}, // dims 0 and 1 split (ep x etp on fc1)
      {{0, 0, 0}, {4, 6, 5}}, // whole
      {{2, 0, 1}, {2, 6, 2}}, // dims 0 and 2 split (ep x etp on fc2)
      {{1, 2, 3}, {1, 1, 1}}, // one element
  };
  for (const TensorBlock &block : blocks) {
    std::vector<float> out(size_t(block.extent[0] * block.extent[1] *
                                  block.extent[2]));
    ASSERT_TRUE(initParameterBlock(tessera::artifact::InitKind::Normal, 0.02f,
                                   7, "experts.fc1", shape, block, out.data())
                    .ok());
    size_t k = 0;
    for (int64_t i = 0; i < block.extent[0]; ++i)
      for (int64_t j = 0; j < block.extent[1]; ++j)
        for (int64_t l = 0; l < block.extent[2]; ++l, ++k) {
          size_t g = size_t(((block.lo[0] + i) * 6 + block.lo[1] + j) * 5 +
                            block.lo[2] + l);
          ASSERT_EQ(out[k], full[g]) << "element " << k;
        }
  }
}

TEST(RngTest, UniformOnesZerosInit) {
  std::vector<float> v(50);
  ASSERT_TRUE(initParameterShard(tessera::artifact::InitKind::Uniform, 0.5f, 3,
                                 "u", {50}, -1, 0, 1, v.data())
                  .ok());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], float(double(0.5f) * (2 * uniform(3, "u", i) - 1)));
    EXPECT_LE(std::fabs(v[i]), 0.5f);
  }
  ASSERT_TRUE(initParameterShard(tessera::artifact::InitKind::Ones, 0, 3, "o",
                                 {50}, -1, 0, 1, v.data())
                  .ok());
  for (float x : v)
    EXPECT_EQ(x, 1.0f);
}

TEST(DataTest, SameSamplesForEveryLayout) {
  // dp = 2, micro 4, 2 microbatches == dp 1, micro 8, 1 microbatch covers
  // the same global indices per iteration.
  DataLayout a{1234, 16, 4, 0, 2};
  DataLayout b{1234, 16, 8, 0, 1};
  std::set<int64_t> sa, sb;
  for (int r = 0; r < 2; ++r) {
    a.dpIndex = r;
    for (int m = 0; m < 2; ++m)
      for (int i = 0; i < 4; ++i)
        sa.insert(globalSampleIndex(a, 3, m, i));
  }
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < 8; ++i)
      sb.insert(globalSampleIndex(b, 3, m, i));
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(*sa.begin(), 32);
  EXPECT_EQ(*sa.rbegin(), 47);
  for (int64_t g = 0; g < 100; ++g) {
    int32_t l = syntheticLabel(1234, g, 10);
    EXPECT_GE(l, 0);
    EXPECT_LT(l, 10);
  }
}

//===----------------------------------------------------------------------===//
// Parameters initialised from data (imported models)
//===----------------------------------------------------------------------===//

namespace {
namespace fb = tessera::artifact;

/// An artifact with a tp group {0, 1} and one parameter of global shape
/// `global` split along `shardDim` over tp, initialised from `data`
/// (inline) or from `file` at `offset`.
/// With `shard2Dim` >= 0 there are four ranks, tp groups {0, 1} and
/// {2, 3}, and a second split of `shard2Dim` over the cp groups {0, 2} and
/// {1, 3}.
std::string dataParamArtifact(std::vector<int64_t> global, int shardDim,
                              std::vector<int64_t> dataShape,
                              const std::vector<float> &data,
                              const std::string &file = "", int64_t offset = 0,
                              int shard2Dim = -1,
                              const std::string &dataDir = "") {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<int64_t> local = global;
  if (shardDim >= 0)
    local[size_t(shardDim)] /= 2;
  if (shard2Dim >= 0 && shard2Dim != shardDim)
    local[size_t(shard2Dim)] /= 2;
  auto name = fbb.CreateString("w");
  auto shape = fbb.CreateVector(local);
  auto globalVec = fbb.CreateVector(global);
  auto axis = fbb.CreateString("tp");
  auto axis2 = fbb.CreateString("cp");
  auto dataShapeVec = fbb.CreateVector(dataShape);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> bytes;
  flatbuffers::Offset<flatbuffers::String> fileName, dirName;
  if (file.empty()) {
    bytes = fbb.CreateVector(reinterpret_cast<const uint8_t *>(data.data()),
                             data.size() * 4);
  } else {
    fileName = fbb.CreateString(file);
    dirName = fbb.CreateString(dataDir);
  }
  fb::BufferBuilder bb(fbb);
  bb.add_name(name);
  bb.add_kind(fb::BufferKind::Param);
  bb.add_shape(shape);
  bb.add_global_shape(globalVec);
  bb.add_shard_dim(shardDim);
  bb.add_shard_axis(axis);
  if (shard2Dim >= 0) {
    bb.add_shard2_dim(shard2Dim);
    bb.add_shard2_axis(axis2);
  }
  bb.add_init(fb::InitKind::Data);
  bb.add_data_shape(dataShapeVec);
  if (file.empty())
    bb.add_data(bytes);
  else {
    bb.add_data_file(fileName);
    bb.add_data_dir(dirName);
    bb.add_data_offset(offset);
  }
  auto buffer = bb.Finish();
  auto buffers = fbb.CreateVector(std::vector{buffer});
  auto program = fb::CreateProgram(fbb, 0, 0, 0, buffers);
  auto programs = fbb.CreateVector(std::vector{program});
  std::vector<flatbuffers::Offset<fb::RankGroup>> list;
  auto add = [&](const char *kind, std::vector<int> ranks) {
    list.push_back(fb::CreateRankGroup(fbb, fbb.CreateString(kind),
                                       fbb.CreateVector(ranks)));
  };
  add("tp", {0, 1});
  if (shard2Dim >= 0) {
    add("tp", {2, 3});
    add("cp", {0, 2});
    add("cp", {1, 3});
  }
  auto groups = fbb.CreateVector(list);
  fb::ArtifactBuilder ab(fbb);
  ab.add_groups(groups);
  ab.add_programs(programs);
  fbb.Finish(ab.Finish());
  return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
                     fbb.GetSize());
}

Status initRank(const std::string &payload, int rank, std::vector<float> &out,
                const std::string &fileName = "/tmp/model.tsr") {
  const fb::Artifact *a = fb::GetArtifact(payload.data());
  const fb::Buffer *b = a->programs()->Get(0)->buffers()->Get(0);
  int64_t n = 1;
  for (int64_t d : *b->shape())
    n *= d;
  out.assign(size_t(n), -1.0f);
  return initParameterBuffer(*a, *b, rank, 7, fileName, out.data());
}
} // namespace

TEST(DataInitTest, ShardsOfInlineDataWithPaddedRows) {
  // A [5, 4] table padded to 6 rows (a padded vocabulary): row 5 is zero.
  std::vector<float> data(20);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = float(i) + 0.5f;
  auto value = [&](int64_t r, int64_t c) {
    return r < 5 ? data[size_t(r * 4 + c)] : 0.0f;
  };
  for (int dim : {0, 1, -1}) {
    std::string payload = dataParamArtifact({6, 4}, dim, {5, 4}, data);
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<float> out;
      Status st = initRank(payload, rank, out);
      ASSERT_TRUE(st.ok()) << st.message();
      int64_t rows = dim == 0 ? 3 : 6, cols = dim == 1 ? 2 : 4;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          int64_t gr = r + (dim == 0 ? rank * 3 : 0);
          int64_t gc = c + (dim == 1 ? rank * 2 : 0);
          ASSERT_EQ(out[size_t(r * cols + c)], value(gr, gc))
              << "dim " << dim << " rank " << rank << " at " << r << "," << c;
        }
    }
  }
}

// Split along two dims (the experts over ep and their FFN over etp):
// each of four ranks gets its block of the global tensor; a dim split
// twice, or an axis without a group holding the rank, is an error.
TEST(DataInitTest, BlocksOfTwoSplits) {
  std::vector<float> data(24);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = float(i);
  std::string payload =
      dataParamArtifact({4, 6}, 1, {4, 6}, data, "", 0, /*shard2Dim=*/0);
  for (int rank = 0; rank < 4; ++rank) {
    // tp index rank % 2 along dim 1, cp index rank / 2 along dim 0.
    std::vector<float> out;
    Status st = initRank(payload, rank, out);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(out.size(), 6u);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(out[size_t(r * 3 + c)],
                  data[size_t((r + 2 * (rank / 2)) * 6 + c + 3 * (rank % 2))])
            << "rank " << rank << " at " << r << "," << c;
  }
  std::vector<float> out;
  Status st = initRank(
      dataParamArtifact({4, 6}, 1, {4, 6}, data, "", 0, /*shard2Dim=*/1), 0,
      out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shard dim 1 (over 'cp') is out of range or split "
                              "twice"),
            std::string::npos)
      << st.message();
  // Rank 5 is in no group of the axes.
  st = initRank(payload, 5, out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no rank group of shard axis 'tp' contains rank 5"),
            std::string::npos)
      << st.message();
}

TEST(DataInitTest, ExternalFileIsMappedAtItsOffset) {
  std::vector<float> data(24);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = -float(i);
  std::string dir = ::testing::TempDir();
  std::string path = dir + "/weights.bin";
  {
    FILE *f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    char header[10] = {};
    std::fwrite(header, 1, sizeof(header), f);
    std::fwrite(data.data(), 4, data.size(), f);
    std::fclose(f);
  }
  // In its data directory; shard 1 of dim 0 is rows 3..5.
  std::string payload =
      dataParamArtifact({6, 4}, 0, {6, 4}, {}, "weights.bin", 10, -1, dir);
  std::vector<float> out;
  Status st = initRank(payload, 1, out, "/elsewhere/model.tsr");
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], data[12 + i]);
  // A file shorter than the tensor, and a missing file, are errors naming it.
  std::string shortPayload =
      dataParamArtifact({6, 4}, 0, {6, 4}, {}, "weights.bin", 20, -1, dir);
  st = initRank(shortPayload, 0, out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("weights.bin' holds 106 bytes"), std::string::npos)
      << st.message();
  st = initRank(dataParamArtifact({6, 4}, 0, {6, 4}, {}, "none.bin", 0, -1, dir),
                0, out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot find the data file 'none.bin'"),
            std::string::npos)
      << st.message();
  // An absolute path (a crafted artifact) is refused.
  st = initRank(dataParamArtifact({6, 4}, 0, {6, 4}, {}, path, 10, -1, "/"), 0,
                out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is not a path relative to its data directory"),
            std::string::npos)
      << st.message();
  // A data directory that no longer holds it: the file of that name next to
  // the artifact (an artifact moved together with its data).
  std::string moved = dataParamArtifact({6, 4}, 0, {6, 4}, {}, "weights.bin",
                                        10, -1, "/no/such/dir");
  st = initRank(moved, 1, out, dir + "/model.tsr");
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], data[12 + i]);
}

TEST(DataInitTest, BadDataIsAnError) {
  // Inline data of the wrong size, and a data_shape wider than the tensor.
  std::vector<float> out;
  Status st = initRank(dataParamArtifact({6, 4}, 0, {6, 4}, std::vector<float>(5)),
                       0, out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("inline data holds 20 bytes"), std::string::npos)
      << st.message();
  st = initRank(dataParamArtifact({6, 4}, 0, {6, 5}, std::vector<float>(30)), 0,
                out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("beyond dim 0"), std::string::npos) << st.message();
}
