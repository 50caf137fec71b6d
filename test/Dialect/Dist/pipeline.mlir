// RUN: tessera-opt %s | tessera-opt | FileCheck %s

// Round trip of the pipeline ops.
// CHECK-LABEL: module @pp0 attributes {dist.pp_rank = 0 : i64}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  // CHECK: func.func @forward_c0
  func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    // CHECK: %[[R:.*]] = dist.recv from "prev" {tag = 2 : i64} : tensor<4x8xf32>
    %r = dist.recv from "prev" {tag = 2 : i64} : tensor<4x8xf32>
    // CHECK: dist.send %[[R]] to "next" {tag = 4 : i64} : tensor<4x8xf32>
    dist.send %r to "next" {tag = 4 : i64} : tensor<4x8xf32>
    return
  }
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
  // CHECK: dist.schedule attributes {kind = "interleaved", warmup = 1 : i64} {
  // CHECK-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "recv"
  // CHECK-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "compute"
  // CHECK-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "send"
  // CHECK-NEXT: dist.run @backward_c0 microbatch 0 slot 0
  dist.schedule attributes {kind = "interleaved", warmup = 1 : i64} {
    dist.run @forward_c0 microbatch 0 slot 0 part "recv"
    dist.run @forward_c0 microbatch 0 slot 0 part "compute"
    dist.run @forward_c0 microbatch 0 slot 0 part "send"
    dist.run @backward_c0 microbatch 0 slot 0
  }
}
