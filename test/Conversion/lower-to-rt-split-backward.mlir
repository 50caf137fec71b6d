// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="optimizer=sgd" --tessera-split-backward --tessera-pp-schedule="schedule=zb-h1" --tessera-lower-to-rt | FileCheck %s

// The chain of lower-to-rt-pipeline.mlir under ZB-H1: each backward is B
// (backward_c0) and W (backward_w_c0). What B saves for W lives in the
// microbatch slot next to the forward's saved activations, marked
// for_weight_grad; the slot grows by those bytes and, W holding it, every
// rank keeps 2 slots (1F1B's last rank keeps 1). W accumulates the
// gradients and carries the weight-gradient FLOPs; on the first stage,
// which sends nothing back, B does no arithmetic.

// CHECK-LABEL: module @pp0
// CHECK-DAG: rt.buffer @"stash:c0:0" : memref<4x8xf32> {kind = "activation", offset = [[S0:[0-9]+]] : i64}
// CHECK-DAG: rt.buffer @"stash:c0:1" : memref<4x8xf32> {for_weight_grad, kind = "activation", offset = {{[0-9]+}} : i64}
// CHECK: func.func @forward_c0() attributes {{{.*}}rt.num_slots = 2 : i64, rt.slot_base = {{[0-9]+}} : i64, rt.slot_bytes = 384 : i64, tessera.phase = "forward"}
// CHECK: func.func @backward_c0() attributes {{{.*}}rt.flops = 0 : i64{{.*}}tessera.phase = "backward"}
// CHECK: func.func @"recv:backward_c0"()
// CHECK-NEXT: %[[G:.*]] = rt.get @"stash:c0:1"
// CHECK-NEXT: rt.recv %[[G]] {group = "pp", iattrs = array<i64: 1, 1>}
// CHECK: func.func @backward_w_c0() attributes {{{.*}}rt.flops = 544 : i64{{.*}}tessera.phase = "backward_w"}
// CHECK: rt.get @"grad:l0.w"
// CHECK: func.func @step()

// CHECK-LABEL: module @pp1
// CHECK-DAG: rt.buffer @"stash:c0:3" : memref<4x3xf32> {for_weight_grad, kind = "activation"
// CHECK-DAG: rt.buffer @"stash:c0:4" : memref<4x8xf32> {for_weight_grad, kind = "activation"
// CHECK: func.func @forward_c0() attributes {{{.*}}rt.num_slots = 2 : i64, rt.slot_base = {{[0-9]+}} : i64, rt.slot_bytes = 576 : i64, tessera.phase = "forward"}
// CHECK: func.func @backward_c0()
// CHECK: func.func @"send:backward_c0"()
// CHECK: rt.send %{{.*}} {group = "pp", iattrs = array<i64: -1, 1>}
// CHECK: func.func @backward_w_c0()
// CHECK-NOT: rt.send
// CHECK-NOT: rt.recv
// CHECK: func.func @step()

module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 4 : i64}} {
dist.mesh @mesh {pp = 2}
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %labels: tensor<4xi32> {nn.input = "labels"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %wh: tensor<3x8xf32> {nn.param = "head.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %h1 = nn.linear %a0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = nn.linear %h1, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}
