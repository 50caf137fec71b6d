//===- RankGroups.h - Rank groups derived from a mesh -------------*- C++ -*-===//
//
// Plain C++ (no MLIR types) so that tools and tests can use it directly.
// Global ranks map onto the mesh axes in the order string's order, fastest
// varying first (seed 001: rank = tp_rank + cp_rank*tp + dp_rank*tp*cp +
// pp_rank*tp*cp*dp for the default order). A group of kind "a-b" holds the
// ranks that agree on every axis except a and b.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_DIST_IR_RANKGROUPS_H
#define TESSERA_DIALECTS_DIST_IR_RANKGROUPS_H

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::dist {

struct MeshShape {
  int64_t tp = 1, cp = 1, ep = 1, etp = 1, dp = 1, pp = 1;
  std::string order = "tp-cp-ep-dp-pp";
};

/// The axes of the dense layout, in order, with their sizes.
struct AxisLayout {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  int64_t worldSize() const;
};

/// Checks the order string (a permutation of tp, cp, ep, dp, pp) and the
/// sizes; returns an empty string or an error message naming the problem.
std::string validateMesh(const MeshShape &mesh);

/// The dense layout (order string without ep).
AxisLayout denseLayout(const MeshShape &mesh);

/// All groups of `kind` ("tp", "dp", "tp-dp", ...), each sorted ascending,
/// ordered by their first rank. Sets `error` on an unknown axis.
std::vector<std::vector<int64_t>> rankGroups(const MeshShape &mesh,
                                             const std::string &kind,
                                             std::string &error);

} // namespace tessera::dist

#endif // TESSERA_DIALECTS_DIST_IR_RANKGROUPS_H
