// RUN: tessera-opt %s -split-input-file --tessera-recompute="granularity=full method=uniform num-layers=2" -verify-diagnostics

// Full recompute groups transformer layers: a model without nn.layer
// marks has none.
// expected-error @+1 {{--recompute-granularity full needs transformer layers: no op is marked nn.layer}}
module {
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %w: tensor<8x8xf32> {nn.param = "fc.weight"}) -> tensor<f32> {
  %h = nn.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// -----

// Megatron bounds --recompute-num-layers by the layers of a pipeline rank.
// expected-error @+1 {{--recompute-num-layers 2 exceeds the 1 layers of a pipeline rank}}
module {
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %w: tensor<8x8xf32> {nn.param = "fc.weight"}) -> tensor<f32> {
  %h = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// -----

// A group is the ops from its first layer's first op to its last layer's
// last op; another layer's op in between is an error.
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %w0: tensor<8x8xf32> {nn.param = "l0.weight"},
               %w1: tensor<8x8xf32> {nn.param = "l1.weight"},
               %w2: tensor<8x8xf32> {nn.param = "l2.weight"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{'nn.linear' op of layer 2 lies between ops of layer 0; a recomputed layer's ops must be contiguous}}
  %h2 = nn.linear %x, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %s = nn.add %h1, %h2 {nn.layer = 2} : tensor<4x8xf32>
  %loss = nn.mean %s : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The pass runs on the model, before autodiff.
// expected-error @+1 {{'func.func' op is a training phase; tessera-recompute runs on the model, before tessera-autodiff}}
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"}) -> tensor<4x8xf32> attributes {tessera.phase = "microbatch"} {
  return %x : tensor<4x8xf32>
}

// -----

// A pipeline transfer inside a group cannot be recomputed (tessera-pp-split
// cuts between layers, so only hand-written IR has one).
module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
dist.mesh @mesh {pp = 2}
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %w0: tensor<8x8xf32> {nn.param = "l0.weight"},
               %w1: tensor<8x8xf32> {nn.param = "l1.weight"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{'dist.send' op lies inside recomputed layer 0; a pipeline transfer cannot be recomputed}}
  dist.send %h0 to "next" {tag = 0 : i64} : tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h1 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}
