// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=2" --tessera-tp-partition | FileCheck %s
// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=4" -verify-diagnostics

// Grouped-query attention (Megatron's --group-query-attention): 8 query
// heads in 2 groups of head dim 8, linear_qkv's features per group [q (4
// heads) | k | v]. Tensor parallelism splits whole groups: at tp 2 each
// rank holds one group, nn.repeat_kv makes its 4 heads' head-major QKV, and
// attention runs on 4 heads.

// CHECK-LABEL: func.func @gqa
// CHECK-SAME: tensor<48x64xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, nn.param = "qkv.weight"}
// CHECK: nn.linear {{.*}} -> tensor<16x2x48xf32>
// CHECK-NEXT: nn.repeat_kv %{{.*}} {num_heads = 4 : i64, num_query_groups = 1 : i64} : (tensor<16x2x48xf32>) -> tensor<16x2x96xf32>
// CHECK-NEXT: nn.attention %{{.*}} {num_heads = 4 : i64} : (tensor<16x2x96xf32>) -> tensor<16x2x32xf32>
// CHECK-NEXT: nn.linear {{.*}} : (tensor<16x2x32xf32>, tensor<64x32xf32>) -> tensor<16x2x64xf32>
// CHECK-NEXT: dist.reduce_from_region
func.func @gqa(%x: tensor<16x2x64xf32> {nn.input = "features"},
               %wqkv: tensor<96x64xf32> {nn.param = "qkv.weight"},
               %wo: tensor<64x64xf32> {nn.param = "proj.weight"}) -> tensor<f32> {
  %qkv = nn.linear %x, %wqkv : (tensor<16x2x64xf32>, tensor<96x64xf32>) -> tensor<16x2x96xf32>
  // expected-error @+1 {{'nn.repeat_kv' op num_query_groups 2 is not divisible by tp = 4 (tensor parallelism splits the query groups)}}
  %h = nn.repeat_kv %qkv {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<16x2x96xf32>) -> tensor<16x2x192xf32>
  %a = nn.attention %h {num_heads = 8 : i64} : (tensor<16x2x192xf32>) -> tensor<16x2x64xf32>
  %y = nn.linear %a, %wo : (tensor<16x2x64xf32>, tensor<64x64xf32>) -> tensor<16x2x64xf32>
  %l = nn.mean %y : (tensor<16x2x64xf32>) -> tensor<f32>
  return %l : tensor<f32>
}
