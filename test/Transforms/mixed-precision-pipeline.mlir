// RUN: tessera-opt %s --tessera-pp-split --tessera-mixed-precision=gemm-dtype=f32 --tessera-autodiff | FileCheck %s
// RUN: tessera-opt %s --tessera-pp-split --tessera-mixed-precision --tessera-autodiff | FileCheck %s --check-prefix=GEMM

// Mixed precision with f32 GEMMs in a pipeline stage: the cast of a parameter comes after
// the phase's leading receive (a phase receives first), and the backward
// casts the bf16 parameter again right before its first use instead of
// saving the f32 copy with the activations (which would hold an f32 copy
// of the weights per microbatch in flight). The saved activations are the stage's input and the linear's
// output only.
// CHECK-LABEL: module @pp1
// CHECK: func.func @forward_c0(%[[W:[^:]*]]: tensor<8x8xbf16> {nn.param = "l1.w"}) -> (tensor<4x8xf32> {tessera.stash = 0 : i64}, tensor<4x8xf32> {tessera.stash = 1 : i64})
// CHECK-NEXT: %[[IN:.*]] = dist.recv from "prev" {tag = 0 : i64}
// CHECK-NEXT: %[[W32:.*]] = nn.cast %[[W]] : tensor<8x8xbf16> to tensor<8x8xf32>
// CHECK-NEXT: nn.linear %[[IN]], %[[W32]]
// CHECK: func.func @backward_c0(%[[BW:[^:]*]]: tensor<8x8xbf16> {nn.param = "l1.w"}, %{{[^:]*}}: tensor<4x8xf32> {tessera.stash = 0 : i64}, %{{[^:]*}}: tensor<4x8xf32> {tessera.stash = 1 : i64}) -> (tensor<8x8xf32> {tessera.grad_of = "l1.w"})
// CHECK-NEXT: %[[DY:.*]] = dist.recv from "next" {tag = 3 : i64}
// CHECK-NEXT: %[[DH:.*]] = nn.gelu_grad %{{.*}}, %[[DY]]
// CHECK-NEXT: %[[BW32:.*]] = nn.cast %[[BW]] : tensor<8x8xbf16> to tensor<8x8xf32>
// CHECK-NEXT: nn.matmul %[[DH]], %[[BW32]]
// CHECK-LABEL: module @pp2

// With bf16 GEMMs no f32 copy of the weights exists: the forward's GEMM
// reads the bf16 parameter and the received input cast to bf16, which the
// stage saves for the backward's wgrad (half the f32 input's bytes); the
// backward's GEMMs read the bf16 parameter and the stashed copy with dy
// cast to bf16, and send the f32 dgrad back.
// GEMM-LABEL: module @pp1
// GEMM: func.func @forward_c0(%[[W:[^:]*]]: tensor<8x8xbf16> {nn.param = "l1.w"}) -> (tensor<4x8xf32> {tessera.stash = 0 : i64}, tensor<4x8xbf16> {tessera.stash = 1 : i64})
// GEMM-NEXT: %[[IN:.*]] = dist.recv from "prev" {tag = 0 : i64}
// GEMM-NEXT: %[[IN16:.*]] = nn.cast %[[IN]] {nn.layer = 1 : i64} : tensor<4x8xf32> to tensor<4x8xbf16>
// GEMM-NEXT: nn.linear %[[IN16]], %[[W]] {nn.layer = 1 : i64} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// GEMM: func.func @backward_c0(%[[BW:[^:]*]]: tensor<8x8xbf16> {nn.param = "l1.w"}, %{{[^:]*}}: tensor<4x8xf32> {tessera.stash = 0 : i64}, %[[S16:[^:]*]]: tensor<4x8xbf16> {tessera.stash = 1 : i64}) -> (tensor<8x8xf32> {tessera.grad_of = "l1.w"})
// GEMM-NEXT: %[[DY:.*]] = dist.recv from "next" {tag = 3 : i64}
// GEMM-NEXT: %[[DH:.*]] = nn.gelu_grad %{{.*}}, %[[DY]]
// GEMM-NEXT: %[[DH16:.*]] = nn.cast %[[DH]] : tensor<4x8xf32> to tensor<4x8xbf16>
// GEMM-NEXT: %[[DX:.*]] = nn.matmul %[[DH16]], %[[BW]] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// GEMM-NEXT: nn.matmul %[[DH16]], %[[S16]] {transpose_lhs} : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<8x8xf32>
// GEMM-NEXT: dist.send %[[DX]] to "prev" {tag = 1 : i64} : tensor<4x8xf32>
// GEMM-NOT: nn.cast %[[BW]]
// GEMM-LABEL: module @pp2
module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}} {
dist.mesh @mesh {pp = 3}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1} : tensor<4x8xf32>
  %h2 = nn.linear %a1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = nn.linear %h2, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}
