// A two-layer MLP (256 -> 1024 -> 256) with a 16-class head, trained with
// softmax cross-entropy. The batch dimension is left dynamic: tessera-compile
// fixes it to --micro-batch-size. Parameter names follow Megatron's MLP.
func.func @mlp(
    %x: tensor<?x256xf32> {nn.input = "features"},
    %labels: tensor<?xi32> {nn.input = "labels"},
    %w1: tensor<1024x256xf32> {nn.param = "mlp.linear_fc1.weight", nn.init = "normal:0.02"},
    %b1: tensor<1024xf32> {nn.param = "mlp.linear_fc1.bias", nn.init = "zeros"},
    %w2: tensor<256x1024xf32> {nn.param = "mlp.linear_fc2.weight", nn.init = "normal:0.02"},
    %b2: tensor<256xf32> {nn.param = "mlp.linear_fc2.bias", nn.init = "zeros"},
    %wh: tensor<16x256xf32> {nn.param = "head.weight", nn.init = "normal:0.02"},
    %bh: tensor<16xf32> {nn.param = "head.bias", nn.init = "zeros"}) -> tensor<f32> {
  %h = nn.linear %x, %w1, %b1 : (tensor<?x256xf32>, tensor<1024x256xf32>, tensor<1024xf32>) -> tensor<?x1024xf32>
  %a = nn.gelu %h : tensor<?x1024xf32>
  %y = nn.linear %a, %w2, %b2 : (tensor<?x1024xf32>, tensor<256x1024xf32>, tensor<256xf32>) -> tensor<?x256xf32>
  %z = nn.linear %y, %wh, %bh : (tensor<?x256xf32>, tensor<16x256xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<?x16xf32>, tensor<?xi32>) -> tensor<?xf32>
  %loss = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
