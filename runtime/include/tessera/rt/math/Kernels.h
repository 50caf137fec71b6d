//===- Kernels.h - Per-element and per-row math of the kernels --*- C++ -*-===//
//
// The formulas every backend evaluates, written once for host and device
// (HostDevice.h): the branch-free exp and erf the CPU vectorises, GELU and
// its gradient, the Adam and SGD updates, the layer-norm and cross-entropy
// row formulas, and the attention operand layout. The CPU backend loops over
// these; the CUDA kernels call them per thread, so the two differ only in
// the order of their sums.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_MATH_KERNELS_H
#define TESSERA_RT_MATH_KERNELS_H

#include "tessera/rt/math/HostDevice.h"

#include <cmath>

namespace tessera::rt::math {

/// exp(x) in float, relative error < 1e-7 (Cephes expf polynomial after
/// Cody-Waite reduction x = n ln2 + r); 0 below -87 (and for -inf),
/// saturates above 88.
TESSERA_HD float expApprox(float x) {
  float xc = selectf(x < -87.0f, -87.0f, x);
  xc = selectf(xc > 88.0f, 88.0f, xc);
  // Round to nearest with the 1.5 * 2^23 trick (no libm call).
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float scale = bitsFloat(uint32_t(int32_t(n) + 127) << 23);
  return selectf(x < -87.0f, 0.0f, p * scale);
}

/// erf(x) in float with absolute error < 1e-7 (about 1.5 ulp near 1):
/// erf(x) = x P(x^2) for |x| < 1 and 1 - exp(-x^2) Q(|x|) for 1 <= |x| < 4
/// (erf rounds to +-1 beyond), P and Q Chebyshev interpolants of
/// erf(x)/x and erfc(x) exp(x^2) of degree 7 and 10. Both branches are
/// computed and selected so that the function vectorises.
TESSERA_HD float erfApprox(float x) {
  float ax = bitsFloat(floatBits(x) & 0x7fffffffu);
  bool isSmall = ax < 1.0f;
  // |x| < 1: t = 2 x^2 - 1 in [-1, 1].
  float u = selectf(isSmall, ax * ax, 1.0f);
  float t = 2.0f * u - 1.0f;
  float p = -7.552378571878e-08f;
  p = p * t + 1.231639597770e-06f;
  p = p * t - 1.753691418080e-05f;
  p = p * t + 2.175119906209e-04f;
  p = p * t - 2.285485612212e-03f;
  p = p * t + 1.985249772246e-02f;
  p = p * t - 1.405360890211e-01f;
  p = p * t + 9.654687386376e-01f;
  float small = ax * p;
  // 1 <= |x| < 4: s = (2 |x| - 5) / 3 in [-1, 1].
  float xc = selectf(isSmall, 1.0f, selectf(ax > 4.0f, 4.0f, ax));
  float s = (2.0f * xc - 5.0f) * (1.0f / 3.0f);
  float q = 9.294974299017e-05f;
  q = q * s - 2.451864515133e-04f;
  q = q * s + 3.764772747247e-04f;
  q = q * s - 9.162726026454e-04f;
  q = q * s + 2.418384229153e-03f;
  q = q * s - 5.611233636598e-03f;
  q = q * s + 1.248669963631e-02f;
  q = q * s - 2.699793741844e-02f;
  q = q * s + 5.611062799449e-02f;
  q = q * s - 1.115213905431e-01f;
  q = q * s + 2.108063640611e-01f;
  float large = 1.0f - expApprox(-xc * xc) * q;
  float r = selectf(isSmall, small, selectf(ax >= 4.0f, 1.0f, large));
  // erf is odd: give r the sign of x.
  return bitsFloat(floatBits(r) | (floatBits(x) & 0x80000000u));
}

/// GELU (exact form, Megatron's default): 0.5 x (1 + erf(x / sqrt 2)).
TESSERA_HD float gelu(float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  return 0.5f * x * (1.0f + erfApprox(x * kInvSqrt2));
}

/// dGELU/dx * dy = dy (Phi(x) + x phi(x)).
TESSERA_HD float geluGrad(float x, float dy) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  float cdf = 0.5f * (1.0f + erfApprox(x * kInvSqrt2));
  float pdf = kInvSqrt2Pi * expApprox(-0.5f * x * x);
  return dy * (cdf + x * pdf);
}

/// tanh(u) = sign(u) (1 - 2 / (exp(2 |u|) + 1)), absolute error ~1e-7
/// (exactly 1 beyond |u| = 10, where float tanh is 1).
TESSERA_HD float tanhApprox(float u) {
  float au = bitsFloat(floatBits(u) & 0x7fffffffu);
  au = selectf(au > 10.0f, 10.0f, au);
  float r = 1.0f - 2.0f / (expApprox(2.0f * au) + 1.0f);
  return bitsFloat(floatBits(r) | (floatBits(u) & 0x80000000u));
}

/// GELU, tanh approximation (PyTorch's approximate='tanh', GPT-2's
/// gelu_new): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
TESSERA_HD float geluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  float t = tanhApprox(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.0f + t);
}

/// dy * d/dx of geluTanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi)
/// (1 + 3 * 0.044715 x^2).
TESSERA_HD float geluTanhGrad(float x, float dy) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  float t = tanhApprox(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  float dinner = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner);
}

/// ReLU's gradient: dy where x > 0, else 0 (also for NaN x).
TESSERA_HD float reluGrad(float x, float dy) { return selectf(x > 0.0f, dy, 0.0f); }

/// The logistic sigmoid 1 / (1 + exp(-x)) with expApprox (0 below x = -88
/// where exp saturates, 1 above 87).
TESSERA_HD float sigmoidApprox(float x) { return 1.0f / (1.0f + expApprox(-x)); }

/// SwiGLU (Megatron's swiglu, Hugging Face's LlamaMLP): silu(g) * u with
/// silu(g) = g * sigmoid(g).
TESSERA_HD float swiglu(float g, float u) { return g * sigmoidApprox(g) * u; }

/// SwiGLU's gradients for the result gradient dy: dg = dy u silu'(g), with
/// silu'(g) = s (1 + g (1 - s)) for s = sigmoid(g), and du = dy silu(g).
TESSERA_HD void swigluGrad(float g, float u, float dy, float &dg, float &du) {
  float s = sigmoidApprox(g);
  dg = dy * u * (s * (1.0f + g * (1.0f - s)));
  du = dy * (g * s);
}

//===----------------------------------------------------------------------===//
// Optimizers (Megatron's Adam is torch.optim.AdamW / apex FusedAdam with
// adam_w_mode: bias correction and decoupled weight decay).
//===----------------------------------------------------------------------===//

/// 1 / (1 - beta^step), the bias correction of Adam step `step` (1-based),
/// computed in double and rounded once.
TESSERA_HD float adamBiasCorrection(float beta, int64_t step) {
  return float(1.0 / (1.0 - pow(double(beta), double(step))));
}

/// One AdamW element update: m and v move towards g, p steps by
/// lr * (mhat / (sqrt(vhat) + eps) + wd * p) with mhat = m * c1 and
/// vhat = v * c2 (c1, c2 from adamBiasCorrection).
TESSERA_HD void adamUpdate(float &p, float g, float &m, float &v, float beta1,
                           float beta2, float c1, float c2, float lr, float eps,
                           float weightDecay) {
  float mi = beta1 * m + (1.0f - beta1) * g;
  float vi = beta2 * v + (1.0f - beta2) * g * g;
  m = mi;
  v = vi;
  float mhat = mi * c1;
  float vhat = vi * c2;
  p -= lr * (mhat / (sqrtf(vhat) + eps) + weightDecay * p);
}

/// The gradient-clipping coefficient of Megatron's clip_grad_norm_fp32 (and
/// torch.nn.utils.clip_grad_norm_): max_norm / (norm + 1e-6), at most 1;
/// 1 when max_norm is 0 (clipping off). A NaN norm gives 1: the gradients
/// stay as they are, and the run stops on the norm.
TESSERA_HD float clipCoefficient(float norm, float maxNorm) {
  if (!(maxNorm > 0.0f))
    return 1.0f;
  float c = maxNorm / (norm + 1.0e-6f);
  return c < 1.0f ? c : 1.0f;
}

/// One SGD element update with weight decay added to the gradient
/// (torch.optim.SGD's).
TESSERA_HD void sgdUpdate(float &p, float g, float lr, float weightDecay) {
  p -= lr * (g + weightDecay * p);
}

/// One SGD-with-momentum element update (torch.optim.SGD, dampening 0, not
/// Nesterov): d = g + wd * p, b = momentum * b + d, p -= lr * b. b starts
/// at zero, so the first step's b is d, as torch's clone of d.
TESSERA_HD void sgdMomentumUpdate(float &p, float g, float &b, float lr,
                                  float weightDecay, float momentum) {
  float d = g + weightDecay * p;
  float bi = momentum * b + d;
  b = bi;
  p -= lr * bi;
}

//===----------------------------------------------------------------------===//
// Layer norm (Megatron's FusedLayerNorm: biased variance, eps inside the
// square root) and its gradient, given a row's statistics.
//===----------------------------------------------------------------------===//

/// 1 / sqrt(var + eps) of a row whose squared deviations from its mean sum
/// to `sumSq` over `cols` elements.
TESSERA_HD float layerNormRstd(float sumSq, int64_t cols, float eps) {
  return 1.0f / sqrtf(sumSq / float(cols) + eps);
}

/// y = (x - mean) * rstd * gamma + beta.
TESSERA_HD float layerNormOut(float x, float mean, float rstd, float gamma,
                              float beta) {
  return (x - mean) * rstd * gamma + beta;
}

/// dx = rstd * (dy * gamma - mean(dy * gamma) - xhat * mean(dy * gamma *
/// xhat)), with the two row means `meanG` and `meanGX` over the row.
TESSERA_HD float layerNormGradX(float xhat, float dy, float gamma, float rstd,
                                float meanG, float meanGX) {
  return rstd * (dy * gamma - meanG - xhat * meanGX);
}

//===----------------------------------------------------------------------===//
// Rotary position embeddings (Megatron's RotaryEmbedding and
// apply_rotary_pos_emb, non-interleaved: Hugging Face's rotate_half), in
// f32 as Megatron computes them.
//===----------------------------------------------------------------------===//

/// The angle of feature pair i (features i and i + rotDim / 2) at sequence
/// position `pos`: pos * base^(-2i / rotDim), the product in f32 as
/// Megatron's (an angle of thousands of radians carries the f32 product's
/// rounding, the same on every backend). The inverse frequency is the f32
/// nearest to the exact one (computed in double), so backends whose powf
/// differ by an ulp still agree: an ulp of it moves the angle at position
/// 4096 by ~2e-4 radians.
///
/// A scaling factor (not 0) applies Llama 3.1's frequency scaling
/// (Megatron's apply_rope_scaling, Hugging Face's
/// _compute_llama3_parameters: low/high frequency factors 1 and 4 over an
/// original context of 8192): wavelengths past 8192 divide the frequency by
/// the factor, those under 2048 keep it, and the band between interpolates.
TESSERA_HD float ropeAngle(int64_t pos, int64_t i, int64_t rotDim, float base,
                           float scalingFactor = 0.0f) {
  double invFreq = 1.0 / pow(double(base), double(2 * i) / double(rotDim));
  if (scalingFactor != 0.0f) {
    const double pi = 3.14159265358979323846, old = 8192.0, low = 1.0,
                 high = 4.0, factor = double(scalingFactor);
    const double wavelen = 2.0 * pi / invFreq;
    if (wavelen > old / low) {
      invFreq /= factor;
    } else if (!(wavelen < old / high)) {
      const double smooth = (old / wavelen - low) / (high - low);
      invFreq = (1.0 - smooth) * invFreq / factor + smooth * invFreq;
    }
  }
  return float(pos) * float(invFreq);
}

/// Rotates the pair (x1, x2) by the angle with cosine c and sine s (s
/// negated for the inverse): y1 = x1 c - x2 s, y2 = x2 c + x1 s.
TESSERA_HD void ropeRotate(float x1, float x2, float c, float s, float &y1,
                           float &y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

//===----------------------------------------------------------------------===//
// Cross-entropy (Megatron's vocab_parallel_cross_entropy: a row's loss from
// the global max M, the sum of exp(z - M) and the label's logit).
//===----------------------------------------------------------------------===//

/// L = log(sum exp(z - M)) + M - z[label].
TESSERA_HD float crossEntropyLoss(float sumExp, float rowMax,
                                  float labelLogit) {
  return logf(sumExp) + rowMax - labelLogit;
}

/// dz[j] = dL * (exp(z[j] - M) / sumExp - [j == label]).
TESSERA_HD float crossEntropyGrad(float z, float rowMax, float scale,
                                  bool isLabel, float dl) {
  return expApprox(z - rowMax) * scale - (isLabel ? dl : 0.0f);
}

/// Whether `label` is a valid class or the ignored index.
TESSERA_HD bool labelInRange(int64_t label, int64_t numClasses,
                             int64_t ignoreIndex) {
  return label == ignoreIndex || (label >= 0 && label < numClasses);
}

/// The column of global class `id` in a shard holding [offset, offset +
/// cols), or -1 when another shard holds it (vocabulary-parallel embedding
/// and loss, Megatron's VocabParallelEmbedding masks).
TESSERA_HD int64_t shardColumn(int64_t id, int64_t offset, int64_t cols) {
  int64_t local = id - offset;
  return local >= 0 && local < cols ? local : -1;
}

//===----------------------------------------------------------------------===//
// Attention operand layout. QKV is [seq, batch, heads * 3 * headDim] with
// feature h * 3 * D + {0 q, 1 k, 2 v} * D + d (Megatron's
// mixed_x_layer before the split); the output is [seq, batch, heads * D].
//===----------------------------------------------------------------------===//

/// Offset of element d of part `part` (0 q, 1 k, 2 v) of head `head` of
/// batch column `b` at position `s`.
TESSERA_HD int64_t qkvOffset(int64_t s, int64_t b, int64_t head, int64_t part,
                             int64_t d, int64_t batch, int64_t heads,
                             int64_t headDim) {
  return ((s * batch + b) * heads + head) * 3 * headDim + part * headDim + d;
}

/// Offset of element d of head `head` of batch column `b` at position `s`
/// of the attention output.
TESSERA_HD int64_t attentionOutOffset(int64_t s, int64_t b, int64_t head,
                                      int64_t d, int64_t batch, int64_t heads,
                                      int64_t headDim) {
  return ((s * batch + b) * heads + head) * headDim + d;
}

} // namespace tessera::rt::math

#endif // TESSERA_RT_MATH_KERNELS_H
