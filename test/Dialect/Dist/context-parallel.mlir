// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// Ring attention over the cp group: this rank's share of the sequence (two
// chunks), the context and the log-sum-exp rows its backward reuses.
dist.mesh @mesh {cp = 2}

// CHECK-LABEL: func.func @ring
func.func @ring(%qkv: tensor<8x2x96xf32>, %dctx: tensor<8x2x32xf32>) -> tensor<8x2x96xf32> {
  // CHECK: %[[CTX:.*]], %[[LSE:.*]] = dist.ring_attention %{{.*}} on @mesh "cp" {num_heads = 4 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x4xf32>
  %ctx, %lse = dist.ring_attention %qkv on @mesh "cp" {num_heads = 4 : i64} : tensor<8x2x96xf32> -> tensor<8x2x32xf32>, tensor<8x2x4xf32>
  // CHECK: dist.ring_attention_grad %{{.*}}, %[[CTX]], %[[LSE]], %{{.*}} on @mesh "cp" {causal = false, num_heads = 4 : i64} : tensor<8x2x96xf32>, tensor<8x2x32xf32>, tensor<8x2x4xf32>
  %dqkv = dist.ring_attention_grad %qkv, %ctx, %lse, %dctx on @mesh "cp" {num_heads = 4 : i64, causal = false} : tensor<8x2x96xf32>, tensor<8x2x32xf32>, tensor<8x2x4xf32>
  return %dqkv : tensor<8x2x96xf32>
}

// CHECK: nn.token_count %{{.*}} : (tensor<8x2xi32>) -> tensor<f32>
// CHECK: nn.token_mean %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x2xf32>, tensor<8x2xi32>, tensor<f32>) -> tensor<f32>
// CHECK: nn.token_mean_grad %{{.*}}, %{{.*}}, %{{.*}} : (tensor<f32>, tensor<8x2xi32>, tensor<f32>) -> tensor<8x2xf32>
func.func @count(%l: tensor<8x2xf32>, %t: tensor<8x2xi32>) -> tensor<8x2xf32> {
  %n = nn.token_count %t : (tensor<8x2xi32>) -> tensor<f32>
  %y = nn.token_mean %l, %t, %n : (tensor<8x2xf32>, tensor<8x2xi32>, tensor<f32>) -> tensor<f32>
  %d = nn.token_mean_grad %y, %t, %n : (tensor<f32>, tensor<8x2xi32>, tensor<f32>) -> tensor<8x2xf32>
  return %d : tensor<8x2xf32>
}
