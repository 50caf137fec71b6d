// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// The fused collectives of --tp-comm-overlap round-trip.

dist.mesh @mesh {tp = 2}

// CHECK-LABEL: func.func @gather_linear
// CHECK: %{{.*}}, %{{.*}} = dist.all_gather_matmul %arg0, %arg1, %arg2 on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>, tensor<48xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
func.func @gather_linear(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>, %b: tensor<48xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>) {
  %g, %y = dist.all_gather_matmul %x, %w, %b on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>, tensor<48xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
  return %g, %y : tensor<8x2x32xf32>, tensor<8x2x48xf32>
}

// A stacked [2, F, H] weight (SwiGLU's fc1) is a [2F, H] matrix; bf16 rows.
// CHECK-LABEL: func.func @gather_stacked_bf16
// CHECK: dist.all_gather_matmul %arg0, %arg1 on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xbf16>, tensor<2x16x32xbf16>) -> (tensor<8x2x32xbf16>, tensor<8x2x32xf32>)
func.func @gather_stacked_bf16(%x: tensor<4x2x32xbf16>, %w: tensor<2x16x32xbf16>) -> tensor<8x2x32xf32> {
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xbf16>, tensor<2x16x32xbf16>) -> (tensor<8x2x32xbf16>, tensor<8x2x32xf32>)
  return %y : tensor<8x2x32xf32>
}

// CHECK-LABEL: func.func @matmul_scatter
// CHECK: dist.matmul_reduce_scatter %arg0, %arg1 on @mesh "tp" : (tensor<8x2x16xf32>, tensor<16x32xf32>) -> tensor<4x2x32xf32>
func.func @matmul_scatter(%a: tensor<8x2x16xf32>, %w: tensor<16x32xf32>) -> tensor<4x2x32xf32> {
  %y = dist.matmul_reduce_scatter %a, %w on @mesh "tp" : (tensor<8x2x16xf32>, tensor<16x32xf32>) -> tensor<4x2x32xf32>
  return %y : tensor<4x2x32xf32>
}
