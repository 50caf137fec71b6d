// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// Every attribute of Model.h in a valid form: the nn, dist and tessera
// dialects accept them and they round-trip.

// CHECK: module attributes {dist.single_bucket_group, tessera.architecture = {hidden_size = 64 : i64, norm_epsilon = 1.000000e-05 : f64, normalization = "RMSNorm", swiglu = true}, tessera.batch = {global_batch_size = 4 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}, tessera.compile_flags = "--dp 2", tessera.mixed_precision = {grads = "f32", params = "bf16"}, tessera.model = "gpt", tessera.optimizer = {beta1 = {{.*}}, kind = "adam", lr = {{.*}}, lr_decay_style = "cosine"{{.*}}}, tessera.vocab = {padded = 384 : i64, size = 257 : i64}, tessera.weights = {b = dense<[{{.*}}]> : tensor<8xf32>, w = {dir = "/data", file = "w.bin", offset = 64 : i64, shape = array<i64: 4, 8>}}}
module attributes {dist.single_bucket_group, tessera.architecture = {hidden_size = 64, normalization = "RMSNorm", swiglu = true, norm_epsilon = 1.0e-5 : f64}, tessera.batch = {micro_batch_size = 1, global_batch_size = 4, num_microbatches = 2}, tessera.compile_flags = "--dp 2", tessera.mixed_precision = {params = "bf16", grads = "f32"}, tessera.model = "gpt", tessera.optimizer = {kind = "adam", lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.0 : f32, lr_warmup_iters = 0, lr_decay_iters = 10, lr_decay_style = "cosine", min_lr = 0.0 : f32}, tessera.vocab = {size = 257, padded = 384}, tessera.weights = {w = {dir = "/data", file = "w.bin", offset = 64, shape = array<i64: 4, 8>}, b = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]> : tensor<8xf32>}} {
  dist.mesh @mesh {dp = 2, pp = 1}
  // CHECK: module @pp0 attributes {dist.pp_rank = 0 : i64}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    // CHECK: func.func @model(%{{.*}}: tensor<4x8xf32> {dist.sharding = {axis = "tp", dim = 0 : i64}, dist.tied = "embedding", nn.init = "normal:0.02", nn.param = "w"}, %{{.*}}: tensor<8xf32> {nn.init = "uniform:0.1", nn.param = "b"}, %{{.*}}: tensor<3x1xf32> {nn.batch_dim = 1 : i64, nn.input = "features"}) attributes {dist.chunk = 0 : i64, dist.stage = {chunk = 0 : i64, layers = array<i64: 0>, stage = 0 : i64}}
    func.func @model(%w: tensor<4x8xf32> {nn.param = "w", nn.init = "normal:0.02", dist.sharding = {axis = "tp", dim = 0}, dist.tied = "embedding"},
                     %b: tensor<8xf32> {nn.param = "b", nn.init = "uniform:0.1"},
                     %x: tensor<3x1xf32> {nn.input = "features", nn.batch_dim = 1}) attributes {dist.stage = {stage = 0, chunk = 0, layers = array<i64: 0>}, dist.chunk = 0} {
      // CHECK: nn.gelu %{{.*}} {nn.layer = 0 : i64}
      %0 = nn.gelu %b {nn.layer = 0} : tensor<8xf32>
      return
    }
    // CHECK: func.func @step(%{{.*}}: tensor<4xf32> {tessera.buffer = "grad:w"}, %{{.*}}: tensor<4xf32> {tessera.stash = 0 : i64}) -> (tensor<4xf32> {tessera.grad_of = "w"}, tensor<4xf32> {tessera.grad_shard = {bucket = 0 : i64, buffer = @gbuf}}) attributes {tessera.last_microbatch, tessera.phase = "step"}
    func.func @step(%g: tensor<4xf32> {tessera.buffer = "grad:w"}, %s: tensor<4xf32> {tessera.stash = 0}) -> (tensor<4xf32> {tessera.grad_of = "w"}, tensor<4xf32> {tessera.grad_shard = {buffer = @gbuf, bucket = 0}}) attributes {tessera.phase = "step", tessera.last_microbatch} {
      return %g, %s : tensor<4xf32>, tensor<4xf32>
    }
    func.func @forward_c0() attributes {tessera.phase = "forward", dist.chunk = 0 : i64} {
      return
    }
    // CHECK: dist.run @forward_c0 microbatch 0 slot 0 {dist.chunk_slot = 1 : i64}
    dist.schedule attributes {kind = "none", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0 {dist.chunk_slot = 1 : i64}
    }
  }
}
