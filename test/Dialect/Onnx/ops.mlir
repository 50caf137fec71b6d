// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// The onnx dialect's ops print and parse again: a node names its ONNX op
// type and carries its ONNX attributes; initializers keep their names.

// CHECK-LABEL: func.func @graph
// CHECK: onnx.initializer "w" : tensor<8x4xf32>
// CHECK: onnx.initializer "ext" {external = {file = "model.data", offset = 0 : i64}} : tensor<8xf32>
// CHECK: onnx.constant dense<[2, 4]> : tensor<2xi64>
// CHECK: onnx.none
// CHECK: onnx.node "MatMul"(%{{.*}}, %{{.*}}) {} : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
// CHECK: onnx.node "Dropout"(%{{.*}}, %{{.*}}, %{{.*}}) {seed = 1 : i64}
// CHECK: onnx.node "Swish" domain "com.example"(%{{.*}}) {}
// CHECK: %{{.*}}:2 = onnx.node "Split"
func.func @graph(%x: tensor<2x8xf32> {onnx.name = "x"}) -> tensor<2x4xf32> {
  %w = onnx.initializer "w" : tensor<8x4xf32>
  %e = onnx.initializer "ext" {external = {file = "model.data", offset = 0 : i64}} : tensor<8xf32>
  %s = onnx.constant dense<[2, 4]> : tensor<2xi64>
  %none = onnx.none
  %y = onnx.node "MatMul"(%x, %w) {} : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  %d = onnx.node "Dropout"(%y, %none, %none) {seed = 1 : i64} : (tensor<2x4xf32>, none, none) -> tensor<2x4xf32>
  %sw = onnx.node "Swish" domain "com.example"(%d) {} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %p:2 = onnx.node "Split"(%sw, %s) {axis = 1 : i64} : (tensor<2x4xf32>, tensor<2xi64>) -> (tensor<2x2xf32>, tensor<2x2xf32>)
  return %sw : tensor<2x4xf32>
}
