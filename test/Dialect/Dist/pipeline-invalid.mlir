// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @peer(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dist.send' op attribute 'peer' failed to satisfy constraint: pipeline peer: next, prev or self}}
  dist.send %x to "up" {tag = 0 : i64} : tensor<4xf32>
  return
}

// -----

func.func @recv_peer() {
  // expected-error @+1 {{'dist.recv' op attribute 'peer' failed to satisfy constraint: pipeline peer: next, prev or self}}
  %r = dist.recv from "down" {tag = 0 : i64} : tensor<4xf32>
  return
}

// -----

module {
  // expected-error @+1 {{attribute 'kind' failed to satisfy constraint: pipeline schedule: none, 1f1b, interleaved, zb-h1, zbv or dualpipev}}
  dist.schedule attributes {kind = "gpipe", warmup = 0 : i64} {
  }
}

// -----

func.func @tag() {
  // expected-error @+1 {{tag 32768 is outside [0, 32767]}}
  %r = dist.recv from "prev" {tag = 32768 : i64} : tensor<4xf32>
  return
}

// -----

module {
  func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
    return
  }
  dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
    // expected-error @+1 {{'dist.run' op attribute 'part' failed to satisfy constraint: phase part: recv, compute or send}}
    dist.run @forward_c0 microbatch 0 slot 0 part "all"
  }
}

// -----

module {
  func.func @helper() {
    return
  }
  dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
    // expected-error @+1 {{runs 'helper', which is not a forward, backward or weight-gradient phase}}
    dist.run @helper microbatch 0 slot 0
  }
}

// -----

module {
  dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
    // expected-error @+1 {{runs 'missing', which is not a function of this pipeline rank}}
    dist.run @missing microbatch 0 slot 0
  }
}
