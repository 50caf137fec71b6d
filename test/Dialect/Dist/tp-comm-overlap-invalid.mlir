// RUN: tessera-opt %s -split-input-file -verify-diagnostics
// The fused collectives of --tp-comm-overlap check their shapes, types and
// group.

dist.mesh @mesh {tp = 2}
func.func @gathered_not_times_group(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op dim 0 of size 4 becomes 4, expected times the group size 2}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>) -> (tensor<4x2x32xf32>, tensor<4x2x48xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @inner_dimension(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op multiplies rows of 32 features by 'tensor<48x32xf32>', which has 48 rows}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" : (tensor<4x2x32xf32>, tensor<48x32xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x32xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @result_not_product(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op result 'tensor<16x48xf32>' must be the product 'tensor<8x2x48xf32>'}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>) -> (tensor<8x2x32xf32>, tensor<16x48xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @mixed_types(%x: tensor<4x2x32xbf16>, %w: tensor<48x32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op multiplies 'tensor<8x2x32xbf16>' by 'tensor<48x32xf32>': both f32, or both bf16 or f16}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xbf16>, tensor<48x32xf32>) -> (tensor<8x2x32xbf16>, tensor<8x2x48xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bias_size(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>, %b: tensor<32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op bias 'tensor<32xf32>' must be 48 f32 values}}
  %g, %y = dist.all_gather_matmul %x, %w, %b on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>, tensor<32xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @unknown_group(%x: tensor<4x2x32xf32>, %w: tensor<48x32xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op names an invalid rank group}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "xx" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xf32>) -> (tensor<8x2x32xf32>, tensor<8x2x48xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @scatter_not_divided(%a: tensor<8x2x16xf32>, %w: tensor<16x32xf32>) {
  // expected-error @+1 {{'dist.matmul_reduce_scatter' op dim 0 of size 8 becomes 8, expected divided by the group size 2}}
  %y = dist.matmul_reduce_scatter %a, %w on @mesh "tp" : (tensor<8x2x16xf32>, tensor<16x32xf32>) -> tensor<8x2x32xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @scatter_features(%a: tensor<8x2x16xf32>, %w: tensor<16x32xf32>) {
  // expected-error @+1 {{'dist.matmul_reduce_scatter' op result shape 'tensor<4x2x16xf32>' differs from input 'tensor<8x2x32xf32>' outside dim 0}}
  %y = dist.matmul_reduce_scatter %a, %w on @mesh "tp" : (tensor<8x2x16xf32>, tensor<16x32xf32>) -> tensor<4x2x16xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @scatter_bf16_result(%a: tensor<8x2x16xbf16>, %w: tensor<16x32xbf16>) {
  // expected-error @+1 {{'dist.matmul_reduce_scatter' op result 'tensor<4x2x32xbf16>' must be f32}}
  %y = dist.matmul_reduce_scatter %a, %w on @mesh "tp" : (tensor<8x2x16xbf16>, tensor<16x32xbf16>) -> tensor<4x2x32xbf16>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @vector_rows(%x: tensor<4xf32>, %w: tensor<8x8xf32>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op needs static operands of rank 2 or more, got 'tensor<8xf32>' and 'tensor<8x8xf32>'}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" : (tensor<4xf32>, tensor<8x8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @gathered_type(%x: tensor<4x2x32xf32>, %w: tensor<48x32xbf16>) {
  // expected-error @+1 {{'dist.all_gather_matmul' op gathers 'tensor<4x2x32xf32>' into 'tensor<8x2x32xbf16>' of another element type}}
  %g, %y = dist.all_gather_matmul %x, %w on @mesh "tp" {transpose_rhs} : (tensor<4x2x32xf32>, tensor<48x32xbf16>) -> (tensor<8x2x32xbf16>, tensor<8x2x48xf32>)
  return
}
