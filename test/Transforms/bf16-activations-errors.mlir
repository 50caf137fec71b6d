// RUN: tessera-opt %s --split-input-file --tessera-bf16-activations -verify-diagnostics

// Not in mixed precision.
// expected-error @+1 {{bf16 activations need bf16 parameters (run tessera-mixed-precision with params-dtype=bf16 first)}}
module {
  func.func @m(%w: tensor<4xf32> {nn.param = "w"}) {
    return
  }
}

// -----

// fp16 parameters.
// expected-error @+1 {{bf16 activations need bf16 parameters}}
module attributes {tessera.mixed_precision = {grads = "f32", params = "f16"}} {
  func.func @m(%w: tensor<4xf16> {nn.param = "w"}) {
    return
  }
}

// -----

// expected-error @+1 {{the module has bf16 activations already}}
module attributes {tessera.mixed_precision = {activations = "bf16", grads = "f32", params = "bf16"}} {
  func.func @m(%w: tensor<4xbf16> {nn.param = "w"}) {
    return
  }
}

// -----

module attributes {tessera.mixed_precision = {grads = "f32", params = "bf16"}} {
  // expected-error @+1 {{is a training phase; tessera-bf16-activations runs on the model, before tessera-autodiff}}
  func.func @microbatch(%w: tensor<4xbf16> {nn.param = "w"}) attributes {tessera.phase = "microbatch"} {
    return
  }
}
