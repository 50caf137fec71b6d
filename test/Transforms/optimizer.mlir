// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="optimizer=adam lr=0.01 clip-grad=0 weight-decay=0" | FileCheck %s --check-prefix=ADAM
// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="optimizer=sgd lr=0.5 weight-decay=0.1 clip-grad=0 sgd-momentum=0" | FileCheck %s --check-prefix=SGD
// RUN: tessera-opt %s --tessera-autodiff --tessera-dp-grad-allreduce --tessera-optimizer="optimizer=sgd lr=0.5 weight-decay=0.1 clip-grad=0" | FileCheck %s --check-prefix=MOM

// ADAM: tessera.optimizer = {beta1 = {{.*}}, kind = "adam", lr = 0.00999999977 : f32
// ADAM-LABEL: func.func @step
// ADAM-SAME: %[[G:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}
// ADAM-SAME: %[[T:[^:]*]]: tensor<i64> {tessera.buffer = "iteration"}
// ADAM-SAME: %[[P:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "head.weight"}
// ADAM-SAME: %[[M:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "adam.exp_avg:head.weight"}
// ADAM-SAME: %[[V:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "adam.exp_avg_sq:head.weight"}
// ADAM-SAME: -> (tensor<3x8xf32> {tessera.buffer = "head.weight"}, tensor<3x8xf32> {tessera.buffer = "adam.exp_avg:head.weight"}, tensor<3x8xf32> {tessera.buffer = "adam.exp_avg_sq:head.weight"}, tensor<3x8xf32> {tessera.buffer = "grad:head.weight"})
// ADAM: %[[NP:.*]], %[[NM:.*]], %[[NV:.*]] = nn.adam %[[P]], %[[G]], %[[M]], %[[V]], %[[T]] {{{.*}}lr = 0.00999999977 : f32
// The gradients restart from zero: one fill per bucket of the grad buffer,
// unpacked into the gradients (views of the bucket after lowering).
// ADAM: %[[F:.*]] = nn.fill 0.000000e+00 : tensor<24xf32>
// ADAM: %[[Z:.*]] = dist.unpack @gbuf bucket 0 "grad" %[[F]] : tensor<24xf32> -> tensor<3x8xf32>
// ADAM: return %[[NP]], %[[NM]], %[[NV]], %[[Z]]

// SGD-LABEL: func.func @step
// SGD-SAME: %[[G:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, %[[P:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "head.weight"}
// SGD: %[[NP:.*]] = nn.sgd %[[P]], %[[G]] {lr = 5.000000e-01 : f32, weight_decay = 1.000000e-01 : f32}
// SGD: return %[[NP]], %{{.*}}

// SGD with Megatron's default momentum (0.9): an fp32 buffer per
// parameter, kept between steps.
// MOM: tessera.optimizer = {{{.*}}kind = "sgd", {{.*}}momentum = 0.899999976 : f32
// MOM-LABEL: func.func @step
// MOM-SAME: %[[G:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "grad:head.weight"}, %[[P:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "head.weight"}, %[[B:[^:]*]]: tensor<3x8xf32> {tessera.buffer = "sgd.momentum_buffer:head.weight"}
// MOM-SAME: -> (tensor<3x8xf32> {tessera.buffer = "head.weight"}, tensor<3x8xf32> {tessera.buffer = "sgd.momentum_buffer:head.weight"}
// MOM: %[[NP:.*]], %[[NB:.*]] = nn.sgd_momentum %[[P]], %[[G]], %[[B]] {lr = 5.000000e-01 : f32, momentum = 0.899999976 : f32, weight_decay = 1.000000e-01 : f32}
// MOM: return %[[NP]], %[[NB]],
func.func @head(%x: tensor<4x8xf32> {nn.input = "features"},
                %t: tensor<4xi32> {nn.input = "labels"},
                %w: tensor<3x8xf32> {nn.param = "head.weight"}) -> tensor<f32> {
  %z = nn.linear %x, %w : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %m = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
