// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-autodiff --tessera-dp-grad-allreduce="overlap-grad-reduce=true bucket-size=2" | FileCheck %s
// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-autodiff --tessera-dp-grad-allreduce="overlap-grad-reduce=true bucket-size=2 single-bucket-group=true" | FileCheck %s --check-prefix=GROUP
// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-autodiff --tessera-dp-grad-allreduce="overlap-grad-reduce=true distributed-optimizer=true" | FileCheck %s --check-prefix=DIST
// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-autodiff --tessera-dp-grad-allreduce="overlap-grad-reduce=true" --tessera-pp-schedule --tessera-verify-schedule | FileCheck %s --check-prefix=SCHED

// The schedule runs the backward variant for the last microbatch only.
// SCHED-LABEL: module @pp0
// SCHED: dist.run @backward_c0 microbatch 0 slot
// SCHED: dist.run @"backward_c0:last" microbatch 1 slot

// With the distributed optimizer the overlapped reduction is a
// reduce-scatter into the bucket's shard buffer, which the step takes and
// hands to the optimizer.
// DIST-LABEL: func.func @"head:last"(
// DIST: dist.bucket_reduce_start @gbuf bucket 0 over @mesh "dp" scale 2.500000e-01(%{{.*}}, %{{.*}}) {kind = "reduce_scatter"}
// DIST: dist.bucket_reduce_wait @gbuf bucket 0
// DIST-LABEL: func.func @step(
// DIST-SAME: %[[S:[^:]*]]: tensor<32xf32> {tessera.buffer = "gshard:gbuf:0"})
// DIST-SAME: -> (tensor<32xf32> {tessera.grad_shard = {bucket = 0 : i64, buffer = @gbuf}})
// DIST-NEXT: return %[[S]]

// With one bucket group, the group's reductions start together once every
// bucket is complete (after the bias gradient).
// GROUP-LABEL: func.func @"head:last"(
// GROUP: %[[DW:.*]] = nn.matmul
// GROUP-NEXT: %[[DB:.*]] = nn.reduce_rows
// GROUP-NEXT: dist.bucket_reduce_start @gbuf bucket 0
// GROUP-NEXT: dist.bucket_reduce_start @gbuf bucket 1

// Megatron's overlap_grad_reduce: the last microbatch runs a variant of the
// microbatch phase that starts each bucket's reduction right after the
// bucket's last gradient is produced (the weight's bucket 1 before the
// bias gradient, bucket 0, is even computed) and waits for both at its
// end; the step does not reduce them again.

// CHECK-LABEL: func.func @head(
// CHECK-NOT: dist.bucket_reduce_start
// CHECK: return
// CHECK-LABEL: func.func @"head:last"(
// CHECK-SAME: tessera.last_microbatch, tessera.phase = "microbatch"
// CHECK: %[[DW:.*]] = nn.matmul
// CHECK-NEXT: dist.bucket_reduce_start @gbuf bucket 1 over @mesh "dp" scale 2.500000e-01(%[[DW]]) : tensor<3x8xf32>
// CHECK-NEXT: %[[DB:.*]] = nn.reduce_rows
// CHECK-NEXT: dist.bucket_reduce_start @gbuf bucket 0 over @mesh "dp" scale 2.500000e-01(%[[DB]]) : tensor<3xf32>
// CHECK: dist.bucket_reduce_wait @gbuf bucket 0
// CHECK-NEXT: dist.bucket_reduce_wait @gbuf bucket 1
// CHECK-NEXT: return
// CHECK-LABEL: func.func @step(
// CHECK-NOT: dist.all_reduce
// CHECK: return %arg0, %arg1
module {
  dist.mesh @mesh {dp = 4}
  func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                  %t: tensor<4xi32> {nn.input = "labels"},
                  %w: tensor<3x8xf32> {nn.param = "head.weight"},
                  %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
    %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
    %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}

// -----

// Pipelines: each chunk's backward gets a variant for the last microbatch,
// whose waits come before the phase's trailing send (a phase sends last);
// the schedule runs it for microbatch M - 1.
// CHECK-LABEL: module @pp0
// CHECK: func.func @"backward_c0:last"(
// CHECK-SAME: tessera.last_microbatch
// CHECK: dist.bucket_reduce_start @gbuf_c0 bucket 0
// CHECK: dist.bucket_reduce_wait @gbuf_c0 bucket 0
// CHECK-NEXT: return
// CHECK-LABEL: module @pp1
// CHECK: func.func @"backward_c0:last"(
// CHECK: dist.bucket_reduce_start @gbuf_c0 bucket 0
// CHECK: dist.bucket_reduce_wait @gbuf_c0 bucket 0
// CHECK-NEXT: dist.send %{{.*}} to "prev"
// CHECK-NEXT: return
module attributes {tessera.batch = {global_batch_size = 16 : i64, micro_batch_size = 4 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {dp = 2, pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @chunk0(%x: tensor<4x8xf32> {nn.input = "features"},
                      %w: tensor<8x8xf32> {nn.param = "w"}) attributes {dist.stage = {chunk = 0 : i64, layers = array<i64: 0>, stage = 0 : i64}} {
      %h = nn.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
      dist.send %h to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @chunk0(%w: tensor<8x8xf32> {nn.param = "v"}) -> tensor<f32> attributes {dist.stage = {chunk = 0 : i64, layers = array<i64: 1>, stage = 1 : i64}} {
      %r = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      %h = nn.linear %r, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
      %m = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
      return %m : tensor<f32>
    }
  }
}
