// RUN: tessera-opt %s --tessera-attach-mesh="order=tp-dp dp=2 pp=2" -verify-diagnostics

// An order may leave out only axes of size 1 (Megatron's RankGenerator
// appends them): pp = 2 must be named.
// expected-error @+1 {{invalid mesh: order 'tp-dp' leaves out pp, whose size is 2 (only axes of size 1 may be left out; they are appended)}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
