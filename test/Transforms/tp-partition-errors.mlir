// RUN: tessera-opt %s -split-input-file --tessera-tp-partition -verify-diagnostics

// expected-error @+1 {{tessera-tp-partition needs a dist.mesh (run tessera-attach-mesh)}}
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

dist.mesh @mesh {tp = 2}
func.func @tied(%x: tensor<8x16xf32> {nn.input = "features"},
                %w: tensor<16x16xf32> {nn.param = "w"}) -> tensor<8x16xf32> {
  // expected-error @+1 {{parameter "w" is used more than once and cannot be split here}}
  %h = nn.linear %x, %w : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %a = nn.gelu %h : tensor<8x16xf32>
  %y = nn.linear %a, %w : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

dist.mesh @mesh {tp = 2}
func.func @computed_weight(%x: tensor<8x16xf32> {nn.input = "features"},
                           %w: tensor<32x16xf32> {nn.param = "w"},
                           %w2: tensor<16x32xf32> {nn.param = "w2"}) -> tensor<8x16xf32> {
  %wr = nn.relu %w : tensor<32x16xf32>
  // expected-error @+1 {{operand #1 must be a model parameter to be split over tp}}
  %h = nn.linear %x, %wr : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %a = nn.gelu %h : tensor<8x32xf32>
  %y = nn.linear %a, %w2 : (tensor<8x32xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}
