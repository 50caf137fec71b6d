//===- IndexedDataset.h - Megatron mmap indexed datasets --------*- C++ -*-===//
//
// Reader and writer of Megatron-LM's "mmap" indexed dataset, the format of
// megatron/core/datasets/indexed_dataset.py (IndexedDatasetBuilder,
// _IndexWriter, _IndexReader) and of the PREFIX_text_document.{bin,idx}
// pairs made by Megatron's tools/preprocess_data.py. All integers are little
// endian.
//
// PREFIX.idx:
//   bytes 0..8    magic "MMIDIDX\0\0" (9 bytes)
//   bytes 9..16   version, uint64 == 1
//   byte  17      token dtype code, uint8 (TokenDType below)
//   bytes 18..25  sequence count N, uint64
//   bytes 26..33  document count D, uint64 (number of documents + 1)
//   then          N x int32  sequence lengths (tokens)
//                 N x int64  sequence pointers (byte offsets into PREFIX.bin)
//                 D x int64  document indices: document k is the sequences
//                            [doc[k], doc[k + 1]); doc[0] = 0, doc[D-1] = N
//   (a multimodal dataset appends N x int8 sequence modes; they are ignored)
// PREFIX.bin: the tokens of every sequence, back to back, in the dtype.
//
// The reader mmaps both files and validates everything up front (every
// error names the file): magic, version, dtype code, the .idx size against
// the counts, document indices, sequence lengths, pointers (non-decreasing,
// non-overlapping, inside the .bin, whose size must be the end of the last
// sequence) and every token id (>= 0; fits the i32 model inputs).
//
// GPT samples: the "token stream" is the concatenation of all sequences in
// index order (document order). With T tokens in the stream and sequence
// length S (T > S required), sample g is the S + 1 consecutive stream tokens
// starting at
//     start(g) = (g * S) mod (T - S),
// so consecutive samples overlap by one token (like Megatron's GPTDataset
// without shuffling) and the stream wraps around once it is exhausted;
// tokens = sample[0..S), labels = sample[1..S].
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_INDEXEDDATASET_H
#define TESSERA_RT_INDEXEDDATASET_H

#include "tessera/rt/Status.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::rt {

/// Megatron's DType codes (indexed_dataset.py, class DType).
enum class TokenDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

/// Size in bytes of `dtype`; 0 for a code Megatron does not define.
int tokenDTypeSize(TokenDType dtype);
/// NumPy's name of `dtype` ("uint16", ...), or "unknown".
const char *tokenDTypeName(TokenDType dtype);
/// True for the integer codes (everything but float32/float64).
bool isIntegerTokenDType(TokenDType dtype);
/// Megatron's DType.optimal_dtype: uint16 for a vocabulary of fewer than
/// 65500 ids, else int32.
TokenDType optimalTokenDType(int64_t vocabSize);

/// The 9-byte magic at the start of every .idx file.
inline constexpr char kIndexMagic[9] = {'M', 'M', 'I',  'D', 'I',
                                        'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
/// Magic + version + dtype code + sequence count + document count.
inline constexpr size_t kIndexHeaderBytes = 34;

/// PREFIX + ".idx" / ".bin".
std::string indexFilePath(const std::string &prefix);
std::string dataFilePath(const std::string &prefix);

/// Collects sequences and documents like Megatron's IndexedDatasetBuilder
/// (in memory) and writes the .bin/.idx pair.
class IndexedDatasetBuilder {
public:
  explicit IndexedDatasetBuilder(TokenDType dtype);

  /// Appends one sequence; every token must be representable in the dtype.
  Status addSequence(const int64_t *tokens, size_t count);
  /// Closes the current document (appends the sequence count to the
  /// document indices), as IndexedDatasetBuilder.end_document.
  void endDocument();
  /// addSequence + endDocument (a document of one sequence).
  Status addDocument(const std::vector<int64_t> &tokens);

  TokenDType dtype() const { return type; }
  int64_t numSequences() const { return int64_t(lengths.size()); }
  /// Documents closed so far.
  int64_t numDocuments() const { return int64_t(documents.size()) - 1; }
  int64_t numTokens() const { return tokens; }

  /// The .idx / .bin images.
  std::string indexBytes() const;
  const std::string &dataBytes() const { return data; }

  /// Writes PREFIX.bin then PREFIX.idx, each atomically (writeFileAtomic,
  /// tessera/rt/FileIO.h).
  Status write(const std::string &prefix) const;

private:
  TokenDType type;
  std::string data;
  std::vector<int32_t> lengths;
  std::vector<int64_t> documents{0};
  int64_t tokens = 0;
};

/// A validated, memory-mapped .idx/.bin pair.
class IndexedDataset {
public:
  /// Opens PREFIX.idx and PREFIX.bin.
  static StatusOr<std::shared_ptr<const IndexedDataset>>
  open(const std::string &prefix);

  /// Resolves a user-given prefix: PREFIX itself if PREFIX.idx exists, else
  /// PREFIX_text_document (the name tessera-preprocess and Megatron's
  /// preprocess_data.py give it). Errors name both candidates.
  static StatusOr<std::string> resolvePrefix(const std::string &prefix);

  ~IndexedDataset();
  IndexedDataset(const IndexedDataset &) = delete;
  IndexedDataset &operator=(const IndexedDataset &) = delete;

  const std::string &prefix() const { return pathPrefix; }
  const std::string &indexPath() const { return idxPath; }
  const std::string &dataPath() const { return binPath; }

  TokenDType dtype() const { return type; }
  int64_t numSequences() const { return sequenceCount; }
  /// Documents (the header's document count - 1).
  int64_t numDocuments() const { return documentCount - 1; }
  /// Tokens in all sequences (the stream length T).
  int64_t numTokens() const { return streamStart.back(); }

  int32_t sequenceLength(int64_t i) const;
  int64_t sequencePointer(int64_t i) const;
  /// Document index k in [0, numDocuments()].
  int64_t documentIndex(int64_t k) const;
  /// Token j of sequence i.
  int64_t sequenceToken(int64_t i, int64_t j) const;

  /// Smallest / largest token id in the dataset (0 if it is empty).
  int64_t minTokenId() const { return minToken; }
  int64_t maxTokenId() const { return maxToken; }

  /// Copies stream tokens [start, start + count) to `out`.
  Status readStream(int64_t start, int64_t count, int64_t *out) const;

  /// Error unless every token id is < vocabSize; names the .bin file, the
  /// first offending token's stream position (and sequence/offset), its id
  /// and the vocabulary size.
  Status checkVocabulary(int64_t vocabSize) const;

private:
  IndexedDataset() = default;
  Status load();

  std::string pathPrefix, idxPath, binPath;
  const uint8_t *idx = nullptr;
  size_t idxSize = 0;
  const uint8_t *bin = nullptr;
  size_t binSize = 0;
  TokenDType type = TokenDType::UInt16;
  int elemSize = 2;
  int64_t sequenceCount = 0, documentCount = 0;
  /// streamStart[i]: stream position of sequence i's first token; N + 1
  /// entries.
  std::vector<int64_t> streamStart{0};
  int64_t minToken = 0, maxToken = 0;
};

/// First stream token of GPT sample `g` with sequence length `seqLength`
/// over a stream of `numTokens` tokens: (g * S) mod (T - S). Needs
/// T > S > 0 and g >= 0.
int64_t gptSampleStart(int64_t g, int64_t seqLength, int64_t numTokens);

/// Writes the S + 1 tokens of GPT sample `g` to `out`. Errors (naming the
/// dataset) when the stream has no more than S tokens.
Status gptSample(const IndexedDataset &dataset, int64_t g, int64_t seqLength,
                 int64_t *out);

} // namespace tessera::rt

#endif // TESSERA_RT_INDEXEDDATASET_H
