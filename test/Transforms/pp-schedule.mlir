// Megatron's pipeline schedules as IR (tessera-pp-schedule), checked by
// tessera-verify-schedule, on an 8-layer GPT with micro-batch-size 1:
// every step of the first and the last pipeline rank.
// RUN: tessera-gen gpt --layers 8 --hidden 8 --heads 2 --seq 4 --vocab 16 -o %t.mlir
//
// 1F1B (pp 4, M 8): rank r runs pp - r - 1 warmup forwards, then one
// forward one backward, then the remaining backwards; a forward takes the
// lowest free slot and its backward frees it, so rank 0 keeps 4 = pp
// microbatches in flight and the last rank 1.
// Interleaved (Megatron's forward_backward_pipelining_with_interleaving):
// warmup (pp - r - 1) * 2 + (vpp - 1) * pp virtual microbatches; each phase
// runs as its receive, compute and send parts so that after a
// forward-backward pair the two sends and the next two receives form one
// batch (p2p parts without ops, such as the first stage's receive, are
// left out). `slot` numbers the rank's pool shared by its chunks (at most
// warmup + 1 microbatch-chunks in flight), `dist.chunk_slot` the slot in a
// region of the chunk alone; lower-to-rt keeps the smaller layout.

// RUN: tessera-opt %t.mlir --tessera-attach-mesh="pp=4" --tessera-set-batch="micro-batch-size=1 global-batch-size=8" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=1f1b" --tessera-verify-schedule | FileCheck %s --check-prefix=P4
// P4-LABEL: module @pp0
// P4: dist.schedule attributes {kind = "1f1b", warmup = 3 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 0 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 1 slot 1 {dist.chunk_slot = 1 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 2 slot 2 {dist.chunk_slot = 2 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 3 slot 3 {dist.chunk_slot = 3 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 0 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 4 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 1 slot 1 {dist.chunk_slot = 1 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 5 slot 1 {dist.chunk_slot = 1 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 2 slot 2 {dist.chunk_slot = 2 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 6 slot 2 {dist.chunk_slot = 2 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 3 slot 3 {dist.chunk_slot = 3 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 7 slot 3 {dist.chunk_slot = 3 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 4 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 5 slot 1 {dist.chunk_slot = 1 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 6 slot 2 {dist.chunk_slot = 2 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 7 slot 3 {dist.chunk_slot = 3 : i64}
// P4-NEXT: }
// P4-LABEL: module @pp3
// P4: dist.schedule attributes {kind = "1f1b", warmup = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 0 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 0 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 1 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 1 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 2 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 2 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 3 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 3 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 4 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 4 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 5 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 5 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 6 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 6 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @forward_c0 microbatch 7 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: dist.run @backward_c0 microbatch 7 slot 0 {dist.chunk_slot = 0 : i64}
// P4-NEXT: }

// RUN: tessera-opt %t.mlir --tessera-attach-mesh="pp=4 vpp=2" --tessera-set-batch="micro-batch-size=1 global-batch-size=8" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=interleaved" --tessera-verify-schedule | FileCheck %s --check-prefix=P4V2
// P4V2-LABEL: module @pp0
// P4V2: dist.schedule attributes {kind = "interleaved", warmup = 10 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 3 slot 3 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 3 slot 3 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 0 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 0 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 0 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 1 slot 5 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 1 slot 5 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 1 slot 5 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 2 slot 6 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 2 slot 6 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 2 slot 6 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 3 slot 7 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 3 slot 7 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 3 slot 7 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 4 slot 8 part "compute" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 4 slot 8 part "send" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 5 slot 9 part "compute" {dist.chunk_slot = 5 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 5 slot 9 part "send" {dist.chunk_slot = 5 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 0 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 6 slot 10 part "compute" {dist.chunk_slot = 6 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 0 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 6 slot 10 part "send" {dist.chunk_slot = 6 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 0 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 1 slot 5 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 7 slot 4 part "compute" {dist.chunk_slot = 7 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 1 slot 5 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 7 slot 4 part "send" {dist.chunk_slot = 7 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 1 slot 5 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 4 slot 5 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 2 slot 6 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 4 slot 5 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 2 slot 6 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 4 slot 5 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 2 slot 6 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 5 slot 6 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 3 slot 7 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 5 slot 6 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 3 slot 7 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 5 slot 6 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 3 slot 7 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 6 slot 7 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 6 slot 7 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 6 slot 7 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 7 slot 0 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 7 slot 0 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 7 slot 0 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 3 slot 3 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 3 slot 3 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 4 slot 5 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 4 slot 5 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 4 slot 5 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 5 slot 6 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 5 slot 6 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 5 slot 6 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 6 slot 7 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 6 slot 7 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 6 slot 7 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 7 slot 0 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 7 slot 0 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 7 slot 0 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 4 slot 8 part "recv" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 4 slot 8 part "compute" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 5 slot 9 part "recv" {dist.chunk_slot = 5 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 5 slot 9 part "compute" {dist.chunk_slot = 5 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 6 slot 10 part "recv" {dist.chunk_slot = 6 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 6 slot 10 part "compute" {dist.chunk_slot = 6 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 7 slot 4 part "recv" {dist.chunk_slot = 7 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 7 slot 4 part "compute" {dist.chunk_slot = 7 : i64}
// P4V2-NEXT: }
// P4V2-LABEL: module @pp3
// P4V2: dist.schedule attributes {kind = "interleaved", warmup = 4 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 3 slot 3 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 3 slot 3 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 3 slot 3 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 0 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 0 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 0 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 0 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 1 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 1 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 1 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 1 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 2 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 2 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 2 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 2 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 3 slot 4 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 3 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 3 slot 4 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 3 slot 4 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 4 slot 4 part "recv" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 4 slot 4 part "compute" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 4 slot 4 part "send" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 5 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 5 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 5 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 6 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 6 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 6 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 7 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 3 slot 3 part "recv" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 7 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 3 slot 3 part "compute" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c0 microbatch 7 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 3 slot 3 part "send" {dist.chunk_slot = 3 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 4 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 4 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 4 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 4 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 5 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 5 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 5 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 5 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 6 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 6 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 6 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 6 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 7 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @forward_c1 microbatch 7 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 7 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c1 microbatch 7 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 4 slot 4 part "recv" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 4 slot 4 part "compute" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 4 slot 4 part "send" {dist.chunk_slot = 4 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 5 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 5 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 5 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 6 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 6 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 6 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 7 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 7 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: dist.run @backward_c0 microbatch 7 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P4V2-NEXT: }

// RUN: tessera-opt %t.mlir --tessera-attach-mesh="pp=2 vpp=2" --tessera-set-batch="micro-batch-size=1 global-batch-size=4" --tessera-pp-split --tessera-autodiff --tessera-pp-schedule="schedule=interleaved" --tessera-verify-schedule | FileCheck %s --check-prefix=P2V2
// P2V2-LABEL: module @pp0
// P2V2: dist.schedule attributes {kind = "interleaved", warmup = 4 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 0 slot 2 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 0 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 0 slot 2 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 1 slot 3 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 1 slot 3 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 1 slot 3 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 0 slot 2 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 2 slot 4 part "compute" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 0 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 2 slot 4 part "send" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 0 slot 2 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 1 slot 3 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 3 slot 2 part "compute" {dist.chunk_slot = 3 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 1 slot 3 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 3 slot 2 part "send" {dist.chunk_slot = 3 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 1 slot 3 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 2 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 2 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 2 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 3 slot 0 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 3 slot 0 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 3 slot 0 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 2 slot 3 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 2 slot 3 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 2 slot 3 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 3 slot 0 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 3 slot 0 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 3 slot 0 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 2 slot 4 part "recv" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 2 slot 4 part "compute" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 3 slot 2 part "recv" {dist.chunk_slot = 3 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 3 slot 2 part "compute" {dist.chunk_slot = 3 : i64}
// P2V2-NEXT: }
// P2V2-LABEL: module @pp1
// P2V2: dist.schedule attributes {kind = "interleaved", warmup = 2 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 0 slot 2 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 0 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 0 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 0 slot 2 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 1 slot 2 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 1 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 1 slot 2 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 1 slot 2 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 2 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 0 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 3 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "recv" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 3 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "compute" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c0 microbatch 3 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 1 slot 1 part "send" {dist.chunk_slot = 1 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 2 slot 1 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 2 slot 1 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 2 slot 1 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 2 slot 1 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 3 slot 1 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @forward_c1 microbatch 3 slot 1 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 3 slot 1 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c1 microbatch 3 slot 1 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "recv" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "compute" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 2 slot 2 part "send" {dist.chunk_slot = 2 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 3 slot 0 part "recv" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 3 slot 0 part "compute" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: dist.run @backward_c0 microbatch 3 slot 0 part "send" {dist.chunk_slot = 0 : i64}
// P2V2-NEXT: }
