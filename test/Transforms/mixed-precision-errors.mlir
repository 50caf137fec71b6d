// RUN: tessera-opt %s -split-input-file --tessera-mixed-precision -verify-diagnostics
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=params-dtype=fp16 2>&1 | FileCheck %s --check-prefix=DTYPE
// DTYPE: error: unsupported params-dtype 'fp16' (expected bf16)
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=gemm-dtype=fp16 2>&1 | FileCheck %s --check-prefix=GEMM
// GEMM: error: unsupported gemm-dtype 'fp16' (expected f32 or bf16)

// expected-error @+1 {{the module is in mixed precision already}}
module attributes {tessera.mixed_precision = {grads = "f32", params = "bf16"}} {
  func.func @m(%w: tensor<4xbf16> {nn.param = "w"}) {
    return
  }
}

// -----

// expected-error @+1 {{parameter 'w' is 'tensor<4xbf16>'; tessera-mixed-precision expects f32 parameters}}
func.func @m(%w: tensor<4xbf16> {nn.param = "w"}) {
  return
}

// -----

// expected-error @+1 {{is a training phase; tessera-mixed-precision runs on the model, before tessera-autodiff}}
func.func @microbatch(%w: tensor<4xf32> {nn.param = "w"}) attributes {tessera.phase = "microbatch"} {
  return
}
