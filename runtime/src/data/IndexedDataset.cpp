//===- IndexedDataset.cpp - Megatron mmap indexed datasets ----------------===//
//
// See tessera/rt/IndexedDataset.h for the format. Follows
// megatron/core/datasets/indexed_dataset.py: _IndexWriter writes the header
// (magic, "<Q" version 1, "<B" dtype code, "<Q" sequence count, "<Q"
// document count), then the int32 lengths, int64 byte pointers and int64
// document indices; IndexedDatasetBuilder starts the document indices at
// [0] and appends the sequence count at every document end.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/FileIO.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace tessera::rt {

static_assert(sizeof(kIndexMagic) == 9, "Megatron's index magic is 9 bytes");

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

int tokenDTypeSize(TokenDType dtype) {
  switch (dtype) {
  case TokenDType::UInt8:
  case TokenDType::Int8:
    return 1;
  case TokenDType::Int16:
  case TokenDType::UInt16:
    return 2;
  case TokenDType::Int32:
  case TokenDType::Float32:
    return 4;
  case TokenDType::Int64:
  case TokenDType::Float64:
    return 8;
  }
  return 0;
}

const char *tokenDTypeName(TokenDType dtype) {
  switch (dtype) {
  case TokenDType::UInt8:
    return "uint8";
  case TokenDType::Int8:
    return "int8";
  case TokenDType::Int16:
    return "int16";
  case TokenDType::Int32:
    return "int32";
  case TokenDType::Int64:
    return "int64";
  case TokenDType::Float64:
    return "float64";
  case TokenDType::Float32:
    return "float32";
  case TokenDType::UInt16:
    return "uint16";
  }
  return "unknown";
}

bool isIntegerTokenDType(TokenDType dtype) {
  return tokenDTypeSize(dtype) != 0 && dtype != TokenDType::Float32 &&
         dtype != TokenDType::Float64;
}

TokenDType optimalTokenDType(int64_t vocabSize) {
  return vocabSize < 65500 ? TokenDType::UInt16 : TokenDType::Int32;
}

static bool dtypeRange(TokenDType dtype, int64_t &lo, int64_t &hi) {
  switch (dtype) {
  case TokenDType::UInt8:
    lo = 0, hi = 255;
    return true;
  case TokenDType::Int8:
    lo = -128, hi = 127;
    return true;
  case TokenDType::Int16:
    lo = -32768, hi = 32767;
    return true;
  case TokenDType::UInt16:
    lo = 0, hi = 65535;
    return true;
  case TokenDType::Int32:
    lo = std::numeric_limits<int32_t>::min();
    hi = std::numeric_limits<int32_t>::max();
    return true;
  case TokenDType::Int64:
    lo = std::numeric_limits<int64_t>::min();
    hi = std::numeric_limits<int64_t>::max();
    return true;
  default:
    return false;
  }
}

/// Little-endian load of an element of `dtype` at `p` (no alignment needed;
/// the host is little endian, as Megatron's files are).
static int64_t loadToken(TokenDType dtype, const uint8_t *p) {
  switch (dtype) {
  case TokenDType::UInt8:
    return *p;
  case TokenDType::Int8:
    return int8_t(*p);
  case TokenDType::Int16: {
    int16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  case TokenDType::UInt16: {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  case TokenDType::Int32: {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  case TokenDType::Int64: {
    int64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  default:
    return 0;
  }
}

static void storeToken(TokenDType dtype, int64_t v, std::string &out) {
  char buf[8];
  std::memcpy(buf, &v, 8); // little endian: the low bytes come first
  out.append(buf, size_t(tokenDTypeSize(dtype)));
}

template <typename T> static void appendLE(std::string &out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

template <typename T> static T loadLE(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string indexFilePath(const std::string &prefix) { return prefix + ".idx"; }
std::string dataFilePath(const std::string &prefix) { return prefix + ".bin"; }

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

IndexedDatasetBuilder::IndexedDatasetBuilder(TokenDType dtype) : type(dtype) {}

Status IndexedDatasetBuilder::addSequence(const int64_t *toks, size_t count) {
  int64_t lo = 0, hi = 0;
  if (!dtypeRange(type, lo, hi))
    return invalidArgument("cannot write tokens as ", tokenDTypeName(type),
                           " (code ", int(type), ")");
  if (count > size_t(std::numeric_limits<int32_t>::max()))
    return invalidArgument("sequence of ", count,
                           " tokens is longer than an int32 length allows");
  for (size_t i = 0; i < count; ++i)
    if (toks[i] < lo || toks[i] > hi)
      return invalidArgument("token ", toks[i], " at offset ", i,
                             " of sequence ", lengths.size(),
                             " does not fit dtype ", tokenDTypeName(type));
  data.reserve(data.size() + count * size_t(tokenDTypeSize(type)));
  for (size_t i = 0; i < count; ++i)
    storeToken(type, toks[i], data);
  lengths.push_back(int32_t(count));
  tokens += int64_t(count);
  return Status();
}

void IndexedDatasetBuilder::endDocument() {
  documents.push_back(int64_t(lengths.size()));
}

Status IndexedDatasetBuilder::addDocument(const std::vector<int64_t> &toks) {
  TESSERA_RETURN_IF_ERROR(addSequence(toks.data(), toks.size()));
  endDocument();
  return Status();
}

std::string IndexedDatasetBuilder::indexBytes() const {
  std::string out;
  out.reserve(kIndexHeaderBytes + lengths.size() * 12 + documents.size() * 8);
  out.append(kIndexMagic, sizeof(kIndexMagic));
  appendLE<uint64_t>(out, kIndexVersion);
  appendLE<uint8_t>(out, uint8_t(type));
  appendLE<uint64_t>(out, uint64_t(lengths.size()));
  appendLE<uint64_t>(out, uint64_t(documents.size()));
  for (int32_t len : lengths)
    appendLE<int32_t>(out, len);
  int64_t pointer = 0, size = tokenDTypeSize(type);
  for (int32_t len : lengths) {
    appendLE<int64_t>(out, pointer);
    pointer += int64_t(len) * size;
  }
  for (int64_t doc : documents)
    appendLE<int64_t>(out, doc);
  return out;
}

Status IndexedDatasetBuilder::write(const std::string &prefix) const {
  // The .bin first: a complete .idx implies a complete .bin.
  TESSERA_RETURN_IF_ERROR(writeFileAtomic(dataFilePath(prefix), data));
  return writeFileAtomic(indexFilePath(prefix), indexBytes());
}

//===----------------------------------------------------------------------===//
// Reader
//===----------------------------------------------------------------------===//

/// Maps `path` read-only; an empty file maps to (nullptr, 0).
static Status mapFile(const std::string &path, const uint8_t *&data,
                      size_t &size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return notFound(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return notFound(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalidArgument(path, ": not a regular file");
  }
  size = size_t(st.st_size);
  data = nullptr;
  if (size > 0) {
    void *p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return internalError(path, ": mmap failed: ", std::strerror(err));
    }
    data = static_cast<const uint8_t *>(p);
  }
  ::close(fd);
  return Status();
}

StatusOr<std::string> IndexedDataset::resolvePrefix(const std::string &prefix) {
  if (prefix.empty())
    return invalidArgument("empty dataset prefix");
  if (pathExists(indexFilePath(prefix)))
    return prefix;
  std::string text = prefix + "_text_document";
  if (pathExists(indexFilePath(text)))
    return text;
  return notFound("no indexed dataset at prefix '", prefix, "': neither ",
                  indexFilePath(prefix), " nor ", indexFilePath(text),
                  " exists (make one with tessera-preprocess)");
}

StatusOr<std::shared_ptr<const IndexedDataset>>
IndexedDataset::open(const std::string &prefix) {
  std::shared_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->pathPrefix = prefix;
  ds->idxPath = indexFilePath(prefix);
  ds->binPath = dataFilePath(prefix);
  TESSERA_RETURN_IF_ERROR(ds->load());
  return std::shared_ptr<const IndexedDataset>(std::move(ds));
}

IndexedDataset::~IndexedDataset() {
  if (idx)
    ::munmap(const_cast<uint8_t *>(idx), idxSize);
  if (bin)
    ::munmap(const_cast<uint8_t *>(bin), binSize);
}

int32_t IndexedDataset::sequenceLength(int64_t i) const {
  return loadLE<int32_t>(idx + kIndexHeaderBytes + size_t(i) * 4);
}

int64_t IndexedDataset::sequencePointer(int64_t i) const {
  return loadLE<int64_t>(idx + kIndexHeaderBytes + size_t(sequenceCount) * 4 +
                         size_t(i) * 8);
}

int64_t IndexedDataset::documentIndex(int64_t k) const {
  return loadLE<int64_t>(idx + kIndexHeaderBytes + size_t(sequenceCount) * 12 +
                         size_t(k) * 8);
}

int64_t IndexedDataset::sequenceToken(int64_t i, int64_t j) const {
  return loadToken(type, bin + sequencePointer(i) + j * elemSize);
}

Status IndexedDataset::load() {
  TESSERA_RETURN_IF_ERROR(mapFile(idxPath, idx, idxSize));
  auto bad = [&](auto &&...args) { return dataLoss(idxPath, ": ", args...); };
  if (idxSize < kIndexHeaderBytes)
    return bad("truncated header: ", idxSize,
               " bytes, a Megatron index "
               "header has ",
               kIndexHeaderBytes);
  if (std::memcmp(idx, kIndexMagic, sizeof(kIndexMagic)) != 0)
    return bad("bad magic (expected \"MMIDIDX\\x00\\x00\"): not a Megatron "
               "mmap indexed dataset index");
  uint64_t version = loadLE<uint64_t>(idx + 9);
  if (version != kIndexVersion)
    return bad("unsupported version ", version, " (expected ", kIndexVersion,
               ")");
  uint8_t code = idx[17];
  type = TokenDType(code);
  if (tokenDTypeSize(type) == 0)
    return bad("unknown dtype code ", int(code),
               " (Megatron's codes are 1..8)");
  if (!isIntegerTokenDType(type))
    return bad("dtype ", tokenDTypeName(type), " (code ", int(code),
               ") cannot hold token ids");
  elemSize = tokenDTypeSize(type);
  uint64_t n = loadLE<uint64_t>(idx + 18);
  uint64_t d = loadLE<uint64_t>(idx + 26);
  // Bound the counts before multiplying (the sizes would overflow).
  const uint64_t limit = uint64_t(1) << 56;
  if (n > limit || d > limit)
    return bad("sequence count ", n, " or document count ", d,
               " is implausibly large");
  uint64_t expect = kIndexHeaderBytes + n * 4 + n * 8 + d * 8;
  if (idxSize != expect && idxSize != expect + n)
    return bad("file holds ", idxSize, " bytes, but ", n, " sequences and ", d,
               " document indices need ", expect, " (header ",
               kIndexHeaderBytes, " + lengths ", n * 4, " + pointers ", n * 8,
               " + document indices ", d * 8, ")");
  sequenceCount = int64_t(n);
  documentCount = int64_t(d);
  if (d < 1)
    return bad("document count 0: the document indices must start with 0");

  // Document indices: 0 = doc[0] <= doc[1] <= ... <= doc[D-1] = N.
  if (documentIndex(0) != 0)
    return bad("document index 0 is ", documentIndex(0), " (must be 0)");
  for (int64_t k = 1; k < documentCount; ++k) {
    int64_t prev = documentIndex(k - 1), cur = documentIndex(k);
    if (cur < prev || cur > sequenceCount)
      return bad("document index ", k, " is ", cur, " (previous ", prev,
                 ", sequence count ", sequenceCount,
                 "): document indices must be non-decreasing and <= the "
                 "sequence count");
  }
  if (documentIndex(documentCount - 1) != sequenceCount)
    return bad("last document index is ", documentIndex(documentCount - 1),
               " but the dataset has ", sequenceCount,
               " sequences (sequences outside every document)");

  TESSERA_RETURN_IF_ERROR(mapFile(binPath, bin, binSize));
  // Lengths and pointers: non-negative, in order, non-overlapping, inside
  // the .bin.
  streamStart.assign(size_t(sequenceCount) + 1, 0);
  int64_t end = 0; // byte end of the previous sequence
  for (int64_t i = 0; i < sequenceCount; ++i) {
    int64_t len = sequenceLength(i), ptr = sequencePointer(i);
    if (len < 0)
      return bad("sequence ", i, " has negative length ", len);
    if (ptr < end)
      return bad("sequence ", i, " pointer ", ptr,
                 (i ? " overlaps the previous sequence, which ends at byte "
                    : " is negative; minimum "),
                 end, " (pointers must be non-decreasing byte offsets)");
    int64_t bytes = len * elemSize;
    if (uint64_t(ptr) > binSize || uint64_t(bytes) > binSize - uint64_t(ptr))
      return dataLoss(binPath, ": sequence ", i, " (", len, " ",
                      tokenDTypeName(type), " tokens at byte ", ptr, " per ",
                      idxPath, ") ends past the end of the file (", binSize,
                      " bytes)");
    end = ptr + bytes;
    streamStart[size_t(i) + 1] = streamStart[size_t(i)] + len;
  }
  if (uint64_t(end) != binSize)
    return dataLoss(binPath, ": file holds ", binSize,
                    " bytes, but the "
                    "sequences of ",
                    idxPath, " end at byte ", end,
                    " (the .bin and .idx do not belong together)");

  // Token ids: non-negative and i32 (the model's token inputs are i32).
  minToken = maxToken = 0;
  bool first = true;
  for (int64_t i = 0; i < sequenceCount; ++i) {
    const uint8_t *p = bin + sequencePointer(i);
    int64_t len = sequenceLength(i);
    for (int64_t j = 0; j < len; ++j, p += elemSize) {
      int64_t v = loadToken(type, p);
      if (v < 0 || v > std::numeric_limits<int32_t>::max())
        return dataLoss(binPath, ": token ", streamStart[size_t(i)] + j,
                        " (sequence ", i, " offset ", j, ") has id ", v,
                        ", outside [0, 2^31)");
      if (first || v < minToken)
        minToken = v;
      if (first || v > maxToken)
        maxToken = v;
      first = false;
    }
  }
  return Status();
}

Status IndexedDataset::readStream(int64_t start, int64_t count,
                                  int64_t *out) const {
  if (start < 0 || count < 0 || start > numTokens() ||
      count > numTokens() - start)
    return outOfRange(binPath, ": tokens [", start, ", ", start + count,
                      ") outside the ", numTokens(), " tokens of the dataset");
  if (count == 0)
    return Status();
  // The sequence holding `start`: the last i with streamStart[i] <= start
  // (empty sequences share a start; the search skips past them).
  auto it = std::upper_bound(streamStart.begin(), streamStart.end(), start);
  int64_t seq = int64_t(it - streamStart.begin()) - 1;
  int64_t off = start - streamStart[size_t(seq)];
  for (int64_t k = 0; k < count;) {
    int64_t len = sequenceLength(seq);
    const uint8_t *p = bin + sequencePointer(seq) + off * elemSize;
    for (; off < len && k < count; ++off, ++k, p += elemSize)
      out[k] = loadToken(type, p);
    ++seq;
    off = 0;
  }
  return Status();
}

Status IndexedDataset::checkVocabulary(int64_t vocabSize) const {
  if (maxToken < vocabSize || numTokens() == 0)
    return Status();
  for (int64_t i = 0; i < sequenceCount; ++i)
    for (int64_t j = 0, len = sequenceLength(i); j < len; ++j) {
      int64_t v = sequenceToken(i, j);
      if (v >= vocabSize)
        return invalidArgument(
            binPath, ": token ", streamStart[size_t(i)] + j, " (sequence ", i,
            " offset ", j, ") has id ", v,
            ", not below the model's vocab "
            "size ",
            vocabSize, " (largest id in the dataset: ", maxToken,
            "; was it preprocessed with another tokenizer?)");
    }
  return Status();
}

//===----------------------------------------------------------------------===//
// GPT samples
//===----------------------------------------------------------------------===//

int64_t gptSampleStart(int64_t g, int64_t seqLength, int64_t numTokens) {
  using u128 = unsigned __int128;
  uint64_t period = uint64_t(numTokens - seqLength);
  return int64_t(u128(uint64_t(g)) * u128(uint64_t(seqLength)) % period);
}

Status gptSample(const IndexedDataset &dataset, int64_t g, int64_t seqLength,
                 int64_t *out) {
  int64_t t = dataset.numTokens();
  if (seqLength <= 0)
    return invalidArgument(dataset.prefix(), ": sequence length ", seqLength,
                           " must be positive");
  if (t <= seqLength)
    return invalidArgument(dataset.dataPath(), ": the dataset has ", t,
                           " tokens, but a sample of sequence length ",
                           seqLength, " needs ", seqLength + 1);
  if (g < 0)
    return invalidArgument("negative global sample index ", g);
  return dataset.readStream(gptSampleStart(g, seqLength, t), seqLength + 1,
                            out);
}

} // namespace tessera::rt
