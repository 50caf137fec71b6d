// RUN: tessera-opt %s --tessera-train-pipeline="dp=4 micro-batch-size=4 global-batch-size=32 bucket-size=2 overlap-grad-reduce=true clip-grad=0 weight-decay=0" | FileCheck %s
// RUN: tessera-opt %s --tessera-train-pipeline="dp=4 micro-batch-size=4 global-batch-size=32 overlap-grad-reduce=true distributed-optimizer=true clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=DIST

// ZeRO-1: the bucket is reduce-scattered in place during the last
// backward, into this rank's block of it (the rank-relative view
// "gshard", a quarter of the 128-element bucket); the step's Adam reads the
// shard from there and updates this rank's block of the parameter bucket
// ("pshard") in place, which the all-gather completes.
// DIST-DAG: rt.buffer @"gshard:gbuf:0" : memref<32xf32> {kind = "view", offset = [[GB:[0-9]+]] : i64, rank_group = "dp", rank_stride = 128 : i64}
// DIST-DAG: rt.buffer @"gbuf:gbuf:0" : memref<128xf32> {kind = "view", offset = [[GB]] : i64}
// DIST-DAG: rt.buffer @"pshard:gbuf:0" : memref<32xf32> {kind = "view", offset = [[PB:[0-9]+]] : i64, rank_group = "dp", rank_stride = 128 : i64}
// DIST-DAG: rt.buffer @"pbuf:gbuf:0" : memref<128xf32> {kind = "view", offset = [[PB]] : i64}
// DIST-LABEL: func.func @"microbatch:last"()
// DIST-DAG: %[[B:.*]] = rt.get @"gbuf:gbuf:0" : memref<128xf32>
// DIST-DAG: %[[S:.*]] = rt.get @"gshard:gbuf:0" : memref<32xf32>
// DIST: rt.scale %[[B]], %[[B]] {alpha = 2.500000e-01 : f32}
// DIST-NEXT: %[[E:.*]] = rt.reduce_scatter_start %[[B]], %[[S]] {group = "dp"}
// DIST: rt.wait %[[E]]
// DIST-LABEL: func.func @step()
// DIST-DAG: %[[S2:.*]] = rt.get @"gshard:gbuf:0"
// DIST-DAG: %[[P:.*]] = rt.get @"pshard:gbuf:0"
// DIST-DAG: %[[PBUF:.*]] = rt.get @"pbuf:gbuf:0"
// DIST-NOT: rt.reduce_scatter
// DIST-NOT: rt.copy
// DIST: rt.adam %[[P]], %[[S2]]
// DIST-NEXT: rt.all_gather %[[P]], %[[PBUF]] {group = "dp"}

// The last microbatch's variant accumulates the weight gradient in place
// (GEMM, beta = 1), then scales its bucket and starts the all-reduce while
// the bias gradient is still being computed; both are waited for at the
// end. The step only runs the optimizer.

// CHECK-LABEL: func.func @microbatch()
// CHECK-NOT: rt.all_reduce_start
// CHECK: return
// CHECK-LABEL: func.func @"microbatch:last"()
// CHECK-DAG: %[[GW:.*]] = rt.get @"grad:head.weight" : memref<3x8xf32>
// CHECK-DAG: %[[B1:.*]] = rt.get @"gbuf:gbuf:1" : memref<24xf32>
// CHECK-DAG: %[[B0:.*]] = rt.get @"gbuf:gbuf:0" : memref<3xf32>
// CHECK: rt.gemm %{{.*}}, %{{.*}}, %[[GW]] {beta = 1.000000e+00 : f32, trans_a}
// CHECK-NEXT: rt.scale %[[B1]], %[[B1]] {alpha = 2.500000e-01 : f32}
// CHECK-NEXT: %[[E1:.*]] = rt.all_reduce_start %[[B1]] {group = "dp"}
// CHECK-NEXT: rt.reduce_rows
// CHECK-NEXT: rt.scale %[[B0]], %[[B0]] {alpha = 2.500000e-01 : f32}
// CHECK-NEXT: %[[E0:.*]] = rt.all_reduce_start %[[B0]] {group = "dp"}
// CHECK-NEXT: rt.wait %[[E0]]
// CHECK-NEXT: rt.wait %[[E1]]
// CHECK-NOT: rt.axpy
// CHECK: return
// CHECK-LABEL: func.func @step()
// CHECK-NOT: rt.all_reduce
// CHECK: rt.adam
module {
  func.func @head(%x: tensor<?x8xf32> {nn.input = "features"},
                  %t: tensor<?xi32> {nn.input = "labels"},
                  %w: tensor<3x8xf32> {nn.param = "head.weight"},
                  %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
    %z = nn.linear %x, %w, %b : (tensor<?x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<?x3xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<?x3xf32>, tensor<?xi32>) -> tensor<?xf32>
    %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
