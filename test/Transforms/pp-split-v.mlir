// RUN: tessera-opt %s --tessera-pp-split="v-shape=true" | FileCheck %s
// RUN: tessera-opt %s --tessera-pp-split="v-shape=true" --tessera-autodiff | FileCheck %s --check-prefix=GRAD

// The V placement of the zbv and dualpipev schedules: 4 layers over pp 2
// with two chunks per rank place virtual stage s on rank s for s < 2 and
// on rank 3 - s after: rank 0 holds layers 0 and 3 (the embedding's and
// the loss's stages), rank 1 layers 1 and 2. The hop 0 -> 1 goes to the
// next rank, 1 -> 2 stays on rank 1 ("self", the V's turn) and 2 -> 3
// goes back to the previous rank (which receives it from its next). A parameter both of rank 0's chunks
// read (a tied embedding) is not reduced over any group: both chunks'
// gradients add up on the one rank.

dist.mesh @mesh {pp = 2, vpp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %emb: tensor<8x8xf32> {nn.param = "emb.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %w3: tensor<8x8xf32> {nn.param = "l3.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %emb {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %w3 {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = nn.linear %h3, %emb : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x8xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: module @pp0 attributes {dist.pp_rank = 0 : i64}
// CHECK: func.func @chunk0(%{{[^:]*}}: tensor<4x8xf32> {nn.input = "features"}, %{{[^:]*}}: tensor<8x8xf32> {nn.param = "emb.w"})
// CHECK-SAME: dist.stage = {chunk = 0 : i64, layers = array<i64: 0>, stage = 0 : i64}
// CHECK: dist.send %{{.*}} to "next" {tag = 0 : i64}
// CHECK: func.func @chunk1(%{{[^:]*}}: tensor<4xi32> {nn.input = "labels"}, %{{[^:]*}}: tensor<8x8xf32> {nn.param = "emb.w"}, %{{[^:]*}}: tensor<8x8xf32> {nn.param = "l3.w"}) -> tensor<f32>
// CHECK-NOT: dist.tied
// CHECK-SAME: dist.stage = {chunk = 1 : i64, layers = array<i64: 3>, stage = 3 : i64}
// CHECK-NEXT: dist.recv from "next" {tag = 4 : i64}
// CHECK-LABEL: module @pp1 attributes {dist.pp_rank = 1 : i64}
// CHECK: func.func @chunk0(
// CHECK-SAME: stage = 1 : i64
// CHECK-NEXT: dist.recv from "prev" {tag = 0 : i64}
// CHECK: dist.send %{{.*}} to "self" {tag = 2 : i64}
// CHECK: func.func @chunk1(
// CHECK-SAME: stage = 2 : i64
// CHECK-NEXT: dist.recv from "self" {tag = 2 : i64}
// CHECK: dist.send %{{.*}} to "prev" {tag = 4 : i64}

// The gradients travel back the same way: each backward receives from
// the rank its forward sent to and sends to the rank its forward received
// from, the turn's on rank 1 itself.
// GRAD-LABEL: module @pp0
// GRAD: func.func @backward_c0(
// GRAD: dist.recv from "next" {tag = 1 : i64}
// GRAD: func.func @backward_c1(
// GRAD: dist.send %{{.*}} to "next" {tag = 5 : i64}
// GRAD-LABEL: module @pp1
// GRAD: func.func @backward_c0(
// GRAD: dist.recv from "self" {tag = 3 : i64}
// GRAD: dist.send %{{.*}} to "prev" {tag = 1 : i64}
// GRAD: func.func @backward_c1(
// GRAD: dist.recv from "prev" {tag = 5 : i64}
// GRAD: dist.send %{{.*}} to "self" {tag = 3 : i64}
