// Megatron's defaults in the optimizer pass: AdamW-style decoupled weight
// decay on all but biases and 1-D parameters (Megatron's
// get_param_groups: no decay for biases and norm weights), and gradients
// clipped to a global L2 norm of --clip-grad (clip_grad_norm_fp32) before
// any update. The norm (before clipping) is a step result bound to
// "grad_norm", which tessera-run logs.

// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=ONE
// ONE: tessera.optimizer = {beta1 = {{.*}}, clip_grad = 1.000000e+00 : f32, {{.*}}weight_decay = 0.00999999977 : f32}
// ONE-LABEL: func.func @step
// ONE-SAME: %[[GW:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, %[[GB:[^:]*]]: tensor<3xf32> {tessera.buffer = "grad:head.bias"}
// ONE-SAME: -> (tensor<f32> {tessera.buffer = "grad_norm"}
// ONE: %[[SW:.*]] = nn.sum_squares %[[GW]] : tensor<3x8xf32> -> tensor<f32>
// ONE: %[[SB:.*]] = nn.sum_squares %[[GB]] : tensor<3xf32> -> tensor<f32>
// ONE: %[[S:.*]] = nn.add %[[SW]], %[[SB]]
// ONE-NOT: dist.all_reduce
// ONE: %[[NORM:.*]], %[[C:.*]] = nn.clip_grad_norm %[[S]] {max_norm = 1.000000e+00 : f32}
// ONE: %[[CW:.*]] = nn.scale_by %[[GW]], %[[C]]
// ONE: %[[CB:.*]] = nn.scale_by %[[GB]], %[[C]]
// ONE: nn.adam %{{.*}}, %[[CW]], {{.*}}weight_decay = 0.00999999977 : f32}
// ONE: nn.adam %{{.*}}, %[[CB]], {{.*}}weight_decay = 0.000000e+00 : f32}
// ONE: return %[[NORM]],

// --clip-grad 0 clips nothing (Megatron's clip_grad = 0); the weight decay
// given applies to the decayed group only.
// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="clip-grad=0 weight-decay=0.1 adam-beta1=0.8 adam-beta2=0.95 adam-eps=1e-5" | FileCheck %s --check-prefix=NOCLIP
// NOCLIP-LABEL: func.func @step
// NOCLIP-NOT: nn.sum_squares
// NOCLIP-NOT: grad_norm
// NOCLIP: nn.adam {{.*}} {beta1 = 8.000000e-01 : f32, beta2 = 0.949999988 : f32, eps = 9.99999974E-6 : f32, lr = 1.000000e-03 : f32, weight_decay = 1.000000e-01 : f32}
// NOCLIP: nn.adam {{.*}}weight_decay = 0.000000e+00 : f32}

// The distributed optimizer: each rank clips and updates its shard of the
// bucket, so the sum of squares reads the runs of real parameters in it
// ([shard elements, start, end, ...] in the bucket's coordinates, padding
// out) and adds up over the shard's group; Adam's runs are the elements
// with no weight decay (the bias).
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true" --tessera-optimizer | FileCheck %s --check-prefix=ZERO
// ZERO-LABEL: func.func @step
// ZERO: %[[RS:.*]] = dist.reduce_scatter {{.*}} on @mesh "dp" dim 0 : tensor<128xf32> -> tensor<64xf32>
// ZERO: %[[SS:.*]] = nn.sum_squares %[[RS]] {group = "dp", runs = array<i64: 64, 0, 3, 64, 88>}
// ZERO: %[[AR:.*]] = dist.all_reduce %[[SS]] on @mesh "dp-pp"
// ZERO: %{{.*}}, %[[C:.*]] = nn.clip_grad_norm %[[AR]]
// ZERO: %[[G:.*]] = nn.scale_by %[[RS]], %[[C]]
// ZERO: nn.adam %{{.*}}, %[[G]], {{.*}}group = "dp", {{.*}}runs = array<i64: 64, 0, 3>, weight_decay = 0.00999999977 : f32}

// SGD with momentum under the distributed optimizer: a buffer per bucket
// shard, no decay on the bias's run. With log-params-norm (Megatron's
// --log-params-norm) the updated shard's norm, over the same runs and
// group as the gradients', after the update: the step's "params_norm".
// RUN: tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-autodiff --tessera-dp-grad-allreduce="distributed-optimizer=true" --tessera-optimizer="optimizer=sgd log-params-norm=true" | FileCheck %s --check-prefix=PNORM
// PNORM-LABEL: func.func @step
// PNORM-SAME: %[[B:[^:]*]]: tensor<64xf32> {tessera.buffer = "sgd.momentum_buffer:pbuf:gbuf:0"}
// PNORM-SAME: tensor<f32> {tessera.buffer = "params_norm"}
// PNORM: %[[NP:.*]], %[[NB:.*]] = nn.sgd_momentum %{{.*}}, %{{.*}}, %[[B]] {group = "dp", lr = {{.*}}, momentum = 0.899999976 : f32, runs = array<i64: 64, 0, 3>, weight_decay = 0.00999999977 : f32}
// PNORM: dist.all_gather %[[NP]]
// PNORM: %[[SS:.*]] = nn.sum_squares %[[NP]] {group = "dp", runs = array<i64: 64, 0, 3, 64, 88>}
// PNORM: %[[AR:.*]] = dist.all_reduce %[[SS]] on @mesh "dp-pp"
// PNORM: %[[N:.*]], %{{.*}} = nn.clip_grad_norm %[[AR]] {max_norm = 0.000000e+00 : f32}
// PNORM: return {{.*}}%[[NB]], %[[N]],

// Tensor parallelism: a gradient split over tp adds up over tp (and pp,
// the whole model's norm: the group "tp-pp", Megatron's model-parallel
// group); a replicated one is the same on every tp rank and adds up over
// pp only (Megatron counts it once), and a group of one rank needs no
// reduction.
// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 257 --seq 8 -o %t.gpt.mlir
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=TP
// TP-LABEL: func.func @step
// TP: nn.sum_squares %{{.*}} : tensor<48x32xf32> -> tensor<f32>
// TP-NOT: on @mesh "pp"
// TP: dist.all_reduce %{{.*}} on @mesh "tp-pp" : tensor<f32>
// TP-NOT: on @mesh "pp"
// TP: nn.clip_grad_norm
// RUN: tessera-opt %t.gpt.mlir --tessera-attach-mesh="tp=2 pp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=4" --tessera-pad-vocab --tessera-tp-partition --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=TPPP
// TPPP: module @pp0
// TPPP: dist.all_reduce %{{.*}} on @mesh "pp" : tensor<f32>
// TPPP-NEXT: dist.all_reduce %{{.*}} on @mesh "tp-pp" : tensor<f32>
// TPPP: nn.clip_grad_norm
// TPPP: module @pp1
// TPPP: dist.all_reduce %{{.*}} on @mesh "pp" : tensor<f32>
// TPPP-NEXT: dist.all_reduce %{{.*}} on @mesh "tp-pp" : tensor<f32>
// TPPP: nn.clip_grad_norm

// A tied word embedding has a gradient on the first and the last stage
// (all-reduced over the embedding group, so equal): only the first stage
// counts it.
// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 257 --seq 8 --tie-embeddings -o %t.tied.mlir
// RUN: tessera-opt %t.tied.mlir --tessera-attach-mesh="pp=2" --tessera-set-batch="micro-batch-size=2 global-batch-size=4" --tessera-pad-vocab --tessera-pp-split --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer | FileCheck %s --check-prefix=TIED
// TIED: module @pp0
// TIED: %[[E:.*]] = dist.all_reduce %arg0 on @mesh "embedding" : tensor<384x32xf32>
// TIED-NEXT: nn.sum_squares %[[E]] : tensor<384x32xf32>
// TIED: dist.all_reduce %{{.*}} on @mesh "pp" : tensor<f32>
// TIED: module @pp1
// TIED: dist.all_reduce %arg0 on @mesh "embedding" : tensor<384x32xf32>
// TIED-NOT: tensor<384x32xf32> -> tensor<f32>
// TIED: dist.all_reduce %{{.*}} on @mesh "pp" : tensor<f32>

// Out-of-range values are errors naming the flag.
// RUN: not tessera-opt %s --tessera-optimizer="clip-grad=-1" 2>&1 | FileCheck %s --check-prefix=NEG
// NEG: error: invalid --clip-grad -1 (expected a finite value in [0, inf))

func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"},
                %b: tensor<3xf32> {nn.param = "head.bias"}) -> tensor<f32> {
  %z = nn.linear %x, %w, %b : (tensor<4x8xf32>, tensor<3x8xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
