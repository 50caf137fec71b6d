//===- ArtifactFormat.h - .tsr container header ------------------*- C++ -*-===//
//
// The container around the FlatBuffer payload of a .tsr artifact: magic,
// format version, payload size and CRC-32. Header-only and dependency-free so
// that the compiler (which writes artifacts) and the runtime (which reads
// them) share one definition.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_ARTIFACTFORMAT_H
#define TESSERA_RT_ARTIFACTFORMAT_H

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

namespace tessera::artifact {

/// Bumped whenever artifact.fbs changes incompatibly.
constexpr uint32_t kFormatVersion = 21;
constexpr char kMagic[4] = {'T', 'S', 'R', 'A'};
constexpr size_t kHeaderSize = 24;

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320).
inline uint32_t crc32(const uint8_t *data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i)
    crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

inline void storeLE32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
inline void storeLE64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
inline uint32_t loadLE32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t loadLE64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t(p[i]) << (8 * i);
  return v;
}

/// Builds the 24-byte header for `payload`.
inline std::string makeHeader(const uint8_t *payload, size_t size) {
  uint8_t h[kHeaderSize] = {};
  std::memcpy(h, kMagic, 4);
  storeLE32(h + 4, kFormatVersion);
  storeLE64(h + 8, size);
  storeLE32(h + 16, crc32(payload, size));
  return std::string(reinterpret_cast<const char *>(h), kHeaderSize);
}

} // namespace tessera::artifact

#endif // TESSERA_RT_ARTIFACTFORMAT_H
