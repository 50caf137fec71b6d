// RUN: tessera-opt %s -split-input-file -verify-diagnostics
// The nn dialect verifies its attributes (nn.param, nn.init, nn.input,
// nn.batch_dim, nn.layer): their values and where they may appear.

// expected-error @+1 {{argument #0 attribute 'nn.param' must be a non-empty string, got 3 : i64}}
func.func @param_not_string(%w: tensor<4xf32> {nn.param = 3}) {
  return
}

// -----

// expected-error @+1 {{argument #1 attribute 'nn.param' must be a non-empty string, got ""}}
func.func @param_empty(%x: tensor<4xf32>, %w: tensor<4xf32> {nn.param = ""}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'nn.init' must be an init spec: "normal:<std>", "uniform:<a>", "zeros", "ones" or "data", got "xavier"}}
func.func @init_kind(%w: tensor<4x4xf32> {nn.param = "w", nn.init = "xavier"}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'nn.init' must be an init spec: "normal:<std>", "uniform:<a>", "zeros", "ones" or "data", got "normal:wide"}}
func.func @init_scale(%w: tensor<4x4xf32> {nn.param = "w", nn.init = "normal:wide"}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'nn.input' must be "features", "labels" or "tokens", got "images"}}
func.func @input_kind(%x: tensor<4x4xf32> {nn.input = "images"}) {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'nn.batch_dim' must be a dimension of tensor<4x4xf32> (0 <= dim < 2), got 2 : i64}}
func.func @batch_dim(%x: tensor<4x4xf32> {nn.input = "features", nn.batch_dim = 2}) {
  return
}

// -----

func.func @layer(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{attribute 'nn.layer' must be a non-negative integer, got "first"}}
  %0 = nn.gelu %x {nn.layer = "first"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @layer_negative(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{attribute 'nn.layer' must be a non-negative integer, got -1 : i64}}
  %0 = nn.gelu %x {nn.layer = -1} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{result #0 has 'nn.param', an attribute of a function argument}}
func.func @param_on_result(%x: tensor<4xf32>) -> (tensor<4xf32> {nn.param = "w"}) {
  return %x : tensor<4xf32>
}

// -----

func.func @param_on_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{has 'nn.param', an attribute of a function argument}}
  %0 = nn.gelu %x {nn.param = "w"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{argument #0 has 'nn.layer', an attribute of an operation}}
func.func @layer_on_argument(%x: tensor<4xf32> {nn.layer = 0}) {
  return
}

// -----

// expected-error @+1 {{argument #0 has an unknown attribute 'nn.parameter'}}
func.func @unknown_argument(%w: tensor<4xf32> {nn.parameter = "w"}) {
  return
}

// -----

func.func @unknown_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{has an unknown attribute 'nn.layers'}}
  %0 = nn.gelu %x {nn.layers = 0} : tensor<4xf32>
  return %0 : tensor<4xf32>
}
