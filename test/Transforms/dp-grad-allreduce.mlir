// RUN: tessera-opt %s --tessera-attach-mesh="dp=4" --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s
// RUN: tessera-opt %s --tessera-attach-mesh="dp=1" --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s --check-prefix=DP1

// Gradients are scaled by 1/dp, then summed over the dp group.
// CHECK-LABEL: func.func @step
// CHECK-SAME: (%[[G0:.*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, %[[G1:.*]]: tensor<3xf32> {tessera.buffer = "grad:head.bias"})
// CHECK-SAME: -> (tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, tensor<3xf32> {tessera.buffer = "grad:head.bias"})
// CHECK-SAME: attributes {tessera.phase = "step"}
// CHECK-NEXT: %[[S0:.*]] = nn.scale %[[G0]] {factor = 2.500000e-01 : f32}
// CHECK-NEXT: %[[R0:.*]] = dist.all_reduce %[[S0]] on @mesh "dp" : tensor<3x8xf32>
// CHECK-NEXT: %[[S1:.*]] = nn.scale %[[G1]] {factor = 2.500000e-01 : f32}
// CHECK-NEXT: %[[R1:.*]] = dist.all_reduce %[[S1]] on @mesh "dp" : tensor<3xf32>
// CHECK-NEXT: return %[[R0]], %[[R1]]

// DP1-LABEL: func.func @step
// DP1-NOT: dist.all_reduce
// DP1: return %arg0, %arg1
func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
