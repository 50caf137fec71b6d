// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.mlir
// RUN: tessera-compile %t.mlir --tp 2 --sequence-parallel --tp-comm-overlap --micro-batch-size 2 --global-batch-size 2 --make-vocab-size-divisible-by 128 --emit=mlir -o - | FileCheck %s
// RUN: tessera-compile %t.mlir --tp 2 --sequence-parallel --micro-batch-size 2 --global-batch-size 2 --make-vocab-size-divisible-by 128 --emit=mlir -o - | FileCheck %s --check-prefix=PLAIN

// --tp-comm-overlap's fused ops as instructions: the gather's GEMM writes
// the product, the bias follows (as a linear's); the reduce-scatter's GEMM
// gets a workspace of three output blocks (2 x 4 x 32 floats each: one
// block computed while the other travels, and the one that arrives). The
// step's FLOPs are the unfused program's.
// CHECK: func.func @microbatch() attributes {{{.*}}rt.flops = 1442562 : i64
// CHECK: rt.all_gather_gemm %{{.*}}, %{{.*}}, %{{.*}}, %[[QKV:.*]] {group = "tp", trans_b} : memref<4x2x32xf32>, memref<48x32xf32>, memref<8x2x32xf32>, memref<8x2x48xf32>
// CHECK-NEXT: rt.bias_add %[[QKV]], %{{.*}}, %[[QKV]] : memref<8x2x48xf32>, memref<48xf32>, memref<8x2x48xf32>
// CHECK: rt.gemm_reduce_scatter %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "tp", trans_b} : memref<8x2x16xf32>, memref<32x16xf32>, memref<768xf32>, memref<4x2x32xf32>
// The backward's: no transposes (dX = dY W).
// CHECK: rt.gemm_reduce_scatter %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "tp"} : memref<8x2x256xf32>, memref<256x32xf32>, memref<768xf32>, memref<4x2x32xf32>
// CHECK: rt.all_gather_gemm %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {group = "tp"} : memref<4x2x32xf32>, memref<32x64xf32>, memref<8x2x32xf32>, memref<8x2x64xf32>
// PLAIN: func.func @microbatch() attributes {{{.*}}rt.flops = 1442562 : i64
// PLAIN-NOT: all_gather_gemm
// PLAIN-NOT: gemm_reduce_scatter
// CHECK-LABEL: func.func @eval

// With --overlap-param-gather and a bucket per weight, a bucket's wait
// comes right before its first reader, the fused GEMM: the fused op never
// moves above it (its weight is complete only after the wait).
// RUN: tessera-compile %t.mlir --tp 2 --dp 2 --sequence-parallel --tp-comm-overlap --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bucket-size 1000 --micro-batch-size 2 --global-batch-size 4 --make-vocab-size-divisible-by 128 --emit=mlir -o - | FileCheck %s --check-prefix=SYNC
// SYNC-LABEL: func.func @microbatch()
// SYNC: rt.layer_norm
// SYNC-NEXT: rt.param_sync_wait {sync = 3 : i64}
// SYNC-NEXT: rt.all_gather_gemm %{{.*}} : memref<4x2x32xf32>, memref<48x32xf32>, memref<8x2x32xf32>, memref<8x2x48xf32>
// SYNC: rt.param_sync_wait {sync = 2 : i64}
// SYNC-NEXT: rt.all_gather_gemm %{{.*}} : memref<4x2x32xf32>, memref<64x32xf32>, memref<8x2x32xf32>, memref<8x2x64xf32>
// SYNC: rt.param_sync_wait {sync = 0 : i64}
// SYNC-NEXT: rt.all_gather_gemm %{{.*}} : memref<4x2x32xf32>, memref<256x32xf32>, memref<8x2x32xf32>, memref<8x2x256xf32>
