// RUN: sed /expected-warning/d %s | tessera-opt --tessera-pad-vocab | FileCheck %s
// RUN: tessera-opt %s --tessera-pad-vocab="mask-padding=false" -verify-diagnostics | FileCheck %s --check-prefix=SOFTMAX
// RUN: sed /expected-warning/d %s | tessera-opt --tessera-pad-vocab="make-vocab-size-divisible-by=1" 2>&1 | FileCheck %s --check-prefix=KEEP

// Weights that came with the model (nn.init = "data", an ONNX or Hugging
// Face import) are padded like any others, and by default
// (mask-padding=auto) the padded rows' logits are kept out of the loss: an
// nn.mask_columns before the cross-entropy sets them to the lowest f32, so
// the loss stays the exported model's at every tp.
// CHECK: module attributes {tessera.vocab = {masked, padded = 384 : i64, size = 260 : i64}}
// CHECK: tensor<384x8xf32> {nn.init = "data", nn.param = "wte"}
// CHECK: %[[Z:.*]] = nn.linear
// CHECK-NEXT: %[[M:.*]] = nn.mask_columns %[[Z]] {fill = -3.40282347E+38 : f32, valid = 260 : i64} : tensor<4x?x384xf32>
// CHECK-NEXT: nn.softmax_cross_entropy %[[M]], %{{.*}}

// mask-padding=false is Megatron's: the zero rows' logits enter the
// softmax, with a warning that the loss is no longer the exported model's.
// SOFTMAX: module attributes {tessera.vocab = {padded = 384 : i64, size = 260 : i64}}
// SOFTMAX-NOT: nn.mask_columns

// No padding, no mask.
// KEEP-NOT: warning
// KEEP-NOT: nn.mask_columns
// KEEP: tensor<260x8xf32> {nn.init = "data", nn.param = "wte"}
func.func @lm(%tokens: tensor<4x?xi32> {nn.input = "tokens", nn.batch_dim = 1 : i64},
              %labels: tensor<4x?xi32> {nn.input = "labels", nn.batch_dim = 1 : i64},
              // expected-warning @+1 {{padding the vocabulary of 'wte' (initialised from data) from 260 to 384 rows adds zero rows whose logits change the loss (mask-padded-vocab=false); make-vocab-size-divisible-by 1 keeps the model's vocabulary}}
              %wte: tensor<260x8xf32> {nn.param = "wte", nn.init = "data"}) -> tensor<f32> {
  %h = nn.embedding %tokens, %wte {vocab_size = 260 : i64} : (tensor<4x?xi32>, tensor<260x8xf32>) -> tensor<4x?x8xf32>
  %z = nn.linear %h, %wte : (tensor<4x?x8xf32>, tensor<260x8xf32>) -> tensor<4x?x260xf32>
  %l = nn.softmax_cross_entropy %z, %labels {ignore_index = -100 : i64} : (tensor<4x?x260xf32>, tensor<4x?xi32>) -> tensor<4x?xf32>
  %m = nn.token_mean %l, %labels : (tensor<4x?xf32>, tensor<4x?xi32>) -> tensor<f32>
  return %m : tensor<f32>
}

// At tp 3 the vocabulary (260) must be padded whatever the divisor: masked,
// the padding does not matter; the vocabulary-parallel loss masks each
// rank's shard by its global columns (group "tp"), and so does the
// backward (fill 0).
// RUN: sed /expected-warning/d %s | tessera-opt --tessera-attach-mesh="tp=3" --tessera-set-batch="micro-batch-size=4" --tessera-pad-vocab="make-vocab-size-divisible-by=1" --tessera-tp-partition --tessera-autodiff 2>&1 | FileCheck %s --check-prefix=TP3
// TP3-NOT: warning
// TP3: nn.mask_columns %{{.*}} {fill = -3.40282347E+38 : f32, group = "tp", valid = 260 : i64} : tensor<4x4x87xf32>
// TP3: nn.cross_entropy_stats
// TP3: nn.mask_columns %{{.*}} {fill = 0.000000e+00 : f32, group = "tp", valid = 260 : i64} : tensor<4x4x87xf32>
// RUN: sed /expected-warning/d %s | tessera-opt --tessera-attach-mesh="tp=3" --tessera-pad-vocab="make-vocab-size-divisible-by=1 mask-padding=false" 2>&1 | FileCheck %s --check-prefix=TP3SOFTMAX
// TP3SOFTMAX: warning: padding the vocabulary of 'wte' (initialised from data) from 260 to 261 rows adds zero rows whose logits change the loss (mask-padded-vocab=false); tp = 3 needs a multiple of 3 rows, so export a vocabulary it divides

// A model initialised here keeps Megatron's behaviour unless asked.
// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 8 -o %t.gpt.mlir
// RUN: tessera-opt %t.gpt.mlir --tessera-pad-vocab | FileCheck %s --check-prefix=GEN
// GEN-NOT: nn.mask_columns
// RUN: tessera-opt %t.gpt.mlir --tessera-pad-vocab="mask-padding=true" | FileCheck %s --check-prefix=GENMASK
// GENMASK: nn.mask_columns %{{.*}} {fill = -3.40282347E+38 : f32, valid = 257 : i64}
// RUN: not tessera-opt %t.gpt.mlir --tessera-pad-vocab="mask-padding=maybe" 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: mask-padded-vocab must be auto, true or false, got 'maybe'
