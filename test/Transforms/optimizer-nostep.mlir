// RUN: tessera-opt %s --tessera-optimizer -verify-diagnostics

// expected-error @+1 {{tessera-optimizer needs the microbatch (or forward) and step phases}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
