// RUN: tessera-opt %s --tessera-mixed-precision --tessera-bf16-activations | FileCheck %s

// A fused add + norm is split again: the norm reads the sum rounded to
// bf16, as Megatron's norm reads the bf16 residual stream; the sum is
// stored for the residual's other readers. eps and the layer stay.
// CHECK-LABEL: func.func @m
// CHECK: %[[S:.*]] = nn.add %{{.*}}, %{{.*}} {nn.layer = 0 : i64} : tensor<4x8xf32>
// CHECK-NEXT: %[[SS:.*]] = nn.cast %[[S]] {nn.layer = 0 : i64, nn.stored_activation} : tensor<4x8xf32> to tensor<4x8xbf16>
// CHECK-NEXT: %[[SW:.*]] = nn.cast %[[SS]] {nn.layer = 0 : i64, nn.recompute_in_backward}
// CHECK-NEXT: %[[Y:.*]] = nn.layer_norm %[[SW]], %{{.*}}, %{{.*}} {nn.layer = 0 : i64}
// CHECK-NEXT: %[[YS:.*]] = nn.cast %[[Y]] {nn.layer = 0 : i64, nn.stored_activation}
// CHECK: %[[S2:.*]] = nn.add %{{.*}}, %{{.*}} {nn.layer = 1 : i64}
// CHECK-NEXT: %[[S2S:.*]] = nn.cast %[[S2]] {nn.layer = 1 : i64, nn.stored_activation}
// CHECK-NEXT: %[[S2W:.*]] = nn.cast %[[S2S]] {nn.layer = 1 : i64, nn.recompute_in_backward}
// CHECK-NEXT: nn.rms_norm %[[S2W]], %{{.*}} {eps = 9.99999997E-7 : f32, nn.layer = 1 : i64}
// CHECK-NOT: nn.add_layer_norm
// CHECK-NOT: nn.add_rms_norm

func.func @m(%a: tensor<4x8xf32> {nn.input = "features"},
             %w: tensor<8x8xf32> {nn.param = "w"},
             %g: tensor<8xf32> {nn.param = "g"},
             %beta: tensor<8xf32> {nn.param = "b"}) -> tensor<f32> {
  %h = nn.linear %a, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %s, %y = nn.add_layer_norm %h, %a, %g, %beta {eps = 1.0e-05 : f32, nn.layer = 0} : tensor<4x8xf32>, tensor<8xf32>
  %s2, %z = nn.add_rms_norm %y, %s, %g {eps = 1.0e-06 : f32, nn.layer = 1} : tensor<4x8xf32>, tensor<8xf32>
  %m = nn.mean %z : (tensor<4x8xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
