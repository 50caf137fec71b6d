// RUN: tessera-opt %s --tessera-pad-vocab -verify-diagnostics | FileCheck %s
// RUN: sed /expected-warning/d %s | tessera-opt --tessera-pad-vocab="make-vocab-size-divisible-by=1" 2>&1 | FileCheck %s --check-prefix=KEEP

// Weights that came with the model (nn.init = "data", an ONNX import) are
// padded like any others, with a warning: the zero rows' logits enter the
// softmax, so the loss is no longer the exported model's.
// CHECK: tensor<384x8xf32> {nn.init = "data", nn.param = "wte"}
// KEEP-NOT: warning
// KEEP: tensor<260x8xf32> {nn.init = "data", nn.param = "wte"}
func.func @lm(%tokens: tensor<4x?xi32> {nn.input = "tokens", nn.batch_dim = 1 : i64},
              %labels: tensor<4x?xi32> {nn.input = "labels", nn.batch_dim = 1 : i64},
              // expected-warning @+1 {{padding the vocabulary of 'wte' (initialised from data) from 260 to 384 rows adds zero rows whose logits change the loss; make-vocab-size-divisible-by 1 keeps the model's vocabulary}}
              %wte: tensor<260x8xf32> {nn.param = "wte", nn.init = "data"}) -> tensor<f32> {
  %h = nn.embedding %tokens, %wte {vocab_size = 260 : i64} : (tensor<4x?xi32>, tensor<260x8xf32>) -> tensor<4x?x8xf32>
  %z = nn.linear %h, %wte : (tensor<4x?x8xf32>, tensor<260x8xf32>) -> tensor<4x?x260xf32>
  %l = nn.softmax_cross_entropy %z, %labels {ignore_index = -100 : i64} : (tensor<4x?x260xf32>, tensor<4x?xi32>) -> tensor<4x?xf32>
  %m = nn.token_mean %l, %labels : (tensor<4x?xf32>, tensor<4x?xi32>) -> tensor<f32>
  return %m : tensor<f32>
}

// At tp 3 the vocabulary (260) must be padded whatever the divisor: the
// warning says why.
// RUN: sed /expected-warning/d %s | tessera-opt --tessera-attach-mesh="tp=3" --tessera-pad-vocab="make-vocab-size-divisible-by=1" 2>&1 | FileCheck %s --check-prefix=TP3
// TP3: warning: padding the vocabulary of 'wte' (initialised from data) from 260 to 261 rows adds zero rows whose logits change the loss; tp = 3 needs a multiple of 3 rows, so export a vocabulary it divides
