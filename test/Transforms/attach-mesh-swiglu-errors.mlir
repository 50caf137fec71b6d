// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="tp=3" -verify-diagnostics

// A stacked linear splits each projection's features: 64 over tp = 3.
func.func @swiglu(%x: tensor<8x32xf32> {nn.input = "features"},
                  %w1: tensor<2x64x32xf32> {nn.param = "fc1.weight"},
                  %w2: tensor<32x64xf32> {nn.param = "fc2.weight"}) -> tensor<8x32xf32> {
  // expected-error @+1 {{'nn.linear' op cannot be split column-parallel over tp = 3: 64 output features are not divisible by 3}}
  %gu = nn.linear %x, %w1 : (tensor<8x32xf32>, tensor<2x64x32xf32>) -> tensor<8x128xf32>
  // expected-error @+1 {{'nn.swiglu' op cannot split 64 SwiGLU features (the FFN hidden size) over tp = 3}}
  %h = nn.swiglu %gu : (tensor<8x128xf32>) -> tensor<8x64xf32>
  %y = nn.linear %h, %w2 : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
  return %y : tensor<8x32xf32>
}
