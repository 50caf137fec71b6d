// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// CHECK-LABEL: func.func @layer
func.func @layer(%ids: tensor<16x2xi32>, %wte: tensor<384x64xf32>, %wpe: tensor<16x64xf32>,
                 %g: tensor<64xf32>, %b: tensor<64xf32>, %wqkv: tensor<192x64xf32>) -> tensor<f32> {
  // CHECK: nn.embedding %{{.*}}, %{{.*}} {vocab_size = 257 : i64} : (tensor<16x2xi32>, tensor<384x64xf32>) -> tensor<16x2x64xf32>
  %h = nn.embedding %ids, %wte {vocab_size = 257 : i64} : (tensor<16x2xi32>, tensor<384x64xf32>) -> tensor<16x2x64xf32>
  // CHECK: nn.add_position_embedding %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<16x64xf32>
  %h1 = nn.add_position_embedding %h, %wpe : tensor<16x2x64xf32>, tensor<16x64xf32>
  // CHECK: nn.dropout %{{.*}} {rate = 1.000000e-01 : f32, stream = 3 : i64} : tensor<16x2x64xf32>
  %h2 = nn.dropout %h1 {rate = 0.1 : f32, stream = 3 : i64} : tensor<16x2x64xf32>
  // CHECK: nn.layer_norm %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<64xf32>
  %x = nn.layer_norm %h2, %g, %b : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.add_layer_norm %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eps = 9.99999997E-7 : f32} : tensor<16x2x64xf32>, tensor<64xf32>
  %xs, %xn = nn.add_layer_norm %h2, %x, %g, %b {eps = 1.0e-6 : f32} : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.add_layer_norm_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<64xf32>
  %dxs, %dg, %dbb = nn.add_layer_norm_grad %xs, %g, %xn, %x : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.rms_norm %{{.*}}, %{{.*}} {eps = 9.99999997E-7 : f32} : tensor<16x2x64xf32>, tensor<64xf32>
  %r = nn.rms_norm %h2, %g {eps = 1.0e-6 : f32} : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.rms_norm_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<64xf32>
  %dr, %drg = nn.rms_norm_grad %h2, %g, %r : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.add_rms_norm %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<64xf32>
  %rs, %rn = nn.add_rms_norm %h2, %r, %g : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.add_rms_norm_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2x64xf32>, tensor<64xf32>
  %drs, %drsg = nn.add_rms_norm_grad %rs, %g, %rn, %r : tensor<16x2x64xf32>, tensor<64xf32>
  // CHECK: nn.linear {{.*}} -> tensor<16x2x192xf32>
  // CHECK: nn.rotary_embedding %{{.*}} {base = 5.000000e+05 : f32, inverse = true, num_heads = 4 : i64, rotary_dim = 8 : i64, scaling_factor = 8.000000e+00 : f32, sequence_shard_group = "cp"} : tensor<16x2x192xf32>
  %rq = nn.linear %x, %wqkv : (tensor<16x2x64xf32>, tensor<192x64xf32>) -> tensor<16x2x192xf32>
  %rr = nn.rotary_embedding %rq {num_heads = 4 : i64, rotary_dim = 8 : i64, base = 5.0e5 : f32, inverse = true, sequence_shard_group = "cp", scaling_factor = 8.0 : f32} : tensor<16x2x192xf32>
  // CHECK: nn.linear {{.*}} -> tensor<16x2x192xf32>
  %qkv = nn.linear %x, %wqkv : (tensor<16x2x64xf32>, tensor<192x64xf32>) -> tensor<16x2x192xf32>
  // CHECK: nn.attention %{{.*}} {num_heads = 4 : i64} : (tensor<16x2x192xf32>) -> tensor<16x2x64xf32>
  %ctx = nn.attention %qkv {num_heads = 4 : i64} : (tensor<16x2x192xf32>) -> tensor<16x2x64xf32>
  // CHECK: nn.linear {{.*}} -> tensor<16x2x384xf32>
  %z = nn.linear %ctx, %wte : (tensor<16x2x64xf32>, tensor<384x64xf32>) -> tensor<16x2x384xf32>
  // CHECK: nn.softmax_cross_entropy %{{.*}}, %{{.*}} {ignore_index = -1 : i64} : (tensor<16x2x384xf32>, tensor<16x2xi32>) -> tensor<16x2xf32>
  %l = nn.softmax_cross_entropy %z, %ids {ignore_index = -1 : i64} : (tensor<16x2x384xf32>, tensor<16x2xi32>) -> tensor<16x2xf32>
  // CHECK: nn.token_mean %{{.*}}, %{{.*}} {ignore_index = -1 : i64} : (tensor<16x2xf32>, tensor<16x2xi32>) -> tensor<f32>
  %m = nn.token_mean %l, %ids {ignore_index = -1 : i64} : (tensor<16x2xf32>, tensor<16x2xi32>) -> tensor<f32>
  return %m : tensor<f32>
}

// CHECK-LABEL: func.func @unsharded_loss
func.func @unsharded_loss(%z: tensor<16x2x384xf32>, %t: tensor<16x2xi32>) -> tensor<16x2xf32> {
  // CHECK: nn.logits_stats %{{.*}}, %{{.*}} {ignore_index = -1 : i64} : (tensor<16x2x384xf32>, tensor<16x2xi32>) -> (tensor<16x2xf32>, tensor<16x2xf32>, tensor<16x2xf32>)
  %m, %se, %pl = nn.logits_stats %z, %t {ignore_index = -1 : i64} : (tensor<16x2x384xf32>, tensor<16x2xi32>) -> (tensor<16x2xf32>, tensor<16x2xf32>, tensor<16x2xf32>)
  // CHECK: nn.cross_entropy_from_stats
  %l = nn.cross_entropy_from_stats %z, %t, %m, %se, %pl {ignore_index = -1 : i64} : (tensor<16x2x384xf32>, tensor<16x2xi32>, tensor<16x2xf32>, tensor<16x2xf32>, tensor<16x2xf32>) -> tensor<16x2xf32>
  return %l : tensor<16x2xf32>
}

// CHECK-LABEL: func.func @vocab_parallel_loss
func.func @vocab_parallel_loss(%z: tensor<16x2x192xf32>, %t: tensor<16x2xi32>) -> tensor<16x2xf32> {
  // CHECK: nn.logits_max
  %m = nn.logits_max %z : (tensor<16x2x192xf32>) -> tensor<16x2xf32>
  // CHECK: nn.cross_entropy_stats {{.*}} {vocab_shard_group = "tp"}
  %se, %pl = nn.cross_entropy_stats %z, %t, %m {vocab_shard_group = "tp"} : (tensor<16x2x192xf32>, tensor<16x2xi32>, tensor<16x2xf32>) -> (tensor<16x2xf32>, tensor<16x2xf32>)
  // CHECK: nn.cross_entropy_from_stats
  %l = nn.cross_entropy_from_stats %z, %t, %m, %se, %pl {vocab_shard_group = "tp"} : (tensor<16x2x192xf32>, tensor<16x2xi32>, tensor<16x2xf32>, tensor<16x2xf32>, tensor<16x2xf32>) -> tensor<16x2xf32>
  // CHECK: nn.cross_entropy_stats_grad
  %dz = nn.cross_entropy_stats_grad %z, %t, %m, %se, %l {vocab_shard_group = "tp"} : tensor<16x2x192xf32>, tensor<16x2xi32>, tensor<16x2xf32>
  return %l : tensor<16x2xf32>
}
