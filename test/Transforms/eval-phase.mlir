// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 64 --seq 8 --dropout 0.1 -o - | tessera-opt --pass-pipeline="builtin.module(tessera-attach-mesh{dp=2},tessera-set-batch{micro-batch-size=2 global-batch-size=8},tessera-autodiff,tessera-dp-grad-allreduce{overlap-grad-reduce=true},tessera-optimizer,tessera-eval-phase)" | FileCheck %s
// RUN: tessera-gen gpt --layers 1 --hidden 32 --heads 4 --vocab 64 --seq 8 --dropout 0.1 -o - | tessera-opt --pass-pipeline="builtin.module(tessera-attach-mesh{dp=2},tessera-set-batch{micro-batch-size=2 global-batch-size=8},tessera-autodiff,tessera-dp-grad-allreduce{overlap-grad-reduce=true},tessera-optimizer,tessera-eval-phase)" | grep -c "tessera.phase = \"eval\"" | FileCheck %s --check-prefix=ONE
// RUN: tessera-gen gpt --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --dropout 0.1 -o - | tessera-opt --pass-pipeline="builtin.module(tessera-attach-mesh{pp=2},tessera-set-batch{micro-batch-size=2 global-batch-size=8},tessera-pp-split,tessera-autodiff,tessera-dp-grad-allreduce,tessera-optimizer,tessera-eval-phase)" | FileCheck %s --check-prefix=PP

// tessera-eval-phase: the microbatch phase's forward alone, to the loss
// (Megatron's evaluate, forward_only=True, model.eval()): the copy keeps
// the loss as its one result, drops the gradients, the backward and the
// bucket reductions, and passes dropout's input through.

// CHECK-LABEL: func.func @eval(
// CHECK-SAME: {nn.batch_dim = 1 : i64, nn.input = "tokens"}
// CHECK-SAME: -> (tensor<f32> {tessera.buffer = "loss"})
// CHECK-SAME: tessera.phase = "eval"
// CHECK: %[[E:.*]] = nn.embedding
// CHECK-NEXT: %[[P:.*]] = nn.add_position_embedding %[[E]]
// CHECK-NEXT: nn.layer_norm %[[P]]
// CHECK-NOT: nn.dropout
// CHECK-NOT: _grad
// CHECK-NOT: dist.bucket_reduce
// CHECK: %[[CE:.*]] = nn.softmax_cross_entropy
// CHECK-NEXT: %[[L:.*]] = nn.token_mean %[[CE]]
// CHECK-NEXT: return %[[L]] : tensor<f32>
// The last microbatch's variant (overlapped reductions) has no copy: one
// evaluation phase.
// ONE: {{^}}1{{$}}

// A pipeline: each chunk's forward, with its receive and send of
// activations and (last stage) the loss; no saved activations.
// PP-LABEL: module @pp0
// PP: func.func @eval_c0(
// PP-SAME: ) attributes {dist.chunk = 0 : i64, {{.*}}tessera.phase = "eval"}
// PP-NOT: nn.dropout
// PP: dist.send %{{.*}} to "next" {tag = 0 : i64}
// PP-NEXT: return{{$}}
// PP-LABEL: module @pp1
// PP: func.func @eval_c0(
// PP-SAME: -> (tensor<f32> {tessera.buffer = "loss"})
// PP-NEXT: dist.recv from "prev" {tag = 0 : i64}
// PP-NOT: nn.dropout
// PP: nn.token_mean
// PP-NEXT: return %{{.*}} : tensor<f32>
