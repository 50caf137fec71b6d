// RUN: tessera-opt %s --tessera-pp-split="pp-layers=1,3" | FileCheck %s

// An uneven split asked for explicitly: one layer on rank 0, three on rank 1.
// CHECK-LABEL: module @pp0
// CHECK: layers = array<i64: 0>, stage = 0 : i64
// CHECK: nn.linear {{.*}} {nn.layer = 0 : i64}
// CHECK-NOT: nn.layer = 1
// CHECK: dist.send
// CHECK-LABEL: module @pp1
// CHECK: layers = array<i64: 1, 2, 3>, stage = 1 : i64
// CHECK: dist.recv

dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %w3: tensor<8x8xf32> {nn.param = "l3.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %w3 {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h3 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
