// Megatron's checks of the recompute options (TransformerConfig), each a
// clear error naming the flags.
// RUN: not tessera-opt %s --tessera-recompute="granularity=full num-layers=1" 2>&1 | FileCheck %s --check-prefix=NOMETHOD
// RUN: not tessera-opt %s --tessera-recompute="granularity=full method=even num-layers=1" 2>&1 | FileCheck %s --check-prefix=BADMETHOD
// RUN: not tessera-opt %s --tessera-recompute="granularity=full method=block" 2>&1 | FileCheck %s --check-prefix=NOLAYERS
// RUN: not tessera-opt %s --tessera-recompute="granularity=full method=block num-layers=-1" 2>&1 | FileCheck %s --check-prefix=NOLAYERS
// RUN: not tessera-opt %s --tessera-recompute="granularity=everything" 2>&1 | FileCheck %s --check-prefix=GRANULARITY
// RUN: not tessera-opt %s --tessera-recompute="granularity=selective method=uniform" 2>&1 | FileCheck %s --check-prefix=SELECTIVE
// RUN: not tessera-opt %s --tessera-recompute="granularity=selective num-layers=2" 2>&1 | FileCheck %s --check-prefix=SELECTIVE
// RUN: not tessera-opt %s --tessera-recompute="method=uniform num-layers=1" 2>&1 | FileCheck %s --check-prefix=NOGRANULARITY
// NOMETHOD: error: --recompute-granularity full needs --recompute-method uniform or block
// BADMETHOD: error: unknown --recompute-method 'even' (uniform or block)
// NOLAYERS: error: --recompute-granularity full needs --recompute-num-layers of at least 1
// GRANULARITY: error: unknown --recompute-granularity 'everything' (full or selective)
// SELECTIVE: error: --recompute-granularity selective takes no --recompute-method or --recompute-num-layers (they choose layers for full recompute)
// NOGRANULARITY: error: --recompute-method and --recompute-num-layers need --recompute-granularity full

func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %w: tensor<8x8xf32> {nn.param = "fc.weight"}) -> tensor<f32> {
  %h = nn.linear %x, %w {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
