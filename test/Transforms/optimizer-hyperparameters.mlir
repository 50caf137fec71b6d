// Non-finite or out-of-range hyper-parameters are errors naming the option
// (a NaN learning rate would train to NaN losses from the first step); the
// names are tessera-compile's flags, which are the pass's options.
// RUN: not tessera-opt %s --tessera-optimizer="lr=nan" 2>&1 | FileCheck %s --check-prefix=LR
// RUN: not tessera-opt %s --tessera-optimizer="lr=inf" 2>&1 | FileCheck %s --check-prefix=LRINF
// RUN: not tessera-opt %s --tessera-optimizer="min-lr=nan" 2>&1 | FileCheck %s --check-prefix=MINLR
// RUN: not tessera-opt %s --tessera-optimizer="weight-decay=nan" 2>&1 | FileCheck %s --check-prefix=WD
// RUN: not tessera-opt %s --tessera-optimizer="weight-decay=-0.1" 2>&1 | FileCheck %s --check-prefix=WDNEG
// RUN: not tessera-opt %s --tessera-optimizer="adam-beta1=-0.5" 2>&1 | FileCheck %s --check-prefix=BETA1
// RUN: not tessera-opt %s --tessera-optimizer="adam-beta2=1" 2>&1 | FileCheck %s --check-prefix=BETA
// RUN: not tessera-opt %s --tessera-optimizer="adam-eps=-1e-8" 2>&1 | FileCheck %s --check-prefix=EPS
// RUN: not tessera-opt %s --tessera-optimizer="clip-grad=-1" 2>&1 | FileCheck %s --check-prefix=CLIP
// RUN: not tessera-opt %s --tessera-optimizer="clip-grad=inf" 2>&1 | FileCheck %s --check-prefix=CLIPINF
// RUN: not tessera-opt %s --tessera-optimizer="optimizer=sgd sgd-momentum=1" 2>&1 | FileCheck %s --check-prefix=MOMENTUM

// LR: error: invalid --lr nan (expected a finite value in [0, inf))
// LRINF: error: invalid --lr inf (expected a finite value in [0, inf))
// MINLR: error: invalid --min-lr nan (expected a finite value in [0, inf))
// WD: error: invalid --weight-decay nan (expected a finite value in [0, inf))
// WDNEG: error: invalid --weight-decay -0.1 (expected a finite value in [0, inf))
// BETA1: error: invalid --adam-beta1 -0.5 (expected a finite value in [0, 1))
// BETA: error: invalid --adam-beta2 1 (expected a finite value in [0, 1))
// EPS: error: invalid --adam-eps -1e-08 (expected a finite value in [0, inf))
// CLIP: error: invalid --clip-grad -1 (expected a finite value in [0, inf))
// CLIPINF: error: invalid --clip-grad inf (expected a finite value in [0, inf))
// MOMENTUM: error: invalid --sgd-momentum 1 (expected a finite value in [0, 1))
module {
  func.func @m(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
