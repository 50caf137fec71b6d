//===- Planner.h - Choose a parallel layout from the compiler's numbers -*- C++ -*-===//
//
// tessera-plan: for a GPT model and a cluster, every layout of tp, cp, pp,
// vpp, dp, micro-batch size, activation recompute and the distributed
// optimizer that the compiler accepts, ranked by predicted step time. The
// per-layer numbers come from the compiler itself: a calibration compiles
// the model at its real width at pp 3, one layer on the first and the last
// stage and the rest in the middle, for each (tp, cp, recompute), and reads,
// per stage, the FLOPs of the forward and backward phases
// (CostOpInterface), the saved activations and transient peak of the
// memory plan, the parameters, and the bytes of every collective and
// point-to-point transfer the phases emit. A candidate's
// stages are then sums of layers plus the embedding (first stage) and the
// head (last); the bubble comes from running the verified schedule
// (lib/Schedule) with the stages' times, and the microbatches in flight per
// chunk from the same schedule. The best few candidates are compiled whole
// to report the exact per-rank memory next to the prediction.
//
// The device model is deliberately small (docs/ARCHITECTURE.md, section
// "tessera-plan"): a compute-bound op's time is FLOPs / (peak x
// efficiency(d)), efficiency = max x d / (d + half_size) with d the GEMMs'
// smaller side (h / tp, or the microbatch's tokens s x b / cp), the other
// ops' bytes go at the HBM bandwidth; a collective over n ranks costs
// alpha (n - 1) + bytes x factor / bandwidth, factor 2(n-1)/n for an
// all-reduce and (n-1)/n for an all-gather or reduce-scatter (NCCL's ring),
// with the intra-node bandwidth when the group stays inside a node.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_PLAN_PLANNER_H
#define TESSERA_PLAN_PLANNER_H

#include "tessera/Frontend/GPT.h"
#include "tessera/Pipeline/Pipeline.h"

#include "mlir/IR/BuiltinOps.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::plan {

/// A cluster description (examples/clusters/*.json).
struct Cluster {
  std::string name;
  int64_t gpusPerNode = 8;
  int64_t nodes = 1;
  double memoryBytes = 80e9;
  /// The fraction of memory the plan may fill (CUDA context, NCCL buffers
  /// and fragmentation take the rest).
  double usableMemory = 0.9;
  /// Dense peak, FLOP/s, per dtype ("bf16", "fp32").
  std::map<std::string, double> peakFlops;
  /// Bytes/s: the memory-bound ops and the optimizer's pass.
  double hbmBandwidth = 2e12;
  double intraBandwidth = 150e9, intraLatency = 5e-6; ///< per GPU, bytes/s, s
  double interBandwidth = 25e9, interLatency = 10e-6;
  /// GEMM efficiency: gemmMax x d / (d + gemmHalf), d the GEMMs' smaller
  /// side (hidden / tp, or tokens per microbatch / cp).
  double gemmMax = 0.8, gemmHalf = 256;

  int64_t gpus() const { return gpusPerNode * nodes; }
};

/// Reads a cluster file; the error names the file and the key.
llvm::Expected<Cluster> readCluster(const std::string &path);

/// One layout. `recompute` is "none", "selective" (under sequence
/// parallelism: the all-gathered GEMM inputs gathered again in the backward;
/// otherwise what the attention kernels always do) or "full" (uniform, one
/// layer per group).
struct Layout {
  int64_t tp = 1, cp = 1, pp = 1, vpp = 1, dp = 1, microBatch = 1;
  /// Mixture of experts: the experts over ep ranks and their FFN over etp
  /// (0: the compiler's default, tp, as Megatron's
  /// --expert-tensor-parallel-size); ep x etp divides tp x cp x dp.
  int64_t ep = 1, etp = 0;
  std::string recompute = "none";
  bool distributedOptimizer = false;
  /// ZeRO-2 (--data-parallel-sharding-strategy optim_grads; with the
  /// distributed optimizer): the gradients sharded over dp x cp too.
  bool shardGrads = false;
  /// ZeRO-3 (--data-parallel-sharding-strategy optim_grads_params; with
  /// shardGrads): the parameters sharded too, each phase gathering them.
  bool shardParams = false;
  bool overlapGradReduce = true; ///< --overlap-grad-reduce (with dp > 1)
  /// --overlap-param-gather (with the distributed optimizer and the
  /// overlapped gradient reduction, as Megatron requires).
  bool overlapParamGather = true;
  bool gradReduceBf16 = false;   ///< --grad-reduce-in-bf16
  bool bf16 = true;              ///< --bf16 (mixed precision)
  /// With bf16: activations stored and transferred in bf16, as Megatron's
  /// (--bf16's default; false: --activations-dtype f32).
  bool bf16Activations = true;
  /// --schedule zb-h1 (pp > 1, vpp 1): backwards split into B and W, W
  /// filling the cool-down bubble; a slot held until its W.
  bool zeroBubble = false;
  /// --tp-comm-overlap (with tp > 1, where sequence parallelism is on):
  /// the sequence-parallel all-gathers and reduce-scatters pipelined with
  /// the GEMMs beside them.
  bool tpCommOverlap = true;

  /// Whether the layout overlaps the parameter all-gather (it has one: the
  /// distributed optimizer over more than one rank, with the overlapped
  /// gradient reduction Megatron requires for it; under ZeRO-3, the
  /// prefetch of each bucket under the previous bucket's readers).
  bool paramGatherOverlapped() const {
    return overlapParamGather && distributedOptimizer && dp * cp > 1 &&
           overlapGradReduce;
  }
  /// The tessera-compile flags of this layout.
  std::vector<std::string> flags(int64_t globalBatch) const;
  /// Sets the training pipeline's options to this layout (every parallel,
  /// batch, precision, reduction and recompute option it plans).
  void apply(TrainPipelineOptions &options, int64_t globalBatch) const;
};

struct Prediction {
  Layout layout;
  bool feasible = false;
  std::string reason; ///< why not feasible
  double stepSeconds = 0;
  double tflopsPerGpu = 0;  ///< hardware FLOPs (recompute included) / s / GPU
  double mfu = 0;           ///< model FLOPs (no recompute) / (time x peak)
  double bubbleFraction = 0;
  double exposedCommSeconds = 0; ///< tp, cp and p2p in the stages, dp after
  double memoryBytes = 0;        ///< the fullest rank's predicted arena
  int64_t fullestPpRank = 0;
  /// Filled for the best few: the compiled plan's bytes for that rank.
  double compiledMemoryBytes = 0;
  /// Each virtual stage's forward and backward seconds per microbatch, and
  /// what follows the pipeline (exposed data-parallel reductions, the
  /// optimizer): the search simulates the schedule with every stage at the
  /// slowest one's times, the best layouts again with their own.
  std::vector<double> stageForward, stageBackward;
  /// Under the zero-bubble schedule: each stage's W (stageBackward is B).
  std::vector<double> stageWeight;
  double afterPipelineSeconds = 0;
};

struct PlanOptions {
  /// The model: a GPT by its configuration, or (when set) an nn-level
  /// module (tessera-gen's, an imported ONNX model), which the calibration
  /// compiles whole at pp 3 with one layer on the first and last stage.
  GPTConfig model;
  mlir::ModuleOp module;
  int64_t globalBatch = 0;
  bool bf16 = true;
  /// Restrict the search (0 or empty: search).
  int64_t tp = 0, cp = 0, pp = 0, vpp = 0, microBatch = 0, ep = 0, etp = 0;
  std::string recompute;
  int distributedOptimizer = -1; ///< -1: both
  int shardGrads = -1; ///< ZeRO-2 with the distributed optimizer; -1: both
  /// ZeRO-3 (with ZeRO-2's sharded gradients); -1: both.
  int shardParams = -1;
  /// The zero-bubble schedule ZB-H1 for pipelines without virtual stages
  /// (1: only it, 0: only 1F1B, -1: both).
  int zeroBubble = -1;
  /// How the data-parallel gradients are reduced (Tessera's defaults:
  /// overlapped with the backward, in fp32).
  bool overlapGradReduce = true, gradReduceBf16 = false;
  /// Bytes of an activation element: 2, under bf16 (the default), Megatron's
  /// bf16 activations as --bf16 compiles them (calibrated and verified on
  /// that compile); in fp32, an fp32 compile halved. Or 4: under bf16 the
  /// layouts compile with --activations-dtype f32 (activations, and so the
  /// cp and pipeline transfers, fp32 but for the bf16 copies the GEMMs read
  /// and the sequence-parallel gathers that carry them); in fp32, fp32.
  double activationBytes = 2;
  /// The distributed optimizer's parameter all-gather behind the next
  /// forward (--overlap-param-gather, planned wherever it applies).
  bool overlapParamGather = true;
  /// --tp-comm-overlap, planned wherever tp > 1 (false: plan without it).
  bool tpCommOverlap = true;
  /// Compile the best `verifyTop` candidates whole for their exact memory.
  int64_t verifyTop = 1;
};

struct PlanResult {
  std::vector<Prediction> ranked; ///< feasible first, fastest first
  int64_t candidates = 0, calibrationCompiles = 0;
  std::string compileError; ///< the first calibration that did not compile
  GPTConfig model;          ///< the sizes planned for
  double seconds = 0;
};

llvm::Expected<PlanResult> plan(const Cluster &cluster,
                                const PlanOptions &options);

/// Why `result` has no feasible layout, in words: no layout met the
/// restrictions, none compiled (the compiler's error), or none fits (the
/// usable memory and what the smallest needs).
std::string explainNoLayout(const PlanResult &result, const Cluster &cluster);

/// JSON of `result` (the top `top` feasible layouts, and the count of
/// infeasible ones by reason).
void printPlan(const PlanResult &result, const Cluster &cluster,
               const PlanOptions &options, int64_t top, bool text,
               llvm::raw_ostream &os);

} // namespace tessera::plan

#endif // TESSERA_PLAN_PLANNER_H
