//===- Passes.td - onnx-level passes --------------------------*- tablegen -*-===//

#ifndef TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_TD
#define TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def OnnxSimplifyPass : Pass<"tessera-onnx-simplify", "mlir::ModuleOp"> {
  let summary = "fold an imported ONNX graph's constants and shape arithmetic";
  let description = [{
    One pass over each function in graph order: every onnx.node's result
    types are refined by the dialect's type rules (a Reshape whose shape
    a folded Concat now gives gets its static type), a node whose inputs
    are all known is replaced by its value (an onnx.constant: shape
    arithmetic, masks sliced from a causal buffer of any size, rotary
    tables computed from inv_freq), and nodes that compute nothing are
    removed: Identity, a Dropout of ratio 0 or in inference mode (its mask
    output unused), a Cast to the same type, a Reshape, Expand, Squeeze or
    Unsqueeze to its input's type, a Transpose by the identity
    permutation. Unused nodes and initializers are erased and the function
    type follows its results. `max-fold-elements` bounds the size of a
    folded value.

    ```mlir
    %s = onnx.node "Shape"(%x) {} : (tensor<4x16x32xf32>) -> tensor<3xi64>
    // becomes
    %s = onnx.constant dense<[4, 16, 32]> : tensor<3xi64>
    ```
  }];
  let options = [
    Option<"maxFoldElements", "max-fold-elements", "int64_t", "1 << 26",
           "the largest value (in elements) folded into a constant">,
  ];
  let dependentDialects = ["::tessera::onnx::OnnxDialect"];
}

#endif // TESSERA_DIALECTS_ONNX_TRANSFORMS_PASSES_TD
