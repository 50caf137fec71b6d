// RUN: tessera-opt %s -split-input-file --tessera-lower-to-rt | FileCheck %s

// The distributed optimizer's shard of a parameter bucket is this rank's
// block of the bucket itself (a rank-relative view), so its update happens
// in place -- but only when nothing else reads the parameters: here the
// step also reads w before the update (its mean), so the block is copied
// out first (a Copy with the group picks this rank's block).

// CHECK-DAG: rt.buffer @"pshard:gbuf:0" : memref<64xf32> {kind = "view", offset = [[PB:[0-9]+]] : i64, rank_group = "dp", rank_stride = 256 : i64}
// CHECK-DAG: rt.buffer @"pbuf:gbuf:0" : memref<128xf32> {kind = "view", offset = [[PB]] : i64}
// CHECK-LABEL: func.func @step
// CHECK: rt.copy %{{.*}}, %[[MINE:.*]] {group = "dp"} : memref<128xf32>, memref<64xf32>
// CHECK: rt.mean
// CHECK: rt.sgd %[[MINE]], %{{.*}}
// CHECK: rt.all_gather %[[MINE]]
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}, %w: tensor<4xf32> {tessera.buffer = "w"}) -> (tensor<4xf32> {tessera.buffer = "w"}, tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "step"} {
    %gf = dist.pack @gbuf bucket 0 "grad"(%g) : tensor<4xf32> -> tensor<128xf32>
    %gs = dist.reduce_scatter %gf on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<64xf32>
    %pf = dist.pack @gbuf bucket 0 "param"(%w) : tensor<4xf32> -> tensor<128xf32>
    %mine = dist.scatter_to_region %pf on @mesh "dp" {dim = 0 : i64} : tensor<128xf32> -> tensor<64xf32>
    %old = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    %new = nn.sgd %mine, %gs {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : tensor<64xf32>
    %all = dist.all_gather %new on @mesh "dp" dim 0 : tensor<64xf32> -> tensor<128xf32>
    %w1 = dist.unpack @gbuf bucket 0 "param" %all : tensor<128xf32> -> tensor<4xf32>
    return %w1, %old : tensor<4xf32>, tensor<f32>
  }
}

// -----

// bf16 parameters: the cast of the main shard goes straight into this
// rank's block of the parameter bucket, unless the parameters' old values
// are still read before the all-gather (here w's mean): then it goes to a
// transient first.
// CHECK-LABEL: func.func @step
// CHECK: %[[T:.*]] = rt.alloc offset {{[0-9]+}} : memref<64xbf16>
// CHECK: rt.cast %{{.*}}, %[[T]] : memref<64xf32>, memref<64xbf16>
// CHECK: rt.mean
// CHECK: rt.all_gather %[[T]], %{{.*}} {group = "dp"} : memref<64xbf16>, memref<128xbf16>
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "bf16", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xbf16> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %w32 = nn.cast %w : tensor<4xbf16> to tensor<4xf32>
    %l = nn.mean %w32 : (tensor<4xf32>) -> tensor<f32>
    return %l, %w32 : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}, %w: tensor<4xbf16> {tessera.buffer = "w"}, %m: tensor<64xf32> {tessera.buffer = "main:pbuf:gbuf:0"}) -> (tensor<4xbf16> {tessera.buffer = "w"}, tensor<64xf32> {tessera.buffer = "main:pbuf:gbuf:0"}, tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "step"} {
    %gf = dist.pack @gbuf bucket 0 "grad"(%g) : tensor<4xf32> -> tensor<128xf32>
    %gs = dist.reduce_scatter %gf on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<64xf32>
    %new = nn.sgd %m, %gs {lr = 1.0e-02 : f32, weight_decay = 0.0 : f32} : tensor<64xf32>
    %low = nn.cast %new : tensor<64xf32> to tensor<64xbf16>
    %w32 = nn.cast %w : tensor<4xbf16> to tensor<4xf32>
    %old = nn.mean %w32 : (tensor<4xf32>) -> tensor<f32>
    %all = dist.all_gather %low on @mesh "dp" dim 0 : tensor<64xbf16> -> tensor<128xbf16>
    %w1 = dist.unpack @gbuf bucket 0 "param" %all : tensor<128xbf16> -> tensor<4xbf16>
    return %w1, %new, %old : tensor<4xbf16>, tensor<64xf32>, tensor<f32>
  }
}
