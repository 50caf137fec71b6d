//===- tessera-run.cpp - Run a compiled Tessera artifact ------------------===//
//
// Thin main around tessera::rt::runLauncher (see tessera/rt/Launcher.h).
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Launcher.h"

int main(int argc, char **argv) { return tessera::rt::runLauncher(argc, argv); }
