//===- DatasetIndexFuzzer.cpp - Fuzz the Megatron .idx/.bin reader --------===//
//
// libFuzzer target `dataset_index`: the input is a Megatron mmap indexed
// dataset, framed as [LE32 n][n bytes of .idx][the rest: .bin]. Both files
// are written to a private temporary directory (on /dev/shm when it is
// there) and opened with IndexedDataset::open, the reader tessera-run uses;
// a dataset that opens is then read: the whole token stream, a few GPT
// samples and the vocabulary check.
// Seeds: fuzz/make-seeds.sh. Run: scripts/fuzz.sh dataset_index SECONDS.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/IndexedDataset.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace tessera;

namespace {

std::string prefix() {
  static const std::string p = [] {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string dir = std::string(base) + "/tessera-fuzz-idx-XXXXXX";
    if (!mkdtemp(dir.data()))
      std::abort();
    return dir + "/ds";
  }();
  return p;
}

void writeFile(const std::string &path, const uint8_t *data, size_t size) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f))
    std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  size_t n = size_t(data[0]) | size_t(data[1]) << 8 | size_t(data[2]) << 16 |
             size_t(data[3]) << 24;
  data += 4;
  size -= 4;
  if (n > size)
    n = size;
  const std::string p = prefix();
  writeFile(rt::indexFilePath(p), data, n);
  writeFile(rt::dataFilePath(p), data + n, size - n);
  auto ds = rt::IndexedDataset::open(p);
  if (!ds.ok()) {
    (void)ds.status().toString();
    return 0;
  }
  const rt::IndexedDataset &d = **ds;
  int64_t t = d.numTokens();
  if (t <= (int64_t(1) << 20)) {
    std::vector<int64_t> all(size_t(t) + 1);
    if (!d.readStream(0, t, all.data()).ok())
      std::abort();
  }
  for (int64_t seq : {1, 4, 64}) {
    std::vector<int64_t> sample(size_t(seq) + 1);
    for (int64_t g : {int64_t(0), int64_t(1), int64_t(12345)})
      (void)rt::gptSample(d, g, seq, sample.data());
  }
  (void)d.checkVocabulary(d.maxTokenId());
  (void)d.checkVocabulary(d.maxTokenId() + 1);
  return 0;
}
