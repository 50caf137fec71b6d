// Non-finite or out-of-range hyper-parameters are errors naming the option
// (a NaN learning rate would train to NaN losses from the first step).
// RUN: not tessera-opt %s --tessera-optimizer="lr=nan" 2>&1 | FileCheck %s --check-prefix=LR
// RUN: not tessera-opt %s --tessera-optimizer="lr=inf" 2>&1 | FileCheck %s --check-prefix=LRINF
// RUN: not tessera-opt %s --tessera-optimizer="min-lr=nan" 2>&1 | FileCheck %s --check-prefix=MINLR
// RUN: not tessera-opt %s --tessera-optimizer="weight-decay=nan" 2>&1 | FileCheck %s --check-prefix=WD
// RUN: not tessera-opt %s --tessera-optimizer="weight-decay=-0.1" 2>&1 | FileCheck %s --check-prefix=WDNEG
// RUN: not tessera-opt %s --tessera-optimizer="beta2=1" 2>&1 | FileCheck %s --check-prefix=BETA
// RUN: not tessera-opt %s --tessera-optimizer="eps=-1e-8" 2>&1 | FileCheck %s --check-prefix=EPS

// LR: error: invalid lr nan (expected a finite value in [0, inf))
// LRINF: error: invalid lr inf (expected a finite value in [0, inf))
// MINLR: error: invalid min-lr nan (expected a finite value in [0, inf))
// WD: error: invalid weight-decay nan (expected a finite value in [0, inf))
// WDNEG: error: invalid weight-decay -0.1 (expected a finite value in [0, inf))
// BETA: error: invalid beta2 1 (expected a finite value in [0, 1))
// EPS: error: invalid eps -1e-08 (expected a finite value in [0, inf))
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
