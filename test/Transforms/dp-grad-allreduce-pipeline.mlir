// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s
// RUN: tessera-opt %s --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true bucket-size=10" | FileCheck %s --check-prefix=DIST

// With the distributed optimizer the shared embedding gets a bucket of its
// own (Megatron's _does_param_require_new_bucket); on the first stage a
// bucket closes at bucket-size elements, later stages keep one bucket
// otherwise.
// DIST-LABEL: module @pp0
// DIST: dist.grad_buffer @gbuf_c0 {buckets = [array<i64: 0, 128, 64>, array<i64: 128, 256, 64>]
// DIST-SAME: params = [{bucket = 1 : i64, end = 192 : i64, name = "tied.w", start = 128 : i64}, {bucket = 0 : i64, end = 64 : i64, name = "l1.w", start = 0 : i64}]
// DIST-LABEL: module @pp1
// DIST: dist.grad_buffer @gbuf_c0 {buckets = [array<i64: 0, 128, 64>, array<i64: 128, 256, 64>]
// DIST-SAME: params = [{bucket = 1 : i64, end = 192 : i64, name = "tied.w", start = 128 : i64}, {bucket = 0 : i64, end = 64 : i64, name = "l2.w", start = 0 : i64}]

// Per pipeline rank, the step takes the gradients of that rank's
// parameters, in a grad buffer per model chunk. The table used on the
// first and the last pipeline rank (tied embedding and LM head) is summed
// over the embedding group first, as Megatron does after the backward;
// then every bucket is averaged over dp.

// CHECK-LABEL: module @pp0
// CHECK: func.func @step(%[[T:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:tied.w"}, %[[W:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:l1.w"})
// CHECK-NEXT: %[[E:.*]] = dist.all_reduce %[[T]] on @mesh "embedding" : tensor<8x8xf32>
// CHECK-NEXT: %[[P:.*]] = dist.pack @gbuf_c0 bucket 0 "grad"(%[[W]], %[[E]])
// CHECK-NEXT: %[[S:.*]] = nn.scale %[[P]] {factor = 5.000000e-01 : f32}
// CHECK-NEXT: dist.all_reduce %[[S]] on @mesh "dp"
// CHECK-LABEL: module @pp1
// CHECK: func.func @step(%[[T1:[^:]*]]: tensor<8x8xf32> {tessera.buffer = "grad:tied.w"}, %{{.*}}: tensor<8x8xf32> {tessera.buffer = "grad:l2.w"})
// CHECK: dist.all_reduce %[[T1]] on @mesh "embedding"

dist.mesh @mesh {pp = 2, dp = 2}
func.func @tied(%x: tensor<4x8xf32> {nn.input = "features"},
                %wt: tensor<8x8xf32> {nn.param = "tied.w"},
                %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                %w2: tensor<8x8xf32> {nn.param = "l2.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %wt {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %wt : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h3 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
