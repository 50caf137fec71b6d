// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 4 --moe-router-topk 2 -o %t.mlir

// RUN: not tessera-opt %t.mlir --tessera-attach-mesh="ep=3 dp=3" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition 2>&1 | FileCheck %s --check-prefix=DIV
// RUN: not tessera-opt %t.mlir --tessera-attach-mesh="ep=2 tp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition 2>&1 | FileCheck %s --check-prefix=TP
// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 -o %t.dense.mlir
// RUN: not tessera-opt %t.dense.mlir --tessera-attach-mesh="ep=2 dp=2" --tessera-ep-partition 2>&1 | FileCheck %s --check-prefix=DENSE
// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="ep=2 dp=2" --tessera-ep-partition -verify-diagnostics
// RUN: not tessera-opt %t.mlir --tessera-attach-mesh="etp=3 dp=3" --tessera-set-batch="micro-batch-size=2" --tessera-ep-partition 2>&1 | FileCheck %s --check-prefix=FFN
// FFN: error: 'nn.grouped_linear' op etp 3 does not divide the experts' FFN hidden size 64


// DIV: error: 'nn.moe_dispatch' op 4 experts do not split evenly over ep = 3
// TP: error: expert parallelism (ep 2, etp 1) with tensor parallelism (tp 2) needs sequence parallelism (--sequence-parallel, as Megatron's MoELayer)
// DENSE: error: expert parallelism (ep 2, etp 1) needs mixture-of-experts layers (tessera-gen gpt --num-experts)

// An expert MLP that is not grouped linears between the permutation and
// the combine.
func.func @m(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>, %p: tensor<4x2xf32>, %w: tensor<4x8x8xf32> {nn.param = "w"}) -> tensor<4x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op expert parallelism expects the experts' grouped linears between nn.moe_dispatch and nn.moe_combine (as tessera-gen builds them)}}
  %r, %c = nn.moe_dispatch %x, %i {num_experts = 4 : i64} : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<8x8xf32>, tensor<4xi32>
  %g = nn.gelu %r : tensor<8x8xf32>
  %y = nn.moe_combine %g, %p, %i {num_experts = 4 : i64} : tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// The experts' weights must be parameters of their own.
func.func @m(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>, %p: tensor<4x2xf32>, %w: tensor<4x8x8xf32>) -> tensor<4x8xf32> {
  %r, %c = nn.moe_dispatch %x, %i {num_experts = 4 : i64} : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<8x8xf32>, tensor<4xi32>
  // expected-error @+1 {{'nn.grouped_linear' op expects the experts' weights as a parameter}}
  %g = nn.grouped_linear %r, %c, %w : (tensor<8x8xf32>, tensor<4xi32>, tensor<4x8x8xf32>) -> tensor<8x8xf32>
  %y = nn.moe_combine %g, %p, %i {num_experts = 4 : i64} : tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @m(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>, %p: tensor<4x2xf32>, %w: tensor<4x8x8xf32> {nn.param = "w"}) -> tensor<4x8xf32> {
  %r, %c = nn.moe_dispatch %x, %i {num_experts = 4 : i64} : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<8x8xf32>, tensor<4xi32>
  // expected-error @+1 {{'nn.grouped_linear' op expects the experts' weights to have no other use}}
  %g = nn.grouped_linear %r, %c, %w : (tensor<8x8xf32>, tensor<4xi32>, tensor<4x8x8xf32>) -> tensor<8x8xf32>
  %y = nn.moe_combine %g, %p, %i {num_experts = 4 : i64} : tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  %s = nn.scale %w {factor = 2.0 : f32} : tensor<4x8x8xf32>
  return %y : tensor<4x8xf32>
}
