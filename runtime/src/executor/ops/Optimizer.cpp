//===- Optimizer.cpp - Optimizer and gradient-clipping opcodes ------------===//
//
// Decode and run functions (Ops.h) of the optimizer steps (Adam with
// decoupled weight decay as Megatron's, SGD with and without momentum),
// whose runs (Opcodes.def's Runs) are the elements exempt from weight
// decay, and of clipping by the global norm (Megatron's
// clip_grad_norm_fp32: sums of squares over runs of gradient shards, the
// norm and the coefficient, the scaling).
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <cmath>

namespace tessera::rt::ops {

/// Calls f(begin, end, decays) over the optimizer thunk `t`'s elements in
/// spans: the runs (no weight decay: biases, norm weights) and the spans
/// between them; one span for all of them without runs. Stops at the first
/// error.
template <typename F> static Status forEachDecaySpan(const Thunk &t, F &&f) {
  if (!t.hasRuns || t.runs.empty())
    return f(int64_t(0), t.n, !t.hasRuns || t.runs.empty());
  int64_t at = 0;
  for (auto [b, e] : t.runs) {
    if (b > at)
      TESSERA_RETURN_IF_ERROR(f(at, b, true));
    TESSERA_RETURN_IF_ERROR(f(b, e, false));
    at = e;
  }
  if (at < t.n)
    TESSERA_RETURN_IF_ERROR(f(at, t.n, true));
  return Status();
}

//===----------------------------------------------------------------------===//
// Optimizer steps
//===----------------------------------------------------------------------===//

// [P, G, M, V, iteration]; fattrs [lr, beta1, beta2, eps, weight_decay].
Status decodeAdam(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1, 2, 3}));
  if (d.numel(in, 4) != 1)
    return invalidArgument("iteration operand must be a scalar i64, got ",
                           d.desc(in, 4));
  return Status();
}

Status runAdam(RunContext &x, const Thunk &t) {
  if (x.updatesSkipped())
    return Status();
  // The iteration stays on the device (no read-back per bucket).
  AdamParams hp{float(t.f[0] * x.lrFactor()), t.f[1], t.f[2], t.f[3], t.f[4]};
  const int64_t *iteration = static_cast<const int64_t *>(t.ptr[4]);
  return forEachDecaySpan(t, [&](int64_t b, int64_t e, bool decays) {
    AdamParams span = hp;
    span.weightDecay = decays ? hp.weightDecay : 0.0f;
    return x.backend().adam(f32(t, 0) + b, f32(t, 1) + b, f32(t, 2) + b,
                            f32(t, 3) + b, e - b, iteration, span);
  });
}

// [P, G]; fattrs [lr, weight_decay].
Status decodeSgd(Decoder &d, const fb::Instr &in, Thunk &t) {
  return d.requireSameNumel(in, {0, 1});
}

Status runSgd(RunContext &x, const Thunk &t) {
  if (x.updatesSkipped())
    return Status();
  const float lr = float(t.f[0] * x.lrFactor());
  return forEachDecaySpan(t, [&](int64_t b, int64_t e, bool decays) {
    return x.backend().sgd(f32(t, 0) + b, f32(t, 1) + b, e - b, lr,
                           decays ? t.f[1] : 0.0f);
  });
}

// [P, G, B]; fattrs [lr, weight_decay, momentum].
Status decodeSgdMomentum(Decoder &d, const fb::Instr &in, Thunk &t) {
  return d.requireSameNumel(in, {0, 1, 2});
}

Status runSgdMomentum(RunContext &x, const Thunk &t) {
  if (x.updatesSkipped())
    return Status();
  const float lr = float(t.f[0] * x.lrFactor());
  return forEachDecaySpan(t, [&](int64_t b, int64_t e, bool decays) {
    return x.backend().sgdMomentum(f32(t, 0) + b, f32(t, 1) + b, f32(t, 2) + b,
                                   e - b, lr, decays ? t.f[1] : 0.0f, t.f[2]);
  });
}

//===----------------------------------------------------------------------===//
// Clipping by the global norm
//===----------------------------------------------------------------------===//

// [X, y]: y = the sum of squares of X's runs (all of X without runs).
Status decodeSumSquares(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.type = d.floatType(in, 0);
  if (d.numel(in, 1) != 1)
    return invalidArgument("the sum ", d.desc(in, 1), " must be one element");
  return Status();
}

Status runSumSquares(RunContext &x, const Thunk &t) {
  Backend &be = x.backend();
  const FloatFormat format = floatFormat(t);
  const int64_t size = formatBytes(format);
  const uint8_t *data = static_cast<const uint8_t *>(t.ptr[0]);
  if (!t.hasRuns)
    return be.sumSquares(data, format, t.n, f32(t, 1), false);
  // The runs of this rank's shard; none gives 0.
  if (t.runs.empty())
    return be.fill(f32(t, 1), 0.0f, 1);
  bool first = true;
  for (auto [b, e] : t.runs) {
    TESSERA_RETURN_IF_ERROR(
        be.sumSquares(data + b * size, format, e - b, f32(t, 1), !first));
    first = false;
  }
  return Status();
}

// [sumsq, norm, coeff] scalars; iattrs [unscale]; fattrs [max_norm].
Status decodeClipGradNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.i[0] = Decoder::iattr(in, 0);
  if (t.i[0] != 0 && t.i[0] != 1)
    return invalidArgument("ClipGradNorm's unscale is 0 or 1, got ", t.i[0]);
  for (int i = 0; i < 3; ++i)
    if (d.numel(in, i) != 1)
      return invalidArgument("ClipGradNorm's operands are scalars, got ",
                             d.desc(in, i));
  if (!(t.f[0] >= 0) || !std::isfinite(t.f[0]))
    return invalidArgument("ClipGradNorm needs max_norm >= 0, got ", t.f[0]);
  return Status();
}

Status runClipGradNorm(RunContext &x, const Thunk &t) {
  if (!t.i[0])
    return x.backend().clipGradNorm(f32(t, 0), f32(t, 1), f32(t, 2), t.f[0],
                                    1.0f);
  // fp16: the gradients are of the scaled loss. The norm, the same on
  // every rank (the sums of squares were all-reduced), decides on the host
  // whether the iteration updates (Megatron reads found_inf back too).
  Backend &be = x.backend();
  TESSERA_RETURN_IF_ERROR(be.clipGradNorm(f32(t, 0), f32(t, 1), f32(t, 2),
                                          t.f[0],
                                          float(1.0 / x.lossScale())));
  float norm = 0.0f;
  TESSERA_RETURN_IF_ERROR(be.copyToHost(&norm, f32(t, 1), 4));
  if (!std::isfinite(norm))
    x.skipUpdates();
  return Status();
}

//===----------------------------------------------------------------------===//
// fp16's loss scaling
//===----------------------------------------------------------------------===//

// [Y]; fattrs [value].
Status decodeLossSeed(Decoder &, const fb::Instr &, Thunk &) {
  return Status();
}

Status runLossSeed(RunContext &x, const Thunk &t) {
  return x.backend().fill(f32(t, 0), float(double(t.f[0]) * x.lossScale()),
                          t.n);
}

// [X, s, Y]: Y = s X, s a scalar on the device.
Status decodeScaleBy(Decoder &d, const fb::Instr &in, Thunk &t) {
  if (d.numel(in, 1) != 1)
    return invalidArgument("the scale ", d.desc(in, 1), " must be one element");
  return d.requireSameNumel(in, {0, 2});
}

Status runScaleBy(RunContext &x, const Thunk &t) {
  return x.backend().scaleBy(f32(t, 0), f32(t, 1), f32(t, 2), t.n);
}

} // namespace tessera::rt::ops
