// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-pp-split

dist.mesh @mesh {pp = 2}
// expected-error @+1 {{has no layer marks (nn.layer) to split into pipeline stages}}
func.func @nomarks(%x: tensor<4x8xf32> {nn.input = "features"},
                   %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h = nn.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

dist.mesh @mesh {pp = 2}
// expected-error @+1 {{cannot be split into pipeline stages: 3 layers do not split evenly over pp x vpp = 2 x 1 (give pp-layers for an uneven split)}}
func.func @uneven(%x: tensor<4x8xf32> {nn.input = "features"},
                  %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.gelu %h0 {nn.layer = 1} : tensor<4x8xf32>
  %h2 = nn.gelu %h1 {nn.layer = 2} : tensor<4x8xf32>
  %loss = nn.mean %h2 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A parameter shared by the first and a middle rank: only the tied
// embedding (first and last rank) has a reduction group.
dist.mesh @mesh {pp = 3}
// expected-error @+1 {{parameter 'w' is used on pipeline ranks 0 1; only the first and last rank may share a parameter}}
func.func @shared(%x: tensor<4x8xf32> {nn.input = "features"},
                  %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.gelu %h1 {nn.layer = 2} : tensor<4x8xf32>
  %loss = nn.mean %h2 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Layer marks out of order: layer 0 reads a value of layer 1.
dist.mesh @mesh {pp = 2}
func.func @backwards(%x: tensor<4x8xf32> {nn.input = "features"},
                     %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  // expected-note @+1 {{defined here}}
  %h0 = nn.linear %x, %w {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{in pipeline stage 0 uses a value of stage 1; values may only flow to later stages}}
  %h1 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %loss = nn.mean %h1 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{'dist.mesh' op vpp 2 needs pp > 1}}
dist.mesh @mesh {vpp = 2}
func.func @novpp(%x: tensor<4x8xf32> {nn.input = "features"}) -> tensor<f32> {
  %loss = nn.mean %x : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Layer marks must be contiguous from 0: layer 1 is empty here.
dist.mesh @mesh {pp = 2}
func.func @gap(%x: tensor<4x8xf32> {nn.input = "features"},
               %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  // expected-error @+1 {{is marked nn.layer = 2, but no op is marked layer 1 (layer marks must be contiguous from 0; 2 distinct layers are marked)}}
  %h1 = nn.gelu %h0 {nn.layer = 2} : tensor<4x8xf32>
  %loss = nn.mean %h1 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An absurd mark is the same error, found without allocating per layer.
dist.mesh @mesh {pp = 2}
func.func @huge(%x: tensor<4x8xf32> {nn.input = "features"},
                %w: tensor<8x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.gelu %h0 {nn.layer = 1} : tensor<4x8xf32>
  // expected-error @+1 {{is marked nn.layer = 2147483647, but no op is marked layer 2}}
  %h2 = nn.gelu %h1 {nn.layer = 2147483647} : tensor<4x8xf32>
  %loss = nn.mean %h2 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
