//===- CheckpointShardFuzzer.cpp - Fuzz the checkpoint shard decoder ------===//
//
// libFuzzer target `checkpoint_shard`: the input is a whole rank_NNNNN.bin
// checkpoint shard, given to decodeShard (header, CRC-32, tensor index).
// The custom mutator mutates the payload and recomputes the header's size
// and CRC (FuzzCommon.h), so mutants reach the tensor-index decoder. A
// decoded tensor's data must be exactly its shape's size (computed here in
// 128 bits), and a decoded shard is re-encoded and must decode again.
// Seeds: fuzz/make-seeds.sh. Run: scripts/fuzz.sh checkpoint_shard SECONDS.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "tessera/rt/checkpoint/ShardFile.h"

#include <cstdlib>
#include <string>

using namespace tessera;

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size,
                                          size_t maxSize, unsigned seed) {
  // Header: magic, version, payload size (LE64 at 8), CRC-32 (LE32 at 16),
  // rank, world size.
  return fuzz::mutateFixingCrc({rt::ckpt::kShardHeaderSize, 8, 16}, data, size,
                               maxSize, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto shard = rt::decodeShard(
      std::string(reinterpret_cast<const char *>(data), size), "rank_00000.bin");
  if (!shard.ok()) {
    (void)shard.status().toString();
    return 0;
  }
  for (const rt::ShardTensor &t : shard->tensors) {
    unsigned __int128 bytes = unsigned(rt::dtypeSize(t.dtype));
    for (int64_t d : t.shape)
      if (bytes >> 64 == 0 || d == 0)
        bytes *= uint64_t(d);
    if (bytes != t.data.size())
      std::abort(); // accepted a tensor whose shape does not match its data
  }
  // What decodes re-encodes to a shard that decodes to the same tensors.
  auto again = rt::decodeShard(rt::encodeShard(*shard), "re-encoded");
  if (!again.ok() || again->tensors.size() != shard->tensors.size())
    std::abort();
  return 0;
}
