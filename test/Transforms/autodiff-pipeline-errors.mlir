// RUN: tessera-opt %s -split-input-file -verify-diagnostics --tessera-autodiff

module {
  dist.mesh @mesh {pp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    // expected-error @+1 {{the module is already differentiated}}
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      return
    }
  }
}

// -----

module {
  dist.mesh @mesh {pp = 2}
  // expected-error @+1 {{pipeline rank module has no stage functions (dist.stage)}}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    func.func @helper() {
      return
    }
  }
}
