// RUN: tessera-opt %s -split-input-file --tessera-optimizer -verify-diagnostics

// Hand-offs from tessera-dp-grad-allreduce that the optimizer checks: a
// step result that is a bucket shard of a grad buffer that does not exist,
// and a result that is neither a gradient nor a shard.
module {
  dist.mesh @mesh {dp = 2}
  // expected-error @+1 {{result #0 is a shard of an unknown grad buffer}}
  func.func @step(%g: tensor<64xf32>) -> (tensor<64xf32> {tessera.grad_shard = {buffer = @nope, bucket = 0 : i64}}) attributes {tessera.phase = "step"} {
    return %g : tensor<64xf32>
  }
}

// -----

module {
  dist.mesh @mesh {dp = 2}
  // expected-error @+1 {{result #0 is not a gradient}}
  func.func @step(%g: tensor<4xf32>) -> (tensor<4xf32> {tessera.buffer = "w"}) attributes {tessera.phase = "step"} {
    return %g : tensor<4xf32>
  }
}
