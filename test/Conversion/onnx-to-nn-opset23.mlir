// RUN: tessera-opt %s -tessera-onnx-to-nn | FileCheck %s
// Opset 23's RotaryEmbedding (rotate-half, caches of half the head: the
// base comes from them) and Attention (is_causal) ops raise to the same nn
// ops as Hugging Face's decomposed forms.

// CHECK-LABEL: func.func @rope23(
// CHECK-SAME: nn.param = "attn.linear_qkv.weight"
// CHECK: nn.linear
// CHECK-NEXT: nn.rotary_embedding %{{.*}} {num_heads = 2 : i64, rotary_dim = 4 : i64}
// CHECK-NEXT: nn.attention %{{.*}} {num_heads = 2 : i64}
module attributes {onnx.opsets = {ai.onnx = 23 : i64}} {
  func.func @rope23(%ids: tensor<2x4xi64>, %labels: tensor<2x4xi64>) -> tensor<f32> {
    %table = onnx.initializer "t" {value = dense<0.5> : tensor<10x8xf32>} : tensor<10x8xf32>
    %wq = onnx.initializer "wq" {value = dense<0.1> : tensor<8x8xf32>} : tensor<8x8xf32>
    %wk = onnx.initializer "wk" {value = dense<0.2> : tensor<8x8xf32>} : tensor<8x8xf32>
    %wv = onnx.initializer "wv" {value = dense<0.3> : tensor<8x8xf32>} : tensor<8x8xf32>
    %wo = onnx.initializer "wo" {value = dense<0.4> : tensor<8x8xf32>} : tensor<8x8xf32>
    %head = onnx.initializer "head" {value = dense<0.25> : tensor<8x10xf32>} : tensor<8x10xf32>
    %cos = onnx.constant dense<[[1.0, 1.0], [0.5403022766113281, 0.9999499917030334], [-0.416146844625473, 0.9998000264167786], [-0.9899924993515015, 0.9995500445365906]]> : tensor<4x2xf32>
    %sin = onnx.constant dense<[[0.0, 0.0], [0.8414709568023682, 0.009999833069741726], [0.9092974066734314, 0.019998665899038315], [0.14112000167369843, 0.029995499178767204]]> : tensor<4x2xf32>
    %pos = onnx.constant dense<[[0, 1, 2, 3], [0, 1, 2, 3]]> : tensor<2x4xi64>
    %split = onnx.constant dense<[2, 4, 2, 4]> : tensor<4xi64>
    %flat = onnx.constant dense<[2, 4, 8]> : tensor<3xi64>
    %e = onnx.node "Gather"(%table, %ids) {axis = 0 : i64} : (tensor<10x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
    %q = onnx.node "MatMul"(%e, %wq) {} {onnx.scope = "attn.q_proj"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %k = onnx.node "MatMul"(%e, %wk) {} {onnx.scope = "attn.k_proj"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %v = onnx.node "MatMul"(%e, %wv) {} {onnx.scope = "attn.v_proj"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %q4 = onnx.node "Reshape"(%q, %split) {} : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x4x2x4xf32>
    %k4 = onnx.node "Reshape"(%k, %split) {} : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x4x2x4xf32>
    %v4 = onnx.node "Reshape"(%v, %split) {} : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x4x2x4xf32>
    %qh = onnx.node "Transpose"(%q4) {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
    %kh = onnx.node "Transpose"(%k4) {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
    %vh = onnx.node "Transpose"(%v4) {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x2x4xf32>) -> tensor<2x2x4x4xf32>
    %qr = onnx.node "RotaryEmbedding"(%qh, %cos, %sin, %pos) {} : (tensor<2x2x4x4xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<2x4xi64>) -> tensor<2x2x4x4xf32>
    %kr = onnx.node "RotaryEmbedding"(%kh, %cos, %sin, %pos) {} : (tensor<2x2x4x4xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<2x4xi64>) -> tensor<2x2x4x4xf32>
    %a = onnx.node "Attention"(%qr, %kr, %vh) {is_causal = 1 : i64} {onnx.scope = "attn"} : (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
    %at = onnx.node "Transpose"(%a) {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x2x4x4xf32>) -> tensor<2x4x2x4xf32>
    %ctx = onnx.node "Reshape"(%at, %flat) {} : (tensor<2x4x2x4xf32>, tensor<3xi64>) -> tensor<2x4x8xf32>
    %o = onnx.node "MatMul"(%ctx, %wo) {} {onnx.scope = "attn.o_proj"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %h = onnx.node "Add"(%e, %o) {} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %l = onnx.node "MatMul"(%h, %head) {} : (tensor<2x4x8xf32>, tensor<8x10xf32>) -> tensor<2x4x10xf32>
    %s1 = onnx.constant dense<[-1, 10]> : tensor<2xi64>
    %s2 = onnx.constant dense<[-1]> : tensor<1xi64>
    %lf = onnx.node "Reshape"(%l, %s1) {} : (tensor<2x4x10xf32>, tensor<2xi64>) -> tensor<8x10xf32>
    %yf = onnx.node "Reshape"(%labels, %s2) {} : (tensor<2x4xi64>, tensor<1xi64>) -> tensor<8xi64>
    %loss = onnx.node "SoftmaxCrossEntropyLoss"(%lf, %yf) {ignore_index = -100 : i64, reduction = "mean"} : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
