//===- Data.cpp - Synthetic data and parameter initialisation -------------===//

#include "tessera/rt/Data.h"
#include "tessera/rt/IndexedDataset.h"
#include "tessera/rt/Rng.h"
#include "tessera/rt/math/Philox.h"
#include "tessera/rt/math/SequenceLayout.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tessera::rt {

int64_t globalSampleIndex(const DataLayout &l, int64_t iteration,
                          int64_t microbatch, int64_t i) {
  return math::globalSample(l.globalBatch, l.microBatch, l.dpSize, l.dpIndex,
                            iteration, microbatch, i);
}

int32_t syntheticLabel(uint64_t seed, int64_t g, int64_t numClasses) {
  double u = uniform(seed, "data.labels", uint64_t(g));
  int64_t c = int64_t(std::floor(u * double(numClasses)));
  return int32_t(std::min<int64_t>(numClasses - 1, c));
}

void syntheticFeatures(uint64_t seed, int64_t g, int32_t label,
                       int64_t numFeatures, float *out) {
  // Class centres at distance ~2 from the origin in unit-variance noise: a
  // task that is learnable but not solved in a handful of steps.
  PhiloxStream centres(seed, "data.centres");
  PhiloxStream noise(seed, "data.noise");
  double scale = 2.0 / std::sqrt(double(std::max<int64_t>(numFeatures, 1)));
  for (int64_t j = 0; j < numFeatures; ++j)
    out[j] = float(scale * centres.normal(uint64_t(label * numFeatures + j)) +
                   noise.normal(uint64_t(g * numFeatures + j)));
}

static int64_t numClassesOf(const fb::Program &program,
                            const fb::InputSpec &spec) {
  if (spec.num_classes() > 0)
    return spec.num_classes();
  if (program.inputs())
    for (const fb::InputSpec *other : *program.inputs())
      if (other->num_classes() > 0)
        return other->num_classes();
  return 0;
}

bool isTokenInput(const fb::InputSpec &spec) {
  if (spec.vocab_size() <= 0 || !spec.name())
    return false;
  std::string_view name = spec.name()->string_view();
  return name == "tokens" || name == "labels";
}

bool artifactNeedsTokenData(const fb::Artifact &artifact) {
  if (artifact.programs())
    for (const fb::Program *p : *artifact.programs())
      if (p->inputs())
        for (const fb::InputSpec *spec : *p->inputs())
          if (isTokenInput(*spec))
            return true;
  return false;
}

/// True for a token input holding a cp rank's share of each sequence.
static bool isContextParallel(const fb::Buffer &buffer) {
  return buffer.shard_axis() && buffer.shard_axis()->str() == "cp";
}

/// Checks the buffer of token input `spec`: i32 [S, b], b = microBatch (a
/// cp rank's share of a sequence of global_shape[0] positions under context
/// parallelism). Returns the whole sequence's length.
static StatusOr<int64_t> tokenSequenceLength(const fb::Program &program,
                                             const fb::InputSpec &spec,
                                             int64_t microBatch,
                                             const std::string &fileName) {
  const fb::Buffer *buffer = program.buffers()->Get(spec.buffer());
  const auto *shape = buffer->shape();
  auto error = [&](auto &&...args) {
    return invalidArgument(fileName, ": input '", spec.name()->str(),
                           "' (buffer ", shapeToString(shape), "): ", args...);
  };
  if (buffer->dtype() != fb::DType::I32 || !shape || shape->size() != 2 ||
      shape->Get(0) < 1)
    return error("token inputs must be i32 [S, b] buffers (sequence-major)");
  if (shape->Get(1) != microBatch)
    return error("second dimension ", shape->Get(1), " != micro batch size ",
                 microBatch);
  if (spec.vocab_size() > int64_t(INT32_MAX) + 1)
    return error("vocab_size ", spec.vocab_size(), " does not fit i32 ids");
  if (isContextParallel(*buffer)) {
    const auto *global = buffer->global_shape();
    if (buffer->shard_dim() != 0 || !global || global->size() != 2 ||
        global->Get(0) < shape->Get(0) || global->Get(0) % shape->Get(0) ||
        shape->Get(0) % 2)
      return error("a token input split over 'cp' must be the rank's two "
                   "equal chunks of dim 0 of its global shape");
    return global->Get(0);
  }
  return shape->Get(0);
}

Status checkTokenInputs(const fb::Program &program, int64_t microBatch,
                        const IndexedDataset &dataset,
                        const std::string &fileName) {
  if (!program.inputs())
    return Status();
  for (const fb::InputSpec *spec : *program.inputs()) {
    if (!isTokenInput(*spec))
      continue;
    TESSERA_ASSIGN_OR_RETURN(
        int64_t seqLength,
        tokenSequenceLength(program, *spec, microBatch, fileName));
    TESSERA_RETURN_IF_ERROR(dataset.checkVocabulary(spec->vocab_size()));
    if (dataset.numTokens() <= seqLength)
      return invalidArgument(
          dataset.dataPath(), ": the dataset has ", dataset.numTokens(),
          " tokens, but input '", spec->name()->str(), "' of ", fileName,
          " needs samples of sequence length ", seqLength, " + 1 tokens");
  }
  return Status();
}

/// Fills token input `spec` for one microbatch: tokens[s][i] = sample[s],
/// labels[s][i] = sample[s + 1] of sample g(i), element (s, i) at s*b + i.
static Status generateTokenInput(const fb::Program &program,
                                 const fb::InputSpec &spec,
                                 const DataLayout &layout, int64_t iteration,
                                 int64_t microbatch,
                                 const std::string &fileName,
                                 std::vector<uint8_t> &out) {
  std::string name = spec.name()->str();
  if (!layout.dataset && !layout.mockData)
    return failedPrecondition(
        fileName, ": input '", name, "' (vocab size ", spec.vocab_size(),
        ") needs a token dataset, but none was given (tessera-run --data "
        "PREFIX, made with tessera-preprocess, or --mock-data)");
  TESSERA_ASSIGN_OR_RETURN(
      int64_t seqLength,
      tokenSequenceLength(program, spec, layout.microBatch, fileName));
  const fb::Buffer &buffer = *program.buffers()->Get(spec.buffer());
  // Row s of the buffer holds global position pos(s): the identity, or
  // this cp rank's two chunks (Megatron's get_batch_on_this_cp_rank).
  const int64_t rows = buffer.shape()->Get(0);
  const bool cp = isContextParallel(buffer);
  if (cp && layout.cpSize * rows != seqLength)
    return invalidArgument(fileName, ": input '", name, "' holds ", rows,
                           " of ", seqLength, " positions, but the cp group has ",
                           layout.cpSize, " ranks");
  auto pos = [&](int64_t s) {
    return cp ? math::cpGlobalPosition(s, rows, layout.cpIndex, layout.cpSize)
              : s;
  };
  int64_t b = layout.microBatch;
  int64_t shift = name == "labels" ? 1 : 0;
  out.assign(size_t(rows * b) * sizeof(int32_t), 0);
  auto *dst = reinterpret_cast<int32_t *>(out.data());
  if (!layout.dataset) {
    // Mock data: S + 1 tokens per sample, uniform over the vocabulary.
    PhiloxStream stream(layout.seed, "mock-data");
    const int64_t vocab = spec.vocab_size();
    for (int64_t i = 0; i < b; ++i) {
      uint64_t g = uint64_t(globalSampleIndex(layout, iteration, microbatch, i));
      for (int64_t s = 0; s < rows; ++s) {
        uint64_t index = g * uint64_t(seqLength + 1) + uint64_t(pos(s) + shift);
        int64_t id = int64_t(stream.uniform(index) * double(vocab));
        dst[s * b + i] = int32_t(std::min(id, vocab - 1));
      }
    }
    return Status();
  }
  const IndexedDataset &ds = *layout.dataset;
  std::vector<int64_t> sample(size_t(seqLength) + 1);
  for (int64_t i = 0; i < b; ++i) {
    int64_t g = globalSampleIndex(layout, iteration, microbatch, i);
    TESSERA_RETURN_IF_ERROR(gptSample(ds, g, seqLength, sample.data()));
    for (int64_t s = 0; s < rows; ++s) {
      int64_t id = sample[size_t(pos(s) + shift)];
      if (id >= spec.vocab_size())
        return ds.checkVocabulary(spec.vocab_size());
      dst[s * b + i] = int32_t(id);
    }
  }
  return Status();
}

Status generateInput(const fb::Program &program, const fb::InputSpec &spec,
                     const DataLayout &layout, int64_t iteration,
                     int64_t microbatch, const std::string &fileName,
                     std::vector<uint8_t> &out) {
  if (isTokenInput(spec))
    return generateTokenInput(program, spec, layout, iteration, microbatch,
                              fileName, out);
  std::string name = spec.name() ? spec.name()->str() : "";
  const fb::Buffer *buffer = program.buffers()->Get(spec.buffer());
  const auto *shape = buffer->shape();
  int64_t rank = shape ? int64_t(shape->size()) : 0;
  auto error = [&](auto &&...args) {
    return invalidArgument(fileName, ": input '", name, "' (buffer ",
                           shapeToString(shape), "): ", args...);
  };
  if (name == "tokens")
    return error("token inputs need vocab_size > 0");
  int64_t numClasses = numClassesOf(program, spec);
  if (numClasses <= 0)
    return error("no num_classes given for the synthetic labels");
  int64_t b = rank >= 1 ? shape->Get(0) : 0;
  if (b != layout.microBatch)
    return error("leading dimension ", b, " != micro batch size ",
                 layout.microBatch);
  out.assign(size_t(numElements(shape) * dtypeSize(buffer->dtype())), 0);
  if (name == "labels") {
    if (buffer->dtype() != fb::DType::I32 || rank != 1)
      return error("labels must be an i32 [b] buffer");
    auto *dst = reinterpret_cast<int32_t *>(out.data());
    for (int64_t i = 0; i < b; ++i)
      dst[i] = syntheticLabel(
          layout.seed, globalSampleIndex(layout, iteration, microbatch, i),
          numClasses);
    return Status();
  }
  if (name == "features") {
    if (buffer->dtype() != fb::DType::F32 || rank != 2)
      return error("features must be an f32 [b, F] buffer");
    int64_t f = shape->Get(1);
    auto *dst = reinterpret_cast<float *>(out.data());
    for (int64_t i = 0; i < b; ++i) {
      int64_t g = globalSampleIndex(layout, iteration, microbatch, i);
      syntheticFeatures(layout.seed, g,
                        syntheticLabel(layout.seed, g, numClasses), f,
                        dst + i * f);
    }
    return Status();
  }
  return error("unknown synthetic input (expected 'features' or 'labels')");
}

/// Calls fn(g, n, k) for each run of the block's elements that is
/// contiguous in both the global tensor (from row-major index g) and the
/// block (from index k), n elements long, in order.
template <typename Fn>
static void forEachBlockRun(const std::vector<int64_t> &global,
                            const TensorBlock &block, Fn &&fn) {
  const size_t rank = global.size();
  if (rank == 0) {
    fn(int64_t(0), int64_t(1), int64_t(0));
    return;
  }
  // The trailing dims the block covers whole merge into the run.
  size_t inner = rank;
  int64_t run = 1;
  while (inner > 0 && block.extent[inner - 1] == global[inner - 1]) {
    --inner;
    run *= global[inner];
  }
  if (inner == 0) {
    fn(int64_t(0), run, int64_t(0));
    return;
  }
  // Dim inner - 1 is partial: runs of extent[inner - 1] * run elements,
  // one per index of the outer dims.
  const size_t last = inner - 1;
  const int64_t length = block.extent[last] * run;
  std::vector<int64_t> at(last, 0); // odometer over dims [0, last)
  for (int64_t k = 0;; k += length) {
    int64_t g = 0;
    for (size_t d = 0; d < last; ++d)
      g = g * global[d] + block.lo[d] + at[d];
    g = (g * global[last] + block.lo[last]) * run;
    fn(g, length, k);
    size_t d = last;
    while (d > 0 && ++at[d - 1] == block.extent[d - 1])
      at[--d] = 0;
    if (d == 0)
      return;
  }
}

/// The block of shard `index` of `count` along `dim` (-1: the whole).
static TensorBlock shardBlock(const std::vector<int64_t> &global, int dim,
                              int index, int count) {
  TensorBlock block{std::vector<int64_t>(global.size(), 0), global};
  if (dim >= 0 && count > 1) {
    block.extent[size_t(dim)] = global[size_t(dim)] / count;
    block.lo[size_t(dim)] = block.extent[size_t(dim)] * index;
  }
  return block;
}

Status initParameterShard(fb::InitKind init, float scale, uint64_t seed,
                          std::string_view name,
                          const std::vector<int64_t> &globalShape, int shardDim,
                          int shardIndex, int shardCount, float *out) {
  int rank = int(globalShape.size());
  if (shardDim >= rank)
    return invalidArgument("shard dim ", shardDim, " out of range for rank ",
                           rank);
  if (shardDim >= 0 &&
      (shardCount <= 0 || shardIndex < 0 || shardIndex >= shardCount))
    return invalidArgument("bad shard ", shardIndex, " of ", shardCount);
  if (shardDim >= 0 && globalShape[size_t(shardDim)] % shardCount != 0)
    return invalidArgument("dimension ", globalShape[size_t(shardDim)],
                           " is not divisible by ", shardCount, " shards");
  return initParameterBlock(init, scale, seed, name, globalShape,
                            shardBlock(globalShape, shardDim, shardIndex,
                                       shardCount),
                            out);
}

Status initParameterBlock(fb::InitKind init, float scale, uint64_t seed,
                          std::string_view name,
                          const std::vector<int64_t> &globalShape,
                          const TensorBlock &block, float *out) {
  if (init != fb::InitKind::Zeros && init != fb::InitKind::Ones &&
      init != fb::InitKind::Normal && init != fb::InitKind::Uniform)
    return invalidArgument("init kind ", fb::EnumNameInitKind(init),
                           " of '", name, "' has no generator (data-initialised "
                           "parameters are read by initShardFromData)");
  PhiloxStream stream(seed, name);
  forEachBlockRun(globalShape, block, [&](int64_t g0, int64_t n, int64_t k0) {
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t g = uint64_t(g0 + i);
      float &v = out[k0 + i];
      switch (init) {
      case fb::InitKind::Zeros:
        v = 0.0f;
        break;
      case fb::InitKind::Ones:
        v = 1.0f;
        break;
      case fb::InitKind::Normal:
        v = float(double(scale) * stream.normal(g));
        break;
      case fb::InitKind::Uniform:
        v = float(double(scale) * (2.0 * stream.uniform(g) - 1.0));
        break;
      default: // rejected above
        break;
      }
    }
  });
  return Status();
}

namespace {

/// A read-only mapping of bytes [offset, offset + size) of a file.
class MappedRange {
public:
  ~MappedRange() {
    if (base != MAP_FAILED && base)
      ::munmap(base, length);
  }
  Status map(const std::string &path, int64_t offset, int64_t size) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return invalidArgument("cannot open '", path, "': ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return invalidArgument("cannot stat '", path, "': ", std::strerror(err));
    }
    if (offset < 0 || size < 0 || offset > int64_t(st.st_size) ||
        size > int64_t(st.st_size) - offset) {
      ::close(fd);
      return invalidArgument("'", path, "' holds ", int64_t(st.st_size),
                             " bytes; the parameter needs ", size,
                             " bytes from byte ", offset);
    }
    int64_t page = ::sysconf(_SC_PAGESIZE);
    int64_t start = offset / page * page;
    length = size_t(offset + size - start);
    base = size ? ::mmap(nullptr, length, PROT_READ, MAP_PRIVATE, fd, start)
                : nullptr;
    ::close(fd);
    if (base == MAP_FAILED)
      return invalidArgument("cannot map '", path, "': ", std::strerror(errno));
    bytes = static_cast<const uint8_t *>(base) + (offset - start);
    return Status();
  }
  const uint8_t *bytes = nullptr;

private:
  void *base = nullptr;
  size_t length = 0;
};

} // namespace

StatusOr<std::string> resolveDataFile(const std::string &file,
                                      const std::string &dataDir,
                                      const std::string &artifactPath) {
  namespace fs = std::filesystem;
  fs::path rel(file);
  if (file.empty() || rel.is_absolute())
    return invalidArgument("data file '", file,
                           "' is not a path relative to its data directory");
  for (const fs::path &part : rel)
    if (part == "..")
      return invalidArgument("data file '", file,
                             "' leaves its data directory ('..')");
  // The directory recorded at compile time, else the artifact's own (an
  // artifact moved with its data beside it).
  std::error_code ec;
  fs::path base;
  if (!dataDir.empty() && fs::is_directory(dataDir, ec) &&
      fs::exists(fs::path(dataDir) / rel, ec))
    base = dataDir;
  else
    base = fs::absolute(fs::path(artifactPath), ec).parent_path();
  fs::path realBase = fs::canonical(base, ec);
  fs::path real = ec ? fs::path() : fs::canonical(realBase / rel, ec);
  if (ec)
    return notFound("cannot find the data file '", file, "' in '",
                    dataDir.empty() ? std::string("(none)") : dataDir,
                    "' nor next to the artifact in '", base.string(), "'");
  auto [b, r] =
      std::mismatch(realBase.begin(), realBase.end(), real.begin(), real.end());
  if (b != realBase.end())
    return invalidArgument("data file '", file, "' resolves to '",
                           real.string(), "', outside its directory '",
                           realBase.string(), "'");
  if (!fs::is_regular_file(real, ec))
    return invalidArgument("data file '", real.string(),
                           "' is not a regular file");
  return real.string();
}

template <typename ErrorFn>
static Status initShardFromData(const fb::Buffer &buffer,
                                const std::vector<int64_t> &global,
                                const TensorBlock &block,
                                const std::string &fileName, float *out,
                                ErrorFn &&error) {
  // The data is the global tensor, row major, with possibly fewer rows in
  // dim 0 (a padded vocabulary): element g of the global tensor is element g
  // of the data while g < rows * rowElements, else zero.
  if (!buffer.data_shape() || buffer.data_shape()->size() != global.size() ||
      global.empty())
    return error("init Data needs data_shape of the global shape's rank");
  int64_t rowElements = 1;
  for (size_t d = 1; d < global.size(); ++d) {
    if (buffer.data_shape()->Get(d) != global[d])
      return error("data_shape ", shapeToString(buffer.data_shape()),
                   " differs from global shape ",
                   shapeToString(buffer.global_shape()), " beyond dim 0");
    rowElements *= global[d];
  }
  int64_t rows = buffer.data_shape()->Get(0);
  if (rows < 0 || rows > global[0])
    return error("data_shape ", shapeToString(buffer.data_shape()),
                 " has more rows than the global shape");
  int64_t limit = rows * rowElements;
  const uint8_t *src = nullptr;
  MappedRange mapped;
  if (buffer.data_file() && buffer.data_file()->size()) {
    auto resolved =
        resolveDataFile(buffer.data_file()->str(),
                        buffer.data_dir() ? buffer.data_dir()->str() : "",
                        fileName);
    if (!resolved.ok())
      return error(resolved.status().message());
    std::string path = *resolved;
    // Each rank maps the file and touches only its shard's pages.
    Status st = mapped.map(path, buffer.data_offset(), limit * 4);
    if (!st.ok())
      return error(st.message());
    src = mapped.bytes;
  } else {
    if (!buffer.data() || int64_t(buffer.data()->size()) != limit * 4)
      return error("inline data holds ",
                   buffer.data() ? int64_t(buffer.data()->size()) : 0,
                   " bytes; data_shape ", shapeToString(buffer.data_shape()),
                   " needs ", limit * 4);
    src = buffer.data()->data();
  }
  // Runs of contiguous global elements making up the shard, in order.
  auto copyRun = [&](int64_t g, int64_t n, float *dst) {
    int64_t valid = std::clamp<int64_t>(limit - g, 0, n);
    if (valid)
      std::memcpy(dst, src + g * 4, size_t(valid) * 4);
    std::fill(dst + valid, dst + n, 0.0f);
  };
  forEachBlockRun(global, block, [&](int64_t g, int64_t n, int64_t k) {
    copyRun(g, n, out + k);
  });
  return Status();
}

Status initParameterBuffer(const fb::Artifact &artifact,
                           const fb::Buffer &buffer, int rank, uint64_t seed,
                           const std::string &fileName, float *out) {
  std::string name = buffer.name() ? buffer.name()->str() : "";
  auto error = [&](auto &&...args) {
    return invalidArgument(fileName, ": parameter '", name, "': ", args...);
  };
  // 16-bit parameters get the same f32 values; the caller rounds them.
  if (!isFloatDType(buffer.dtype()))
    return error("only F32, BF16 and F16 parameters can be initialised, got ",
                 fb::EnumNameDType(buffer.dtype()));
  std::vector<int64_t> local, global;
  if (buffer.shape())
    local.assign(buffer.shape()->begin(), buffer.shape()->end());
  if (buffer.global_shape() && buffer.global_shape()->size())
    global.assign(buffer.global_shape()->begin(), buffer.global_shape()->end());
  else
    global = local;
  if (global.size() != local.size())
    return error("shape and global_shape have different ranks");
  // The block this rank holds: each split's shard of its dim.
  StatusOr<std::vector<ParameterSplit>> splits =
      parameterSplits(artifact, buffer, rank);
  if (!splits.ok())
    return error(splits.status().message());
  TensorBlock block{std::vector<int64_t>(global.size(), 0), global};
  for (const ParameterSplit &split : *splits) {
    const size_t d = size_t(split.dim);
    if (global[d] % split.count)
      return error("dim ", split.dim, " of global shape ",
                   shapeToString(buffer.global_shape()),
                   " does not split into ", split.count, " shards over '",
                   split.axis, "'");
    block.extent[d] = global[d] / split.count;
    block.lo[d] = block.extent[d] * split.index;
  }
  if (block.extent != local)
    return error("local shape ", shapeToString(buffer.shape()),
                 " is not this rank's shard of global shape ",
                 shapeToString(buffer.global_shape()));
  if (buffer.init() == fb::InitKind::Data)
    return initShardFromData(buffer, global, block, fileName, out, error);
  Status st = initParameterBlock(buffer.init(), buffer.init_scale(), seed,
                                 name, global, block, out);
  return st.ok() ? st : error(st.message());
}

} // namespace tessera::rt
