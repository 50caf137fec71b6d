// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="ep=2 etp=2 dp=4" --tessera-ep-partition -verify-diagnostics

// Expert tensor parallelism splits the FFN between its two GEMMs: an
// expert of one grouped linear has no FFN dimension to split.
func.func @m(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>, %p: tensor<4x2xf32>, %w: tensor<4x8x8xf32> {nn.param = "w"}) -> tensor<4x8xf32> {
  // expected-error @+1 {{'nn.moe_dispatch' op expert tensor parallelism (etp 2) expects two grouped linears per expert (the FFN's two GEMMs), found 1}}
  %r, %c = nn.moe_dispatch %x, %i {num_experts = 4 : i64} : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<8x8xf32>, tensor<4xi32>
  %g = nn.grouped_linear %r, %c, %w : (tensor<8x8xf32>, tensor<4xi32>, tensor<4x8x8xf32>) -> tensor<8x8xf32>
  %y = nn.moe_combine %g, %p, %i {num_experts = 4 : i64} : tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// A stacked [experts, 2, ffn, hidden] weight's slice is [gate | up]: only
// nn.swiglu may read it under etp (the second GEMM would contract blocks).
func.func @stacked(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>, %p: tensor<4x2xf32>, %w1: tensor<4x2x8x8xf32> {nn.param = "w1"}, %w2: tensor<4x8x16xf32> {nn.param = "w2"}) -> tensor<4x8xf32> {
  %r, %c = nn.moe_dispatch %x, %i {num_experts = 4 : i64} : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<8x8xf32>, tensor<4xi32>
  // expected-error @+1 {{'nn.grouped_linear' op expert tensor parallelism splits a stacked [experts, k, ffn, hidden] weight only before nn.swiglu}}
  %g = nn.grouped_linear %r, %c, %w1 : (tensor<8x8xf32>, tensor<4xi32>, tensor<4x2x8x8xf32>) -> tensor<8x16xf32>
  %a = nn.gelu %g : tensor<8x16xf32>
  %h = nn.grouped_linear %a, %c, %w2 : (tensor<8x16xf32>, tensor<4xi32>, tensor<4x8x16xf32>) -> tensor<8x8xf32>
  %y = nn.moe_combine %h, %p, %i {num_experts = 4 : i64} : tensor<8x8xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
