// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// CHECK: dist.grad_buffer @gbuf {buckets = [array<i64: 0, 128, 74>, array<i64: 128, 256, 100>]
dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 256 : i64, numel_unpadded = 174 : i64,
    params = [{name = "c", start = 128 : i64, end = 228 : i64, bucket = 1 : i64},
              {name = "a", start = 64 : i64, end = 74 : i64, bucket = 0 : i64},
              {name = "b", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 74>, array<i64: 128, 256, 100>]}

// CHECK-LABEL: func.func @roundtrip
func.func @roundtrip(%a: tensor<10xf32>, %b: tensor<2x5xf32>) -> (tensor<10xf32>, tensor<2x5xf32>) {
  // Buffer order: b (start 0) before a (start 64).
  // CHECK: %[[F:.*]] = dist.pack @gbuf bucket 0 "grad"(%{{.*}}, %{{.*}}) : tensor<2x5xf32>, tensor<10xf32> -> tensor<128xf32>
  %f = dist.pack @gbuf bucket 0 "grad" (%b, %a) : tensor<2x5xf32>, tensor<10xf32> -> tensor<128xf32>
  // CHECK: dist.unpack @gbuf bucket 0 "grad" %[[F]] : tensor<128xf32> -> tensor<2x5xf32>, tensor<10xf32>
  %ub, %ua = dist.unpack @gbuf bucket 0 "grad" %f : tensor<128xf32> -> tensor<2x5xf32>, tensor<10xf32>
  return %ua, %ub : tensor<10xf32>, tensor<2x5xf32>
}

// overlap_param_gather: the step's gather of a parameter bucket left in
// flight, and a forward's wait for it.
// CHECK-LABEL: func.func @param_sync
func.func @param_sync(%s: tensor<64xf32>) -> (tensor<10xf32>, tensor<2x5xf32>) {
  // CHECK: dist.param_sync_wait @gbuf bucket 0
  dist.param_sync_wait @gbuf bucket 0
  // CHECK: %[[G:.*]] = dist.all_gather %{{.*}} on @mesh "dp" dim 0 {param_sync} : tensor<64xf32> -> tensor<128xf32>
  %g = dist.all_gather %s on @mesh "dp" dim 0 {param_sync} : tensor<64xf32> -> tensor<128xf32>
  %ub, %ua = dist.unpack @gbuf bucket 0 "param" %g : tensor<128xf32> -> tensor<2x5xf32>, tensor<10xf32>
  return %ua, %ub : tensor<10xf32>, tensor<2x5xf32>
}
dist.mesh @mesh {dp = 2}

// ZeRO-3: a shard_params buffer.
// CHECK: dist.grad_buffer @pbuf3 {{.*}}shard_grads = true, shard_params = true
dist.grad_buffer @pbuf3 {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_grads = true, shard_params = true, numel = 128 : i64,
    numel_unpadded = 10 : i64,
    params = [{name = "y", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}

// ZeRO-2: a shard_grads buffer and a backward's accumulating reduction.
// CHECK: dist.grad_buffer @zbuf {{.*}}shard_grads = true
dist.grad_buffer @zbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_grads = true, numel = 128 : i64, numel_unpadded = 10 : i64,
    params = [{name = "z", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}
// CHECK-LABEL: func.func @accumulate
func.func @accumulate(%z: tensor<10xf32>) {
  // CHECK: dist.bucket_reduce_start @zbuf bucket 0 over @mesh "dp" scale 5.000000e-01(%{{.*}}) {accumulate, kind = "reduce_scatter"}
  dist.bucket_reduce_start @zbuf bucket 0 over @mesh "dp" scale 5.000000e-01 (%z) {accumulate, kind = "reduce_scatter"} : tensor<10xf32>
  // CHECK-NEXT: dist.bucket_reduce_wait @zbuf bucket 0
  dist.bucket_reduce_wait @zbuf bucket 0
  return
}
