//===- BlasCore.cpp - Which OpenBLAS kernels the cpu backend runs ---------===//

#include "backends/cpu/BlasCore.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstring>

extern "C" {
// Declared by openblas_config.h in every OpenBLAS; repeated here so the
// file does not depend on which header variant is installed.
char *openblas_get_corename(void);
char *openblas_get_config(void);
}

namespace tessera::rt::cpu {
namespace {

enum class Needs { Nothing, Avx, Fma4, Avx2, Avx512, Avx512Bf16 };

struct CoreName {
  const char *name;
  Needs needs;
};

/// OpenBLAS's x86-64 core names (OPENBLAS_CORETYPE) and what each set of
/// kernels executes beyond SSE3: the Bulldozer family's kernels use FMA4,
/// Haswell's and Zen's AVX2 with FMA3, SkylakeX's AVX-512 and Cooperlake's
/// and Sapphire Rapids' also AVX512_BF16 (their bf16 GEMMs).
constexpr CoreName kCores[] = {
    {"Prescott", Needs::Nothing},       {"Atom", Needs::Nothing},
    {"Core2", Needs::Nothing},          {"Penryn", Needs::Nothing},
    {"Dunnington", Needs::Nothing},     {"Nehalem", Needs::Nothing},
    {"Opteron", Needs::Nothing},        {"Opteron_SSE3", Needs::Nothing},
    {"Barcelona", Needs::Nothing},      {"Nano", Needs::Nothing},
    {"Bobcat", Needs::Nothing},         {"Sandybridge", Needs::Avx},
    {"Bulldozer", Needs::Fma4},         {"Piledriver", Needs::Fma4},
    {"Steamroller", Needs::Fma4},       {"Excavator", Needs::Fma4},
    {"Haswell", Needs::Avx2},           {"Zen", Needs::Avx2},
    {"SkylakeX", Needs::Avx512},        {"Cooperlake", Needs::Avx512Bf16},
    {"SapphireRapids", Needs::Avx512Bf16},
};

const CoreName *findCore(const std::string &name) {
  for (const CoreName &c : kCores)
    if (sameBlasCore(c.name, name))
      return &c;
  return nullptr;
}

} // namespace

bool sameBlasCore(const std::string &a, const std::string &b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower((unsigned char)x) ==
                  std::tolower((unsigned char)y);
         });
}

CpuFeatures hostCpuFeatures() {
  CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // libgcc's and compiler-rt's CPU model also require the OS to save the
  // AVX and AVX-512 registers before reporting those features.
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.fma4 = __builtin_cpu_supports("fma4");
  f.avx512 = __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd");
  f.avx512bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

std::string runningBlasCore() {
  const char *name = openblas_get_corename();
  return name ? name : "";
}

std::string blasDescription() {
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": keep the version.
  std::string config = openblas_get_config() ? openblas_get_config() : "";
  std::string library = "OpenBLAS";
  if (config.rfind("OpenBLAS ", 0) == 0) {
    size_t end = config.find(' ', 9);
    library = config.substr(0, end);
  }
  return library + " (" + runningBlasCore() + " kernels)";
}

std::string suggestedBlasCore(const CpuFeatures &features,
                              const std::string &running) {
  if (!features.avx512)
    return "";
  const CoreName *core = findCore(running);
  // A core this table does not know is newer than it: keep it.
  if (!core || core->needs == Needs::Avx512 ||
      core->needs == Needs::Avx512Bf16)
    return "";
  // Cooperlake's sgemm is SkylakeX's; it adds bf16 GEMM kernels.
  return features.avx512bf16 ? "Cooperlake" : "SkylakeX";
}

Status checkBlasCore(const std::string &name, const CpuFeatures &f) {
  const CoreName *core = findCore(name);
  if (!core) {
    std::string names;
    for (const CoreName &c : kCores)
      names += std::string(names.empty() ? "" : ", ") + c.name;
    return invalidArgument("--blas-core: '", name,
                           "' is not an OpenBLAS x86-64 core (one of ",
                           names, ")");
  }
  const char *missing = nullptr;
  switch (core->needs) {
  case Needs::Nothing:
    break;
  case Needs::Avx:
    missing = f.avx ? nullptr : "AVX";
    break;
  case Needs::Fma4:
    missing = f.fma4 ? nullptr : "FMA4";
    break;
  case Needs::Avx2:
    missing = f.avx2 && f.fma ? nullptr : "AVX2 with FMA";
    break;
  case Needs::Avx512:
    missing = f.avx512 ? nullptr : "AVX-512 (F, CD, DQ, BW, VL)";
    break;
  case Needs::Avx512Bf16:
    missing = f.avx512bf16 ? nullptr : "AVX-512 with AVX512_BF16";
    break;
  }
  if (missing)
    return invalidArgument("--blas-core ", core->name,
                           ": this CPU lacks ", missing,
                           ", which those kernels execute");
  return Status();
}

} // namespace tessera::rt::cpu
