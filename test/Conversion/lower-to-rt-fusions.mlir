// RUN: tessera-opt %s --tessera-train-pipeline="micro-batch-size=8 global-batch-size=16" | FileCheck %s
// RUN: tessera-opt %s --tessera-train-pipeline="micro-batch-size=8 global-batch-size=16 fuse-bias-gelu=false fuse-cross-entropy=false" | FileCheck %s --check-prefix=OFF
// RUN: tessera-opt %s --tessera-fuse-bias-gelu --tessera-fuse-cross-entropy --tessera-autodiff | FileCheck %s --check-prefix=GRAD

// Through the pipeline: fc1's GEMM writes the unbiased output, which the
// forward's rt.bias_gelu and the backward's rt.bias_gelu_grad both read
// (the saved activation); the backward writes fc1's bias gradient into
// its grad buffer with beta 1 (accumulating over the two microbatches) in
// the same kernel, so fc1 has no rt.bias_add and no rt.reduce_rows; fc2
// keeps both. The loss reads the logits once for its statistics
// (rt.logits_stats) and once more for its gradient, which reuses them.
// The synthetic labels' classes still come from the (fused) loss.
// CHECK: rt.buffer @labels : memref<8xi32> {kind = "input", num_classes = 4 : i64
// CHECK-LABEL: func.func @microbatch
// CHECK: rt.gemm %[[X:.*]], %[[W1:.*]], %[[Z:.*]] {trans_b}
// CHECK-NEXT: rt.bias_gelu %[[Z]], %[[B1:.*]], %[[H:.*]] {iattrs = array<i64: 1>}
// CHECK-NEXT: rt.gemm %[[H]], %{{.*}} {trans_b}
// CHECK-NEXT: rt.bias_add
// CHECK-NEXT: rt.logits_stats %[[LOGITS:[^,]*]], %[[T:[^,]*]], %[[M:[^,]*]], %[[SE:[^,]*]], %{{[^ ]*}} {iattrs = array<i64: -100>}
// CHECK-NEXT: rt.cross_entropy_from_stats
// CHECK-NOT: rt.logits
// CHECK: rt.cross_entropy_stats_grad %[[LOGITS]], %[[T]], %[[M]], %[[SE]],
// CHECK: rt.reduce_rows
// CHECK: rt.bias_gelu_grad %[[Z]], %[[B1]], %{{.*}}, %{{.*}}, %[[DB1:.*]] {beta = 1.000000e+00 : f32, iattrs = array<i64: 1>} : memref<8x64xf32>, memref<64xf32>, memref<8x64xf32>, memref<8x64xf32>, memref<64xf32>
// CHECK-NOT: rt.reduce_rows
// CHECK: return
// OFF: rt.bias_add
// OFF-NEXT: rt.gelu {{.*}} {iattrs = array<i64: 1>}
// OFF: rt.logits_max
// OFF: rt.cross_entropy_stats
// OFF: rt.logits_max
// OFF: rt.cross_entropy_stats
// OFF: rt.cross_entropy_stats_grad
// OFF: rt.reduce_rows
// OFF: rt.gelu_grad
// OFF: rt.reduce_rows
// OFF-NOT: rt.bias_gelu
// OFF-NOT: rt.logits_stats

// The autodiff of the fused ops: one nn.bias_gelu_grad for fc1's input and
// bias gradients; fc2's bias keeps its nn.reduce_rows.
// The loss's backward reads the saved statistics: no second
// nn.logits_stats.
// GRAD: %[[M:.*]], %[[SE:.*]], %{{.*}} = nn.logits_stats
// GRAD-NOT: nn.logits_stats
// GRAD: nn.cross_entropy_stats_grad %{{.*}}, %arg5, %[[M]], %[[SE]], %{{.*}} :
// GRAD: nn.reduce_rows
// GRAD: %{{.*}}, %{{.*}} = nn.bias_gelu_grad %{{.*}}, %arg2, %{{.*}} {approximate = "tanh"} : (tensor<8x64xf32>, tensor<64xf32>, tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<64xf32>)
// GRAD-NOT: nn.reduce_rows
func.func @mlp(%x: tensor<8x16xf32> {nn.input = "features"},
               %w1: tensor<64x16xf32> {nn.param = "fc1.weight", nn.init = "normal:0.02"},
               %b1: tensor<64xf32> {nn.param = "fc1.bias", nn.init = "zeros"},
               %w2: tensor<4x64xf32> {nn.param = "fc2.weight", nn.init = "normal:0.02"},
               %b2: tensor<4xf32> {nn.param = "fc2.bias", nn.init = "zeros"},
               %y: tensor<8xi32> {nn.input = "labels"}) -> tensor<f32> {
  %z = nn.linear %x, %w1, %b1 : (tensor<8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %h = nn.gelu %z {approximate = "tanh"} : tensor<8x64xf32>
  %o = nn.linear %h, %w2, %b2 : (tensor<8x64xf32>, tensor<4x64xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %l = nn.softmax_cross_entropy %o, %y {ignore_index = -100 : i64} : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<8xf32>
  %m = nn.token_mean %l, %y : (tensor<8xf32>, tensor<8xi32>) -> tensor<f32>
  return %m : tensor<f32>
}
