// RUN: rm -rf %t && mkdir -p %t
// RUN: tessera-opt %s --tessera-train-pipeline="tp=2 micro-batch-size=4" --tessera-serialize="output=%t/m.tsr"
// RUN: tessera-run --print-summary %t/m.tsr | FileCheck %s
// RUN: not tessera-opt %s --tessera-serialize 2>&1 | FileCheck %s --check-prefix=NOOUT
// RUN: not tessera-opt %s --tessera-serialize="output=%t/x.tsr" 2>&1 | FileCheck %s --check-prefix=NORT

// CHECK: world size: 2
// CHECK: mesh: tp=2 cp=1 dp=1 pp=1 (order tp-cp-ep-dp-pp)
// CHECK: tp: [0,1]
// CHECK: batch: micro 4, global 4, microbatches 1
// CHECK: optimizer: adam lr=0.001
// The gradients first, in their grad buffer (reverse order), with a view
// of the bucket on top; the parameters and their Adam state in that layout
// too, with the views the bucket's one Adam update reads.
// CHECK: fc1.weight Param F32[8, 8] @512 global[16, 8] shard dim 0 over tp init Normal(0.02)
// CHECK: grad:fc1.weight Grad F32[8, 8] @128
// CHECK: grad:fc2.weight Grad F32[4, 8] @0
// CHECK: gbuf:gbuf:0 View F32[96] @0
// CHECK: bucket.param:gbuf:0 View F32[96] @384
// CHECK: bucket.exp_avg:gbuf:0 View F32[96] @768
// CHECK: bucket.exp_avg_sq:gbuf:0 View F32[96] @1152

// NOOUT: tessera-serialize needs output=<file>
// NORT: tessera-serialize needs an rt module (run tessera-lower-to-rt)
module {
  func.func @mlp(%x: tensor<?x8xf32> {nn.input = "features"},
                 %t: tensor<?xi32> {nn.input = "labels"},
                 %w1: tensor<16x8xf32> {nn.param = "fc1.weight"},
                 %w2: tensor<4x16xf32> {nn.param = "fc2.weight"}) -> tensor<f32> {
    %h = nn.linear %x, %w1 : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %a = nn.gelu %h : tensor<?x16xf32>
    %z = nn.linear %a, %w2 : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<?x4xf32>, tensor<?xi32>) -> tensor<?xf32>
    %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
