// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff | FileCheck %s

// Each pipeline chunk becomes a forward and a backward phase. The forward
// returns what the backward reads (tessera.stash); the backward of a stage
// that sends starts by receiving the gradient of what it sent (tag + 1 from
// "next"), and the backward of a stage that received ends by sending the
// gradient back (tag + 1 to "prev").

module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}} {
dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %a0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = nn.linear %h1, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// CHECK-LABEL: module @pp0
// CHECK: func.func @forward_c0(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %{{.*}}: tensor<8x8xf32> {nn.param = "l0.w"}) -> (tensor<4x8xf32> {tessera.stash = 0 : i64})
// CHECK-SAME: dist.chunk = 0 : i64, {{.*}}tessera.phase = "forward"
// CHECK: %[[H0:.*]] = nn.linear %[[X]]
// CHECK-NEXT: %[[A0:.*]] = nn.gelu %[[H0]]
// CHECK-NEXT: dist.send %[[A0]] to "next" {tag = 0 : i64}
// CHECK-NEXT: return %[[H0]]
// CHECK: func.func @backward_c0(%[[BX:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %[[S:[^:]*]]: tensor<4x8xf32> {tessera.stash = 0 : i64}) -> (tensor<8x8xf32> {tessera.grad_of = "l0.w"})
// CHECK-SAME: tessera.phase = "backward"
// CHECK-NEXT: %[[G:.*]] = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
// CHECK-NEXT: %[[D:.*]] = nn.gelu_grad %[[S]], %[[G]]
// CHECK-NEXT: %[[GW:.*]] = nn.matmul %[[D]], %[[BX]] {transpose_lhs}
// CHECK-NEXT: return %[[GW]]
// CHECK-LABEL: module @pp1
// CHECK: func.func @forward_c0(
// CHECK-SAME: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x3xf32> {tessera.stash = 0 : i64}, tensor<4x8xf32> {tessera.stash = 1 : i64}, tensor<4x8xf32> {tessera.stash = 2 : i64})
// CHECK-NEXT: %[[R:.*]] = dist.recv from "prev" {tag = 0 : i64}
// CHECK: func.func @backward_c0(
// The loss is divided by the number of microbatches (Megatron's scaling).
// CHECK: nn.fill 2.500000e-01 : tensor<f32>
// CHECK: %[[DX:.*]] = nn.matmul %{{.*}}, %{{.*}} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK: dist.send %[[DX]] to "prev" {tag = 1 : i64} : tensor<4x8xf32>
// CHECK-NEXT: return
