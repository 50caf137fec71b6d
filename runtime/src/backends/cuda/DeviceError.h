//===- DeviceError.h - Errors recorded by CUDA kernels ----------*- C++ -*-===//
//
// A kernel that meets bad data (a token id outside the vocabulary, a label
// outside the classes, an Adam iteration below 1, an expert index outside
// the experts) cannot return a Status:
// it records the first such error in one DeviceError in device memory and
// the backend turns it into a Status at the next synchronize(), once per
// iteration, instead of the host waiting for the device after every kernel.
// The message is the CPU backend's, prefixed with the kernel's opcode;
// where several elements are bad, it names one of them (the first thread to
// record wins), not necessarily the first the CPU would name.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_DEVICEERROR_H
#define TESSERA_RT_BACKENDS_CUDA_DEVICEERROR_H

#include <cstdint>

namespace tessera::rt::cuda {

/// What went wrong (0: nothing).
enum DeviceErrorKind : int {
  kNoError = 0,
  /// Embedding: value = id, row, limit = vocabulary size.
  kVocabularyId = 1,
  /// CrossEntropy(Grad): value = label, row, limit = classes.
  kLabel = 2,
  /// CrossEntropyStats(Grad): value = label, row, limit = classes,
  /// extra = ignore index.
  kLabelWithIgnore = 3,
  /// Adam: value = the iteration.
  kAdamIteration = 4,
  /// MoE kernels: value = expert index, row = routing choice, limit =
  /// experts.
  kExpertIndex = 5,
  /// MoERouterGrad: value = expert index, row = token, limit = experts.
  kExpertIndexOfToken = 6,
};

/// The first error since the last synchronize(). `kind` is claimed with an
/// atomic compare-and-swap, so later errors never overwrite it.
struct DeviceError {
  int kind;
  int padding;
  long long value, row, limit, extra;
};

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_DEVICEERROR_H
