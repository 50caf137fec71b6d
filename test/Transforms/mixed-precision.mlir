// RUN: tessera-opt %s --tessera-mixed-precision=gemm-dtype=f32 | FileCheck %s
// RUN: tessera-opt %s --tessera-mixed-precision | FileCheck %s --check-prefix=GEMM
// RUN: tessera-opt %s --tessera-mixed-precision --tessera-autodiff | FileCheck %s --check-prefix=GRAD32
// RUN: tessera-opt %s --tessera-mixed-precision=grad-reduce-in-fp32=false --tessera-autodiff | FileCheck %s --check-prefix=GRAD16
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-mixed-precision --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=MAIN
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-mixed-precision --tessera-autodiff --tessera-dp-grad-allreduce=distributed-optimizer=true --tessera-optimizer="clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=ZERO
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-mixed-precision=grad-reduce-in-fp32=false --tessera-autodiff --tessera-dp-grad-allreduce=distributed-optimizer=true --tessera-optimizer="clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=ZERO16

// With f32 GEMMs, parameters are stored in bf16 and read through one cast
// to f32, right before their first reader; inputs stay as they are.
// CHECK: module attributes {tessera.mixed_precision = {grads = "f32", params = "bf16"}}
// CHECK: func.func @head(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %{{[^:]*}}: tensor<4xi32> {nn.input = "labels"}, %[[W:[^:]*]]: tensor<3x8xbf16> {nn.param = "head.weight"}, %[[B:[^:]*]]: tensor<3xbf16> {nn.param = "head.bias"}, %{{[^:]*}}: tensor<5xbf16> {nn.param = "unused"}) -> tensor<f32>
// CHECK-NEXT: %[[W32:.*]] = nn.cast %[[W]] : tensor<3x8xbf16> to tensor<3x8xf32>
// CHECK-NEXT: %[[B32:.*]] = nn.cast %[[B]] : tensor<3xbf16> to tensor<3xf32>
// CHECK-NEXT: nn.linear %[[X]], %[[W32]], %[[B32]] {nn.layer = 0 : i64} : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
// CHECK-NOT: nn.cast

// With bf16 GEMMs (the default) the linear reads its bf16 weight as it is
// and its input cast to bf16 (in its own layer), and accumulates in f32;
// the bias, which no GEMM reads, is cast to f32.
// GEMM: func.func @head(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %{{[^:]*}}: tensor<4xi32> {nn.input = "labels"}, %[[W:[^:]*]]: tensor<3x8xbf16> {nn.param = "head.weight"}, %[[B:[^:]*]]: tensor<3xbf16> {nn.param = "head.bias"}
// GEMM-NEXT: %[[B32:.*]] = nn.cast %[[B]] : tensor<3xbf16> to tensor<3xf32>
// GEMM-NEXT: %[[X16:.*]] = nn.cast %[[X]] {nn.layer = 0 : i64} : tensor<4x8xf32> to tensor<4x8xbf16>
// GEMM-NEXT: nn.linear %[[X16]], %[[W]], %[[B32]] {nn.layer = 0 : i64} : (tensor<4x8xbf16>, tensor<3x8xbf16>, tensor<3xf32>) -> tensor<4x3xf32>
// GEMM-NOT: nn.cast

// With grad-reduce-in-fp32 (the default) a gradient is the f32 adjoint
// itself: the wgrad GEMM's f32 result (Megatron's main_grad), the bias's
// f32 row sums of dy. The GEMM takes dy rounded to bf16 and the saved bf16
// input. An unused parameter's zero gradient is f32 too.
// GRAD32: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<3x8xf32> {tessera.grad_of = "head.weight"}, tensor<3xf32> {tessera.grad_of = "head.bias"}, tensor<5xf32> {tessera.grad_of = "unused"})
// GRAD32: %[[X16:.*]] = nn.cast %{{.*}} {nn.layer = 0 : i64} : tensor<4x8xf32> to tensor<4x8xbf16>
// GRAD32: %[[DY:.*]] = nn.softmax_cross_entropy_grad
// GRAD32-NEXT: %[[DY16:.*]] = nn.cast %[[DY]] : tensor<4x3xf32> to tensor<4x3xbf16>
// GRAD32-NEXT: %[[DW:.*]] = nn.matmul %[[DY16]], %[[X16]] {transpose_lhs} : (tensor<4x3xbf16>, tensor<4x8xbf16>) -> tensor<3x8xf32>
// GRAD32-NEXT: %[[DB:.*]] = nn.reduce_rows %[[DY]]
// GRAD32-NEXT: %[[DU:.*]] = nn.fill 0.000000e+00 : tensor<5xf32>
// GRAD32-NEXT: return %{{.*}}, %[[DW]], %[[DB]], %[[DU]]

// Gradients in bf16: each f32 gradient is rounded once, at the end.
// GRAD16: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<3x8xbf16> {tessera.grad_of = "head.weight"}, tensor<3xbf16> {tessera.grad_of = "head.bias"}, tensor<5xbf16> {tessera.grad_of = "unused"})
// GRAD16: %[[DW:.*]] = nn.matmul %{{.*}}, %{{.*}} {transpose_lhs}
// GRAD16-NEXT: %[[DB:.*]] = nn.reduce_rows
// GRAD16-NEXT: %[[DW16:.*]] = nn.cast %[[DW]] : tensor<3x8xf32> to tensor<3x8xbf16>
// GRAD16-NEXT: %[[DB16:.*]] = nn.cast %[[DB]] : tensor<3xf32> to tensor<3xbf16>
// GRAD16-NEXT: %[[DU:.*]] = nn.fill 0.000000e+00 : tensor<5xbf16>
// GRAD16-NEXT: return %{{.*}}, %[[DW16]], %[[DB16]], %[[DU]]

// The grad buffer groups by (param dtype, grad dtype). The optimizer steps
// each fp32 main parameter with its f32 gradient and writes the parameter
// back rounded to bf16; the init phase makes the main parameters from the
// parameters once.
// MAIN: dist.grad_buffer @gbuf {{{.*}}grad_dtype = "f32", {{.*}}param_dtype = "bf16"
// MAIN-LABEL: func.func @step
// MAIN-SAME: %[[T:[^:]*]]: tensor<i64> {tessera.buffer = "iteration"}, %[[M:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "main:head.weight"}, %{{[^:]*}}: tensor<3x8xf32> {tessera.buffer = "adam.exp_avg:head.weight"}
// MAIN-SAME: -> (tensor<3x8xbf16> {tessera.buffer = "head.weight"}, tensor<3x8xf32> {tessera.buffer = "main:head.weight"}, tensor<3x8xf32> {tessera.buffer = "adam.exp_avg:head.weight"}
// MAIN: %[[U:.*]]:3 = dist.unpack @gbuf bucket 0 "grad" %{{.*}} : tensor<32xf32>
// MAIN: %[[NM:[^,]*]], %{{.*}}, %{{.*}} = nn.adam %[[M]], %[[U]]#2, %{{.*}}, %{{.*}}, %[[T]]
// MAIN-NEXT: %[[NP:.*]] = nn.cast %[[NM]] : tensor<3x8xf32> to tensor<3x8xbf16>
// MAIN: return %[[NP]], %[[NM]],
// MAIN-LABEL: func.func @init
// MAIN-SAME: (%[[PW:[^:]*]]: tensor<3x8xbf16> {tessera.buffer = "head.weight"}, %[[PB:[^:]*]]: tensor<3xbf16> {tessera.buffer = "head.bias"}, %[[PU:[^:]*]]: tensor<5xbf16> {tessera.buffer = "unused"})
// MAIN-SAME: -> (tensor<3x8xf32> {tessera.buffer = "main:head.weight"}, tensor<3xf32> {tessera.buffer = "main:head.bias"}, tensor<5xf32> {tessera.buffer = "main:unused"})
// MAIN-SAME: attributes {tessera.phase = "init"}
// MAIN-NEXT: %[[A:.*]] = nn.cast %[[PW]] : tensor<3x8xbf16> to tensor<3x8xf32>
// MAIN-NEXT: %[[B:.*]] = nn.cast %[[PB]]
// MAIN-NEXT: %[[C:.*]] = nn.cast %[[PU]]
// MAIN-NEXT: return %[[A]], %[[B]], %[[C]]

// The distributed optimizer keeps this rank's fp32 main shard of each
// bucket (1/dp of the 256-element padded bucket), steps it with the
// reduce-scattered f32 gradient shard, and all-gathers the bf16 shards
// into the parameters. The init phase takes the same shard of the packed
// bf16 parameters.
// ZERO: dist.grad_buffer @gbuf {{{.*}}distributed = true, {{.*}}grad_dtype = "f32", numel = 256 : i64, {{.*}}param_dtype = "bf16"
// ZERO-LABEL: func.func @step
// ZERO-SAME: %[[T:[^:]*]]: tensor<i64> {tessera.buffer = "iteration"}, %[[M:[^:]*]]: tensor<128xf32> {tessera.buffer = "main:pbuf:gbuf:0"}
// ZERO-NOT: tessera.buffer = "head.weight"} {{.*}}->
// ZERO: %[[G:.*]] = dist.reduce_scatter %{{.*}} on @mesh "dp" dim 0 : tensor<256xf32> -> tensor<128xf32>
// ZERO-NEXT: %[[NM:[^,]*]], %{{.*}}, %{{.*}} = nn.adam %[[M]], %[[G]], %{{.*}}, %{{.*}}, %[[T]]
// ZERO-NEXT: %[[S:.*]] = nn.cast %[[NM]] : tensor<128xf32> to tensor<128xbf16>
// ZERO-NEXT: %[[AG:.*]] = dist.all_gather %[[S]] on @mesh "dp" dim 0 : tensor<128xbf16> -> tensor<256xbf16>
// ZERO-NEXT: %[[P:.*]]:3 = dist.unpack @gbuf bucket 0 "param" %[[AG]] : tensor<256xbf16> -> tensor<5xbf16>, tensor<3xbf16>, tensor<3x8xbf16>
// ZERO: return %[[P]]#0, %[[P]]#1, %[[P]]#2, %[[NM]],
// ZERO-LABEL: func.func @init
// ZERO-SAME: -> (tensor<128xf32> {tessera.buffer = "main:pbuf:gbuf:0"})
// ZERO-NEXT: %[[F:.*]] = dist.pack @gbuf bucket 0 "param"(%{{.*}}) : tensor<5xbf16>, tensor<3xbf16>, tensor<3x8xbf16> -> tensor<256xbf16>
// ZERO-NEXT: %[[MINE:.*]] = dist.scatter_to_region %[[F]] on @mesh "dp" {dim = 0 : i64} : tensor<256xbf16> -> tensor<128xbf16>
// ZERO-NEXT: %[[C:.*]] = nn.cast %[[MINE]] : tensor<128xbf16> to tensor<128xf32>
// ZERO-NEXT: return %[[C]]

// Gradients reduced in bf16: the bf16 bucket is scaled and reduce-scattered
// in bf16, and its shard cast to f32 for the step.
// ZERO16: dist.grad_buffer @gbuf {{{.*}}grad_dtype = "bf16", {{.*}}param_dtype = "bf16"
// ZERO16-LABEL: func.func @step
// ZERO16: %[[P:.*]] = dist.pack @gbuf bucket 0 "grad"(%{{.*}}) : tensor<5xbf16>, tensor<3xbf16>, tensor<3x8xbf16> -> tensor<256xbf16>
// ZERO16-NEXT: %[[S:.*]] = nn.scale %[[P]] {factor = 5.000000e-01 : f32} : tensor<256xbf16>
// ZERO16-NEXT: %[[R:.*]] = dist.reduce_scatter %[[S]] on @mesh "dp" dim 0 : tensor<256xbf16> -> tensor<128xbf16>
// ZERO16-NEXT: %[[R32:.*]] = nn.cast %[[R]] : tensor<128xbf16> to tensor<128xf32>
// ZERO16-NEXT: nn.adam %{{.*}}, %[[R32]],
// ZERO16: nn.fill 0.000000e+00 : tensor<256xbf16>
func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"},
                %u: tensor<5xf32> {nn.param = "unused"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b {nn.layer = 0 : i64} : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
