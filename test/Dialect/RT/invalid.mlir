// RUN: tessera-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{attribute 'kind' failed to satisfy constraint: buffer kind: param, grad, main_param, opt_state, input, loss, iteration, activation, view, metric or param_shard}}
rt.buffer @w : memref<4x8xf32> {kind = "weights", offset = 0 : i64}

// -----

// expected-error @+1 {{of kind 'grad' must name its parameter with 'of'}}
rt.buffer @g : memref<4x8xf32> {kind = "grad", offset = 0 : i64}

// -----

// expected-error @+1 {{is saved for the weight gradients (for_weight_grad), which needs kind 'activation'}}
rt.buffer @dy : memref<4x8xf32> {kind = "input", offset = 0 : i64, for_weight_grad}

// -----

// expected-error @+1 {{of kind 'param_shard' must name its bucket view with 'of' and the group that splits it with 'rank_group' (and no rank_stride)}}
rt.buffer @"pshard:b:0" : memref<64xf32> {kind = "param_shard", offset = 0 : i64, rank_group = "dp"}

// -----

// expected-error @+1 {{of kind 'param_shard' must name its bucket view with 'of' and the group that splits it with 'rank_group' (and no rank_stride)}}
rt.buffer @"pshard:b:0" : memref<64xf32> {kind = "param_shard", of = @"pbuf:b:0", offset = 0 : i64, rank_group = "dp", rank_stride = 256 : i64}

// -----

// expected-error @+1 {{is staged, which only parameters and their bucket views are}}
rt.buffer @"grad:w" : memref<4xf32> {kind = "grad", of = @w, offset = 0 : i64, staged}

// -----

// expected-error @+1 {{needs a statically shaped memref type}}
rt.buffer @w : memref<?x8xf32> {kind = "param", offset = 0 : i64}

// -----

rt.buffer @w : memref<4x8xf32> {kind = "param", offset = 0 : i64}
func.func @f() {
  // expected-error @+1 {{type 'memref<8x4xf32>' differs from buffer type 'memref<4x8xf32>'}}
  %w = rt.get @w : memref<8x4xf32>
  return
}

// -----

rt.buffer @s : memref<4xf32> {kind = "param", offset = 0 : i64, staged}
func.func @f() {
  // expected-error @+1 {{reads @s, which is staged (ZeRO-3: its value lives in its bucket's param_shard, not in the arena)}}
  %s = rt.get @s : memref<4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{refers to unknown buffer @nope}}
  %w = rt.get @nope : memref<8x4xf32>
  return
}

// -----

func.func @f(%a: memref<2x8xf32>, %b: memref<4x8xf32>, %c: memref<2x5xf32>) {
  // expected-error @+1 {{shapes do not form a product}}
  rt.gemm %a, %b, %c {trans_b} : memref<2x8xf32>, memref<4x8xf32>, memref<2x5xf32>
  return
}

// -----

func.func @f(%a: memref<2x8xf32>) {
  // expected-error @+1 {{takes 2 buffers, got 1}}
  rt.gelu %a : memref<2x8xf32>
  return
}

// -----

func.func @f(%a: memref<8xf32>, %b: memref<4xbf16>) {
  // expected-error @+1 {{converts between float buffers of the same size, got 'memref<8xf32>' and 'memref<4xbf16>'}}
  rt.cast %a, %b : memref<8xf32>, memref<4xbf16>
  return
}

// -----

func.func @f(%x: memref<8xf32>) {
  // expected-error @+1 {{attribute 'reduction' failed to satisfy constraint: reduction: sum or max}}
  rt.all_reduce %x {group = "dp", reduction = "mean"} : memref<8xf32>
  return
}

// -----

func.func @f(%x: memref<4x8xf32>, %w: memref<6x8xf32>, %g: memref<8x8xf32>, %c: memref<8x8xf32>) {
  // expected-error @+1 {{shapes do not form a product: 'memref<8x8xf32>' x 'memref<6x8xf32>' -> 'memref<8x8xf32>'}}
  rt.all_gather_gemm %x, %w, %g, %c {group = "tp", trans_b} : memref<4x8xf32>, memref<6x8xf32>, memref<8x8xf32>, memref<8x8xf32>
  return
}

// -----

func.func @f(%x: memref<4x8xbf16>, %w: memref<6x8xf32>, %g: memref<8x8xbf16>, %c: memref<8x6xf32>) {
  // expected-error @+1 {{buffers 0 (X) and 1 (B) must be the same float type (f32, bf16 or f16), got 'memref<4x8xbf16>' and 'memref<6x8xf32>'}}
  rt.all_gather_gemm %x, %w, %g, %c {group = "tp", trans_b} : memref<4x8xbf16>, memref<6x8xf32>, memref<8x8xbf16>, memref<8x6xf32>
  return
}

// -----

func.func @f(%a: memref<8x8xf32>, %w: memref<6x8xf32>, %ws: memref<8xf32>, %y: memref<4x6xf32>) {
  // expected-error @+1 {{workspace 'memref<8xf32>' holds fewer than three output blocks}}
  rt.gemm_reduce_scatter %a, %w, %ws, %y {group = "tp", trans_b} : memref<8x8xf32>, memref<6x8xf32>, memref<8xf32>, memref<4x6xf32>
  return
}

// -----

func.func @f(%a: memref<8x8xf32>, %w: memref<6x8xf32>, %ws: memref<72xf32>, %y: memref<3x6xf32>) {
  // expected-error @+1 {{output 'memref<3x6xf32>' is not a block of rows of the product of 'memref<8x8xf32>' and 'memref<6x8xf32>'}}
  rt.gemm_reduce_scatter %a, %w, %ws, %y {group = "tp", trans_b} : memref<8x8xf32>, memref<6x8xf32>, memref<72xf32>, memref<3x6xf32>
  return
}

// -----

func.func @f(%a: memref<8xf32>, %w: memref<6x8xf32>, %ws: memref<72xf32>, %y: memref<4x6xf32>) {
  // expected-error @+1 {{expects buffers of rank >= 2}}
  rt.gemm_reduce_scatter %a, %w, %ws, %y {group = "tp", trans_b} : memref<8xf32>, memref<6x8xf32>, memref<72xf32>, memref<4x6xf32>
  return
}

// -----

func.func @f(%a: memref<8x5xf32>, %w: memref<6x8xf32>, %ws: memref<72xf32>, %y: memref<4x6xf32>) {
  // expected-error @+1 {{shapes do not form a product: 'memref<8x5xf32>' x 'memref<6x8xf32>'}}
  rt.gemm_reduce_scatter %a, %w, %ws, %y {group = "tp", trans_b} : memref<8x5xf32>, memref<6x8xf32>, memref<72xf32>, memref<4x6xf32>
  return
}
