// Serialisation errors of parameters initialised from data.
// RUN: rm -rf %t && mkdir -p %t
// RUN: tessera-opt %s -split-input-file -verify-diagnostics --tessera-train-pipeline="tp=2 micro-batch-size=4" --tessera-serialize="output=%t/m.tsr"


module attributes {tessera.weights = {fc2.weight = dense<0.5> : tensor<4x16xf32>}} {
  // expected-error @+1 {{'rt.buffer' op has init "data" but the module's tessera.weights has no value for it}}
  func.func @mlp(%x: tensor<?x8xf32> {nn.input = "features"},
                 %t: tensor<?xi32> {nn.input = "labels"},
                 %w1: tensor<16x8xf32> {nn.param = "fc1.weight", nn.init = "data"},
                 %w2: tensor<4x16xf32> {nn.param = "fc2.weight", nn.init = "data"}) -> tensor<f32> {
    %h = nn.linear %x, %w1 : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %z = nn.linear %h, %w2 : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<?x4xf32>, tensor<?xi32>) -> tensor<?xf32>
    %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}

// -----

module attributes {tessera.weights = {fc1.weight = dense<0.5> : tensor<16x4xf32>}} {
  // expected-error @+1 {{'rt.buffer' op initial value of shape [16, 4] does not fit the parameter's global shape [16, 8] (only the vocabulary rows of dim 0 may be padded)}}
  func.func @mlp(%x: tensor<?x8xf32> {nn.input = "features"},
                 %t: tensor<?xi32> {nn.input = "labels"},
                 %w1: tensor<16x8xf32> {nn.param = "fc1.weight", nn.init = "data"},
                 %w2: tensor<4x16xf32> {nn.param = "fc2.weight"}) -> tensor<f32> {
    %h = nn.linear %x, %w1 : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %z = nn.linear %h, %w2 : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<?x4xf32>, tensor<?xi32>) -> tensor<?xf32>
    %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
