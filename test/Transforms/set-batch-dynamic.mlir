// RUN: tessera-opt %s --tessera-set-batch -verify-diagnostics

// expected-error @+1 {{the model's batch dimension is dynamic: give micro-batch-size}}
func.func @m(%x: tensor<?x8xf32> {nn.input = "features"}) -> tensor<?x8xf32> {
  return %x : tensor<?x8xf32>
}
