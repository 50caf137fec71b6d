// RUN: tessera-opt %s -split-input-file -verify-diagnostics

dist.mesh @mesh {ep = 2, dp = 2}

func.func @experts(%rows: tensor<16x8xf32>, %counts: tensor<3xi32>) -> tensor<32x8xf32> {
  // expected-error @+1 {{'dist.expert_dispatch' op 3 experts do not split evenly over 2 expert-parallel ranks}}
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @mesh "ep" : tensor<16x8xf32>, tensor<3xi32> -> tensor<32x8xf32>, tensor<1xi32>, tensor<2x1xi32>
  return %recv : tensor<32x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, dp = 2}

func.func @rows(%rows: tensor<16x8xf32>, %counts: tensor<4xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{'dist.expert_dispatch' op expects 2 x the rows 'tensor<16x8xf32>' on the experts' side, got 'tensor<16x8xf32>'}}
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @mesh "ep" : tensor<16x8xf32>, tensor<4xi32> -> tensor<16x8xf32>, tensor<2xi32>, tensor<2x2xi32>
  return %recv : tensor<16x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, dp = 2}

func.func @splits(%y: tensor<32x8xf32>, %splits: tensor<2x1xi32>, %counts: tensor<4xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{'dist.expert_combine' op expects splits [2, 2] and local counts [2]}}
  %back = dist.expert_combine %y, %splits, %counts on @mesh "ep" : tensor<32x8xf32>, tensor<2x1xi32>, tensor<4xi32> -> tensor<16x8xf32>
  return %back : tensor<16x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, etp = 2, dp = 4}

func.func @etp(%rows: tensor<16x8xf32>, %counts: tensor<4xi32>) -> tensor<64x8xf32> {
  // expected-error @+1 {{'dist.expert_dispatch' op expects etp (3) to divide the group's 4 ranks}}
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @mesh "etp-ep" {etp = 3 : i64} : tensor<16x8xf32>, tensor<4xi32> -> tensor<64x8xf32>, tensor<2xi32>, tensor<4x2xi32>
  return %recv : tensor<64x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, etp = 2, dp = 4}

func.func @etp_splits(%y: tensor<64x8xf32>, %splits: tensor<2x2xi32>, %counts: tensor<4xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{'dist.expert_combine' op expects splits [4, 2] and local counts [2]}}
  %back = dist.expert_combine %y, %splits, %counts on @mesh "etp-ep" {etp = 2 : i64} : tensor<64x8xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x8xf32>
  return %back : tensor<16x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, dp = 2}

func.func @dtypes(%rows: tensor<16x8xbf16>, %counts: tensor<4xi32>) -> tensor<32x8xf32> {
  // expected-error @+1 {{'dist.expert_dispatch' op expects the rows 'tensor<16x8xbf16>' and the experts' side 'tensor<32x8xf32>' in one dtype}}
  %recv, %local, %splits = dist.expert_dispatch %rows, %counts on @mesh "ep" : tensor<16x8xbf16>, tensor<4xi32> -> tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>
  return %recv : tensor<32x8xf32>
}

// -----

dist.mesh @mesh {ep = 2, etp = 2, dp = 4}

// bf16 rows (bf16 activations) only move; etp > 1 sums partial rows.
func.func @etp_bf16(%y: tensor<64x8xbf16>, %splits: tensor<4x2xi32>, %counts: tensor<4xi32>) -> tensor<16x8xbf16> {
  // expected-error @+1 {{'dist.expert_combine' op moves 'bf16' rows, but etp 2 > 1 sums partial rows, in f32 only}}
  %back = dist.expert_combine %y, %splits, %counts on @mesh "etp-ep" {etp = 2 : i64} : tensor<64x8xbf16>, tensor<4x2xi32>, tensor<4xi32> -> tensor<16x8xbf16>
  return %back : tensor<16x8xbf16>
}
