// RUN: tessera-opt %s -split-input-file -tessera-onnx-simplify | FileCheck %s
// tessera-onnx-simplify folds an imported graph's shape arithmetic and
// constants in graph order, refines types with the dialect's type rules,
// drops nodes that compute nothing, and keeps weights named.

// Shape arithmetic feeding a Reshape folds; the Reshape gets its static
// type from the folded shape.
// CHECK-LABEL: func.func @reshape_shape
// CHECK-SAME: -> tensor<2x4x8xf32>
// CHECK-NOT: "Shape"
// CHECK-NOT: "Concat"
// CHECK: %[[S:.*]] = onnx.constant dense<[2, 4, 8]> : tensor<3xi64>
// CHECK: onnx.node "Reshape"(%arg0, %[[S]]) {} : (tensor<2x32xf32>, tensor<3xi64>) -> tensor<2x4x8xf32>
func.func @reshape_shape(%x: tensor<2x32xf32>) -> tensor<*xf32> {
  %shape = onnx.node "Shape"(%x) {} : (tensor<2x32xf32>) -> tensor<2xi64>
  %i0 = onnx.constant dense<0> : tensor<i64>
  %b = onnx.node "Gather"(%shape, %i0) {axis = 0 : i64} : (tensor<2xi64>, tensor<i64>) -> tensor<i64>
  %ax = onnx.constant dense<[0]> : tensor<1xi64>
  %b1 = onnx.node "Unsqueeze"(%b, %ax) {} : (tensor<i64>, tensor<1xi64>) -> tensor<1xi64>
  %rest = onnx.constant dense<[4, 8]> : tensor<2xi64>
  %s = onnx.node "Concat"(%b1, %rest) {axis = 0 : i64} : (tensor<1xi64>, tensor<2xi64>) -> tensor<3xi64>
  %y = onnx.node "Reshape"(%x, %s) {} : (tensor<2x32xf32>, tensor<3xi64>) -> tensor<*xf32>
  return %y : tensor<*xf32>
}

// -----

// A causal-mask buffer (a float initializer, larger than the sequence) is
// sliced to the sequence and compared: the comparison folds to a bool
// constant and the buffer is gone. The weight's Transpose before a MatMul
// is not folded: the parameter keeps its name.
// CHECK-LABEL: func.func @mask_buffer
// CHECK-NOT: "mask"
// CHECK-DAG: onnx.constant dense<{{\[\[}}false, true, true], [false, false, true], [false, false, false]]> : tensor<3x3xi1>
// CHECK-DAG: %[[W:.*]] = onnx.initializer "w" {{.*}}: tensor<3x3xf32>
// CHECK: %[[WT:.*]] = onnx.node "Transpose"(%[[W]])
// CHECK: onnx.node "MatMul"(%arg0, %[[WT]])
func.func @mask_buffer(%x: tensor<3x3xf32>) -> tensor<3x3xf32> {
  %mask = onnx.initializer "mask" {value = dense<[[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]> : tensor<4x4xf32>} : tensor<4x4xf32>
  %w = onnx.initializer "w" {value = dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]> : tensor<3x3xf32>} : tensor<3x3xf32>
  %st = onnx.constant dense<[0, 0]> : tensor<2xi64>
  %en = onnx.constant dense<[3, 3]> : tensor<2xi64>
  %m = onnx.node "Slice"(%mask, %st, %en) {} : (tensor<4x4xf32>, tensor<2xi64>, tensor<2xi64>) -> tensor<3x3xf32>
  %zero = onnx.constant dense<0.0> : tensor<f32>
  %keep = onnx.node "Equal"(%m, %zero) {} : (tensor<3x3xf32>, tensor<f32>) -> tensor<3x3xi1>
  %wt = onnx.node "Transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %y = onnx.node "MatMul"(%x, %wt) {} : (tensor<3x3xf32>, tensor<3x3xf32>) -> tensor<3x3xf32>
  %ninf = onnx.constant dense<0xFF800000> : tensor<f32>
  %z = onnx.node "Where"(%keep, %ninf, %y) {} : (tensor<3x3xi1>, tensor<f32>, tensor<3x3xf32>) -> tensor<3x3xf32>
  return %z : tensor<3x3xf32>
}

// -----

// Nodes that compute nothing go: Identity, an inference-mode Dropout, a
// Dropout of ratio 0, a Cast to the same type, a Reshape to the same
// static type, a Transpose by the identity, a Slice keeping everything. A
// training Dropout of ratio 0.1 stays.
// CHECK-LABEL: func.func @identities
// CHECK-NEXT: %[[T:.*]] = onnx.constant dense<true>
// CHECK-NEXT: %[[R:.*]] = onnx.constant dense<1.000000e-01>
// CHECK-NEXT: %[[D:.*]] = onnx.node "Dropout"(%arg0, %[[R]], %[[T]])
// CHECK-NEXT: return %[[D]]
func.func @identities(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %none = onnx.none
  %a = onnx.node "Identity"(%x) {} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %b = onnx.node "Dropout"(%a, %none, %none) {} : (tensor<2x3xf32>, none, none) -> tensor<2x3xf32>
  %zero = onnx.constant dense<0.0> : tensor<f32>
  %true = onnx.constant dense<true> : tensor<i1>
  %c = onnx.node "Dropout"(%b, %zero, %true) {} : (tensor<2x3xf32>, tensor<f32>, tensor<i1>) -> tensor<2x3xf32>
  %d = onnx.node "Cast"(%c) {to = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %s = onnx.constant dense<[2, 3]> : tensor<2xi64>
  %e = onnx.node "Reshape"(%d, %s) {} : (tensor<2x3xf32>, tensor<2xi64>) -> tensor<2x3xf32>
  %f = onnx.node "Transpose"(%e) {perm = array<i64: 0, 1>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %st = onnx.constant dense<[0]> : tensor<1xi64>
  %en = onnx.constant dense<[9223372036854775807]> : tensor<1xi64>
  %g = onnx.node "Slice"(%f, %st, %en) {} : (tensor<2x3xf32>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x3xf32>
  %p = onnx.constant dense<1.000000e-01> : tensor<f32>
  %h = onnx.node "Dropout"(%g, %p, %true) {} : (tensor<2x3xf32>, tensor<f32>, tensor<i1>) -> tensor<2x3xf32>
  return %h : tensor<2x3xf32>
}

// -----

// Rotary tables computed from inv_freq and the positions fold: Range,
// Unsqueeze, the product, Cos and Sin. f32 results are rounded as f32
// arithmetic would round them.
// CHECK-LABEL: func.func @rotary_tables
// CHECK-NOT: onnx.node "Cos"
// CHECK-NOT: onnx.node "Sin"
// CHECK-DAG: onnx.constant dense<{{\[\[}}1.000000e+00, 1.000000e+00], [0.540302277, 0.999949991], [-0.416146845, 9.998000e-01]]> : tensor<3x2xf32>
// CHECK-DAG: onnx.constant dense<{{\[\[}}0.000000e+00, 0.000000e+00], [0.841470957, 0.00999983306], [0.909297406, 0.0199986659]]> : tensor<3x2xf32>
func.func @rotary_tables(%q: tensor<3x2xf32>) -> tensor<3x2xf32> {
  %inv = onnx.initializer "inv_freq" {value = dense<[1.0, 0.01]> : tensor<2xf32>} : tensor<2xf32>
  %start = onnx.constant dense<0> : tensor<i64>
  %limit = onnx.constant dense<3> : tensor<i64>
  %delta = onnx.constant dense<1> : tensor<i64>
  %pos = onnx.node "Range"(%start, %limit, %delta) {} : (tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<?xi64>
  %posf = onnx.node "Cast"(%pos) {to = 1 : i64} : (tensor<?xi64>) -> tensor<?xf32>
  %ax1 = onnx.constant dense<[1]> : tensor<1xi64>
  %ax0 = onnx.constant dense<[0]> : tensor<1xi64>
  %p2 = onnx.node "Unsqueeze"(%posf, %ax1) {} : (tensor<?xf32>, tensor<1xi64>) -> tensor<?x1xf32>
  %f2 = onnx.node "Unsqueeze"(%inv, %ax0) {} : (tensor<2xf32>, tensor<1xi64>) -> tensor<1x2xf32>
  %freqs = onnx.node "MatMul"(%p2, %f2) {} : (tensor<?x1xf32>, tensor<1x2xf32>) -> tensor<?x2xf32>
  %cos = onnx.node "Cos"(%freqs) {} : (tensor<?x2xf32>) -> tensor<?x2xf32>
  %sin = onnx.node "Sin"(%freqs) {} : (tensor<?x2xf32>) -> tensor<?x2xf32>
  %a = onnx.node "Mul"(%q, %cos) {} : (tensor<3x2xf32>, tensor<?x2xf32>) -> tensor<3x2xf32>
  %b = onnx.node "Mul"(%q, %sin) {} : (tensor<3x2xf32>, tensor<?x2xf32>) -> tensor<3x2xf32>
  %c = onnx.node "Add"(%a, %b) {} : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
  return %c : tensor<3x2xf32>
}

// -----

// A value larger than max-fold-elements stays a node.
// RUN: tessera-opt %s -split-input-file -tessera-onnx-simplify="max-fold-elements=4" | FileCheck %s --check-prefix=LIMIT
// LIMIT-LABEL: func.func @fold_limit
// LIMIT: onnx.node "Trilu"
func.func @fold_limit() -> tensor<3x3xi1> {
  %ones = onnx.constant dense<true> : tensor<3x3xi1>
  %t = onnx.node "Trilu"(%ones) {upper = 0 : i64} : (tensor<3x3xi1>) -> tensor<3x3xi1>
  return %t : tensor<3x3xi1>
}

// -----

// A node that would compute nothing stays when another of its results is
// read (a malformed Identity with two outputs).
// CHECK-LABEL: func.func @other_result_used
// CHECK: %[[N:.*]]:2 = onnx.node "Identity"
// CHECK: return %[[N]]#1
func.func @other_result_used(%x: tensor<2xf32>) -> tensor<*xf32> {
  %y:2 = onnx.node "Identity"(%x) {} : (tensor<2xf32>) -> (tensor<2xf32>, tensor<*xf32>)
  return %y#1 : tensor<*xf32>
}
