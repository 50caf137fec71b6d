// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @heads(%qkv: tensor<16x2x96xf32>) {
  // expected-error @+1 {{qkv features 96 are not 3 x num_heads (5) x head_dim}}
  %c = nn.attention %qkv {num_heads = 5 : i64} : (tensor<16x2x96xf32>) -> tensor<16x2x32xf32>
  return
}

// -----

func.func @ln(%x: tensor<16x2x64xf32>, %g: tensor<32xf32>) {
  // expected-error @+1 {{weight and bias must be 1-d of the input's last dimension 64}}
  %y = nn.layer_norm %x, %g, %g : tensor<16x2x64xf32>, tensor<32xf32>
  return
}

// -----

func.func @positions(%x: tensor<16x2x64xf32>, %p: tensor<8x64xf32>) {
  // expected-error @+1 {{sequence length 16 exceeds the 8 position embeddings}}
  %y = nn.add_position_embedding %x, %p : tensor<16x2x64xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @vocab(%ids: tensor<16x2xi32>, %t: tensor<100x64xf32>) {
  // expected-error @+1 {{table has 100 rows, fewer than vocab_size 257}}
  %h = nn.embedding %ids, %t {vocab_size = 257 : i64} : (tensor<16x2xi32>, tensor<100x64xf32>) -> tensor<16x2x64xf32>
  return
}

// -----

func.func @dropout(%x: tensor<16x2x64xf32>) {
  // expected-error @+1 {{rate must be in [0, 1), got 1}}
  %y = nn.dropout %x {rate = 1.0 : f32, stream = 0 : i64} : tensor<16x2x64xf32>
  return
}

// -----

func.func @dropout_nan(%x: tensor<16x2x64xf32>) {
  // expected-error @+1 {{rate must be in [0, 1), got nan}}
  %y = nn.dropout %x {rate = 0x7FC00000 : f32, stream = 0 : i64} : tensor<16x2x64xf32>
  return
}

// -----

func.func @rope_features(%q: tensor<16x2x100xf32>) {
  // expected-error @+1 {{qkv features 100 are not 3 x num_heads (4) x head_dim}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 8 : i64} : tensor<16x2x100xf32>
  return
}

// -----

func.func @rope_odd_dim(%q: tensor<16x2x96xf32>) {
  // expected-error @+1 {{rotary_dim 7 must be even and in [2, head_dim 8]}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 7 : i64} : tensor<16x2x96xf32>
  return
}

// -----

func.func @rope_wide(%q: tensor<16x2x96xf32>) {
  // expected-error @+1 {{rotary_dim 10 must be even and in [2, head_dim 8]}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 10 : i64} : tensor<16x2x96xf32>
  return
}

// -----

func.func @rope_base(%q: tensor<16x2x96xf32>) {
  // expected-error @+1 {{base must be finite and > 1, got 1}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 8 : i64, base = 1.0 : f32} : tensor<16x2x96xf32>
  return
}

// -----

func.func @rope_scaling(%q: tensor<16x2x96xf32>) {
  // expected-error @+1 {{scaling_factor must be finite and >= 1, got 5.000000e-01}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 8 : i64, scaling_factor = 0.5 : f32} : tensor<16x2x96xf32>
  return
}

// -----

func.func @rope_rank(%q: tensor<16x96xf32>) {
  // expected-error @+1 {{expects a fused [seq, batch, heads * 3 * head_dim] input, got 'tensor<16x96xf32>'}}
  %r = nn.rotary_embedding %q {num_heads = 4 : i64, rotary_dim = 8 : i64} : tensor<16x96xf32>
  return
}

// -----

func.func @rms_norm_weight(%x: tensor<16x2x64xf32>, %g: tensor<64x1xf32>) {
  // expected-error @+1 {{weight must be 1-d of the input's last dimension 64, got 'tensor<64x1xf32>'}}
  %y = nn.rms_norm %x, %g : tensor<16x2x64xf32>, tensor<64x1xf32>
  return
}

// -----

func.func @add_rms_norm_weight(%x: tensor<16x2x64xf32>, %g: tensor<32xf32>) {
  // expected-error @+1 {{weight must be 1-d of the input's last dimension 64, got 'tensor<32xf32>'}}
  %s, %y = nn.add_rms_norm %x, %x, %g : tensor<16x2x64xf32>, tensor<32xf32>
  return
}

// -----

func.func @add_layer_norm_params(%x: tensor<16x2x64xf32>, %g: tensor<32xf32>) {
  // expected-error @+1 {{weight and bias must be 1-d of the input's last dimension 64, got 'tensor<32xf32>'}}
  %s, %y = nn.add_layer_norm %x, %x, %g, %g : tensor<16x2x64xf32>, tensor<32xf32>
  return
}
