//===- tessera-export.cpp - Checkpoint to Hugging Face model --------------===//
//
// Thin main around tessera::rt::runExport (see tessera/rt/Export.h).
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Export.h"

int main(int argc, char **argv) { return tessera::rt::runExport(argc, argv); }
