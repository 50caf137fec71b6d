//===- Container.cpp - .tsr container: header, CRC, FlatBuffer ------------===//
//
// Reads a .tsr file: the 24-byte header of ArtifactFormat.h (magic, format
// version, payload size, CRC-32), FlatBuffer verification against
// artifact.fbs, then the semantic validator. Also writes the container.
//
//===----------------------------------------------------------------------===//

#include "ArtifactInternal.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace tessera::rt {

StatusOr<std::shared_ptr<const LoadedArtifact>>
LoadedArtifact::loadFromFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound(path, ": cannot open artifact file for reading");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad())
    return dataLoss(path, ": error reading artifact file");
  return loadFromMemory(os.str(), path);
}

StatusOr<std::shared_ptr<const LoadedArtifact>>
LoadedArtifact::loadFromMemory(std::string bytes, const std::string &name) {
  using namespace ::tessera::artifact;
  const auto *data = reinterpret_cast<const uint8_t *>(bytes.data());
  if (bytes.size() < kHeaderSize)
    return dataLoss(name, ": file is ", bytes.size(),
                    " bytes, smaller than the ", kHeaderSize,
                    "-byte .tsr header (truncated or not an artifact)");
  if (std::memcmp(data, kMagic, 4) != 0)
    return invalidArgument(name, ": bad magic (not a Tessera .tsr artifact)");
  uint32_t version = loadLE32(data + 4);
  if (version != kFormatVersion)
    return failedPrecondition(name, ": unsupported format version ", version,
                              " (this runtime supports version ",
                              kFormatVersion, "); recompile the model");
  uint64_t payloadSize = loadLE64(data + 8);
  uint64_t expected = kHeaderSize + payloadSize;
  if (payloadSize > bytes.size() || bytes.size() < expected)
    return dataLoss(name, ": file is truncated: expected ", expected,
                    " bytes, got ", bytes.size());
  if (bytes.size() > expected)
    return dataLoss(name, ": file has ", bytes.size() - expected,
                    " unexpected trailing bytes (expected ", expected,
                    " bytes, got ", bytes.size(), ")");
  uint32_t crc = loadLE32(data + 16);
  uint32_t actual = artifact::crc32(data + kHeaderSize, payloadSize);
  if (crc != actual) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%08x, computed 0x%08x", crc, actual);
    return dataLoss(name, ": payload is corrupted (CRC-32 mismatch: header ",
                    buf, ")");
  }

  std::shared_ptr<LoadedArtifact> result(new LoadedArtifact());
  result->fileName = name;
  // A fresh string keeps the payload heap-aligned for the verifier.
  result->payload = bytes.substr(kHeaderSize);
  const auto *buf = reinterpret_cast<const uint8_t *>(result->payload.data());
  flatbuffers::Verifier verifier(buf, result->payload.size());
  if (!verifier.VerifyBuffer<fb::Artifact>(nullptr))
    return dataLoss(name, ": FlatBuffer verification failed (payload does not "
                          "match schema artifact.fbs)");
  result->rootPtr = flatbuffers::GetRoot<fb::Artifact>(buf);
  TESSERA_RETURN_IF_ERROR(validateArtifact(name, *result->rootPtr));
  return std::shared_ptr<const LoadedArtifact>(std::move(result));
}

Status writeArtifactFile(const std::string &path, const uint8_t *payload,
                         size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return notFound(path, ": cannot open for writing");
  std::string header = artifact::makeHeader(payload, size);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char *>(payload), std::streamsize(size));
  if (!out)
    return dataLoss(path, ": write failed");
  return Status();
}
} // namespace tessera::rt
