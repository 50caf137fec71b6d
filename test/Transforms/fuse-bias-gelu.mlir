// RUN: tessera-opt %s --split-input-file --tessera-fuse-bias-gelu -verify-diagnostics | FileCheck %s

// The MLP's first projection: the linear drops its bias, which the GELU
// adds (both forms); the linear's attributes stay on it, the GELU's on the
// fused op.
// CHECK-LABEL: func.func @mlp
// CHECK: %[[Z:.*]] = nn.linear %{{.*}}, %arg1 {nn.layer = 0 : i64} : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
// CHECK-NEXT: %[[H:.*]] = nn.bias_gelu %[[Z]], %arg2 {approximate = "tanh", nn.layer = 0 : i64} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
// CHECK-NEXT: nn.linear %[[H]], %arg3, %arg4 :
// CHECK-NOT: nn.gelu
func.func @mlp(%x: tensor<8x16xf32> {nn.input = "features"},
               %w1: tensor<64x16xf32> {nn.param = "fc1.weight", nn.init = "normal:0.02"},
               %b1: tensor<64xf32> {nn.param = "fc1.bias", nn.init = "zeros"},
               %w2: tensor<4x64xf32> {nn.param = "fc2.weight", nn.init = "normal:0.02"},
               %b2: tensor<4xf32> {nn.param = "fc2.bias", nn.init = "zeros"},
               %y: tensor<8xi32> {nn.input = "labels"}) -> tensor<f32> {
  %z = nn.linear %x, %w1, %b1 {nn.layer = 0 : i64} : (tensor<8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %h = nn.gelu %z {approximate = "tanh", nn.layer = 0 : i64} : tensor<8x64xf32>
  %o = nn.linear %h, %w2, %b2 : (tensor<8x64xf32>, tensor<4x64xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %l = nn.softmax_cross_entropy %o, %y : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<8xf32>
  %m = nn.mean %l : (tensor<8xf32>) -> tensor<f32>
  return %m : tensor<f32>
}

// -----

// A bias that tp-partition moved after a row-parallel reduction
// (nn.bias_add) fuses too.
// CHECK-LABEL: func.func @bias_add
// CHECK: %[[H:.*]] = nn.bias_gelu %arg0, %arg1 : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
// CHECK-NOT: nn.bias_add
// CHECK: return %[[H]]
func.func @bias_add(%x: tensor<8x64xf32>, %b: tensor<64xf32>) -> tensor<8x64xf32> {
  %z = nn.bias_add %x, %b : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %h = nn.gelu %z : tensor<8x64xf32>
  return %h : tensor<8x64xf32>
}

// -----

// Left alone: a biased value something else reads too, a linear without a
// bias, and a GELU of a function argument.
// CHECK-LABEL: func.func @unfused
// CHECK: %[[Z:.*]] = nn.linear %arg0, %arg1, %arg2 :
// CHECK: nn.gelu %[[Z]]
// CHECK: %[[N:.*]] = nn.linear %arg0, %arg1 :
// CHECK: nn.gelu %[[N]]
// CHECK: nn.gelu %arg3
// CHECK-NOT: nn.bias_gelu
func.func @unfused(%x: tensor<8x16xf32>, %w: tensor<64x16xf32>, %b: tensor<64xf32>,
                   %a: tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>) {
  %z = nn.linear %x, %w, %b : (tensor<8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %h = nn.gelu %z : tensor<8x64xf32>
  %n = nn.linear %x, %w : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
  %g = nn.gelu %n : tensor<8x64xf32>
  %k = nn.gelu %a : tensor<8x64xf32>
  return %h, %z, %g, %k : tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>
}

// -----

// The fusion rewrites the model, not a training phase.
// expected-error @+1 {{'func.func' op is a training phase; tessera-fuse-bias-gelu runs on the model, before tessera-autodiff}}
func.func @microbatch(%x: tensor<8x64xf32>) -> tensor<8x64xf32> attributes {tessera.phase = "microbatch"} {
  %h = nn.gelu %x : tensor<8x64xf32>
  return %h : tensor<8x64xf32>
}
