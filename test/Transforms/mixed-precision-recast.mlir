// RUN: tessera-opt %s --tessera-mixed-precision=gemm-dtype=f32 --tessera-autodiff | FileCheck %s

// With f32 GEMMs, the backward casts a bf16 parameter to f32 again right before it first
// needs it (the head's weight, for the gradient of its input), so the
// forward's f32 copy dies with the forward linear instead of living
// through the backward; the first layer's weight is not needed by the
// backward at all (its input is data), so it is not cast again.
// CHECK: %[[W1:.*]] = nn.cast %[[P1:[^ ]*]] : tensor<8x8xbf16> to tensor<8x8xf32>
// CHECK-NEXT: nn.linear %{{.*}}, %[[W1]]
// CHECK: %[[W2:.*]] = nn.cast %[[P2:[^ ]*]] : tensor<3x8xbf16> to tensor<3x8xf32>
// CHECK-NEXT: nn.linear %{{.*}}, %[[W2]]
// CHECK: %[[DZ:.*]] = nn.softmax_cross_entropy_grad
// CHECK-NEXT: %[[W2B:.*]] = nn.cast %[[P2]] : tensor<3x8xbf16> to tensor<3x8xf32>
// CHECK-NEXT: nn.matmul %[[DZ]], %[[W2B]] :
// CHECK-NOT: nn.cast
// CHECK: return
func.func @two(%x: tensor<4x8xf32> {nn.input = "features"},
               %t: tensor<4xi32> {nn.input = "labels"},
               %w1: tensor<8x8xf32> {nn.param = "l1.w"},
               %w2: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h = nn.linear %x, %w1 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a = nn.gelu %h : tensor<4x8xf32>
  %z = nn.linear %a, %w2 : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
