//===- ArtifactLoaderFuzzer.cpp - Fuzz the .tsr loader --------------------===//
//
// libFuzzer target `artifact_loader`: the input is a whole .tsr file, given
// to LoadedArtifact::loadFromMemory (header, CRC-32, FlatBuffers
// verification, semantic validation); an artifact that loads also goes
// through Executor::validate (decoding and shape checks of every function
// of every program at every rank, as tessera-run does before a launch);
// the human-readable summary (tessera-run --summary) and, for an artifact
// that validates, its checkpoint manifest (describeCheckpoint, what a save
// writes) are built too.
// The custom mutator mutates the payload and recomputes the header's size
// and CRC (FuzzCommon.h), so mutants reach the verifier and the validators.
// Seeds: fuzz/make-seeds.sh. Run: scripts/fuzz.sh artifact_loader SECONDS.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/checkpoint/Manifest.h"

#include <string>

using namespace tessera;

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size,
                                          size_t maxSize, unsigned seed) {
  // Header: magic, version, payload size (LE64 at 8), CRC-32 (LE32 at 16).
  return fuzz::mutateFixingCrc({artifact::kHeaderSize, 8, 16}, data, size,
                               maxSize, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto loaded = rt::LoadedArtifact::loadFromMemory(
      std::string(reinterpret_cast<const char *>(data), size), "fuzz.tsr");
  if (!loaded.ok()) {
    (void)loaded.status().toString();
    return 0;
  }
  (void)rt::summarizeArtifact(**loaded);
  rt::Status status = rt::Executor::validate(**loaded);
  if (!status.ok()) {
    (void)status.toString();
    return 0;
  }
  auto manifest = rt::describeCheckpoint(**loaded, rt::CheckpointRunInfo{});
  if (manifest.ok())
    (void)rt::manifestToJson(*manifest);
  return 0;
}
