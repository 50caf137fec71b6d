//===- FuzzCommon.h - Helpers shared by the libFuzzer targets ---*- C++ -*-===//
//
// A mutator for the containers that carry a CRC-32 of their payload (.tsr
// artifacts, checkpoint shards): libFuzzer's own mutations applied to the
// payload, then the header's payload size and CRC recomputed, so that most
// mutants get past the CRC check to the decoders and validators behind it.
// One mutation in 16 is applied to the whole input, header included, so
// the header checks are fuzzed too.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_FUZZ_FUZZCOMMON_H
#define TESSERA_FUZZ_FUZZCOMMON_H

#include "tessera/rt/ArtifactFormat.h"

#include <cstddef>
#include <cstdint>

extern "C" size_t LLVMFuzzerMutate(uint8_t *data, size_t size,
                                   size_t maxSize);

namespace tessera::fuzz {

/// Layout of a CRC'd header: `headerSize` bytes, the payload size (LE64) at
/// `sizeOffset` and the payload's CRC-32 (LE32) at `crcOffset`.
struct CrcHeader {
  size_t headerSize, sizeOffset, crcOffset;
};

inline size_t mutateFixingCrc(const CrcHeader &h, uint8_t *data, size_t size,
                              size_t maxSize, unsigned seed) {
  if (size < h.headerSize || maxSize <= h.headerSize || seed % 16 == 0)
    return LLVMFuzzerMutate(data, size, maxSize);
  size_t payload = LLVMFuzzerMutate(data + h.headerSize, size - h.headerSize,
                                    maxSize - h.headerSize);
  artifact::storeLE64(data + h.sizeOffset, payload);
  artifact::storeLE32(data + h.crcOffset,
                      artifact::crc32(data + h.headerSize, payload));
  return h.headerSize + payload;
}

} // namespace tessera::fuzz

#endif // TESSERA_FUZZ_FUZZCOMMON_H
