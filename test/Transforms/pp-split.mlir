// RUN: tessera-opt %s --split-input-file --tessera-pp-split | FileCheck %s

// Four layers (x -> gelu(linear(x)) each) over pp = 2: contiguous blocks,
// layers 0-1 on rank 0 and 2-3 on rank 1. The input and the first layer's
// weight stay with rank 0, the head and loss go to the last stage, and
// the activation between layers 1 and 2 crosses as a send/recv pair.

dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %w3: tensor<8x8xf32> {nn.param = "l3.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %a0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1} : tensor<4x8xf32>
  %h2 = nn.linear %a1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a2 = nn.gelu %h2 {nn.layer = 2} : tensor<4x8xf32>
  %h3 = nn.linear %a2, %w3 {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a3 = nn.gelu %h3 {nn.layer = 3} : tensor<4x8xf32>
  %z = nn.linear %a3, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: module @pp0 attributes {dist.pp_rank = 0 : i64}
// CHECK: func.func @chunk0(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %[[W0:[^:]*]]: tensor<8x8xf32> {nn.param = "l0.w"}, %[[W1:[^:]*]]: tensor<8x8xf32> {nn.param = "l1.w"})
// CHECK-SAME: attributes {dist.stage = {chunk = 0 : i64, layers = array<i64: 0, 1>, stage = 0 : i64}}
// CHECK: nn.linear %[[X]], %[[W0]]
// CHECK-NEXT: nn.gelu
// CHECK-NEXT: nn.linear
// CHECK-NEXT: %[[A1:.*]] = nn.gelu
// CHECK-NEXT: dist.send %[[A1]] to "next" {tag = 0 : i64} : tensor<4x8xf32>
// CHECK-NEXT: return{{$}}
// CHECK-LABEL: module @pp1 attributes {dist.pp_rank = 1 : i64}
// CHECK: func.func @chunk0(%[[L:[^:]*]]: tensor<4xi32> {nn.input = "labels"}, %{{.*}}: tensor<8x8xf32> {nn.param = "l2.w"}, %{{.*}}: tensor<8x8xf32> {nn.param = "l3.w"}, %{{.*}}: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32>
// CHECK-SAME: layers = array<i64: 2, 3>, stage = 1 : i64
// CHECK-NEXT: %[[R:.*]] = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
// CHECK-NEXT: nn.linear %[[R]]
// CHECK: nn.softmax_cross_entropy %{{.*}}, %[[L]]
// CHECK: return %{{.*}} : tensor<f32>

// -----

// Virtual stages (Megatron's get_transformer_layer_offset): 4 layers, pp = 2,
// vpp = 2 give rank 0 the chunks [0] and [2], rank 1 [1] and [3]; virtual
// stage = chunk * pp + rank. The last rank's chunk 0 sends to the first
// rank's chunk 1 ("next" wraps around the pp group). A value used two stages
// later (%a0, read by layer 2's residual add) is passed on through the stage
// in between on its own channel, and a parameter used on the first and the
// last pipeline rank (the tied table) is marked for the embedding-group
// all-reduce.

dist.mesh @mesh {pp = 2, vpp = 2}
func.func @virtual(%x: tensor<4x8xf32> {nn.input = "features"},
                   %labels: tensor<4xi32> {nn.input = "labels"},
                   %wt: tensor<8x8xf32> {nn.param = "tied.w"},
                   %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                   %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                   %w3: tensor<3x8xf32> {nn.param = "l3.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %wt {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %a0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %r2 = nn.add %h2, %a0 {nn.layer = 2} : tensor<4x8xf32>
  %h3 = nn.linear %r2, %wt {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = nn.linear %h3, %w3 : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: module @pp0
// CHECK: func.func @chunk0(%{{.*}}: tensor<4x8xf32> {nn.input = "features"}, %{{.*}}: tensor<8x8xf32> {dist.tied = "embedding", nn.param = "tied.w"})
// CHECK-SAME: layers = array<i64: 0>, stage = 0
// CHECK: %[[A0:.*]] = nn.gelu
// CHECK-NEXT: dist.send %[[A0]] to "next" {tag = 0 : i64}
// CHECK: func.func @chunk1(
// CHECK-SAME: layers = array<i64: 2>, stage = 2
// CHECK-NEXT: %[[P:.*]] = dist.recv from "prev" {tag = 2 : i64}
// CHECK-NEXT: %[[H1:.*]] = dist.recv from "prev" {tag = 4 : i64}
// CHECK-NEXT: %[[H2:.*]] = nn.linear %[[H1]]
// CHECK-NEXT: %[[R2:.*]] = nn.add %[[H2]], %[[P]]
// CHECK-NEXT: dist.send %[[R2]] to "next" {tag = 6 : i64}
// CHECK-LABEL: module @pp1
// CHECK: func.func @chunk0(
// CHECK-SAME: layers = array<i64: 1>, stage = 1
// CHECK-NEXT: %[[A:.*]] = dist.recv from "prev" {tag = 0 : i64}
// CHECK-NEXT: %[[H:.*]] = nn.linear %[[A]]
// CHECK-NEXT: dist.send %[[A]] to "next" {tag = 2 : i64}
// CHECK-NEXT: dist.send %[[H]] to "next" {tag = 4 : i64}
// CHECK: func.func @chunk1(%{{.*}}: tensor<4xi32> {nn.input = "labels"}, %{{.*}}: tensor<8x8xf32> {dist.tied = "embedding", nn.param = "tied.w"}
// CHECK-SAME: layers = array<i64: 3>, stage = 3
// CHECK: nn.mean

// -----

// pp = 1: nothing to split.
// CHECK-LABEL: func.func @single
// CHECK-NOT: module @pp
dist.mesh @mesh {tp = 2}
func.func @single(%x: tensor<4x8xf32> {nn.input = "features"},
                  %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
