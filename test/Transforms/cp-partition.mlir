// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --dropout 0.1 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition --tessera-cp-partition | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-cp-partition | FileCheck %s --check-prefix=SP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="cp=1" --tessera-set-batch="micro-batch-size=2" --tessera-cp-partition | FileCheck %s --check-prefix=NONE

// Context parallelism: each cp rank holds its load-balanced share (8 / 2 =
// 4 positions) of every sequence; attention becomes ring attention over
// "cp", the position embedding and dropout take global positions, and the
// token mean divides by the whole sequence's count, the shares summed.

// CHECK: func.func @gpt(%[[TOK:.*]]: tensor<4x2xi32> {dist.sharding = {axis = "cp", dim = 0 : i64}, nn.batch_dim = 1 : i64, nn.input = "tokens"}, %[[LAB:.*]]: tensor<4x2xi32> {dist.sharding = {axis = "cp", dim = 0 : i64}, nn.batch_dim = 1 : i64, nn.input = "labels"}
// CHECK: nn.embedding %[[TOK]], {{.*}} -> tensor<4x2x32xf32>
// CHECK: nn.add_position_embedding {{.*}} {sequence_shard_group = "cp"} : tensor<4x2x32xf32>, tensor<8x32xf32>
// CHECK: nn.dropout {{.*}}sequence_shard_group = "cp"{{.*}} : tensor<4x2x32xf32>
// CHECK: %[[QKV:.*]] = nn.linear {{.*}} -> tensor<4x2x96xf32>
// CHECK: %[[CTX:.*]], %[[LSE:.*]] = dist.ring_attention %[[QKV]] on @mesh "cp" {nn.layer = 0 : i64, num_heads = 4 : i64} : tensor<4x2x96xf32> -> tensor<4x2x32xf32>, tensor<4x2x4xf32>
// CHECK-NOT: nn.attention
// CHECK: nn.linear %[[CTX]]
// CHECK: %[[CE:.*]] = nn.softmax_cross_entropy
// CHECK-NEXT: %[[N:.*]] = nn.token_count %[[LAB]] : (tensor<4x2xi32>) -> tensor<f32>
// CHECK-NEXT: %[[NALL:.*]] = dist.all_reduce %[[N]] on @mesh "cp" : tensor<f32>
// CHECK-NEXT: %[[SHARE:.*]] = nn.token_mean %[[CE]], %[[LAB]], %[[NALL]] : (tensor<4x2xf32>, tensor<4x2xi32>, tensor<f32>) -> tensor<f32>
// CHECK-NEXT: %[[LOSS:.*]] = dist.reduce_from_region %[[SHARE]] on @mesh "cp" : tensor<f32>
// CHECK-NEXT: return %[[LOSS]]

// With sequence parallelism the tp shards split the cp share: dropout on
// them keys its masks by "tp-cp", and the sequence collectives shrink.
// SP: nn.add_position_embedding {{.*}} {sequence_shard_group = "cp"} : tensor<4x2x32xf32>
// SP-NEXT: dist.scatter_to_region {{.*}} on @mesh "tp" {dim = 0 : i64} : tensor<4x2x32xf32> -> tensor<2x2x32xf32>
// SP-NEXT: nn.dropout {{.*}}sequence_shard_group = "tp-cp"{{.*}} : tensor<2x2x32xf32>
// SP: dist.all_gather {{.*}} on @mesh "tp" dim 0 : tensor<2x2x32xf32> -> tensor<4x2x32xf32>
// SP: dist.ring_attention {{.*}} on @mesh "cp" {nn.layer = 0 : i64, num_heads = 2 : i64} : tensor<4x2x48xf32> -> tensor<4x2x16xf32>, tensor<4x2x2xf32>
// SP: dist.reduce_scatter {{.*}} on @mesh "tp" dim 0 {nn.layer = 0 : i64} : tensor<4x2x32xf32> -> tensor<2x2x32xf32>

// cp = 1: nothing changes.
// NONE-NOT: dist.ring_attention
// NONE: nn.attention
// NONE-NOT: nn.token_count

// RoPE rotates each row of the share by its global position: the op takes
// the sequence's shard group, as dropout does, and ring attention reads the
// rotated QKV.
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --position-embedding-type rope -o %t.rope.mlir
// RUN: tessera-opt %t.rope.mlir --tessera-attach-mesh="cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition --tessera-cp-partition | FileCheck %s --check-prefix=ROPE
// ROPE-NOT: {{add_position_embedding|position_embeddings.weight}}
// ROPE: %[[QKV:.*]] = nn.linear {{.*}} -> tensor<4x2x96xf32>
// ROPE-NEXT: %[[R:.*]] = nn.rotary_embedding %[[QKV]] {nn.layer = 0 : i64, num_heads = 4 : i64, rotary_dim = 8 : i64, sequence_shard_group = "cp"} : tensor<4x2x96xf32>
// ROPE-NEXT: dist.ring_attention %[[R]] on @mesh "cp"
