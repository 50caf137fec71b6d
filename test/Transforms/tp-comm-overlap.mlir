// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-autodiff --tessera-tp-comm-overlap | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-mixed-precision --tessera-autodiff --tessera-cast-before-gather --tessera-tp-comm-overlap | FileCheck %s --check-prefix=BF16
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-mixed-precision --tessera-bf16-activations --tessera-autodiff --tessera-cast-before-gather --tessera-tp-comm-overlap | FileCheck %s --check-prefix=BF16ACT
// RUN: tessera-opt %s --split-input-file --tessera-tp-comm-overlap | FileCheck %s --check-prefix=KEEP
// Megatron's --disable-tp-comm-overlap-ag and --disable-tp-comm-overlap-rs:
// one kind fused, the other left apart.
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-autodiff --tessera-tp-comm-overlap="all-gather=false" | FileCheck %s --check-prefix=NOAG
// NOAG-NOT: dist.all_gather_matmul
// NOAG: dist.all_gather
// NOAG: dist.matmul_reduce_scatter
// NOAG-NOT: dist.all_gather_matmul
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-autodiff --tessera-tp-comm-overlap="reduce-scatter=false" | FileCheck %s --check-prefix=NORS
// NORS-NOT: dist.matmul_reduce_scatter
// NORS: dist.all_gather_matmul
// NORS: dist.reduce_scatter
// NORS-NOT: dist.matmul_reduce_scatter

// Megatron's --tp-comm-overlap under sequence parallelism: each region's
// all-gather becomes one op with the column-parallel GEMM that reads it
// (the bias too), and each reduce-scatter one op with the row-parallel
// GEMM before it; the LM head's gathered input likewise.
// CHECK: %[[X:.*]] = nn.layer_norm {{.*}} : tensor<4x2x32xf32>
// CHECK-NEXT: %[[XG:.*]], %[[QKV:.*]] = dist.all_gather_matmul %[[X]], %arg6, %arg7 on @mesh "tp" {nn.layer = 0 : i64, transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>, tensor<48xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
// CHECK-NEXT: %[[CTX:.*]] = nn.attention %[[QKV]]
// CHECK-NEXT: dist.matmul_reduce_scatter %[[CTX]], %arg8 on @mesh "tp" {nn.layer = 0 : i64, transpose_rhs} : (tensor<8x2x16xf32>, tensor<32x16xf32>) -> tensor<4x2x32xf32>
// CHECK: dist.all_gather_matmul {{.*}} -> (tensor<8x2x32xf32>, tensor<8x2x64xf32>)
// CHECK: dist.matmul_reduce_scatter {{.*}} : (tensor<8x2x64xf32>, tensor<32x64xf32>) -> tensor<4x2x32xf32>
// CHECK: %[[HG:.*]], %[[LOGITS:.*]] = dist.all_gather_matmul %{{.*}}, %arg18 on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<256x32xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x256xf32>)
// The backward: the LM head's input gradient reduce-scattered with its
// GEMM (the weight gradient reads the gathered input the forward kept),
// the gradient gathered with the row-parallel linear's input-gradient
// GEMM, whose gathered rows the weight gradient reads too.
// CHECK: %[[DZ:.*]] = nn.cross_entropy_stats_grad
// CHECK-NEXT: nn.matmul %[[DZ]], %[[HG]] {transpose_lhs}
// CHECK-NEXT: dist.matmul_reduce_scatter %[[DZ]], %arg18 on @mesh "tp" : (tensor<8x2x256xf32>, tensor<256x32xf32>) -> tensor<4x2x32xf32>
// CHECK: %[[DG:.*]], %[[DA:.*]] = dist.all_gather_matmul %{{.*}}, %arg14 on @mesh "tp" : (tensor<4x2x32xf32>, tensor<32x64xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x64xf32>)
// CHECK-NEXT: nn.matmul %[[DG]], %{{.*}} {transpose_lhs}
// CHECK: dist.matmul_reduce_scatter {{.*}}, %arg12 on @mesh "tp" : (tensor<8x2x64xf32>, tensor<64x32xf32>) -> tensor<4x2x32xf32>
// CHECK: dist.all_gather_matmul {{.*}}, %arg8 on @mesh "tp" : (tensor<4x2x32xf32>, tensor<32x16xf32>)
// CHECK: dist.matmul_reduce_scatter {{.*}}, %arg6 on @mesh "tp" : (tensor<8x2x48xf32>, tensor<48x32xf32>) -> tensor<4x2x32xf32>
// The embeddings' scatter is undone by a gather no GEMM reads: it stays.
// CHECK: dist.gather_from_region
// CHECK-NOT: dist.all_gather {{.*}}"tp"
// CHECK-NOT: dist.reduce_scatter {{.*}}"tp"

// With bf16 GEMMs tessera-cast-before-gather has the gather carry the
// bf16 rows, which then fuses with the GEMM.
// BF16: %[[X16:.*]] = nn.cast %{{.*}} {nn.layer = 0 : i64} : tensor<4x2x32xf32> to tensor<4x2x32xbf16>
// BF16-NEXT: %[[B32:.*]] = nn.cast %arg7 : tensor<48xbf16> to tensor<48xf32>
// BF16-NEXT: dist.all_gather_matmul %[[X16]], %arg6, %[[B32]] on @mesh "tp" {nn.layer = 0 : i64, transpose_rhs} : (tensor<4x2x32xbf16>, tensor<48x32xbf16>, tensor<48xf32>) -> (tensor<8x2x32xbf16>, tensor<8x2x48xf32>)
// BF16-NOT: dist.all_gather {{.*}}"tp"

// -----

// What stays as it is: a GEMM whose partial sums another op reads too, or
// with a bias (summed over the group otherwise); a gather along another
// dimension or over another group; a GEMM that reads the gathered rows
// transposed (a weight gradient); a weight defined after another reader
// of the gathered rows.
dist.mesh @mesh {tp = 2, dp = 2}
// KEEP-LABEL: func.func @kept
func.func @kept(%x: tensor<4x2x8xf32>, %a: tensor<8x2x8xf32>, %w: tensor<8x8xf32>,
                %b: tensor<8xf32>) -> (tensor<4x2x8xf32>, tensor<8x2x8xf32>, tensor<4x2x8xf32>,
                                       tensor<4x4x8xf32>, tensor<8x8xf32>, tensor<8x2x8xf32>, tensor<8x2x8xf32>) {
  // KEEP: nn.linear
  // KEEP-NEXT: dist.reduce_scatter
  %p = nn.linear %a, %w : (tensor<8x2x8xf32>, tensor<8x8xf32>) -> tensor<8x2x8xf32>
  %r = dist.reduce_scatter %p on @mesh "tp" dim 0 : tensor<8x2x8xf32> -> tensor<4x2x8xf32>
  // KEEP-NEXT: nn.linear
  // KEEP-NEXT: dist.reduce_scatter
  %pb = nn.linear %a, %w, %b : (tensor<8x2x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<8x2x8xf32>
  %rb = dist.reduce_scatter %pb on @mesh "tp" dim 0 : tensor<8x2x8xf32> -> tensor<4x2x8xf32>
  // KEEP-NEXT: dist.all_gather {{.*}} dim 1
  // KEEP-NEXT: nn.linear
  %g1 = dist.all_gather %x on @mesh "tp" dim 1 : tensor<4x2x8xf32> -> tensor<4x4x8xf32>
  %y1 = nn.linear %g1, %w : (tensor<4x4x8xf32>, tensor<8x8xf32>) -> tensor<4x4x8xf32>
  // KEEP-NEXT: dist.all_gather {{.*}} "dp" dim 0
  // KEEP-NEXT: nn.matmul
  %g2 = dist.all_gather %x on @mesh "dp" dim 0 : tensor<4x2x8xf32> -> tensor<8x2x8xf32>
  %dw = nn.matmul %g2, %a {transpose_lhs} : (tensor<8x2x8xf32>, tensor<8x2x8xf32>) -> tensor<8x8xf32>
  // KEEP-NEXT: dist.all_gather {{.*}} "tp" dim 0
  // KEEP-NEXT: nn.gelu
  // KEEP-NEXT: nn.scale
  // KEEP-NEXT: nn.linear
  %g3 = dist.all_gather %x on @mesh "tp" dim 0 : tensor<4x2x8xf32> -> tensor<8x2x8xf32>
  %e = nn.gelu %g3 : tensor<8x2x8xf32>
  %w2 = nn.scale %w {factor = 2.0 : f32} : tensor<8x8xf32>
  %y3 = nn.linear %g3, %w2 : (tensor<8x2x8xf32>, tensor<8x8xf32>) -> tensor<8x2x8xf32>
  return %r, %p, %rb, %y1, %dw, %e, %y3 : tensor<4x2x8xf32>, tensor<8x2x8xf32>, tensor<4x2x8xf32>, tensor<4x4x8xf32>, tensor<8x8xf32>, tensor<8x2x8xf32>, tensor<8x2x8xf32>
}

// -----

// A weight defined after the gather but before its other readers: the
// fused op goes where the weight is.
dist.mesh @mesh {tp = 2}
// KEEP-LABEL: func.func @late_weight
// KEEP-NEXT: %[[W2:.*]] = nn.scale
// KEEP-NEXT: %[[G:.*]], %{{.*}} = dist.all_gather_matmul %arg0, %[[W2]]
// KEEP-NEXT: nn.gelu %[[G]]
func.func @late_weight(%x: tensor<4x2x8xf32>, %w: tensor<8x8xf32>) -> (tensor<8x2x8xf32>, tensor<8x2x8xf32>) {
  %g = dist.all_gather %x on @mesh "tp" dim 0 : tensor<4x2x8xf32> -> tensor<8x2x8xf32>
  %w2 = nn.scale %w {factor = 2.0 : f32} : tensor<8x8xf32>
  %e = nn.gelu %g : tensor<8x2x8xf32>
  %y = nn.linear %g, %w2 : (tensor<8x2x8xf32>, tensor<8x8xf32>) -> tensor<8x2x8xf32>
  return %e, %y : tensor<8x2x8xf32>, tensor<8x2x8xf32>
}

// bf16 activations: the reduce-scatter reads the GEMM's partial sums
// rounded to bf16; the fused op's ring carries the f32 partial sums and
// its result is rounded once, after the sum (forward and backward), and
// no plain sequence reduce-scatter is left.
// BF16ACT: %[[RS:.*]] = dist.matmul_reduce_scatter %{{.*}}, %arg8 on @mesh "tp" {nn.layer = 0 : i64, transpose_rhs} : (tensor<8x2x16xbf16>, tensor<32x16xbf16>) -> tensor<4x2x32xf32>
// BF16ACT-NEXT: nn.cast %[[RS]] {nn.layer = 0 : i64, nn.stored_activation} : tensor<4x2x32xf32> to tensor<4x2x32xbf16>
// BF16ACT: %[[RS2:.*]] = dist.matmul_reduce_scatter %{{.*}}, %arg6 on @mesh "tp" : (tensor<8x2x48xbf16>, tensor<48x32xbf16>) -> tensor<4x2x32xf32>
// BF16ACT-NEXT: nn.cast %[[RS2]]{{.*}} : tensor<4x2x32xf32> to tensor<4x2x32xbf16>
// BF16ACT-NOT: dist.reduce_scatter {{.*}}"tp" dim 0
