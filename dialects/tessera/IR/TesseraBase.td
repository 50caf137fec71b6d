//===- TesseraBase.td - tessera dialect: module conventions *- tablegen -*-===//
//
// The owner of the `tessera.*` attributes that passes hand to each other
// (phases, buffer bindings, batch, optimizer and mixed-precision settings)
// and the enums of their closed string sets.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_TESSERA_IR_TESSERABASE_TD
#define TESSERA_DIALECTS_TESSERA_IR_TESSERABASE_TD

include "mlir/IR/OpBase.td"
include "dialects/tessera/IR/TesseraEnumBase.td"

def Tessera_Dialect : Dialect {
  let name = "tessera";
  let cppNamespace = "::tessera";
  let summary = "Conventions of a Tessera training module";
  let description = [{
    A dialect without ops: it owns the discardable `tessera.*` attributes
    (names in include/tessera/Support/Model.h) and verifies them, as the nn
    and dist dialects verify `nn.*` and `dist.*`. The nn and dist dialects
    load it. Functions are phases (`tessera.phase = "microbatch"`, ...)
    whose arguments and results are bound to persistent buffers
    (`tessera.buffer`, `tessera.grad_of`, `tessera.stash`,
    `tessera.grad_shard`); the root module records the batch
    (`tessera.batch`), the optimizer (`tessera.optimizer`), mixed precision
    (`tessera.mixed_precision`), the vocabulary (`tessera.vocab`) and what
    tessera-compile was given (`tessera.compile_flags`, `tessera.model`).
  }];
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
}

//===----------------------------------------------------------------------===//
// Enums of the tessera.* attributes
//===----------------------------------------------------------------------===//

def Tessera_FloatDtype : Tessera_Enum<"FloatDtype",
    "stored dtype: f32, bf16 or f16", ["f32", "bf16", "f16"],
    ["F32", "BF16", "F16"]>;

def Tessera_Phase : Tessera_Enum<"Phase",
    "phase: microbatch, step, init, forward, backward, backward_w or eval",
    ["microbatch", "step", "init", "forward", "backward", "backward_w", "eval"],
    ["Microbatch", "Step", "Init", "Forward", "Backward", "BackwardW", "Eval"]>;

def Tessera_OptimizerKind : Tessera_Enum<"OptimizerKind",
    "optimizer: sgd or adam", ["sgd", "adam"], ["Sgd", "Adam"]>;

def Tessera_LrDecayStyle : Tessera_Enum<"LrDecayStyle",
    "learning-rate decay: constant, linear or cosine",
    ["constant", "linear", "cosine"], ["Constant", "Linear", "Cosine"]>;

#endif // TESSERA_DIALECTS_TESSERA_IR_TESSERABASE_TD
