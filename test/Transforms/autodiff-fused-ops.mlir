// RUN: tessera-opt %s --split-input-file --tessera-autodiff | FileCheck %s

// The gradient rules of the fused ops (what the fusion passes create):
// - nn.logits_stats has none: nn.cross_entropy_from_stats' adjoint is the
//   whole logits gradient, from the saved max and sum of exponentials;
// - nn.add_layer_norm whose sum something else reads: the layer norm's
//   input gradient and the sum's own gradient in one nn.add_layer_norm_grad,
//   the gradient of both addends;
// - nn.add_layer_norm whose sum nothing else reads: a plain
//   nn.layer_norm_grad;
// - nn.bias_gelu: one nn.bias_gelu_grad for the input and the bias.
// CHECK-LABEL: func.func @m
// CHECK: %[[M:.*]], %[[SE:.*]], %{{.*}} = nn.logits_stats %[[O:[^,]*]], %arg6
// CHECK: nn.token_mean_grad
// CHECK-NEXT: %[[DO:.*]] = nn.cross_entropy_stats_grad %[[O]], %arg6, %[[M]], %[[SE]], %{{.*}} :
// CHECK: %[[DY2:.*]] = nn.matmul %[[DO]], %arg5
// CHECK: %[[DS2:.*]], %{{.*}}, %{{.*}} = nn.layer_norm_grad %[[S2:[^,]*]], %arg3, %[[DY2]]
// CHECK: %[[DS1:.*]], %{{.*}}, %{{.*}} = nn.add_layer_norm_grad %[[S1:[^,]*]], %arg3, %[[DS2]], %[[DS2]]
// CHECK: %[[DZ:.*]], %[[DB1:.*]] = nn.bias_gelu_grad %{{.*}}, %arg2, %[[DS1]]
// CHECK-NOT: nn.reduce_rows
// CHECK-NOT: nn.logits_stats
// CHECK: return
func.func @m(%x: tensor<4x8xf32> {nn.input = "features"},
             %w: tensor<8x8xf32> {nn.param = "fc.weight", nn.init = "normal:0.02"},
             %b1: tensor<8xf32> {nn.param = "fc.bias", nn.init = "zeros"},
             %g: tensor<8xf32> {nn.param = "ln.weight", nn.init = "ones"},
             %beta: tensor<8xf32> {nn.param = "ln.bias", nn.init = "zeros"},
             %w2: tensor<5x8xf32> {nn.param = "head.weight", nn.init = "normal:0.02"},
             %t: tensor<4xi32> {nn.input = "labels"}) -> tensor<f32> {
  %z = nn.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h = nn.bias_gelu %z, %b1 : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %s1, %y1 = nn.add_layer_norm %x, %h, %g, %beta : tensor<4x8xf32>, tensor<8xf32>
  %s2, %y2 = nn.add_layer_norm %s1, %y1, %g, %beta : tensor<4x8xf32>, tensor<8xf32>
  %o = nn.linear %y2, %w2 : (tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<4x5xf32>
  %m, %se, %pl = nn.logits_stats %o, %t : (tensor<4x5xf32>, tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
  %l = nn.cross_entropy_from_stats %o, %t, %m, %se, %pl : (tensor<4x5xf32>, tensor<4xi32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %loss = nn.token_mean %l, %t : (tensor<4xf32>, tensor<4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// RMSNorm's rules, as LayerNorm's without a bias: nn.rms_norm gives
// nn.rms_norm_grad (input and weight gradients); nn.add_rms_norm whose sum
// another op reads gives one nn.add_rms_norm_grad, and a plain
// nn.rms_norm_grad when nothing else reads it. The weight's gradients of
// its three uses are summed.
// CHECK-LABEL: func.func @rms
// CHECK: %[[DS2:.*]], %[[DG2:.*]] = nn.rms_norm_grad %[[S2:[^,]*]], %arg1, %{{.*}} {eps = 9.99999997E-7 : f32}
// CHECK: %[[DS1:.*]], %[[DG1:.*]] = nn.add_rms_norm_grad %[[S1:[^,]*]], %arg1, %[[DS2]], %[[DS2]]
// CHECK: %[[DX:.*]], %[[DG0:.*]] = nn.rms_norm_grad %arg0, %arg1, %[[DS1]]
// CHECK-NOT: nn.layer_norm_grad
// CHECK: return
func.func @rms(%x: tensor<4x8xf32> {nn.input = "features"},
               %g: tensor<8xf32> {nn.param = "norm.weight", nn.init = "ones"},
               %w2: tensor<5x8xf32> {nn.param = "head.weight", nn.init = "normal:0.02"},
               %t: tensor<4xi32> {nn.input = "labels"}) -> tensor<f32> {
  %y0 = nn.rms_norm %x, %g : tensor<4x8xf32>, tensor<8xf32>
  %s1, %y1 = nn.add_rms_norm %x, %y0, %g : tensor<4x8xf32>, tensor<8xf32>
  %s2, %y2 = nn.add_rms_norm %s1, %y1, %g {eps = 1.0e-6 : f32} : tensor<4x8xf32>, tensor<8xf32>
  %o = nn.linear %y2, %w2 : (tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<4x5xf32>
  %l = nn.softmax_cross_entropy %o, %t : (tensor<4x5xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.token_mean %l, %t : (tensor<4xf32>, tensor<4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// RoPE's adjoint is the inverse rotation (the same op, inverse = true),
// with the op's attributes (and sequence shard group) kept.
// CHECK-LABEL: func.func @rope
// CHECK: %[[R:.*]] = nn.rotary_embedding %[[Q:[^ ]*]] {base = 5.000000e+05 : f32, num_heads = 2 : i64, rotary_dim = 4 : i64, sequence_shard_group = "cp"}
// CHECK: %[[DC:.*]] = nn.attention_grad %[[R]]
// CHECK-NEXT: nn.rotary_embedding %[[DC]] {base = 5.000000e+05 : f32, inverse = true, num_heads = 2 : i64, rotary_dim = 4 : i64, sequence_shard_group = "cp"}
func.func @rope(%x: tensor<4x2x8xf32> {nn.input = "features"},
                %w: tensor<24x8xf32> {nn.param = "qkv.weight", nn.init = "normal:0.02"},
                %t: tensor<4x2xi32> {nn.input = "labels"}) -> tensor<f32> {
  %q = nn.linear %x, %w : (tensor<4x2x8xf32>, tensor<24x8xf32>) -> tensor<4x2x24xf32>
  %r = nn.rotary_embedding %q {num_heads = 2 : i64, rotary_dim = 4 : i64, base = 5.0e5 : f32, sequence_shard_group = "cp"} : tensor<4x2x24xf32>
  %c = nn.attention %r {num_heads = 2 : i64} : (tensor<4x2x24xf32>) -> tensor<4x2x8xf32>
  %l = nn.softmax_cross_entropy %c, %t : (tensor<4x2x8xf32>, tensor<4x2xi32>) -> tensor<4x2xf32>
  %loss = nn.token_mean %l, %t : (tensor<4x2xf32>, tensor<4x2xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
