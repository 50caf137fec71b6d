// The pipeline passes on pipeline-rank modules without a dist.mesh: a
// diagnostic naming what is missing, never a crash.
// RUN: tessera-opt %s -split-input-file --tessera-pp-schedule -verify-diagnostics
// RUN: not tessera-opt %s --tessera-verify-schedule 2>&1 | FileCheck %s --check-prefix=VERIFY

// VERIFY: error: tessera-verify-schedule needs the module's dist.mesh (run tessera-attach-mesh)

// expected-error @+1 {{tessera-pp-schedule needs the module's dist.mesh (run tessera-attach-mesh)}}
module {
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
  }
}
