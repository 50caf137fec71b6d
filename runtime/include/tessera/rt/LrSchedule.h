//===- LrSchedule.h - Megatron's learning-rate schedule -----------*- C++ -*-===//
//
// Header-only: the learning rate of 1-based iteration `it`, as Megatron's
// OptimizerParamScheduler computes it: linear warmup to `maxLr` over
// `warmupIters`, then constant, or a linear or cosine decay to `minLr` at
// `decayIters` (and `minLr` after it).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_LRSCHEDULE_H
#define TESSERA_RT_LRSCHEDULE_H

#include <cmath>
#include <cstdint>
#include <string>

namespace tessera::rt {

struct LrSchedule {
  double maxLr = 1e-3, minLr = 0.0;
  int64_t warmupIters = 0, decayIters = 0;
  std::string style = "constant"; ///< "constant", "linear" or "cosine"

  double at(int64_t it) const {
    if (warmupIters > 0 && it <= warmupIters)
      return maxLr * double(it) / double(warmupIters);
    if (style == "constant" || decayIters <= warmupIters)
      return maxLr;
    if (it > decayIters)
      return minLr;
    double ratio = double(it - warmupIters) / double(decayIters - warmupIters);
    double coeff = style == "linear" ? 1.0 - ratio
                                     : 0.5 * (std::cos(M_PI * ratio) + 1.0);
    return minLr + coeff * (maxLr - minLr);
  }
};

} // namespace tessera::rt

#endif // TESSERA_RT_LRSCHEDULE_H
