// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 3 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="micro-batch-size=2 global-batch-size=4" | FileCheck %s

// The MoE layer in the rt program: one kernel per op; the probabilities
// the scaler (add_aux_loss, an identity) returns are the router's own
// buffer; the grouped GEMMs' weight gradients accumulate into the grad
// buffers with beta 1 over the two microbatches.

// CHECK: rt.buffer @"grad:decoder.layers.0.mlp.experts.linear_fc1.weight" : memref<3x64x16xf32> {kind = "grad"
// CHECK-LABEL: func.func @microbatch
// CHECK: %[[G1:.*]] = rt.get @"grad:decoder.layers.0.mlp.experts.linear_fc1.weight"
// CHECK: %[[G2:.*]] = rt.get @"grad:decoder.layers.0.mlp.experts.linear_fc2.weight"
// CHECK: rt.moe_router %[[L:.*]], %[[P:.*]], %[[I:.*]] : memref<4x2x3xf32>, memref<4x2x2xf32>, memref<4x2x2xi32>
// CHECK-NEXT: rt.moe_aux_loss %[[L]], %[[I]], %{{.*}} {value = 0.00999999977 : f32}
// CHECK-NEXT: rt.moe_dispatch %{{.*}}, %[[I]], %[[ROWS:.*]], %[[C:.*]] : memref<4x2x16xf32>, memref<4x2x2xi32>, memref<16x16xf32>, memref<3xi32>
// CHECK-NEXT: rt.grouped_linear %[[ROWS]], %[[C]], %{{.*}}, %{{.*}} : memref<16x16xf32>, memref<3xi32>, memref<3x64x16xf32>, memref<16x64xf32>
// CHECK: rt.grouped_linear %{{.*}}, %[[C]], %{{.*}}, %[[Y:.*]] : memref<16x64xf32>, memref<3xi32>, memref<3x16x64xf32>, memref<16x16xf32>
// CHECK-NEXT: rt.moe_combine %[[Y]], %[[P]], %[[I]], %{{.*}} {iattrs = array<i64: 3>}
// CHECK: rt.moe_combine_grad %[[Y]], %[[P]], %[[I]], {{.*}} {iattrs = array<i64: 3>}
// CHECK: rt.grouped_linear_grad {{.*}}, %[[G2]] {beta = 1.000000e+00 : f32}
// CHECK: rt.grouped_linear_grad {{.*}}, %[[G1]] {beta = 1.000000e+00 : f32}
// CHECK: rt.moe_dispatch_grad {{.*}} {iattrs = array<i64: 3>}
// CHECK: rt.moe_aux_loss_grad %[[L]], %[[I]], {{.*}} {value = 0.00999999977 : f32}
// CHECK: rt.moe_router_grad %[[P]], %[[I]], {{.*}} : memref<4x2x2xf32>, memref<4x2x2xi32>, memref<4x2x2xf32>, memref<4x2x3xf32>

// Under sequence parallelism (tp = 2) the loss takes all tp ranks' counts:
// MoETokenCounts, an all-reduce over tp, then MoEAuxLossOver and its
// backward with the counts after dy.
// RUN: tessera-opt %t.mlir --tessera-train-pipeline="tp=2 sequence-parallel=1 micro-batch-size=2 global-batch-size=4 make-vocab-size-divisible-by=1" | FileCheck %s --check-prefix=SP
// SP: rt.moe_token_counts %[[I:.*]], %[[C:.*]] : memref<2x2x2xi32>, memref<3xf32>
// SP-NEXT: rt.all_reduce %[[C]] {group = "tp"}
// SP-NEXT: rt.moe_aux_loss_over %{{.*}}, %[[I]], %[[C]], %{{.*}} {value = 0.00999999977 : f32}
// SP: rt.moe_aux_loss_over_grad %{{.*}}, %[[I]], %{{.*}}, %[[C]], %{{.*}} {value = 0.00999999977 : f32}
