// RUN: tessera-opt %s --tessera-autodiff | FileCheck %s

// Activation recompute in the backward: for each group that
// tessera-recompute marked (nn.recompute), the values its ops produce that
// only the group reads in the forward but the backward reads too are
// computed again right before the backward's first reader, by clones of
// the group's ops that lead to them; the backward reads the clones. Only
// the ops that are needed are cloned (the GELU gradient reads the GEMM
// output, so no GELU is recomputed), the group's input and output (the
// residual stream) are read as they are, and unmarked ops (the head) are
// not recomputed.

module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %labels: tensor<4xi32> {nn.input = "labels"},
               %g0: tensor<8xf32> {nn.param = "l0.norm.weight"},
               %b0: tensor<8xf32> {nn.param = "l0.norm.bias"},
               %w0: tensor<8x8xf32> {nn.param = "l0.fc.weight"},
               %g1: tensor<8xf32> {nn.param = "l1.norm.weight"},
               %b1: tensor<8xf32> {nn.param = "l1.norm.bias"},
               %w1: tensor<8x8xf32> {nn.param = "l1.fc.weight"},
               %g2: tensor<8xf32> {nn.param = "l2.norm.weight"},
               %b2: tensor<8xf32> {nn.param = "l2.norm.bias"},
               %w2: tensor<8x8xf32> {nn.param = "l2.fc.weight"},
               %wh: tensor<3x8xf32> {nn.param = "head.weight"}) -> tensor<f32> {
  %n0 = nn.layer_norm %x, %g0, %b0 {nn.layer = 0, nn.recompute = 0} : tensor<4x8xf32>, tensor<8xf32>
  %h0 = nn.linear %n0, %w0 {nn.layer = 0, nn.recompute = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0, nn.recompute = 0} : tensor<4x8xf32>
  %r0 = nn.add %x, %a0 {nn.layer = 0, nn.recompute = 0} : tensor<4x8xf32>
  %n1 = nn.layer_norm %r0, %g1, %b1 {nn.layer = 1, nn.recompute = 1} : tensor<4x8xf32>, tensor<8xf32>
  %h1 = nn.linear %n1, %w1 {nn.layer = 1, nn.recompute = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1, nn.recompute = 1} : tensor<4x8xf32>
  %r1 = nn.add %r0, %a1 {nn.layer = 1, nn.recompute = 1} : tensor<4x8xf32>
  %n2 = nn.layer_norm %r1, %g2, %b2 {nn.layer = 2, nn.recompute = 2} : tensor<4x8xf32>, tensor<8xf32>
  %h2 = nn.linear %n2, %w2 {nn.layer = 2, nn.recompute = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a2 = nn.gelu %h2 {nn.layer = 2, nn.recompute = 2} : tensor<4x8xf32>
  %r2 = nn.add %r1, %a2 {nn.layer = 2, nn.recompute = 2} : tensor<4x8xf32>
  %z = nn.linear %r2, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// CHECK-LABEL: func.func @net
// CHECK-SAME: tessera.phase = "microbatch"
// Forward.
// CHECK: %[[R0:.*]] = nn.add %arg0, %{{.*}} {nn.layer = 0 : i64, nn.recompute = 0 : i64}
// CHECK: %[[R1:.*]] = nn.add %[[R0]], %{{.*}} {nn.layer = 1 : i64, nn.recompute = 1 : i64}
// CHECK: %[[R2:.*]] = nn.add %[[R1]], %{{.*}} {nn.layer = 2 : i64, nn.recompute = 2 : i64}
// CHECK: nn.mean
// Backward: the head's gradients read the last layer's output as it is.
// CHECK: %[[DZ:.*]] = nn.softmax_cross_entropy_grad
// CHECK: %[[DR2:.*]] = nn.matmul %[[DZ]], %arg11 :
// CHECK-NEXT: nn.matmul %[[DZ]], %[[R2]] {transpose_lhs}
// Layer 2 again, from its input, without the mark; then its gradient.
// CHECK-NEXT: %[[N2:.*]] = nn.layer_norm %[[R1]], %arg8, %arg9 {nn.layer = 2 : i64} :
// CHECK-NEXT: %[[H2:.*]] = nn.linear %[[N2]], %arg10 {nn.layer = 2 : i64} :
// CHECK-NEXT: %[[G2:.*]] = nn.gelu_grad %[[H2]], %[[DR2]]
// CHECK-NEXT: nn.matmul %[[G2]], %arg10 :
// CHECK-NEXT: nn.matmul %[[G2]], %[[N2]] {transpose_lhs}
// CHECK-NEXT: nn.layer_norm_grad %[[R1]], %arg8
// CHECK-NEXT: nn.add
// Layer 1 again, right before its gradient.
// CHECK-NEXT: %[[N1:.*]] = nn.layer_norm %[[R0]], %arg5, %arg6 {nn.layer = 1 : i64} :
// CHECK-NEXT: %[[H1:.*]] = nn.linear %[[N1]], %arg7 {nn.layer = 1 : i64} :
// CHECK-NEXT: nn.gelu_grad %[[H1]],
// Layer 0 again, from the model's input.
// CHECK: %[[N0:.*]] = nn.layer_norm %arg0, %arg2, %arg3 {nn.layer = 0 : i64} :
// CHECK-NEXT: %[[H0:.*]] = nn.linear %[[N0]], %arg4 {nn.layer = 0 : i64} :
// CHECK-NEXT: nn.gelu_grad %[[H0]],
// CHECK-NOT: nn.gelu {{.*}}nn.layer
// CHECK: return
