//===- IndexedDatasetTest.cpp - Megatron indexed datasets, GPT samples ----===//
//
// Writer/reader round trips for every token dtype, the exact .idx layout of
// Megatron's _IndexWriter, every validation error, tessera-preprocess, the
// GPT sample rule, global-index determinism over data layouts, the
// out-of-vocabulary error and the tessera-run --data plumbing.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/Data.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/FileIO.h"
#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/Launcher.h"
#include "tessera/rt/Preprocess.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

using namespace tessera::rt;
using namespace tessera::rt::test;

#ifndef TESSERA_RUN_PATH
#error "TESSERA_RUN_PATH must point at the tessera-run binary"
#endif
#ifndef TESSERA_PREPROCESS_PATH
#error "TESSERA_PREPROCESS_PATH must point at the tessera-preprocess binary"
#endif

namespace {

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void writeRaw(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename T> void put(std::string &s, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), s.size());
  std::memcpy(&s[at], &v, sizeof(T));
}

template <typename T> std::string le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(&s[0], &v, sizeof(T));
  return s;
}

struct ToolResult {
  int exitCode = -1;
  std::string output;
};

ToolResult runCommand(const std::string &cmd) {
  ToolResult result;
  FILE *pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe)
    return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0)
    result.output.append(buf, n);
  int status = pclose(pipe);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

class IndexedDatasetTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-indexed-dataset-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    (void)std::system(("rm -rf '" + dir + "'").c_str());
  }

  /// Writes documents of one sequence each; returns the prefix.
  std::string writeDataset(const std::string &name,
                           const std::vector<std::vector<int64_t>> &docs,
                           TokenDType dtype = TokenDType::UInt16) {
    IndexedDatasetBuilder builder(dtype);
    for (const auto &d : docs)
      EXPECT_TRUE(builder.addDocument(d).ok());
    std::string prefix = dir + "/" + name;
    Status st = builder.write(prefix);
    EXPECT_TRUE(st.ok()) << st.toString();
    return prefix;
  }

  /// A dataset whose stream is 0, 1, ..., n - 1 (int32), in documents of 7.
  std::string iotaDataset(const std::string &name, int64_t n) {
    std::vector<std::vector<int64_t>> docs;
    for (int64_t t = 0; t < n; ++t) {
      if (t % 7 == 0)
        docs.emplace_back();
      docs.back().push_back(t);
    }
    return writeDataset(name, docs, TokenDType::Int32);
  }

  std::shared_ptr<const IndexedDataset> open(const std::string &prefix) {
    auto ds = IndexedDataset::open(prefix);
    EXPECT_TRUE(ds.ok()) << ds.status().toString();
    return ds.ok() ? *ds : nullptr;
  }

  /// Expects opening `prefix` to fail with `code` and a message naming
  /// `file` and containing `text`.
  void expectOpenError(const std::string &prefix, StatusCode code,
                       const std::string &file, const std::string &text) {
    auto ds = IndexedDataset::open(prefix);
    ASSERT_FALSE(ds.ok()) << "opened " << prefix;
    EXPECT_EQ(ds.status().getCode(), code) << ds.status().toString();
    EXPECT_NE(ds.status().message().find(file), std::string::npos)
        << ds.status().message();
    EXPECT_NE(ds.status().message().find(text), std::string::npos)
        << ds.status().message() << "\n  (expected '" << text << "')";
  }

  std::string dir;
};

//===----------------------------------------------------------------------===//
// Dtypes and the writer
//===----------------------------------------------------------------------===//

TEST(TokenDTypeTest, CodesSizesAndOptimalDtype) {
  // Megatron's DType enum: uint8 1, int8 2, int16 3, int32 4, int64 5,
  // float64 6, float32 7, uint16 8.
  EXPECT_EQ(int(TokenDType::UInt8), 1);
  EXPECT_EQ(int(TokenDType::Int8), 2);
  EXPECT_EQ(int(TokenDType::Int16), 3);
  EXPECT_EQ(int(TokenDType::Int32), 4);
  EXPECT_EQ(int(TokenDType::Int64), 5);
  EXPECT_EQ(int(TokenDType::Float64), 6);
  EXPECT_EQ(int(TokenDType::Float32), 7);
  EXPECT_EQ(int(TokenDType::UInt16), 8);
  EXPECT_EQ(tokenDTypeSize(TokenDType::UInt8), 1);
  EXPECT_EQ(tokenDTypeSize(TokenDType::Int8), 1);
  EXPECT_EQ(tokenDTypeSize(TokenDType::Int16), 2);
  EXPECT_EQ(tokenDTypeSize(TokenDType::UInt16), 2);
  EXPECT_EQ(tokenDTypeSize(TokenDType::Int32), 4);
  EXPECT_EQ(tokenDTypeSize(TokenDType::Int64), 8);
  EXPECT_EQ(tokenDTypeSize(TokenDType(9)), 0);
  EXPECT_STREQ(tokenDTypeName(TokenDType::UInt16), "uint16");
  EXPECT_FALSE(isIntegerTokenDType(TokenDType::Float32));
  EXPECT_TRUE(isIntegerTokenDType(TokenDType::Int64));
  // DType.optimal_dtype: uint16 below 65500, else int32.
  EXPECT_EQ(optimalTokenDType(257), TokenDType::UInt16);
  EXPECT_EQ(optimalTokenDType(65499), TokenDType::UInt16);
  EXPECT_EQ(optimalTokenDType(65500), TokenDType::Int32);
  EXPECT_EQ(optimalTokenDType(128256), TokenDType::Int32);
}

TEST_F(IndexedDatasetTest, ExactIndexLayoutFollowsMegatron) {
  // Documents "ab" and "c" with EOD (256), uint16, as Megatron's
  // IndexedDatasetBuilder.add_document + finalize write them.
  std::string prefix = writeDataset("small", {{'a', 'b', 256}, {'c', 256}});
  std::string expect;
  expect += std::string("MMIDIDX\0\0", 9);   // _INDEX_HEADER
  expect += le<uint64_t>(1);                 // version "<Q" 1
  expect += le<uint8_t>(8);                  // dtype code "<B": uint16
  expect += le<uint64_t>(2);                 // sequence count
  expect += le<uint64_t>(3);                 // document count (indices)
  expect += le<int32_t>(3) + le<int32_t>(2); // sequence lengths
  expect += le<int64_t>(0) + le<int64_t>(6); // byte pointers
  expect += le<int64_t>(0) + le<int64_t>(1) + le<int64_t>(2); // documents
  ASSERT_EQ(expect.size(), 34u + 8 + 16 + 24);
  EXPECT_EQ(readFile(prefix + ".idx"), expect);
  std::string bin = le<uint16_t>('a') + le<uint16_t>('b') + le<uint16_t>(256) +
                    le<uint16_t>('c') + le<uint16_t>(256);
  EXPECT_EQ(readFile(prefix + ".bin"), bin);
}

TEST_F(IndexedDatasetTest, RoundTripEveryDtype) {
  struct Case {
    TokenDType dtype;
    int64_t big; // largest id the reader accepts in this dtype
  };
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  for (Case c :
       {Case{TokenDType::UInt8, 255}, Case{TokenDType::Int8, 127},
        Case{TokenDType::Int16, 32767}, Case{TokenDType::UInt16, 65535},
        Case{TokenDType::Int32, i32max}, Case{TokenDType::Int64, i32max}}) {
    SCOPED_TRACE(tokenDTypeName(c.dtype));
    // Document 0: two sequences; document 1: empty; document 2: one.
    IndexedDatasetBuilder b(c.dtype);
    std::vector<int64_t> s0 = {1, 2, c.big}, s1 = {0}, s2 = {5, 6, 7, 8};
    ASSERT_TRUE(b.addSequence(s0.data(), s0.size()).ok());
    ASSERT_TRUE(b.addSequence(s1.data(), s1.size()).ok());
    b.endDocument();
    b.endDocument();
    ASSERT_TRUE(b.addDocument(s2).ok());
    EXPECT_EQ(b.numDocuments(), 3);
    EXPECT_EQ(b.numSequences(), 3);
    EXPECT_EQ(b.numTokens(), 8);
    std::string prefix = dir + "/rt_" + tokenDTypeName(c.dtype);
    ASSERT_TRUE(b.write(prefix).ok());
    EXPECT_EQ(readFile(prefix + ".idx"), b.indexBytes());
    EXPECT_EQ(readFile(prefix + ".bin"), b.dataBytes());

    auto ds = open(prefix);
    ASSERT_TRUE(ds);
    int size = tokenDTypeSize(c.dtype);
    EXPECT_EQ(ds->dtype(), c.dtype);
    EXPECT_EQ(ds->numSequences(), 3);
    EXPECT_EQ(ds->numDocuments(), 3);
    EXPECT_EQ(ds->numTokens(), 8);
    EXPECT_EQ(ds->sequenceLength(0), 3);
    EXPECT_EQ(ds->sequenceLength(1), 1);
    EXPECT_EQ(ds->sequenceLength(2), 4);
    EXPECT_EQ(ds->sequencePointer(0), 0);
    EXPECT_EQ(ds->sequencePointer(1), 3 * size);
    EXPECT_EQ(ds->sequencePointer(2), 4 * size);
    std::vector<int64_t> docs;
    for (int64_t k = 0; k <= ds->numDocuments(); ++k)
      docs.push_back(ds->documentIndex(k));
    EXPECT_EQ(docs, (std::vector<int64_t>{0, 2, 2, 3}));
    EXPECT_EQ(ds->sequenceToken(0, 2), c.big);
    EXPECT_EQ(ds->minTokenId(), 0);
    EXPECT_EQ(ds->maxTokenId(), c.big);
    std::vector<int64_t> all(8);
    ASSERT_TRUE(ds->readStream(0, 8, all.data()).ok());
    EXPECT_EQ(all, (std::vector<int64_t>{1, 2, c.big, 0, 5, 6, 7, 8}));
    std::vector<int64_t> mid(4);
    ASSERT_TRUE(ds->readStream(2, 4, mid.data()).ok());
    EXPECT_EQ(mid, (std::vector<int64_t>{c.big, 0, 5, 6}));
    Status st = ds->readStream(6, 3, mid.data());
    EXPECT_EQ(st.getCode(), StatusCode::OutOfRange) << st.toString();
  }
}

TEST_F(IndexedDatasetTest, WriterRejectsTokensOutsideTheDtype) {
  IndexedDatasetBuilder u8(TokenDType::UInt8);
  std::vector<int64_t> big = {1, 256};
  Status st = u8.addSequence(big.data(), big.size());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("256"), std::string::npos) << st.message();
  IndexedDatasetBuilder u16(TokenDType::UInt16);
  std::vector<int64_t> neg = {-1};
  EXPECT_FALSE(u16.addSequence(neg.data(), neg.size()).ok());
  IndexedDatasetBuilder f32(TokenDType::Float32);
  std::vector<int64_t> one = {1};
  EXPECT_FALSE(f32.addSequence(one.data(), one.size()).ok());
}

TEST_F(IndexedDatasetTest, AtomicWriteReplacesAndLeavesNoTemporaries) {
  std::string path = dir + "/file";
  writeRaw(path, "old contents");
  ASSERT_TRUE(writeFileAtomic(path, "new").ok());
  EXPECT_EQ(readFile(path), "new");
  int entries = 0;
  DIR *d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent *e = readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
      ++entries;
  closedir(d);
  EXPECT_EQ(entries, 1);
  Status st = writeFileAtomic(dir + "/missing/x", "y");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir + "/missing/x"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

class IndexedDatasetValidationTest : public IndexedDatasetTest {
protected:
  void SetUp() override {
    IndexedDatasetTest::SetUp();
    reset();
  }
  /// The valid pair: two documents, three sequences of lengths 2, 3, 1
  /// (uint16).
  void reset() {
    IndexedDatasetBuilder b(TokenDType::UInt16);
    std::vector<int64_t> a = {1, 2}, c = {3, 4, 5}, e = {6};
    ASSERT_TRUE(b.addSequence(a.data(), a.size()).ok());
    ASSERT_TRUE(b.addSequence(c.data(), c.size()).ok());
    b.endDocument();
    ASSERT_TRUE(b.addDocument(e).ok());
    idx = b.indexBytes();
    bin = b.dataBytes();
    prefix = dir + "/bad";
  }
  /// Writes the (patched) pair.
  void store() {
    writeRaw(prefix + ".idx", idx);
    writeRaw(prefix + ".bin", bin);
  }
  void expectIdxError(const std::string &text) {
    store();
    expectOpenError(prefix, StatusCode::DataLoss, prefix + ".idx", text);
  }
  void expectBinError(const std::string &text) {
    store();
    expectOpenError(prefix, StatusCode::DataLoss, prefix + ".bin", text);
  }
  // Offsets in the index of 3 sequences and 3 document indices.
  static constexpr size_t kLengths = 34, kPointers = 34 + 12,
                          kDocuments = 34 + 36;
  std::string idx, bin, prefix;
};

TEST_F(IndexedDatasetValidationTest, ValidBaselineOpens) {
  store();
  auto ds = open(prefix);
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->numDocuments(), 2);
  EXPECT_EQ(ds->numTokens(), 6);
}

TEST_F(IndexedDatasetValidationTest, MissingFiles) {
  expectOpenError(prefix, StatusCode::NotFound, prefix + ".idx", "cannot open");
  writeRaw(prefix + ".idx", idx);
  expectOpenError(prefix, StatusCode::NotFound, prefix + ".bin", "cannot open");
}

TEST_F(IndexedDatasetValidationTest, TruncatedHeader) {
  idx.resize(20);
  expectIdxError("truncated header");
}

TEST_F(IndexedDatasetValidationTest, BadMagic) {
  idx[0] = 'X';
  expectIdxError("bad magic");
}

TEST_F(IndexedDatasetValidationTest, BadVersion) {
  put<uint64_t>(idx, 9, 2);
  expectIdxError("unsupported version 2");
}

TEST_F(IndexedDatasetValidationTest, UnknownDtypeCode) {
  put<uint8_t>(idx, 17, 9);
  expectIdxError("unknown dtype code 9");
  put<uint8_t>(idx, 17, 0);
  expectIdxError("unknown dtype code 0");
}

TEST_F(IndexedDatasetValidationTest, FloatDtypeCode) {
  put<uint8_t>(idx, 17, 7);
  expectIdxError("float32 (code 7) cannot hold token ids");
  put<uint8_t>(idx, 17, 6);
  expectIdxError("float64 (code 6) cannot hold token ids");
}

TEST_F(IndexedDatasetValidationTest, IndexSizeDoesNotMatchCounts) {
  idx.pop_back();
  expectIdxError("need 94");
  reset();
  put<uint64_t>(idx, 18, 4); // sequence count 4: 34 + 48 + 24 = 106 bytes
  expectIdxError("file holds 94 bytes, but 4 sequences and 3 document "
                 "indices need 106");
  reset();
  put<uint64_t>(idx, 18, uint64_t(1) << 62);
  expectIdxError("implausibly large");
}

TEST_F(IndexedDatasetValidationTest, MultimodalModesAreAccepted) {
  idx += std::string(3, '\0'); // one int8 mode per sequence
  store();
  EXPECT_TRUE(open(prefix));
}

TEST_F(IndexedDatasetValidationTest, DocumentIndices) {
  // No document indices at all (document count 0).
  idx.resize(kDocuments);
  put<uint64_t>(idx, 26, 0);
  expectIdxError("document count 0");
  reset();
  put<int64_t>(idx, kDocuments, 1);
  expectIdxError("document index 0 is 1");
  reset();
  put<int64_t>(idx, kDocuments + 8, 3);
  put<int64_t>(idx, kDocuments + 16, 2);
  expectIdxError("non-decreasing");
  reset();
  put<int64_t>(idx, kDocuments + 16, 2);
  expectIdxError("last document index is 2 but the dataset has 3 sequences");
}

TEST_F(IndexedDatasetValidationTest, NegativeLength) {
  put<int32_t>(idx, kLengths + 4, -1);
  expectIdxError("sequence 1 has negative length -1");
}

TEST_F(IndexedDatasetValidationTest, PointersMustBeMonotonicAndInRange) {
  put<int64_t>(idx, kPointers + 8, 2); // sequence 1 overlaps sequence 0
  expectIdxError("sequence 1 pointer 2 overlaps the previous sequence");
  reset();
  put<int64_t>(idx, kPointers, -4);
  expectIdxError("sequence 0 pointer -4 is negative");
  reset();
  put<int64_t>(idx, kPointers + 16, 100);
  expectBinError("sequence 2 (1 uint16 tokens at byte 100");
}

TEST_F(IndexedDatasetValidationTest, BinSizeMustMatchTheIndex) {
  bin.pop_back();
  bin.pop_back();
  expectBinError("ends past the end of the file (10 bytes)");
  reset();
  bin += "xx";
  expectBinError("file holds 14 bytes, but the sequences of " + prefix +
                 ".idx end at byte 12");
}

TEST_F(IndexedDatasetValidationTest, TokenIdsMustBeNonNegativeI32) {
  IndexedDatasetBuilder b(TokenDType::Int16);
  ASSERT_TRUE(b.addDocument({3, -5}).ok());
  std::string p = dir + "/neg";
  ASSERT_TRUE(b.write(p).ok());
  expectOpenError(p, StatusCode::DataLoss, p + ".bin",
                  "token 1 (sequence 0 offset 1) has id -5");
  IndexedDatasetBuilder w(TokenDType::Int64);
  ASSERT_TRUE(w.addDocument({int64_t(1) << 40}).ok());
  p = dir + "/wide";
  ASSERT_TRUE(w.write(p).ok());
  expectOpenError(p, StatusCode::DataLoss, p + ".bin", "has id 1099511627776");
}

TEST_F(IndexedDatasetTest, ResolvePrefix) {
  std::string p = writeDataset("corpus_text_document", {{1, 2}});
  auto a = IndexedDataset::resolvePrefix(dir + "/corpus");
  ASSERT_TRUE(a.ok()) << a.status().toString();
  EXPECT_EQ(*a, p);
  auto b = IndexedDataset::resolvePrefix(p);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, p);
  auto c = IndexedDataset::resolvePrefix(dir + "/none");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().getCode(), StatusCode::NotFound);
  EXPECT_NE(c.status().message().find(dir + "/none.idx"), std::string::npos);
  EXPECT_NE(c.status().message().find(dir + "/none_text_document.idx"),
            std::string::npos);
}

//===----------------------------------------------------------------------===//
// Preprocessing
//===----------------------------------------------------------------------===//

StatusOr<PreprocessOptions> parsePre(std::vector<std::string> args) {
  args.insert(args.begin(), "tessera-preprocess");
  std::vector<char *> argv;
  for (auto &a : args)
    argv.push_back(a.data());
  return parsePreprocessOptions(int(argv.size()), argv.data());
}

TEST(PreprocessTest, ParseOptions) {
  auto o = parsePre({"--input", "a.txt", "--output-prefix=out", "--append-eod",
                     "--documents", "lines", "--tokenizer", "byte"});
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_EQ(o->input, "a.txt");
  EXPECT_EQ(o->outputPrefix, "out");
  EXPECT_TRUE(o->appendEod);
  EXPECT_EQ(o->documents, DocumentMode::Lines);
  auto d = parsePre({"--input", "a", "--output-prefix", "b"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->documents, DocumentMode::Paragraphs);
  EXPECT_FALSE(d->appendEod);
  for (auto bad : std::vector<std::vector<std::string>>{
           {"--output-prefix", "b"},
           {"--input", "a"},
           {"--input", "a", "--output-prefix", "b", "--tokenizer", "gpt2"},
           {"--input", "a", "--output-prefix", "b", "--documents", "pages"},
           {"--input", "a", "--output-prefix", "b", "--frobnicate"},
           {"--input", "a", "--output-prefix", "b", "stray"},
           {"--input"}}) {
    auto r = parsePre(bad);
    EXPECT_FALSE(r.ok()) << bad.back();
  }
  auto h = parsePre({"--help"});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->help);
}

std::vector<std::string> split(std::string_view text, DocumentMode mode) {
  std::vector<std::string> out;
  for (std::string_view d : splitDocuments(text, mode))
    out.emplace_back(d);
  return out;
}

TEST(PreprocessTest, SplitDocuments) {
  std::string text = "\n\nOne line\r\nsecond line\n  \t\nPara two\n\n\n"
                     "Three\nend";
  EXPECT_EQ(split(text, DocumentMode::Paragraphs),
            (std::vector<std::string>{"One line\r\nsecond line", "Para two",
                                      "Three\nend"}));
  EXPECT_EQ(split(text, DocumentMode::Lines),
            (std::vector<std::string>{"One line", "second line", "Para two",
                                      "Three", "end"}));
  EXPECT_EQ(split(text, DocumentMode::File), (std::vector<std::string>{text}));
  EXPECT_TRUE(split("", DocumentMode::File).empty());
  EXPECT_TRUE(split("\n \n", DocumentMode::Paragraphs).empty());
  EXPECT_EQ(split("x", DocumentMode::Paragraphs),
            (std::vector<std::string>{"x"}));
  EXPECT_EQ(ByteTokenizer::tokenize("A\xc3\xa9"),
            (std::vector<int64_t>{65, 0xc3, 0xa9}));
}

TEST_F(IndexedDatasetTest, PreprocessTextRoundTrip) {
  PreprocessOptions o;
  o.input = "mem.txt";
  o.outputPrefix = dir + "/pre";
  o.appendEod = true;
  auto r = preprocessText("Hello\nworld\n\nBye\n", o);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->documents, 2);
  EXPECT_EQ(r->tokens, 11 + 1 + 3 + 1);
  EXPECT_EQ(r->vocabSize, 257);
  EXPECT_EQ(r->dtype, TokenDType::UInt16);
  EXPECT_EQ(r->prefix, dir + "/pre_text_document");
  EXPECT_EQ(r->binPath, dir + "/pre_text_document.bin");
  EXPECT_EQ(r->idxPath, dir + "/pre_text_document.idx");
  std::string summary = summarizePreprocess(*r, o);
  for (const char *part : {"2 documents", "16 tokens", "vocab 257", "uint16",
                           "pre_text_document.bin", "pre_text_document.idx"})
    EXPECT_NE(summary.find(part), std::string::npos) << summary;
  auto ds = open(r->prefix);
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->numDocuments(), 2);
  std::vector<int64_t> all(16);
  ASSERT_TRUE(ds->readStream(0, 16, all.data()).ok());
  std::string back;
  for (int64_t t : all)
    back += t == 256 ? '|' : char(t);
  EXPECT_EQ(back, "Hello\nworld|Bye|");
  EXPECT_EQ(ds->maxTokenId(), 256);

  o.appendEod = false;
  o.documents = DocumentMode::Lines;
  r = preprocessText("Hello\nworld\n\nBye\n", o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->documents, 3);
  EXPECT_EQ(r->tokens, 13);
}

TEST_F(IndexedDatasetTest, PreprocessToolEndToEnd) {
  std::string input = dir + "/in.txt";
  writeRaw(input, "First paragraph.\n\nSecond one,\non two lines.\n");
  ToolResult ok =
      runCommand(std::string(TESSERA_PREPROCESS_PATH) + " --input " + input +
                 " --output-prefix " + dir + "/tool --append-eod");
  ASSERT_EQ(ok.exitCode, 0) << ok.output;
  EXPECT_NE(ok.output.find("tessera-preprocess: 2 documents"),
            std::string::npos)
      << ok.output;
  auto ds = open(dir + "/tool_text_document");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->numTokens(), 16 + 1 + 25 + 1);
  ToolResult missing =
      runCommand(std::string(TESSERA_PREPROCESS_PATH) + " --input " + dir +
                 "/nope.txt --output-prefix " + dir + "/x");
  EXPECT_EQ(missing.exitCode, 1);
  EXPECT_NE(missing.output.find(dir + "/nope.txt: cannot open"),
            std::string::npos)
      << missing.output;
  ToolResult usage = runCommand(std::string(TESSERA_PREPROCESS_PATH));
  EXPECT_EQ(usage.exitCode, 1);
  EXPECT_NE(usage.output.find("usage:"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// GPT samples
//===----------------------------------------------------------------------===//

TEST_F(IndexedDatasetTest, SampleRule) {
  const int64_t T = 50, S = 8;
  auto ds = open(iotaDataset("iota", T));
  ASSERT_TRUE(ds);
  ASSERT_EQ(ds->numTokens(), T);
  std::vector<int64_t> sample(S + 1);
  for (int64_t g : {0, 1, 2, 5, 6, 41, 1000003}) {
    int64_t start = (g * S) % (T - S);
    EXPECT_EQ(gptSampleStart(g, S, T), start);
    ASSERT_TRUE(gptSample(*ds, g, S, sample.data()).ok());
    for (int64_t s = 0; s <= S; ++s)
      EXPECT_EQ(sample[size_t(s)], start + s) << "g " << g << " s " << s;
  }
  // Consecutive samples share one token; the stream wraps: 42 % 42 = 0.
  EXPECT_EQ(gptSampleStart(5, S, T), 40);
  EXPECT_EQ(gptSampleStart(6, S, T), 6);
  // Huge g: no overflow.
  EXPECT_EQ(gptSampleStart(int64_t(1) << 62, 1 << 20, (int64_t(1) << 40) + 7),
            int64_t((static_cast<unsigned __int128>(1) << 82) %
                    ((uint64_t(1) << 40) + 7 - (1 << 20))));
  // T <= S: an error naming the .bin.
  Status st = gptSample(*ds, 0, T, sample.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(ds->dataPath()), std::string::npos);
  EXPECT_NE(st.message().find("has 50 tokens"), std::string::npos)
      << st.message();
  std::vector<int64_t> whole(T);
  ASSERT_TRUE(gptSample(*ds, 3, T - 1, whole.data()).ok());
  EXPECT_EQ(whole.front(), 0); // T - S = 1: every sample is the stream
  EXPECT_EQ(whole.back(), T - 1);
}

/// A one-program artifact with "tokens" and "labels" [S, b] i32 inputs of
/// vocabulary `vocab` (and an empty microbatch function).
ArtifactDesc tokenArtifact(int64_t S, int64_t b, int64_t microbatches, int dp,
                           int64_t vocab) {
  ArtifactDesc a;
  a.worldSize = dp;
  a.mesh = {{"tp", 1}, {"dp", dp}};
  std::vector<int> all;
  for (int r = 0; r < dp; ++r) {
    all.push_back(r);
    a.groups.push_back({"tp", {r}});
  }
  a.groups.push_back({"dp", all});
  a.microBatch = b;
  a.numMicrobatches = microbatches;
  a.globalBatch = b * microbatches * dp;
  ProgramDesc p;
  int tokens = p.add("tokens", fb::BufferKind::Input, {S, b}, fb::DType::I32);
  int labels = p.add("labels", fb::BufferKind::Input, {S, b}, fb::DType::I32);
  InputDesc ti{"tokens", tokens, 0, vocab};
  InputDesc li{"labels", labels, 0, vocab};
  p.inputs = {ti, li};
  p.function("microbatch");
  a.programs.push_back(std::move(p));
  return a;
}

std::shared_ptr<const LoadedArtifact> load(const ArtifactDesc &desc) {
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "lm.tsr");
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  return loaded.ok() ? *loaded : nullptr;
}

/// Fills input `name` with generateInput.
std::vector<int32_t> fill(const LoadedArtifact &art, const std::string &name,
                          const DataLayout &layout, int64_t it, int64_t m) {
  const fb::Program &p = *art.root()->programs()->Get(0);
  for (const fb::InputSpec *spec : *p.inputs())
    if (spec->name()->str() == name) {
      std::vector<uint8_t> bytes;
      Status st = generateInput(p, *spec, layout, it, m, art.name(), bytes);
      EXPECT_TRUE(st.ok()) << st.toString();
      std::vector<int32_t> out(bytes.size() / 4);
      std::memcpy(out.data(), bytes.data(), bytes.size());
      return out;
    }
  ADD_FAILURE() << "no input " << name;
  return {};
}

TEST_F(IndexedDatasetTest, TokensAndLabelsAreSequenceMajorShiftedSamples) {
  const int64_t T = 200, S = 5, b = 3;
  auto ds = open(iotaDataset("iota", T));
  ASSERT_TRUE(ds);
  auto art = load(tokenArtifact(S, b, 2, 1, 1000));
  ASSERT_TRUE(art);
  DataLayout layout;
  layout.globalBatch = b * 2;
  layout.microBatch = b;
  layout.dataset = ds;
  for (int64_t it : {1, 3})
    for (int64_t m : {0, 1}) {
      std::vector<int32_t> tokens = fill(*art, "tokens", layout, it, m);
      std::vector<int32_t> labels = fill(*art, "labels", layout, it, m);
      ASSERT_EQ(tokens.size(), size_t(S * b));
      for (int64_t i = 0; i < b; ++i) {
        int64_t g = (it - 1) * 6 + m * b + i;
        int64_t start = (g * S) % (T - S);
        for (int64_t s = 0; s < S; ++s) {
          EXPECT_EQ(tokens[size_t(s * b + i)], start + s);
          EXPECT_EQ(labels[size_t(s * b + i)], start + s + 1);
        }
      }
    }
  // Without a dataset: a clear error pointing at --data.
  layout.dataset.reset();
  const fb::Program &p = *art->root()->programs()->Get(0);
  std::vector<uint8_t> bytes;
  Status st =
      generateInput(p, *p.inputs()->Get(0), layout, 1, 0, art->name(), bytes);
  EXPECT_EQ(st.getCode(), StatusCode::FailedPrecondition);
  EXPECT_NE(st.message().find("--data"), std::string::npos) << st.message();
  EXPECT_TRUE(artifactNeedsTokenData(*art->root()));
  EXPECT_FALSE(
      artifactNeedsTokenData(*load(softmaxRegression(4, 3, 2, 1, 1))->root()));
}

/// The global batch of iteration `it` as seen by every rank of a layout
/// with micro batch b, M microbatches and D data-parallel ranks: sample g
/// -> its token column.
std::map<int64_t, std::vector<int32_t>>
globalBatch(const std::shared_ptr<const IndexedDataset> &ds, int64_t S,
            int64_t b, int64_t M, int D, int64_t it) {
  std::map<int64_t, std::vector<int32_t>> batch;
  auto art = load(tokenArtifact(S, b, M, D, 1000));
  for (int r = 0; r < D; ++r) {
    DataLayout layout;
    layout.globalBatch = b * M * D;
    layout.microBatch = b;
    layout.dpIndex = r;
    layout.dpSize = D;
    layout.dataset = ds;
    for (int64_t m = 0; m < M; ++m) {
      std::vector<int32_t> tokens = fill(*art, "tokens", layout, it, m);
      for (int64_t i = 0; i < b; ++i) {
        std::vector<int32_t> column;
        for (int64_t s = 0; s < S; ++s)
          column.push_back(tokens[size_t(s * b + i)]);
        int64_t g = globalSampleIndex(layout, it, m, i);
        EXPECT_TRUE(batch.emplace(g, column).second) << "duplicate g " << g;
      }
    }
  }
  return batch;
}

TEST_F(IndexedDatasetTest, SameGlobalBatchForEveryDataLayout) {
  // Real text: the shipped-style byte dataset of a short passage.
  PreprocessOptions o;
  o.outputPrefix = dir + "/text";
  o.appendEod = true;
  auto r = preprocessText(
      "It is a truth universally acknowledged, that a single man in "
      "possession\nof a good fortune, must be in want of a wife.\n\nHowever "
      "little known the feelings or views of such a man may be on his first\n"
      "entering a neighbourhood, this truth is so well fixed in the minds\n",
      o);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  auto ds = open(r->prefix);
  ASSERT_TRUE(ds);
  const int64_t S = 16, G = 8;
  for (int64_t it : {1, 2, 7}) {
    auto dp1 = globalBatch(ds, S, 4, 2, 1, it);  // b 4 x M 2 x dp 1
    auto dp2 = globalBatch(ds, S, 4, 1, 2, it);  // b 4 x M 1 x dp 2
    auto dp2b = globalBatch(ds, S, 2, 2, 2, it); // b 2 x M 2 x dp 2
    auto dp4 = globalBatch(ds, S, 1, 2, 4, it);  // b 1 x M 2 x dp 4
    ASSERT_EQ(dp1.size(), size_t(G));
    EXPECT_EQ(dp1.begin()->first, (it - 1) * G);
    EXPECT_EQ(dp1.rbegin()->first, it * G - 1);
    EXPECT_EQ(dp1, dp2);
    EXPECT_EQ(dp1, dp2b);
    EXPECT_EQ(dp1, dp4);
  }
}

TEST_F(IndexedDatasetTest, OutOfVocabularyIsAnError) {
  // Byte data (EOD 256) against a model with a 200-token vocabulary.
  std::string prefix =
      writeDataset("oov", {{'a', 'b', 256}, {'c', 'd', 'e', 256}});
  auto ds = open(prefix);
  ASSERT_TRUE(ds);
  EXPECT_TRUE(ds->checkVocabulary(257).ok());
  Status st = ds->checkVocabulary(200);
  ASSERT_FALSE(st.ok());
  for (std::string part :
       {prefix + ".bin", std::string("token 2 "), std::string("has id 256"),
        std::string("vocab size 200")})
    EXPECT_NE(st.message().find(part), std::string::npos)
        << st.message() << "\n  (expected '" << part << "')";
  st = ds->checkVocabulary(98); // 'b' = 98 is the first id >= 98
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token 1 (sequence 0 offset 1) has id 98"),
            std::string::npos)
      << st.message();
  // In the second document: the stream position counts across documents.
  IndexedDatasetBuilder b2(TokenDType::UInt16);
  ASSERT_TRUE(b2.addDocument({1, 2, 3}).ok());
  ASSERT_TRUE(b2.addDocument({4, 500, 6}).ok());
  ASSERT_TRUE(b2.write(dir + "/oov2").ok());
  auto ds2 = open(dir + "/oov2");
  ASSERT_TRUE(ds2);
  st = ds2->checkVocabulary(257);
  EXPECT_NE(st.message().find("token 4 (sequence 1 offset 1) has id 500"),
            std::string::npos)
      << st.message();

  // The executor refuses the dataset for the model up front.
  auto art = load(tokenArtifact(2, 1, 1, 1, 200));
  ASSERT_TRUE(art);
  auto backend = BackendRegistry::global().create("cpu", {});
  ASSERT_TRUE(backend.ok());
  ExecutorOptions eo;
  eo.dataset = ds;
  auto ex =
      Executor::create(art, std::move(*backend), CommunicatorSet(), 0, eo);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("vocab size 200"), std::string::npos)
      << ex.status().toString();
  // And generateInput checks every id it hands out, too.
  DataLayout layout;
  layout.dataset = ds;
  const fb::Program &p = *art->root()->programs()->Get(0);
  std::vector<uint8_t> bytes;
  st = generateInput(p, *p.inputs()->Get(0), layout, 1, 0, art->name(),
                     bytes); // g = 0: tokens 'a', 'b' fine
  EXPECT_TRUE(st.ok()) << st.toString();
  st = generateInput(p, *p.inputs()->Get(1), layout, 1, 0, art->name(),
                     bytes); // labels 'b', 256
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocab size 200"), std::string::npos);
}

TEST_F(IndexedDatasetTest, ExecutorFillsTokenInputs) {
  auto ds = open(iotaDataset("iota", 100));
  ASSERT_TRUE(ds);
  auto art = load(tokenArtifact(4, 2, 1, 1, 100));
  ASSERT_TRUE(art);
  auto backend = BackendRegistry::global().create("cpu", {});
  ASSERT_TRUE(backend.ok());
  ExecutorOptions eo;
  eo.dataset = ds;
  auto ex =
      Executor::create(art, std::move(*backend), CommunicatorSet(), 0, eo);
  ASSERT_TRUE(ex.ok()) << ex.status().toString();
  ASSERT_TRUE((*ex)->fillInputs(2, 0).ok());
  auto tokens = (*ex)->readBuffer("tokens");
  auto labels = (*ex)->readBuffer("labels");
  ASSERT_TRUE(tokens.ok() && labels.ok());
  std::vector<int32_t> t(8), l(8);
  std::memcpy(t.data(), tokens->data(), 32);
  std::memcpy(l.data(), labels->data(), 32);
  // G = 2: iteration 2 holds g = 2, 3 -> starts 8, 12 (mod 96).
  EXPECT_EQ(t, (std::vector<int32_t>{8, 12, 9, 13, 10, 14, 11, 15}));
  EXPECT_EQ(l, (std::vector<int32_t>{9, 13, 10, 14, 11, 15, 12, 16}));

  // Too short a dataset for S = 4 is refused at create.
  auto tiny = open(writeDataset("tiny", {{1, 2, 3, 4}}));
  backend = BackendRegistry::global().create("cpu", {});
  eo.dataset = tiny;
  ex = Executor::create(art, std::move(*backend), CommunicatorSet(), 0, eo);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("has 4 tokens"), std::string::npos)
      << ex.status().toString();
}

//===----------------------------------------------------------------------===//
// tessera-run --data
//===----------------------------------------------------------------------===//

TEST(LaunchDataTest, ParsesDataOption) {
  std::vector<std::string> args = {"tessera-run", "m.tsr",  "--steps",
                                   "1",           "--data", "/tmp/corpus"};
  std::vector<char *> argv;
  for (auto &a : args)
    argv.push_back(a.data());
  auto o = parseLaunchOptions(int(argv.size()), argv.data());
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_EQ(o->dataPrefix, "/tmp/corpus");
  args = {"tessera-run", "m.tsr", "--steps", "1", "--data="};
  argv.clear();
  for (auto &a : args)
    argv.push_back(a.data());
  EXPECT_FALSE(parseLaunchOptions(int(argv.size()), argv.data()).ok());
}

TEST_F(IndexedDatasetTest, TesseraRunData) {
  std::string model = dir + "/lm.tsr";
  writeRaw(model, buildFile(buildPayload(tokenArtifact(4, 2, 1, 1, 257))));
  std::string run =
      std::string(TESSERA_RUN_PATH) + " -n 1 " + model + " --steps 2";
  // No --data: a usage error before MPI starts.
  ToolResult missing = runCommand(run);
  EXPECT_EQ(missing.exitCode, 1);
  EXPECT_NE(missing.output.find("--data PREFIX is required"), std::string::npos)
      << missing.output;
  EXPECT_NE(missing.output.find("usage:"), std::string::npos);
  EXPECT_EQ(missing.output.find("mpirun"), std::string::npos);
  // A dataset that does not exist.
  ToolResult none = runCommand(run + " --data " + dir + "/none");
  EXPECT_EQ(none.exitCode, 1);
  EXPECT_NE(none.output.find(dir + "/none_text_document.idx"),
            std::string::npos)
      << none.output;
  // Out of vocabulary for a 100-token model: refused before launch.
  PreprocessOptions o;
  o.outputPrefix = dir + "/corpus";
  o.appendEod = true;
  ASSERT_TRUE(preprocessText("Tessera reads Megatron data.\n\nTwo.\n", o).ok());
  std::string small = dir + "/small.tsr";
  writeRaw(small, buildFile(buildPayload(tokenArtifact(4, 2, 1, 1, 100))));
  ToolResult oov = runCommand(std::string(TESSERA_RUN_PATH) + " -n 1 " + small +
                              " --steps 1 --data " + dir + "/corpus");
  EXPECT_EQ(oov.exitCode, 1);
  EXPECT_NE(oov.output.find(dir + "/corpus_text_document.bin: token 1 "),
            std::string::npos)
      << oov.output;
  EXPECT_NE(oov.output.find("vocab size 100"), std::string::npos);
  // Both prefix spellings run.
  for (std::string prefix : {dir + "/corpus", dir + "/corpus_text_document"}) {
    ToolResult ok = runCommand(run + " --data " + prefix);
    EXPECT_EQ(ok.exitCode, 0) << ok.output;
    EXPECT_NE(ok.output.find("data " + dir +
                             "/corpus_text_document: 2 "
                             "documents"),
              std::string::npos)
        << ok.output;
  }
}

} // namespace
