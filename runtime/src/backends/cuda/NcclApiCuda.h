//===- NcclApiCuda.h - The NcclApi table over NCCL and CUDA -----*- C++ -*-===//
//
// The real NcclApi (tessera/rt/NcclApi.h): NCCL 2.28 and the CUDA runtime
// API. Part of the CUDA backend plugin, which links NCCL and cudart; the
// runtime library itself never sees these headers.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_NCCLAPICUDA_H
#define TESSERA_RT_BACKENDS_CUDA_NCCLAPICUDA_H

#include "tessera/rt/NcclApi.h"

#include <string>

namespace tessera::rt {

/// The table binding NCCL and the CUDA runtime (built once, never freed).
const NcclApi &cudaNcclApi();

/// "NCCL <version> (<file it was loaded from>)", for tessera-run's banner.
std::string ncclLibrary();

} // namespace tessera::rt

#endif // TESSERA_RT_BACKENDS_CUDA_NCCLAPICUDA_H
