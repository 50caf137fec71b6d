// RUN: tessera-opt %s --tessera-attach-mesh="cp=2" --tessera-cp-partition -verify-diagnostics

// Context parallelism sums the load-balancing loss's counts over cp (or
// extends a sum over tp to tp-cp); counts of another origin are an error.
func.func @m(%tokens: tensor<8x2xi32> {nn.input = "tokens"}, %labels: tensor<8x2xi32> {nn.input = "labels"}, %logits: tensor<8x2x4xf32>, %idx: tensor<8x2x2xi32>, %counts: tensor<4xf32>, %qkv: tensor<8x2x48xf32>) -> tensor<f32> {
  %a = nn.attention %qkv {num_heads = 2 : i64} : (tensor<8x2x48xf32>) -> tensor<8x2x16xf32>
  // expected-error @+1 {{'nn.moe_aux_loss' op context parallelism expects the load-balancing loss's counts summed over tp (sequence parallelism) or not given}}
  %aux = nn.moe_aux_loss %logits, %idx, %counts {coeff = 1.0e-02 : f32} : (tensor<8x2x4xf32>, tensor<8x2x2xi32>, tensor<4xf32>) -> tensor<f32>
  return %aux : tensor<f32>
}
