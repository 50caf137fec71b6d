// RUN: tessera-opt %s --split-input-file --verify-diagnostics --tessera-verify-schedule

// tessera-verify-schedule on hand-made two-rank pipelines (pp = 2): each
// rank's forward sends/receives one activation on tag 0 and its backward
// the gradient on tag 1.

// A correct 1F1B pair of schedules: no diagnostics.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
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
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// A receive on the wrong tag: both ranks wait forever.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      // expected-error @+1 {{would hang: pipeline rank 0 waits to send to pipeline rank 1 (tag 0, tensor<4x8xf32>), which no rank ever matches (the schedule deadlocks)}}
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      // expected-note @+1 {{run by this schedule step (forward_c0, microbatch 0)}}
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      // expected-note @+1 {{pipeline rank 1 waits here to receive from pipeline rank 0 (tag 2, tensor<4x8xf32>) (forward_c0, microbatch 0)}}
      %a = dist.recv from "prev" {tag = 2 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// Shapes disagree across a boundary.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x4xf32>
      // expected-error @+1 {{sends 'tensor<4x4xf32>' on tag 0, but the matching receive on pipeline rank 1 expects 'tensor<4x8xf32>'}}
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x4xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      // expected-note @+1 {{run by this schedule step}}
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      // expected-note @+1 {{the receive}}
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// The hand-made mismatched schedule of the issue: rank 1 runs microbatch 1
// before microbatch 0, so it would take microbatch 0's activation as 1's.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      // expected-note @+1 {{the send}}
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      // expected-error @+1 {{receives on tag 0 for microbatch 1, but pipeline rank 0 sends microbatch 0 there first (the schedules disagree on the order)}}
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      // expected-note @+1 {{run by this schedule step (forward_c0, microbatch 1)}}
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
}

// -----

// The tied embedding's gradients all-reduced in different orders.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @step(%a: tensor<8xf32>, %b: tensor<4xf32>) attributes {tessera.phase = "step"} {
      // expected-note @+2 {{in the step phase}}
      // expected-error @+1 {{is the next collective over "embedding" on pipeline rank 0, but pipeline rank 1 runs dist.all_reduce over "embedding" with 'tensor<4xf32>' there; the group's members must agree on the order}}
      %0 = dist.all_reduce %a on @mesh "embedding" : tensor<8xf32>
      %1 = dist.all_reduce %b on @mesh "embedding" : tensor<4xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
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
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @step(%a: tensor<8xf32>, %b: tensor<4xf32>) attributes {tessera.phase = "step"} {
      // expected-note @+1 {{the other collective}}
      %1 = dist.all_reduce %b on @mesh "embedding" : tensor<4xf32>
      %0 = dist.all_reduce %a on @mesh "embedding" : tensor<8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// Two microbatches in flight in one slot.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      // expected-error @+1 {{puts microbatch 1 of chunk 0 in slot 0, which microbatch 0 of chunk 0 still uses}}
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// A backward must find its forward's saved activations.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      // expected-error @+1 {{runs microbatch 0 of chunk 0 on slot 1, but its forward used slot 0}}
      dist.run @backward_c0 microbatch 0 slot 1
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      // expected-error @+1 {{runs the backward of chunk 0 microbatch 0 before its forward completed}}
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 0 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
}

// -----

// Microbatch 1 is never run on rank 0.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    // expected-error @+1 {{never completes chunk 0 microbatch 1}}
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      // expected-error @+1 {{runs microbatch 5, but there are 2 microbatches}}
      dist.run @forward_c0 microbatch 5 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      // expected-error @+1 {{runs the forward of chunk 0 microbatch 0 twice}}
      dist.run @forward_c0 microbatch 0 slot 1
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// A receive after computation cannot be batched.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
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
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      // expected-error @+1 {{comes after computation in phase 'backward_c0'; a phase must receive first and send last}}
      %h = dist.recv from "prev" {tag = 5 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 1
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 1 slot 1
    }
  }
  // expected-error @+1 {{pipeline rank 1 has no schedule (run tessera-pp-schedule)}}
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %a = dist.recv from "prev" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
  }
}

// -----

// A schedule step that runs a phase no chunk owns.
module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward() attributes {tessera.phase = "forward"} {
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      // expected-error @+1 {{runs a function that is no chunk phase}}
      dist.run @forward microbatch 0 slot 0
    }
  }
}

// -----

// The evaluation phases (tessera-eval-phase) run in the order of the
// schedule's forwards; one that receives on the wrong tag hangs the
// evaluation even though training would not.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @eval_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "eval"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      // expected-error @+1 {{would hang: pipeline rank 0 waits to send to pipeline rank 1 (tag 0, tensor<4x8xf32>), which no rank ever matches (the evaluation order (the schedule's forwards alone) deadlocks)}}
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 1 : i64} {
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
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %g to "prev" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @eval_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "eval"} {
      // expected-note @+1 {{pipeline rank 1 waits here to receive from pipeline rank 0 (tag 7, tensor<4x8xf32>) (forward_c0, microbatch 0)}}
      %a = dist.recv from "prev" {tag = 7 : i64} : tensor<4x8xf32>
      return
    }
    dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_c0 microbatch 1 slot 0
    }
  }
}

// -----

// A split backward (B and W, for ZB-H1): W after its B, and the slot held
// until W.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_w_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward_w"} {
      return
    }
    dist.schedule attributes {kind = "zb-h1", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      // expected-error @+1 {{runs the weight-gradient phase of chunk 0 microbatch 0 before its backward completed}}
      dist.run @backward_w_c0 microbatch 0 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_w_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward_w"} {
      return
    }
    dist.schedule attributes {kind = "zb-h1", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
      // expected-error @+1 {{puts microbatch 1 of chunk 0 in slot 0, which microbatch 0 of chunk 0 still uses}}
      dist.run @forward_c0 microbatch 1 slot 0
      dist.run @backward_w_c0 microbatch 0 slot 0
    }
  }
}

// -----

module attributes {tessera.batch = {global_batch_size = 1 : i64, micro_batch_size = 1 : i64, num_microbatches = 1 : i64}} {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      %x = nn.fill 1.0 : tensor<4x8xf32>
      dist.send %x to "next" {tag = 0 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = dist.recv from "next" {tag = 1 : i64} : tensor<4x8xf32>
      return
    }
    func.func @backward_w_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward_w"} {
      return
    }
    // expected-error @+1 {{never completes chunk 0 microbatch 0}}
    dist.schedule attributes {kind = "zb-h1", warmup = 1 : i64} {
      dist.run @forward_c0 microbatch 0 slot 0
      dist.run @backward_c0 microbatch 0 slot 0
    }
  }
}
