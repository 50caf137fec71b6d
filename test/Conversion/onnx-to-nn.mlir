// RUN: tessera-opt %s -split-input-file -tessera-onnx-to-nn -verify-diagnostics | FileCheck %s
// tessera-onnx-to-nn raises a simplified onnx graph to the nn model: here a
// word embedding, a decomposed RMSNorm (LlamaRMSNorm's export), a linear
// layer whose weight the dynamo exporter stored [in, out], a Gemm, and the
// mean token cross-entropy; activations become sequence-major and the
// batch dynamic. The parameters' values are computed in Megatron's layouts.

// CHECK-LABEL: func.func @model(
// CHECK-SAME: %[[TOK:[^:]*]]: tensor<4x?xi32> {nn.batch_dim = 1 : i64, nn.input = "tokens"}
// CHECK-SAME: %[[LAB:[^:]*]]: tensor<4x?xi32> {nn.batch_dim = 1 : i64, nn.input = "labels"}
// CHECK-SAME: %[[EMB:[^:]*]]: tensor<10x8xf32> {nn.init = "data", nn.param = "embed.weight"}
// CHECK-SAME: %[[NORM:[^:]*]]: tensor<8xf32> {nn.init = "data", nn.param = "norm.weight"}
// CHECK-SAME: %[[W:[^:]*]]: tensor<10x8xf32> {nn.init = "data", nn.param = "head.weight"}
// CHECK: %[[E:.*]] = nn.embedding %[[TOK]], %[[EMB]] {vocab_size = 10 : i64} : (tensor<4x?xi32>, tensor<10x8xf32>) -> tensor<4x?x8xf32>
// CHECK-NEXT: %[[N:.*]] = nn.rms_norm %[[E]], %[[NORM]] {eps = 9.99999997E-7 : f32} : tensor<4x?x8xf32>, tensor<8xf32>
// CHECK-NEXT: %[[L:.*]] = nn.linear %[[N]], %[[W]] : (tensor<4x?x8xf32>, tensor<10x8xf32>) -> tensor<4x?x10xf32>
// CHECK-NEXT: %[[CE:.*]] = nn.softmax_cross_entropy %[[L]], %[[LAB]] {ignore_index = -100 : i64}
// CHECK-NEXT: %[[M:.*]] = nn.token_mean %[[CE]], %[[LAB]]
// CHECK-NEXT: return %[[M]] : tensor<f32>
// The head's weight, stored [in, out] = [[0, 1, ..., 9], [10, ...], ...],
// is [out, in]: its first row is the first column.
// CHECK: head.weight: "0x0400000000000000000020410000A041
module attributes {onnx.opsets = {ai.onnx = 18 : i64}} {
  func.func @model(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %scale = onnx.initializer "s" {value = dense<1.0> : tensor<8xf32>} : tensor<8xf32>
    %w = onnx.initializer "w" {value = dense<[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0], [20.0, 21.0, 22.0, 23.0, 24.0, 25.0, 26.0, 27.0, 28.0, 29.0], [30.0, 31.0, 32.0, 33.0, 34.0, 35.0, 36.0, 37.0, 38.0, 39.0], [40.0, 41.0, 42.0, 43.0, 44.0, 45.0, 46.0, 47.0, 48.0, 49.0], [50.0, 51.0, 52.0, 53.0, 54.0, 55.0, 56.0, 57.0, 58.0, 59.0], [60.0, 61.0, 62.0, 63.0, 64.0, 65.0, 66.0, 67.0, 68.0, 69.0], [70.0, 71.0, 72.0, 73.0, 74.0, 75.0, 76.0, 77.0, 78.0, 79.0]]> : tensor<8x10xf32>} : tensor<8x10xf32>
    %two = onnx.constant dense<2.0> : tensor<f32>
    %eps = onnx.constant dense<1.0e-6> : tensor<f32>
    %axes = onnx.constant dense<[-1]> : tensor<1xi64>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} {onnx.scope = "embed"} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %p = onnx.node "Pow"(%e, %two) {} : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
    %m = onnx.node "ReduceMean"(%p, %axes) {keepdims = 1 : i64} : (tensor<2x4x8xf32>, tensor<1xi64>) -> tensor<2x4x1xf32>
    %a = onnx.node "Add"(%m, %eps) {} : (tensor<2x4x1xf32>, tensor<f32>) -> tensor<2x4x1xf32>
    %r = onnx.node "Sqrt"(%a) {} : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    %inv = onnx.node "Reciprocal"(%r) {} : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    %x = onnx.node "Mul"(%e, %inv) {} : (tensor<2x4x8xf32>, tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
    %n = onnx.node "Mul"(%scale, %x) {} {onnx.scope = "norm"} : (tensor<8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%n, %w) {} {onnx.scope = "head"} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// What no pattern raises is an error naming the node, its op type and its
// module.
module {
  func.func @unraised(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %w = onnx.initializer "w" {value = dense<0.5> : tensor<8x10xf32>} : tensor<8x10xf32>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    // expected-error @+1 {{node 'Softsign' (Softsign) in module 'layers.0.mlp': not part of any construct Tessera raises}}
    %s = onnx.node "Softsign"(%e) {} {onnx.scope = "layers.0.mlp"} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%s, %w) {} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// A graph returning logits needs the loss option.
module {
  // expected-error @+1 {{the model returns logits [batch, seq, vocab], not a loss: give --loss cross-entropy}}
  func.func @logits(%ids: tensor<2x4xi64>) -> tensor<2x4x10xf32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %w = onnx.initializer "w" {value = dense<0.5> : tensor<8x10xf32>} : tensor<8x10xf32>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%e, %w) {} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    return %l : tensor<2x4x10xf32>
  }
}

// -----

// RMSNorm written as x / sqrt(mean(x^2) + eps), then the weight.
// CHECK-LABEL: func.func @rms_div(
// CHECK: nn.rms_norm %{{.*}}, %{{.*}} : tensor<4x?x8xf32>, tensor<8xf32>
module attributes {onnx.opsets = {ai.onnx = 18 : i64}} {
  func.func @rms_div(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %scale = onnx.initializer "s" {value = dense<1.0> : tensor<8xf32>} : tensor<8xf32>
    %w = onnx.initializer "w" {value = dense<0.25> : tensor<8x10xf32>} : tensor<8x10xf32>
    %two = onnx.constant dense<2.0> : tensor<f32>
    %eps = onnx.constant dense<1.0e-5> : tensor<f32>
    %axes = onnx.constant dense<[-1]> : tensor<1xi64>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %p = onnx.node "Pow"(%e, %two) {} : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
    %m = onnx.node "ReduceMean"(%p, %axes) {keepdims = 1 : i64} : (tensor<2x4x8xf32>, tensor<1xi64>) -> tensor<2x4x1xf32>
    %a = onnx.node "Add"(%m, %eps) {} : (tensor<2x4x1xf32>, tensor<f32>) -> tensor<2x4x1xf32>
    %r = onnx.node "Sqrt"(%a) {} : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    %x = onnx.node "Div"(%e, %r) {} : (tensor<2x4x8xf32>, tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
    %n = onnx.node "Mul"(%x, %scale) {} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%n, %w) {} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Tessera's data gives the labels as their own input: a graph that scores
// the token ids themselves as labels is refused.
module {
  // expected-error @+1 {{graph input #0 is both the tokens and the labels}}
  func.func @same_input(%ids: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %w = onnx.initializer "w" {value = dense<0.5> : tensor<8x10xf32>} : tensor<8x10xf32>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%e, %w) {} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%ids, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Two layers the exporter put in one module scope, their weights renamed
// (val_N), would get one name: an error rather than a merged parameter.
module {
  func.func @same_name(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %w1 = onnx.initializer "val_1" {value = dense<0.5> : tensor<8x8xf32>} : tensor<8x8xf32>
    %w2 = onnx.initializer "val_2" {value = dense<0.25> : tensor<8x10xf32>} : tensor<8x10xf32>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %h = onnx.node "MatMul"(%e, %w1) {} {onnx.scope = "fc"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    // expected-error @+1 {{two different parameters are named 'fc.weight'}}
    %l = onnx.node "MatMul"(%h, %w2) {} {onnx.scope = "fc"} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// A head equal to the embedding table is tied only when the values vary:
// two constant tensors (here both 0.5) are two parameters.
// CHECK-LABEL: func.func @constant_head(
// CHECK-SAME: nn.param = "t"
// CHECK-SAME: nn.param = "head.weight"
module {
  func.func @constant_head(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %w = onnx.initializer "val_3" {value = dense<0.5> : tensor<8x10xf32>} : tensor<8x10xf32>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%e, %w) {} {onnx.scope = "head"} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
