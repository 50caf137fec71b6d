// RUN: tessera-opt %s -split-input-file --tessera-lower-to-rt | FileCheck %s

// ZeRO-3 (a shard_params grad buffer): this rank's shard of the parameter
// bucket is a buffer of its own (kind param_shard, naming its bucket view
// and the group that splits it); the parameters and the bucket's view are
// staged: their offsets are into the staging space (rt.staging_bytes), the
// runtime's host copy, not the arena. A phase's gathered bucket is a
// transient and the parameters it unpacks are views into it at their
// layout offsets (v at 64 elements, 256 bytes in), live until the last of
// them is read; the step updates the shard in place and gathers nothing.
// CHECK: module attributes {{{.*}}rt.staging_bytes = 512 : i64
// CHECK-DAG: rt.buffer @"pshard:gbuf:0" : memref<64xf32> {kind = "param_shard", of = @"pbuf:gbuf:0", offset = {{[0-9]+}} : i64, rank_group = "dp"}
// CHECK-DAG: rt.buffer @w : memref<4xf32> {global_shape = array<i64: 4>, init = "zeros", kind = "param", offset = 0 : i64, staged}
// CHECK-DAG: rt.buffer @v : memref<4xf32> {global_shape = array<i64: 4>, init = "zeros", kind = "param", offset = 256 : i64, staged}
// CHECK-DAG: rt.buffer @"pbuf:gbuf:0" : memref<128xf32> {kind = "view", offset = 0 : i64, staged}
// CHECK-LABEL: func.func @microbatch
// CHECK: rt.get @loss
// CHECK-NEXT: rt.alloc offset {{[0-9]+}} : memref<4xf32>
// CHECK-NEXT: %[[V:.*]] = rt.alloc offset [[#G:]] : memref<4xf32>
// The first sum, written while v is still to be read, lies past the bucket.
// CHECK-NEXT: %[[A:.*]] = rt.alloc offset [[#G + 256]] : memref<4xf32>
// CHECK-NEXT: %[[W:.*]] = rt.alloc offset [[#G - 256]] : memref<4xf32>
// CHECK-NEXT: %[[S:.*]] = rt.get @"pshard:gbuf:0" : memref<64xf32>
// CHECK-NEXT: %[[B:.*]] = rt.alloc offset [[#G - 256]] : memref<128xf32>
// CHECK-NEXT: rt.all_gather %[[S]], %[[B]] {group = "dp"} : memref<64xf32>, memref<128xf32>
// CHECK-NEXT: rt.add %[[W]], %[[W]], %[[A]] :
// CHECK-NEXT: rt.add %[[A]], %[[V]], %{{.*}} :
// CHECK-LABEL: func.func @step
// CHECK-NEXT: %[[P:.*]] = rt.get @"pshard:gbuf:0"
// CHECK-NEXT: %[[GS:.*]] = rt.get @"gshard:gbuf:0"
// CHECK-NEXT: rt.sgd %[[P]], %[[GS]]
// CHECK-NOT: rt.all_gather
// CHECK: return
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, shard_grads = true, shard_params = true, numel = 128 : i64, numel_unpadded = 68 : i64,
      params = [{name = "v", start = 64 : i64, end = 68 : i64, bucket = 0 : i64},
                {name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64}],
      buckets = [array<i64: 0, 128, 68>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}, %v: tensor<4xf32> {nn.param = "v"}, %s: tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "microbatch"} {
    %all = dist.all_gather %s on @mesh "dp" dim 0 : tensor<64xf32> -> tensor<128xf32>
    %w1, %v1 = dist.unpack @gbuf bucket 0 "param" %all : tensor<128xf32> -> tensor<4xf32>, tensor<4xf32>
    %a = nn.add %w1, %w1 : tensor<4xf32>
    %b = nn.add %a, %v1 : tensor<4xf32>
    %l = nn.mean %b : (tensor<4xf32>) -> tensor<f32>
    return %l : tensor<f32>
  }
  func.func @step(%g: tensor<64xf32> {tessera.buffer = "gshard:gbuf:0"}, %s: tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) attributes {tessera.phase = "step"} {
    %new = nn.sgd %s, %g {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : tensor<64xf32>
    return %new : tensor<64xf32>
  }
}

// -----

// ZeRO-3's prefetch: bucket 1's gather starts before bucket 0's readers
// and is waited for before its own; the started bucket is a transient from
// the start to its last reader, apart from bucket 0's (both live at once).
// CHECK-LABEL: func.func @microbatch
// CHECK: rt.all_gather %[[S0:.*]], %[[B0:.*]] {group = "dp"} : memref<64xf32>, memref<128xf32>
// CHECK-NEXT: %[[E:.*]] = rt.all_gather_start %[[S1:.*]], %[[B1:.*]] {group = "dp"} : memref<64xf32>, memref<128xf32>
// CHECK-NEXT: rt.mean
// CHECK-NEXT: rt.wait %[[E]]
// CHECK-NEXT: rt.mean
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, shard_grads = true, shard_params = true, numel = 256 : i64, numel_unpadded = 8 : i64,
      params = [{name = "v", start = 128 : i64, end = 132 : i64, bucket = 1 : i64},
                {name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64}],
      buckets = [array<i64: 0, 128, 4>, array<i64: 128, 256, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}, %v: tensor<4xf32> {nn.param = "v"}, %s0: tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}, %s1: tensor<64xf32> {tessera.buffer = "pshard:gbuf:1"}) -> (tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "microbatch"} {
    %g0 = dist.all_gather %s0 on @mesh "dp" dim 0 : tensor<64xf32> -> tensor<128xf32>
    %w1 = dist.unpack @gbuf bucket 0 "param" %g0 : tensor<128xf32> -> tensor<4xf32>
    %f1 = dist.all_gather_start %s1 on @mesh "dp" dim 0 : tensor<64xf32> -> !dist.async<tensor<128xf32>>
    %a = nn.mean %w1 : (tensor<4xf32>) -> tensor<f32>
    %g1 = dist.wait %f1 : !dist.async<tensor<128xf32>> -> tensor<128xf32>
    %v1 = dist.unpack @gbuf bucket 1 "param" %g1 : tensor<128xf32> -> tensor<4xf32>
    %b = nn.mean %v1 : (tensor<4xf32>) -> tensor<f32>
    %l = nn.add %a, %b : tensor<f32>
    return %l : tensor<f32>
  }
  func.func @step(%g: tensor<64xf32> {tessera.buffer = "gshard:gbuf:0"}, %s: tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) attributes {tessera.phase = "step"} {
    %new = nn.sgd %s, %g {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : tensor<64xf32>
    return %new : tensor<64xf32>
  }
}
