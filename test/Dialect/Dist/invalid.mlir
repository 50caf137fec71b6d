// RUN: tessera-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{order 'tp-cp-ep-dp-xx' names unknown axis 'xx'}}
dist.mesh @mesh {tp = 2, order = "tp-cp-ep-dp-xx"}

// -----

// expected-error @+1 {{order 'tp-tp-ep-dp-pp' repeats axis 'tp'}}
dist.mesh @mesh {order = "tp-tp-ep-dp-pp"}

// -----

// expected-error @+1 {{order 'tp-dp' must name each of tp, cp, ep, dp and pp exactly once}}
dist.mesh @mesh {order = "tp-dp"}

// -----

// expected-error @+1 {{dp must be at least 1, got 0}}
dist.mesh @mesh {dp = 0}

// -----

func.func @no_mesh(%x: tensor<8xf32>) {
  // expected-error @+1 {{refers to mesh @mesh, which is not a dist.mesh in scope}}
  %0 = dist.all_reduce %x on @mesh "dp" : tensor<8xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bad_group(%x: tensor<8xf32>) {
  // expected-error @+1 {{names an invalid rank group: unknown rank-group axis 'xp' in group kind 'xp'}}
  %0 = dist.all_reduce %x on @mesh "xp" : tensor<8xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bad_reduction(%x: tensor<8xf32>) {
  // expected-error @+1 {{attribute 'reduction' failed to satisfy constraint: reduction: sum or max}}
  %0 = dist.all_reduce %x on @mesh "tp" {reduction = "min"} : tensor<8xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bad_start_reduction(%x: tensor<8xf32>) {
  // expected-error @+1 {{attribute 'reduction' failed to satisfy constraint: reduction: sum or max}}
  %f = dist.all_reduce_start %x on @mesh "tp" {reduction = "prod"} : tensor<8xf32> -> !dist.async<tensor<8xf32>>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bad_gather(%x: tensor<8x4xf32>) {
  // expected-error @+1 {{dim 0 of size 8 becomes 8, expected times the group size 2}}
  %0 = dist.all_gather %x on @mesh "tp" dim 0 : tensor<8x4xf32> -> tensor<8x4xf32>
  return
}

// -----

dist.mesh @mesh {tp = 4}
func.func @bad_scatter(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{dim 1 of size 6 becomes 2, expected divided by the group size 4}}
  %0 = dist.scatter_to_region %x on @mesh "tp" : tensor<8x6xf32> -> tensor<8x2xf32>
  return
}

// -----

dist.mesh @mesh {tp = 2}
func.func @bad_wait(%x: tensor<8xf32>) {
  %f = dist.all_reduce_start %x on @mesh "tp" : tensor<8xf32> -> !dist.async<tensor<8xf32>>
  // expected-error @+1 {{result type 'tensor<4xf32>' differs from the awaited 'tensor<8xf32>'}}
  %r = dist.wait %f : !dist.async<tensor<8xf32>> -> tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{ep * etp = 4 * 1 = 4 does not divide tp * cp * dp = 2 * 1 * 3 = 6 (the expert data-parallel size edp would not be integral)}}
dist.mesh @mesh {tp = 2, dp = 3, ep = 4}

// -----

// expected-error @+1 {{ep * etp = 2 * 2 = 4 does not divide tp * cp * dp = 2 * 1 * 1 = 2}}
dist.mesh @mesh {tp = 2, ep = 2, etp = 2}

// -----

// expected-error @+1 {{order 'tp-pp-cp-ep-dp' gives different pp groups to the dense (tp-cp-dp-pp) and expert (etp-ep-edp-pp) layouts}}
dist.mesh @mesh {tp = 2, pp = 2, ep = 2, order = "tp-pp-cp-ep-dp"}

// -----

// expected-error @+1 {{vpp must be at least 1, got 0}}
dist.mesh @mesh {pp = 2, vpp = 0}

// -----

// expected-error @+1 {{etp must be at least 1, got 0}}
dist.mesh @mesh {etp = 0}

// -----

dist.mesh @mesh {tp = 2, dp = 2, ep = 2}
func.func @mixed(%x: tensor<8xf32>) {
  // expected-error @+1 {{names an invalid rank group: group kind 'tp-ep' mixes dense axes (tp, cp, dp) with expert axes (etp, ep, edp)}}
  %0 = dist.all_reduce %x on @mesh "tp-ep" : tensor<8xf32>
  return
}

// -----

dist.mesh @mesh {dp = 4}

func.func @all_to_all_blocks(%x: tensor<6x8xf32>) -> tensor<6x8xf32> {
  // expected-error @+1 {{'dist.all_to_all' op dim 0 of 'tensor<6x8xf32>' must hold one block per rank of group 'dp' (4 ranks)}}
  %0 = dist.all_to_all %x on @mesh "dp" : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}
