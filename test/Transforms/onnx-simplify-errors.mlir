// RUN: tessera-opt %s -split-input-file -tessera-onnx-simplify -verify-diagnostics
// A malformed node is an error naming it and the problem, never an
// out-of-range index.

func.func @axis(%x: tensor<2x3xf32>) -> tensor<*xf32> {
  // expected-error @+1 {{node 'Softmax' (Softmax): axis 5 is out of range for rank 2}}
  %y = onnx.node "Softmax"(%x) {axis = 5 : i64} : (tensor<2x3xf32>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @unsqueeze_axes(%x: tensor<2x3xf32>) -> tensor<*xf32> {
  %axes = onnx.constant dense<[7]> : tensor<1xi64>
  // expected-error @+1 {{node 'Unsqueeze' (Unsqueeze): axis 7 is out of range for rank 3}}
  %y = onnx.node "Unsqueeze"(%x, %axes) {} : (tensor<2x3xf32>, tensor<1xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @slice_step(%x: tensor<4xf32>) -> tensor<*xf32> {
  %s = onnx.constant dense<[0]> : tensor<1xi64>
  %e = onnx.constant dense<[4]> : tensor<1xi64>
  %a = onnx.constant dense<[0]> : tensor<1xi64>
  %st = onnx.constant dense<[0]> : tensor<1xi64>
  // expected-error @+1 {{node 'Slice' (Slice): a Slice step is 0}}
  %y = onnx.node "Slice"(%x, %s, %e, %a, %st) {} : (tensor<4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @reshape_target(%x: tensor<4xf32>) -> tensor<*xf32> {
  %t = onnx.constant dense<[-2, 2]> : tensor<2xi64>
  // expected-error @+1 {{node 'Reshape' (Reshape): its target shape has a dimension below -1}}
  %y = onnx.node "Reshape"(%x, %t) {} : (tensor<4xf32>, tensor<2xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @negative_size() -> tensor<*xf32> {
  %shape = onnx.constant dense<[-3]> : tensor<1xi64>
  // expected-error @+1 {{node 'ConstantOfShape' (ConstantOfShape): its result would have a negative dimension}}
  %y = onnx.node "ConstantOfShape"(%shape) {} : (tensor<1xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @broadcast(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<*xf32> {
  // expected-error @+1 {{node 'Add' (Add): its inputs' shapes do not broadcast}}
  %y = onnx.node "Add"(%a, %b) {} : (tensor<2x3xf32>, tensor<4x5xf32>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @unsqueeze_repeat(%x: tensor<4xf32>) -> tensor<*xf32> {
  %axes = onnx.constant dense<[0, 0]> : tensor<2xi64>
  // expected-error @+1 {{node 'Unsqueeze' (Unsqueeze): its axes repeat or are out of range}}
  %y = onnx.node "Unsqueeze"(%x, %axes) {} : (tensor<4xf32>, tensor<2xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @squeeze_not_one(%x: tensor<4x3xf32>) -> tensor<*xf32> {
  %axes = onnx.constant dense<[0]> : tensor<1xi64>
  // expected-error @+1 {{node 'Squeeze' (Squeeze): it squeezes a dimension that is not 1}}
  %y = onnx.node "Squeeze"(%x, %axes) {} : (tensor<4x3xf32>, tensor<1xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @concat_dims(%a: tensor<2x3xf32>, %b: tensor<2x4xf32>) -> tensor<*xf32> {
  // expected-error @+1 {{node 'Concat' (Concat): its inputs differ in a dimension other than the axis}}
  %y = onnx.node "Concat"(%a, %b) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x4xf32>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @reshape_count(%x: tensor<4xf32>) -> tensor<*xf32> {
  %t = onnx.constant dense<[5]> : tensor<1xi64>
  // expected-error @+1 {{node 'Reshape' (Reshape): its target shape does not fit its input}}
  %y = onnx.node "Reshape"(%x, %t) {} : (tensor<4xf32>, tensor<1xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @inputs(%x: tensor<4xf32>) -> tensor<*xf32> {
  // expected-error @+1 {{node 'Gather' (Gather): expected at least 2 input(s) and 1 output(s)}}
  %y = onnx.node "Gather"(%x) {} : (tensor<4xf32>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

func.func @no_inputs() -> tensor<*xi64> {
  // expected-error @+1 {{node 'Shape' (Shape): expected inputs and outputs}}
  %y = onnx.node "Shape"() {} : () -> tensor<*xi64>
  return %y : tensor<*xi64>
}

// -----

func.func @split_scalar(%x: tensor<f32>) -> tensor<*xf32> {
  // expected-error @+1 {{node 'Split' (Split): axis 0 is out of range for rank 0}}
  %y = onnx.node "Split"(%x) {} : (tensor<f32>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}
