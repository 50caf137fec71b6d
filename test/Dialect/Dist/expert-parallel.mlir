// RUN: tessera-opt %s | tessera-opt | FileCheck %s

dist.mesh @mesh {ep = 2, dp = 2}

// CHECK-LABEL: func.func @exchange
func.func @exchange(%rows: tensor<16x8xf32>, %counts: tensor<4xi32>) -> tensor<16x8xf32> {
  // CHECK: %[[R:.*]], %[[L:.*]], %[[S:.*]] = dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "ep" : tensor<16x8xf32>, tensor<4xi32> -> tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @mesh "ep" : tensor<16x8xf32>, tensor<4xi32> -> tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>
  // CHECK: dist.expert_combine %[[R]], %[[S]], %{{.*}} on @mesh "ep" : tensor<32x8xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x8xf32>
  %back = dist.expert_combine %recv, %splits, %counts on @mesh "ep" : tensor<32x8xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x8xf32>
  return %back : tensor<16x8xf32>
}

// With expert tensor parallelism the exchange runs over "etp-ep": 2 x 2
// ranks, each receiving from all 4.
dist.mesh @emesh {ep = 2, etp = 2, dp = 4}

// CHECK-LABEL: func.func @etp
func.func @etp(%rows: tensor<16x8xf32>, %counts: tensor<4xi32>) -> tensor<16x8xf32> {
  // CHECK: dist.expert_dispatch %{{.*}}, %{{.*}} on @emesh "etp-ep" {etp = 2 : i64} : tensor<16x8xf32>, tensor<4xi32> -> tensor<64x8xf32>, tensor<2xi32>, tensor<4x2xi32>
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @emesh "etp-ep" {etp = 2 : i64} : tensor<16x8xf32>, tensor<4xi32> -> tensor<64x8xf32>, tensor<2xi32>, tensor<4x2xi32>
  // CHECK: dist.expert_combine %{{.*}}, %{{.*}}, %{{.*}} on @emesh "etp-ep" {etp = 2 : i64} : tensor<64x8xf32>, tensor<4x2xi32>, tensor<4xi32> -> tensor<16x8xf32>
  %back = dist.expert_combine %recv, %splits, %counts on @emesh "etp-ep" {etp = 2 : i64} : tensor<64x8xf32>, tensor<4x2xi32>, tensor<4xi32> -> tensor<16x8xf32>
  return %back : tensor<16x8xf32>
}

// bf16 rows (bf16 activations): the exchange moves them as they are.
dist.mesh @bmesh {ep = 2, dp = 2}
// CHECK-LABEL: func.func @bf16_rows
func.func @bf16_rows(%rows: tensor<16x8xbf16>, %counts: tensor<4xi32>) -> tensor<16x8xbf16> {
  // CHECK: dist.expert_dispatch {{.*}} : tensor<16x8xbf16>, tensor<4xi32> -> tensor<32x8xbf16>, tensor<2xi32>, tensor<2x2xi32>
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @bmesh "ep" : tensor<16x8xbf16>, tensor<4xi32> -> tensor<32x8xbf16>, tensor<2xi32>, tensor<2x2xi32>
  // CHECK: dist.expert_combine {{.*}} : tensor<32x8xbf16>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x8xbf16>
  %back = dist.expert_combine %recv, %splits, %counts on @bmesh "ep" : tensor<32x8xbf16>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x8xbf16>
  return %back : tensor<16x8xbf16>
}
