// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s

// A parameter that enters a tensor-parallel region through copy_to_region
// (a layer norm or bias under sequence parallelism) gets a partial gradient
// per rank, summed by the all-reduce that is copy_to_region's adjoint. The
// microbatch phase accumulates it unreduced; the step reduces it once.

// CHECK-LABEL: func.func @m
// CHECK-NOT: dist.all_reduce
// CHECK: %[[DB:.*]] = nn.reduce_rows
// CHECK-NEXT: return %{{.*}}, %[[DB]]
// CHECK-LABEL: func.func @step
// CHECK-SAME: (%[[G:.*]]: tensor<4xf32> {tessera.buffer = "grad:b"})
// CHECK-NEXT: %[[R:.*]] = dist.all_reduce %[[G]] on @mesh "tp" : tensor<4xf32>
// CHECK-NEXT: %[[P:.*]] = dist.pack @gbuf bucket 0 "grad"(%[[R]])
// CHECK-NEXT: %[[S:.*]] = nn.scale %[[P]] {factor = 5.000000e-01 : f32}
// CHECK-NEXT: dist.all_reduce %[[S]] on @mesh "dp"
module {
  dist.mesh @mesh {tp = 2, dp = 2}
  func.func @m(%x: tensor<2x3x4xf32> {nn.input = "features"},
               %b: tensor<4xf32> {nn.param = "b"}) -> tensor<f32> {
    %bc = dist.copy_to_region %b on @mesh "tp" : tensor<4xf32>
    %y = nn.bias_add %x, %bc : (tensor<2x3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32>
    %z = nn.gelu %y : tensor<2x3x4xf32>
    %m = nn.mean %z : (tensor<2x3x4xf32>) -> tensor<f32>
    return %m : tensor<f32>
  }
}
