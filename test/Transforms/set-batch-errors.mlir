// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=12" -verify-diagnostics

// expected-error @+1 {{global batch size 12 is not divisible by micro-batch-size 4 x dp 2 = 8}}
module {
  func.func @m(%x: tensor<?x8xf32> {nn.input = "features"}) -> tensor<?x8xf32> {
    return %x : tensor<?x8xf32>
  }
}

// -----

module {
  // expected-error @+1 {{the model's static batch size 16 differs from micro-batch-size 4}}
  func.func @m(%x: tensor<16x8xf32> {nn.input = "features"}) -> tensor<16x8xf32> {
    return %x : tensor<16x8xf32>
  }
}

// -----

// A 0-d input has no batch dimension (the nn dialect checks nn.batch_dim
// against ranked inputs of rank >= 1).
module {
  // expected-error @+1 {{model input #0 must be a ranked tensor with a batch dim}}
  func.func @m(%x: tensor<f32> {nn.input = "features"}) -> tensor<f32> {
    return %x : tensor<f32>
  }
}
