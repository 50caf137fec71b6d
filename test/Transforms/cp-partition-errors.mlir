// RUN: tessera-opt %s -split-input-file --tessera-attach-mesh="cp=2" --tessera-cp-partition -verify-diagnostics
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 6 -o %t.odd.mlir
// RUN: not tessera-opt %t.odd.mlir --tessera-attach-mesh="cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-cp-partition 2>&1 | FileCheck %s --check-prefix=SEQ
// SEQ: error: context parallelism: the sequence length of input 'tokens' (6) is not divisible by 2 x cp = 4
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 257 --seq 12 -o %t.sp.mlir
// RUN: not tessera-opt %t.sp.mlir --tessera-attach-mesh="tp=4 cp=2" --tessera-set-batch="micro-batch-size=2" --tessera-pad-vocab --tessera-tp-partition="sequence-parallel=1" --tessera-cp-partition 2>&1 | FileCheck %s --check-prefix=SP
// SP: error: 'dist.scatter_to_region' op context parallelism: the sequence-parallel shards of 12 positions over cp = 2 and tp = 4 are not whole (seq must be divisible by cp x tp)

// A model without a sequence: nothing to split.
// expected-error @+1 {{context parallelism splits the sequence of a language model: the model has no token or label input [seq, batch]}}
func.func @mlp(%x: tensor<4x8xf32> {nn.input = "features"}, %y: tensor<4xi32> {nn.input = "labels"}, %w: tensor<3x8xf32> {nn.param = "w"}) -> tensor<f32> {
  %0 = nn.linear %x, %w : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>
  %1 = nn.softmax_cross_entropy %0, %y : (tensor<4x3xf32>, tensor<4xi32>) -> tensor<4xf32>
  %2 = nn.mean %1 : (tensor<4xf32>) -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// A plain mean over a share would not be the sequence's mean.
func.func @mean(%t: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "tokens"}, %l: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "labels"}, %e: tensor<16x12xf32> {nn.param = "e"}) -> tensor<f32> {
  %0 = nn.embedding %t, %e {vocab_size = 16 : i64} : (tensor<8x2xi32>, tensor<16x12xf32>) -> tensor<8x2x12xf32>
  %1 = nn.attention %0 {num_heads = 1 : i64} : (tensor<8x2x12xf32>) -> tensor<8x2x4xf32>
  // expected-error @+1 {{'nn.mean' op is not supported under context parallelism: the loss must be a per-token mean (nn.token_mean), whose count is summed over the cp group}}
  %2 = nn.mean %1 : (tensor<8x2x4xf32>) -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// expected-error @+1 {{context parallelism needs attention to split: the model has no nn.attention}}
func.func @noattn(%t: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "tokens"}, %l: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "labels"}, %e: tensor<16x4xf32> {nn.param = "e"}) -> tensor<f32> {
  %0 = nn.embedding %t, %e {vocab_size = 16 : i64} : (tensor<8x2xi32>, tensor<16x4xf32>) -> tensor<8x2x4xf32>
  %1 = nn.linear %0, %e : (tensor<8x2x4xf32>, tensor<16x4xf32>) -> tensor<8x2x16xf32>
  %2 = nn.softmax_cross_entropy %1, %l {ignore_index = -100 : i64} : (tensor<8x2x16xf32>, tensor<8x2xi32>) -> tensor<8x2xf32>
  %3 = nn.token_mean %2, %l : (tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

func.func @posshard(%t: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "tokens"}, %l: tensor<8x2xi32> {nn.batch_dim = 1 : i64, nn.input = "labels"}, %e: tensor<16x12xf32> {nn.param = "e"}, %p: tensor<8x12xf32> {nn.param = "p"}, %w: tensor<16x4xf32> {nn.param = "w"}) -> tensor<f32> {
  %0 = nn.embedding %t, %e {vocab_size = 16 : i64} : (tensor<8x2xi32>, tensor<16x12xf32>) -> tensor<8x2x12xf32>
  // expected-error @+1 {{'nn.add_position_embedding' op runs on a sequence shard already; context parallelism expects the position embedding on the whole sequence}}
  %1 = nn.add_position_embedding %0, %p {sequence_shard_group = "tp"} : tensor<8x2x12xf32>, tensor<8x12xf32>
  %2 = nn.attention %1 {num_heads = 1 : i64} : (tensor<8x2x12xf32>) -> tensor<8x2x4xf32>
  %3 = nn.linear %2, %w : (tensor<8x2x4xf32>, tensor<16x4xf32>) -> tensor<8x2x16xf32>
  %4 = nn.softmax_cross_entropy %3, %l {ignore_index = -100 : i64} : (tensor<8x2x16xf32>, tensor<8x2xi32>) -> tensor<8x2xf32>
  %5 = nn.token_mean %4, %l : (tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<f32>
  return %5 : tensor<f32>
}
