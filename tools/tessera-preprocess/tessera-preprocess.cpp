//===- tessera-preprocess.cpp - Text to Megatron indexed dataset ----------===//
//
// Thin main around tessera::rt::runPreprocess (see tessera/rt/Preprocess.h).
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Preprocess.h"

int main(int argc, char **argv) {
  return tessera::rt::runPreprocess(argc, argv);
}
