// RUN: tessera-opt %s --verify-diagnostics --tessera-autodiff --tessera-dp-grad-allreduce="overlap-grad-reduce=true distributed-optimizer=true"

// expected-error @+1 {{overlap-grad-reduce with the distributed optimizer is not supported yet (its reduce-scatter runs in the step)}}
module {
  dist.mesh @mesh {dp = 2}
  func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                  %w: tensor<3x8xf32> {nn.param = "head.weight"}) -> tensor<f32> {
    %z = nn.linear %x, %w : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
    %m = nn.mean %z : (tensor<4x3xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
