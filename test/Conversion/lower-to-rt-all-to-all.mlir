// RUN: tessera-opt %s --tessera-set-batch="micro-batch-size=4" --tessera-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: tessera-opt %s --tessera-set-batch="micro-batch-size=4" --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer --tessera-lower-to-rt | FileCheck %s

// The equal-split all-to-all (expert parallelism's token exchange, Megatron's
// _AllToAll): its adjoint is the same exchange of the gradient, and it
// lowers to rt.all_to_all into a buffer of its own.

dist.mesh @mesh {dp = 2}

func.func @m(%x: tensor<4x8xf32> {nn.input = "features"}, %y: tensor<4xi32> {nn.input = "labels"}, %w1: tensor<8x8xf32> {nn.param = "w1"}, %w2: tensor<3x8xf32> {nn.param = "w2"}) -> tensor<f32> {
  %h = nn.linear %x, %w1 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %e = dist.all_to_all %h on @mesh "dp" : tensor<4x8xf32>
  %z = nn.linear %e, %w2 : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %y : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}

// GRAD: %[[E:.*]] = dist.all_to_all %{{.*}} on @mesh "dp" : tensor<4x8xf32>
// GRAD: %[[DE:.*]] = nn.matmul %{{.*}}, %{{.*}} : (tensor<4x3xf32>, tensor<3x8xf32>) -> tensor<4x8xf32>
// GRAD: dist.all_to_all %[[DE]] on @mesh "dp" : tensor<4x8xf32>

// CHECK-LABEL: func.func @microbatch
// CHECK: rt.all_to_all %[[IN:.*]], %[[OUT:.*]] {group = "dp"} : memref<4x8xf32>, memref<4x8xf32>
// CHECK: rt.all_to_all %{{.*}}, %{{.*}} {group = "dp"} : memref<4x8xf32>, memref<4x8xf32>

