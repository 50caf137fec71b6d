// RUN: tessera-opt %s --tessera-attach-mesh="tp=2" --tessera-tp-partition | FileCheck %s
// RUN: tessera-opt %s --tessera-attach-mesh="tp=1" --tessera-tp-partition | FileCheck %s --check-prefix=TP1

// Megatron's MLP: fc1 column-parallel (ColumnParallelLinear), fc2 row-parallel
// (RowParallelLinear), one reduction in the forward (its backward all-reduce
// comes from copy_to_region's adjoint); fc2's bias is added once after the
// reduction; the head stays replicated.

// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %[[X:[^:]*]]: tensor<8x256xf32> {nn.input = "features"}
// CHECK-SAME: %[[W1:[^:]*]]: tensor<512x256xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, nn.param = "fc1.weight"}
// CHECK-SAME: %[[B1:[^:]*]]: tensor<512xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, nn.param = "fc1.bias"}
// CHECK-SAME: %[[W2:[^:]*]]: tensor<256x512xf32> {dist.sharding = {axis = "tp", dim = 1 : i64}, nn.param = "fc2.weight"}
// CHECK-SAME: %[[B2:[^:]*]]: tensor<256xf32> {nn.param = "fc2.bias"}
// CHECK-SAME: %[[WH:[^:]*]]: tensor<16x256xf32> {nn.param = "head.weight"}
// CHECK-NEXT: %[[XC:.*]] = dist.copy_to_region %[[X]] on @mesh "tp" : tensor<8x256xf32>
// CHECK-NEXT: %[[H:.*]] = nn.linear %[[XC]], %[[W1]], %[[B1]] : (tensor<8x256xf32>, tensor<512x256xf32>, tensor<512xf32>) -> tensor<8x512xf32>
// CHECK-NEXT: %[[A:.*]] = nn.gelu %[[H]] : tensor<8x512xf32>
// CHECK-NEXT: %[[P:.*]] = nn.linear %[[A]], %[[W2]] : (tensor<8x512xf32>, tensor<256x512xf32>) -> tensor<8x256xf32>
// CHECK-NEXT: %[[R:.*]] = dist.reduce_from_region %[[P]] on @mesh "tp" : tensor<8x256xf32>
// CHECK-NEXT: %[[Y:.*]] = nn.bias_add %[[R]], %[[B2]] : (tensor<8x256xf32>, tensor<256xf32>) -> tensor<8x256xf32>
// CHECK-NEXT: nn.linear %[[Y]], %[[WH]] : (tensor<8x256xf32>, tensor<16x256xf32>) -> tensor<8x16xf32>
// CHECK-NOT: dist.

// TP1-NOT: dist.copy_to_region
// TP1: nn.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x256xf32>, tensor<1024x256xf32>, tensor<1024xf32>)
func.func @mlp(%x: tensor<8x256xf32> {nn.input = "features"},
               %w1: tensor<1024x256xf32> {nn.param = "fc1.weight"},
               %b1: tensor<1024xf32> {nn.param = "fc1.bias"},
               %w2: tensor<256x1024xf32> {nn.param = "fc2.weight"},
               %b2: tensor<256xf32> {nn.param = "fc2.bias"},
               %wh: tensor<16x256xf32> {nn.param = "head.weight"}) -> tensor<8x16xf32> {
  %h = nn.linear %x, %w1, %b1 : (tensor<8x256xf32>, tensor<1024x256xf32>, tensor<1024xf32>) -> tensor<8x1024xf32>
  %a = nn.gelu %h : tensor<8x1024xf32>
  %y = nn.linear %a, %w2, %b2 : (tensor<8x1024xf32>, tensor<256x1024xf32>, tensor<256xf32>) -> tensor<8x256xf32>
  %z = nn.linear %y, %wh : (tensor<8x256xf32>, tensor<16x256xf32>) -> tensor<8x16xf32>
  return %z : tensor<8x16xf32>
}
