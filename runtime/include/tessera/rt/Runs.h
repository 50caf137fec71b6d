//===- Runs.h - Runs of elements of a (sharded) tensor ----------*- C++ -*-===//
//
// The Runs attribute of the optimizer and gradient-norm instructions
// (Opcodes.def's Runs flag): empty, or [shard_elements, start0, end0, start1,
// end1, ...], ascending disjoint [start, end) runs in the coordinates of the
// whole tensor (a gradient bucket) whose shard the operand is; the operand
// holds elements [index * shard_elements, + its size), index being this
// rank's index in the instruction's group. Header-only, free of LLVM and of
// the schema: the runtime and the compiler's nn dialect check them alike.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_RUNS_H
#define TESSERA_RT_RUNS_H

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::rt {

/// The Runs iattrs of Opcodes.def (`a`, `n` of them): empty when well
/// formed, else what is wrong with them.
constexpr std::string_view runsError(const int64_t *a, size_t n) {
  if (n == 0)
    return {};
  if (n % 2 != 1)
    return "runs are [shard_elements] followed by [start, end) pairs";
  if (a[0] < 1)
    return "runs need shard_elements >= 1";
  int64_t last = 0;
  for (size_t i = 1; i + 1 < n; i += 2) {
    if (a[i] < last || a[i + 1] <= a[i])
      return "runs must be non-empty, ascending and disjoint, from 0";
    last = a[i + 1];
  }
  return {};
}

/// Calls f(begin, end) for each run of `a` (well formed, n > 0) that meets
/// the operand's elements [offset, offset + count), relative to offset.
template <typename F>
void forEachLocalRun(const int64_t *a, size_t n, int64_t offset, int64_t count,
                     F &&f) {
  for (size_t i = 1; i + 1 < n; i += 2) {
    int64_t b = a[i] > offset ? a[i] : offset;
    int64_t e = a[i + 1] < offset + count ? a[i + 1] : offset + count;
    if (b < e)
      f(b - offset, e - offset);
  }
}

} // namespace tessera::rt

#endif // TESSERA_RT_RUNS_H
