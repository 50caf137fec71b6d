// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// CHECK: rt.buffer @w : memref<4x8xf32> {init = "normal:0.02", kind = "param", offset = 0 : i64}
rt.buffer @w : memref<4x8xf32> {kind = "param", offset = 0 : i64, init = "normal:0.02"}
// CHECK: rt.buffer @"grad:w" : memref<4x8xf32> {kind = "grad", of = @w, offset = 128 : i64}
rt.buffer @"grad:w" : memref<4x8xf32> {kind = "grad", of = @w, offset = 128 : i64}
rt.buffer @t : memref<i64> {kind = "iteration", offset = 256 : i64}
// ZeRO-3: a staged parameter and bucket view, and this rank's shard.
// CHECK: rt.buffer @s : memref<4xf32> {init = "zeros", kind = "param", offset = 0 : i64, staged}
rt.buffer @s : memref<4xf32> {kind = "param", offset = 0 : i64, init = "zeros", staged}
// CHECK: rt.buffer @"pbuf:b:0" : memref<128xf32> {kind = "view", offset = 0 : i64, staged}
rt.buffer @"pbuf:b:0" : memref<128xf32> {kind = "view", offset = 0 : i64, staged}
// CHECK: rt.buffer @"pshard:b:0" : memref<64xf32> {kind = "param_shard", of = @"pbuf:b:0", offset = 512 : i64, rank_group = "dp"}
rt.buffer @"pshard:b:0" : memref<64xf32> {kind = "param_shard", of = @"pbuf:b:0", offset = 512 : i64, rank_group = "dp"}

// CHECK-LABEL: func.func @f
func.func @f() attributes {rt.entry} {
  %w = rt.get @w : memref<4x8xf32>
  %g = rt.get @"grad:w" : memref<4x8xf32>
  %t = rt.get @t : memref<i64>
  // CHECK: rt.alloc offset 512 : memref<2x8xf32>
  %x = rt.alloc offset 512 : memref<2x8xf32>
  %y = rt.alloc offset 576 : memref<2x4xf32>
  // CHECK: rt.gemm %{{.*}}, %{{.*}}, %{{.*}} {trans_b} : memref<2x8xf32>, memref<4x8xf32>, memref<2x4xf32>
  rt.gemm %x, %w, %y {trans_b} : memref<2x8xf32>, memref<4x8xf32>, memref<2x4xf32>
  // A bf16 x bf16 product accumulates into f32.
  %x16 = rt.alloc offset 640 : memref<2x8xbf16>
  %w16 = rt.alloc offset 704 : memref<4x8xbf16>
  // CHECK: rt.gemm %{{.*}}, %{{.*}}, %{{.*}} {trans_b} : memref<2x8xbf16>, memref<4x8xbf16>, memref<2x4xf32>
  rt.gemm %x16, %w16, %y {trans_b} : memref<2x8xbf16>, memref<4x8xbf16>, memref<2x4xf32>
  // CHECK: rt.gelu
  rt.gelu %y, %y {iattrs = array<i64: 1>} : memref<2x4xf32>, memref<2x4xf32>
  // CHECK: rt.scale %{{.*}}, %{{.*}} {alpha = 5.000000e-01 : f32}
  rt.scale %g, %g {alpha = 0.5 : f32} : memref<4x8xf32>, memref<4x8xf32>
  // CHECK: %[[E:.*]] = rt.all_reduce_start %{{.*}} {group = "dp"}
  %e = rt.all_reduce_start %g {group = "dp"} : memref<4x8xf32>
  // CHECK: rt.wait %[[E]]
  rt.wait %e
  // overlap_param_gather: a bucket's gather started under a program-wide
  // sync id, finished in another function.
  // CHECK: rt.param_sync_start %{{.*}}, %{{.*}} {group = "dp", sync = 3 : i64} : memref<4x8xf32>, memref<8x8xf32>
  %full = rt.alloc offset 768 : memref<8x8xf32>
  rt.param_sync_start %g, %full {group = "dp", sync = 3 : i64} : memref<4x8xf32>, memref<8x8xf32>
  // CHECK: rt.param_sync_wait {sync = 3 : i64}
  rt.param_sync_wait {sync = 3 : i64}
  // CHECK: rt.adam
  rt.adam %w, %g, %w, %w, %t {lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.0 : f32} : memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<i64>
  // Weight decay skips runs [0, 8) and [24, 32) of the bucket whose shard
  // over "dp" the operands are; the gradient norm reads the same runs.
  // CHECK: rt.adam {{.*}} {beta1 = {{.*}}, group = "dp", {{.*}}, runs = array<i64: 32, 0, 8, 24, 32>, weight_decay = 1.000000e-01 : f32}
  rt.adam %w, %g, %w, %w, %t {lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32, runs = array<i64: 32, 0, 8, 24, 32>, group = "dp"} : memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<i64>
  // CHECK: rt.sgd {{.*}} {group = "dp", lr = {{.*}}, runs = array<i64: 32, 0, 8>, weight_decay = 1.000000e-01 : f32}
  rt.sgd %w, %g {lr = 1.0e-2 : f32, weight_decay = 0.1 : f32, runs = array<i64: 32, 0, 8>, group = "dp"} : memref<4x8xf32>, memref<4x8xf32>
  // CHECK: rt.sgd_momentum {{.*}} {lr = {{.*}}, momentum = 0.899999976 : f32, weight_decay = 1.000000e-01 : f32} : memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>
  rt.sgd_momentum %w, %g, %g {lr = 1.0e-2 : f32, weight_decay = 0.1 : f32, momentum = 0.9 : f32} : memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>
  // RMSNorm's kernels: eps as the value, beta for the weight gradient.
  %n = rt.alloc offset 2048 : memref<8xf32>
  // CHECK: rt.rms_norm %{{.*}}, %{{.*}}, %{{.*}} {value = 9.99999997E-7 : f32} : memref<4x8xf32>, memref<8xf32>, memref<4x8xf32>
  rt.rms_norm %w, %n, %w {value = 1.0e-6 : f32} : memref<4x8xf32>, memref<8xf32>, memref<4x8xf32>
  // CHECK: rt.rms_norm_grad {{.*}} {beta = 1.000000e+00 : f32, value = {{.*}}}
  rt.rms_norm_grad %w, %n, %g, %g, %n {value = 1.0e-5 : f32, beta = 1.0 : f32} : memref<4x8xf32>, memref<8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>
  // SwiGLU over rows of [gate | up].
  %h4 = rt.alloc offset 4096 : memref<4x4xf32>
  // CHECK: rt.swiglu %{{.*}}, %{{.*}} : memref<4x8xf32>, memref<4x4xf32>
  rt.swiglu %w, %h4 : memref<4x8xf32>, memref<4x4xf32>
  // CHECK: rt.swiglu_grad %{{.*}}, %{{.*}}, %{{.*}} : memref<4x8xf32>, memref<4x4xf32>, memref<4x8xf32>
  rt.swiglu_grad %w, %h4, %g : memref<4x8xf32>, memref<4x4xf32>, memref<4x8xf32>
  // Grouped-query attention's K/V repeat: 4 heads in 2 groups, head dim 2.
  %gq = rt.alloc offset 4608 : memref<2x16xf32>
  %hm = rt.alloc offset 4736 : memref<2x24xf32>
  // CHECK: rt.repeat_kv %{{.*}}, %{{.*}} {iattrs = array<i64: 4, 2>} : memref<2x16xf32>, memref<2x24xf32>
  rt.repeat_kv %gq, %hm {iattrs = array<i64: 4, 2>} : memref<2x16xf32>, memref<2x24xf32>
  // CHECK: rt.repeat_kv_grad
  rt.repeat_kv_grad %hm, %gq {iattrs = array<i64: 4, 2>} : memref<2x24xf32>, memref<2x16xf32>
  // CHECK: rt.add_rms_norm
  rt.add_rms_norm %w, %g, %n, %w, %g {value = 1.0e-5 : f32} : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>, memref<4x8xf32>, memref<4x8xf32>
  // CHECK: rt.add_rms_norm_grad
  rt.add_rms_norm_grad %w, %n, %g, %g, %w, %n {value = 1.0e-5 : f32} : memref<4x8xf32>, memref<8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>
  // RoPE: rows over the sequence shards of "cp"; Llama 3.1's scaling.
  %qkv = rt.alloc offset 4096 : memref<4x2x24xf32>
  // CHECK: rt.rotary_embedding %{{.*}}, %{{.*}} {base = 5.000000e+05 : f32, group = "cp", inverse = true, num_heads = 2 : i64, rotary_dim = 4 : i64, scaling_factor = 8.000000e+00 : f32} : memref<4x2x24xf32>, memref<4x2x24xf32>
  rt.rotary_embedding %qkv, %qkv {num_heads = 2 : i64, rotary_dim = 4 : i64, inverse = true, base = 5.0e5 : f32, scaling_factor = 8.0 : f32, group = "cp"} : memref<4x2x24xf32>, memref<4x2x24xf32>
  %ss = rt.alloc offset 1024 : memref<1xf32>
  %nrm = rt.alloc offset 1088 : memref<1xf32>
  %cf = rt.alloc offset 1152 : memref<1xf32>
  // CHECK: rt.sum_squares %{{.*}}, %{{.*}} {group = "dp", iattrs = array<i64: 32, 0, 8>}
  rt.sum_squares %g, %ss {iattrs = array<i64: 32, 0, 8>, group = "dp"} : memref<4x8xf32>, memref<1xf32>
  // CHECK: rt.clip_grad_norm %{{.*}}, %{{.*}}, %{{.*}} {iattrs = array<i64: 0>, value = 1.000000e+00 : f32}
  rt.clip_grad_norm %ss, %nrm, %cf {iattrs = array<i64: 0>, value = 1.0 : f32} : memref<1xf32>, memref<1xf32>, memref<1xf32>
  // CHECK: rt.clip_grad_norm %{{.*}}, %{{.*}}, %{{.*}} {iattrs = array<i64: 1>, value = 1.000000e+00 : f32}
  rt.clip_grad_norm %ss, %nrm, %cf {iattrs = array<i64: 1>, value = 1.0 : f32} : memref<1xf32>, memref<1xf32>, memref<1xf32>
  // CHECK: rt.loss_seed %{{.*}} {value = 2.500000e-01 : f32}
  rt.loss_seed %nrm {value = 0.25 : f32} : memref<1xf32>
  // CHECK: rt.scale_by %{{.*}}, %{{.*}}, %{{.*}} :
  rt.scale_by %g, %cf, %g : memref<4x8xf32>, memref<1xf32>, memref<4x8xf32>
  // CHECK: rt.fill %{{.*}} {value = 0.000000e+00 : f32}
  rt.fill %g {value = 0.0 : f32} : memref<4x8xf32>
  // CHECK: rt.cast %{{.*}}, %{{.*}} {beta = 1.000000e+00 : f32} : memref<4x8xf32>, memref<4x8xbf16>
  %h = rt.alloc offset 2048 : memref<4x8xbf16>
  rt.cast %g, %h {beta = 1.0 : f32} : memref<4x8xf32>, memref<4x8xbf16>
  return
}
