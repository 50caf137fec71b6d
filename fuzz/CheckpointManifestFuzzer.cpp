//===- CheckpointManifestFuzzer.cpp - Fuzz the manifest.json parser -------===//
//
// libFuzzer target `checkpoint_manifest`: the input is the text of a
// checkpoint's manifest.json, given to parseManifest (JSON parsing with
// nlohmann::json, then the field and consistency checks). A manifest that
// parses is written back with manifestToJson and must parse again.
// Seeds: fuzz/make-seeds.sh. Run: scripts/fuzz.sh checkpoint_manifest SECONDS.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/checkpoint/Manifest.h"

#include <cstdlib>
#include <string>

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto manifest = rt::parseManifest(
      std::string(reinterpret_cast<const char *>(data), size), "manifest.json");
  if (!manifest.ok()) {
    (void)manifest.status().toString();
    return 0;
  }
  (void)manifest->configString();
  auto again = rt::parseManifest(rt::manifestToJson(*manifest), "re-written");
  if (!again.ok())
    std::abort();
  return 0;
}
