// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 256 --seq 8 --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-tp-partition="sequence-parallel=1" | FileCheck %s --check-prefix=SP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 ep=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-tp-partition="sequence-parallel=1" --tessera-ep-partition | FileCheck %s --check-prefix=SPEP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-cp-partition | FileCheck %s --check-prefix=CP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 cp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-tp-partition="sequence-parallel=1" --tessera-cp-partition | FileCheck %s --check-prefix=SPCP
// RUN: not tessera-opt %t.mlir --tessera-attach-mesh="tp=2 ep=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-tp-partition --tessera-ep-partition 2>&1 | FileCheck %s --check-prefix=NOSP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="cp=2 ep=2" --tessera-set-batch="micro-batch-size=2" --tessera-cp-partition --tessera-ep-partition | FileCheck %s --check-prefix=EPCP

// Mixture of experts on sequence shards (Megatron's sequence_partition_group):
// the router and the experts see this rank's tokens only. Under sequence
// parallelism their weights enter through copy_to_region (their gradients
// are all-reduced over tp), and the load-balancing loss takes the choices
// per expert of all tp ranks' tokens (nn.moe_token_counts, all-reduced).
// SP: dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<4x16xf32>
// SP-NEXT: %[[LOGITS:.*]] = nn.linear %{{.*}} : (tensor<4x2x16xf32>, tensor<4x16xf32>) -> tensor<4x2x4xf32>
// SP-NEXT: %[[P:.*]], %[[I:.*]] = nn.moe_router %[[LOGITS]]
// SP-NEXT: %[[C:.*]] = nn.moe_token_counts %[[I]] {num_experts = 4 : i64} : (tensor<4x2x2xi32>) -> tensor<4xf32>
// SP-NEXT: %[[ALL:.*]] = dist.all_reduce %[[C]] on @mesh "tp" : tensor<4xf32>
// SP-NEXT: nn.moe_aux_loss %[[LOGITS]], %[[I]], %[[ALL]] {{.*}}: (tensor<4x2x4xf32>, tensor<4x2x2xi32>, tensor<4xf32>) -> tensor<f32>
// SP: dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<4x64x16xf32>
// SP-NEXT: nn.grouped_linear
// SP: dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<4x16x64xf32>
// SP-NEXT: nn.grouped_linear

// With the experts split over ep their gradients are whole on their ranks
// (the exchange brought them every token): no copy_to_region; the router's
// weight still has one.
// SPEP: dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<4x16xf32>
// SPEP: dist.all_reduce %{{.*}} on @mesh "tp" : tensor<4xf32>
// SPEP-NOT: dist.copy_to_region
// SPEP: dist.expert_dispatch

// Context parallelism: the counts are summed over cp, or over tp-cp with
// sequence parallelism.
// CP: %[[C:.*]] = nn.moe_token_counts
// CP-NEXT: %[[ALL:.*]] = dist.all_reduce %[[C]] on @mesh "cp" : tensor<4xf32>
// CP-NEXT: nn.moe_aux_loss %{{.*}}, %{{.*}}, %[[ALL]]
// SPCP: %[[C:.*]] = nn.moe_token_counts
// SPCP-NEXT: %[[ALL:.*]] = dist.all_reduce %[[C]] on @mesh "tp-cp" : tensor<4xf32>
// SPCP-NEXT: nn.moe_aux_loss %{{.*}}, %{{.*}}, %[[ALL]]

// NOSP: error: expert parallelism (ep 2, etp 1) with tensor parallelism (tp 2) needs sequence parallelism (--sequence-parallel, as Megatron's MoELayer): without it every tp rank would send the same tokens to the experts; or --ep 1 --etp 1 to replicate the experts over tp
// Expert parallelism on a context-parallel share: the rows of this rank's
// 4 x 2 tokens go to the experts' ranks.
// EPCP: dist.ring_attention
// EPCP: dist.all_reduce %{{.*}} on @mesh "cp" : tensor<4xf32>
// EPCP: dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "ep" {nn.layer = 0 : i64} : tensor<16x16xf32>, tensor<4xi32> -> tensor<32x16xf32>, tensor<2xi32>, tensor<2x2xi32>
