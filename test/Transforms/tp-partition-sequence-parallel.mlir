// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" | FileCheck %s
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 9 -o %t.odd.mlir
// RUN: not tessera-opt %t.odd.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-tp-partition="sequence-parallel=1" 2>&1 | FileCheck %s --check-prefix=SEQ

// Megatron's sequence parallelism: the embeddings (computed in full) are
// scattered onto sequence shards; layer norms and residuals run on
// [seq/tp, batch, hidden]; each region starts with an all-gather along the
// sequence and ends with a reduce-scatter; parameters used on shards enter
// through copy_to_region so their gradients are all-reduced.

// CHECK: %[[E:.*]] = nn.embedding
// CHECK-NEXT: %[[ER:.*]] = dist.reduce_from_region %[[E]] on @mesh "tp" : tensor<8x2x32xf32>
// CHECK-NEXT: %[[P:.*]] = nn.add_position_embedding %[[ER]]
// CHECK-NEXT: %[[S:.*]] = dist.scatter_to_region %[[P]] on @mesh "tp" {dim = 0 : i64} : tensor<8x2x32xf32> -> tensor<4x2x32xf32>
// CHECK-NEXT: %[[G:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<32xf32>
// CHECK-NEXT: %[[B:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<32xf32>
// CHECK-NEXT: %[[X:.*]] = nn.layer_norm %[[S]], %[[G]], %[[B]] {nn.layer = 0 : i64} : tensor<4x2x32xf32>, tensor<32xf32>
// CHECK-NEXT: %[[XG:.*]] = dist.all_gather %[[X]] on @mesh "tp" dim 0 : tensor<4x2x32xf32> -> tensor<8x2x32xf32>
// CHECK-NEXT: nn.linear %[[XG]]
// CHECK-NEXT: nn.attention
// CHECK-NEXT: %[[O:.*]] = nn.linear
// CHECK-NEXT: %[[RS:.*]] = dist.reduce_scatter %[[O]] on @mesh "tp" dim 0 {nn.layer = 0 : i64} : tensor<8x2x32xf32> -> tensor<4x2x32xf32>
// CHECK-NEXT: %[[PB:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<32xf32>
// CHECK-NEXT: %[[BA:.*]] = nn.bias_add %[[RS]], %[[PB]] {nn.layer = 0 : i64} : (tensor<4x2x32xf32>, tensor<32xf32>) -> tensor<4x2x32xf32>
// CHECK-NEXT: nn.add %[[S]], %[[BA]] {nn.layer = 0 : i64} : tensor<4x2x32xf32>
// CHECK: dist.all_gather {{.*}} -> tensor<8x2x32xf32>
// CHECK: dist.reduce_scatter {{.*}} -> tensor<4x2x32xf32>
// The final layer norm on shards, then the LM head's input gathered.
// CHECK: nn.layer_norm {{.*}} : tensor<4x2x32xf32>, tensor<32xf32>
// CHECK-NEXT: %[[H:.*]] = dist.all_gather %{{.*}} on @mesh "tp" dim 0 : tensor<4x2x32xf32> -> tensor<8x2x32xf32>
// CHECK-NEXT: nn.linear %[[H]], {{.*}} -> tensor<8x2x256xf32>
// CHECK-NOT: dist.copy_to_region %{{.*}} : tensor<8x2x32xf32>

// SEQ: error: 'nn.add_position_embedding' op sequence length 9 is not divisible by tp = 2 (sequence parallelism)

// RUN: not tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-tp-partition 2>&1 | FileCheck %s --check-prefix=PAD
// PAD: error: 'nn.embedding' op vocabulary of 257 rows is not divisible by tp = 2 (run tessera-pad-vocab first)

// Dropout on sequence shards offsets its masks by the shard's position.
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --dropout 0.1 -o %t.drop.mlir
// RUN: tessera-opt %t.drop.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" | FileCheck %s --check-prefix=DROP
// DROP: nn.dropout %{{.*}} {rate = 1.000000e-01 : f32, sequence_shard_group = "tp", stream = 0 : i64} : tensor<4x2x32xf32>
// DROP: nn.dropout %{{.*}} {nn.layer = 0 : i64, rate = 1.000000e-01 : f32, sequence_shard_group = "tp", stream = 1 : i64} : tensor<4x2x32xf32>

// Without learned positions (Megatron's --position-embedding-type rope):
// the word embeddings' reduced output is what is scattered onto sequence
// shards; RoPE runs on the gathered QKV with the rank's heads (2 of 4).
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --normalization RMSNorm --disable-bias-linear --position-embedding-type rope -o %t.rope.mlir
// RUN: tessera-opt %t.rope.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" | FileCheck %s --check-prefix=ROPE
// ROPE: %[[E:.*]] = nn.embedding
// ROPE-NEXT: %[[ER:.*]] = dist.reduce_from_region %[[E]] on @mesh "tp" : tensor<8x2x32xf32>
// ROPE-NEXT: %[[S:.*]] = dist.scatter_to_region %[[ER]] on @mesh "tp" {dim = 0 : i64} : tensor<8x2x32xf32> -> tensor<4x2x32xf32>
// ROPE-NEXT: %[[G:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<32xf32>
// ROPE-NEXT: nn.rms_norm %[[S]], %[[G]] {nn.layer = 0 : i64} : tensor<4x2x32xf32>, tensor<32xf32>
// ROPE-NEXT: %[[XG:.*]] = dist.all_gather
// ROPE-NEXT: %[[QKV:.*]] = nn.linear %[[XG]]
// ROPE-NEXT: %[[R:.*]] = nn.rotary_embedding %[[QKV]] {nn.layer = 0 : i64, num_heads = 2 : i64, rotary_dim = 8 : i64} : tensor<8x2x48xf32>
// ROPE-NEXT: nn.attention %[[R]] {nn.layer = 0 : i64, num_heads = 2 : i64}
