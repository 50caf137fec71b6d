// Parameters initialised from data (nn.init = "data", imported models): the
// artifact carries the global value of each (inline) or names the file it is
// in; each rank takes its shard at load time.
// RUN: rm -rf %t && mkdir -p %t
// RUN: tessera-opt %s --tessera-train-pipeline="tp=2 micro-batch-size=4" --tessera-serialize="output=%t/m.tsr"
// RUN: tessera-run --print-summary %t/m.tsr | FileCheck %s
// CHECK: fc1.weight Param F32[8, 8] {{.*}} global[16, 8] shard dim 0 over tp init Data[16, 8] from fc1.bin in /data @128
// CHECK: fc2.weight Param F32[4, 8] {{.*}} global[4, 16] shard dim 1 over tp init Data[4, 16] inline
module attributes {tessera.weights = {
    fc1.weight = {dir = "/data", file = "fc1.bin", offset = 128, shape = array<i64: 16, 8>},
    fc2.weight = dense<0.5> : tensor<4x16xf32>}} {
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
