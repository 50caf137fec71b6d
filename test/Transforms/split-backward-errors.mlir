// RUN: tessera-opt %s --tessera-split-backward -split-input-file -verify-diagnostics

// The last microbatch's variant must compute the input gradient as the
// plain backward does (here it sends another value).
module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @forward_c0(%x: tensor<4xf32> {nn.input = "features"}) -> (tensor<4xf32> {tessera.stash = 0 : i64}) attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    dist.send %x to "next" {tag = 0 : i64} : tensor<4xf32>
    return %x : tensor<4xf32>
  }
  func.func @backward_c0(%s: tensor<4xf32> {tessera.stash = 0 : i64}) -> (tensor<4xf32> {tessera.grad_of = "w"}) attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    %g = dist.recv from "next" {tag = 1 : i64} : tensor<4xf32>
    %w = nn.add %g, %s : tensor<4xf32>
    return %w : tensor<4xf32>
  }
  // expected-error @+1 {{computes its input gradient differently from the chunk's backward}}
  func.func @"backward_c0:last"(%s: tensor<4xf32> {tessera.stash = 0 : i64}) -> (tensor<4xf32> {tessera.grad_of = "w"}) attributes {dist.chunk = 0 : i64, tessera.last_microbatch, tessera.phase = "backward"} {
    %g = dist.recv from "next" {tag = 1 : i64} : tensor<4xf32>
    %h = nn.add %g, %s : tensor<4xf32>
    dist.send %h to "prev" {tag = 3 : i64} : tensor<4xf32>
    return %h : tensor<4xf32>
  }
}
}

// -----

module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  // expected-error @+1 {{the backward of pipeline rank 0 is already split ('backward_w_c0')}}
  func.func @backward_w_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward_w"} {
    return
  }
}
}

// -----

module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  // expected-error @+1 {{cannot be split into input- and weight-gradient phases: builtin.module has regions}}
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    "builtin.module"() ({
    ^bb0:
    }) : () -> ()
    return
  }
}
}

// -----

module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  // expected-error @+1 {{is a backward phase not named backward_c<k>}}
  func.func @grads() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
}
}

// -----

module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  }
  // expected-error @+1 {{is a last-microbatch variant (tessera.last_microbatch) not named <backward>:last}}
  func.func @backward_c0_last() attributes {dist.chunk = 0 : i64, tessera.last_microbatch, tessera.phase = "backward"} {
    return
  }
}
}

// -----

module {
dist.mesh @mesh {pp = 2}
module @pp0 attributes {dist.pp_rank = 0 : i64} {
  // expected-error @+1 {{cannot be split into input- and weight-gradient phases: it has more than one block}}
  func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
    return
  ^bb1:
    return
  }
}
}
