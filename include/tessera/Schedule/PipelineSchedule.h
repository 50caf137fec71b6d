//===- PipelineSchedule.h - Megatron pipeline schedules -----------*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), like the rank groups: which layers each
// pipeline rank and model chunk holds, and the order in which each rank runs
// the forward (F) and backward (B) of every (microbatch, chunk), following
// Megatron's schedules (megatron/core/pipeline_parallel/schedules.py,
// chosen by get_forward_backward_func):
//   - none (forward_backward_no_pipelining): F0 B0 F1 B1 ... (gradients
//     accumulated);
//   - 1f1b (forward_backward_pipelining_without_interleaving): warmup =
//     min(pp - rank - 1, M) forwards, then one forward one backward in
//     steady state, then the remaining backwards (cooldown);
//   - interleaved (forward_backward_pipelining_with_interleaving): V model
//     chunks per rank, M * V virtual microbatches,
//     warmup = min((pp - rank - 1) * 2 + (V - 1) * pp, M * V); virtual
//     microbatch k runs chunk (k mod (pp V)) / pp (reversed for backwards)
//     on microbatch (k / (pp V)) * pp + k mod pp. M must divide by pp;
//   - zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; not
//     in Megatron-LM): each backward split into B (input gradient) and W
//     (weight gradients); 1F1B's order of F and B, and on rank r W(i - r)
//     after B(i), the last r W's at the end: bubble (p - 1)(F + B - W);
//   - zbv (the V-shaped zero-bubble schedule, ZB-V of Qi et al.; PyTorch's
//     ScheduleZBVZeroBubble, which torchtitan runs) and dualpipev
//     (DeepSeek-V3's DualPipe folded onto pp ranks, PyTorch's
//     ScheduleDualPipeV): two chunks per rank placed as a V, virtual stage
//     s on rank s for s < pp and on rank 2 pp - 1 - s after, so the last
//     rank hands its chunk 0's output to its own chunk 1 and the first rank
//     holds both the embedding and the loss; B and W apart.
// Layers (Megatron's get_transformer_layer_offset): contiguous blocks
// without virtual stages; with V chunks, chunk c of rank r holds L / (pp V)
// layers from c * (L / V) + r * (L / (pp V)). Megatron's uneven splits
// (resolveSplit: --pipeline-model-parallel-layout,
// --decoder-first/last-pipeline-num-layers,
// --account-for-embedding/loss-in-pipeline-split) give a count per virtual
// stage s = c * pp + r (V-shaped: s as above), the layers numbered in
// that order.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_SCHEDULE_PIPELINESCHEDULE_H
#define TESSERA_SCHEDULE_PIPELINESCHEDULE_H

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::schedule {

enum class Kind { None, OneFOneB, Interleaved, ZbH1, Zbv, DualPipeV };

/// Whether the schedule runs each backward as B (input gradient) and W
/// (weight gradients) separately (tessera-split-backward).
inline bool splitsBackward(Kind kind) {
  return kind == Kind::ZbH1 || kind == Kind::Zbv || kind == Kind::DualPipeV;
}

/// Whether the schedule places its two chunks per rank as a V (virtual
/// stage s on rank s, then back up: PyTorch's stage-to-rank style "v").
inline bool vShaped(Kind kind) {
  return kind == Kind::Zbv || kind == Kind::DualPipeV;
}

/// Whether the schedule runs several chunks per rank (vpp > 1).
inline bool multiChunk(Kind kind) {
  return kind == Kind::Interleaved || vShaped(kind);
}

struct PipelineConfig {
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t microbatches = 1;
  int64_t layers = 1;
  Kind kind = Kind::OneFOneB;
  /// Explicit layers per pipeline rank (uneven split, --pp-layers, at
  /// least one each, no virtual stages); empty: even.
  std::vector<int64_t> stageLayers;
  /// Explicit layers per virtual stage s = chunk * pp + rank (pp * vpp
  /// entries, zero allowed: a stage of the embedding or the loss alone),
  /// from resolveSplit; empty: none.
  std::vector<int64_t> virtualStageLayers;
};

/// Megatron's options for an uneven pipeline split (its flag names).
struct SplitOptions {
  /// --pipeline-model-parallel-layout, e.g. "E|(t|)*3,t|L" (empty: none).
  std::string layout;
  /// --decoder-first-pipeline-num-layers and
  /// --decoder-last-pipeline-num-layers (-1: not given; any other value
  /// below 1 is an error).
  int64_t firstStageLayers = -1, lastStageLayers = -1;
  /// --account-for-embedding-in-pipeline-split and
  /// --account-for-loss-in-pipeline-split.
  bool accountForEmbedding = false, accountForLoss = false;
  bool any() const {
    return !layout.empty() || firstStageLayers != -1 ||
           lastStageLayers != -1 || accountForEmbedding || accountForLoss;
  }
};

/// The stages of a --pipeline-model-parallel-layout string (Megatron's
/// PipelineParallelLayerLayout.parse_str_to_list: ',' ignored, "(...)*n"
/// and "X*n" repeated, '|' between stages; each stage a string of 'E'
/// embedding, 't' transformer layer, 'm' multi-token prediction, 'L' loss),
/// or an error message.
std::string parseLayout(const std::string &text,
                        std::vector<std::string> &stages);

/// The virtual pipeline size a layout gives on `pp` ranks (its stages /
/// pp), or an error message (Megatron's) in `error`.
int64_t layoutVpp(const std::string &layout, int64_t pp, std::string &error);

/// Resolves Megatron's split options for `layers` transformer layers over
/// pp x vpp virtual stages into config.virtualStageLayers (layers per
/// virtual stage); returns "" or the error, in Megatron's words where
/// Megatron has them.
std::string resolveSplit(const SplitOptions &split, PipelineConfig &config);

struct LayerPlacement {
  int64_t layer, ppRank, chunk;
};

/// One computation of a rank's order: a forward (F), a backward (B: the
/// whole backward, or under a schedule that splits it the input gradient
/// alone) or, with `weight`, the weight gradients (W) of (microbatch,
/// chunk).
struct Step {
  bool forward;
  int64_t microbatch, chunk;
  bool weight = false;
};

struct RankSchedule {
  int64_t ppRank;
  int64_t warmup;
  std::vector<Step> order;
};

/// Parses "none", "1f1b", "interleaved", "zb-h1", "zbv" or "dualpipev";
/// false on anything else.
bool parseKind(const std::string &text, Kind &kind);
const char *kindName(Kind kind);

/// Checks the configuration; returns an error naming the sizes or "".
std::string validate(const PipelineConfig &config);

/// The pipeline rank and chunk of virtual stage `stage` (0 <= stage < pp
/// vpp), and back: round robin (rank stage mod pp, chunk stage / pp), or
/// a V under zbv and dualpipev.
int64_t stageRank(const PipelineConfig &config, int64_t stage);
int64_t stageChunk(const PipelineConfig &config, int64_t stage);
int64_t stageOf(const PipelineConfig &config, int64_t rank, int64_t chunk);

/// Every layer's pipeline rank and chunk, in layer order.
std::vector<LayerPlacement> placeLayers(const PipelineConfig &config);

/// Every pipeline rank's order of forwards and backwards.
std::vector<RankSchedule> buildSchedule(const PipelineConfig &config);

/// One executed step of a simulation, in time units.
struct TimedStep {
  int64_t ppRank;
  Step step;
  double start, end;
};

/// The result of running the per-rank orders against their dependencies.
struct Simulation {
  std::vector<TimedStep> steps; ///< in execution order
  double makespan = 0;
  /// Idle time over busy time summed over ranks: Megatron's bubble
  /// fraction, (p - 1) / m for 1F1B, (p - 1) / (v m) interleaved and
  /// (p - 1) / (3 m) for ZB-H1 (F = B = W).
  double bubbleFraction = 0;
  /// Non-empty when the orders deadlock: names a stuck rank and step.
  std::string deadlock;
};

/// Runs `ranks` (e.g. from buildSchedule) symbolically: a forward of
/// (microbatch, virtual stage s) waits for the same forward of stage s - 1
/// (on the previous rank, or on the last rank's previous chunk when the
/// round robin wraps around, or on the same rank at a V's turn), a
/// backward for the same backward of stage s + 1 (the own forward on the
/// last stage), a W for its own B. A
/// forward costs `forwardCost`, a backward `backwardCost` time units; in an
/// order with W steps, B and W cost half a backward each (the zero-bubble
/// paper's F = B = W when a backward is twice a forward).
Simulation simulate(const PipelineConfig &config,
                    const std::vector<RankSchedule> &ranks,
                    double forwardCost = 1.0, double backwardCost = 2.0);

/// The same with each virtual stage's own costs: `forwardCosts[s]` and
/// `backwardCosts[s]` for virtual stage s (stageOf; pp * vpp entries);
/// with W steps, `weightCosts[s]` is W's and `backwardCosts[s]` B's alone
/// (empty `weightCosts`: half of `backwardCosts` each).
Simulation simulate(const PipelineConfig &config,
                    const std::vector<RankSchedule> &ranks,
                    const std::vector<double> &forwardCosts,
                    const std::vector<double> &backwardCosts,
                    const std::vector<double> &weightCosts = {});

} // namespace tessera::schedule

#endif // TESSERA_SCHEDULE_PIPELINESCHEDULE_H
