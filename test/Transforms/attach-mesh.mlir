// RUN: tessera-opt %s --tessera-attach-mesh="tp=2 dp=4" | FileCheck %s
// RUN: tessera-opt %s --tessera-attach-mesh="tp=4 order=dp-tp-cp-ep-pp" | FileCheck %s --check-prefix=ORDER
// RUN: tessera-opt %s --tessera-attach-mesh="tp=2 etp=1 dp=4" | FileCheck %s --check-prefix=ETP1

// etp defaults to tp (Megatron's --expert-tensor-parallel-size); etp=1
// keeps every expert whole.
// CHECK: dist.mesh @mesh {dp = 4 : i64, etp = 2 : i64, tp = 2 : i64}
// ORDER: dist.mesh @mesh {etp = 4 : i64, order = "dp-tp-cp-ep-pp", tp = 4 : i64}
// ETP1: dist.mesh @mesh {dp = 4 : i64, tp = 2 : i64}
// CHECK-LABEL: func.func @mlp
func.func @mlp(%x: tensor<?x64xf32> {nn.input = "features"},
               %w1: tensor<128x64xf32> {nn.param = "fc1.weight"},
               %w2: tensor<64x128xf32> {nn.param = "fc2.weight"}) -> tensor<?x64xf32> {
  %h = nn.linear %x, %w1 : (tensor<?x64xf32>, tensor<128x64xf32>) -> tensor<?x128xf32>
  %a = nn.gelu %h : tensor<?x128xf32>
  %y = nn.linear %a, %w2 : (tensor<?x128xf32>, tensor<64x128xf32>) -> tensor<?x64xf32>
  return %y : tensor<?x64xf32>
}
