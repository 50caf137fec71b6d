// tessera-optimizer="overlap-param-gather=true" (Megatron's
// --overlap-param-gather) with the distributed optimizer: the step's
// gather of each updated parameter bucket carries `param_sync` (left in
// flight when the step returns), and every forward phase waits for a
// bucket right before its first op that reads one of the bucket's
// parameters. The step starts the gathers after every update, in the order
// the forward reads the buckets (buffers are laid out in reverse, so the
// last bucket first).

// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.gpt.mlir
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true bucket-size=6000 overlap-grad-reduce=true" --tessera-optimizer="overlap-param-gather=true" | FileCheck %s
// CHECK-LABEL: func.func @gpt(
// CHECK-NEXT: dist.param_sync_wait @gbuf bucket 4
// CHECK-NEXT: nn.embedding %arg0, %arg2
// CHECK: nn.layer_norm
// CHECK-NEXT: dist.param_sync_wait @gbuf bucket 3
// CHECK-NEXT: nn.linear %{{.*}}, %arg6, %arg7
// CHECK: nn.gelu
// CHECK-NEXT: dist.param_sync_wait @gbuf bucket 2
// CHECK-NEXT: nn.linear %{{.*}}, %arg14, %arg15
// CHECK: dist.param_sync_wait @gbuf bucket 1
// CHECK-NEXT: nn.linear %{{.*}}, %arg24, %arg25
// CHECK: dist.param_sync_wait @gbuf bucket 0
// CHECK-NEXT: nn.linear %{{.*}}, %arg30 :
// CHECK-NOT: dist.param_sync_wait
// CHECK: return
// The last microbatch's variant (overlap-grad-reduce) waits too: with one
// microbatch it is the first.
// CHECK-LABEL: func.func @"gpt:last"(
// CHECK-NEXT: dist.param_sync_wait @gbuf bucket 4
// CHECK-LABEL: func.func @step(
// CHECK-NOT: dist.param_sync_wait
// CHECK: %[[G4:.*]] = dist.all_gather %{{.*}} on @mesh "dp" dim 0 {param_sync} : tensor<6336xf32> -> tensor<12672xf32>
// CHECK-NEXT: dist.unpack @gbuf bucket 4 "param" %[[G4]]
// CHECK-NEXT: %[[G3:.*]] = dist.all_gather %{{.*}} {param_sync}
// CHECK-NEXT: dist.unpack @gbuf bucket 3 "param" %[[G3]]
// CHECK-NEXT: %[[G2:.*]] = dist.all_gather %{{.*}} {param_sync}
// CHECK-NEXT: dist.unpack @gbuf bucket 2 "param" %[[G2]]
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %{{.*}} {param_sync}
// CHECK-NEXT: dist.unpack @gbuf bucket 1 "param" %[[G1]]
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %{{.*}} {param_sync}
// CHECK-NEXT: dist.unpack @gbuf bucket 0 "param" %[[G0]]
// CHECK-NEXT: return

// Pipelines: each chunk's forward waits for its own buckets (after its
// leading receive), the backward never (the forward of the same chunk ran
// first); the evaluation phase keeps the forward's waits.
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="pp=2 dp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=8" --tessera-pad-vocab --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true" --tessera-optimizer="overlap-param-gather=true" --tessera-eval-phase | FileCheck %s --check-prefix=PP
// PP-LABEL: module @pp0
// PP: func.func @forward_c0(
// PP-NEXT: dist.param_sync_wait @gbuf_c0 bucket 0
// PP-NEXT: nn.embedding
// PP: func.func @eval_c0(
// PP-NEXT: dist.param_sync_wait @gbuf_c0 bucket 0
// PP: func.func @backward_c0(
// PP-NOT: dist.param_sync_wait
// PP: dist.all_gather {{.*}} {param_sync}
// PP-LABEL: module @pp1
// PP: func.func @forward_c0(
// PP-NEXT: dist.recv from "prev"
// PP-NEXT: dist.param_sync_wait @gbuf_c0 bucket 0
// PP-NEXT: nn.layer_norm
// PP: func.func @backward_c0(
// PP-NOT: dist.param_sync_wait
// PP: dist.all_gather {{.*}} {param_sync}

// Without the distributed optimizer the step gathers nothing to overlap.
// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="overlap-param-gather=true" -verify-diagnostics

// expected-error @+1 {{overlap-param-gather needs the distributed optimizer (tessera-dp-grad-allreduce distributed-optimizer=true): without it the step gathers no parameters}}
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
