// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// CHECK-LABEL: func.func @forward
func.func @forward(%x: tensor<8x256xf32>, %w: tensor<16x256xf32>, %b: tensor<16xf32>,
                   %t: tensor<8xi32>, %w2s: tensor<2x8x256xf32>,
                   %b2s: tensor<2x8xf32>, %gqkv: tensor<8x2x48xf32>,
                   %qkw: tensor<4xf32>) -> tensor<f32> {
  // CHECK: nn.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x256xf32>, tensor<16x256xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  %y = nn.linear %x, %w, %b : (tensor<8x256xf32>, tensor<16x256xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  // CHECK: nn.linear %{{.*}}, %{{.*}} : (tensor<8x256xf32>, tensor<16x256xf32>) -> tensor<8x16xf32>
  %y2 = nn.linear %x, %w : (tensor<8x256xf32>, tensor<16x256xf32>) -> tensor<8x16xf32>
  // SwiGLU: a stacked [2, out, in] weight (gate, up) and its [..., 2n] ->
  // [..., n] activation; the gradients of a stacked weight and bias.
  // CHECK: nn.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x256xf32>, tensor<2x8x256xf32>, tensor<2x8xf32>) -> tensor<8x16xf32>
  %gu = nn.linear %x, %w2s, %b2s : (tensor<8x256xf32>, tensor<2x8x256xf32>, tensor<2x8xf32>) -> tensor<8x16xf32>
  // CHECK: nn.swiglu %{{.*}} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %sw = nn.swiglu %gu : (tensor<8x16xf32>) -> tensor<8x8xf32>
  // CHECK: nn.swiglu_grad %{{.*}}, %{{.*}} : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %dsw = nn.swiglu_grad %gu, %sw : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  // CHECK: nn.matmul %{{.*}}, %{{.*}} {transpose_lhs} : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<2x8x256xf32>
  %dws = nn.matmul %dsw, %x {transpose_lhs} : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<2x8x256xf32>
  // CHECK: nn.reduce_rows %{{.*}} : (tensor<8x16xf32>) -> tensor<2x8xf32>
  %dbs = nn.reduce_rows %dsw : (tensor<8x16xf32>) -> tensor<2x8xf32>
  // Grouped-query attention: 8 heads in 2 groups of head dim 4, grouped
  // [q (4 heads) | k | v] per group -> head-major [q | k | v] per head.
  // CHECK: nn.repeat_kv %{{.*}} {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<8x2x48xf32>) -> tensor<8x2x96xf32>
  %rep = nn.repeat_kv %gqkv {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<8x2x48xf32>) -> tensor<8x2x96xf32>
  // QK-norm on the grouped QKV (head dim 4).
  // CHECK: nn.qk_norm %{{.*}}, %{{.*}}, %{{.*}} {eps = 9.99999997E-7 : f32, num_heads = 8 : i64, num_query_groups = 2 : i64} : tensor<8x2x48xf32>, tensor<4xf32>
  %qn = nn.qk_norm %gqkv, %qkw, %qkw {num_heads = 8 : i64, num_query_groups = 2 : i64, eps = 1.0e-6 : f32} : tensor<8x2x48xf32>, tensor<4xf32>
  // CHECK: nn.qk_norm_grad
  %dqn, %dwq, %dwk = nn.qk_norm_grad %gqkv, %qkw, %qkw, %qn {num_heads = 8 : i64, num_query_groups = 2 : i64} : tensor<8x2x48xf32>, tensor<4xf32>
  // CHECK: nn.repeat_kv_grad %{{.*}} {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<8x2x96xf32>) -> tensor<8x2x48xf32>
  %drep = nn.repeat_kv_grad %rep {num_heads = 8 : i64, num_query_groups = 2 : i64} : (tensor<8x2x96xf32>) -> tensor<8x2x48xf32>
  // CHECK: nn.gelu
  %g = nn.gelu %y : tensor<8x16xf32>
  // CHECK: nn.gelu %{{.*}} {approximate = "tanh"}
  %gt = nn.gelu %y {approximate = "tanh"} : tensor<8x16xf32>
  // CHECK: nn.bias_gelu %{{.*}}, %{{.*}} {approximate = "tanh"} : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  %bg = nn.bias_gelu %y2, %b {approximate = "tanh"} : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  // CHECK: nn.relu
  %r = nn.relu %y2 : tensor<8x16xf32>
  // CHECK: nn.add
  %s = nn.add %g, %r : tensor<8x16xf32>
  // CHECK: nn.bias_add
  %s2 = nn.bias_add %s, %b : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  // CHECK: nn.softmax_cross_entropy
  %l = nn.softmax_cross_entropy %s2, %t : (tensor<8x16xf32>, tensor<8xi32>) -> tensor<8xf32>
  // CHECK: nn.mean
  %m = nn.mean %l : (tensor<8xf32>) -> tensor<f32>
  return %m : tensor<f32>
}

// CHECK-LABEL: func.func @backward
func.func @backward(%dy: tensor<8x16xf32>, %x: tensor<8x256xf32>, %z: tensor<8x16xf32>,
                    %t: tensor<8xi32>, %p: tensor<16x256xf32>, %it: tensor<i64>) {
  // CHECK: nn.matmul %{{.*}}, %{{.*}} {transpose_lhs} : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<16x256xf32>
  %dw = nn.matmul %dy, %x {transpose_lhs} : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<16x256xf32>
  // CHECK: nn.reduce_rows
  %db = nn.reduce_rows %dy : (tensor<8x16xf32>) -> tensor<16xf32>
  // CHECK: nn.gelu_grad
  %dz = nn.gelu_grad %z, %dy : tensor<8x16xf32>
  // CHECK: nn.gelu_grad %{{.*}}, %{{.*}} {approximate = "tanh"}
  %dzt = nn.gelu_grad %z, %dy {approximate = "tanh"} : tensor<8x16xf32>
  // CHECK: nn.bias_gelu_grad %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x16xf32>, tensor<16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  %dzb, %dbb = nn.bias_gelu_grad %z, %db, %dy : (tensor<8x16xf32>, tensor<16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  // CHECK: nn.relu_grad
  %dz2 = nn.relu_grad %z, %dy : tensor<8x16xf32>
  // CHECK: nn.fill 2.500000e-01 : tensor<f32>
  %seed = nn.fill 0.25 : tensor<f32>
  // CHECK: nn.mean_grad
  %dl = nn.mean_grad %seed : (tensor<f32>) -> tensor<8xf32>
  // CHECK: nn.softmax_cross_entropy_grad
  %dlogits = nn.softmax_cross_entropy_grad %z, %t, %dl : (tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>) -> tensor<8x16xf32>
  // CHECK: nn.scale %{{.*}} {factor = 5.000000e-01 : f32}
  %h = nn.scale %dw {factor = 0.5 : f32} : tensor<16x256xf32>
  // CHECK: nn.sgd
  %p1 = nn.sgd %p, %h {lr = 0.01 : f32, weight_decay = 0.0 : f32} : tensor<16x256xf32>
  // CHECK: nn.adam
  %p2, %m2, %v2 = nn.adam %p1, %h, %p, %p, %it {lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.0 : f32} : tensor<16x256xf32>, tensor<i64>
  // Gradient clipping: sums of squares (here over runs of a bucket shard),
  // the norm and coefficient, the scaled gradient; Adam with no decay on
  // the runs given.
  // CHECK: nn.sum_squares %{{.*}} {group = "dp", runs = array<i64: 4096, 0, 16, 256, 4096>} : tensor<16x256xf32> -> tensor<f32>
  %ss = nn.sum_squares %h {runs = array<i64: 4096, 0, 16, 256, 4096>, group = "dp"} : tensor<16x256xf32> -> tensor<f32>
  // CHECK: nn.clip_grad_norm %{{.*}} {max_norm = 1.000000e+00 : f32} : tensor<f32> -> tensor<f32>, tensor<f32>
  %norm, %coeff = nn.clip_grad_norm %ss {max_norm = 1.0 : f32} : tensor<f32> -> tensor<f32>, tensor<f32>
  // CHECK: nn.clip_grad_norm %{{.*}} {max_norm = 1.000000e+00 : f32, unscale} : tensor<f32> -> tensor<f32>, tensor<f32>
  %norm16, %coeff16 = nn.clip_grad_norm %ss {max_norm = 1.0 : f32, unscale} : tensor<f32> -> tensor<f32>, tensor<f32>
  // CHECK: nn.loss_seed 2.500000e-01 : tensor<f32>
  %scaledSeed = nn.loss_seed 0.25 : tensor<f32>
  // CHECK: nn.scale_by %{{.*}}, %{{.*}} : tensor<16x256xf32>, tensor<f32>
  %hc = nn.scale_by %h, %coeff : tensor<16x256xf32>, tensor<f32>
  // CHECK: nn.sgd_momentum {{.*}} {lr = {{.*}}, momentum = 0.899999976 : f32, weight_decay = 1.000000e-01 : f32} : tensor<16x256xf32>
  %p4, %b4 = nn.sgd_momentum %p2, %hc, %m2 {lr = 1.0e-2 : f32, weight_decay = 0.1 : f32, momentum = 0.9 : f32} : tensor<16x256xf32>
  // CHECK: nn.adam {{.*}}runs = array<i64: 4096, 0, 16>
  %p3, %m3, %v3 = nn.adam %p2, %hc, %m2, %v2, %it {lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32, runs = array<i64: 4096, 0, 16>, group = "dp"} : tensor<16x256xf32>, tensor<i64>
  return
}
