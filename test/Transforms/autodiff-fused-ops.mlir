// RUN: tessera-opt %s --tessera-autodiff | FileCheck %s

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
