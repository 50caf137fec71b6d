// tessera-dp-grad-allreduce="shard-grads=true" (ZeRO-2, Megatron's
// --data-parallel-sharding-strategy optim_grads): the buffers are
// shard_grads; the microbatch phase ends each bucket with an accumulating
// reduce-scatter right after the bucket's last gradient, waits for it right
// before the next bucket's starts (one bucket in flight), returns no
// gradient, and the step takes the shards.

// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.gpt.mlir
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true bucket-size=6000 shard-grads=true" | FileCheck %s
// CHECK-LABEL: func.func @gpt(
// CHECK-SAME: -> (tensor<f32> {tessera.buffer = "loss"})
// CHECK: dist.bucket_reduce_start @gbuf bucket 0 over @mesh "dp" scale 5.000000e-01(%{{.*}}) {accumulate, kind = "reduce_scatter"} : tensor<384x32xf32>
// CHECK: dist.bucket_reduce_wait @gbuf bucket 0
// CHECK-NEXT: dist.bucket_reduce_start @gbuf bucket 1 {{.*}}{accumulate, kind = "reduce_scatter"}
// CHECK: dist.bucket_reduce_wait @gbuf bucket 1
// CHECK-NEXT: dist.bucket_reduce_start @gbuf bucket 2
// CHECK: dist.bucket_reduce_wait @gbuf bucket 4
// CHECK-NEXT: return %{{.*}} : tensor<f32>
// CHECK: dist.grad_buffer @gbuf {{.*}}distributed = true{{.*}}shard_grads = true
// CHECK-LABEL: func.func @step(
// CHECK-SAME: %{{.*}}: tensor<6144xf32> {tessera.buffer = "gshard:gbuf:0"}
// CHECK-NOT: grad:
// CHECK: return

// Under sequence parallelism a layer norm's gradient is all-reduced over tp
// in the phase (ZeRO-1 defers it to the step, which keeps no whole
// gradient here).
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="tp=2 dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true shard-grads=true" | FileCheck %s --check-prefix=SP
// SP-LABEL: func.func @gpt(
// SP: %[[R:.*]] = dist.all_reduce %{{.*}} on @mesh "tp" : tensor<32xf32>
// SP: dist.bucket_reduce_start {{.*}}%[[R]]
// SP-LABEL: func.func @step(
// SP-NOT: dist.all_reduce

// The tied embedding across pipeline stages: a bucket of its own on both
// stages (the same padded size, so the same elements in each dp shard),
// reduce-scattered in the backward like the others; the step sums its
// shard over the embedding group (Megatron's embedding-group all-reduce).
// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 257 --seq 8 --tie-embeddings -o %t.tied.mlir
// RUN: tessera-opt %t.tied.mlir --tessera-attach-mesh="pp=2 dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true shard-grads=true" | FileCheck %s --check-prefix=TIED
// TIED-LABEL: module @pp0
// TIED: dist.bucket_reduce_start @gbuf_c0 bucket 1 {{.*}}{accumulate, kind = "reduce_scatter"} : tensor<384x32xf32>
// TIED: dist.grad_buffer @gbuf_c0 {buckets = [{{.*}}, array<i64: {{[0-9]+}}, {{[0-9]+}}, 12288>]
// TIED: func.func @step(%{{.*}}: tensor<{{[0-9]+}}xf32> {tessera.buffer = "gshard:gbuf_c0:0"}, %[[E0:.*]]: tensor<6144xf32> {tessera.buffer = "gshard:gbuf_c0:1"})
// TIED-NEXT: %[[S0:.*]] = dist.all_reduce %[[E0]] on @mesh "embedding" : tensor<6144xf32>
// TIED-NEXT: return %{{.*}}, %[[S0]]
// TIED-LABEL: module @pp1
// TIED: dist.bucket_reduce_start @gbuf_c0 bucket 1 {{.*}}{accumulate, kind = "reduce_scatter"} : tensor<384x32xf32>
// TIED: func.func @step(%{{.*}}: tensor<{{[0-9]+}}xf32> {tessera.buffer = "gshard:gbuf_c0:0"}, %[[E1:.*]]: tensor<6144xf32> {tessera.buffer = "gshard:gbuf_c0:1"})
// TIED-NEXT: %[[S1:.*]] = dist.all_reduce %[[E1]] on @mesh "embedding" : tensor<6144xf32>
// TIED-NEXT: return %{{.*}}, %[[S1]]

// The tied embedding under a V-shaped placement (zbv, dualpipev): rank 0
// holds both the embedding's chunk and the output layer's, the gradient
// is in chunk 0's buffer, and chunk 1's backward, which adds the output
// layer's share every microbatch, reduce-scatters that bucket too, with
// zeros for the bucket's other parameters.
// RUN: tessera-gen gpt --layers 4 --hidden 32 --heads 4 --vocab 257 --seq 8 --tie-embeddings -o %t.tied4.mlir
// RUN: tessera-opt %t.tied4.mlir --tessera-attach-mesh="pp=2 vpp=2 dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-pp-split="v-shape=true" --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true shard-grads=true" | FileCheck %s --check-prefix=V
// V-LABEL: module @pp0
// V: func.func @backward_c0(
// V: dist.bucket_reduce_start @gbuf_c0 bucket 0 {{.*}}{accumulate, kind = "reduce_scatter"}
// V-NOT: dist.bucket_reduce_start
// V: func.func @backward_c1(
// V: nn.fill 0.000000e+00 : tensor<8x32xf32>
// V: dist.bucket_reduce_start @gbuf_c0 bucket 0 {{.*}}{accumulate, kind = "reduce_scatter"}
// V: dist.bucket_reduce_start @gbuf_c1 bucket 0 {{.*}}{accumulate, kind = "reduce_scatter"}
// V-LABEL: module @pp1
// V: func.func @backward_c0(
// V-NOT: nn.fill 0.000000e+00
// V: dist.bucket_reduce_start @gbuf_c0 bucket 0
// V-NOT: @gbuf_c1
// V: func.func @backward_c1(

// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="dp=2" --tessera-autodiff --tessera-dp-grad-allreduce="shard-grads=true" -verify-diagnostics

// expected-error @+1 {{shard-grads (ZeRO-2) needs the distributed optimizer (distributed-optimizer=true)}}
module {
  func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                  %t: tensor<4xi32> {nn.input = "labels"},
                  %w: tensor<3x8xf32> {nn.param = "head.weight"}) -> tensor<f32> {
    %z = nn.linear %x, %w : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
    %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
    %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
