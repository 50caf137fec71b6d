//===- tessera-opt.cpp - Tessera optimizer driver -------------------------===//

#include "tessera/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  tessera::registerAllDialects(registry);
  tessera::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Tessera optimizer driver\n", registry));
}
