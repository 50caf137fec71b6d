// RUN: tessera-opt %s -split-input-file --tessera-autodiff | FileCheck %s

// The loss is seeded with 1/num_microbatches (4 here), like Megatron's loss
// scaling; the backward follows each op's rule in reverse order, and the
// function returns the loss then one gradient per parameter.

// CHECK-LABEL: func.func @mlp
// CHECK-SAME: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<16x8xf32> {tessera.grad_of = "fc1.weight"}, tensor<16xf32> {tessera.grad_of = "fc1.bias"}, tensor<3x16xf32> {tessera.grad_of = "head.weight"})
// CHECK-SAME: attributes {tessera.phase = "microbatch"}
// CHECK: %[[H:.*]] = nn.linear %[[X:[^,]*]], %[[W1:[^,]*]], %{{.*}}
// CHECK: %[[A:.*]] = nn.relu %[[H]]
// CHECK: %[[Z:.*]] = nn.linear %[[A]], %[[WH:[^ ]*]] :
// CHECK: %[[LOSS:.*]] = nn.mean
// CHECK: %[[SEED:.*]] = nn.fill 2.500000e-01 : tensor<f32>
// CHECK: %[[DL:.*]] = nn.mean_grad %[[SEED]] : (tensor<f32>) -> tensor<4xf32>
// CHECK: %[[DZ:.*]] = nn.softmax_cross_entropy_grad %[[Z]], %{{.*}}, %[[DL]]
// CHECK: %[[DA:.*]] = nn.matmul %[[DZ]], %[[WH]] :
// CHECK: %[[DWH:.*]] = nn.matmul %[[DZ]], %[[A]] {transpose_lhs}
// CHECK: %[[DH:.*]] = nn.relu_grad %[[H]], %[[DA]]
// The data input needs no gradient: no matmul against W1 for dx.
// CHECK-NOT: nn.matmul %[[DH]], %[[W1]]
// CHECK: %[[DW1:.*]] = nn.matmul %[[DH]], %[[X]] {transpose_lhs}
// CHECK: %[[DB1:.*]] = nn.reduce_rows %[[DH]]
// CHECK: return %[[LOSS]], %[[DW1]], %[[DB1]], %[[DWH]]
module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}} {
  func.func @mlp(%x: tensor<4x8xf32> {nn.input = "features"},
                 %t: tensor<4xi32> {nn.input = "labels"},
                 %w1: tensor<16x8xf32> {nn.param = "fc1.weight"},
                 %b1: tensor<16xf32> {nn.param = "fc1.bias"},
                 %wh: tensor<3x16xf32> {nn.param = "head.weight"}) -> tensor<f32> {
    %h = nn.linear %x, %w1, %b1 : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %a = nn.relu %h : tensor<4x16xf32>
    %z = nn.linear %a, %wh : (tensor<4x16xf32>, tensor<3x16xf32>) -> tensor<4x3xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
    %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}

// -----

// Adjoints of the region ops: copy_to_region's backward is the all-reduce
// (Megatron's f, copy_to_tensor_model_parallel_region), reduce_from_region's
// backward is the identity (g, reduce_from_tensor_model_parallel_region). A
// value used twice gets its adjoints summed. An unused parameter gets zeros.

// CHECK-LABEL: func.func @tp
// CHECK: %[[IN:.*]] = nn.linear %{{.*}}, %[[W0:[^ ]*]] :
// CHECK: %[[C:.*]] = dist.copy_to_region %[[IN]] on @mesh "tp"
// CHECK: %[[P:.*]] = nn.linear %[[C]], %[[W:[^ ]*]] :
// CHECK: %[[R:.*]] = dist.reduce_from_region %[[P]] on @mesh "tp"
// CHECK: %[[S:.*]] = nn.add %[[R]], %[[IN]]
// CHECK: %[[DS:.*]] = nn.softmax_cross_entropy_grad
// CHECK: %[[DC:.*]] = nn.matmul %[[DS]], %[[W]] :
// CHECK: %[[DW:.*]] = nn.matmul %[[DS]], %[[C]] {transpose_lhs}
// CHECK: %[[AR:.*]] = dist.all_reduce %[[DC]] on @mesh "tp" : tensor<4x8xf32>
// CHECK: %[[DIN:.*]] = nn.add %[[DS]], %[[AR]]
// CHECK: %[[DW0:.*]] = nn.matmul %[[DIN]], %{{.*}} {transpose_lhs}
// CHECK: %[[ZERO:.*]] = nn.fill 0.000000e+00 : tensor<5xf32>
// CHECK: return %{{.*}}, %[[DW0]], %[[DW]], %[[ZERO]]
module {
  dist.mesh @mesh {tp = 2}
  func.func @tp(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w0: tensor<8x8xf32> {nn.param = "w0"},
                %w: tensor<8x8xf32> {nn.param = "w"},
                %unused: tensor<5xf32> {nn.param = "unused"}) -> tensor<f32> {
    %in = nn.linear %x, %w0 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %c = dist.copy_to_region %in on @mesh "tp" : tensor<4x8xf32>
    %p = nn.linear %c, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %r = dist.reduce_from_region %p on @mesh "tp" : tensor<4x8xf32>
    %s = nn.add %r, %in : tensor<4x8xf32>
    %l = nn.softmax_cross_entropy %s, %t : (tensor<4x8xf32>, tensor<4xi32>) -> tensor<4xf32>
    %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}

// -----

// The tanh GELU's adjoint is the tanh GELU's gradient.
// CHECK-LABEL: func.func @tanh_gelu
// CHECK: %[[H:.*]] = nn.linear
// CHECK: nn.gelu %[[H]] {approximate = "tanh"}
// CHECK: nn.gelu_grad %[[H]], %{{.*}} {approximate = "tanh"}
module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
  func.func @tanh_gelu(%x: tensor<4x8xf32> {nn.input = "features"},
                       %t: tensor<4xi32> {nn.input = "labels"},
                       %w1: tensor<16x8xf32> {nn.param = "fc1.weight"},
                       %wh: tensor<3x16xf32> {nn.param = "head.weight"}) -> tensor<f32> {
    %h = nn.linear %x, %w1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
    %a = nn.gelu %h {approximate = "tanh"} : tensor<4x16xf32>
    %z = nn.linear %a, %wh : (tensor<4x16xf32>, tensor<3x16xf32>) -> tensor<4x3xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
    %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
