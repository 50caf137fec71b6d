// RUN: tessera-opt %s --split-input-file --tessera-fuse-cross-entropy -verify-diagnostics | FileCheck %s

// A language-model loss (ignore_index) becomes the one-pass statistics and
// the loss from them; its attributes stay on both ops. (The backward that
// reuses the statistics: test/Conversion/lower-to-rt-fusions.mlir.)
// CHECK-LABEL: func.func @lm
// CHECK: %[[M:.*]], %[[SE:.*]], %[[PL:.*]] = nn.logits_stats %[[Z:.*]], %arg1 {ignore_index = -1 : i64, nn.layer = 3 : i64} : (tensor<4x2x16xf32>, tensor<4x2xi32>) -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>)
// CHECK-NEXT: %[[L:.*]] = nn.cross_entropy_from_stats %[[Z]], %arg1, %[[M]], %[[SE]], %[[PL]] {ignore_index = -1 : i64, nn.layer = 3 : i64}
// CHECK-NEXT: nn.token_mean %[[L]], %arg1
// CHECK-NOT: nn.softmax_cross_entropy
func.func @lm(%x: tensor<4x2x8xf32> {nn.input = "features"},
              %labels: tensor<4x2xi32> {nn.input = "labels"},
              %w: tensor<16x8xf32> {nn.param = "head", nn.init = "normal:0.02"}) -> tensor<f32> {
  %z = nn.linear %x, %w : (tensor<4x2x8xf32>, tensor<16x8xf32>) -> tensor<4x2x16xf32>
  %l = nn.softmax_cross_entropy %z, %labels {ignore_index = -1 : i64, nn.layer = 3 : i64} : (tensor<4x2x16xf32>, tensor<4x2xi32>) -> tensor<4x2xf32>
  %m = nn.token_mean %l, %labels {ignore_index = -1 : i64} : (tensor<4x2xf32>, tensor<4x2xi32>) -> tensor<f32>
  return %m : tensor<f32>
}

// -----

// Without ignore_index (a classifier's loss, the CrossEntropy kernel) the
// loss stays as it is.
// CHECK-LABEL: func.func @classifier
// CHECK: nn.softmax_cross_entropy
// CHECK-NOT: nn.logits_stats
func.func @classifier(%z: tensor<8x4xf32>, %t: tensor<8xi32>) -> tensor<8xf32> {
  %l = nn.softmax_cross_entropy %z, %t : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<8xf32>
  return %l : tensor<8xf32>
}

// -----

// expected-error @+1 {{'func.func' op is a training phase; tessera-fuse-cross-entropy runs on the model, before tessera-autodiff}}
func.func @microbatch(%z: tensor<8x4xf32>, %t: tensor<8xi32>) -> tensor<8xf32> attributes {tessera.phase = "microbatch"} {
  %l = nn.softmax_cross_entropy %z, %t {ignore_index = -100 : i64} : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<8xf32>
  return %l : tensor<8xf32>
}
