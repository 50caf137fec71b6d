// RUN: tessera-opt %s --tessera-train-pipeline="micro-batch-size=256 global-batch-size=256 optimizer=sgd" | FileCheck %s

// Each entry function records its cost per run for tessera-plan, from
// CostOpInterface: all FLOPs (rt.flops), the FLOPs of the compute-bound ops,
// those with at least 16 FLOPs a byte (rt.dense_flops: here the forward GEMM
// and the weight gradient's, 2 x 256^3 each), and the bytes the other ops
// move (rt.light_bytes).

func.func @net(%x: tensor<?x256xf32> {nn.input = "features"},
               %w: tensor<256x256xf32> {nn.param = "fc.weight"}) -> tensor<f32> {
  %h = nn.linear %x, %w : (tensor<?x256xf32>, tensor<256x256xf32>) -> tensor<?x256xf32>
  %a = nn.relu %h : tensor<?x256xf32>
  %loss = nn.mean %a : (tensor<?x256xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK: func.func @microbatch() attributes {rt.dense_flops = 67108864 : i64, rt.entry, rt.flops = {{[0-9]+}} : i64, rt.light_bytes = {{[1-9][0-9]*}} : i64, tessera.phase = "microbatch"}
// CHECK: func.func @step() attributes {rt.dense_flops = 0 : i64, rt.entry
