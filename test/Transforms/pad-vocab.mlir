// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 8 --tie-embeddings -o %t.mlir
// RUN: tessera-opt %t.mlir --tessera-pad-vocab | FileCheck %s --check-prefix=TP1
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=4" --tessera-pad-vocab | FileCheck %s --check-prefix=TP4
// RUN: tessera-opt %t.mlir --tessera-attach-mesh="tp=2" --tessera-pad-vocab="make-vocab-size-divisible-by=1" | FileCheck %s --check-prefix=D1

// Megatron: 257 rounded up to a multiple of 128 x tp.
// TP1: tessera.vocab = {padded = 384 : i64, size = 257 : i64}
// TP1: tensor<384x32xf32> {nn.init = "normal:0.02", nn.param = "embedding.word_embeddings.weight"}
// TP1: nn.embedding {{.*}} {vocab_size = 257 : i64} : (tensor<8x?xi32>, tensor<384x32xf32>)
// TP1: nn.linear {{.*}} -> tensor<8x?x384xf32>
// TP4: tessera.vocab = {padded = 512 : i64, size = 257 : i64}
// D1: tessera.vocab = {padded = 258 : i64, size = 257 : i64}
