// RUN: tessera-opt %s --tessera-attach-mesh="dp=4" --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s
// RUN: tessera-opt %s --tessera-attach-mesh="dp=1" --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s --check-prefix=DP1
// RUN: tessera-opt %s --tessera-attach-mesh="dp=4" --tessera-autodiff --tessera-dp-grad-allreduce="bucket-size=2" | FileCheck %s --check-prefix=SMALL
// RUN: tessera-opt %s --tessera-attach-mesh="dp=4" --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true" | FileCheck %s --check-prefix=DIST

// The gradients live in one flat buffer (Megatron's _ParamAndGradBuffer),
// laid out in reverse order: the bias first, then the weight. Per bucket they are packed,
// scaled by 1/dp and summed over the dp group.
// CHECK: dist.grad_buffer @gbuf {buckets = [array<i64: 0, 27, 27>], distributed = false, dp = 4 : i64, grad_dtype = "f32", numel = 27 : i64, numel_unpadded = 27 : i64, param_dtype = "f32", params = [{bucket = 0 : i64, end = 27 : i64, name = "head.weight", start = 3 : i64}, {bucket = 0 : i64, end = 3 : i64, name = "head.bias", start = 0 : i64}]}
// CHECK-LABEL: func.func @step
// CHECK-SAME: (%[[G0:.*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, %[[G1:.*]]: tensor<3xf32> {tessera.buffer = "grad:head.bias"})
// CHECK-SAME: -> (tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, tensor<3xf32> {tessera.buffer = "grad:head.bias"})
// CHECK-SAME: attributes {tessera.phase = "step"}
// CHECK-NEXT: %[[P:.*]] = dist.pack @gbuf bucket 0 "grad"(%[[G1]], %[[G0]]) : tensor<3xf32>, tensor<3x8xf32> -> tensor<27xf32>
// CHECK-NEXT: %[[S:.*]] = nn.scale %[[P]] {factor = 2.500000e-01 : f32} : tensor<27xf32>
// CHECK-NEXT: %[[R:.*]] = dist.all_reduce %[[S]] on @mesh "dp" : tensor<27xf32>
// CHECK-NEXT: %[[U:.*]]:2 = dist.unpack @gbuf bucket 0 "grad" %[[R]] : tensor<27xf32> -> tensor<3xf32>, tensor<3x8xf32>
// CHECK-NEXT: return %[[U]]#1, %[[U]]#0

// DP1-LABEL: func.func @step
// DP1-NOT: dist.all_reduce
// DP1: return %arg0, %arg1

// A new bucket once one holds bucket-size (2) elements: the bias alone,
// then the weight; one all-reduce per bucket, the bias first (the
// backward finishes it first).
// SMALL: buckets = [array<i64: 0, 3, 3>, array<i64: 3, 27, 24>]
// SMALL-LABEL: func.func @step
// SMALL: dist.pack @gbuf bucket 0 "grad"(%arg1)
// SMALL: dist.all_reduce %{{.*}} on @mesh "dp" : tensor<3xf32>
// SMALL: dist.pack @gbuf bucket 1 "grad"(%arg0)
// SMALL: dist.all_reduce %{{.*}} on @mesh "dp" : tensor<24xf32>

// The distributed optimizer: 64-element starts, the bucket padded to
// lcm(4, 128) = 128, reduce-scattered; the step returns the shard.
// DIST: dist.grad_buffer @gbuf {buckets = [array<i64: 0, 128, 88>], distributed = true, dp = 4 : i64, grad_dtype = "f32", numel = 128 : i64, numel_unpadded = 88 : i64, param_dtype = "f32", params = [{bucket = 0 : i64, end = 88 : i64, name = "head.weight", start = 64 : i64}, {bucket = 0 : i64, end = 3 : i64, name = "head.bias", start = 0 : i64}]
// DIST-LABEL: func.func @step
// DIST-SAME: -> (tensor<32xf32> {tessera.grad_shard = {bucket = 0 : i64, buffer = @gbuf}})
// DIST: %[[P:.*]] = dist.pack @gbuf bucket 0 "grad"
// DIST-NEXT: %[[S:.*]] = nn.scale %[[P]]
// DIST-NEXT: %[[RS:.*]] = dist.reduce_scatter %[[S]] on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<32xf32>
// DIST-NEXT: return %[[RS]]
func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
