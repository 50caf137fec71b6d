//===- NNEnums.td - nn dialect: enums of its attributes ----*- tablegen -*-===//

#ifndef TESSERA_DIALECTS_NN_IR_NNENUMS_TD
#define TESSERA_DIALECTS_NN_IR_NNENUMS_TD

include "dialects/tessera/IR/TesseraEnumBase.td"

/// `nn.input` of a model argument.
def NN_InputKind : Tessera_Enum<"InputKind",
    "model input: features, labels or tokens",
    ["features", "labels", "tokens"], ["Features", "Labels", "Tokens"],
    "::tessera::nn">;

/// The kind of an `nn.init` spec (`<kind>` or `<kind>:<scale>`).
// "data": the value comes with the model (the root module's tessera.weights
// entry of the parameter's name, e.g. an imported ONNX initializer).
def NN_InitKind : Tessera_Enum<"InitKind",
    "initialisation: normal, uniform, zeros, ones or data",
    ["normal", "uniform", "zeros", "ones", "data"],
    ["Normal", "Uniform", "Zeros", "Ones", "Data"], "::tessera::nn">;

#endif // TESSERA_DIALECTS_NN_IR_NNENUMS_TD
