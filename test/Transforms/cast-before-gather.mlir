// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-mixed-precision --tessera-autodiff --tessera-cast-before-gather | FileCheck %s
// RUN: tessera-opt %s --split-input-file --tessera-cast-before-gather | FileCheck %s --check-prefix=KEEP

// Under bf16 GEMMs every sequence-parallel gather (the forward's before the
// column-parallel GEMMs and the LM head, the backward's before the
// row-parallel input gradients) carries the bf16 rows: the cast of its
// input, gathered; no f32 gather feeds a cast any more.
// CHECK: %[[X16:.*]] = nn.cast %{{.*}} {nn.layer = 0 : i64} : tensor<4x2x32xf32> to tensor<4x2x32xbf16>
// CHECK-NEXT: %[[G:.*]] = dist.all_gather %[[X16]] on @mesh "tp" dim 0 {{.*}}: tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>
// CHECK: nn.linear %[[G]]
// CHECK-COUNT-4: dist.all_gather {{.*}} : tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>
// CHECK-NOT: dist.all_gather {{.*}} : tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>

// -----

// What stays: a gather with a reader that is not a cast, casts to two
// types, a gather no one reads, a widening cast (it would gather more
// bytes).
dist.mesh @mesh {tp = 2, dp = 2}
// KEEP-LABEL: func.func @kept
func.func @kept(%x: tensor<4x8xf32>, %a16s: tensor<4x8xbf16>) -> (tensor<8x8xbf16>, tensor<8x8xf32>, tensor<8x8xbf16>, tensor<8x8xf16>, tensor<8x8xf32>) {
  // KEEP-NEXT: %[[A:.*]] = dist.all_gather %arg0 {{.*}} : tensor<4x8xf32> -> tensor<8x8xf32>
  // KEEP-NEXT: nn.cast %[[A]]
  %a = dist.all_gather %x on @mesh "tp" dim 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %a16 = nn.cast %a : tensor<8x8xf32> to tensor<8x8xbf16>
  // KEEP-NEXT: %[[B:.*]] = dist.all_gather %arg0 {{.*}} : tensor<4x8xf32> -> tensor<8x8xf32>
  // KEEP-NEXT: nn.cast %[[B]] {{.*}} to tensor<8x8xbf16>
  // KEEP-NEXT: nn.cast %[[B]] {{.*}} to tensor<8x8xf16>
  %b = dist.all_gather %x on @mesh "tp" dim 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %b16 = nn.cast %b : tensor<8x8xf32> to tensor<8x8xbf16>
  %bh = nn.cast %b : tensor<8x8xf32> to tensor<8x8xf16>
  // KEEP-NEXT: dist.all_gather %arg0 {{.*}} : tensor<4x8xf32> -> tensor<8x8xf32>
  %c = dist.all_gather %x on @mesh "dp" dim 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  // KEEP-NEXT: %[[D:.*]] = dist.all_gather %{{.*}} : tensor<4x8xbf16> -> tensor<8x8xbf16>
  // KEEP-NEXT: nn.cast %[[D]] : tensor<8x8xbf16> to tensor<8x8xf32>
  %d = dist.all_gather %a16s on @mesh "tp" dim 0 : tensor<4x8xbf16> -> tensor<8x8xbf16>
  %d32 = nn.cast %d : tensor<8x8xbf16> to tensor<8x8xf32>
  return %a16, %a, %b16, %bh, %d32 : tensor<8x8xbf16>, tensor<8x8xf32>, tensor<8x8xbf16>, tensor<8x8xf16>, tensor<8x8xf32>
}

// -----

// A gather along another dimension or over another group moves the cast
// the same way (exact for any gather).
dist.mesh @mesh {tp = 2, dp = 2}
// KEEP-LABEL: func.func @moved
// KEEP-NEXT: %[[C:.*]] = nn.cast %arg0 {nn.layer = 3 : i64} : tensor<4x8xf32> to tensor<4x8xbf16>
// KEEP-NEXT: %[[G:.*]] = dist.all_gather %[[C]] on @mesh "dp" dim 1 : tensor<4x8xbf16> -> tensor<4x16xbf16>
// KEEP-NEXT: return %[[G]], %[[G]]
func.func @moved(%x: tensor<4x8xf32>) -> (tensor<4x16xbf16>, tensor<4x16xbf16>) {
  %g = dist.all_gather %x on @mesh "dp" dim 1 : tensor<4x8xf32> -> tensor<4x16xf32>
  %c1 = nn.cast %g {nn.layer = 3} : tensor<4x16xf32> to tensor<4x16xbf16>
  %c2 = nn.cast %g : tensor<4x16xf32> to tensor<4x16xbf16>
  return %c1, %c2 : tensor<4x16xbf16>, tensor<4x16xbf16>
}
