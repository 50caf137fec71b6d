// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// Megatron's MoE layer as nn ops: the router, the load-balancing loss and
// its scaler, the token permutation, the grouped expert GEMMs and the
// weighted unpermutation, with their backward ops.

// CHECK-LABEL: func.func @moe
func.func @moe(%x: tensor<4x2x8xf32>, %wr: tensor<3x8xf32>, %w1: tensor<3x16x8xf32>, %w2: tensor<3x8x16xf32>) -> tensor<4x2x8xf32> {
  %logits = nn.linear %x, %wr : (tensor<4x2x8xf32>, tensor<3x8xf32>) -> tensor<4x2x3xf32>
  // CHECK: nn.moe_router %{{.*}} {topk = 2 : i64} : tensor<4x2x3xf32> -> tensor<4x2x2xf32>, tensor<4x2x2xi32>
  %probs, %idx = nn.moe_router %logits {topk = 2 : i64} : tensor<4x2x3xf32> -> tensor<4x2x2xf32>, tensor<4x2x2xi32>
  // CHECK: nn.moe_aux_loss %{{.*}}, %{{.*}} {coeff = 0.00999999977 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>) -> tensor<f32>
  %aux = nn.moe_aux_loss %logits, %idx {coeff = 0.01 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>) -> tensor<f32>
  // CHECK: nn.add_aux_loss %{{.*}}, %{{.*}} : tensor<4x2x2xf32>, tensor<f32>
  %p = nn.add_aux_loss %probs, %aux : tensor<4x2x2xf32>, tensor<f32>
  // CHECK: nn.moe_capacity_drop %{{.*}}, %{{.*}} {capacity_factor = 1.500000e+00 : f32, drop_policy = "position", num_experts = 3 : i64} : tensor<4x2x2xf32>, tensor<4x2x2xi32>
  %kp, %ki = nn.moe_capacity_drop %p, %idx {num_experts = 3 : i64, capacity_factor = 1.5 : f32, drop_policy = "position"} : tensor<4x2x2xf32>, tensor<4x2x2xi32>
  // CHECK: nn.moe_capacity_drop_grad %{{.*}}, %{{.*}} : tensor<4x2x2xf32>, tensor<4x2x2xi32>
  %dkp = nn.moe_capacity_drop_grad %kp, %ki : tensor<4x2x2xf32>, tensor<4x2x2xi32>
  // CHECK: nn.moe_dispatch %{{.*}}, %{{.*}} {num_experts = 3 : i64} : tensor<4x2x8xf32>, tensor<4x2x2xi32> -> tensor<16x8xf32>, tensor<3xi32>
  %rows, %counts = nn.moe_dispatch %x, %idx {num_experts = 3 : i64} : tensor<4x2x8xf32>, tensor<4x2x2xi32> -> tensor<16x8xf32>, tensor<3xi32>
  // CHECK: nn.grouped_linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<16x8xf32>, tensor<3xi32>, tensor<3x16x8xf32>) -> tensor<16x16xf32>
  %h = nn.grouped_linear %rows, %counts, %w1 : (tensor<16x8xf32>, tensor<3xi32>, tensor<3x16x8xf32>) -> tensor<16x16xf32>
  %y = nn.grouped_linear %h, %counts, %w2 : (tensor<16x16xf32>, tensor<3xi32>, tensor<3x8x16xf32>) -> tensor<16x8xf32>
  // CHECK: nn.moe_combine %{{.*}}, %{{.*}}, %{{.*}} {num_experts = 3 : i64} : tensor<16x8xf32>, tensor<4x2x2xf32>, tensor<4x2x2xi32> -> tensor<4x2x8xf32>
  %out = nn.moe_combine %y, %p, %idx {num_experts = 3 : i64} : tensor<16x8xf32>, tensor<4x2x2xf32>, tensor<4x2x2xi32> -> tensor<4x2x8xf32>
  // CHECK: nn.moe_combine_grad
  %dy, %dp = nn.moe_combine_grad %y, %p, %idx, %out {num_experts = 3 : i64} : tensor<16x8xf32>, tensor<4x2x2xf32>, tensor<4x2x2xi32>, tensor<4x2x8xf32>
  // CHECK: nn.grouped_linear_grad
  %dh, %dw2 = nn.grouped_linear_grad %h, %counts, %w2, %dy : tensor<16x16xf32>, tensor<3xi32>, tensor<3x8x16xf32>, tensor<16x8xf32>
  // CHECK: nn.moe_dispatch_grad
  %dx = nn.moe_dispatch_grad %dy, %idx {num_experts = 3 : i64} : tensor<16x8xf32>, tensor<4x2x2xi32> -> tensor<4x2x8xf32>
  // CHECK: nn.moe_router_grad
  %dl = nn.moe_router_grad %probs, %idx, %dp : tensor<4x2x2xf32>, tensor<4x2x2xi32> -> tensor<4x2x3xf32>
  // CHECK: nn.moe_aux_loss_grad
  %da = nn.moe_aux_loss_grad %logits, %idx, %aux {coeff = 0.01 : f32} : tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<f32>
  // With all ranks' counts (tokens split over ranks).
  // CHECK: %[[C:.*]] = nn.moe_token_counts %{{.*}} {num_experts = 3 : i64} : (tensor<4x2x2xi32>) -> tensor<3xf32>
  %c = nn.moe_token_counts %idx {num_experts = 3 : i64} : (tensor<4x2x2xi32>) -> tensor<3xf32>
  // CHECK: nn.moe_aux_loss %{{.*}}, %{{.*}}, %[[C]] {coeff = {{.*}}} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<3xf32>) -> tensor<f32>
  %share = nn.moe_aux_loss %logits, %idx, %c {coeff = 0.01 : f32} : (tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<3xf32>) -> tensor<f32>
  // CHECK: nn.moe_aux_loss_grad %{{.*}}, %{{.*}}, %{{.*}}, %[[C]] {coeff = {{.*}}} : tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<f32>, tensor<3xf32>
  %dshare = nn.moe_aux_loss_grad %logits, %idx, %share, %c {coeff = 0.01 : f32} : tensor<4x2x3xf32>, tensor<4x2x2xi32>, tensor<f32>, tensor<3xf32>
  return %dx : tensor<4x2x8xf32>
}
