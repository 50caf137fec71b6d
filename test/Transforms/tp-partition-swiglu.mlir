// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=2" --tessera-tp-partition | FileCheck %s
// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=2" --tessera-tp-partition --tessera-autodiff | FileCheck %s --check-prefix=GRAD

// Megatron's SwiGLU MLP (--swiglu): linear_fc1's stacked [2, F, H] weight
// (gate, up) splits along F, so each rank computes [gate shard | up shard]
// and nn.swiglu turns it into the rank's contiguous shard of the F
// features; linear_fc2 is row-parallel as for GELU.

// CHECK-LABEL: func.func @swiglu
// CHECK-SAME: tensor<2x64x32xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, nn.param = "fc1.weight"}
// CHECK-SAME: tensor<2x64xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, nn.param = "fc1.bias"}
// CHECK-SAME: tensor<32x64xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, nn.param = "fc2.weight"}
// CHECK: dist.copy_to_region
// CHECK-NEXT: %[[GU:.*]] = nn.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x32xf32>, tensor<2x64x32xf32>, tensor<2x64xf32>) -> tensor<8x128xf32>
// CHECK-NEXT: %[[H:.*]] = nn.swiglu %[[GU]] : (tensor<8x128xf32>) -> tensor<8x64xf32>
// CHECK-NEXT: %[[P:.*]] = nn.linear %[[H]], %{{.*}} : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
// CHECK-NEXT: dist.reduce_from_region %[[P]]

// The stacked weight's and bias's gradients keep their shapes.
// GRAD-LABEL: func.func @swiglu
// GRAD: nn.swiglu_grad %{{.*}}, %{{.*}} : (tensor<8x128xf32>, tensor<8x64xf32>) -> tensor<8x128xf32>
// GRAD-DAG: nn.matmul %{{.*}}, %{{.*}} {transpose_lhs} : (tensor<8x128xf32>, tensor<8x32xf32>) -> tensor<2x64x32xf32>
// GRAD-DAG: nn.reduce_rows %{{.*}} : (tensor<8x128xf32>) -> tensor<2x64xf32>
func.func @swiglu(%x: tensor<8x32xf32> {nn.input = "features"},
                  %w1: tensor<2x128x32xf32> {nn.param = "fc1.weight"},
                  %b1: tensor<2x128xf32> {nn.param = "fc1.bias"},
                  %w2: tensor<32x128xf32> {nn.param = "fc2.weight"}) -> tensor<f32> {
  %gu = nn.linear %x, %w1, %b1 : (tensor<8x32xf32>, tensor<2x128x32xf32>, tensor<2x128xf32>) -> tensor<8x256xf32>
  %h = nn.swiglu %gu : (tensor<8x256xf32>) -> tensor<8x128xf32>
  %y = nn.linear %h, %w2 : (tensor<8x128xf32>, tensor<32x128xf32>) -> tensor<8x32xf32>
  %l = nn.mean %y : (tensor<8x32xf32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A stacked linear whose [gate shard | up shard] would reach a row-parallel
// linear directly stays whole: the blocks are not a contiguous shard.
// CHECK-LABEL: func.func @stacked_without_swiglu
// CHECK-SAME: tensor<2x128x32xf32> {nn.param = "fc1.weight"}
// CHECK-SAME: tensor<32x256xf32> {nn.param = "fc2.weight"}
// CHECK-NOT: dist.
func.func @stacked_without_swiglu(%x: tensor<8x32xf32> {nn.input = "features"},
                                  %w1: tensor<2x128x32xf32> {nn.param = "fc1.weight"},
                                  %w2: tensor<32x256xf32> {nn.param = "fc2.weight"}) -> tensor<f32> {
  %gu = nn.linear %x, %w1 : (tensor<8x32xf32>, tensor<2x128x32xf32>) -> tensor<8x256xf32>
  %h = nn.gelu %gu : tensor<8x256xf32>
  %y = nn.linear %h, %w2 : (tensor<8x256xf32>, tensor<32x256xf32>) -> tensor<8x32xf32>
  %l = nn.mean %y : (tensor<8x32xf32>) -> tensor<f32>
  return %l : tensor<f32>
}
