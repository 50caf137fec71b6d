// RUN: tessera-gen gpt --layers 1 --hidden 64 --heads 8 --group-query-attention --num-query-groups 2 --qk-layernorm --normalization RMSNorm --disable-bias-linear --position-embedding-type rope --vocab 257 --seq 8 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" | FileCheck %s --check-prefix=SP

// QK-norm inside the attention region: each rank normalises the heads of
// its query group; the whole [head_dim] weights enter through
// copy_to_region, whose backward all-reduces their partial gradients over
// tp (Megatron all-reduces q_layernorm's and k_layernorm's). Under
// sequence parallelism they stay copies: only activations are gathered.

// CHECK: %[[WQ:.*]] = dist.copy_to_region %arg{{[0-9]+}} on @mesh "tp" : tensor<8xf32>
// CHECK-NEXT: %[[WK:.*]] = dist.copy_to_region %arg{{[0-9]+}} on @mesh "tp" : tensor<8xf32>
// CHECK-NEXT: nn.qk_norm %{{.*}}, %[[WQ]], %[[WK]] {{.*}}num_heads = 4 : i64, num_query_groups = 1 : i64} : tensor<8x2x48xf32>, tensor<8xf32>
// CHECK-NEXT: nn.repeat_kv %{{.*}} {{.*}}num_heads = 4 : i64, num_query_groups = 1 : i64

// SP: dist.all_gather
// SP: dist.copy_to_region %arg{{[0-9]+}} on @mesh "tp" : tensor<8xf32>
// SP-NEXT: dist.copy_to_region %arg{{[0-9]+}} on @mesh "tp" : tensor<8xf32>
// SP-NEXT: nn.qk_norm
