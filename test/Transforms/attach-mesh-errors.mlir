// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=3" -verify-diagnostics

func.func @mlp(%x: tensor<?x64xf32> {nn.input = "features"},
               %w1: tensor<128x64xf32> {nn.param = "fc1.weight"},
               %w2: tensor<64x128xf32> {nn.param = "fc2.weight"}) -> tensor<?x64xf32> {
  // expected-error @+1 {{'nn.linear' op cannot be split column-parallel over tp = 3: 128 output features are not divisible by 3}}
  %h = nn.linear %x, %w1 : (tensor<?x64xf32>, tensor<128x64xf32>) -> tensor<?x128xf32>
  %a = nn.relu %h : tensor<?x128xf32>
  %y = nn.linear %a, %w2 : (tensor<?x128xf32>, tensor<64x128xf32>) -> tensor<?x64xf32>
  return %y : tensor<?x64xf32>
}

// -----

// expected-error @+1 {{the module already has a mesh}}
dist.mesh @mesh {tp = 2}

// -----

func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
// expected-error @+1 {{more than one model function in the module ('a' and 'b')}}
func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
