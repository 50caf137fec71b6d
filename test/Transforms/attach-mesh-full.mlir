// RUN: tessera-opt %s --tessera-attach-mesh="tp=2 cp=2 ep=2 etp=2 dp=2 pp=2 vpp=2" | FileCheck %s
// RUN: not tessera-opt %s --tessera-attach-mesh="tp=2 dp=3 ep=4 etp=1" 2>&1 | FileCheck %s --check-prefix=EDP

// CHECK: dist.mesh @mesh {cp = 2 : i64, dp = 2 : i64, ep = 2 : i64, etp = 2 : i64, pp = 2 : i64, tp = 2 : i64, vpp = 2 : i64}
// EDP: invalid mesh: ep * etp = 4 * 1 = 4 does not divide tp * cp * dp = 2 * 1 * 3 = 6
func.func @m(%x: tensor<4xf32> {nn.input = "features"}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
