// RUN: tessera-opt %s -split-input-file -verify-diagnostics

dist.mesh @mesh {cp = 2}

func.func @odd(%qkv: tensor<7x2x96xf32>) -> tensor<7x2x32xf32> {
  // expected-error @+1 {{'dist.ring_attention' op the local sequence (7) must be even: two chunks of the load-balanced layout}}
  %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 4 : i64} : tensor<7x2x96xf32> -> tensor<7x2x32xf32>, tensor<7x2x4xf32>
  return %ctx : tensor<7x2x32xf32>
}

// -----

dist.mesh @mesh {cp = 2}

func.func @heads(%qkv: tensor<8x2x96xf32>) -> tensor<8x2x32xf32> {
  // expected-error @+1 {{'dist.ring_attention' op qkv features 96 are not 3 x num_heads (5) x head_dim}}
  %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 5 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x5xf32>
  return %ctx : tensor<8x2x32xf32>
}

// -----

dist.mesh @mesh {cp = 2}

func.func @lse(%qkv: tensor<8x2x96xf32>) -> tensor<8x2x32xf32> {
  // expected-error @+1 {{'dist.ring_attention' op expects the context [s, b, heads * d] and the log-sum-exp [s, b, heads] of qkv 'tensor<8x2x96xf32>', got 'tensor<8x2x32xf32>' and 'tensor<8x2x2xf32>'}}
  %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 4 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x2xf32>
  return %ctx : tensor<8x2x32xf32>
}

// -----

dist.mesh @mesh {cp = 2}

func.func @zero(%qkv: tensor<8x2x96xf32>) -> tensor<8x2x32xf32> {
  // expected-error @+1 {{'dist.ring_attention' op num_heads must be positive}}
  %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 0 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x0xf32>
  return %ctx : tensor<8x2x32xf32>
}

// -----

dist.mesh @mesh {cp = 2}

func.func @group(%qkv: tensor<8x2x96xf32>) -> tensor<8x2x32xf32> {
  // expected-error @+1 {{names an invalid rank group: unknown rank-group axis 'xp' in group kind 'xp'}}
  %ctx, %lse = dist.ring_attention %qkv on @mesh "xp" {num_heads = 4 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x4xf32>
  return %ctx : tensor<8x2x32xf32>
}
