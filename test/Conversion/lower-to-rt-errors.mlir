// RUN: tessera-opt %s -split-input-file --tessera-lower-to-rt -verify-diagnostics

// expected-error @+1 {{tessera-lower-to-rt needs the microbatch (or forward and backward) and step phases}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

module {
  dist.mesh @mesh {tp = 2}
  func.func @mb(%w: tensor<4x8xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x8xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    // expected-error @+1 {{'dist.all_gather' op lower-to-rt supports dim 0 only}}
    %g = dist.all_gather %w on @mesh "tp" dim 1 : tensor<4x8xf32> -> tensor<4x16xf32>
    %s = dist.reduce_scatter %g on @mesh "tp" dim 1 : tensor<4x16xf32> -> tensor<4x8xf32>
    %l = nn.mean %s : (tensor<4x8xf32>) -> tensor<f32>
    return %l, %s : tensor<f32>, tensor<4x8xf32>
  }
  func.func @step(%g: tensor<4x8xf32> {tessera.buffer = "grad:w"}) -> (tensor<4x8xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4x8xf32>
  }
}

// -----

// A wait for a bucket reduction the phase never started.
module {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = false, numel = 4 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 4, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    // expected-error @+1 {{waits for a bucket reduction that was not started}}
    dist.bucket_reduce_wait @gbuf bucket 0
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}) -> (tensor<4xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4xf32>
  }
}

// -----

// A parameter's old value read after the unpack that overwrote it.
module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 1}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
      distributed = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}, %w: tensor<4xf32> {tessera.buffer = "w"}) -> (tensor<4xf32> {tessera.buffer = "w"}, tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "step"} {
    %f = nn.fill 0.0 : tensor<128xf32>
    %w1 = dist.unpack @gbuf bucket 0 "param" %f : tensor<128xf32> -> tensor<4xf32>
    // expected-error @+1 {{reads 'w' after a dist.unpack overwrote it; lower-to-rt keeps one copy of each parameter and gradient}}
    %old = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %w1, %old : tensor<4xf32>, tensor<f32>
  }
}

// -----

// A reduce-scatter of a bucket needs the distributed optimizer's shard.
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = false, numel = 4 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 4, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    %g = nn.scale %w {factor = 1.0 : f32} : tensor<4xf32>
    // expected-error @+1 {{reduce-scatters bucket 0 of @gbuf, which is not a distributed-optimizer buffer}}
    dist.bucket_reduce_start @gbuf bucket 0 over @mesh "dp" scale 5.000000e-01 (%g) {kind = "reduce_scatter"} : tensor<4xf32>
    dist.bucket_reduce_wait @gbuf bucket 0
    return %l, %g : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}) -> (tensor<4xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4xf32>
  }
}

// -----

// A grad buffer that lays out a parameter no phase has.
module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 1}
  // expected-error @+1 {{lays out 'v', which no phase of this program has}}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
      distributed = false, numel = 4 : i64, numel_unpadded = 4 : i64,
      params = [{name = "v", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 4, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}) -> (tensor<4xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4xf32>
  }
}

// -----

// A grad buffer whose dtype is not the gradient's.
module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 1}
  // expected-error @+1 {{gives 'w' 4 bf16 elements, its buffer is 'memref<4xf32>'}}
  dist.grad_buffer @gbuf {param_dtype = "bf16", grad_dtype = "bf16", dp = 1 : i64,
      distributed = false, numel = 4 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 4, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}) -> (tensor<4xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4xf32>
  }
}

// -----

// An op that has no rt lowering (a started reduce-scatter: only bucket
// reductions start one).
module {
  dist.mesh @mesh {dp = 2}
  func.func @mb(%w: tensor<4x8xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x8xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    // expected-error @+1 {{'dist.reduce_scatter_start' op cannot be lowered to rt}}
    %h = dist.reduce_scatter_start %w on @mesh "dp" dim 0 : tensor<4x8xf32> -> !dist.async<tensor<2x8xf32>>
    %g = dist.wait %h : !dist.async<tensor<2x8xf32>> -> tensor<2x8xf32>
    %l = nn.mean %g : (tensor<2x8xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4x8xf32>
  }
  func.func @step(%g: tensor<4x8xf32> {tessera.buffer = "grad:w"}) -> (tensor<4x8xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4x8xf32>
  }
}

// -----

// A started all-gather (ZeRO-3's prefetch) along another dimension.
module {
  dist.mesh @mesh {dp = 2}
  func.func @mb(%w: tensor<4x8xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4x8xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    // expected-error @+1 {{'dist.all_gather_start' op lower-to-rt supports dim 0 only}}
    %h = dist.all_gather_start %w on @mesh "dp" dim 1 : tensor<4x8xf32> -> !dist.async<tensor<4x16xf32>>
    %g = dist.wait %h : !dist.async<tensor<4x16xf32>> -> tensor<4x16xf32>
    %l = nn.mean %g : (tensor<4x16xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4x8xf32>
  }
  func.func @step(%g: tensor<4x8xf32> {tessera.buffer = "grad:w"}) -> (tensor<4x8xf32> {tessera.buffer = "grad:w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4x8xf32>
  }
}

// -----

// ZeRO-2: an accumulating bucket reduction needs its wait (its transient
// bucket lives until then).
module {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, shard_grads = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    %g = nn.scale %w {factor = 2.0 : f32} : tensor<4xf32>
    // expected-error @+1 {{has no dist.bucket_reduce_wait}}
    dist.bucket_reduce_start @gbuf bucket 0 over @mesh "dp" scale 5.000000e-01 (%g) {accumulate, kind = "reduce_scatter"} : tensor<4xf32>
    return %l : tensor<f32>
  }
  func.func @step(%g: tensor<64xf32> {tessera.buffer = "gshard:gbuf:0"}) -> (tensor<64xf32> {tessera.grad_shard = {buffer = @gbuf, bucket = 0 : i64}}) attributes {tessera.phase = "step"} {
    return %g : tensor<64xf32>
  }
}

// -----

// overlap-param-gather: a parameter gather left in flight after the step
// must run in place (its input, read by something else, is a transient the
// next function would reuse while the gather still reads it).
module {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64} ],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}, tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "microbatch"} {
    dist.param_sync_wait @gbuf bucket 0
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
  func.func @step(%s: tensor<64xf32> {tessera.buffer = "gshard:gbuf:0"}) -> (tensor<4xf32> {tessera.buffer = "w"}, tensor<64xf32> {tessera.buffer = "gshard:gbuf:0"}) attributes {tessera.phase = "step"} {
    %n = nn.scale %s {factor = 2.0 : f32} : tensor<64xf32>
    // expected-error @+2 {{with param_sync must gather in place into 'pbuf:gbuf:0' from its shard 'pshard:gbuf:0' (overlap-param-gather leaves it in flight after the step)}}
    // expected-error @+1 {{failed to legalize operation 'dist.all_gather'}}
    %g = dist.all_gather %n on @mesh "dp" dim 0 {param_sync} : tensor<64xf32> -> tensor<128xf32>
    %u = dist.unpack @gbuf bucket 0 "param" %g : tensor<128xf32> -> tensor<4xf32>
    return %u, %n : tensor<4xf32>, tensor<64xf32>
  }
}

// -----

// ZeRO-3: a shard_params bucket unpacks only from its gathered transient
// (tessera-gather-params), not from a phase's own bucket of parameters.
module attributes {tessera.batch = {global_batch_size = 8 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {dp = 2}
  dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
      distributed = true, shard_grads = true, shard_params = true, numel = 128 : i64, numel_unpadded = 4 : i64,
      params = [{name = "w", start = 0 : i64, end = 4 : i64, bucket = 0 : i64}],
      buckets = [array<i64: 0, 128, 4>]}
  func.func @mb(%w: tensor<4xf32> {nn.param = "w"}) -> (tensor<f32> {tessera.buffer = "loss"}) attributes {tessera.phase = "microbatch"} {
    %p = dist.pack @gbuf bucket 0 "param"(%w) : tensor<4xf32> -> tensor<128xf32>
    // expected-error @+1 {{unpacks the parameters of a ZeRO-3 bucket (shard_params) from a value that is not a gathered transient; only tessera-gather-params' all-gathers of the bucket's shard are}}
    %w1 = dist.unpack @gbuf bucket 0 "param" %p : tensor<128xf32> -> tensor<4xf32>
    %l = nn.mean %w1 : (tensor<4xf32>) -> tensor<f32>
    return %l : tensor<f32>
  }
  func.func @step(%s: tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<64xf32> {tessera.buffer = "pshard:gbuf:0"}) attributes {tessera.phase = "step"} {
    return %s : tensor<64xf32>
  }
}
