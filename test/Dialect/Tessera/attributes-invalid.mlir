// RUN: tessera-opt %s -split-input-file -verify-diagnostics
// The tessera dialect (no ops) verifies the tessera.* attributes: phases,
// bindings of phase arguments and results, and the root module's settings.

// expected-error @+1 {{attribute 'tessera.phase' must be "microbatch", "step", "init", "forward", "backward", "backward_w" or "eval", got "train"}}
func.func @phase() attributes {tessera.phase = "train"} {
  return
}

// -----

// expected-error @+1 {{attribute 'tessera.last_microbatch' must be a unit attribute, got 1 : i64}}
func.func @last() attributes {tessera.phase = "microbatch", tessera.last_microbatch = 1} {
  return
}

// -----

// expected-error @+1 {{result #0 attribute 'tessera.buffer' must be a non-empty string, got 0 : i64}}
func.func @buffer() -> (tensor<f32> {tessera.buffer = 0}) attributes {tessera.phase = "step"} {
  %0 = nn.fill 0.0 : tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error @+1 {{argument #0 has 'tessera.grad_of', an attribute of a function result}}
func.func @grad_of(%g: tensor<4xf32> {tessera.grad_of = "w"}) attributes {tessera.phase = "step"} {
  return
}

// -----

// expected-error @+1 {{argument #0 attribute 'tessera.stash' must be a non-negative integer, got "a"}}
func.func @stash(%s: tensor<4xf32> {tessera.stash = "a"}) attributes {tessera.phase = "backward"} {
  return
}

// -----

// expected-error @+1 {{result #0 attribute 'tessera.grad_shard' must be {buffer = a symbol reference, bucket = a non-negative integer}, got {bucket = 0 : i64, buffer = "gbuf"}}}
func.func @grad_shard(%g: tensor<4xf32>) -> (tensor<4xf32> {tessera.grad_shard = {buffer = "gbuf", bucket = 0}}) attributes {tessera.phase = "step"} {
  return %g : tensor<4xf32>
}

// -----

// expected-error @+1 {{attribute 'tessera.batch' must be {micro_batch_size = a positive integer, global_batch_size = a positive integer, num_microbatches = a positive integer}, got {global_batch_size = 8 : i64, micro_batch_size = 0 : i64, num_microbatches = 2 : i64}}}
module attributes {tessera.batch = {micro_batch_size = 0, global_batch_size = 8, num_microbatches = 2}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.optimizer' must be {kind = "sgd" or "adam", lr = a float, beta1 = a float, beta2 = a float, eps = a float, weight_decay = a float, clip_grad? = a float, momentum? = a float, lr_warmup_iters? = a non-negative integer, lr_decay_iters? = a non-negative integer, lr_decay_style? = "constant", "linear" or "cosine", min_lr? = a float, loss_scale? = a float, initial_loss_scale? = a float, min_loss_scale? = a float, loss_scale_window? = a positive integer, hysteresis? = a positive integer}, got {beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, kind = "lamb", lr = 1.000000e-03 : f32, weight_decay = 0.000000e+00 : f32}}}
module attributes {tessera.optimizer = {kind = "lamb", lr = 1.0e-3 : f32, beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-8 : f32, weight_decay = 0.0 : f32}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.mixed_precision' must be {params = "f32", "bf16" or "f16", grads = "f32", "bf16" or "f16", activations? = "f32", "bf16" or "f16"}, got {grads = "fp8", params = "bf16"}}}
module attributes {tessera.mixed_precision = {params = "bf16", grads = "fp8"}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.vocab' must be {size = a positive integer, padded = a positive integer, masked? = a unit attribute}, got {size = 257 : i64}}}
module attributes {tessera.vocab = {size = 257}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.weights' must be a dictionary from parameter names to f32 elements or {dir = <directory>, file = <path relative to it>, offset = <bytes>, shape = <the data's shape>}; the value of 'w' is not f32, got {w = dense<1> : tensor<2xi32>}}}
module attributes {tessera.weights = {w = dense<1> : tensor<2xi32>}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.weights' must be a dictionary from parameter names to f32 elements or {dir = <directory>, file = <path relative to it>, offset = <bytes>, shape = <the data's shape>}; the entry of 'w' must be {dir = a string, file = a string, offset = a non-negative integer, shape = an array<i64: ...>}, got {w = {file = "/w.bin"}}}}
module attributes {tessera.weights = {w = {file = "/w.bin"}}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.weights' must be a dictionary from parameter names to f32 elements or {dir = <directory>, file = <path relative to it>, offset = <bytes>, shape = <the data's shape>}; the entry of 'w' must be {dir = a string, file = a string, offset = a non-negative integer, shape = an array<i64: ...>}, got {w = {dir = "/d", file = "w.bin", offset = -4 : i64, shape = array<i64: 2>}}}}
module attributes {tessera.weights = {w = {dir = "/d", file = "w.bin", offset = -4, shape = array<i64: 2>}}} {
}

// -----

// A long value is shortened: a model's weights would fill pages.
// expected-error @+1 {{the value of 'b' is not f32, got {a = dense<[1.000000e+00, 2.000000e+00, 3.000000e+00, 4.000000e+00, 5.000000e+00, 6.000000e+00, 7.000000e+00, 8.000000e+00]> : tensor<8xf32>, b = dense<[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, ... (242 characters)}}
module attributes {tessera.weights = {a = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]> : tensor<8xf32>, b = dense<[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]> : tensor<20xi32>}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.compile_flags' must be a string, got ["--tp", "2"]}}
module attributes {tessera.compile_flags = ["--tp", "2"]} {
}

// -----

// expected-error @+1 {{attribute 'tessera.model' must be a string, got 1 : i64}}
module attributes {tessera.model = 1} {
}

// -----

// expected-error @+1 {{has 'tessera.batch', an attribute of a builtin.module}}
func.func @batch_on_function() attributes {tessera.batch = {micro_batch_size = 1, global_batch_size = 1, num_microbatches = 1}} {
  return
}

// -----

// expected-error @+1 {{has an unknown attribute 'tessera.phases'}}
func.func @unknown() attributes {tessera.phases = "step"} {
  return
}

// -----

// expected-error @+1 {{attribute 'tessera.architecture' must be a dictionary of integers, floats, bools and strings (Megatron-LM's argument names); 'layers' is not one, got {layers = [2]}}}
module attributes {tessera.architecture = {layers = [2]}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.architecture' must be a dictionary of integers, floats, bools and strings (Megatron-LM's argument names), got "llama"}}
module attributes {tessera.architecture = "llama"} {
}

// -----

// expected-error @+1 {{attribute 'tessera.onnx_source' must be {model = <the .onnx file>, parameters = [{param, kind, shape, sources = [{initializer, shape, readers}], ...}]}; 'model' is not a string}}
module attributes {tessera.onnx_source = {model = 3, parameters = []}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.onnx_source' must be {model = <the .onnx file>, parameters = [{param, kind, shape, sources = [{initializer, shape, readers}], ...}]}; 'parameters' is not an array}}
module attributes {tessera.onnx_source = {model = "m.onnx"}} {
}

// -----

// expected-error @+1 {{attribute 'tessera.onnx_source' must be {model = <the .onnx file>, parameters = [{param, kind, shape, sources = [{initializer, shape, readers}], ...}]}; a parameter entry lacks param, kind, shape or sources}}
module attributes {tessera.onnx_source = {model = "m.onnx", parameters = [{param = "w", kind = "identity"}]}} {
}
