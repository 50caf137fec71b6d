// RUN: tessera-opt %s --tessera-attach-mesh="order=tp-dp" -verify-diagnostics

// expected-error @+1 {{invalid mesh: order 'tp-dp' must name each of tp, cp, ep, dp and pp exactly once}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
