//===- GradScaler.h - fp16's loss scale -------------------------*- C++ -*-===//
//
// Megatron-LM's grad scalers (megatron/core/optimizer/grad_scaler.py), run
// by the launcher under --fp16: the backward is seeded with the loss times
// scale() (LossSeed), the step unscales the gradients by it and skips its
// updates when any of them is inf or NaN (ClipGradNorm's found_inf), and
// update() then moves the scale:
//   - ConstantGradScaler (--loss-scale S): the scale stays S;
//   - DynamicGradScaler: starts at --initial-loss-scale; an iteration with
//     inf or NaN gradients resets the growth count and takes one from the
//     hysteresis count, and when that reaches 0 the scale halves (not below
//     --min-loss-scale, and again on every later overflow until a growth);
//     --loss-scale-window clean iterations in a row double the scale and
//     restore the hysteresis count (--hysteresis).
// The state (scale, growth and hysteresis counts: DynamicGradScaler's
// state_dict) goes into checkpoints, so that a resumed run scales as the
// uninterrupted one.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_GRADSCALER_H
#define TESSERA_RT_GRADSCALER_H

#include <algorithm>
#include <cstdint>

namespace tessera::rt {

/// The scaler's settings (the artifact's Optimizer fields).
struct GradScalerConfig {
  double constantScale = 0.0; ///< --loss-scale; 0: dynamic
  double initialScale = 4294967296.0;
  double minScale = 1.0;
  int64_t window = 1000;
  int64_t hysteresis = 2;
};

/// The scaler's state between iterations (DynamicGradScaler's state_dict).
struct GradScalerState {
  double scale = 1.0;
  int64_t growthTracker = 0;
  int64_t hysteresisTracker = 0;
};

class GradScaler {
public:
  explicit GradScaler(const GradScalerConfig &config) : config(config) {
    state.scale = config.constantScale > 0 ? config.constantScale
                                           : config.initialScale;
    state.hysteresisTracker = config.hysteresis;
  }

  double scale() const { return state.scale; }
  bool dynamic() const { return config.constantScale <= 0; }
  const GradScalerState &saved() const { return state; }
  void restore(const GradScalerState &s) { state = s; }

  /// After an iteration: `foundInf` when its gradients held an inf or NaN
  /// (its updates were skipped).
  void update(bool foundInf) {
    if (!dynamic())
      return;
    if (foundInf) {
      state.growthTracker = 0;
      state.hysteresisTracker -= 1;
      if (state.hysteresisTracker <= 0)
        state.scale = std::max(state.scale * 0.5, config.minScale);
      return;
    }
    state.growthTracker += 1;
    if (state.growthTracker == config.window) {
      state.growthTracker = 0;
      state.hysteresisTracker = config.hysteresis;
      state.scale *= 2.0;
    }
  }

private:
  GradScalerConfig config;
  GradScalerState state;
};

} // namespace tessera::rt

#endif // TESSERA_RT_GRADSCALER_H
