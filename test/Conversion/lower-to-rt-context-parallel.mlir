// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --dropout 0.1 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="cp=2 micro-batch-size=2" | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="cp=2 dp=2 micro-batch-size=2 distributed-optimizer=1" | FileCheck %s --check-prefix=ZERO
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="cp=2 micro-batch-size=2 bf16=true" | FileCheck %s --check-prefix=BF16

// Context parallelism in the rt program: the token inputs are the rank's
// share of each sequence (shard_axis "cp", the global shape for the data
// loader); the position embedding and dropout name the sequence's shard
// group; ring attention and its backward run over "cp" with a workspace
// from the memory plan (forward: two K/V blocks of 4 x 2 x 4 x 2 x 8
// floats and the running max and sum, 2 x 512 + 2 x 32 = 1088 floats;
// backward: four blocks and sum(dO * O), 4 x 512 + 32 = 2080); the loss
// sums the shares over "cp" and the gradients are reduced over "dp-cp".
// The K/V blocks travel in f32 (kv_format 0, the last iattr).

// CHECK: rt.buffer @tokens : memref<4x2xi32> {global_shape = array<i64: 8, 2>, kind = "input", offset = {{.*}}, shard_axis = "cp", shard_dim = 0 : i64, vocab_size = 257 : i64}
// CHECK: rt.buffer @labels : memref<4x2xi32> {global_shape = array<i64: 8, 2>, kind = "input", offset = {{.*}}, shard_axis = "cp", shard_dim = 0 : i64, vocab_size = 257 : i64}
// CHECK-LABEL: func.func @microbatch
// CHECK: %[[W:.*]] = rt.alloc offset {{.*}} : memref<1088xf32>
// CHECK: rt.add_position_embedding {{.*}} {group = "cp"} : memref<4x2x32xf32>, memref<8x32xf32>, memref<4x2x32xf32>
// CHECK: rt.dropout {{.*}} {group = "cp", iattrs = array<i64: 0>, value = 1.000000e-01 : f32}
// CHECK: rt.ring_attention %{{.*}}, %[[W]], %{{.*}}, %{{.*}} {group = "cp", iattrs = array<i64: 4, 1, 0>} : memref<4x2x96xf32>, memref<1088xf32>, memref<4x2x32xf32>, memref<4x2x4xf32>
// CHECK: rt.token_count %{{.*}}, %[[N:.*]] {iattrs = array<i64: -100>} : memref<4x2xi32>, memref<f32>
// CHECK-NEXT: rt.all_reduce %[[N]] {group = "cp"} : memref<f32>
// CHECK-NEXT: rt.token_mean_over %{{.*}}, %{{.*}}, %[[N]], %{{.*}} {iattrs = array<i64: -100>}
// CHECK: rt.all_reduce %{{.*}} {group = "cp"} : memref<f32>
// CHECK: rt.token_mean_over_grad %{{.*}}, %{{.*}}, %[[N]], %{{.*}} {iattrs = array<i64: -100>}
// CHECK: rt.ring_attention_grad {{.*}} {group = "cp", iattrs = array<i64: 4, 1, 0>} : memref<4x2x96xf32>, memref<4x2x32xf32>, memref<4x2x4xf32>, memref<4x2x32xf32>, memref<2080xf32>, memref<4x2x96xf32>
// CHECK: rt.position_embedding_grad {{.*}} {beta = 1.000000e+00 : f32, group = "cp"} : memref<4x2x32xf32>, memref<8x32xf32>
// CHECK-LABEL: func.func @step
// CHECK: rt.all_reduce %{{.*}} {group = "dp-cp"}

// The distributed optimizer shards over dp-cp (4 ranks): its shard views
// are relative to that group and its collectives run over it.
// ZERO: rt.buffer @"gshard:{{.*}}" : memref<{{[0-9]+}}xf32> {kind = "view", {{.*}}rank_group = "dp-cp"
// ZERO-LABEL: func.func @step
// ZERO: rt.reduce_scatter {{.*}} {group = "dp-cp"}
// ZERO: rt.all_gather {{.*}} {group = "dp-cp"}

// Under bf16 activations QKV is a bf16 activation widened for the kernel:
// the K/V blocks travel in bf16 (kv_format 1), forward and backward, in
// the same workspace (one f32 block and two bf16 ones in the place of two
// f32 blocks).
// BF16-LABEL: func.func @microbatch
// BF16: rt.cast %{{.*}}, %[[QKV:[0-9]+]] : memref<4x2x96xbf16>, memref<4x2x96xf32>
// BF16-NEXT: rt.ring_attention %[[QKV]], {{.*}} {group = "cp", iattrs = array<i64: 4, 1, 1>} : memref<4x2x96xf32>, memref<1088xf32>
// BF16: rt.ring_attention_grad {{.*}} {group = "cp", iattrs = array<i64: 4, 1, 1>} : memref<4x2x96xf32>, {{.*}}, memref<2080xf32>
