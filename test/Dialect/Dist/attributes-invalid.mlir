// RUN: tessera-opt %s -split-input-file -verify-diagnostics
// The dist dialect verifies its attributes (dist.sharding, dist.tied,
// dist.pp_rank, dist.stage, dist.chunk, dist.chunk_slot,
// dist.single_bucket_group): their values and where they may appear.

// expected-error @+1 {{attribute 'dist.pp_rank' must be a non-negative integer, got "pp0"}}
module @pp0 attributes {dist.pp_rank = "pp0"} {
}

// -----

// expected-error @+1 {{has 'dist.pp_rank', an attribute of a builtin.module}}
func.func @pp_rank_on_function() attributes {dist.pp_rank = 0} {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be {axis = a non-empty string, dim = a dimension of tensor<4x8xf32> (0 <= dim < 2), axis2? = a non-empty string, dim2? = a dimension of tensor<4x8xf32> (0 <= dim < 2)}, got {axis = "tp"}}}
func.func @sharding_without_dim(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {axis = "tp"}}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be {axis = a non-empty string, dim = a dimension of tensor<4x8xf32> (0 <= dim < 2), axis2? = a non-empty string, dim2? = a dimension of tensor<4x8xf32> (0 <= dim < 2)}, got {dim = 0 : i64}}}
func.func @sharding_without_axis(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {dim = 0}}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be {axis = a non-empty string, dim = a dimension of tensor<4x8xf32> (0 <= dim < 2), axis2? = a non-empty string, dim2? = a dimension of tensor<4x8xf32> (0 <= dim < 2)}, got {axis = "tp", dim = 2 : i64}}}
func.func @sharding_dim(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {axis = "tp", dim = 2}}) {
  return
}

// -----

// A second split names its axis and its dim, another dim than the first.
// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be a dictionary whose second split has both axis2 and dim2, got {axis = "ep", axis2 = "etp", dim = 0 : i64}}}
func.func @sharding_second_without_dim(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {axis = "ep", dim = 0, axis2 = "etp"}}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be a dictionary whose second split (dim2) is of another dimension than dim, got {axis = "ep", axis2 = "etp", dim = 1 : i64, dim2 = 1 : i64}}}
func.func @sharding_same_dim_twice(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {axis = "ep", dim = 1, axis2 = "etp", dim2 = 1}}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.sharding' must be {axis = a non-empty string, dim = a dimension of tensor<4x8xf32> (0 <= dim < 2), axis2? = a non-empty string, dim2? = a dimension of tensor<4x8xf32> (0 <= dim < 2)}, got {axis = "tp", dim = 0 : i64, size = 2 : i64}}}
func.func @sharding_extra(%w: tensor<4x8xf32> {nn.param = "w", dist.sharding = {axis = "tp", dim = 0, size = 2}}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'dist.tied' must be a non-empty string, got true}}
func.func @tied(%w: tensor<4x8xf32> {nn.param = "w", dist.tied = true}) {
  return
}

// -----

// expected-error @+1 {{attribute 'dist.stage' must be {stage = a non-negative integer, chunk = a non-negative integer, layers = an array<i64: ...>}, got {chunk = 0 : i64, stage = 0 : i64}}}
func.func @stage() attributes {dist.stage = {stage = 0, chunk = 0}} {
  return
}

// -----

// expected-error @+1 {{attribute 'dist.chunk' must be a non-negative integer, got -1 : i64}}
func.func @chunk() attributes {dist.chunk = -1} {
  return
}

// -----

// expected-error @+1 {{attribute 'dist.single_bucket_group' must be a unit attribute, got true}}
module attributes {dist.single_bucket_group = true} {
}

// -----

// expected-error @+1 {{result #0 has 'dist.tied', an attribute of a function argument}}
func.func @tied_on_result(%x: tensor<4xf32>) -> (tensor<4xf32> {dist.tied = "embedding"}) {
  return %x : tensor<4xf32>
}

// -----

// expected-error @+1 {{has an unknown attribute 'dist.rank'}}
module attributes {dist.rank = 0} {
}

// -----

module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @forward_c0() attributes {tessera.phase = "forward", dist.chunk = 0 : i64} {
    return
  }
  dist.schedule attributes {kind = "none", warmup = 0 : i64} {
    // expected-error @+1 {{attribute 'dist.chunk_slot' must be a non-negative integer, got 1.000000e+00 : f32}}
    dist.run @forward_c0 microbatch 0 slot 0 {dist.chunk_slot = 1.0 : f32}
  }
}
