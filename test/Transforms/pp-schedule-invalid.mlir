// RUN: tessera-opt %s -split-input-file -verify-diagnostics --tessera-pp-schedule

module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2}
  // expected-error @+1 {{pipeline rank 0 already has a schedule}}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
  }
}
