//===- Passes.h - nn-level training passes ------------------------*- C++ -*-===//

#ifndef TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_H
#define TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_H

#include "dialects/dist/IR/DistOps.h"
#include "dialects/nn/IR/NNOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace tessera::nn {

#define GEN_PASS_DECL
#include "dialects/nn/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/nn/Transforms/Passes.h.inc"

} // namespace tessera::nn

#endif // TESSERA_DIALECTS_NN_TRANSFORMS_PASSES_H
