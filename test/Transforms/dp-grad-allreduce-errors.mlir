// RUN: tessera-opt %s --tessera-dp-grad-allreduce -verify-diagnostics

// expected-error @+1 {{tessera-dp-grad-allreduce needs the microbatch or backward phases (run tessera-autodiff)}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
