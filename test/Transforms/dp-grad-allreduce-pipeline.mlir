// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s

// Per pipeline rank, the step takes the gradients of that rank's
// parameters. The table used on the first and the last pipeline rank (tied
// embedding and LM head) is summed over the embedding group first, as
// Megatron does after the backward; then every gradient is averaged over dp.

// CHECK-LABEL: module @pp0
// CHECK: func.func @step(%[[T:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:tied.w"}, %[[W:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:l1.w"})
// CHECK-NEXT: %[[E:.*]] = dist.all_reduce %[[T]] on @mesh "embedding" : tensor<8x8xf32>
// CHECK-NEXT: %[[S:.*]] = nn.scale %[[E]] {factor = 5.000000e-01 : f32}
// CHECK-NEXT: dist.all_reduce %[[S]] on @mesh "dp"
// CHECK-NEXT: %[[S1:.*]] = nn.scale %[[W]]
// CHECK-NEXT: dist.all_reduce %[[S1]] on @mesh "dp"
// CHECK-LABEL: module @pp1
// CHECK: func.func @step(%[[T1:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:tied.w"}, %{{.*}}: tensor<8x8xf32> {tessera.buffer = "grad:l2.w"})
// CHECK: dist.all_reduce %[[T1]] on @mesh "embedding"

dist.mesh @mesh {pp = 2, dp = 2}
func.func @tied(%x: tensor<4x8xf32> {nn.input = "features"},
                %wt: tensor<8x8xf32> {nn.param = "tied.w"},
                %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                %w2: tensor<8x8xf32> {nn.param = "l2.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %wt {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %wt : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h3 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
