// RUN: tessera-gen gpt --layers 1 --hidden 48 --heads 6 --vocab 257 --seq 8 -o %t.heads.mlir
// RUN: not tessera-opt %t.heads.mlir --tessera-attach-mesh="tp=4" 2>&1 | FileCheck %s --check-prefix=HEADS
// HEADS: error: 'nn.attention' op cannot split 6 attention heads over tp = 4
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --ffn 90 --vocab 257 --seq 8 -o %t.ffn.mlir
// RUN: not tessera-opt %t.ffn.mlir --tessera-attach-mesh="tp=4" 2>&1 | FileCheck %s --check-prefix=FFN
// FFN: error: 'nn.linear' op cannot be split column-parallel over tp = 4: 90 output features are not divisible by 4
