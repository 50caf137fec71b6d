//===- OnnxOps.td - onnx dialect: an ONNX graph, node for node -*- tablegen -*-===//
//
// The first level of the ONNX frontend: a model's graph imported one op per
// ONNX node, with its initializers and inferred types, before anything is
// recognised. Passes fold its shape arithmetic and constants
// (tessera-onnx-simplify) and raise its subgraphs to nn ops.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_ONNX_IR_ONNXOPS_TD
#define TESSERA_DIALECTS_ONNX_IR_ONNXOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Onnx_Dialect : Dialect {
  let name = "onnx";
  let cppNamespace = "::tessera::onnx";
  let summary = "An ONNX graph imported node for node";
  let description = [{
    One function per ONNX graph: its arguments are the graph's inputs
    (`onnx.name`), its results the graph's outputs. Every ONNX node is one
    generic `onnx.node` op that names its ONNX op type, so any operator of
    any opset imports and the error for what is not understood can name the
    node (its location is the node's name). Initializers are
    `onnx.initializer` ops that keep their names (the parameters of the
    model); constants are `onnx.constant`. Types come from the model's
    value infos or ONNX shape inference where they exist and from
    tessera-onnx-simplify's inference otherwise; an unknown shape is an
    unranked tensor.
  }];
  let hasConstantMaterializer = 1;
}

class Onnx_Op<string mnemonic, list<Trait> traits = []>
    : Op<Onnx_Dialect, mnemonic, !listconcat(traits, [Pure])>;

def Onnx_NodeOp : Onnx_Op<"node"> {
  let summary = "One ONNX node";
  let description = [{
    An ONNX node of type `op_type` in `domain` ("" is the standard
    ai.onnx domain) with its ONNX attributes in `attrs` (ints as i64,
    floats as f32, lists as dense arrays, tensors as dense elements,
    strings as strings). An omitted optional input is an `onnx.none`
    value. The node's name is its location.

    ```mlir
    %y = onnx.node "MatMul"(%x, %w) {} : (tensor<4x16x32xf32>, tensor<32x96xf32>) -> tensor<4x16x96xf32>
    %s:2 = onnx.node "Split"(%y, %sizes) {axis = -1 : i64} : (tensor<4x16x96xf32>, tensor<2xi64>) -> (tensor<4x16x48xf32>, tensor<4x16x48xf32>)
    ```
  }];
  let arguments = (ins StrAttr:$op_type,
                       DefaultValuedStrAttr<StrAttr, "">:$domain,
                       DictionaryAttr:$attrs,
                       Variadic<AnyType>:$inputs);
  let results = (outs Variadic<AnyType>:$outputs);
  let assemblyFormat = [{
    $op_type (`domain` $domain^)? `(` $inputs `)` $attrs attr-dict `:`
    functional-type($inputs, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The node's ONNX name (from its location), or its op type.
    std::string getNodeName();
    /// An int, float or string attribute, or a default.
    int64_t getInt(llvm::StringRef name, int64_t dflt);
    float getFloat(llvm::StringRef name, float dflt);
    llvm::StringRef getString(llvm::StringRef name, llvm::StringRef dflt);
    /// An ints attribute, or none.
    std::optional<llvm::ArrayRef<int64_t>> getInts(llvm::StringRef name);
    /// The input at `i` when present (not omitted, not beyond the end).
    mlir::Value getInputOrNull(unsigned i);
  }];
}

def Onnx_InitializerOp : Onnx_Op<"initializer"> {
  let summary = "A graph initializer (a parameter or a buffer of the model)";
  let description = [{
    The initializer `name`. Its data, when loaded, is `value` (inline
    data, as a dense resource: the model's bytes are held once) or
    `external` (`{file, offset}` relative to the model's directory, not
    read). Not a constant op: folding reads an initializer's value, but a
    parameter keeps its name.

    ```mlir
    %w = onnx.initializer "model.layers.0.mlp.up_proj.weight" : tensor<64x32xf32>
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<ElementsAttr>:$value,
                       OptionalAttr<DictionaryAttr>:$external);
  let results = (outs AnyRankedTensor:$output);
  let assemblyFormat = "$name attr-dict `:` type($output)";
  let hasVerifier = 1;
}

def Onnx_ConstantOp : Onnx_Op<"constant", [ConstantLike,
    TypesMatchWith<"the result type is the value's", "value", "output",
                   "$_self">]> {
  let summary = "A constant tensor";
  let description = [{
    An ONNX `Constant` node's value, or a value tessera-onnx-simplify
    computed.

    ```mlir
    %shape = onnx.constant dense<[4, 16, 4, 8]> : tensor<4xi64>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs AnyRankedTensor:$output);
  let assemblyFormat = "attr-dict $value";
  let builders = [OpBuilder<(ins "mlir::ElementsAttr":$value), [{
    build($_builder, $_state, value.getType(), value);
  }]>];
  let hasFolder = 1;
  let hasVerifier = 1;
}

def Onnx_NoneOp : Onnx_Op<"none"> {
  let summary = "An omitted optional input";
  let description = [{
    ```mlir
    %none = onnx.none
    %y = onnx.node "Dropout"(%x, %none, %none) {} : (tensor<4x8xf32>, none, none) -> tensor<4x8xf32>
    ```
  }];
  let results = (outs NoneType:$output);
  let assemblyFormat = "attr-dict";
}

#endif // TESSERA_DIALECTS_ONNX_IR_ONNXOPS_TD
