// RUN: tessera-opt %s --tessera-pp-split --tessera-recompute="granularity=full method=uniform num-layers=1" --tessera-autodiff | FileCheck %s

// Recompute in pipeline chunks: the forward phase no longer returns what
// the group recomputes (tessera.stash), and the backward phase recomputes
// it from the group's input (a model input, or a received activation that
// is stashed instead). Without recompute the first stage stashes its GEMM
// output for the GELU gradient and the second stage its own as well.

module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 2 : i64}} {
dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %a0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1} : tensor<4x8xf32>
  %z = nn.linear %a1, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// CHECK-LABEL: module @pp0
// CHECK: func.func @forward_c0(%{{[^:]*}}: tensor<4x8xf32> {nn.input = "features"}, %{{[^:]*}}: tensor<8x8xf32> {nn.param = "l0.w"}) attributes
// CHECK: dist.send
// CHECK-NEXT: return{{$}}
// CHECK: func.func @backward_c0(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %[[W:[^:]*]]: tensor<8x8xf32> {nn.param = "l0.w"}) -> (tensor<8x8xf32> {tessera.grad_of = "l0.w"})
// CHECK-NEXT: %[[G:.*]] = dist.recv from "next"
// CHECK-NEXT: %[[H:.*]] = nn.linear %[[X]], %[[W]] {nn.layer = 0 : i64} :
// CHECK-NEXT: nn.gelu_grad %[[H]], %[[G]]
// CHECK-LABEL: module @pp1
// The logits, the layer's output (the head's input) and the received input.
// CHECK: func.func @forward_c0(
// CHECK-SAME: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x3xf32> {tessera.stash = 0 : i64}, tensor<4x8xf32> {tessera.stash = 1 : i64}, tensor<4x8xf32> {tessera.stash = 2 : i64})
// CHECK: %[[IN:.*]] = dist.recv from "prev"
// CHECK: %[[H1:.*]] = nn.linear %[[IN]], {{.*}}nn.recompute = 0
// CHECK-NEXT: %[[A1:.*]] = nn.gelu %[[H1]]
// CHECK: return %{{.*}}, %{{.*}}, %[[A1]], %[[IN]] :
// CHECK: func.func @backward_c0(%{{[^:]*}}: tensor<4xi32> {nn.input = "labels"}, %{{[^:]*}}: tensor<3x8xf32> {nn.param = "head.w"}, %[[W1:[^:]*]]: tensor<8x8xf32> {nn.param = "l1.w"}, %{{[^:]*}}: tensor<4x3xf32> {tessera.stash = 0 : i64}, %{{[^:]*}}: tensor<4x8xf32> {tessera.stash = 1 : i64}, %[[S2:[^:]*]]: tensor<4x8xf32> {tessera.stash = 2 : i64})
// CHECK: %[[RH:.*]] = nn.linear %[[S2]], %[[W1]] {nn.layer = 1 : i64} :
// CHECK-NEXT: nn.gelu_grad %[[RH]],
