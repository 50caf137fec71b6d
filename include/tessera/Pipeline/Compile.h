//===- Compile.h - The tessera-compile driver -------------------*- C++ -*-===//
//
// tessera-compile as a library function: its flags (the training pipeline's
// options plus the tool's own) and what it does with them.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_PIPELINE_COMPILE_H
#define TESSERA_PIPELINE_COMPILE_H

#include "tessera/Pipeline/Pipeline.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/CommandLine.h"

#include <functional>

namespace tessera {

/// The flags of tessera-compile. Constructing it registers them on the
/// process's command line (for llvm::cl::ParseCommandLineOptions): the
/// training pipeline's options, the same objects that
/// `tessera-opt --tessera-train-pipeline="..."` parses, and the flags only
/// the tool has. Construct one, in main.
struct CompileOptions {
  CompileOptions();

  TrainPipelineOptions pipeline{TrainPipelineOptions::CommandLineTag()};

  llvm::cl::opt<std::string> input;
  llvm::cl::opt<std::string> output;
  llvm::cl::opt<int64_t> worldSize;
  llvm::cl::opt<int64_t> microBatches;
  llvm::cl::opt<int64_t> numLayers;
  llvm::cl::opt<std::string> emit;
  llvm::cl::opt<std::string> emitFormat;
  /// --hf-checkpoint DIR: a Hugging Face model directory, in place of the
  /// positional input.
  llvm::cl::opt<std::string> hfCheckpoint;
  /// Hugging Face model directories: the training sequence length.
  llvm::cl::opt<int64_t> seqLength;
  /// ONNX models that return logits: the loss to add ("cross-entropy").
  llvm::cl::opt<std::string> loss;
  /// --plan cluster.json: compile the layout tessera-plan ranks first.
  llvm::cl::opt<std::string> plan;
  /// Chooses the layout for --plan: sets `pipeline`'s parallel options for
  /// `model` on the cluster of `clusterFile` (`worldSize` GPUs when not 0),
  /// searching only the sizes `given` (the command line) leaves open, or
  /// reports an error and fails. Set by the tool (lib/Plan links the
  /// pipeline library, not the other way round).
  std::function<mlir::LogicalResult(mlir::ModuleOp model,
                                    const TrainPipelineOptions &given,
                                    TrainPipelineOptions &pipeline,
                                    llvm::StringRef clusterFile,
                                    int64_t worldSize)>
      planLayout;
};

/// tessera-compile once its flags are parsed: checks them, then writes the
/// artifact (atomically: a temporary file, then rename) or the --emit
/// output. `args` (the command line without the program name) is recorded
/// in the artifact. Returns the process's exit code.
int compile(const CompileOptions &options, llvm::ArrayRef<const char *> args);

/// Appends "(default: VALUE)" to the --help text of every training-pipeline
/// flag that has a default (lr, optimizer, schedule, bucket size, ...). Call
/// once, before parsing the command line.
void describeDefaults(CompileOptions &options);

} // namespace tessera

#endif // TESSERA_PIPELINE_COMPILE_H
