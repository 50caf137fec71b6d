// RUN: tessera-opt %s -split-input-file -verify-diagnostics

func.func @peer(%x: tensor<4xf32>) {
  // expected-error @+1 {{peer must be "next" or "prev", got "up"}}
  dist.send %x to "up" {tag = 0 : i64} : tensor<4xf32>
  return
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
    // expected-error @+1 {{part must be "recv", "compute" or "send", got "all"}}
    dist.run @forward_c0 microbatch 0 slot 0 part "all"
  }
}

// -----

module {
  func.func @helper() {
    return
  }
  dist.schedule attributes {kind = "1f1b", warmup = 0 : i64} {
    // expected-error @+1 {{runs 'helper', which is not a forward or backward phase}}
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
