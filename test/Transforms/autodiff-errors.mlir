// RUN: tessera-opt %s -split-input-file --tessera-autodiff -verify-diagnostics

// expected-error @+1 {{must return exactly one 0-d loss tensor to be differentiated}}
func.func @not_a_loss(%w: tensor<4xf32> {nn.param = "w"}) -> tensor<4xf32> {
  return %w : tensor<4xf32>
}

// -----

dist.mesh @mesh {tp = 2}
func.func @max(%w: tensor<4xf32> {nn.param = "w"}, %t: tensor<4xi32> {nn.input = "labels"}) -> tensor<f32> {
  // expected-error @+1 {{has no gradient for reduction 'max'}}
  %m = dist.all_reduce %w on @mesh "tp" {reduction = "max"} : tensor<4xf32>
  %l = nn.mean %m : (tensor<4xf32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @no_rule(%w: tensor<4xf32> {nn.param = "w"}) -> tensor<f32> {
  // expected-error @+1 {{'nn.scale' op has no gradient rule (DifferentiableOpInterface)}}
  %s = nn.scale %w {factor = 2.0 : f32} : tensor<4xf32>
  %l = nn.mean %s : (tensor<4xf32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{the module is already differentiated}}
module {
  func.func @m(%w: tensor<4xf32> {nn.param = "w"}) -> tensor<f32> attributes {tessera.phase = "microbatch"} {
    %l = nn.mean %w : (tensor<4xf32>) -> tensor<f32>
    return %l : tensor<f32>
  }
}
