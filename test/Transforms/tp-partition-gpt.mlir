// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --tie-embeddings -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition | FileCheck %s

// Megatron's tensor parallelism on a transformer layer: QKV column-parallel
// by heads, the output projection row-parallel; MLP column then row
// (ColumnParallelLinear, RowParallelLinear); vocab-parallel embedding
// (VocabParallelEmbedding); the tied LM head column-parallel over the
// vocabulary; the cross-entropy on vocabulary shards with the three
// all-reduces of vocab_parallel_cross_entropy and no gather of logits.

// CHECK-LABEL: func.func @gpt
// CHECK-SAME: %[[IDS:[^:]*]]: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "tokens"}
// CHECK-SAME: %[[LABELS:[^:]*]]: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "labels"}
// CHECK-SAME: %[[WTE:[^:]*]]: tensor<256x32xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, {{.*}}nn.param = "embedding.word_embeddings.weight"}
// CHECK-SAME: tensor<48x32xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, {{.*}}linear_qkv.weight"}
// CHECK-SAME: tensor<32x16xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, {{.*}}linear_proj.weight"}
// CHECK-SAME: tensor<64x32xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, {{.*}}mlp.linear_fc1.weight"}
// CHECK-SAME: tensor<32x64xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, {{.*}}mlp.linear_fc2.weight"}
// CHECK: %[[E:.*]] = nn.embedding %[[IDS]], %[[WTE]] {vocab_shard_group = "tp", vocab_size = 257 : i64} : (tensor<8x2xi32>, tensor<256x32xf32>) -> tensor<8x2x32xf32>
// CHECK-NEXT: dist.reduce_from_region %[[E]] on @mesh "tp" : tensor<8x2x32xf32>
// CHECK: %[[XA:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<8x2x32xf32>
// CHECK-NEXT: %[[QKV:.*]] = nn.linear %[[XA]], {{.*}} -> tensor<8x2x48xf32>
// CHECK-NEXT: %[[CTX:.*]] = nn.attention %[[QKV]] {nn.layer = 0 : i64, num_heads = 2 : i64} : (tensor<8x2x48xf32>) -> tensor<8x2x16xf32>
// CHECK-NEXT: %[[P:.*]] = nn.linear %[[CTX]], %{{.*}} {nn.layer = 0 : i64} : (tensor<8x2x16xf32>, tensor<32x16xf32>) -> tensor<8x2x32xf32>
// CHECK-NEXT: dist.reduce_from_region %[[P]] on @mesh "tp"
// CHECK: dist.copy_to_region
// CHECK-NEXT: nn.linear {{.*}} -> tensor<8x2x64xf32>
// CHECK-NEXT: nn.gelu
// CHECK-NEXT: nn.linear {{.*}} -> tensor<8x2x32xf32>
// CHECK-NEXT: dist.reduce_from_region
// CHECK: %[[XH:.*]] = dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<8x2x32xf32>
// CHECK-NEXT: %[[Z:.*]] = nn.linear %[[XH]], %[[WTE]] : (tensor<8x2x32xf32>, tensor<256x32xf32>) -> tensor<8x2x256xf32>
// CHECK-NEXT: %[[M:.*]] = nn.logits_max %[[Z]]
// CHECK-NEXT: %[[GM:.*]] = dist.all_reduce %[[M]] on @mesh "tp" {reduction = "max"} : tensor<8x2xf32>
// CHECK-NEXT: %[[SE:.*]], %[[PL:.*]] = nn.cross_entropy_stats %[[Z]], %[[LABELS]], %[[GM]] {vocab_shard_group = "tp"}
// CHECK-NEXT: %[[GSE:.*]] = dist.reduce_from_region %[[SE]] on @mesh "tp" : tensor<8x2xf32>
// CHECK-NEXT: %[[GPL:.*]] = dist.reduce_from_region %[[PL]] on @mesh "tp" : tensor<8x2xf32>
// CHECK-NEXT: %[[L:.*]] = nn.cross_entropy_from_stats %[[Z]], %[[LABELS]], %[[GM]], %[[GSE]], %[[GPL]] {vocab_shard_group = "tp"}
// CHECK-NEXT: nn.token_mean %[[L]], %[[LABELS]]
// CHECK-NOT: dist.gather_from_region
