// RUN: tessera-opt %s -split-input-file -verify-diagnostics --tessera-pp-split="pp-layers=1,1"

// expected-error @+1 {{pp-layers given, but pp is 1}}
module {
  dist.mesh @mesh {tp = 2}
  func.func @m(%x: tensor<4xf32> {nn.input = "features"}) -> tensor<f32> {
    %l = nn.mean %x {nn.layer = 0} : (tensor<4xf32>) -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// expected-error @+1 {{the module is already split into stages}}
module {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
  }
}
