// RUN: tessera-opt %s --tessera-recompute="granularity=full method=uniform num-layers=1" | FileCheck %s --check-prefix=UNIFORM1
// RUN: tessera-opt %s --tessera-recompute="granularity=full method=uniform num-layers=2" | FileCheck %s --check-prefix=UNIFORM2
// RUN: tessera-opt %s --tessera-recompute="granularity=full method=block num-layers=2" | FileCheck %s --check-prefix=BLOCK
// RUN: tessera-opt %s --tessera-recompute="granularity=selective" | FileCheck %s --check-prefix=SELECTIVE
// RUN: tessera-opt %s --tessera-recompute="granularity=full method=uniform num-layers=2" --tessera-fuse-add-layer-norm | FileCheck %s --check-prefix=FUSE

// tessera-recompute marks the ops of the layer groups whose activations the
// backward recomputes (Megatron's --recompute-granularity full): uniform
// groups num-layers consecutive layers (the last group may be shorter),
// block makes each of the first num-layers layers a group of its own.
// Selective recompute marks nothing: the attention ops keep no s x s
// activations to begin with.

module attributes {tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 4 : i64, num_microbatches = 1 : i64}} {
func.func @net(%x: tensor<4x8xf32> {nn.input = "features"},
               %labels: tensor<4xi32> {nn.input = "labels"},
               %g0: tensor<8xf32> {nn.param = "l0.norm.weight"},
               %b0: tensor<8xf32> {nn.param = "l0.norm.bias"},
               %w0: tensor<8x8xf32> {nn.param = "l0.fc.weight"},
               %g1: tensor<8xf32> {nn.param = "l1.norm.weight"},
               %b1: tensor<8xf32> {nn.param = "l1.norm.bias"},
               %w1: tensor<8x8xf32> {nn.param = "l1.fc.weight"},
               %g2: tensor<8xf32> {nn.param = "l2.norm.weight"},
               %b2: tensor<8xf32> {nn.param = "l2.norm.bias"},
               %w2: tensor<8x8xf32> {nn.param = "l2.fc.weight"},
               %wh: tensor<3x8xf32> {nn.param = "head.weight"}) -> tensor<f32> {
  %n0 = nn.layer_norm %x, %g0, %b0 {nn.layer = 0} : tensor<4x8xf32>, tensor<8xf32>
  %h0 = nn.linear %n0, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a0 = nn.gelu %h0 {nn.layer = 0} : tensor<4x8xf32>
  %r0 = nn.add %x, %a0 {nn.layer = 0} : tensor<4x8xf32>
  %n1 = nn.layer_norm %r0, %g1, %b1 {nn.layer = 1} : tensor<4x8xf32>, tensor<8xf32>
  %h1 = nn.linear %n1, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a1 = nn.gelu %h1 {nn.layer = 1} : tensor<4x8xf32>
  %r1 = nn.add %r0, %a1 {nn.layer = 1} : tensor<4x8xf32>
  %n2 = nn.layer_norm %r1, %g2, %b2 {nn.layer = 2} : tensor<4x8xf32>, tensor<8xf32>
  %h2 = nn.linear %n2, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %a2 = nn.gelu %h2 {nn.layer = 2} : tensor<4x8xf32>
  %r2 = nn.add %r1, %a2 {nn.layer = 2} : tensor<4x8xf32>
  %z = nn.linear %r2, %wh : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %l = nn.softmax_cross_entropy %z, %labels : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %loss = nn.mean %l : (tensor<4xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}

// UNIFORM1: nn.layer_norm %arg0{{.*}}nn.layer = 0 : i64, nn.recompute = 0 : i64
// UNIFORM1: nn.add %arg0{{.*}}nn.layer = 0 : i64, nn.recompute = 0 : i64
// UNIFORM1: nn.layer_norm {{.*}}nn.layer = 1 : i64, nn.recompute = 1 : i64
// UNIFORM1: nn.add {{.*}}nn.layer = 1 : i64, nn.recompute = 1 : i64
// UNIFORM1: nn.layer_norm {{.*}}nn.layer = 2 : i64, nn.recompute = 2 : i64
// UNIFORM1: nn.add {{.*}}nn.layer = 2 : i64, nn.recompute = 2 : i64
// The head is in no layer.
// UNIFORM1: nn.linear
// UNIFORM1-NOT: nn.recompute
// UNIFORM1-SAME: tensor<3x8xf32>

// UNIFORM2: nn.layer_norm %arg0{{.*}}nn.layer = 0 : i64, nn.recompute = 0 : i64
// UNIFORM2: nn.layer_norm {{.*}}nn.layer = 1 : i64, nn.recompute = 0 : i64
// UNIFORM2: nn.add {{.*}}nn.layer = 1 : i64, nn.recompute = 0 : i64
// UNIFORM2: nn.layer_norm {{.*}}nn.layer = 2 : i64, nn.recompute = 1 : i64
// UNIFORM2: nn.add {{.*}}nn.layer = 2 : i64, nn.recompute = 1 : i64

// BLOCK: nn.layer_norm %arg0{{.*}}nn.layer = 0 : i64, nn.recompute = 0 : i64
// BLOCK: nn.add {{.*}}nn.layer = 1 : i64, nn.recompute = 1 : i64
// BLOCK: nn.layer_norm {{.*}} {nn.layer = 2 : i64} :
// BLOCK: nn.gelu {{.*}} {nn.layer = 2 : i64} :
// BLOCK: nn.add {{.*}} {nn.layer = 2 : i64} :

// SELECTIVE-NOT: nn.recompute

// The fusion stays inside a group: layer 0's residual add and layer 1's
// layer norm (both group 0) fuse; layer 1's add (group 0) and layer 2's
// norm (group 1) do not, so group 1 starts from one saved tensor.
// FUSE: nn.gelu {{.*}}nn.layer = 0 : i64, nn.recompute = 0
// FUSE-NEXT: nn.add_layer_norm {{.*}}nn.layer = 1 : i64, nn.recompute = 0
// FUSE: %[[R1:.*]] = nn.add {{.*}}nn.layer = 1 : i64, nn.recompute = 0
// FUSE-NEXT: nn.layer_norm %[[R1]], {{.*}}nn.layer = 2 : i64, nn.recompute = 1
// FUSE-NOT: nn.add_layer_norm
