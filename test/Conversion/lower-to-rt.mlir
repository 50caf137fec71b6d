// RUN: tessera-opt %s --tessera-train-pipeline="tp=2 dp=2 micro-batch-size=4 global-batch-size=16 clip-grad=0 weight-decay=0" | FileCheck %s
// RUN: tessera-opt %s --tessera-train-pipeline="tp=2 dp=2 micro-batch-size=4 global-batch-size=16 fuse-bucket-optimizer=false clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=PERPARAM

// Persistent buffers first, with their manifest entries: the grad buffer
// (Megatron's _ParamAndGradBuffer: gradients in reverse order, back to back) at
// offset 0 with its bucket view, then the parameters and each Adam state in
// regions of that layout (offset 448, 896, 1344), then the rest 64-byte
// aligned.
// CHECK: module attributes {rt.arena_bytes = [[ARENA:[0-9]+]] : i64, rt.flops_per_step = {{[0-9]+}} : i64, rt.persistent_bytes = [[PERSIST:[0-9]+]] : i64
// CHECK: rt.buffer @fc1.weight : memref<8x8xf32> {global_shape = array<i64: 16, 8>, init = "normal:0.02", kind = "param", offset = 592 : i64, shard_axis = "tp", shard_dim = 0 : i64}
// CHECK: rt.buffer @fc2.weight : memref<4x8xf32> {global_shape = array<i64: 4, 16>, init = "normal:0.02", kind = "param", offset = 464 : i64, shard_axis = "tp", shard_dim = 1 : i64}
// CHECK: rt.buffer @fc2.bias : memref<4xf32> {global_shape = array<i64: 4>, init = "zeros", kind = "param", offset = 448 : i64}
// CHECK: rt.buffer @"grad:fc1.weight" : memref<8x8xf32> {kind = "grad", of = @fc1.weight, offset = 144 : i64}
// CHECK: rt.buffer @"grad:fc2.weight" : memref<4x8xf32> {kind = "grad", of = @fc2.weight, offset = 16 : i64}
// CHECK: rt.buffer @"grad:fc2.bias" : memref<4xf32> {kind = "grad", of = @fc2.bias, offset = 0 : i64}
// CHECK: rt.buffer @iteration : memref<i64> {kind = "iteration"
// CHECK: rt.buffer @"adam.exp_avg:fc1.weight" : memref<8x8xf32> {kind = "opt_state", of = @fc1.weight, offset = 1040 : i64}
// CHECK: rt.buffer @"adam.exp_avg:fc2.bias" : memref<4xf32> {kind = "opt_state", of = @fc2.bias, offset = 896 : i64}
// CHECK: rt.buffer @features : memref<4x8xf32> {kind = "input"
// CHECK: rt.buffer @labels : memref<4xi32> {kind = "input", num_classes = 4 : i64
// CHECK: rt.buffer @loss : memref<f32> {kind = "loss"
// CHECK: rt.buffer @"gbuf:gbuf:0" : memref<100xf32> {kind = "view", offset = 0 : i64}
// CHECK: rt.buffer @"bucket.param:gbuf:0" : memref<100xf32> {kind = "view", offset = 448 : i64}
// CHECK: rt.buffer @"bucket.exp_avg:gbuf:0" : memref<100xf32> {kind = "view", offset = 896 : i64}
// CHECK: rt.buffer @"bucket.exp_avg_sq:gbuf:0" : memref<100xf32> {kind = "view", offset = 1344 : i64}

// Each entry records its cost per run (tessera-plan): no op of this tiny
// MLP reaches 16 FLOPs a byte, so none counts as compute-bound.
// CHECK-LABEL: func.func @microbatch() attributes {rt.dense_flops = 0 : i64, rt.entry, rt.flops = 1902 : i64, rt.light_bytes = 3148 : i64, tessera.phase = "microbatch"}
// CHECK-DAG: %[[X:.*]] = rt.get @features : memref<4x8xf32>
// CHECK-DAG: %[[W1:.*]] = rt.get @fc1.weight : memref<8x8xf32>
// CHECK-DAG: %[[GW1:.*]] = rt.get @"grad:fc1.weight" : memref<8x8xf32>
// The data input enters the tp region without a copy.
// CHECK: rt.gemm %[[X]], %[[W1]], %[[H:[^ ]*]] {trans_b}
// CHECK: rt.gelu %[[H]], %{{.*}} {iattrs = array<i64: 0>}
// CHECK: rt.all_reduce %{{.*}} {group = "tp"}
// CHECK: rt.cross_entropy
// CHECK: rt.mean %{{.*}}, %{{.*}} : memref<4xf32>, memref<f32>
// CHECK: rt.fill %{{.*}} {value = 5.000000e-01 : f32}
// Weight gradients accumulate over microbatches straight into their buffers.
// CHECK: rt.gemm %{{.*}}, %[[X]], %[[GW1]] {beta = 1.000000e+00 : f32, trans_a}
// CHECK-NOT: rt.axpy
// CHECK: return

// CHECK-LABEL: func.func @step() attributes {rt.dense_flops = 0 : i64, rt.entry, rt.flops = 1600 : i64, rt.light_bytes = 4024 : i64, tessera.phase = "step"}
// CHECK-DAG: %[[T:.*]] = rt.get @iteration
// CHECK-DAG: %[[B:.*]] = rt.get @"gbuf:gbuf:0" : memref<100xf32>
// Scaling and the dp all-reduce run once on the whole bucket, in place
// (packing and unpacking cost nothing); then one Adam, in place, over the
// bucket's parameters, gradients and state (tessera-fuse-bucket-optimizer).
// CHECK: rt.scale %[[B]], %[[B]] {alpha = 5.000000e-01 : f32}
// CHECK-NEXT: rt.all_reduce %[[B]] {group = "dp"}
// CHECK-DAG: %[[P:.*]] = rt.get @"bucket.param:gbuf:0"
// CHECK-DAG: %[[M:.*]] = rt.get @"bucket.exp_avg:gbuf:0"
// CHECK-DAG: %[[V:.*]] = rt.get @"bucket.exp_avg_sq:gbuf:0"
// CHECK: rt.adam %[[P]], %[[B]], %[[M]], %[[V]], %[[T]] {{.*}} : memref<100xf32>, memref<100xf32>, memref<100xf32>, memref<100xf32>, memref<i64>
// CHECK-NOT: rt.adam
// One fill zeroes the whole bucket for the next step.
// CHECK: rt.fill %[[B]] {value = 0.000000e+00 : f32} : memref<100xf32>
// CHECK-NOT: rt.copy
// CHECK: return

// With the fusion off, an Adam per parameter on the same buffers.
// PERPARAM-LABEL: func.func @step()
// PERPARAM-DAG: %[[G:.*]] = rt.get @"grad:fc1.weight"
// PERPARAM-DAG: %[[P:.*]] = rt.get @fc1.weight
// PERPARAM-DAG: %[[M:.*]] = rt.get @"adam.exp_avg:fc1.weight"
// PERPARAM-DAG: %[[V:.*]] = rt.get @"adam.exp_avg_sq:fc1.weight"
// PERPARAM: rt.adam %[[P]], %[[G]], %[[M]], %[[V]]
// PERPARAM-COUNT-2: rt.adam
// PERPARAM-NOT: bucket.
module {
  func.func @mlp(%x: tensor<?x8xf32> {nn.input = "features"},
                 %t: tensor<?xi32> {nn.input = "labels"},
                 %w1: tensor<16x8xf32> {nn.param = "fc1.weight"},
                 %w2: tensor<4x16xf32> {nn.param = "fc2.weight"},
                 %b2: tensor<4xf32> {nn.param = "fc2.bias", nn.init = "zeros"}) -> tensor<f32> {
    %h = nn.linear %x, %w1 : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %a = nn.gelu %h : tensor<?x16xf32>
    %z = nn.linear %a, %w2, %b2 : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>) -> tensor<?x4xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<?x4xf32>, tensor<?xi32>) -> tensor<?xf32>
    %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
