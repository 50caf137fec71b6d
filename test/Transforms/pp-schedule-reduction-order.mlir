// RUN: tessera-opt %s --tessera-pp-schedule="schedule=interleaved" -verify-diagnostics

// A last-microbatch variant that starts reducing a bucket must run after
// every other chunk's last phase adding to one of the bucket's gradients
// (the tied embedding on a V's first rank, whose bucket is chunk 0's, which
// the V schedules run last). Here chunk 1's variant reduces "w", which
// chunk 0 also adds to, and the interleaved order runs chunk 0's last
// backward after it: the reduction would miss chunk 0's share.
module attributes {tessera.batch = {global_batch_size = 2 : i64, micro_batch_size = 1 : i64, num_microbatches = 2 : i64}} {
  dist.mesh @mesh {pp = 2, vpp = 2, dp = 2}
  module @pp0 attributes {dist.pp_rank = 0 : i64} {
    dist.grad_buffer @gbuf_c1 {param_dtype = "f32", grad_dtype = "f32", dp = 2 : i64,
        distributed = false, numel = 64 : i64, numel_unpadded = 64 : i64,
        params = [{name = "w", start = 0 : i64, end = 64 : i64, bucket = 0 : i64}],
        buckets = [array<i64: 0, 64, 64>]}
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @backward_c0() -> (tensor<64xf32> {tessera.grad_of = "w"}) attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<64xf32>
      return %g : tensor<64xf32>
    }
    func.func @backward_c1() -> (tensor<64xf32> {tessera.grad_of = "w"}) attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      %g = nn.fill 1.0 : tensor<64xf32>
      return %g : tensor<64xf32>
    }
    // expected-error @+1 {{pipeline rank 0: schedule 'interleaved' runs the last microbatch of chunk 0, which adds to the gradient of 'w', after 'backward_c1:last' starts reducing it}}
    func.func @"backward_c1:last"() -> (tensor<64xf32> {tessera.grad_of = "w"}) attributes {dist.chunk = 1 : i64, tessera.phase = "backward", tessera.last_microbatch} {
      %g = nn.fill 1.0 : tensor<64xf32>
      dist.bucket_reduce_start @gbuf_c1 bucket 0 over @mesh "dp" scale 5.000000e-01(%g) {kind = "all_reduce"} : tensor<64xf32>
      dist.bucket_reduce_wait @gbuf_c1 bucket 0
      return %g : tensor<64xf32>
    }
  }
  module @pp1 attributes {dist.pp_rank = 1 : i64} {
    func.func @forward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @forward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "forward"} {
      return
    }
    func.func @backward_c0() attributes {dist.chunk = 0 : i64, tessera.phase = "backward"} {
      return
    }
    func.func @backward_c1() attributes {dist.chunk = 1 : i64, tessera.phase = "backward"} {
      return
    }
  }
}
