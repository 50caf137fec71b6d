//===- Reports.h - tessera-compile --emit explanations ------------*- C++ -*-===//
//
// The machine-readable (JSON) and human-readable (text) explanations that
// tessera-compile prints with --emit=...: what the compiler derived from a
// configuration, without running anything.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_PIPELINE_REPORTS_H
#define TESSERA_PIPELINE_REPORTS_H

#include "tessera/Mesh/RankGroups.h"
#include "tessera/Schedule/PipelineSchedule.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>
#include <vector>

namespace tessera {

/// --emit=rank-groups: every standard group kind of `mesh` and each rank's
/// index in it. `format` is "json" or "text". The mesh must be valid.
void printRankGroups(const mesh::MeshConfig &mesh, llvm::StringRef format,
                     llvm::raw_ostream &os);

/// --emit=memory: per rank, the bytes of the static memory plan of an
/// rt-level module by kind (parameters, gradients, optimizer state, inputs,
/// peak activations). Fails on a module that is not lowered to rt.
/// --emit=buckets: every pipeline rank's param-and-grad buffers (Megatron's
/// _ParamAndGradBuffer): parameters and buckets with their ranges and, with
/// the distributed optimizer, every dp rank's shard ranges (gbuf_world,
/// gbuf_world_in_bucket, gbuf_local, param), as JSON (or a text summary).
mlir::LogicalResult printBuckets(mlir::ModuleOp module, llvm::StringRef format,
                                 llvm::raw_ostream &os);

mlir::LogicalResult printMemory(mlir::ModuleOp module, llvm::StringRef format,
                                llvm::raw_ostream &os);

/// One pipeline rank's static memory plan by kind (the rows of
/// --emit=memory: "params", ..., "peak_activations", "total") and the
/// microbatches each chunk has in flight.
struct ProgramMemory {
  int64_t ppRank = 0;
  std::map<std::string, int64_t> bytes;
  std::map<int64_t, int64_t> inFlight;
};

/// The memory plan of every program of an rt-level module.
mlir::FailureOr<std::vector<ProgramMemory>> programMemory(mlir::ModuleOp module);

/// --emit=schedule: every layer's pipeline rank and chunk and every rank's
/// order of forwards and backwards. The configuration must be valid.
void printSchedule(const schedule::PipelineConfig &config,
                   llvm::StringRef format, llvm::raw_ostream &os);

} // namespace tessera

#endif // TESSERA_PIPELINE_REPORTS_H
