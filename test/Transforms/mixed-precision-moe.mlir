// RUN: tessera-gen gpt --layers 1 --hidden 16 --heads 2 --vocab 257 --seq 4 --num-experts 3 --moe-router-topk 2 -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-mixed-precision | FileCheck %s
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-mixed-precision --tessera-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2 etp=1" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=true" --tessera-mixed-precision=moe-router-dtype=fp32 | FileCheck %s --check-prefix=ROUTER32
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=moe-router-dtype=fp64 2>&1 | FileCheck %s --check-prefix=FP64
// RUN: not tessera-compile %t.mlir --bf16 --moe-router-dtype bf16 --micro-batch-size 2 -o %t.tsr 2>&1 | FileCheck %s --check-prefix=FLAG

// bf16 GEMMs on sequence shards: tp-partition makes the router's and the
// (unsplit) experts' weights enter the tensor-parallel region
// (dist.copy_to_region, so that their partial gradients sum over tp);
// they enter it in bf16 and the GEMMs read them so, as at tp 1, with no
// f32 copy of them left.
// CHECK: func.func @gpt({{.*}}%[[ROUTER:[^:]*]]: tensor<3x16xbf16> {{{.*}}nn.param = "decoder.layers.0.mlp.router.weight"}, %[[FC1:[^:]*]]: tensor<3x64x16xbf16> {{{.*}}nn.param = "decoder.layers.0.mlp.experts.linear_fc1.weight"}, %[[FC2:[^:]*]]: tensor<3x16x64xbf16> {{{.*}}nn.param = "decoder.layers.0.mlp.experts.linear_fc2.weight"}
// CHECK-NOT: nn.cast %[[ROUTER]]
// CHECK-NOT: nn.cast %[[FC1]]
// CHECK-NOT: nn.cast %[[FC2]]
// CHECK: %[[R:.*]] = dist.copy_to_region %[[ROUTER]] on @mesh "tp" : tensor<3x16xbf16>
// CHECK: nn.linear %{{.*}}, %[[R]] {nn.layer = 0 : i64} : (tensor<2x2x16xbf16>, tensor<3x16xbf16>) -> tensor<2x2x3xf32>
// CHECK: %[[W1:.*]] = dist.copy_to_region %[[FC1]] on @mesh "tp" : tensor<3x64x16xbf16>
// CHECK: nn.grouped_linear %{{.*}}, %{{.*}}, %[[W1]] {nn.layer = 0 : i64} : (tensor<8x16xbf16>, tensor<3xi32>, tensor<3x64x16xbf16>) -> tensor<8x64xf32>
// CHECK: %[[W2:.*]] = dist.copy_to_region %[[FC2]] on @mesh "tp" : tensor<3x16x64xbf16>
// CHECK: nn.grouped_linear %{{.*}}, %{{.*}}, %[[W2]] {nn.layer = 0 : i64} : (tensor<8x64xbf16>, tensor<3xi32>, tensor<3x16x64xbf16>) -> tensor<8x16xf32>
// CHECK-NOT: nn.cast %[[ROUTER]]
// CHECK-NOT: nn.cast %[[FC1]]
// CHECK-NOT: nn.cast %[[FC2]]
// CHECK: return

// The region's adjoint sums the f32 weight gradients over tp.
// GRAD: %{{.*}}, %[[DW2:.*]] = nn.grouped_linear_grad {{.*}} : tensor<8x64xbf16>, tensor<3xi32>, tensor<3x16x64xbf16>, tensor<8x16xbf16>
// GRAD-NEXT: dist.all_reduce %[[DW2]] on @mesh "tp" : tensor<3x16x64xf32>
// GRAD: %{{.*}}, %[[DW1:.*]] = nn.grouped_linear_grad {{.*}} : tensor<8x16xbf16>, tensor<3xi32>, tensor<3x64x16xbf16>, tensor<8x64xbf16>
// GRAD-NEXT: dist.all_reduce %[[DW1]] on @mesh "tp" : tensor<3x64x16xf32>
// GRAD: dist.all_reduce %{{.*}} on @mesh "tp" : tensor<3x16xf32>

// With moe-router-dtype=fp32 (Megatron's --moe-router-dtype fp32) the
// router's GEMM stays in f32: the f32 weight enters the region and the
// linear reads f32 hidden states; the experts' GEMMs are still bf16.
// ROUTER32: %[[R32:.*]] = nn.cast %[[ROUTER:[^ ]*]] : tensor<3x16xbf16> to tensor<3x16xf32>
// ROUTER32-NEXT: %[[R:.*]] = dist.copy_to_region %[[R32]] on @mesh "tp" : tensor<3x16xf32>
// ROUTER32: %[[LOGITS:.*]] = nn.linear %{{.*}}, %[[R]] {nn.layer = 0 : i64} : (tensor<2x2x16xf32>, tensor<3x16xf32>) -> tensor<2x2x3xf32>
// ROUTER32-NEXT: nn.moe_router %[[LOGITS]]
// ROUTER32: nn.grouped_linear {{.*}} : (tensor<8x16xbf16>, tensor<3xi32>, tensor<3x64x16xbf16>) -> tensor<8x64xf32>
// FP64: error: unsupported moe-router-dtype 'fp64' (expected fp32; the router's GEMM is otherwise in the gemm-dtype)
// FLAG: tessera-compile: error: --moe-router-dtype must be fp32 (the router's GEMM is otherwise in the GEMM dtype), got 'bf16'
