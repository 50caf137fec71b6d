//===- PipelineSchedule.h - Megatron pipeline schedules -----------*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), like the rank groups: which layers each
// pipeline rank and model chunk holds, and the order in which each rank runs
// the forward (F) and backward (B) of every (microbatch, chunk), following
// seed 003 (Megatron's schedules):
//   - none: F0 B0 F1 B1 ... (no pipelining, gradients accumulated);
//   - 1f1b: warmup = min(pp - rank - 1, M) forwards, then one forward one
//     backward in steady state, then the remaining backwards (cooldown);
//   - interleaved: V model chunks per rank, M * V virtual microbatches,
//     warmup = min((pp - rank - 1) * 2 + (V - 1) * pp, M * V); virtual
//     microbatch k runs chunk (k mod (pp V)) / pp (reversed for backwards)
//     on microbatch (k / (pp V)) * pp + k mod pp. M must divide by pp.
// Layers: contiguous blocks without virtual stages; with V chunks, chunk c
// of rank r holds L / (pp V) layers from c * (L / V) + r * (L / (pp V)).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_SCHEDULE_PIPELINESCHEDULE_H
#define TESSERA_SCHEDULE_PIPELINESCHEDULE_H

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::schedule {

enum class Kind { None, OneFOneB, Interleaved };

struct PipelineConfig {
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t microbatches = 1;
  int64_t layers = 1;
  Kind kind = Kind::OneFOneB;
  /// Explicit layers per pipeline rank (uneven split); empty: even.
  std::vector<int64_t> stageLayers;
};

struct LayerPlacement {
  int64_t layer, ppRank, chunk;
};

struct Step {
  bool forward;
  int64_t microbatch, chunk;
};

struct RankSchedule {
  int64_t ppRank;
  int64_t warmup;
  std::vector<Step> order;
};

/// Parses "none", "1f1b" or "interleaved"; false on anything else.
bool parseKind(const std::string &text, Kind &kind);
const char *kindName(Kind kind);

/// Checks the configuration; returns an error naming the sizes or "".
std::string validate(const PipelineConfig &config);

/// Every layer's pipeline rank and chunk, in layer order.
std::vector<LayerPlacement> placeLayers(const PipelineConfig &config);

/// Every pipeline rank's order of forwards and backwards.
std::vector<RankSchedule> buildSchedule(const PipelineConfig &config);

} // namespace tessera::schedule

#endif // TESSERA_SCHEDULE_PIPELINESCHEDULE_H
