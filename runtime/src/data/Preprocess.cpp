//===- Preprocess.cpp - tessera-preprocess driver -------------------------===//
//
// Text file -> Megatron indexed dataset (see tessera/rt/Preprocess.h).
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/CommandLine.h"
#include "tessera/rt/Preprocess.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tessera::rt {

std::vector<int64_t> ByteTokenizer::tokenize(std::string_view text) {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (char c : text)
    ids.push_back(int64_t(static_cast<unsigned char>(c)));
  return ids;
}

std::string preprocessUsage(const char *argv0) {
  return std::string("usage: ") + argv0 +
         " --input FILE.txt --output-prefix PREFIX [--tokenizer byte]\n"
         "       [--append-eod] [--documents lines|paragraphs|file]\n"
         "\n"
         "Writes the Megatron-LM mmap indexed dataset PREFIX_text_document.bin"
         "\nand PREFIX_text_document.idx (one sequence per document).\n"
         "\n"
         "  --input FILE         UTF-8 (or any byte) text to tokenize\n"
         "  --output-prefix P    output prefix; its directory must exist\n"
         "  --tokenizer byte     byte-level: ids 0..255 are the bytes, EOD is "
         "256,\n"
         "                       vocabulary 257 (the only tokenizer)\n"
         "  --append-eod         end every document with the EOD token\n"
         "  --documents MODE     paragraphs (default; blank-line separated),\n"
         "                       lines (one per non-blank line) or file "
         "(one)\n";
}

StatusOr<PreprocessOptions> parsePreprocessOptions(int argc, char **argv) {
  PreprocessOptions o;
  ArgReader args(argc, argv);
  while (args.next()) {
    const std::string &arg = args.arg();
    auto next = [&] { return args.value(); };
    bool hasInline = args.hasInlineValue();
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--input") {
      TESSERA_ASSIGN_OR_RETURN(o.input, next());
      if (o.input.empty())
        return invalidArgument("empty --input path");
    } else if (arg == "--output-prefix") {
      TESSERA_ASSIGN_OR_RETURN(o.outputPrefix, next());
      if (o.outputPrefix.empty())
        return invalidArgument("empty --output-prefix");
    } else if (arg == "--tokenizer" || arg == "--tokenizer-type") {
      TESSERA_ASSIGN_OR_RETURN(o.tokenizer, next());
      if (o.tokenizer != "byte")
        return invalidArgument("unknown tokenizer '", o.tokenizer,
                               "' (supported: byte)");
    } else if (arg == "--append-eod") {
      if (hasInline)
        return invalidArgument("--append-eod takes no value");
      o.appendEod = true;
    } else if (arg == "--documents") {
      TESSERA_ASSIGN_OR_RETURN(std::string mode, next());
      if (mode == "lines")
        o.documents = DocumentMode::Lines;
      else if (mode == "paragraphs")
        o.documents = DocumentMode::Paragraphs;
      else if (mode == "file")
        o.documents = DocumentMode::File;
      else
        return invalidArgument("unknown --documents mode '", mode,
                               "' (expected lines, paragraphs or file)");
    } else if (!arg.empty() && arg[0] == '-') {
      return invalidArgument("unknown option '", args.raw(), "'");
    } else {
      return invalidArgument("unexpected argument '", arg,
                             "' (use --input FILE)");
    }
  }
  if (o.help)
    return o;
  if (o.input.empty())
    return invalidArgument("--input is required");
  if (o.outputPrefix.empty())
    return invalidArgument("--output-prefix is required");
  return o;
}

static bool isBlank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v')
      return false;
  return true;
}

std::vector<std::string_view> splitDocuments(std::string_view text,
                                             DocumentMode mode) {
  std::vector<std::string_view> docs;
  if (mode == DocumentMode::File) {
    if (!text.empty())
      docs.push_back(text);
    return docs;
  }
  // Walk the lines; a paragraph is [paraBegin, paraEnd) of the text.
  size_t pos = 0;
  size_t paraBegin = std::string_view::npos, paraEnd = 0;
  auto closeParagraph = [&]() {
    if (paraBegin != std::string_view::npos)
      docs.push_back(text.substr(paraBegin, paraEnd - paraBegin));
    paraBegin = std::string_view::npos;
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t lineEnd = nl == std::string_view::npos ? text.size() : nl;
    size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    size_t contentEnd = lineEnd;
    if (contentEnd > pos && text[contentEnd - 1] == '\r')
      --contentEnd;
    std::string_view line = text.substr(pos, contentEnd - pos);
    if (isBlank(line)) {
      if (mode == DocumentMode::Paragraphs)
        closeParagraph();
    } else if (mode == DocumentMode::Lines) {
      docs.push_back(line);
    } else {
      if (paraBegin == std::string_view::npos)
        paraBegin = pos;
      paraEnd = contentEnd;
    }
    pos = next;
  }
  if (mode == DocumentMode::Paragraphs)
    closeParagraph();
  return docs;
}

StatusOr<PreprocessResult> preprocessText(std::string_view text,
                                          const PreprocessOptions &options) {
  if (options.tokenizer != "byte")
    return invalidArgument("unknown tokenizer '", options.tokenizer, "'");
  PreprocessResult r;
  r.vocabSize = ByteTokenizer::kVocabSize;
  r.dtype = optimalTokenDType(r.vocabSize);
  r.prefix = options.outputPrefix + "_text_document";
  r.binPath = dataFilePath(r.prefix);
  r.idxPath = indexFilePath(r.prefix);
  IndexedDatasetBuilder builder(r.dtype);
  for (std::string_view doc : splitDocuments(text, options.documents)) {
    std::vector<int64_t> ids = ByteTokenizer::tokenize(doc);
    if (options.appendEod)
      ids.push_back(ByteTokenizer::kEod);
    if (ids.empty())
      continue;
    Status st = builder.addDocument(ids);
    if (!st.ok())
      return st.withContext(options.input);
  }
  r.documents = builder.numDocuments();
  r.tokens = builder.numTokens();
  std::string dir = ".";
  size_t slash = r.prefix.rfind('/');
  if (slash != std::string::npos)
    dir = slash == 0 ? "/" : r.prefix.substr(0, slash);
  TESSERA_RETURN_IF_ERROR(builder.write(r.prefix).withContext(
      "writing the dataset (does the directory '" + dir + "' exist?)"));
  return r;
}

StatusOr<PreprocessResult> preprocessFile(const PreprocessOptions &options) {
  std::ifstream in(options.input, std::ios::binary);
  if (!in)
    return notFound(options.input, ": cannot open: ", std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad())
    return dataLoss(options.input, ": read failed");
  std::string text = buf.str();
  return preprocessText(text, options);
}

std::string summarizePreprocess(const PreprocessResult &r,
                                const PreprocessOptions &options) {
  const char *mode = options.documents == DocumentMode::Lines  ? "lines"
                     : options.documents == DocumentMode::File ? "file"
                                                               : "paragraphs";
  std::ostringstream os;
  os << r.documents << " documents (" << mode << "), " << r.tokens
     << " tokens, vocab " << r.vocabSize << " (" << options.tokenizer
     << ", eod " << ByteTokenizer::kEod
     << (options.appendEod ? " appended" : " not appended") << "), dtype "
     << tokenDTypeName(r.dtype) << " -> " << r.binPath << ", " << r.idxPath;
  return os.str();
}

int runPreprocess(int argc, char **argv) {
  const char *argv0 = argc > 0 ? argv[0] : "tessera-preprocess";
  auto parsed = parsePreprocessOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "tessera-preprocess: error: %s\n%s",
                 parsed.status().message().c_str(),
                 preprocessUsage(argv0).c_str());
    return 1;
  }
  const PreprocessOptions &o = *parsed;
  if (o.help) {
    std::printf("%s", preprocessUsage(argv0).c_str());
    return 0;
  }
  auto result = preprocessFile(o);
  if (!result.ok()) {
    std::fprintf(stderr, "tessera-preprocess: error: %s\n",
                 result.status().message().c_str());
    return 1;
  }
  std::printf("tessera-preprocess: %s\n",
              summarizePreprocess(*result, o).c_str());
  return 0;
}

} // namespace tessera::rt
