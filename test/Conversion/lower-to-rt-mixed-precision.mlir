// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=8" --tessera-mixed-precision --tessera-autodiff --tessera-dp-grad-allreduce=distributed-optimizer=true --tessera-optimizer="clip-grad=0 weight-decay=0" --tessera-lower-to-rt | FileCheck %s
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=8" --tessera-mixed-precision=gemm-dtype=f32 --tessera-autodiff --tessera-dp-grad-allreduce=distributed-optimizer=true --tessera-optimizer="clip-grad=0 weight-decay=0" --tessera-lower-to-rt | FileCheck %s --check-prefix=F32GEMM
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=8" --tessera-mixed-precision=grad-reduce-in-fp32=false --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="clip-grad=0 weight-decay=0" --tessera-lower-to-rt | FileCheck %s --check-prefix=BF16GRAD

// bf16 parameters with the distributed optimizer: the f32 gradients fill
// the grad buffer's region (4 bytes an element, 256 elements), the bf16
// parameters the parameter region after it (2 bytes an element, so
// "head.weight" at element 128 is at byte 1024 + 256, its gradient at
// byte 512). Each rank keeps its
// fp32 main shard (kind main_param) and Adam state of 128 elements.
// CHECK-DAG: rt.buffer @head.weight : memref<3x8xbf16> {global_shape = array<i64: 3, 8>, init = "normal:0.02", kind = "param", offset = 1280 : i64}
// CHECK-DAG: rt.buffer @head.bias : memref<3xbf16> {{{.*}}kind = "param", offset = 1152 : i64}
// CHECK-DAG: rt.buffer @unused : memref<5xbf16> {{{.*}}kind = "param", offset = 1024 : i64}
// CHECK-DAG: rt.buffer @"grad:head.weight" : memref<3x8xf32> {kind = "grad", of = @head.weight, offset = 512 : i64}
// CHECK-DAG: rt.buffer @"main:pbuf:gbuf:0" : memref<128xf32> {kind = "main_param", offset = [[MAIN:[0-9]+]] : i64}
// CHECK-DAG: rt.buffer @"adam.exp_avg:pbuf:gbuf:0" : memref<128xf32> {kind = "opt_state"
// CHECK-DAG: rt.buffer @"gbuf:gbuf:0" : memref<256xf32> {kind = "view", offset = 0 : i64}
// CHECK-DAG: rt.buffer @"pbuf:gbuf:0" : memref<256xbf16> {kind = "view", offset = 1024 : i64}
// This rank's blocks of the buckets: rank-relative views.
// CHECK-DAG: rt.buffer @"gshard:gbuf:0" : memref<128xf32> {kind = "view", offset = 0 : i64, rank_group = "dp", rank_stride = 512 : i64}
// CHECK-DAG: rt.buffer @"pshard:gbuf:0" : memref<128xbf16> {kind = "view", offset = 1024 : i64, rank_group = "dp", rank_stride = 256 : i64}

// bf16 GEMMs: the forward GEMM reads the bf16 parameter buffer itself and
// a bf16 transient of its input; the wgrad GEMM reads that transient and
// dy rounded to bf16, accumulating in f32 straight into the f32 gradient
// (beta = 1). Only the bias, which no GEMM reads, is cast to f32.
// CHECK-LABEL: func.func @microbatch
// CHECK-DAG: %[[W:.*]] = rt.get @head.weight : memref<3x8xbf16>
// CHECK-DAG: %[[DW:.*]] = rt.get @"grad:head.weight" : memref<3x8xf32>
// CHECK-DAG: %[[X16:.*]] = rt.alloc offset {{[0-9]+}} : memref<4x8xbf16>
// CHECK-DAG: %[[X:.*]] = rt.get @features : memref<4x8xf32>
// CHECK: rt.cast %[[X]], %[[X16]] : memref<4x8xf32>, memref<4x8xbf16>
// CHECK-NEXT: rt.gemm %[[X16]], %[[W]], %{{.*}} {trans_b} : memref<4x8xbf16>, memref<3x8xbf16>, memref<4x3xf32>
// CHECK: rt.cast %[[DY:.*]], %[[DY16:.*]] : memref<4x3xf32>, memref<4x3xbf16>
// CHECK-NEXT: rt.gemm %[[DY16]], %[[X16]], %[[DW]] {beta = 1.000000e+00 : f32, trans_a} : memref<4x3xbf16>, memref<4x8xbf16>, memref<3x8xf32>
// CHECK-NOT: memref<3x8xbf16>, memref<3x8xf32>

// f32 GEMMs: the model reads its parameters through casts to f32
// transients; the gradients accumulate in f32 directly (GEMM beta = 1).
// F32GEMM-LABEL: func.func @microbatch
// F32GEMM-DAG: %[[W:.*]] = rt.get @head.weight : memref<3x8xbf16>
// F32GEMM-DAG: %[[W32:.*]] = rt.alloc offset {{[0-9]+}} : memref<3x8xf32>
// F32GEMM: rt.cast %[[W]], %[[W32]] : memref<3x8xbf16>, memref<3x8xf32>
// F32GEMM: rt.gemm %{{.*}}, %[[W32]], %{{.*}} {trans_b}
// F32GEMM: rt.gemm %{{.*}}, %{{.*}}, %{{.*}} {beta = 1.000000e+00 : f32, trans_a} : memref<4x3xf32>, memref<4x8xf32>, memref<3x8xf32>

// The step works in the buffers, as Megatron's distributed optimizer:
// reduce-scatter the f32 bucket in place into this rank's block, Adam on
// the main shard, round it straight into this rank's block of the bf16
// parameter bucket and all-gather around it. No transients.
// CHECK-LABEL: func.func @step
// CHECK-NOT: rt.alloc
// CHECK-DAG: %[[PB:.*]] = rt.get @"pbuf:gbuf:0" : memref<256xbf16>
// CHECK-DAG: %[[S16:.*]] = rt.get @"pshard:gbuf:0" : memref<128xbf16>
// CHECK-DAG: %[[M:.*]] = rt.get @"main:pbuf:gbuf:0" : memref<128xf32>
// CHECK-DAG: %[[G:.*]] = rt.get @"gshard:gbuf:0" : memref<128xf32>
// CHECK-DAG: %[[GB:.*]] = rt.get @"gbuf:gbuf:0" : memref<256xf32>
// CHECK: rt.reduce_scatter %[[GB]], %[[G]] {group = "dp"} : memref<256xf32>, memref<128xf32>
// CHECK-NEXT: rt.adam %[[M]], %[[G]],
// CHECK-NEXT: rt.cast %[[M]], %[[S16]] : memref<128xf32>, memref<128xbf16>
// CHECK-NEXT: rt.all_gather %[[S16]], %[[PB]] {group = "dp"} : memref<128xbf16>, memref<256xbf16>

// The init entry: this rank's block of the bf16 parameter bucket, in f32.
// CHECK-LABEL: func.func @init() attributes {rt.dense_flops = 0 : i64, rt.entry, rt.flops = {{[0-9]+}} : i64, rt.light_bytes = {{[0-9]+}} : i64, tessera.phase = "init"}
// CHECK-DAG: %[[IM:.*]] = rt.get @"main:pbuf:gbuf:0" : memref<128xf32>
// CHECK-DAG: %[[IS:.*]] = rt.get @"pshard:gbuf:0" : memref<128xbf16>
// CHECK-NOT: rt.copy
// CHECK: rt.cast %[[IS]], %[[IM]] : memref<128xbf16>, memref<128xf32>

// bf16 gradients: 2-byte elements in the grad buffer, accumulated by a
// cast with beta = 1 (f32 sum, rounded once per microbatch); the step
// reduces the bf16 bucket and casts each gradient to f32 for Adam on the
// per-parameter main copy, then rounds the main copy into the parameter.
// BF16GRAD-DAG: rt.buffer @"grad:head.weight" : memref<3x8xbf16> {kind = "grad", of = @head.weight, offset = 16 : i64}
// BF16GRAD-DAG: rt.buffer @"grad:head.bias" : memref<3xbf16> {kind = "grad", of = @head.bias, offset = 10 : i64}
// BF16GRAD-DAG: rt.buffer @"main:head.weight" : memref<3x8xf32> {kind = "main_param", of = @head.weight
// BF16GRAD-DAG: rt.buffer @"gbuf:gbuf:0" : memref<32xbf16> {kind = "view", offset = 0 : i64}
// BF16GRAD-LABEL: func.func @microbatch
// BF16GRAD: rt.gemm %{{.*}}, %{{.*}}, %[[DW:.*]] {trans_a} : memref<4x3xbf16>, memref<4x8xbf16>, memref<3x8xf32>
// BF16GRAD: rt.cast %[[DW]], %{{.*}} {beta = 1.000000e+00 : f32} : memref<3x8xf32>, memref<3x8xbf16>
// BF16GRAD-LABEL: func.func @step
// BF16GRAD: rt.scale %[[V:.*]], %[[V]] {alpha = 5.000000e-01 : f32} : memref<32xbf16>, memref<32xbf16>
// BF16GRAD-NEXT: rt.all_reduce %[[V]] {group = "dp"} : memref<32xbf16>
// The f32 gradients first (the clipping, when on, scales them before any
// update), then the updates.
// BF16GRAD-NEXT: rt.cast %{{.*}}, %[[G32:.*]] : memref<3x8xbf16>, memref<3x8xf32>
// BF16GRAD: rt.adam %[[M:.*]], %[[G32]],
// BF16GRAD-NEXT: rt.cast %[[M]], %{{.*}} : memref<3x8xf32>, memref<3x8xbf16>
// BF16GRAD: rt.fill %[[V]] {value = 0.000000e+00 : f32} : memref<32xbf16>
// BF16GRAD-LABEL: func.func @init
func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"},
                %u: tensor<5xf32> {nn.param = "unused"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
