// Megatron's --fp16: parameters stored in f16 and the GEMMs that read them
// in f16 (f32 accumulation), gradients in f32, the backward seeded with
// the loss scale (nn.loss_seed, Megatron's scale_loss) and the step
// unscaling the gradients in its clipping coefficient
// (nn.clip_grad_norm {unscale}: the norm is taken even without clipping,
// and a norm that is not finite skips the updates at run time).

// RUN: tessera-opt %s --tessera-mixed-precision=params-dtype=f16 | FileCheck %s --check-prefix=GEMM
// RUN: tessera-opt %s --tessera-mixed-precision=params-dtype=f16 --tessera-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: tessera-opt %s --tessera-mixed-precision=params-dtype=f16 --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=STEP
// RUN: tessera-opt %s --tessera-mixed-precision=params-dtype=f16 --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="clip-grad=0 loss-scale=1024" | FileCheck %s --check-prefix=NOCLIP
// RUN: tessera-opt %s --tessera-mixed-precision=params-dtype=f16 --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer --tessera-lower-to-rt | FileCheck %s --check-prefix=RT
// Without f16 parameters the seed is a plain fill and nothing unscales.
// RUN: tessera-opt %s --tessera-mixed-precision --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=BF16

// GEMM: module attributes {tessera.mixed_precision = {grads = "f32", params = "f16"}}
// GEMM: func.func @head(%[[X:[^:]*]]: tensor<4x8xf32> {nn.input = "features"}, %{{[^:]*}}: tensor<4xi32> {nn.input = "labels"}, %[[W:[^:]*]]: tensor<3x8xf16> {nn.param = "head.weight"}, %[[B:[^:]*]]: tensor<3xf16> {nn.param = "head.bias"})
// GEMM-NEXT: %[[B32:.*]] = nn.cast %[[B]] : tensor<3xf16> to tensor<3xf32>
// GEMM-NEXT: %[[X16:.*]] = nn.cast %[[X]] : tensor<4x8xf32> to tensor<4x8xf16>
// GEMM-NEXT: nn.linear %[[X16]], %[[W]], %[[B32]] : (tensor<4x8xf16>, tensor<3x8xf16>, tensor<3xf32>) -> tensor<4x3xf32>

// The seed carries the loss scale; dy is rounded to f16 for the wgrad
// GEMM (where a too large scale overflows), the gradients are f32.
// GRAD: -> (tensor<f32> {tessera.buffer = "loss"}, tensor<3x8xf32> {tessera.grad_of = "head.weight"}, tensor<3xf32> {tessera.grad_of = "head.bias"})
// GRAD: %[[SEED:.*]] = nn.loss_seed 1.000000e+00 : tensor<f32>
// GRAD-NOT: nn.fill
// GRAD: %[[DY:.*]] = nn.softmax_cross_entropy_grad
// GRAD-NEXT: %[[DY16:.*]] = nn.cast %[[DY]] : tensor<4x3xf32> to tensor<4x3xf16>
// GRAD-NEXT: nn.matmul %[[DY16]], %{{.*}} {transpose_lhs} : (tensor<4x3xf16>, tensor<4x8xf16>) -> tensor<3x8xf32>

// The step: the norm of the scaled gradients, unscaled with the clipping
// coefficient; the scaler's settings (Megatron's defaults) recorded for
// the launcher; fp32 main parameters updated, cast back to f16.
// STEP: tessera.optimizer = {{{.*}}hysteresis = 2 : i64, initial_loss_scale = 0x41F0000000000000 : f64, {{.*}}loss_scale = 0.000000e+00 : f64, loss_scale_window = 1000 : i64, {{.*}}min_loss_scale = 1.000000e+00 : f64
// STEP-LABEL: func.func @step
// STEP: %[[NORM:.*]], %[[C:.*]] = nn.clip_grad_norm %{{.*}} {max_norm = 1.000000e+00 : f32, unscale}
// STEP: nn.scale_by %{{.*}}, %[[C]] : tensor<3x8xf32>
// STEP: nn.adam
// STEP: nn.cast %{{.*}} : tensor<3x8xf32> to tensor<3x8xf16>

// --clip-grad 0 under fp16 keeps the norm (its coefficient only
// unscales); --loss-scale sets a constant scale.
// NOCLIP: loss_scale = 1.024000e+03 : f64
// NOCLIP-LABEL: func.func @step
// NOCLIP-SAME: tensor<f32> {tessera.buffer = "grad_norm"}
// NOCLIP: nn.clip_grad_norm %{{.*}} {max_norm = 0.000000e+00 : f32, unscale}

// In the artifact's instructions: LossSeed, and ClipGradNorm's iattrs
// [unscale].
// RT: rt.loss_seed %{{.*}} {value = 1.000000e+00 : f32}
// RT: rt.clip_grad_norm %{{.*}} {iattrs = array<i64: 1>, value = 1.000000e+00 : f32}

// An MoE layer's auxiliary loss gets the loss's own scaled seed
// (Megatron's MoEAuxLossAutoScaler.set_loss_scale(loss_scale /
// num_microbatches)): both seeds are nn.loss_seed.
// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 64 --seq 8 --num-experts 2 --moe-router-topk 1 --moe-aux-loss-coeff 0.01 -o %t.moe.mlir
// RUN: tessera-opt %t.moe.mlir --tessera-set-batch="micro-batch-size=2" --tessera-mixed-precision=params-dtype=f16 --tessera-autodiff | FileCheck %s --check-prefix=AUX
// AUX: nn.add_aux_loss
// AUX: nn.loss_seed 1.000000e+00 : tensor<f32>
// AUX: nn.loss_seed 1.000000e+00 : tensor<f32>
// AUX-NOT: nn.fill 1.000000e+00 : tensor<f32>

// BF16-NOT: nn.loss_seed
// BF16: nn.fill 1.000000e+00 : tensor<f32>
// BF16: nn.clip_grad_norm %{{.*}} {max_norm = 1.000000e+00 : f32} :

func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
