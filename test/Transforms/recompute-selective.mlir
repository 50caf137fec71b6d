// RUN: tessera-gen gpt --layers 1 --hidden 64 --heads 4 --vocab 257 --seq 32 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-recompute="granularity=selective" | FileCheck %s --check-prefix=MARK
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-recompute="granularity=selective" --tessera-autodiff | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-mixed-precision --tessera-recompute="granularity=selective" --tessera-autodiff | FileCheck %s --check-prefix=GEMM

// Selective recompute under sequence parallelism: the all-gathers in front
// of the column-parallel GEMMs (QKV, fc1, the LM head) are marked
// nn.recompute_in_backward, and the backward gathers the shard again right
// before the weight gradient that reads the whole sequence, so only the
// shard is kept (Megatron's linear layers keep the shard the same way).
// The attention core needs nothing: nn.attention_grad recomputes it.

// MARK-COUNT-3: dist.all_gather {{.*}} {nn.recompute_in_backward}
// MARK-NOT: nn.recompute_in_backward

// CHECK: %[[QKVIN:.*]] = dist.all_gather %[[LN1:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// CHECK-NEXT: nn.linear %[[QKVIN]]
// CHECK: %[[FC1IN:.*]] = dist.all_gather %[[LN2:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// CHECK-NEXT: nn.linear %[[FC1IN]]
// CHECK: %[[HEADIN:.*]] = dist.all_gather %[[LNF:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// The backward: each weight gradient reads a fresh gather of the shard.
// CHECK: %[[G1:.*]] = dist.all_gather %[[LNF]] on @mesh "tp" dim 0 :
// CHECK-NEXT: nn.matmul %{{.*}}, %[[G1]] {transpose_lhs}
// CHECK: %[[G2:.*]] = dist.all_gather %[[LN2]] on @mesh "tp" dim 0 :
// CHECK-NEXT: nn.matmul %{{.*}}, %[[G2]] {transpose_lhs}
// CHECK: %[[G3:.*]] = dist.all_gather %[[LN1]] on @mesh "tp" dim 0 :
// CHECK-NEXT: nn.matmul %{{.*}}, %[[G3]] {transpose_lhs}
// No backward op reads a forward gather.
// CHECK-NOT: %[[QKVIN]]{{[,) ]}}
// CHECK-NOT: %[[FC1IN]]{{[,) ]}}
// CHECK: return

// With bf16 GEMMs the GEMMs read bf16 copies of the gathers, which are
// gathered data too: marked with them, and cast again from the fresh
// gather in the backward, so still only the f32 shard is kept.
// GEMM: %[[QKVIN:.*]] = dist.all_gather %[[LN1:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// GEMM: %[[QKVIN16:.*]] = nn.cast %[[QKVIN]] {nn.layer = 0 : i64, nn.recompute_in_backward} : tensor<32x2x64xf32> to tensor<32x2x64xbf16>
// GEMM-NEXT: nn.linear %[[QKVIN16]]
// GEMM: %[[FC1IN:.*]] = dist.all_gather %[[LN2:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// GEMM: %[[FC1IN16:.*]] = nn.cast %[[FC1IN]] {nn.layer = 0 : i64, nn.recompute_in_backward}
// GEMM-NEXT: nn.linear %[[FC1IN16]]
// GEMM: %[[HEADIN:.*]] = dist.all_gather %[[LNF:.*]] on @mesh "tp" dim 0 {nn.recompute_in_backward}
// GEMM-NEXT: %[[HEADIN16:.*]] = nn.cast %[[HEADIN]] {nn.recompute_in_backward}
// GEMM: %[[G1:.*]] = dist.all_gather %[[LNF]] on @mesh "tp" dim 0 :
// GEMM-NEXT: %[[C1:.*]] = nn.cast %[[G1]] : tensor<32x2x64xf32> to tensor<32x2x64xbf16>
// GEMM-NEXT: nn.matmul %{{.*}}, %[[C1]] {transpose_lhs}
// GEMM: %[[G2:.*]] = dist.all_gather %[[LN2]] on @mesh "tp" dim 0 :
// GEMM-NEXT: %[[C2:.*]] = nn.cast %[[G2]]
// GEMM-NEXT: nn.matmul %{{.*}}, %[[C2]] {transpose_lhs}
// GEMM: %[[G3:.*]] = dist.all_gather %[[LN1]] on @mesh "tp" dim 0 :
// GEMM-NEXT: %[[C3:.*]] = nn.cast %[[G3]]
// GEMM-NEXT: nn.matmul %{{.*}}, %[[C3]] {transpose_lhs}
// GEMM-NOT: %[[QKVIN16]]{{[,) ]}}
// GEMM-NOT: %[[FC1IN16]]{{[,) ]}}
// GEMM-NOT: %[[HEADIN16]]{{[,) ]}}
// GEMM: return
