// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @linear_features(%x: tensor<8x128xf32>, %w: tensor<16x256xf32>) {
  // expected-error @+1 {{input features (128) do not match the weight's in-features (256)}}
  %y = nn.linear %x, %w : (tensor<8x128xf32>, tensor<16x256xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @linear_mixed(%x: tensor<8x256xf32>, %w: tensor<16x256xbf16>) {
  // expected-error @+1 {{'nn.linear' op operands must be both f32, both bf16 or both f16, got 'tensor<8x256xf32>' and 'tensor<16x256xbf16>' (cast one with nn.cast)}}
  %y = nn.linear %x, %w : (tensor<8x256xf32>, tensor<16x256xbf16>) -> tensor<8x16xf32>
  return
}

// -----

func.func @matmul_mixed(%a: tensor<8x16xbf16>, %b: tensor<16x32xf32>) {
  // expected-error @+1 {{'nn.matmul' op operands must be both f32, both bf16 or both f16, got 'tensor<8x16xbf16>' and 'tensor<16x32xf32>' (cast one with nn.cast)}}
  %c = nn.matmul %a, %b : (tensor<8x16xbf16>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<8x256xf32>, %w: tensor<16x256xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{bias must be of shape [16] (the weight's without its in-features), got 'tensor<8xf32>'}}
  %y = nn.linear %x, %w, %b : (tensor<8x256xf32>, tensor<16x256xf32>, tensor<8xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @linear_stacked_bias(%x: tensor<8x256xf32>, %w: tensor<2x16x256xf32>, %b: tensor<32xf32>) {
  // expected-error @+1 {{bias must be of shape [2, 16] (the weight's without its in-features), got 'tensor<32xf32>'}}
  %y = nn.linear %x, %w, %b : (tensor<8x256xf32>, tensor<2x16x256xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  return
}

// -----

func.func @linear_weight_rank(%x: tensor<8x256xf32>, %w: tensor<2x2x16x256xf32>) {
  // expected-error @+1 {{'nn.linear' op expects a [out, in] or stacked [k, out, in] weight, got 'tensor<2x2x16x256xf32>'}}
  %y = nn.linear %x, %w : (tensor<8x256xf32>, tensor<2x2x16x256xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @matmul_view(%a: tensor<8x32xf32>, %b: tensor<8x16xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'nn.matmul' op inferred type(s) 'tensor<32x16xf32>' are incompatible with return type(s) of operation 'tensor<2x8x32xf32>'}}
  %c = nn.matmul %a, %b {transpose_lhs} : (tensor<8x32xf32>, tensor<8x16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

func.func @reduce_rows_size(%a: tensor<8x32xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'nn.reduce_rows' op inferred type(s) 'tensor<32xf32>' are incompatible with return type(s) of operation 'tensor<2x8xf32>'}}
  %c = nn.reduce_rows %a : (tensor<8x32xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @swiglu_odd(%x: tensor<8x33xf32>) {
  // expected-error @+1 {{'nn.swiglu' op expects a [..., 2n] input (the gate and up projections stacked), got 'tensor<8x33xf32>'}}
  %y = nn.swiglu %x : (tensor<8x33xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @swiglu_grad_shape(%x: tensor<8x32xf32>, %dy: tensor<8x32xf32>) {
  // expected-error @+1 {{'nn.swiglu_grad' op result_grad 'tensor<8x32xf32>' must have the forward result's shape (the input's with half its last dimension)}}
  %dx = nn.swiglu_grad %x, %dy : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  return
}

// -----

func.func @linear_result(%x: tensor<8x256xf32>, %w: tensor<16x256xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'nn.linear' op inferred type(s) 'tensor<8x16xf32>' are incompatible with return type(s) of operation 'tensor<8x32xf32>'}}
  %y = nn.linear %x, %w : (tensor<8x256xf32>, tensor<16x256xf32>) -> tensor<8x32xf32>
  return
}

// -----

func.func @bias_add(%x: tensor<8x16xf32>, %b: tensor<32xf32>) {
  // expected-error @+1 {{expects a [..., n] input and a [n] bias}}
  %y = nn.bias_add %x, %b : (tensor<8x16xf32>, tensor<32xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @labels(%z: tensor<8x16xf32>, %t: tensor<4xi32>) {
  // expected-error @+1 {{labels must hold one label per row of the logits}}
  %l = nn.softmax_cross_entropy %z, %t : (tensor<8x16xf32>, tensor<4xi32>) -> tensor<8xf32>
  return
}

// -----

func.func @matmul(%a: tensor<8x16xf32>, %b: tensor<8x256xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{nn.matmul contraction sizes differ: 16 vs 8}}
  %c = nn.matmul %a, %b : (tensor<8x16xf32>, tensor<8x256xf32>) -> tensor<8x256xf32>
  return
}

// -----

func.func @cast_shape(%x: tensor<4x8xbf16>) {
  // expected-error @+1 {{'nn.cast' op changes the shape: 'tensor<4x8xbf16>' to 'tensor<8x4xf32>'}}
  %y = nn.cast %x : tensor<4x8xbf16> to tensor<8x4xf32>
  return
}

// -----

func.func @cast_int(%x: tensor<4xi32>) {
  // expected-error @+1 {{'nn.cast' op operand #0 must be ranked tensor of 32-bit float or bfloat16 type or 16-bit float values}}
  %y = nn.cast %x : tensor<4xi32> to tensor<4xf32>
  return
}

// -----

func.func @gelu_approximate(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{approximate must be "none" or "tanh", got "sigmoid"}}
  %y = nn.gelu %x {approximate = "sigmoid"} : tensor<8x16xf32>
  return
}

// -----

func.func @gelu_grad_approximate(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{approximate must be "none" or "tanh", got "erf"}}
  %y = nn.gelu_grad %x, %x {approximate = "erf"} : tensor<8x16xf32>
  return
}

// -----

func.func @bias_gelu_bias(%x: tensor<8x16xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{expects a [..., n] input and a [n] bias, got 'tensor<8x16xf32>' and 'tensor<8xf32>'}}
  %y = nn.bias_gelu %x, %b : (tensor<8x16xf32>, tensor<8xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @bias_gelu_approximate(%x: tensor<8x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{approximate must be "none" or "tanh", got "erf"}}
  %y = nn.bias_gelu %x, %b {approximate = "erf"} : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @bias_gelu_grad_bias(%x: tensor<8x16xf32>, %b: tensor<4x4xf32>) {
  // expected-error @+1 {{expects a [..., n] input and a [n] bias, got 'tensor<8x16xf32>' and 'tensor<4x4xf32>'}}
  %dx, %db = nn.bias_gelu_grad %x, %b, %x : (tensor<8x16xf32>, tensor<4x4xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<4x4xf32>)
  return
}

// -----

func.func @bias_gelu_grad_dy(%x: tensor<8x16xf32>, %b: tensor<16xf32>, %dy: tensor<4x16xf32>) {
  // expected-error @+1 {{result_grad 'tensor<4x16xf32>' must have the input's type 'tensor<8x16xf32>'}}
  %dx, %db = nn.bias_gelu_grad %x, %b, %dy : (tensor<8x16xf32>, tensor<16xf32>, tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @bias_gelu_grad_approximate(%x: tensor<8x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{approximate must be "none" or "tanh", got "exact"}}
  %dx, %db = nn.bias_gelu_grad %x, %b, %x {approximate = "exact"} : (tensor<8x16xf32>, tensor<16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @logits_stats_labels(%z: tensor<8x16xf32>, %t: tensor<4xi32>) {
  // expected-error @+1 {{labels must hold one label per row of the logits, got 'tensor<4xi32>' for 'tensor<8x16xf32>'}}
  %m, %se, %pl = nn.logits_stats %z, %t : (tensor<8x16xf32>, tensor<4xi32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>)
  return
}

// -----

func.func @sum_squares_runs(%g: tensor<8xf32>) {
  // expected-error @+1 {{runs array<i64: 8, 4, 2>: runs must be non-empty, ascending and disjoint, from 0}}
  %s = nn.sum_squares %g {runs = array<i64: 8, 4, 2>} : tensor<8xf32> -> tensor<f32>
  return
}

// -----

func.func @sum_squares_shard(%g: tensor<8xf32>) {
  // expected-error @+1 {{runs' shard of 4 elements is smaller than the operand 'tensor<8xf32>'}}
  %s = nn.sum_squares %g {runs = array<i64: 4, 0, 2>} : tensor<8xf32> -> tensor<f32>
  return
}

// -----

func.func @adam_runs(%p: tensor<8xf32>, %t: tensor<i64>) {
  // expected-error @+1 {{runs array<i64: 8, 0>: runs are [shard_elements] followed by [start, end) pairs}}
  %a, %b, %c = nn.adam %p, %p, %p, %p, %t {lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32, runs = array<i64: 8, 0>} : tensor<8xf32>, tensor<i64>
  return
}

// -----

func.func @clip_negative(%s: tensor<f32>) {
  // expected-error @+1 {{max_norm must be finite and >= 0 (0: no clipping), got -1}}
  %n, %c = nn.clip_grad_norm %s {max_norm = -1.0 : f32} : tensor<f32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @sgd_momentum_range(%p: tensor<8xf32>) {
  // expected-error @+1 {{momentum must be in (0, 1) (nn.sgd has none), got 1}}
  %a, %b = nn.sgd_momentum %p, %p, %p {lr = 1.0e-2 : f32, weight_decay = 0.0 : f32, momentum = 1.0 : f32} : tensor<8xf32>
  return
}

// -----

func.func @repeat_kv_groups(%x: tensor<8x2x64xf32>) {
  // expected-error @+1 {{'nn.repeat_kv' op num_heads 6 must be a positive multiple of num_query_groups 4}}
  %y = nn.repeat_kv %x {num_heads = 6 : i64, num_query_groups = 4 : i64} : (tensor<8x2x64xf32>) -> tensor<8x2x72xf32>
  return
}

// -----

func.func @repeat_kv_features(%x: tensor<8x2x60xf32>) {
  // expected-error @+1 {{'nn.repeat_kv' op grouped qkv features 60 are not num_query_groups (2) x (num_heads / num_query_groups + 2) x head_dim}}
  %y = nn.repeat_kv %x {num_heads = 4 : i64, num_query_groups = 2 : i64} : (tensor<8x2x60xf32>) -> tensor<8x2x?xf32>
  return
}

// -----

func.func @qk_norm_weight(%x: tensor<8x2x96xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'nn.qk_norm' op q_weight and k_weight must be [head_dim = 8], got 'tensor<16xf32>'}}
  %y = nn.qk_norm %x, %w, %w {num_heads = 8 : i64, num_query_groups = 2 : i64} : tensor<8x2x96xf32>, tensor<16xf32>
  return
}

// -----

func.func @qk_norm_features(%x: tensor<8x2x90xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'nn.qk_norm' op qkv features 90 are not num_query_groups (2) x (num_heads / num_query_groups + 2) x head_dim}}
  %y = nn.qk_norm %x, %w, %w {num_heads = 8 : i64, num_query_groups = 2 : i64} : tensor<8x2x90xf32>, tensor<8xf32>
  return
}
