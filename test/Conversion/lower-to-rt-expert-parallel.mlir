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
// CHECK: rt.expert_dispatch %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "ep", iattrs = array<i64: 4, 1>} : memref<16x16xf32>, memref<4xi32>, memref<32x16xf32>, memref<2xi32>, memref<2x2xi32>, memref<512xf32>
// CHECK: rt.expert_combine %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "ep", iattrs = array<i64: 4, 1>} : memref<32x16xf32>, memref<2x2xi32>, memref<4xi32>, memref<16x16xf32>, memref<512xf32>
// CHECK-LABEL: func.func @step
// CHECK-DAG: rt.all_reduce %{{.*}} {group = "dp"}
// CHECK-DAG: rt.all_reduce %{{.*}} {group = "edp"}

// With the distributed optimizer the experts' buffer is sharded over edp.
// ZERO: rt.buffer @"gshard:gbuf_experts:0" : {{.*}}rank_group = "edp"
// ZERO-LABEL: func.func @step
// ZERO-DAG: rt.reduce_scatter %{{.*}}, %{{.*}} {group = "edp"}
// ZERO-DAG: rt.all_gather %{{.*}}, %{{.*}} {group = "edp"}

// Expert tensor parallelism (ep = 2 x etp = 2): both of the experts'
// weights carry a second split over "etp" (fc1 by its output rows, dim 1;
// fc2 by its input columns, dim 2); the exchange runs over "etp-ep" with
// etp = 2, 4 x the rows on the experts' side, and the combine's workspace
// holds the etp partials (2 x 16 x 16) behind the 64 x 16 rows.
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="ep=2 etp=2 dp=4 micro-batch-size=2" | FileCheck %s --check-prefix=ETP
// ETP: rt.buffer @decoder.layers.0.mlp.experts.linear_fc1.weight : memref<2x32x16xf32> {global_shape = array<i64: 4, 64, 16>, {{.*}}shard2_axis = "etp", shard2_dim = 1 : i64, shard_axis = "ep", shard_dim = 0 : i64}
// ETP: rt.buffer @decoder.layers.0.mlp.experts.linear_fc2.weight : memref<2x16x32xf32> {global_shape = array<i64: 4, 16, 64>, {{.*}}shard2_axis = "etp", shard2_dim = 2 : i64, shard_axis = "ep", shard_dim = 0 : i64}
// ETP: dist.grad_buffer @gbuf_experts {{.*}}dp = 1 : i64, {{.*}}group = "edp"
// ETP-LABEL: func.func @microbatch
// ETP: rt.expert_dispatch {{.*}} {group = "etp-ep", iattrs = array<i64: 4, 2>} : memref<16x16xf32>, memref<4xi32>, memref<64x16xf32>, memref<2xi32>, memref<4x2xi32>, memref<1024xf32>
// ETP: rt.expert_combine {{.*}} {group = "etp-ep", iattrs = array<i64: 4, 2>} : memref<64x16xf32>, memref<4x2xi32>, memref<4xi32>, memref<16x16xf32>, memref<1536xf32>
