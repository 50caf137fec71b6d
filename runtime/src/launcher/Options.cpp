//===- Options.cpp - tessera-run command line and its checks --------------===//
//
// The command line of tessera-run (parseLaunchOptions, launchUsage: usage
// errors name the flag), and what the options mean once the artifact is
// known, shared by the pre-launch checks and the ranks: the --data dataset
// checked against the programs' token inputs, the checkpoint load options
// of --load, whether a --load DIR without a checkpoint starts from scratch
// (the same DIR as --save), and the default --threads.
//
//===----------------------------------------------------------------------===//

#include "LauncherInternal.h"

#include "tessera/rt/CommandLine.h"
#include "tessera/rt/Data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace tessera::rt {

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

std::string launchUsage(const char *argv0) {
  return std::string("usage: ") + argv0 +
         " -n N FILE.tsr --steps S [--seed S] [--metrics FILE]\n"
         "       [--backend cpu] [--threads T] [--blas-core NAME] [--data PREFIX]\n"
         "       [--save DIR [--save-interval K]] [--load DIR "
         "[--no-load-optim]]\n"
         "       " +
         argv0 +
         " FILE.tsr --print-summary\n"
         "\n"
         "  -n N             number of MPI ranks (must equal the artifact's "
         "world size;\n"
         "                   default: the artifact's world size)\n"
         "  --steps S        train up to iteration S: the total iteration "
         "count, so a\n"
         "                   run resumed with --load at iteration K trains "
         "K+1..S\n"
         "                   (Megatron's --train-iters)\n"
         "  --seed S         seed of weight init and synthetic data "
         "(default 1234)\n"
         "  --data PREFIX    Megatron indexed dataset (PREFIX.bin/.idx or\n"
         "                   PREFIX_text_document.bin/.idx, e.g. from\n"
         "                   tessera-preprocess) for models with token "
         "inputs\n"
         "  --mock-data      synthetic tokens instead of --data (uniform over\n"
         "                   the vocabulary, seeded by --seed, the same\n"
         "                   samples in every layout)\n"
         "  --metrics FILE   write one JSON line per step\n"
         "  --save DIR       write checkpoints to DIR every --save-interval\n"
         "                   iterations and after the last one: one shard per "
         "rank in\n"
         "                   DIR/iter_NNNNNNN/rank_RRRRR.bin, then "
         "manifest.json,"
         "\n"
         "                   then DIR/latest; atomic (a crash leaves the "
         "previous"
         "\n"
         "                   checkpoint loadable); with --steps 0, the "
         "initial\n"
         "                   state as iteration 0\n"
         "  --save-interval K  save every K iterations (default: only at the "
         "end)\n"
         "  --load DIR       resume from the checkpoint DIR/latest names (or "
         "the"
         "\n"
         "                   iter_NNNNNNN directory DIR): parameters, "
         "optimizer "
         "state\n"
         "                   and iteration; resharded when tp/pp/dp differ. "
         "With"
         "\n"
         "                   --save DIR, the same DIR without a checkpoint yet "
         "starts\n"
         "                   from scratch\n"
         "  --no-load-optim  with --load: restore parameters and iteration "
         "only\n"
         "  --eval-iters N   evaluate N batches (the loss with the forward "
         "alone:\n"
         "                   no gradients, no update, dropout off; "
         "Megatron's\n"
         "                   evaluate) after the last iteration and every\n"
         "                   --eval-interval K iterations\n"
         "  --eval-data PREFIX  the validation set whose batches 1..N are "
         "scored\n"
         "                   (default: the --data batches after the current\n"
         "                   iteration, not yet trained on)\n"
         "  --eval-only      evaluate the --load'ed (or initial) model and "
         "train\n"
         "                   nothing (Megatron's --skip-train; --eval-iters\n"
         "                   default 1, no --steps)\n"
         "  --timeout S      seconds one instruction or checkpoint step may "
         "take\n"
         "                   before every rank stops with an error naming it\n"
         "                   (default 300, 0: off)\n"
         "  --trace FILE     write a Chrome/Perfetto trace of every rank's\n"
         "                   instructions (phases, compute, communication,\n"
         "                   pipeline p2p)\n"
         "  --profile        time every instruction; adds per-opcode seconds\n"
         "                   (kernel_time_s) to the metrics lines\n"
         "  --no-check-for-nan-in-loss\n"
         "                   keep training when a loss is NaN or inf (by\n"
         "                   default the run stops with an error naming the\n"
         "                   iteration, before saving anything of it)\n"
         "  --backend NAME   compute backend: cpu (default) or cuda (one GPU\n"
         "                   per rank: the rank's index on its node)\n"
         "  --tf32           let the cuda backend's fp32 GEMMs use TF32\n"
         "                   tensor cores (off by default: an fp32 run then\n"
         "                   matches the CPU's losses)\n"
         "  --threads T      BLAS threads per rank (default: cores / N)\n"
         "  --blas-core NAME OpenBLAS kernels of the cpu backend ranks\n"
         "                   (exported as OPENBLAS_CORETYPE), e.g.\n"
         "                   SkylakeX: AVX-512 GEMMs on a CPU newer than\n"
         "                   the installed OpenBLAS, which runs it on older\n"
         "                   kernels (default: OpenBLAS's choice; the\n"
         "                   banner names the kernels that run)\n"
         "  --print-summary  print the artifact manifest and exit\n";
}

static StatusOr<int64_t> parseInt(const std::string &flag,
                                  const std::string &text, int64_t min) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < min)
    return invalidArgument("invalid value '", text, "' for ", flag,
                           " (expected an integer >= ", min, ")");
  return int64_t(v);
}

StatusOr<LaunchOptions> parseLaunchOptions(int argc, char **argv) {
  LaunchOptions o;
  ArgReader args(argc, argv);
  while (args.next()) {
    const std::string &arg = args.arg();
    auto next = [&] { return args.value(); };
    bool hasInline = args.hasInlineValue();
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "-n" || arg == "--np") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t n, parseInt("-n", v, 1));
      if (n > INT_MAX)
        return invalidArgument("-n is too large");
      o.numRanks = int(n);
    } else if (arg == "--steps") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.steps, parseInt(arg, v, 0));
    } else if (arg == "--seed") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t s, parseInt(arg, v, 0));
      o.seed = uint64_t(s);
    } else if (arg == "--metrics") {
      TESSERA_ASSIGN_OR_RETURN(o.metricsPath, next());
      if (o.metricsPath.empty())
        return invalidArgument("empty --metrics path");
    } else if (arg == "--data") {
      TESSERA_ASSIGN_OR_RETURN(o.dataPrefix, next());
      if (o.dataPrefix.empty())
        return invalidArgument("empty --data prefix");
    } else if (arg == "--save") {
      TESSERA_ASSIGN_OR_RETURN(o.saveDir, next());
      if (o.saveDir.empty())
        return invalidArgument("empty --save directory");
    } else if (arg == "--save-interval") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.saveInterval, parseInt(arg, v, 1));
    } else if (arg == "--load") {
      TESSERA_ASSIGN_OR_RETURN(o.loadDir, next());
      if (o.loadDir.empty())
        return invalidArgument("empty --load directory");
    } else if (arg == "--no-load-optim") {
      if (hasInline)
        return invalidArgument("--no-load-optim takes no value");
      o.noLoadOptim = true;
    } else if (arg == "--eval-iters") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.evalIters, parseInt(arg, v, 0));
    } else if (arg == "--eval-interval") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(o.evalInterval, parseInt(arg, v, 1));
    } else if (arg == "--eval-data") {
      TESSERA_ASSIGN_OR_RETURN(o.evalDataPrefix, next());
      if (o.evalDataPrefix.empty())
        return invalidArgument("empty --eval-data prefix");
    } else if (arg == "--eval-only") {
      if (hasInline)
        return invalidArgument("--eval-only takes no value");
      o.evalOnly = true;
    } else if (arg == "--backend") {
      TESSERA_ASSIGN_OR_RETURN(o.backend, next());
    } else if (arg == "--tf32") {
      if (hasInline)
        return invalidArgument("--tf32 takes no value");
      o.allowTf32 = true;
    } else if (arg == "--threads") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      TESSERA_ASSIGN_OR_RETURN(int64_t t, parseInt(arg, v, 1));
      o.threads = int(std::min<int64_t>(t, 1024));
    } else if (arg == "--blas-core") {
      TESSERA_ASSIGN_OR_RETURN(o.blasCore, next());
      if (o.blasCore.empty())
        return invalidArgument("empty --blas-core name");
    } else if (arg == "--timeout") {
      TESSERA_ASSIGN_OR_RETURN(std::string v, next());
      char *end = nullptr;
      o.timeout = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || o.timeout < 0)
        return invalidArgument("--timeout needs a number of seconds >= 0, got '",
                               v, "'");
    } else if (arg == "--trace") {
      TESSERA_ASSIGN_OR_RETURN(o.tracePath, next());
      if (o.tracePath.empty())
        return invalidArgument("empty --trace path");
    } else if (arg == "--profile") {
      if (hasInline)
        return invalidArgument("--profile takes no value");
      o.profile = true;
    } else if (arg == "--mock-data") {
      if (hasInline)
        return invalidArgument("--mock-data takes no value");
      o.mockData = true;
    } else if (arg == "--no-check-for-nan-in-loss") {
      if (hasInline)
        return invalidArgument("--no-check-for-nan-in-loss takes no value");
      o.checkForNanInLoss = false;
    } else if (arg == "--print-summary") {
      if (hasInline)
        return invalidArgument("--print-summary takes no value");
      o.printSummary = true;
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      return invalidArgument("unknown option '", args.raw(), "'");
    } else {
      if (!o.artifactPath.empty())
        return invalidArgument("more than one artifact file given ('",
                               o.artifactPath, "' and '", arg, "')");
      o.artifactPath = arg;
    }
  }
  if (o.help)
    return o;
  if (o.artifactPath.empty())
    return invalidArgument("no artifact file given");
  if (o.evalOnly) {
    if (o.steps >= 0)
      return invalidArgument("--eval-only trains nothing: give --load DIR, not "
                             "--steps");
    if (!o.saveDir.empty())
      return invalidArgument("--eval-only saves nothing: drop --save");
    if (o.evalInterval > 0)
      return invalidArgument("--eval-interval is for training; --eval-only "
                             "evaluates once");
    if (o.evalIters < 0)
      o.evalIters = 1;
    if (o.evalIters == 0)
      return invalidArgument("--eval-only needs --eval-iters >= 1");
  } else if (!o.printSummary && o.steps < 0) {
    return invalidArgument("--steps is required");
  }
  if (o.evalIters < 0)
    o.evalIters = 0;
  if (o.evalInterval > 0 && o.evalIters == 0)
    return invalidArgument("--eval-interval needs --eval-iters N");
  if (!o.evalDataPrefix.empty() && o.evalIters == 0)
    return invalidArgument("--eval-data needs --eval-iters N (or --eval-only)");
  if (o.saveInterval > 0 && o.saveDir.empty())
    return invalidArgument("--save-interval needs --save DIR");
  if (o.noLoadOptim && o.loadDir.empty())
    return invalidArgument("--no-load-optim needs --load DIR");
  if (o.mockData && !o.dataPrefix.empty())
    return invalidArgument("give --data PREFIX or --mock-data, not both");
  return o;
}

//===----------------------------------------------------------------------===//
// What the options imply
//===----------------------------------------------------------------------===//

namespace launcher {

NodePlace nodePlaceAmong(const std::vector<std::string> &names, int rank) {
  NodePlace place;
  place.count = 0;
  for (size_t r = 0; r < names.size(); ++r)
    if (names[r] == names[size_t(rank)]) {
      place.index += int(r) < rank;
      ++place.count;
    }
  return place;
}

int defaultThreads(int numRanks) {
  unsigned cores = std::thread::hardware_concurrency();
  return std::max(1, int(cores ? cores : 1) / std::max(1, numRanks));
}

StatusOr<std::shared_ptr<const IndexedDataset>>
openDataset(const LaunchOptions &o, const LoadedArtifact &artifact) {
  const fb::Artifact &a = *artifact.root();
  if (o.dataPrefix.empty()) {
    // --eval-only scores --eval-data alone.
    if (artifactNeedsTokenData(a) && !o.mockData &&
        !(o.evalOnly && !o.evalDataPrefix.empty()))
      return failedPrecondition(
          artifact.name(), " has token inputs (a language model): "
                           "--data PREFIX is required (make the dataset with "
                           "tessera-preprocess), or --mock-data for "
                           "synthetic tokens");
    return std::shared_ptr<const IndexedDataset>();
  }
  TESSERA_ASSIGN_OR_RETURN(std::string prefix,
                           IndexedDataset::resolvePrefix(o.dataPrefix));
  TESSERA_ASSIGN_OR_RETURN(auto dataset, IndexedDataset::open(prefix));
  for (const fb::Program *p : *a.programs())
    TESSERA_RETURN_IF_ERROR(checkTokenInputs(*p, a.batch()->micro_batch_size(),
                                             *dataset, artifact.name()));
  return dataset;
}

Status checkDataOption(const LaunchOptions &o, const LoadedArtifact &artifact) {
  auto dataset = openDataset(o, artifact);
  if (!dataset.ok())
    return dataset.status();
  if (*dataset && !artifactNeedsTokenData(*artifact.root()))
    std::fprintf(stderr,
                 "tessera-run: warning: %s has no token inputs; --data %s is "
                 "not used\n",
                 artifact.name().c_str(), o.dataPrefix.c_str());
  if (o.mockData && !artifactNeedsTokenData(*artifact.root()))
    std::fprintf(stderr,
                 "tessera-run: warning: %s has no token inputs; --mock-data "
                 "is not used\n",
                 artifact.name().c_str());
  return Status();
}

namespace {

std::string withoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

/// True if --load and --save name the same directory (the auto-resume
/// pattern: a first run finds no checkpoint there and starts from scratch).
bool sameDirectory(const std::string &a, const std::string &b) {
  if (a.empty() || b.empty())
    return false;
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return withoutTrailingSlashes(a) == withoutTrailingSlashes(b);
}

} // namespace

CheckpointLoadOptions loadOptionsOf(const LaunchOptions &o,
                                    const IndexedDataset *dataset) {
  CheckpointLoadOptions lo;
  lo.seed = o.seed;
  lo.loadOptimizer = !o.noLoadOptim;
  if (dataset) {
    lo.datasetPrefix = dataset->prefix();
    lo.datasetTokens = dataset->numTokens();
  }
  return lo;
}

bool startsFromScratch(const LaunchOptions &o, const Status &st) {
  return st.getCode() == StatusCode::NotFound &&
         sameDirectory(o.loadDir, o.saveDir);
}

} // namespace launcher
} // namespace tessera::rt
