//===- MoE.h - Mixture-of-experts routing math ------------------*- C++ -*-===//
//
// The per-token routing of Megatron's TopKRouter and the row layout of its
// token permutation, shared by the CPU kernels and (as __host__ __device__)
// by the CUDA backend, so every backend routes every token alike.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_MATH_MOE_H
#define TESSERA_RT_MATH_MOE_H

#include "tessera/rt/math/HostDevice.h"
#include "tessera/rt/math/Kernels.h"

namespace tessera::rt::math {

/// One token's routing (`moe_router_pre_softmax = False`, Megatron's
/// default): the k largest of `experts` logits in descending order, ties to
/// the lower expert index, and the softmax over those k.
TESSERA_HD void moeTopK(const float *logits, int64_t experts, int64_t k,
                        float *probs, int32_t *indices) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i)
        taken = taken || indices[i] == int32_t(e);
      if (!taken && (best < 0 || logits[e] > logits[best]))
        best = e;
    }
    indices[j] = int32_t(best);
    probs[j] = logits[best];
  }
  // Softmax over the chosen logits; probs[0] is their max.
  const float mx = probs[0];
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    probs[j] = expApprox(probs[j] - mx);
    sum += probs[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < k; ++j)
    probs[j] *= inv;
}

/// dlogits of one token from its router probabilities and their gradient:
/// p_j (dp_j - sum_i p_i dp_i) at the chosen experts, 0 elsewhere.
TESSERA_HD void moeTopKGrad(const float *probs, const int32_t *indices,
                            const float *dprobs, int64_t experts, int64_t k,
                            float *dlogits) {
  float dot = 0.0f;
  for (int64_t j = 0; j < k; ++j)
    dot += probs[j] * dprobs[j];
  for (int64_t e = 0; e < experts; ++e)
    dlogits[e] = 0.0f;
  for (int64_t j = 0; j < k; ++j)
    dlogits[indices[j]] = probs[j] * (dprobs[j] - dot);
}

/// The load-balancing loss's scale: coeff * E / (k * T * T)
/// (Megatron's switch_load_balancing_loss_func); T may be all ranks'
/// tokens, sum_e counts_e / k, when ranks split them.
TESSERA_HD float moeAuxScale(float coeff, int64_t experts, int64_t k,
                             double tokens) {
  return float(double(coeff) * double(experts) /
               (double(k) * tokens * tokens));
}

/// Expert capacity's order among one expert's routing choices: whether
/// choice `a` (probability pa) goes before choice `b` (pb). By position the
/// earlier choice first; by probability the more probable first, ties to
/// the earlier choice (a stable sort by descending probability).
TESSERA_HD bool moeCapacityBefore(float pa, int64_t a, float pb, int64_t b,
                                  bool byPosition) {
  return byPosition ? a < b : (pa > pb || (pa == pb && a < b));
}

/// Whether routing choice c of `n` keeps its expert under `capacity`: fewer
/// than `capacity` choices of its expert go before it. A dropped choice
/// (index -1) keeps nothing. O(n): the definition, which the CPU backend
/// evaluates by sorting each expert's choices and the CUDA backend by one
/// radix sort of moeChoiceSortKey.
TESSERA_HD bool moeCapacityKeeps(const float *probs, const int32_t *indices,
                                 int64_t n, int64_t c, int64_t capacity,
                                 bool byPosition) {
  const int32_t e = indices[c];
  if (e < 0)
    return false;
  int64_t before = 0;
  for (int64_t o = 0; o < n; ++o)
    before += indices[o] == e &&
              moeCapacityBefore(probs[o], o, probs[c], c, byPosition);
  return before < capacity;
}

/// The routing choices in expert order by one stable sort (the CUDA
/// backend's row map and expert capacity): a 64-bit key per choice whose
/// ascending order puts each expert's choices together, in
/// moeCapacityBefore's order, when ties keep the choices' order. The
/// expert is the high 32 bits (`experts` for a choice routed nowhere: -1,
/// or an index out of range, so those sort last); by position the low
/// bits are 0 and the stable sort keeps token order; by probability they
/// are the probability's bits mapped so that a larger probability sorts
/// first (the usual order-preserving map of IEEE floats, inverted; -0
/// taken as +0, which compares equal to it). Probabilities are a softmax's,
/// never NaN.
TESSERA_HD uint64_t moeChoiceSortKey(float prob, int32_t expert,
                                     int64_t experts, bool byPosition) {
  const uint64_t high = expert < 0 || expert >= experts ? uint64_t(experts)
                                                        : uint64_t(expert);
  uint32_t low = 0;
  if (!byPosition) {
    const uint32_t bits = floatBits(prob == 0.0f ? 0.0f : prob);
    const uint32_t ascending =
        (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    low = ~ascending;
  }
  return (high << 32) | low;
}

/// The expert of a sorted moeChoiceSortKey (`experts` for none).
TESSERA_HD int64_t moeSortKeyExpert(uint64_t key) { return int64_t(key >> 32); }

/// The bits a radix sort of moeChoiceSortKey over `experts` must look at,
/// from bit `begin` (32 by position: the low bits are 0) to `end` (the
/// high word up to `experts` itself).
TESSERA_HD int moeSortKeyEndBit(int64_t experts) {
  int bits = 1;
  while ((uint64_t(1) << bits) <= uint64_t(experts))
    ++bits;
  return 32 + bits;
}

} // namespace tessera::rt::math

#endif // TESSERA_RT_MATH_MOE_H
