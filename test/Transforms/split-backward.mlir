// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-split-backward | FileCheck %s
// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-split-backward --tessera-pp-schedule="schedule=zb-h1" --tessera-verify-schedule | FileCheck %s --check-prefix=SCHED

// Each backward becomes B (backward_c<k>: the receive, the send and what the
// send needs) and W (backward_w_c<k>: the rest, returning the gradients).
// What B computes and W reads is saved in the slot, numbered after the
// forward's saved activations.

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

// The first stage sends nothing back: B only receives, W does the rest.
// CHECK-LABEL: module @pp0
// CHECK: func.func @forward_c0({{.*}}) -> (tensor<4x8xf32> {tessera.stash = 0 : i64})
// CHECK: func.func @backward_c0() -> (tensor<4x8xf32> {tessera.stash = 1 : i64})
// CHECK-SAME: tessera.phase = "backward"
// CHECK-NEXT: %[[G:.*]] = dist.recv from "next" {tag = 1 : i64}
// CHECK-NEXT: return %[[G]]
// CHECK: func.func @backward_w_c0(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %[[S0:[^:]*]]: tensor<4x8xf32> {tessera.stash = 0 : i64}, %[[S1:[^:]*]]: tensor<4x8xf32> {tessera.stash = 1 : i64}) -> (tensor<8x8xf32> {tessera.grad_of = "l0.w"})
// CHECK-SAME: tessera.phase = "backward_w"
// CHECK-NEXT: %[[D:.*]] = nn.gelu_grad %[[S0]], %[[S1]]
// CHECK-NEXT: %[[GW:.*]] = nn.matmul %[[D]], %[[X]] {transpose_lhs}
// CHECK-NEXT: return %[[GW]]

// The last stage: B computes the logits' and the hidden state's gradients
// (saved as 3 and 4) and sends the input gradient; W the two weight
// gradients from them and the forward's activations.
// CHECK-LABEL: module @pp1
// CHECK: func.func @backward_c0({{.*}}) -> (tensor<4x3xf32> {tessera.stash = 3 : i64}, tensor<4x8xf32> {tessera.stash = 4 : i64})
// CHECK: %[[DZ:.*]] = nn.softmax_cross_entropy_grad
// CHECK-NEXT: %[[DH:.*]] = nn.matmul %[[DZ]], %{{.*}} : (tensor<4x3xf32>, tensor<3x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[DX:.*]] = nn.matmul %[[DH]], %{{.*}} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: dist.send %[[DX]] to "prev" {tag = 1 : i64}
// CHECK-NEXT: return %[[DZ]], %[[DH]]
// CHECK: func.func @backward_w_c0(%[[A1:[^:]*]]: tensor<4x8xf32> {tessera.stash = 1 : i64}, %[[A0:[^:]*]]: tensor<4x8xf32> {tessera.stash = 2 : i64}, %[[SZ:[^:]*]]: tensor<4x3xf32> {tessera.stash = 3 : i64}, %[[SH:[^:]*]]: tensor<4x8xf32> {tessera.stash = 4 : i64}) -> (tensor<8x8xf32> {tessera.grad_of = "l1.w"}, tensor<3x8xf32> {tessera.grad_of = "head.w"})
// CHECK-NEXT: %[[GH:.*]] = nn.matmul %[[SZ]], %[[A1]] {transpose_lhs}
// CHECK-NEXT: %[[G1:.*]] = nn.matmul %[[SH]], %[[A0]] {transpose_lhs}
// CHECK-NEXT: return %[[G1]], %[[GH]]

// ZB-H1 on 4 microbatches: rank 0 (warmup 1) runs W(i) right after B(i),
// rank 1 one W late; each microbatch's slot is held until its W (two slots
// on both ranks, where 1F1B's last rank needs one).
// SCHED-LABEL: module @pp0
// SCHED: dist.schedule attributes {kind = "zb-h1", warmup = 1 : i64}
// SCHED-NEXT: dist.run @forward_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @forward_c0 microbatch 1 slot 1
// SCHED-NEXT: dist.run @backward_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @backward_w_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @forward_c0 microbatch 2 slot 0
// SCHED-LABEL: module @pp1
// SCHED: dist.schedule attributes {kind = "zb-h1", warmup = 0 : i64}
// SCHED-NEXT: dist.run @forward_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @backward_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @forward_c0 microbatch 1 slot 1
// SCHED-NEXT: dist.run @backward_c0 microbatch 1 slot 1
// SCHED-NEXT: dist.run @backward_w_c0 microbatch 0 slot 0
// SCHED-NEXT: dist.run @forward_c0 microbatch 2 slot 0
// SCHED-NEXT: dist.run @backward_c0 microbatch 2 slot 0
// SCHED-NEXT: dist.run @backward_w_c0 microbatch 1 slot 1
// SCHED-NEXT: dist.run @forward_c0 microbatch 3 slot 1
// SCHED-NEXT: dist.run @backward_c0 microbatch 3 slot 1
// SCHED-NEXT: dist.run @backward_w_c0 microbatch 2 slot 0
// SCHED-NEXT: dist.run @backward_w_c0 microbatch 3 slot 1
// SCHED-NEXT: {{^ *}}}
