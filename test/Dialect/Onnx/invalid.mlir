// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @no_op_type(%x: tensor<2xf32>) {
  // expected-error @+1 {{needs an ONNX op type}}
  %y = onnx.node ""(%x) {} : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @result_not_tensor(%x: tensor<2xf32>) {
  // expected-error @+1 {{results must be tensors, got 'i32'}}
  %y = onnx.node "Relu"(%x) {} : (tensor<2xf32>) -> i32
  return
}

// -----

func.func @input_not_tensor(%x: i32) {
  // expected-error @+1 {{inputs must be tensors or none, got 'i32'}}
  %y = onnx.node "Relu"(%x) {} : (i32) -> tensor<2xf32>
  return
}

// -----

func.func @both_data() {
  // expected-error @+1 {{has both inline and external data}}
  %w = onnx.initializer "w" {value = dense<1.0> : tensor<2xf32>, external = {file = "d", offset = 0 : i64}} : tensor<2xf32>
  return
}

// -----

func.func @value_type() {
  // expected-error @+1 {{value type 'tensor<3xf32>' differs from the result type 'tensor<2xf32>'}}
  %w = onnx.initializer "w" {value = dense<1.0> : tensor<3xf32>} : tensor<2xf32>
  return
}

// -----

func.func @external_fields() {
  // expected-error @+1 {{external data needs 'file' (a string) and 'offset' (an integer)}}
  %w = onnx.initializer "w" {external = {file = 3 : i64}} : tensor<2xf32>
  return
}
