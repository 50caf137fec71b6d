// RUN: tessera-opt %s --tessera-pp-split --tessera-mixed-precision --tessera-bf16-activations | FileCheck %s
// RUN: tessera-opt %s --tessera-pp-split --tessera-mixed-precision --tessera-bf16-activations --tessera-autodiff | FileCheck %s --check-prefix=GRAD

// Every activation is stored in bf16 right after the op that computes it
// (nn.stored_activation); each reader that computes in f32 gets its own
// cast back right before it, marked for the backward to cast again. The
// bf16 GEMM operand tessera-mixed-precision made is the stored value
// itself, and the send carries bf16, as does the receive on the next stage.
// The logits are stored in bf16 too; the cross entropy and the loss stay
// f32.
// CHECK: tessera.mixed_precision = {activations = "bf16", grads = "f32", params = "bf16"}
// CHECK-LABEL: func.func @chunk0
// CHECK: %[[H:.*]] = nn.linear %{{.*}}, %{{.*}} {nn.layer = 0 : i64} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[HS:.*]] = nn.cast %[[H]] {nn.layer = 0 : i64, nn.stored_activation} : tensor<4x8xf32> to tensor<4x8xbf16>
// CHECK-NEXT: %[[HW:.*]] = nn.cast %[[HS]] {nn.layer = 0 : i64, nn.recompute_in_backward} : tensor<4x8xbf16> to tensor<4x8xf32>
// CHECK-NEXT: %[[A:.*]] = nn.gelu %[[HW]]
// CHECK-NEXT: %[[AS:.*]] = nn.cast %[[A]] {nn.layer = 0 : i64, nn.stored_activation}
// CHECK-NEXT: %[[HW2:.*]] = nn.cast %[[HS]] {nn.layer = 0 : i64, nn.recompute_in_backward}
// CHECK-NEXT: %[[AW:.*]] = nn.cast %[[AS]] {nn.layer = 0 : i64, nn.recompute_in_backward}
// CHECK-NEXT: %[[R:.*]] = nn.add %[[AW]], %[[HW2]]
// CHECK-NEXT: %[[RS:.*]] = nn.cast %[[R]] {nn.layer = 0 : i64, nn.stored_activation}
// CHECK-NEXT: dist.send %[[RS]] to "next" {tag = 0 : i64} : tensor<4x8xbf16>
// CHECK-LABEL: func.func @chunk0
// CHECK: %[[X:.*]] = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xbf16>
// CHECK-NEXT: nn.linear %[[X]], %{{.*}} {nn.layer = 1 : i64} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK: %[[Z:.*]] = nn.linear %{{.*}}, %{{.*}} : (tensor<4x8xbf16>, tensor<3x8xbf16>) -> tensor<4x3xf32>
// CHECK-NEXT: %[[ZS:.*]] = nn.cast %[[Z]] {nn.stored_activation} : tensor<4x3xf32> to tensor<4x3xbf16>
// CHECK-NEXT: %[[ZW:.*]] = nn.cast %[[ZS]] {nn.recompute_in_backward} : tensor<4x3xbf16> to tensor<4x3xf32>
// CHECK-NEXT: nn.softmax_cross_entropy %[[ZW]], %{{.*}} : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>

// The saved activations are the bf16 values; the backward casts them to
// f32 where a rule computes in f32. Gradients are f32 inside a stage and
// bf16 between stages (received, cast to f32; cast to bf16, sent).
// GRAD-LABEL: func.func @forward_c0
// GRAD-SAME: -> (tensor<4x8xbf16> {tessera.stash = 0 : i64}, tensor<4x8xbf16> {tessera.stash = 1 : i64})
// GRAD-LABEL: func.func @backward_c0
// GRAD-SAME: (%[[S0:[^:]*]]: tensor<4x8xbf16> {tessera.stash = 0 : i64}, %[[S1:[^:]*]]: tensor<4x8xbf16> {tessera.stash = 1 : i64})
// GRAD-NEXT: %[[G:.*]] = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xbf16>
// GRAD-NEXT: %[[G32:.*]] = nn.cast %[[G]] : tensor<4x8xbf16> to tensor<4x8xf32>
// GRAD-NEXT: %[[H32:.*]] = nn.cast %[[S0]] {nn.layer = 0 : i64} : tensor<4x8xbf16> to tensor<4x8xf32>
// GRAD-NEXT: %[[D:.*]] = nn.gelu_grad %[[H32]], %[[G32]] : tensor<4x8xf32>
// GRAD-NEXT: %[[DH:.*]] = nn.add %[[G32]], %[[D]] : tensor<4x8xf32>
// GRAD-NEXT: %[[DH16:.*]] = nn.cast %[[DH]] : tensor<4x8xf32> to tensor<4x8xbf16>
// GRAD-NEXT: nn.matmul %[[DH16]], %[[S1]] {transpose_lhs}
// GRAD-LABEL: func.func @forward_c0
// GRAD-SAME: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x3xbf16> {tessera.stash = 0 : i64}, tensor<4x8xbf16> {tessera.stash = 1 : i64}, tensor<4x8xbf16> {tessera.stash = 2 : i64}, tensor<4x8xbf16> {tessera.stash = 3 : i64})
// GRAD-LABEL: func.func @backward_c0
// GRAD: %[[DX:.*]] = nn.matmul %{{.*}}, %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// GRAD: %[[DX16:.*]] = nn.cast %[[DX]] : tensor<4x8xf32> to tensor<4x8xbf16>
// GRAD-NEXT: dist.send %[[DX16]] to "prev" {tag = 1 : i64} : tensor<4x8xbf16>

module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}} {
dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %r0 = nn.add %a0, %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %r0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1} : tensor<4x8xf32>
  %z = nn.linear %a1, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}
