// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 256 --seq 8 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-mixed-precision --tessera-bf16-activations --tessera-autodiff | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-mixed-precision --tessera-bf16-activations --tessera-autodiff | FileCheck %s --check-prefix=NOF32

// Tensor and sequence parallelism under bf16 activations: every transfer
// of an activation or of its gradient is bf16 (the vocabulary-parallel
// embedding's sum, the sequence scatter, gathers and reduce-scatters both
// ways, the gradient's final gather); the cross entropy's statistics and
// the norm weights' gradient sums over tp (parameter gradients, f32 as
// Megatron's main_grad) stay f32.
// CHECK: dist.reduce_from_region %{{.*}} on @mesh "tp" : tensor<8x2x32xbf16>
// CHECK: dist.scatter_to_region %{{.*}} : tensor<8x2x32xbf16> -> tensor<4x2x32xbf16>
// CHECK: dist.all_gather %{{.*}} : tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>
// CHECK: dist.reduce_scatter %{{.*}} : tensor<8x2x32xbf16> -> tensor<4x2x32xbf16>
// CHECK: dist.all_reduce %{{.*}} on @mesh "tp" {reduction = "max"} : tensor<8x2xf32>
// CHECK: dist.reduce_from_region %sum_exp on @mesh "tp" : tensor<8x2xf32>
// The backward.
// CHECK: dist.reduce_scatter %{{.*}} : tensor<8x2x32xbf16> -> tensor<4x2x32xbf16>
// CHECK: dist.all_reduce %bias_grad on @mesh "tp" : tensor<32xf32>
// CHECK: dist.all_gather %{{.*}} : tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>
// CHECK: dist.gather_from_region %{{.*}} : tensor<4x2x32xbf16> -> tensor<8x2x32xbf16>
// Nowhere an f32 sequence transfer.
// NOF32-NOT: dist.{{(all_gather|reduce_scatter|scatter_to_region|gather_from_region)}} {{.*}}xf32>
