// Megatron's uneven pipeline splits (its flags, resolved by
// tessera-pp-split into layers per virtual stage s = chunk * pp + rank,
// layers numbered in that order): a layout string with an embedding-only
// first stage, an empty middle stage and a loss-only last stage (pp 2 x vpp
// 2), the first and last ranks' layer counts, and the embedding and loss
// counted as layers.

// RUN: tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split="pipeline-model-parallel-layout=E|tt|tt|L" | FileCheck %s --check-prefix=LAYOUT
// LAYOUT-LABEL: module @pp0
// LAYOUT: func.func @chunk0
// LAYOUT-SAME: layers = array<i64>, stage = 0
// LAYOUT: nn.linear %{{.*}}, %{{.*}} : (tensor<4x8xf32>
// LAYOUT-NOT: nn.layer
// LAYOUT: dist.send
// LAYOUT: func.func @chunk1
// LAYOUT-SAME: layers = array<i64: 2, 3>, stage = 2
// LAYOUT-LABEL: module @pp1
// LAYOUT: func.func @chunk0
// LAYOUT-SAME: layers = array<i64: 0, 1>, stage = 1
// LAYOUT: func.func @chunk1
// LAYOUT-SAME: layers = array<i64>, stage = 3
// LAYOUT: nn.mean

// The stages of an empty layout entry pass the activations on.
// RUN: tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split="pipeline-model-parallel-layout=Et|t||ttL" | FileCheck %s --check-prefix=EMPTY
// EMPTY-LABEL: module @pp0
// EMPTY: func.func @chunk1
// EMPTY-SAME: layers = array<i64>, stage = 2
// EMPTY-NEXT: %[[R:.*]] = dist.recv from "prev"
// EMPTY-NEXT: dist.send %[[R]] to "next"

// RUN: tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="decoder-first-pipeline-num-layers=1" | FileCheck %s --check-prefix=FIRST
// FIRST: layers = array<i64: 0>, stage = 0
// FIRST: layers = array<i64: 1, 2, 3>, stage = 1

// RUN: tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="account-for-embedding-in-pipeline-split=true account-for-loss-in-pipeline-split=true" | FileCheck %s --check-prefix=ACCOUNT
// ACCOUNT: layers = array<i64: 0, 1>, stage = 0
// ACCOUNT: layers = array<i64: 2, 3>, stage = 1

// Checked as Megatron checks them, in its words.
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split="pipeline-model-parallel-layout=E|tt|t|L" 2>&1 | FileCheck %s --check-prefix=COUNT
// COUNT: error: 'func.func' op cannot be split into pipeline stages: Number of decoder layers 3 must match num_layers 4
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="pipeline-model-parallel-layout=E|tt|tt|L" 2>&1 | FileCheck %s --check-prefix=VPP
// VPP: virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout, (virtual_pipeline_model_parallel_size=1, detected_vpp_size=2)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="pipeline-model-parallel-layout=E|tt|t|t|L" 2>&1 | FileCheck %s --check-prefix=STAGES
// STAGES: The length of pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size (num_stages=5, pipeline_model_parallel_size=2)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="pipeline-model-parallel-layout=E|tt|q|tL" 2>&1 | FileCheck %s --check-prefix=CHAR
// CHAR: Invalid layer character: q
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="pipeline-model-parallel-layout=Ett|ttL decoder-first-pipeline-num-layers=2" 2>&1 | FileCheck %s --check-prefix=BOTH
// BOTH: pipeline_model_parallel_layout cannot be set with other pipeline layout arguments
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split="decoder-first-pipeline-num-layers=1" 2>&1 | FileCheck %s --check-prefix=FIRSTVPP
// FIRSTVPP: number of layers at first stage: 1 must be divisible by virtual pipeline parallel degree 2
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="decoder-first-pipeline-num-layers=4" 2>&1 | FileCheck %s --check-prefix=MISMATCH
// MISMATCH: Mismatch: 0 middle layers remaining but 1 middle PP stages available.
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="account-for-embedding-in-pipeline-split=true" 2>&1 | FileCheck %s --check-prefix=ACCDIV
// ACCDIV: number of middle layers: 5 must be divisible by middle pipeline_model_parallel_size 2
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="decoder-first-pipeline-num-layers=1 account-for-loss-in-pipeline-split=true" 2>&1 | FileCheck %s --check-prefix=ACCFIRST
// ACCFIRST: num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be set at the same time with account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split="pp-layers=1,3 decoder-last-pipeline-num-layers=3" 2>&1 | FileCheck %s --check-prefix=PPLAYERS
// PPLAYERS: --pp-layers cannot be combined with Megatron's split options
// RUN: not tessera-opt %s --tessera-attach-mesh="dp=2" --tessera-pp-split="decoder-last-pipeline-num-layers=3" 2>&1 | FileCheck %s --check-prefix=ONE
// ONE: error: an uneven pipeline split (Megatron's split options) needs pp > 1

func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %w3: tensor<8x8xf32> {nn.param = "l3.w"},
                 %we: tensor<8x8xf32> {nn.param = "embed.w"}) -> tensor<f32> {
  %e = nn.linear %x, %we : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h0 = nn.linear %e, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %w3 {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h3 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
