// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// CHECK: dist.mesh @mesh {dp = 2 : i64, tp = 4 : i64}
dist.mesh @mesh {tp = 4, dp = 2}

// CHECK-LABEL: func.func @regions
func.func @regions(%x: tensor<8x256xf32>) -> tensor<8x256xf32> {
  // CHECK: dist.copy_to_region %{{.*}} on @mesh "tp" : tensor<8x256xf32>
  %0 = dist.copy_to_region %x on @mesh "tp" : tensor<8x256xf32>
  // CHECK: dist.scatter_to_region %{{.*}} on @mesh "tp" : tensor<8x256xf32> -> tensor<8x64xf32>
  %1 = dist.scatter_to_region %0 on @mesh "tp" : tensor<8x256xf32> -> tensor<8x64xf32>
  // CHECK: dist.gather_from_region %{{.*}} on @mesh "tp" : tensor<8x64xf32> -> tensor<8x256xf32>
  %2 = dist.gather_from_region %1 on @mesh "tp" : tensor<8x64xf32> -> tensor<8x256xf32>
  // CHECK: dist.reduce_from_region %{{.*}} on @mesh "tp" : tensor<8x256xf32>
  %3 = dist.reduce_from_region %2 on @mesh "tp" : tensor<8x256xf32>
  return %3 : tensor<8x256xf32>
}

// CHECK-LABEL: func.func @all_to_all
func.func @all_to_all(%x: tensor<8x256xf32>) -> tensor<8x256xf32> {
  // CHECK: dist.all_to_all %{{.*}} on @mesh "dp" : tensor<8x256xf32>
  %0 = dist.all_to_all %x on @mesh "dp" : tensor<8x256xf32>
  return %0 : tensor<8x256xf32>
}

// CHECK-LABEL: func.func @collectives
func.func @collectives(%x: tensor<8x256xf32>) -> tensor<8x256xf32> {
  // CHECK: dist.all_reduce %{{.*}} on @mesh "dp" : tensor<8x256xf32>
  %0 = dist.all_reduce %x on @mesh "dp" : tensor<8x256xf32>
  // CHECK: dist.all_reduce %{{.*}} on @mesh "tp" {reduction = "max"}
  %1 = dist.all_reduce %0 on @mesh "tp" {reduction = "max"} : tensor<8x256xf32>
  // CHECK: dist.reduce_scatter %{{.*}} on @mesh "tp-dp" dim 0 : tensor<8x256xf32> -> tensor<1x256xf32>
  %2 = dist.reduce_scatter %1 on @mesh "tp-dp" dim 0 : tensor<8x256xf32> -> tensor<1x256xf32>
  // CHECK: dist.all_gather %{{.*}} on @mesh "tp-dp" dim 0 : tensor<1x256xf32> -> tensor<8x256xf32>
  %3 = dist.all_gather %2 on @mesh "tp-dp" dim 0 : tensor<1x256xf32> -> tensor<8x256xf32>
  return %3 : tensor<8x256xf32>
}

// CHECK-LABEL: func.func @async
func.func @async(%x: tensor<8x256xf32>) -> tensor<4x256xf32> {
  // CHECK: %[[F:.*]] = dist.all_reduce_start %{{.*}} on @mesh "dp" : tensor<8x256xf32> -> !dist.async<tensor<8x256xf32>>
  %f = dist.all_reduce_start %x on @mesh "dp" : tensor<8x256xf32> -> !dist.async<tensor<8x256xf32>>
  // CHECK: dist.wait %[[F]] : !dist.async<tensor<8x256xf32>> -> tensor<8x256xf32>
  %r = dist.wait %f : !dist.async<tensor<8x256xf32>> -> tensor<8x256xf32>
  // CHECK: dist.reduce_scatter_start
  %g = dist.reduce_scatter_start %r on @mesh "dp" dim 0 : tensor<8x256xf32> -> !dist.async<tensor<4x256xf32>>
  %s = dist.wait %g : !dist.async<tensor<4x256xf32>> -> tensor<4x256xf32>
  // CHECK: dist.all_gather_start
  %h = dist.all_gather_start %s on @mesh "dp" dim 0 : tensor<4x256xf32> -> !dist.async<tensor<8x256xf32>>
  %t = dist.wait %h : !dist.async<tensor<8x256xf32>> -> tensor<8x256xf32>
  return %s : tensor<4x256xf32>
}

// The full mesh: every axis, any order, expert groups over the same ranks.
// CHECK-LABEL: func.func @expert
func.func @expert(%x: tensor<8x256xf32>) -> tensor<8x256xf32> {
  // CHECK: dist.all_reduce %{{.*}} on @mesh "etp-ep" : tensor<8x256xf32>
  %0 = dist.all_reduce %x on @mesh "etp-ep" : tensor<8x256xf32>
  // CHECK: dist.all_reduce %{{.*}} on @mesh "embedding" : tensor<8x256xf32>
  %1 = dist.all_reduce %0 on @mesh "embedding" : tensor<8x256xf32>
  return %1 : tensor<8x256xf32>
}
