// RUN: tessera-opt %s -split-input-file --tessera-mixed-precision -verify-diagnostics
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=params-dtype=fp16 2>&1 | FileCheck %s --check-prefix=DTYPE
// DTYPE: error: unsupported params-dtype 'fp16' (expected bf16 or f16)
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=gemm-dtype=fp16 2>&1 | FileCheck %s --check-prefix=GEMM
// GEMM: error: unsupported gemm-dtype 'fp16' (expected f32 or bf16: bf16 means the GEMMs take the parameters' 16-bit dtype)
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision=gemm-dtype=f16 2>&1 | FileCheck %s --check-prefix=GEMM16
// GEMM16: error: unsupported gemm-dtype 'f16' (expected f32 or bf16
// fp16 gradients accumulate and reduce in f32 only.
// RUN: echo 'module {}' | not tessera-opt --tessera-mixed-precision="params-dtype=f16 grad-reduce-in-fp32=false" 2>&1 | FileCheck %s --check-prefix=F16GRAD
// F16GRAD: error: params-dtype=f16 needs grad-reduce-in-fp32 (fp16 gradients accumulate and reduce in f32)

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
