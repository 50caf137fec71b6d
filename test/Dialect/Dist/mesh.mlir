// RUN: tessera-opt %s -split-input-file | FileCheck %s

// MoE folding in Megatron's RankGenerator on 16 ranks: dense TP4-PP2-DP2
// (decoder_rank_generator) and expert ETP1-EP4-EDP2-PP2
// (expert_decoder_rank_generator).
// CHECK: dist.mesh @mesh {dp = 2 : i64, ep = 4 : i64, pp = 2 : i64, tp = 4 : i64}
dist.mesh @mesh {tp = 4, pp = 2, dp = 2, etp = 1, ep = 4}
func.func @f(%x: tensor<8x16xf32>) -> tensor<8x4xf32> {
  // ep groups hold 4 ranks: a reduce-scatter over them quarters dim 1.
  // CHECK: dist.reduce_scatter %{{.*}} on @mesh "ep" dim 1
  %0 = dist.reduce_scatter %x on @mesh "ep" dim 1 : tensor<8x16xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// Any permutation of the axes is an order.
// CHECK: dist.mesh @mesh {cp = 2 : i64, order = "dp-tp-cp-ep-pp", pp = 2 : i64, tp = 2 : i64, vpp = 2 : i64}
dist.mesh @mesh {tp = 2, cp = 2, pp = 2, vpp = 2, order = "dp-tp-cp-ep-pp"}
