//===- RTEnums.td - rt dialect: closed sets of strings -----*- tablegen -*-===//
//
// The rt attributes whose values are a closed set: a buffer's kind and a
// collective's reduction. The IR keeps the strings (Tessera_StrEnumAttr);
// C++ sees the enums.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_RT_IR_RTENUMS_TD
#define TESSERA_DIALECTS_RT_IR_RTENUMS_TD

include "dialects/tessera/IR/TesseraEnumBase.td"

// The artifact's BufferKind (runtime/schema/artifact.fbs), spelled as in the IR.
def RT_BufferKind : Tessera_Enum<"BufferKind",
    "buffer kind: param, grad, main_param, opt_state, input, loss, iteration, activation, view, metric or param_shard",
    ["param", "grad", "main_param", "opt_state", "input", "loss", "iteration",
     "activation", "view", "metric", "param_shard"],
    ["Param", "Grad", "MainParam", "OptState", "Input", "Loss", "Iteration",
     "Activation", "View", "Metric", "ParamShard"], "::tessera::rt">;

def RT_Reduction : Tessera_Enum<"Reduction", "reduction: sum or max",
    ["sum", "max"], ["Sum", "Max"], "::tessera::rt">;

#endif // TESSERA_DIALECTS_RT_IR_RTENUMS_TD
