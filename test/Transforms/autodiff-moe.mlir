// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 3 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-set-batch="micro-batch-size=2 global-batch-size=4" --tessera-autodiff | FileCheck %s
// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 3 --moe-router-topk 1 -o %t.noaux.mlir
// RUN: tessera-opt %t.noaux.mlir --tessera-set-batch="micro-batch-size=2" --tessera-autodiff | FileCheck %s --check-prefix=NOAUX

// The MoE layer's backward, in reverse: the weighted unpermutation gives
// the expert outputs' and the probabilities' gradients; the grouped GEMMs
// their inputs' and weights'; the permutation sums each token's rows; the
// router's probabilities flow back to the logits through the top-k
// softmax, and the load-balancing loss (MoEAuxLossAutoScaler) gets the
// loss's own gradient, 1/2 for two microbatches.

// CHECK: %[[LOGITS:.*]] = nn.linear %{{.*}}, %{{.*}} {nn.layer = 0 : i64} : (tensor<4x2x16xf32>, tensor<3x16xf32>) -> tensor<4x2x3xf32>
// CHECK: %[[PROBS:.*]], %[[IDX:.*]] = nn.moe_router %[[LOGITS]]
// CHECK: %[[AUX:.*]] = nn.moe_aux_loss %[[LOGITS]], %[[IDX]]
// CHECK: %[[P:.*]] = nn.add_aux_loss %[[PROBS]], %[[AUX]]
// CHECK: %[[ROWS:.*]], %[[COUNTS:.*]] = nn.moe_dispatch
// CHECK: %[[H:.*]] = nn.grouped_linear %[[ROWS]], %[[COUNTS]], %[[W1:.*]] {nn.layer = 0 : i64}
// CHECK: %[[Y:.*]] = nn.grouped_linear %[[G:.*]], %[[COUNTS]], %[[W2:.*]] {nn.layer = 0 : i64}
// CHECK: nn.moe_combine %[[Y]], %[[P]], %[[IDX]]
// CHECK: %[[DY:.*]], %[[DP:.*]] = nn.moe_combine_grad %[[Y]], %[[P]], %[[IDX]], %{{.*}} {num_experts = 3 : i64}
// CHECK: %[[DG:.*]], %[[DW2:.*]] = nn.grouped_linear_grad %[[G]], %[[COUNTS]], %[[W2]], %[[DY]]
// CHECK: %[[DROWS:.*]], %[[DW1:.*]] = nn.grouped_linear_grad %[[ROWS]], %[[COUNTS]], %[[W1]], %{{.*}}
// CHECK: nn.moe_dispatch_grad %[[DROWS]], %[[IDX]] {num_experts = 3 : i64}
// CHECK: %[[SEED:.*]] = nn.fill 5.000000e-01 : tensor<f32>
// CHECK: %[[DAUX:.*]] = nn.moe_aux_loss_grad %[[LOGITS]], %[[IDX]], %[[SEED]]
// CHECK: %[[DR:.*]] = nn.moe_router_grad %[[PROBS]], %[[IDX]], %[[DP]]
// CHECK: nn.add %{{.*}}
// CHECK: return {{.*}}%[[DW1]], %[[DW2]]

// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 3 --moe-router-topk 2 --moe-expert-capacity-factor 1.0 -o %t.cap.mlir
// RUN: tessera-opt %t.cap.mlir --tessera-set-batch="micro-batch-size=2" --tessera-autodiff | FileCheck %s --check-prefix=CAP
// With expert capacity the kept probabilities' gradient is zero for the
// dropped choices before the router's backward.
// CAP: %[[KP:.*]], %[[KI:.*]] = nn.moe_capacity_drop %{{.*}}, %{{.*}} {capacity_factor = 1.000000e+00 : f32, nn.layer = 0 : i64, num_experts = 3 : i64}
// CAP: nn.moe_dispatch %{{.*}}, %[[KI]]
// CAP: %{{.*}}, %[[DP:.*]] = nn.moe_combine_grad
// CAP: %[[DK:.*]] = nn.moe_capacity_drop_grad %[[DP]], %[[KI]]
// CAP: nn.moe_router_grad %{{.*}}, %{{.*}}, %[[DK]]

// Without the auxiliary loss the router's gradient is the probabilities' only.
// NOAUX-NOT: nn.moe_aux_loss
// NOAUX: nn.moe_router_grad
// NOAUX-NOT: nn.moe_aux_loss_grad

// RUN: tessera-opt %t.mlir --tessera-set-batch="micro-batch-size=2 global-batch-size=4" --tessera-mixed-precision --tessera-autodiff | FileCheck %s --check-prefix=BF16
// With bf16 GEMMs the experts' grouped GEMMs read their bf16 weights and
// rows cast to bf16; their backward takes dy cast to bf16 and gives f32
// gradients (the weights' accumulate as fp32 main_grad).
// BF16: %[[ROWS:.*]], %[[COUNTS:.*]] = nn.moe_dispatch
// BF16: %[[R16:.*]] = nn.cast %[[ROWS]] {nn.layer = 0 : i64} : tensor<16x16xf32> to tensor<16x16xbf16>
// BF16-NEXT: nn.grouped_linear %[[R16]], %[[COUNTS]], %[[W1:[^ ]*]] {nn.layer = 0 : i64} : (tensor<16x16xbf16>, tensor<3xi32>, tensor<3x64x16xbf16>) -> tensor<16x64xf32>
// BF16: %[[G16:.*]] = nn.cast %{{.*}} {nn.layer = 0 : i64} : tensor<16x64xf32> to tensor<16x64xbf16>
// BF16-NEXT: nn.grouped_linear %[[G16]], %[[COUNTS]], %[[W2:[^ ]*]] {nn.layer = 0 : i64} : (tensor<16x64xbf16>, tensor<3xi32>, tensor<3x16x64xbf16>) -> tensor<16x16xf32>
// BF16: %[[DY:.*]], %{{.*}} = nn.moe_combine_grad
// BF16-NEXT: %[[DY16:.*]] = nn.cast %[[DY]] : tensor<16x16xf32> to tensor<16x16xbf16>
// BF16-NEXT: %[[DG:.*]], %[[DW2:.*]] = nn.grouped_linear_grad %[[G16]], %[[COUNTS]], %[[W2]], %[[DY16]] : tensor<16x64xbf16>, tensor<3xi32>, tensor<3x16x64xbf16>, tensor<16x16xbf16>
// BF16: %[[DROWS:.*]], %[[DW1:.*]] = nn.grouped_linear_grad %[[R16]], %[[COUNTS]], %[[W1]], %{{.*}} : tensor<16x16xbf16>, tensor<3xi32>, tensor<3x64x16xbf16>, tensor<16x64xbf16>
// BF16: return {{.*}}%[[DW1]], %[[DW2]], {{.*}} : {{.*}}tensor<3x64x16xf32>, tensor<3x16x64xf32>
