// RUN: tessera-opt %s --tessera-train-pipeline="micro-batch-size=4 global-batch-size=8 clip-grad=0 weight-decay=0" | FileCheck %s

// The step's FLOPs summed from each op's CostOpInterface, per microbatch:
//   linear 2*4*3*8 + 12 (bias) = 204, cross-entropy 4, mean 1, seed fill 1,
//   mean_grad 4, cross-entropy grad 12, dW = 2*3*8*4 = 192, db 3  -> 421
// times 2 microbatches, plus the step: Adam 14 * (24 + 3) = 378 and the
// zeroing of the gradients 24 + 3 = 27: 842 + 405 = 1247.
// CHECK: rt.flops_per_step = 1247 : i64
func.func @head(%x: tensor<?x8xf32> {nn.input = "features"},
                %t: tensor<?xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<?x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<?x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<?x3xf32>, tensor<?xi32>) -> tensor<?xf32>
  %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
