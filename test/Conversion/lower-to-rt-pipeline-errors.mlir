// RUN: tessera-opt %s -split-input-file -verify-diagnostics --tessera-lower-to-rt

dist.mesh @mesh {pp = 2}
// expected-error @+1 {{tessera-lower-to-rt needs the pipeline schedule (run tessera-pp-schedule)}}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    return
  }
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
  func.func @step() attributes {tessera.phase = "step"} {
    return
  }
}

// -----

dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @forward_c0(%x: tensor<4xf32> {nn.input = "features"}) attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    return
  }
  // expected-error @+1 {{reads input 'features', which another chunk of this pipeline rank reads too}}
  func.func @forward_c1(%x: tensor<4xf32> {nn.input = "features"}) attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
    return
  }
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
  func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
    return
  }
  func.func @step() attributes {tessera.phase = "step"} {
    return
  }
  dist.schedule attributes {kind = "interleaved", warmup = 0 : i64} {
    dist.run @forward_c0 microbatch 0 slot 0
    dist.run @forward_c1 microbatch 0 slot 0
    dist.run @backward_c1 microbatch 0 slot 0
    dist.run @backward_c0 microbatch 0 slot 0
  }
}

// -----

// Without tessera-verify-schedule the shape of a phase is still checked
// where it is split into parts.
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    %a = nn.fill 1.0 : tensor<4xf32>
    dist.send %a to "next" {tag = 0 : i64} : tensor<4xf32>
    // expected-error @+1 {{receives after computation in 'forward_c0'; a phase must receive first and send last}}
    %b = dist.recv from "prev" {tag = 2 : i64} : tensor<4xf32>
    return
  }
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
  func.func @step() attributes {tessera.phase = "step"} {
    return
  }
  dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
    dist.run @forward_c0 microbatch 0 slot 0
    dist.run @backward_c0 microbatch 0 slot 0
  }
}
