// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-verify-schedule

// tessera-verify-schedule under the V-shaped schedules (kind zbv or
// dualpipev) on hand-made two-rank pipelines: sends to the rank itself go
// through a queue per tag, other sends stay in flight (a batch completes
// when its receives have met their sends), and a phase waits for the
// earlier sends of its own chunk and phase (its staging buffer) before it
// runs.

// A correct V: rank 0's chunk 0 sends to rank 1, whose chunk 0 hands the
// value to its own chunk 1 (tag 2), which sends it back to rank 0's chunk
// 1. Rank 0 runs both chunk-0 forwards before either chunk-1 forward; its
// second waits for the first's send to be received. No diagnostics.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2, vpp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "next" {tag = 4 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 2 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @forward_c1 microbatch 0 slot 2
      dist.run @backward_c1 microbatch 0 slot 2
      dist.run @forward_c1 microbatch 1 slot 2
      dist.run @backward_c1 microbatch 1 slot 2
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      dist.send %a to "self" {tag = 2 : i64} : tensor<4x8xf32>
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "self" {tag = 2 : i64} : tensor<4x8xf32>
      dist.send %a to "prev" {tag = 4 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 4 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c1 microbatch 0 slot 1
      dist.run @forward_c0 microbatch 1 slot 2
      dist.run @forward_c1 microbatch 1 slot 3
      dist.run @backward_c1 microbatch 0 slot 1
      dist.run @backward_c1 microbatch 1 slot 3
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 2
    }
  }
}

// -----

// Rank 1 runs its chunk 1 first: it takes the value of the V's turn from
// its own queue before its chunk 0 put anything there.
module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2, vpp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      dist.send %a to "self" {tag = 2 : i64} : tensor<4x8xf32>
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      // expected-error @+1 {{receives from pipeline rank 1 itself on tag 2 before that rank sent anything there (the schedule runs the receiving chunk first)}}
      %a = dist.recv from "self" {tag = 2 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 2 : i64} {
      // expected-note @+1 {{run by this schedule step (forward_c1, microbatch 0)}}
      dist.run @forward_c1 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 0 slot 1
      dist.run @backward_c1 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 1
    }
  }
}

// -----

// A send kept in flight must complete before its phase runs again (it
// rewrites the staging buffer): rank 0's second chunk-0 forward waits
// for rank 1 to receive the first, but rank 1 first waits for a value
// rank 0 sends only in its backward, after that forward.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2, vpp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      // expected-error @+1 {{would hang: pipeline rank 0 waits to send to pipeline rank 1 (tag 0, tensor<4x8xf32>), which no rank ever matches (the schedule deadlocks)}}
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "next" {tag = 6 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 2 : i64} {
      // expected-note @+1 {{run by this schedule step (forward_c0, microbatch 0)}}
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      // expected-note @+1 {{pipeline rank 1 waits here to receive from pipeline rank 0 (tag 6, tensor<4x8xf32>) (forward_c1, microbatch 0)}}
      %a = dist.recv from "prev" {tag = 6 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "zbv", warmup = 2 : i64} {
      dist.run @forward_c1 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 0 slot 1
      dist.run @forward_c1 microbatch 1 slot 2
      dist.run @forward_c0 microbatch 1 slot 3
      dist.run @backward_c1 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 1
      dist.run @backward_c1 microbatch 1 slot 2
      dist.run @backward_c0 microbatch 1 slot 3
    }
  }
}

// -----

// A send nothing ever receives: the batch completes without it, the end
// of the schedule would wait for it forever.
module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2, vpp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      // expected-error @+1 {{would hang: pipeline rank 0 waits to send to pipeline rank 1 (tag 8, tensor<4x8xf32>), which no rank ever receives (the schedule deadlocks)}}
      dist.send %x to "next" {tag = 8 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "dualpipev", warmup = 1 : i64} {
      // expected-note @+1 {{run by this schedule step (forward_c0, microbatch 0)}}
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    dist.schedule attributes {kind = "dualpipev", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
}
