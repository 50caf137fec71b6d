// RUN: tessera-opt %s -split-input-file -verify-diagnostics

// The layout invariants of Megatron's _ParamAndGradBuffer are the
// dialect's, not the runtime's.

// expected-error @+1 {{has an invalid layout: parameter 'a' starts at 70, not at a multiple of 64 elements}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 128 : i64, numel_unpadded = 80 : i64,
    params = [{name = "a", start = 70 : i64, end = 80 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 80>]}

// -----

// expected-error @+1 {{has an invalid layout: bucket 0 holds 127 elements, not divisible by dp 2}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 127 : i64, numel_unpadded = 10 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 127, 10>]}

// -----

// expected-error @+1 {{has an invalid layout: bucket 0 ends at 64, not padded to a multiple of 128}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 192 : i64, numel_unpadded = 20 : i64,
    params = [{name = "b", start = 64 : i64, end = 74 : i64, bucket = 1 : i64},
              {name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 64, 10>, array<i64: 64, 192, 10>]}

// -----

// expected-error @+1 {{has an invalid layout: parameter 'a' [100, 140) is split across buckets or outside bucket 0 [0, 128)}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = false, numel = 256 : i64, numel_unpadded = 256 : i64,
    params = [{name = "a", start = 100 : i64, end = 140 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 128>, array<i64: 128, 256, 128>]}

// -----

// expected-error @+1 {{has an invalid layout: parameters 'a' and 'b' overlap}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "b", start = 10 : i64, end = 20 : i64, bucket = 0 : i64},
              {name = "a", start = 0 : i64, end = 12 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}

// -----

// expected-error @+1 {{has an invalid layout: the buffer is padded (32 elements, 20 used) without the distributed optimizer}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 32 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 32, 20>]}

// -----

// expected-error @+1 {{has an invalid layout: bucket 1 starts at 30, not at 20 where the previous one ends}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 40 : i64, numel_unpadded = 30 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64},
              {name = "b", start = 30 : i64, end = 40 : i64, bucket = 1 : i64} ],
    buckets = [array<i64: 0, 20, 20>, array<i64: 30, 40, 10>]}

// -----

// expected-error @+1 {{params must be {name, start, end, bucket} dictionaries}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64} ], buckets = [array<i64: 0, 20, 20>]}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @pack(%a: tensor<10xf32>, %b: tensor<20xf32>) {
  // expected-error @+1 {{has 2 parameter tensors, but the bucket holds 1}}
  %f = dist.pack @g bucket 0 "grad" (%a, %b) : tensor<10xf32>, tensor<20xf32> -> tensor<20xf32>
  return
}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @size(%a: tensor<4x4xf32>) {
  // expected-error @+1 {{parameter tensor #0 has 16 elements, the bucket's slot 20}}
  %f = dist.pack @g bucket 0 "grad" (%a) : tensor<4x4xf32> -> tensor<20xf32>
  return
}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @flat(%f: tensor<16xf32>) {
  // expected-error @+1 {{flat tensor 'tensor<16xf32>' must be 1-d with the bucket's 20 elements}}
  %a = dist.unpack @g bucket 0 "grad" %f : tensor<16xf32> -> tensor<20xf32>
  return
}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @bucket(%a: tensor<20xf32>) {
  // expected-error @+1 {{names bucket 3 of @g, which has 1}}
  %f = dist.pack @g bucket 3 "grad" (%a) : tensor<20xf32> -> tensor<20xf32>
  return
}

// -----

func.func @nobuffer(%a: tensor<20xf32>) {
  // expected-error @+1 {{refers to @nothing, which is not a dist.grad_buffer in scope}}
  %f = dist.pack @nothing bucket 0 "grad" (%a) : tensor<20xf32> -> tensor<20xf32>
  return
}

// -----

func.func @data(%a: tensor<20xf32>) {
  // expected-error @+1 {{'dist.pack' op attribute 'data' failed to satisfy constraint: bucket data: grad or param}}
  %f = dist.pack @g bucket 0 "state" (%a) : tensor<20xf32> -> tensor<20xf32>
  return
}

// -----

func.func @unpack_data(%f: tensor<20xf32>) {
  // expected-error @+1 {{'dist.unpack' op attribute 'data' failed to satisfy constraint: bucket data: grad or param}}
  %a = dist.unpack @g bucket 0 "state" %f : tensor<20xf32> -> tensor<20xf32>
  return
}

// -----

// expected-error @+1 {{buckets must be [start, end, numel_unpadded] arrays}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [], buckets = [array<i64: 0, 20>]}

// -----

// expected-error @+1 {{dp must be at least 1}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 0 : i64,
    distributed = false, numel = 0 : i64, numel_unpadded = 0 : i64,
    params = [], buckets = []}

// -----

dist.mesh @mesh {dp = 2}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @kind(%a: tensor<20xf32>) {
  // expected-error @+1 {{attribute 'kind' failed to satisfy constraint: bucket reduction: all_reduce or reduce_scatter}}
  dist.bucket_reduce_start @g bucket 0 over @mesh "dp" scale 5.000000e-01 (%a) {kind = "broadcast"} : tensor<20xf32>
  return
}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @wait() {
  // expected-error @+1 {{names bucket 2 of @g, which has 1}}
  dist.bucket_reduce_wait @g bucket 2
  return
}

// -----

// expected-error @+1 {{attribute 'param_dtype' failed to satisfy constraint: stored dtype: f32, bf16 or f16}}
dist.grad_buffer @g {param_dtype = "fp8", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}

// -----

// expected-error @+1 {{attribute 'grad_dtype' failed to satisfy constraint: stored dtype: f32, bf16 or f16}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "fp16", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}

// -----

// A bucket of a buffer with bf16 parameters and f32 gradients: its
// gradients are f32, its parameters bf16.
dist.grad_buffer @g {param_dtype = "bf16", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @pack_dtype(%a: tensor<20xbf16>) -> tensor<20xbf16> {
  // expected-error @+1 {{tensor 'tensor<20xbf16>' is not of the bucket's f32}}
  %f = dist.pack @g bucket 0 "grad"(%a) : tensor<20xbf16> -> tensor<20xbf16>
  return %f : tensor<20xbf16>
}

// -----

dist.grad_buffer @g {param_dtype = "bf16", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @unpack_dtype(%f: tensor<20xf32>) -> tensor<20xf32> {
  // expected-error @+1 {{tensor 'tensor<20xf32>' is not of the bucket's bf16}}
  %a = dist.unpack @g bucket 0 "param" %f : tensor<20xf32> -> tensor<20xf32>
  return %a : tensor<20xf32>
}

// -----

// The parameters are listed in the model's order, which the buffer holds
// in reverse.
// expected-error @+1 {{has an invalid layout: parameter 'b' starts at 64, not below 'a' at 0 (parameters are listed in the model's order, at decreasing offsets)}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 1 : i64,
    distributed = false, numel = 74 : i64, numel_unpadded = 74 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64},
              {name = "b", start = 64 : i64, end = 74 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 74, 74>]}

// -----

dist.mesh @mesh {dp = 2}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 128 : i64, numel_unpadded = 10 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}
func.func @param_sync_user(%s: tensor<64xf32>) -> tensor<128xf32> {
  // expected-error @+1 {{with param_sync gathers a parameter bucket: dim 0, its one user the dist.unpack of the bucket's parameters}}
  %g = dist.all_gather %s on @mesh "dp" dim 0 {param_sync} : tensor<64xf32> -> tensor<128xf32>
  return %g : tensor<128xf32>
}

// -----

dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = false, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}
func.func @param_sync_wait() {
  // expected-error @+1 {{names bucket 1 of @g, which has 1}}
  dist.param_sync_wait @g bucket 1
  return
}

// -----

// expected-error @+1 {{shards its gradients (shard_grads) but not its parameters' optimizer state (distributed): ZeRO-2 builds on the distributed optimizer}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = false, shard_grads = true, numel = 20 : i64, numel_unpadded = 20 : i64,
    params = [{name = "a", start = 0 : i64, end = 20 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 20, 20>]}

// -----

// expected-error @+1 {{shards its parameters (shard_params) but not its gradients (shard_grads): ZeRO-3 builds on ZeRO-2}}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_params = true, numel = 128 : i64, numel_unpadded = 10 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}

// -----

dist.mesh @mesh {dp = 2}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, numel = 128 : i64, numel_unpadded = 10 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}
func.func @accumulate_unsharded(%a: tensor<10xf32>) {
  // expected-error @+1 {{accumulates into the shard of @g, whose gradients are not sharded (shard_grads); an accumulating reduction is a reduce-scatter}}
  dist.bucket_reduce_start @g bucket 0 over @mesh "dp" scale 5.000000e-01 (%a) {accumulate, kind = "reduce_scatter"} : tensor<10xf32>
  return
}

// -----

dist.mesh @mesh {dp = 2}
dist.grad_buffer @g {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_grads = true, numel = 128 : i64, numel_unpadded = 10 : i64,
    params = [{name = "a", start = 0 : i64, end = 10 : i64, bucket = 0 : i64} ],
    buckets = [array<i64: 0, 128, 10>]}
func.func @overwrite_sharded(%a: tensor<10xf32>) {
  // expected-error @+1 {{does not accumulate into the shard of @g, whose gradients are sharded (shard_grads)}}
  dist.bucket_reduce_start @g bucket 0 over @mesh "dp" scale 5.000000e-01 (%a) {kind = "reduce_scatter"} : tensor<10xf32>
  return
}
