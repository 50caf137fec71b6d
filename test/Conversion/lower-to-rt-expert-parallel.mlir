// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 4 --moe-router-topk 2 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="ep=2 dp=4 micro-batch-size=2" | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="ep=2 dp=4 micro-batch-size=2 distributed-optimizer=1" | FileCheck %s --check-prefix=ZERO

// Expert parallelism in the rt program: the experts' weights are this
// rank's half (shard_axis "ep"); the exchanges stage the rows in a
// workspace from the memory plan (2 x 16 rows of 16); the experts'
// gradients live in their own buffer, all-reduced over "edp" (2 ranks at
// ep 2 x dp 4) after the 1/dp scale, the dense ones over "dp".

// CHECK: rt.buffer @decoder.layers.0.mlp.experts.linear_fc1.weight : memref<2x64x16xf32> {global_shape = array<i64: 4, 64, 16>, {{.*}}shard_axis = "ep", shard_dim = 0 : i64}
// CHECK: dist.grad_buffer @gbuf_experts {{.*}}dp = 2 : i64, {{.*}}group = "edp"
// CHECK-LABEL: func.func @microbatch
// CHECK: rt.expert_dispatch %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "ep", iattrs = array<i64: 4>} : memref<16x16xf32>, memref<4xi32>, memref<32x16xf32>, memref<2xi32>, memref<2x2xi32>, memref<512xf32>
// CHECK: rt.expert_combine %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "ep", iattrs = array<i64: 4>} : memref<32x16xf32>, memref<2x2xi32>, memref<4xi32>, memref<16x16xf32>, memref<512xf32>
// CHECK-LABEL: func.func @step
// CHECK-DAG: rt.all_reduce %{{.*}} {group = "dp"}
// CHECK-DAG: rt.all_reduce %{{.*}} {group = "edp"}

// With the distributed optimizer the experts' buffer is sharded over edp.
// ZERO: rt.buffer @"gshard:gbuf_experts:0" : {{.*}}rank_group = "edp"
// ZERO-LABEL: func.func @step
// ZERO-DAG: rt.reduce_scatter %{{.*}}, %{{.*}} {group = "edp"}
// ZERO-DAG: rt.all_gather %{{.*}}, %{{.*}} {group = "edp"}
