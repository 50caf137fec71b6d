// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-gather-params | FileCheck %s
// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-gather-params=prefetch=1 | FileCheck %s --check-prefix=PREFETCH

// ZeRO-3 (shard_params): a phase gathers a bucket right before each run of
// ops that read its parameters; a run ends at an op that reads other
// buckets only. Bucket 0 (b, c) is read by two ops in a row: one gather.
// Bucket 1 (a) twice in a row: one gather. Then b again, after a: a new
// gather of bucket 0 (as the backward's). An op reading both buckets
// keeps bucket 1's run open; the next op, reading bucket 0 only, ends it.
// The step and init phases are left alone; a phase that reads no
// parameter gets no shard argument.
dist.mesh @mesh {dp = 2}
dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_grads = true, shard_params = true,
    numel = 512 : i64, numel_unpadded = 82 : i64,
    params = [{name = "a", start = 256 : i64, end = 264 : i64, bucket = 1 : i64},
              {name = "c", start = 64 : i64, end = 74 : i64, bucket = 0 : i64},
              {name = "b", start = 0 : i64, end = 8 : i64, bucket = 0 : i64}],
    buckets = [array<i64: 0, 256, 74>, array<i64: 256, 512, 8>]}

// With prefetch, each gather but the first starts right after the
// previous one's unpack and is waited for where it was.
// PREFETCH-LABEL: func.func @phase
// PREFETCH-NEXT: %[[G0:.*]] = dist.all_gather %{{.*}} on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<256xf32>
// PREFETCH-NEXT: %[[U0:.*]]:2 = dist.unpack @gbuf bucket 0 "param" %[[G0]]
// PREFETCH-NEXT: %[[F1:.*]] = dist.all_gather_start %{{.*}} on @mesh "dp" dim 0 : tensor<128xf32> -> !dist.async<tensor<256xf32>>
// PREFETCH-NEXT: nn.add %{{.*}}, %[[U0]]#0
// PREFETCH-NEXT: nn.sum_squares %[[U0]]#1
// PREFETCH-NEXT: %[[W1:.*]] = dist.wait %[[F1]] : !dist.async<tensor<256xf32>> -> tensor<256xf32>
// PREFETCH-NEXT: %[[U1:.*]] = dist.unpack @gbuf bucket 1 "param" %[[W1]]
// PREFETCH-NEXT: %[[F2:.*]] = dist.all_gather_start
// PREFETCH-NEXT: nn.add %{{.*}}, %[[U1]]
// PREFETCH-NEXT: nn.add %{{.*}}, %[[U1]]
// PREFETCH-NEXT: %[[W2:.*]] = dist.wait %[[F2]]
// PREFETCH-NEXT: %[[U2:.*]]:2 = dist.unpack @gbuf bucket 0 "param" %[[W2]]
// PREFETCH-NEXT: %[[F3:.*]] = dist.all_gather_start
// PREFETCH-NEXT: nn.add %[[U1]], %[[U2]]#0
// PREFETCH-NEXT: nn.add %{{.*}}, %[[U2]]#0
// PREFETCH-NEXT: %[[W3:.*]] = dist.wait %[[F3]]
// PREFETCH-NEXT: %[[U3:.*]] = dist.unpack @gbuf bucket 1 "param" %[[W3]]
// PREFETCH-NEXT: nn.add %{{.*}}, %[[U3]]
// CHECK-LABEL: func.func @phase
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<8xf32>, %[[A:[a-z0-9]+]]: tensor<8xf32> {nn.param = "a"}, %[[B:[a-z0-9]+]]: tensor<8xf32> {nn.param = "b"}, %[[C:[a-z0-9]+]]: tensor<10xf32> {nn.param = "c"}, %[[S0:[a-z0-9]+]]: tensor<128xf32> {tessera.buffer = "pshard:gbuf:0"}, %[[S1:[a-z0-9]+]]: tensor<128xf32> {tessera.buffer = "pshard:gbuf:1"})
func.func @phase(%x: tensor<8xf32>, %a: tensor<8xf32> {nn.param = "a"}, %b: tensor<8xf32> {nn.param = "b"}, %c: tensor<10xf32> {nn.param = "c"}) -> tensor<8xf32> attributes {tessera.phase = "microbatch"} {
  // CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[S0]] on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<256xf32>
  // CHECK-NEXT: %[[U0:.*]]:2 = dist.unpack @gbuf bucket 0 "param" %[[G0]] : tensor<256xf32> -> tensor<8xf32>, tensor<10xf32>
  // CHECK-NEXT: %[[Y1:.*]] = nn.add %[[X]], %[[U0]]#0
  %y1 = nn.add %x, %b : tensor<8xf32>
  // CHECK-NEXT: nn.sum_squares %[[U0]]#1
  %n = nn.sum_squares %c : tensor<10xf32> -> tensor<f32>
  // CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[S1]] on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<256xf32>
  // CHECK-NEXT: %[[U1:.*]] = dist.unpack @gbuf bucket 1 "param" %[[G1]] : tensor<256xf32> -> tensor<8xf32>
  // CHECK-NEXT: %[[Y2:.*]] = nn.add %[[Y1]], %[[U1]]
  %y2 = nn.add %y1, %a : tensor<8xf32>
  // CHECK-NEXT: %[[Y3:.*]] = nn.add %[[Y2]], %[[U1]]
  %y3 = nn.add %y2, %a : tensor<8xf32>
  // CHECK-NEXT: %[[G2:.*]] = dist.all_gather %[[S0]]
  // CHECK-NEXT: %[[U2:.*]]:2 = dist.unpack @gbuf bucket 0 "param" %[[G2]]
  // CHECK-NEXT: %[[Y4:.*]] = nn.add %[[U1]], %[[U2]]#0
  %y4 = nn.add %a, %b : tensor<8xf32>
  // CHECK-NEXT: %[[Y5:.*]] = nn.add %[[Y4]], %[[U2]]#0
  %y5 = nn.add %y4, %b : tensor<8xf32>
  // CHECK-NEXT: %[[G3:.*]] = dist.all_gather %[[S1]]
  // CHECK-NEXT: %[[U3:.*]] = dist.unpack @gbuf bucket 1 "param" %[[G3]]
  // CHECK-NEXT: nn.add %[[Y5]], %[[U3]]
  %y6 = nn.add %y5, %a : tensor<8xf32>
  return %y6 : tensor<8xf32>
}

// CHECK-LABEL: func.func @step
// CHECK-SAME: (%{{.*}}: tensor<128xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<128xf32> {tessera.buffer = "pshard:gbuf:0"})
// CHECK-NOT: dist.all_gather
func.func @step(%s: tensor<128xf32> {tessera.buffer = "pshard:gbuf:0"}) -> (tensor<128xf32> {tessera.buffer = "pshard:gbuf:0"}) attributes {tessera.phase = "step"} {
  return %s : tensor<128xf32>
}

// CHECK-LABEL: func.func @no_params
// CHECK-SAME: (%{{.*}}: tensor<8xf32>) -> tensor<8xf32>
func.func @no_params(%x: tensor<8xf32>) -> tensor<8xf32> attributes {tessera.phase = "eval"} {
  return %x : tensor<8xf32>
}

// -----

// Every parameter of a bucket a phase reads must be some phase's argument
// (a backward takes only the parameters it reads; the forward takes all).
dist.mesh @mesh {dp = 2}
dist.grad_buffer @gbuf {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
    distributed = true, shard_grads = true, shard_params = true,
    numel = 256 : i64, numel_unpadded = 74 : i64,
    params = [{name = "c", start = 64 : i64, end = 74 : i64, bucket = 0 : i64},
              {name = "b", start = 0 : i64, end = 8 : i64, bucket = 0 : i64}],
    buckets = [array<i64: 0, 256, 74>]}
// expected-error @+1 {{reads bucket 0 of @gbuf but no phase of the program takes every parameter of it}}
func.func @partial(%x: tensor<8xf32>, %b: tensor<8xf32> {nn.param = "b"}) -> tensor<8xf32> attributes {tessera.phase = "microbatch"} {
  %y = nn.add %x, %b : tensor<8xf32>
  return %y : tensor<8xf32>
}
