//===- tessera-compile.cpp - Model to .tsr artifact -----------------------===//
//
// Parses the flags (the training pipeline's options and the tool's own,
// declared in tessera/Pipeline) and runs the compile driver.
//
//===----------------------------------------------------------------------===//

#include "tessera/Pipeline/Compile.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  tessera::CompileOptions options;
  llvm::cl::ParseCommandLineOptions(argc, argv, "Tessera compiler\n");
  return tessera::compile(options,
                          llvm::ArrayRef<const char *>(argv + 1, argv + argc));
}
