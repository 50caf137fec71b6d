// RUN: tessera-opt %s -split-input-file -verify-diagnostics
//
// Every rt instruction op is verified against its opcode's row of the
// instruction contract (runtime/include/tessera/rt/Opcodes.def), the same
// rows the runtime's artifact loader checks: buffer count and element types,
// iattrs and float-attribute counts, and what the group may hold.

func.func @f(%x: memref<2x8xbf16>, %y: memref<2x8xf32>) {
  // expected-error @+1 {{buffer 0 (X) must be F32, got 'memref<2x8xbf16>'}}
  rt.gelu %x, %y : memref<2x8xbf16>, memref<2x8xf32>
  return
}

// -----

func.func @f(%ids: memref<4xf32>, %t: memref<10x8xf32>, %y: memref<4x8xf32>) {
  // expected-error @+1 {{buffer 0 (ids) must be I32, got 'memref<4xf32>'}}
  rt.embedding %ids, %t, %y {iattrs = array<i64: 10>} : memref<4xf32>, memref<10x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @f(%a: memref<2x8xbf16>, %b: memref<4x8xf32>, %c: memref<2x4xf32>) {
  // expected-error @+1 {{buffers 0 (A) and 1 (B) must be the same float type (f32, bf16 or f16), got 'memref<2x8xbf16>' and 'memref<4x8xf32>'}}
  rt.gemm %a, %b, %c {trans_b} : memref<2x8xbf16>, memref<4x8xf32>, memref<2x4xf32>
  return
}

// -----

// A 16-bit C takes A and B's format...
func.func @f(%a: memref<2x8xf32>, %b: memref<4x8xf32>, %c: memref<2x4xbf16>) {
  // expected-error @+1 {{result buffer 2 (C) must be f32 or the float type of its operands, got 'memref<2x4xbf16>'}}
  rt.gemm %a, %b, %c {trans_b} : memref<2x8xf32>, memref<4x8xf32>, memref<2x4xbf16>
  return
}

// -----

func.func @f(%a: memref<2x8xbf16>, %b: memref<4x8xbf16>, %c: memref<2x4xf16>) {
  // expected-error @+1 {{result buffer 2 (C) must be f32 or the float type of its operands, got 'memref<2x4xf16>'}}
  rt.gemm %a, %b, %c {trans_b} : memref<2x8xbf16>, memref<4x8xbf16>, memref<2x4xf16>
  return
}

// -----

// ... and is never accumulated into.
func.func @f(%a: memref<2x8xbf16>, %b: memref<4x8xbf16>, %c: memref<2x4xbf16>) {
  // expected-error @+1 {{accumulates (beta 1) into the 16-bit C 'memref<2x4xbf16>'; an accumulated result must be f32}}
  rt.gemm %a, %b, %c {trans_b, beta = 1.0 : f32} : memref<2x8xbf16>, memref<4x8xbf16>, memref<2x4xbf16>
  return
}

// -----

// The 16-bit GEMM writing its 16-bit result.
func.func @f(%a: memref<2x8xbf16>, %b: memref<4x8xbf16>, %c: memref<2x4xbf16>) {
  rt.gemm %a, %b, %c {trans_b} : memref<2x8xbf16>, memref<4x8xbf16>, memref<2x4xbf16>
  return
}

// -----

func.func @f(%x: memref<8xf32>, %y: memref<8xbf16>) {
  // expected-error @+1 {{buffers 'memref<8xf32>' and 'memref<8xbf16>' must have the same element type}}
  rt.scale %x, %y {alpha = 2.0 : f32} : memref<8xf32>, memref<8xbf16>
  return
}

// -----

func.func @f(%x: memref<8xi32>, %y: memref<8xf32>) {
  // expected-error @+1 {{buffer 0 (X) must be F32, BF16 or F16, got 'memref<8xi32>'}}
  rt.cast %x, %y : memref<8xi32>, memref<8xf32>
  return
}

// -----

func.func @f(%qkv: memref<4x2x24xf32>, %o: memref<4x2x8xf32>) {
  // expected-error @+1 {{takes 2 integer attributes (iattrs), got 1}}
  rt.attention %qkv, %o {iattrs = array<i64: 2>} : memref<4x2x24xf32>, memref<4x2x8xf32>
  return
}

// -----

func.func @f(%x: memref<3x8xf32>, %g: memref<8xf32>, %b: memref<8xf32>, %y: memref<3x8xf32>) {
  // expected-error @+1 {{takes 1 float attributes, got 0}}
  rt.layer_norm %x, %g, %b, %y : memref<3x8xf32>, memref<8xf32>, memref<8xf32>, memref<3x8xf32>
  return
}

// -----

func.func @f(%x: memref<4x2x24xi32>) {
  // expected-error @+1 {{operand #0 must be memref of 32-bit float or bfloat16 type or 16-bit float values, but got 'memref<4x2x24xi32>'}}
  rt.rotary_embedding %x, %x {num_heads = 2 : i64, rotary_dim = 4 : i64, base = 1.0e4 : f32} : memref<4x2x24xi32>, memref<4x2x24xi32>
  return
}

// -----

// RoPE in place on bf16 activations.
func.func @f(%x: memref<4x2x24xbf16>) {
  rt.rotary_embedding %x, %x {num_heads = 2 : i64, rotary_dim = 4 : i64, base = 1.0e4 : f32} : memref<4x2x24xbf16>, memref<4x2x24xbf16>
  return
}

// -----

func.func @f(%x: memref<3x8xf32>, %g: memref<8xf32>, %y: memref<3x8xf32>) {
  // expected-error @+1 {{takes 1 float attributes, got 0}}
  rt.rms_norm %x, %g, %y : memref<3x8xf32>, memref<8xf32>, memref<3x8xf32>
  return
}

// -----

func.func @f(%x: memref<3x8xf32>, %g: memref<8xf32>, %y: memref<3x8xf32>) {
  // expected-error @+1 {{takes 3 buffers, got 4}}
  rt.rms_norm %x, %g, %g, %y {value = 1.0e-5 : f32} : memref<3x8xf32>, memref<8xf32>, memref<8xf32>, memref<3x8xf32>
  return
}

// -----

func.func @f(%x: memref<8xf32>, %y: memref<8xf32>) {
  // expected-error @+1 {{takes no group, got 'tp'}}
  rt.gelu %x, %y {iattrs = array<i64: 0>, group = "tp"} : memref<8xf32>, memref<8xf32>
  return
}

// -----

func.func @f(%x: memref<8xf32>) {
  // expected-error @+1 {{runs over the pipeline group 'pp', not 'dp'}}
  rt.send %x {iattrs = array<i64: 1, 0>, group = "dp"} : memref<8xf32>
  return
}

// -----

func.func @f(%p: memref<8xf32>, %g: memref<8xf32>, %m: memref<8xf32>, %v: memref<8xf32>, %t: memref<i32>) {
  // expected-error @+1 {{operand #4 must be memref of 64-bit signless integer values}}
  rt.adam %p, %g, %m, %v, %t {lr = 1.0e-03 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-08 : f32, weight_decay = 0.0 : f32} : memref<8xf32>, memref<8xf32>, memref<8xf32>, memref<8xf32>, memref<i32>
  return
}

// -----

func.func @f(%x: memref<4xf32>, %y: memref<8xbf16>) {
  // expected-error @+1 {{buffers 'memref<4xf32>' and 'memref<8xbf16>' must have the same element type}}
  rt.all_gather %x, %y {group = "dp"} : memref<4xf32>, memref<8xbf16>
  return
}

// -----

func.func @f(%x: memref<8xf32>) {
  // expected-error @+1 {{needs a rank group}}
  rt.all_reduce %x {group = ""} : memref<8xf32>
  return
}

// -----

func.func @f(%p: memref<8xf32>, %g: memref<8xf32>, %m: memref<8xf32>, %v: memref<8xf32>, %t: memref<i64>) {
  // expected-error @+1 {{runs must be non-empty, ascending and disjoint, from 0}}
  rt.adam %p, %g, %m, %v, %t {lr = 1.0e-03 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-08 : f32, weight_decay = 0.1 : f32, runs = array<i64: 8, 4, 6, 5, 7>} : memref<8xf32>, memref<8xf32>, memref<8xf32>, memref<8xf32>, memref<i64>
  return
}

// -----

func.func @f(%g: memref<8xf32>) {
  // expected-error @+1 {{runs are [shard_elements] followed by [start, end) pairs}}
  rt.sgd %g, %g {lr = 1.0e-02 : f32, weight_decay = 0.1 : f32, runs = array<i64: 8, 4>} : memref<8xf32>, memref<8xf32>
  return
}

// -----

func.func @f(%g: memref<8xf32>, %s: memref<1xf32>) {
  // expected-error @+1 {{runs need shard_elements >= 1}}
  rt.sum_squares %g, %s {iattrs = array<i64: 0, 0, 4>} : memref<8xf32>, memref<1xf32>
  return
}

// -----

func.func @f(%s: memref<1xf32>) {
  // expected-error @+1 {{takes 1 float attributes, got 0}}
  rt.clip_grad_norm %s, %s, %s {iattrs = array<i64: 0>} : memref<1xf32>, memref<1xf32>, memref<1xf32>
  return
}

// -----

func.func @f(%p: memref<8xf32>, %b: memref<4xf32>) {
  // expected-error @+1 {{runs are [shard_elements] followed by [start, end) pairs}}
  rt.sgd_momentum %p, %p, %p {lr = 1.0e-02 : f32, weight_decay = 0.1 : f32, momentum = 0.9 : f32, runs = array<i64: 8, 2>} : memref<8xf32>, memref<8xf32>, memref<8xf32>
  return
}
