// RUN: tessera-opt %s -split-input-file --tessera-optimizer="optimizer=lamb" -verify-diagnostics

// expected-error @+1 {{unknown optimizer 'lamb' (expected sgd or adam)}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
