// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=32" | FileCheck %s

// Megatron's batch semantics: 32 / (4 x dp 2) = 4 microbatches.
// CHECK: module attributes {tessera.batch = {global_batch_size = 32 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}}
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %{{.*}}: tensor<4x64xf32> {nn.input = "features"}, %{{.*}}: tensor<4xi32> {nn.input = "labels"}
// CHECK: nn.linear {{.*}} -> tensor<4x10xf32>
// CHECK: nn.softmax_cross_entropy {{.*}} -> tensor<4xf32>
func.func @mlp(%x: tensor<?x64xf32> {nn.input = "features"},
               %t: tensor<?xi32> {nn.input = "labels"},
               %w: tensor<10x64xf32> {nn.param = "head.weight"}) -> tensor<f32> {
  %z = nn.linear %x, %w : (tensor<?x64xf32>, tensor<10x64xf32>) -> tensor<?x10xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<?x10xf32>, tensor<?xi32>) -> tensor<?xf32>
  %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
