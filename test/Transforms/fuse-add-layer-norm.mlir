// RUN: tessera-opt %s --split-input-file --tessera-fuse-add-layer-norm -verify-diagnostics | FileCheck %s

// A pre-LN block's residual: the add that feeds the second layer norm and
// the next residual becomes one op returning both the sum and the
// normalised value; the layer norm's attributes stay on it.
// CHECK-LABEL: func.func @block
// CHECK: %[[S:.*]], %[[Y:.*]] = nn.add_layer_norm %arg0, %arg1, %arg2, %arg3 {nn.layer = 0 : i64} : tensor<4x2x8xf32>, tensor<8xf32>
// CHECK-NEXT: %[[H:.*]] = nn.gelu %[[Y]]
// CHECK-NEXT: %[[O:.*]] = nn.add %[[S]], %[[H]]
// CHECK-NEXT: return %[[O]]
// CHECK-NOT: nn.layer_norm
func.func @block(%x: tensor<4x2x8xf32>, %a: tensor<4x2x8xf32>, %g: tensor<8xf32>,
                 %b: tensor<8xf32>) -> tensor<4x2x8xf32> {
  %s = nn.add %x, %a : tensor<4x2x8xf32>
  %y = nn.layer_norm %s, %g, %b {nn.layer = 0 : i64} : tensor<4x2x8xf32>, tensor<8xf32>
  %h = nn.gelu %y : tensor<4x2x8xf32>
  %o = nn.add %s, %h : tensor<4x2x8xf32>
  return %o : tensor<4x2x8xf32>
}

// -----

// RMSNorm (Megatron's --normalization RMSNorm) fuses the same way, its eps
// kept.
// CHECK-LABEL: func.func @rms_block
// CHECK: %[[S:.*]], %[[Y:.*]] = nn.add_rms_norm %arg0, %arg1, %arg2 {eps = 9.99999997E-7 : f32, nn.layer = 0 : i64} : tensor<4x2x8xf32>, tensor<8xf32>
// CHECK-NEXT: %[[O:.*]] = nn.add %[[S]], %[[Y]]
// CHECK-NEXT: return %[[O]]
// CHECK-NOT: nn.rms_norm
func.func @rms_block(%x: tensor<4x2x8xf32>, %a: tensor<4x2x8xf32>, %g: tensor<8xf32>) -> tensor<4x2x8xf32> {
  %s = nn.add %x, %a : tensor<4x2x8xf32>
  %y = nn.rms_norm %s, %g {eps = 1.0e-6 : f32, nn.layer = 0 : i64} : tensor<4x2x8xf32>, tensor<8xf32>
  %o = nn.add %s, %y : tensor<4x2x8xf32>
  return %o : tensor<4x2x8xf32>
}

// -----

// Mixed precision casts a layer norm's weight right before it, after the
// add: the fused op goes where the layer norm was, since the sum's other
// reader comes later.
// CHECK-LABEL: func.func @cast_params
// CHECK: nn.cast %arg2
// CHECK-NEXT: nn.cast %arg3
// CHECK-NEXT: %[[S:.*]], %[[Y:.*]] = nn.add_layer_norm %arg0, %arg1
// CHECK-NEXT: nn.add %[[S]], %[[Y]]
func.func @cast_params(%x: tensor<4x8xf32>, %a: tensor<4x8xf32>, %g16: tensor<8xbf16>,
                       %b16: tensor<8xbf16>) -> tensor<4x8xf32> {
  %s = nn.add %x, %a : tensor<4x8xf32>
  %g = nn.cast %g16 : tensor<8xbf16> to tensor<8xf32>
  %b = nn.cast %b16 : tensor<8xbf16> to tensor<8xf32>
  %y = nn.layer_norm %s, %g, %b : tensor<4x8xf32>, tensor<8xf32>
  %o = nn.add %s, %y : tensor<4x8xf32>
  return %o : tensor<4x8xf32>
}

// -----

// Left alone: the sum is read between the add and the layer norm, whose
// weight is only defined after the add (no place has both).
// CHECK-LABEL: func.func @unfusable
// CHECK: nn.add %arg0, %arg1
// CHECK: nn.layer_norm
// CHECK-NOT: nn.add_layer_norm
func.func @unfusable(%x: tensor<4x8xf32>, %a: tensor<4x8xf32>, %g16: tensor<8xbf16>,
                     %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = nn.add %x, %a : tensor<4x8xf32>
  %r = nn.gelu %s : tensor<4x8xf32>
  %g = nn.cast %g16 : tensor<8xbf16> to tensor<8xf32>
  %y = nn.layer_norm %s, %g, %b : tensor<4x8xf32>, tensor<8xf32>
  return %r, %y : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Two layer norms of one sum: the first fuses the add, the second reads
// the fused op's sum as it is.
// CHECK-LABEL: func.func @two_norms
// CHECK: %[[S:.*]], %[[Y:.*]] = nn.add_layer_norm %arg0, %arg1, %arg2, %arg2
// CHECK-NEXT: %[[Z:.*]] = nn.layer_norm %[[S]], %arg2, %arg2
// CHECK-NEXT: return %[[Y]], %[[Z]]
func.func @two_norms(%x: tensor<4x8xf32>, %a: tensor<4x8xf32>, %g: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = nn.add %x, %a : tensor<4x8xf32>
  %y = nn.layer_norm %s, %g, %g : tensor<4x8xf32>, tensor<8xf32>
  %z = nn.layer_norm %s, %g, %g : tensor<4x8xf32>, tensor<8xf32>
  return %y, %z : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// expected-error @+1 {{'func.func' op is a training phase; tessera-fuse-add-layer-norm runs on the model, before tessera-autodiff}}
func.func @step(%x: tensor<4x8xf32>, %g: tensor<8xf32>) -> tensor<4x8xf32> attributes {tessera.phase = "microbatch"} {
  %s = nn.add %x, %x : tensor<4x8xf32>
  %y = nn.layer_norm %s, %g, %g : tensor<4x8xf32>, tensor<8xf32>
  return %y : tensor<4x8xf32>
}
