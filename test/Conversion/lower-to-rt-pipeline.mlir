// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="optimizer=sgd" --tessera-pp-schedule --tessera-lower-to-rt | FileCheck %s

// A two-stage chain under 1F1B with 4 microbatches. Each chunk's inputs and
// saved activations live in a slot region, one copy per microbatch in
// flight (2 on the first stage, 1 on the last); received values that the
// backward needs land directly in their slot; sends read p2p staging
// buffers; each phase's receives and sends become their own functions
// (recv:<phase>, send:<phase>) so the schedule can batch them.

// CHECK-LABEL: module @pp0
// CHECK-SAME: rt.arena_bytes
// CHECK-DAG: rt.buffer @features : memref<4x8xf32> {chunk = 0 : i64, kind = "input", offset = [[IN:[0-9]+]] : i64}
// CHECK-DAG: rt.buffer @"stash:c0:0" : memref<4x8xf32> {kind = "activation", offset = {{[0-9]+}} : i64}
// CHECK-DAG: rt.buffer @"p2p.send:forward_c0:0" : memref<4x8xf32> {kind = "activation"
// CHECK-DAG: rt.buffer @"p2p.recv:backward_c0:0" : memref<4x8xf32> {kind = "activation"
// CHECK: func.func @forward_c0() attributes {rt.chunk = 0 : i64, rt.dense_flops = 0 : i64, rt.entry, rt.flops = 544 : i64, rt.light_bytes = 768 : i64, rt.num_slots = 2 : i64, rt.slot_base = [[IN]] : i64, rt.slot_bytes = 256 : i64, tessera.phase = "forward"}
// CHECK-NOT: rt.send
// CHECK: return
// CHECK: func.func @"send:forward_c0"() attributes {{{.*}}rt.part = "send"
// CHECK-NEXT: %[[S:.*]] = rt.get @"p2p.send:forward_c0:0"
// CHECK-NEXT: rt.send %[[S]] {group = "pp", iattrs = array<i64: 1, 0>}
// CHECK: func.func @backward_c0()
// CHECK-NOT: rt.recv
// CHECK: func.func @"recv:backward_c0"() attributes {{{.*}}rt.part = "recv"
// CHECK-NEXT: %[[G:.*]] = rt.get @"p2p.recv:backward_c0:0"
// CHECK-NEXT: rt.recv %[[G]] {group = "pp", iattrs = array<i64: 1, 1>}
// CHECK: func.func @step()

// CHECK-LABEL: module @pp1
// CHECK: func.func @forward_c0() attributes {rt.chunk = 0 : i64, rt.dense_flops = 0 : i64, rt.entry, rt.flops = 709 : i64, rt.light_bytes = 884 : i64, rt.num_slots = 1 : i64
// CHECK: func.func @"recv:forward_c0"()
// The received activation is saved for the backward: it lands in the slot.
// CHECK-NEXT: %[[A:.*]] = rt.get @"stash:c0:{{[0-9]+}}"
// CHECK-NEXT: rt.recv %[[A]] {group = "pp", iattrs = array<i64: -1, 0>}
// CHECK: func.func @"send:backward_c0"()
// CHECK: rt.send %{{.*}} {group = "pp", iattrs = array<i64: -1, 1>}

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
