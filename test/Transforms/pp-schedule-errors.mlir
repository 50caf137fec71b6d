// Errors of tessera-pp-schedule (the schedule options against the mesh and
// the batch), on a 4-layer chain.
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=interleaved" 2>&1 | FileCheck %s --check-prefix=NOVPP
// NOVPP: error: the interleaved schedule needs virtual pipeline stages (vpp > 1)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=interleaved" 2>&1 | FileCheck %s --check-prefix=MULT
// MULT: error: cannot schedule the pipeline: the interleaved schedule needs the number of micro-batches (3) to be a multiple of pp (2)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=1f1b" 2>&1 | FileCheck %s --check-prefix=VPP
// VPP: error: cannot schedule the pipeline: vpp 2 needs the interleaved schedule
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=gpipe" 2>&1 | FileCheck %s --check-prefix=KIND
// KIND: error: unknown schedule 'gpipe' (expected none, 1f1b, interleaved, zb-h1, zbv or dualpipev)
// ZB-H1 runs B and W apart: without tessera-split-backward there is no W;
// a split backward under 1F1B is refused.
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=zb-h1" 2>&1 | FileCheck %s --check-prefix=NOW
// NOW: error: pipeline rank 0 has no weight-gradient phase for chunk 0 (schedule 'zb-h1' runs B and W apart: run tessera-split-backward)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-autodiff --tessera-split-backward --tessera-pp-schedule="schedule=1f1b" 2>&1 | FileCheck %s --check-prefix=SPLIT
// SPLIT: error: pipeline rank 0 has a weight-gradient phase ('backward_w_c0'), which only the zero-bubble schedules (zb-h1, zbv, dualpipev) run; schedule '1f1b' runs whole backwards
// The V-shaped schedules need two chunks per rank placed as a V (and
// DualPipeV 2 pp micro-batches); a V and round robin do not mix.
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-autodiff --tessera-split-backward --tessera-pp-schedule="schedule=zbv" 2>&1 | FileCheck %s --check-prefix=ZBV1
// ZBV1: error: cannot schedule the pipeline: the zbv schedule runs exactly two chunks per rank (vpp 2), got vpp 1
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split --tessera-autodiff --tessera-split-backward --tessera-pp-schedule="schedule=zbv" 2>&1 | FileCheck %s --check-prefix=NOTV
// NOTV: error: schedule 'zbv' runs virtual stage 3 as chunk 1 of pipeline rank 0, but the split put stage 2 there (split with tessera-pp-split v-shape=true)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-set-batch="micro-batch-size=4 global-batch-size=8" --tessera-pp-split="v-shape=true" --tessera-autodiff --tessera-pp-schedule="schedule=interleaved" 2>&1 | FileCheck %s --check-prefix=VROBIN
// VROBIN: error: schedule 'interleaved' runs virtual stage 2 as chunk 1 of pipeline rank 0, but the split put stage 3 there (split without tessera-pp-split's v-shape)
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2 vpp=2" --tessera-pp-split="v-shape=true" --tessera-autodiff --tessera-split-backward --tessera-pp-schedule="schedule=dualpipev" 2>&1 | FileCheck %s --check-prefix=DPV
// DPV: error: cannot schedule the pipeline: the dualpipev schedule needs at least as many micro-batches as virtual stages (2 x pp = 4), got 3
// RUN: not tessera-opt %s --tessera-attach-mesh="pp=2" --tessera-pp-split --tessera-pp-schedule 2>&1 | FileCheck %s --check-prefix=PHASES
// PHASES: error: pipeline rank 0 has no forward phase for chunk 0 (run tessera-pp-split and tessera-autodiff)

module attributes {tessera.batch = {global_batch_size = 3 : i64, micro_batch_size = 4 : i64, num_microbatches = 3 : i64}} {
func.func @chain(%x: tensor<4x8xf32> {nn.input = "features"},
                 %w0: tensor<8x8xf32> {nn.param = "l0.w"},
                 %w1: tensor<8x8xf32> {nn.param = "l1.w"},
                 %w2: tensor<8x8xf32> {nn.param = "l2.w"},
                 %w3: tensor<8x8xf32> {nn.param = "l3.w"}) -> tensor<f32> {
  %h0 = nn.linear %x, %w0 {nn.layer = 0} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h1 = nn.linear %h0, %w1 {nn.layer = 1} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h2 = nn.linear %h1, %w2 {nn.layer = 2} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %h3 = nn.linear %h2, %w3 {nn.layer = 3} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %loss = nn.mean %h3 : (tensor<4x8xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}
}
