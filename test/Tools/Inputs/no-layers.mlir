// A model without transformer layers (no nn.layer marks), for tessera-plan.
func.func @f(%x: tensor<4x8xf32> {nn.input = "features"}) -> tensor<f32> {
  %l = nn.mean %x : (tensor<4x8xf32>) -> tensor<f32>
  return %l : tensor<f32>
}
