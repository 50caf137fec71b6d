// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 4 --moe-router-topk 2 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="ep=2 dp=2" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="ep=2 dp=2" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition --tessera-autodiff --tessera-dp-grad-allreduce | FileCheck %s --check-prefix=GRAD
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="dp=2" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition | FileCheck %s --check-prefix=NONE

// Expert parallelism: each rank holds 2 of the 4 experts (weights sharded
// over "ep" on dim 0); the permuted rows go to their experts' ranks
// (dist.expert_dispatch: up to 2 x 16 rows arrive, with per-expert counts
// and the splits by source) and come back before the weighted combine.

// CHECK: nn.param = "decoder.layers.0.mlp.router.weight"
// CHECK-SAME: %[[W1:.*]]: tensor<2x64x16xf32> {dist.sharding = {axis = "ep", dim = 0 : i64}, nn.init = "normal:0.02", nn.param = "decoder.layers.0.mlp.experts.linear_fc1.weight"}
// CHECK-SAME: %[[W2:.*]]: tensor<2x16x64xf32> {dist.sharding = {axis = "ep", dim = 0 : i64}
// CHECK: %[[ROWS:.*]], %[[COUNTS:.*]] = nn.moe_dispatch
// CHECK-NEXT: %[[RECV:.*]], %[[LOCAL:.*]], %[[SPLITS:.*]] = dist.expert_dispatch %[[ROWS]], %[[COUNTS]] on @mesh "ep" {nn.layer = 0 : i64} : tensor<16x16xf32>, tensor<4xi32> -> tensor<32x16xf32>, tensor<2xi32>, tensor<2x2xi32>
// The GEMMs' FLOPs count the 16 rows balanced routing brings (expected_rows),
// not the 32 of room.
// CHECK-NEXT: nn.grouped_linear %[[RECV]], %[[LOCAL]], %[[W1]] {expected_rows = 16 : i64{{.*}}} {{.*}} -> tensor<32x64xf32>
// CHECK: %[[Y:.*]] = nn.grouped_linear %{{.*}}, %[[LOCAL]], %[[W2]] {expected_rows = 16 : i64{{.*}}} {{.*}} -> tensor<32x16xf32>
// CHECK-NEXT: %[[BACK:.*]] = dist.expert_combine %[[Y]], %[[SPLITS]], %[[COUNTS]] on @mesh "ep" {nn.layer = 0 : i64} : tensor<32x16xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x16xf32>
// CHECK-NEXT: nn.moe_combine %[[BACK]]

// The backward: the gradient of the combine's input goes to the experts'
// ranks (a dispatch), the experts' input gradient comes back (a combine);
// the experts' gradients get a buffer of their own over "edp".
// GRAD: dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "ep" : tensor<16x16xf32>, tensor<4xi32> -> tensor<32x16xf32>, tensor<2xi32>, tensor<2x2xi32>
// GRAD: nn.grouped_linear_grad {{.*}} {expected_rows = 16 : i64}
// GRAD: dist.expert_combine %{{.*}}, %{{.*}}, %{{.*}} on @mesh "ep" : tensor<32x16xf32>, tensor<2x2xi32>, tensor<4xi32> -> tensor<16x16xf32>
// GRAD: dist.grad_buffer @gbuf {{.*}}dp = 2 : i64
// GRAD: dist.grad_buffer @gbuf_experts {{.*}}dp = 1 : i64, {{.*}}group = "edp"
// GRAD: nn.scale %{{.*}} {factor = 5.000000e-01 : f32}
// GRAD: dist.all_reduce %{{.*}} on @mesh "dp"

// NONE-NOT: dist.expert_dispatch
// NONE-NOT: expected_rows

// Expert tensor parallelism: with ep = 2 x etp = 2 each rank holds its 2
// experts' halves of the FFN (fc1 split on dim 1, fc2 on dim 2, besides
// the experts on dim 0); the rows go to every etp rank of their experts
// (the "etp-ep" group, 4 x the rows arrive) and the partial outputs come
// back to be summed. With etp alone (ep = 1) the experts stay whole in
// number and only their FFN is split.
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="ep=2 etp=2 dp=4" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition | FileCheck %s --check-prefix=ETP
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="ep=2 etp=2 dp=4" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition --tessera-autodiff | FileCheck %s --check-prefix=ETPGRAD
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="etp=2 dp=2" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition | FileCheck %s --check-prefix=ETPONLY
// ETP: nn.param = "decoder.layers.0.mlp.router.weight"
// ETP-SAME: %[[W1:.*]]: tensor<2x32x16xf32> {dist.sharding = {axis = "ep", axis2 = "etp", dim = 0 : i64, dim2 = 1 : i64}
// ETP-SAME: %[[W2:.*]]: tensor<2x16x32xf32> {dist.sharding = {axis = "ep", axis2 = "etp", dim = 0 : i64, dim2 = 2 : i64}
// ETP: %[[RECV:.*]], %[[LOCAL:.*]], %[[SPLITS:.*]] = dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "etp-ep" {etp = 2 : i64, nn.layer = 0 : i64} : tensor<16x16xf32>, tensor<4xi32> -> tensor<64x16xf32>, tensor<2xi32>, tensor<4x2xi32>
// ETP-NEXT: nn.grouped_linear %[[RECV]], %[[LOCAL]], %[[W1]] {expected_rows = 32 : i64{{.*}}} {{.*}} -> tensor<64x32xf32>
// ETP: %[[Y:.*]] = nn.grouped_linear %{{.*}}, %[[LOCAL]], %[[W2]] {expected_rows = 32 : i64{{.*}}} {{.*}} -> tensor<64x16xf32>
// ETP-NEXT: dist.expert_combine %[[Y]], %[[SPLITS]], %{{.*}} on @mesh "etp-ep" {etp = 2 : i64, nn.layer = 0 : i64} : tensor<64x16xf32>, tensor<4x2xi32>, tensor<4xi32> -> tensor<16x16xf32>
// ETPGRAD: dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "etp-ep" {etp = 2 : i64} : tensor<16x16xf32>, tensor<4xi32> -> tensor<64x16xf32>, tensor<2xi32>, tensor<4x2xi32>
// ETPGRAD: dist.expert_combine %{{.*}}, %{{.*}}, %{{.*}} on @mesh "etp-ep" {etp = 2 : i64} : tensor<64x16xf32>, tensor<4x2xi32>, tensor<4xi32> -> tensor<16x16xf32>
// ETPONLY: nn.param = "decoder.layers.0.mlp.router.weight"
// ETPONLY-SAME: tensor<4x32x16xf32> {dist.sharding = {axis = "etp", dim = 1 : i64}
// ETPONLY-SAME: tensor<4x16x32xf32> {dist.sharding = {axis = "etp", dim = 2 : i64}
// ETPONLY: dist.expert_dispatch %{{.*}}, %{{.*}} on @mesh "etp-ep" {etp = 2 : i64, nn.layer = 0 : i64} : tensor<16x16xf32>, tensor<4xi32> -> tensor<32x16xf32>, tensor<4xi32>, tensor<2x4xi32>
