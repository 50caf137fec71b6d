//===- Preprocess.h - tessera-preprocess driver -----------------*- C++ -*-===//
//
// The logic behind the `tessera-preprocess` tool:
//
//   tessera-preprocess --input FILE.txt --output-prefix PREFIX
//                      [--tokenizer byte] [--append-eod]
//                      [--documents lines|paragraphs|file]
//
// turns a text file into the Megatron-LM mmap indexed dataset
// PREFIX_text_document.bin / PREFIX_text_document.idx (the names Megatron's
// tools/preprocess_data.py gives the "text" key at document level), one
// indexed sequence per document (see IndexedDataset.h for the format).
//
// Byte tokenizer: token = byte value 0..255 of the file's bytes (UTF-8 text
// becomes its UTF-8 bytes), EOD = 256, vocabulary size 257, stored as
// uint16 (Megatron's DType.optimal_dtype for a vocabulary below 65500).
//
// Documents:
//   paragraphs (default)  runs of lines separated by blank (empty or
//                         whitespace-only) lines; a paragraph's lines are
//                         joined with "\n" (no trailing newline)
//   lines                 every non-blank line (without its "\n")
//   file                  the whole file as one document
// Blank documents are skipped. A line's "\r" before its "\n" is not part
// of a lines-mode document; paragraphs and files keep their bytes as they
// are (only the final line end of a paragraph is dropped). With
// --append-eod every document ends with the EOD token (like Megatron's
// --append-eod); without it documents run into each other in the token
// stream.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_PREPROCESS_H
#define TESSERA_RT_PREPROCESS_H

#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/Status.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::rt {

enum class DocumentMode { Lines, Paragraphs, File };

/// The byte-level tokenizer.
struct ByteTokenizer {
  static constexpr int64_t kEod = 256;
  static constexpr int64_t kVocabSize = 257;
  static std::vector<int64_t> tokenize(std::string_view text);
};

/// Parsed command line of tessera-preprocess.
struct PreprocessOptions {
  std::string input;
  std::string outputPrefix;
  std::string tokenizer = "byte";
  bool appendEod = false;
  DocumentMode documents = DocumentMode::Paragraphs;
  bool help = false;
};

/// Parses argv[1..argc). Errors are usage errors.
StatusOr<PreprocessOptions> parsePreprocessOptions(int argc, char **argv);

/// The usage text.
std::string preprocessUsage(const char *argv0);

/// Splits `text` into documents (views into `text`) per `mode`.
std::vector<std::string_view> splitDocuments(std::string_view text,
                                             DocumentMode mode);

/// What preprocessText wrote.
struct PreprocessResult {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t vocabSize = 0;
  TokenDType dtype = TokenDType::UInt16;
  std::string prefix; ///< OUTPUT_PREFIX_text_document
  std::string binPath, idxPath;
};

/// Tokenizes `text` and writes the dataset named by `options`.
StatusOr<PreprocessResult> preprocessText(std::string_view text,
                                          const PreprocessOptions &options);

/// Reads options.input and calls preprocessText.
StatusOr<PreprocessResult> preprocessFile(const PreprocessOptions &options);

/// "612 documents, 210000 tokens, vocab 257 (byte, eod 256), dtype uint16
/// -> P_text_document.bin, P_text_document.idx".
std::string summarizePreprocess(const PreprocessResult &result,
                                const PreprocessOptions &options);

/// Entry point of tessera-preprocess; returns the process exit code.
int runPreprocess(int argc, char **argv);

} // namespace tessera::rt

#endif // TESSERA_RT_PREPROCESS_H
