//===- BlasCore.h - Which OpenBLAS kernels the cpu backend runs -*- C++ -*-===//
//
// OpenBLAS built with DYNAMIC_ARCH (every distribution's package) carries one
// set of kernels per CPU family ("core") and picks one when the library
// loads, from the CPUID family and model it knows, or from the environment
// variable OPENBLAS_CORETYPE. A release older than the CPU does not know it
// and falls back to an older core: Debian 12's OpenBLAS 0.3.21 runs AMD Zen 4
// and Zen 5 on its Haswell (AVX2) kernels, half the sgemm throughput of its
// SkylakeX (AVX-512) kernels on those CPUs (bench/gpt_vs_torch.py).
//
// tessera-run --blas-core NAME exports OPENBLAS_CORETYPE=NAME to the ranks
// before they start (OpenBLAS reads it when it loads), after checking that
// NAME is a core this CPU can run, and each rank checks that OpenBLAS runs
// it. Without the flag OpenBLAS chooses (or OPENBLAS_CORETYPE, when the
// environment sets it): a kernel set the library did not pick for the CPU
// is the user's call, since an OpenBLAS older than the CPU has not been
// tested on it. The banner names the kernels that run and, on an AVX-512
// CPU running AVX2 kernels, the core to try.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RUNTIME_BACKENDS_CPU_BLASCORE_H
#define TESSERA_RUNTIME_BACKENDS_CPU_BLASCORE_H

#include "tessera/rt/Status.h"

#include <string>

namespace tessera::rt::cpu {

/// The x86-64 instruction sets OpenBLAS's kernel sets need (with the OS
/// saving their registers).
struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool fma4 = false;
  /// AVX512F, AVX512DQ, AVX512BW and AVX512VL, all of which the SkylakeX
  /// kernels use.
  bool avx512 = false;
  bool avx512bf16 = false;
};

/// The features of the CPU this process runs on (all false off x86-64).
CpuFeatures hostCpuFeatures();

/// The core OpenBLAS runs in this process (openblas_get_corename()).
std::string runningBlasCore();
/// "OpenBLAS 0.3.21 (SkylakeX kernels)": the library and core, for the
/// launcher's banner.
std::string blasDescription();

/// The faster core to suggest on a CPU with `features` running `running`:
/// SkylakeX (Cooperlake with AVX512_BF16, the same sgemm) when the CPU has
/// AVX-512 and `running` is a core without AVX-512 kernels; otherwise "".
std::string suggestedBlasCore(const CpuFeatures &features,
                              const std::string &running);

/// OK when `name` is one of OpenBLAS's x86-64 core names (any case) whose
/// instructions a CPU with `features` has; otherwise an error naming the
/// option, the core and what is missing. Asking for a core the CPU lacks
/// would end the ranks on an illegal instruction.
Status checkBlasCore(const std::string &name, const CpuFeatures &features);

/// Whether OpenBLAS core names `a` and `b` are the same (any case).
bool sameBlasCore(const std::string &a, const std::string &b);

} // namespace tessera::rt::cpu

#endif // TESSERA_RUNTIME_BACKENDS_CPU_BLASCORE_H
