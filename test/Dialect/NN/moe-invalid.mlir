// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @topk(%l: tensor<4x3xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'nn.moe_router' op topk must be in [1, 3], got 4}}
  %p, %i = nn.moe_router %l {topk = 4 : i64} : tensor<4x3xf32> -> tensor<4x4xf32>, tensor<4x4xi32>
  return %p : tensor<4x4xf32>
}

// -----

func.func @rank(%l: tensor<3xf32>) -> tensor<1xf32> {
  // expected-error @+1 {{'nn.moe_router' op expects logits [tokens..., experts], got 'tensor<3xf32>'}}
  %p, %i = "nn.moe_router"(%l) {topk = 1 : i64} : (tensor<3xf32>) -> (tensor<1xf32>, tensor<1xi32>)
  return %p : tensor<1xf32>
}

// -----

func.func @counts(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op counts must be [3]}}
  %r, %c = "nn.moe_dispatch"(%x, %i) {num_experts = 3 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> (tensor<8x8xf32>, tensor<2xi32>)
  return %r : tensor<8x8xf32>
}

// -----

func.func @tokens(%x: tensor<5x8xf32>, %i: tensor<4x2xi32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op input 'tensor<5x8xf32>' and the routing 'tensor<4x2xi32>' must have the same tokens}}
  %r, %c = "nn.moe_dispatch"(%x, %i) {num_experts = 3 : i64} : (tensor<5x8xf32>, tensor<4x2xi32>) -> (tensor<8x8xf32>, tensor<3xi32>)
  return %r : tensor<8x8xf32>
}

// -----

func.func @rows(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>) -> tensor<6x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op expects the permuted rows [tokens * k, 8] of routing 'tensor<4x2xi32>', got 'tensor<6x8xf32>'}}
  %r, %c = "nn.moe_dispatch"(%x, %i) {num_experts = 3 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> (tensor<6x8xf32>, tensor<3xi32>)
  return %r : tensor<6x8xf32>
}

// -----

func.func @grouped(%x: tensor<8x8xf32>, %c: tensor<3xi32>, %w: tensor<3x16x6xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'nn.grouped_linear' op rows 'tensor<8x8xf32>' do not match the weights 'tensor<3x16x6xf32>' (in features)}}
  %y = nn.grouped_linear %x, %c, %w : (tensor<8x8xf32>, tensor<3xi32>, tensor<3x16x6xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

func.func @groups(%x: tensor<8x8xf32>, %c: tensor<2xi32>, %w: tensor<3x16x8xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'nn.grouped_linear' op counts must be [3], one per expert}}
  %y = nn.grouped_linear %x, %c, %w : (tensor<8x8xf32>, tensor<2xi32>, tensor<3x16x8xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

func.func @grouped_expected_rows(%x: tensor<8x8xf32>, %c: tensor<3xi32>, %w: tensor<3x16x8xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'nn.grouped_linear' op expected_rows 9 must be in [0, 8] (the input's rows)}}
  %y = nn.grouped_linear %x, %c, %w {expected_rows = 9 : i64} : (tensor<8x8xf32>, tensor<3xi32>, tensor<3x16x8xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

func.func @grouped_grad_expected_rows(%x: tensor<8x8xf32>, %c: tensor<3xi32>, %w: tensor<3x16x8xf32>, %dy: tensor<8x16xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'nn.grouped_linear_grad' op expected_rows -1 must be in [0, 8] (the input's rows)}}
  %dx, %dw = nn.grouped_linear_grad %x, %c, %w, %dy {expected_rows = -1 : i64} : tensor<8x8xf32>, tensor<3xi32>, tensor<3x16x8xf32>, tensor<8x16xf32>
  return %dx : tensor<8x8xf32>
}

// -----

func.func @grouped_mixed(%x: tensor<8x8xbf16>, %c: tensor<3xi32>, %w: tensor<3x16x8xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'nn.grouped_linear' op operands must be both f32, both bf16 or both f16, got 'tensor<8x8xbf16>' and 'tensor<3x16x8xf32>' (cast one with nn.cast)}}
  %y = nn.grouped_linear %x, %c, %w : (tensor<8x8xbf16>, tensor<3xi32>, tensor<3x16x8xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

func.func @grouped_grad_mixed(%x: tensor<8x8xbf16>, %c: tensor<3xi32>, %w: tensor<3x16x8xbf16>, %dy: tensor<8x16xf32>) {
  // expected-error @+1 {{'nn.grouped_linear_grad' op operands must be both f32, both bf16 or both f16, got 'tensor<3x16x8xbf16>' and 'tensor<8x16xf32>' (cast one with nn.cast)}}
  %dx, %dw = nn.grouped_linear_grad %x, %c, %w, %dy : tensor<8x8xbf16>, tensor<3xi32>, tensor<3x16x8xbf16>, tensor<8x16xf32>
  return
}

// -----

func.func @grouped_grad_shapes(%x: tensor<8x8xf32>, %c: tensor<3xi32>, %w: tensor<3x16x8xf32>, %dy: tensor<8x12xf32>) {
  // expected-error @+1 {{'nn.grouped_linear_grad' op expects rows [n, in], weights [experts, out, in] (or stacked [experts, k, out, in]) and their result's gradient [n, out], got 'tensor<8x8xf32>', 'tensor<3x16x8xf32>' and 'tensor<8x12xf32>'}}
  %dx, %dw = nn.grouped_linear_grad %x, %c, %w, %dy : tensor<8x8xf32>, tensor<3xi32>, tensor<3x16x8xf32>, tensor<8x12xf32>
  return
}

// -----

func.func @combine(%y: tensor<8x8xf32>, %p: tensor<4x2xf32>, %i: tensor<4x1xi32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'nn.moe_combine' op probs 'tensor<4x2xf32>' must match the indices 'tensor<4x1xi32>'}}
  %o = "nn.moe_combine"(%y, %p, %i) {num_experts = 3 : i64} : (tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x1xi32>) -> tensor<4x8xf32>
  return %o : tensor<4x8xf32>
}

// -----

func.func @experts(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op num_experts must be positive}}
  %r, %c = "nn.moe_dispatch"(%x, %i) {num_experts = 0 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> (tensor<8x8xf32>, tensor<0xi32>)
  return %r : tensor<8x8xf32>
}

// -----

func.func @factor(%p: tensor<4x2xf32>, %i: tensor<4x2xi32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'nn.moe_capacity_drop' op capacity_factor must be positive and finite, got 0}}
  %kp, %ki = nn.moe_capacity_drop %p, %i {num_experts = 3 : i64, capacity_factor = 0.0 : f32} : tensor<4x2xf32>, tensor<4x2xi32>
  return %kp : tensor<4x2xf32>
}

// -----

func.func @policy(%p: tensor<4x2xf32>, %i: tensor<4x2xi32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'nn.moe_capacity_drop' op drop_policy must be "probs" or "position", got "random"}}
  %kp, %ki = nn.moe_capacity_drop %p, %i {num_experts = 3 : i64, capacity_factor = 1.0 : f32, drop_policy = "random"} : tensor<4x2xf32>, tensor<4x2xi32>
  return %kp : tensor<4x2xf32>
}

// -----

func.func @shapes(%p: tensor<4x2xf32>, %i: tensor<4x1xi32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'nn.moe_capacity_drop' op probs 'tensor<4x2xf32>' must match the indices 'tensor<4x1xi32>'}}
  %kp, %ki = nn.moe_capacity_drop %p, %i {num_experts = 3 : i64, capacity_factor = 1.0 : f32} : tensor<4x2xf32>, tensor<4x1xi32>
  return %kp : tensor<4x2xf32>
}

// -----

func.func @aux_counts(%l: tensor<4x2x3xf32>, %i: tensor<4x2x2xi32>, %c: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'nn.moe_aux_loss' op expects counts [3] (one per expert), got 'tensor<4xf32>'}}
  %a = nn.moe_aux_loss %l, %i, %c {coeff = 0.01 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<4xf32>) -> tensor<f32>
  return %a : tensor<f32>
}

// -----

func.func @factor_inf(%p: tensor<4x2xf32>, %i: tensor<4x2xi32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'nn.moe_capacity_drop' op capacity_factor must be positive and finite, got INF}}
  %kp, %ki = nn.moe_capacity_drop %p, %i {num_experts = 3 : i64, capacity_factor = 0x7F800000 : f32} : tensor<4x2xf32>, tensor<4x2xi32>
  return %kp : tensor<4x2xf32>
}

// -----

func.func @aux_coeff_nan(%l: tensor<4x2x3xf32>, %i: tensor<4x2x2xi32>) -> tensor<f32> {
  // expected-error @+1 {{'nn.moe_aux_loss' op coeff must be finite and >= 0, got nan}}
  %a = nn.moe_aux_loss %l, %i {coeff = 0x7FC00000 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>) -> tensor<f32>
  return %a : tensor<f32>
}

// -----

func.func @aux_coeff_negative(%l: tensor<4x2x3xf32>, %i: tensor<4x2x2xi32>) -> tensor<f32> {
  // expected-error @+1 {{'nn.moe_aux_loss' op coeff must be finite and >= 0, got -1}}
  %a = nn.moe_aux_loss %l, %i {coeff = -1.0 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>) -> tensor<f32>
  return %a : tensor<f32>
}
