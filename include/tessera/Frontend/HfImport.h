//===- HfImport.h - Hugging Face checkpoints in ------------------*- C++ -*-===//
//
// tessera-compile DIR, DIR a Hugging Face model directory (config.json plus
// model.safetensors or a sharded model.safetensors.index.json): the
// architecture from config.json (GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM) built as
// tessera-gen builds it, and
// the pretrained weights as every parameter's initial value. The weights
// are converted once, here, to Megatron's layouts (per-head or per-group
// fused QKV, GPT-2's Conv1D transposed, stacked gate/up, grouped experts) in one f32 file next to the artifact
// (`<artifact>.weights`), which the artifact names as external data: each
// rank then reads only its own shards' bytes of it (mapped). The inverse
// of tessera-export (tessera/rt/Export.h), as Megatron-Bridge's import is
// of its export.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_FRONTEND_HFIMPORT_H
#define TESSERA_FRONTEND_HFIMPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>

namespace tessera {

struct HfImportOptions {
  /// The training sequence length (Megatron's --seq-length; 0: the
  /// config's max_position_embeddings).
  int64_t seqLength = 0;
  /// Where the converted weights go (the artifact's path + ".weights").
  std::string weightsPath;
};

/// Whether `path` is a directory with a config.json.
bool isHfCheckpoint(llvm::StringRef path);

/// The model of the Hugging Face directory `dir` with its weights as
/// initial values (written to options.weightsPath); null after an error
/// naming the file and the tensor or field.
mlir::OwningOpRef<mlir::ModuleOp>
importHfCheckpoint(mlir::MLIRContext *context, llvm::StringRef dir,
                   const HfImportOptions &options, std::string &error);

} // namespace tessera

#endif // TESSERA_FRONTEND_HFIMPORT_H
