//===- MakeSeeds.cpp - Seed corpora for the runtime fuzz targets ----------===//
//
// tessera-fuzz-seeds OUTDIR: writes small valid inputs for each runtime
// fuzz target into OUTDIR/TARGET/ (artifact_loader: .tsr files built with
// the unit tests' artifact builders, runtime/unittests/TestArtifacts.h;
// checkpoint_manifest: their manifest.json; checkpoint_shard: shard files;
// dataset_index: .idx/.bin pairs in the target's framing, [LE32 n][n bytes
// of .idx][.bin]). Run by fuzz/make-seeds.sh; nothing it writes is
// committed.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/Artifact.h"
#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/checkpoint/Manifest.h"
#include "tessera/rt/checkpoint/ShardFile.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace tessera;
using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

std::string outDir;

void put(const std::string &target, const std::string &name,
         const std::string &bytes) {
  std::string dir = outDir + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::string path = dir + "/" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f)) {
    std::fprintf(stderr, "tessera-fuzz-seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void check(const Status &st) {
  if (!st.ok()) {
    std::fprintf(stderr, "tessera-fuzz-seeds: %s\n", st.toString().c_str());
    std::exit(1);
  }
}

void artifactSeeds() {
  std::vector<std::pair<std::string, ArtifactDesc>> models = {
      {"softmax", softmaxRegression()},
      {"softmax_dp2_sgd", softmaxRegression(8, 4, 16, 2, 2, false)},
      {"mixed", mixedPrecisionRegression()},
      {"mixed_bf16grads", mixedPrecisionRegression(8, 4, 16, 2, 2, true)},
      {"slotted", slottedSchedule()},
      {"two_stage", twoStagePipeline()},
      {"sharded_buckets", shardedBuckets(2, 2, 4)},
      {"sharded_buckets_bf16", shardedBuckets(2, 2, 4, fb::DType::BF16)},
      {"tp_comm_overlap", tpCommOverlap(2, 6, 5, 7)},
      {"tp_comm_overlap_bf16", tpCommOverlap(2, 6, 5, 7, fb::DType::BF16)},
      {"zero3_bucket", zero3Bucket()},
  };
  int n = 0;
  for (auto &[name, desc] : models) {
    std::string file = buildFile(buildPayload(desc));
    put("artifact_loader", name + ".tsr", file);
    auto loaded = LoadedArtifact::loadFromMemory(file, name + ".tsr");
    check(loaded.status());
    CheckpointRunInfo info;
    info.iteration = 10 + n;
    info.seed = 1234;
    if (n % 2) {
      info.datasetPrefix = "data/corpus_text_document";
      info.datasetTokens = 4096;
    }
    auto manifest = describeCheckpoint(**loaded, info);
    check(manifest.status());
    for (int r = 0; r < manifest->worldSize; ++r)
      manifest->files.push_back({r, shardFileName(r), 4096, 0x1234abcdu});
    put("checkpoint_manifest", name + ".json", manifestToJson(*manifest));
    ++n;
  }
}

void shardSeeds() {
  ShardFile s;
  s.rank = 1;
  s.worldSize = 4;
  s.iteration = 10;
  s.consumedSamples = 80;
  s.seed = 1234;
  ShardTensor w;
  w.name = "fc.weight";
  w.shape = {3, 5};
  w.data.resize(15 * 4);
  for (size_t i = 0; i < w.data.size(); ++i)
    w.data[i] = uint8_t(i * 7 + 1);
  ShardTensor m = w;
  m.name = "adam.exp_avg:fc.weight";
  m.kind = fb::BufferKind::OptState;
  ShardTensor b;
  b.name = "fc.bias";
  b.dtype = fb::DType::BF16;
  b.shape = {5};
  b.data.assign(10, 0x3f);
  ShardTensor it;
  it.name = "iteration";
  it.kind = fb::BufferKind::Iteration;
  it.dtype = fb::DType::I64;
  it.data.assign(8, 0);
  it.data[0] = 10;
  ShardTensor empty;
  empty.name = "empty";
  empty.shape = {0, 4};
  s.tensors = {w, m, b, it, empty};
  put("checkpoint_shard", "four_tensors.bin", encodeShard(s));
  s.tensors = {it};
  s.rank = 0;
  s.worldSize = 1;
  put("checkpoint_shard", "iteration_only.bin", encodeShard(s));
  s.tensors.clear();
  put("checkpoint_shard", "empty.bin", encodeShard(s));
}

void datasetSeeds() {
  struct Case {
    const char *name;
    TokenDType dtype;
    std::vector<std::vector<int64_t>> docs;
  };
  std::vector<Case> cases = {
      {"uint16", TokenDType::UInt16, {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10}}},
      {"int32", TokenDType::Int32, {{70000, 1, 2}, {3}, {}, {65535, 4, 5, 6}}},
      {"uint8", TokenDType::UInt8, {{255, 0, 1, 2, 3, 4, 5, 6, 7, 8}}},
      {"int64", TokenDType::Int64, {{1, 2}, {3, 4}}},
      {"empty", TokenDType::UInt16, {}},
  };
  for (const Case &c : cases) {
    IndexedDatasetBuilder builder(c.dtype);
    for (const auto &doc : c.docs)
      check(builder.addDocument(doc));
    std::string idx = builder.indexBytes();
    std::string framed(4, '\0');
    artifact::storeLE32(reinterpret_cast<uint8_t *>(framed.data()),
                        uint32_t(idx.size()));
    put("dataset_index", std::string(c.name) + ".ds",
        framed + idx + builder.dataBytes());
  }
  // Two sequences in one document (IndexedDatasetBuilder without
  // endDocument between them).
  IndexedDatasetBuilder builder(TokenDType::UInt16);
  std::vector<int64_t> a = {1, 2, 3}, b = {4, 5};
  check(builder.addSequence(a.data(), a.size()));
  check(builder.addSequence(b.data(), b.size()));
  builder.endDocument();
  std::string idx = builder.indexBytes();
  std::string framed(4, '\0');
  artifact::storeLE32(reinterpret_cast<uint8_t *>(framed.data()),
                      uint32_t(idx.size()));
  put("dataset_index", "two_sequences_one_doc.ds",
      framed + idx + builder.dataBytes());
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tessera-fuzz-seeds OUTDIR\n");
    return 2;
  }
  outDir = argv[1];
  ::mkdir(outDir.c_str(), 0755);
  artifactSeeds();
  shardSeeds();
  datasetSeeds();
  return 0;
}
