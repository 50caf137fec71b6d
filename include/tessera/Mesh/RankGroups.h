//===- RankGroups.h - Megatron rank groups from a mesh ------------*- C++ -*-===//
//
// Plain C++17 (no LLVM/MLIR), shared by the compiler (dist.mesh verifier,
// serialisation, --emit=rank-groups), the runtime's tests and tools.
//
// Megatron's RankGenerator (megatron/core/parallel_state.py): world =
// tp*cp*dp*pp = etp*ep*edp*pp. Dense ranks follow the order string without
// ep (tp-cp-dp-pp by default); expert ranks follow it without cp, reading tp
// as etp and dp as edp (etp-ep-edp-pp), so attention and MLP use different
// groups over the same ranks (MoE folding). The first axis of the order
// varies fastest:
//   dense:  rank = tp_rank + cp_rank*tp + dp_rank*tp*cp + pp_rank*tp*cp*dp
//   expert: rank = etp_rank + ep_rank*etp + edp_rank*etp*ep + pp_rank*etp*ep*edp
// A group of kind "a-b" (axes joined by '-', in any order) holds the ranks
// that agree on every axis except a and b: mask the axes you want, prefix
// products for the rest (Megatron's generate_masked_orthogonal_rank_groups).
// "embedding" holds the first and last rank of each pp group (one rank when
// pp = 1) and "position-embedding" the first; they do not cover the world.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_MESH_RANKGROUPS_H
#define TESSERA_MESH_RANKGROUPS_H

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::mesh {

/// The largest world a mesh may describe: 2^20 ranks, ten times the largest
/// training jobs run (about 10^5 GPUs). Every size and every product of
/// sizes is checked against it before anything is computed from it, so
/// nothing overflows and no group table grows past 2^20 entries.
constexpr int64_t kMaxWorldSize = int64_t(1) << 20;

/// `a * b`, or -1 when the product exceeds `limit` (a, b >= 0).
int64_t boundedProduct(int64_t a, int64_t b, int64_t limit = kMaxWorldSize);

/// The parallel sizes and rank order of a mesh (dist.mesh).
struct MeshConfig {
  int64_t tp = 1, cp = 1, ep = 1, etp = 1, dp = 1, pp = 1, vpp = 1;
  std::string order = "tp-cp-ep-dp-pp";

  int64_t worldSize() const { return tp * cp * dp * pp; }
  /// Expert data-parallel size tp*cp*dp / (etp*ep); 0 if not integral.
  int64_t edp() const;
};

/// Checks sizes (each at least 1, tp * cp * dp * pp and etp * ep at most
/// kMaxWorldSize), the order string and the expert layout; returns an empty
/// string or a message naming the problem and the sizes. Costs O(1): no
/// group is materialised.
std::string validateMesh(const MeshConfig &mesh);

/// Completes `mesh.order` as Megatron's RankGenerator does: axes of size 1
/// that the order leaves out are appended (`tp-pp-dp` with cp = ep = 1
/// becomes `tp-pp-dp-cp-ep`). Returns an error naming a left-out axis whose
/// size is not 1, or an empty string (the order may still be invalid
/// otherwise: validateMesh says).
std::string completeOrder(MeshConfig &mesh);

/// Fills `mesh.dp` from a world size (Megatron derives dp the same way) or
/// checks it against one. Returns an error message or an empty string.
std::string applyWorldSize(MeshConfig &mesh, int64_t worldSize, bool dpGiven);

/// The group kinds --emit=rank-groups lists, in a fixed order.
const std::vector<std::string> &standardGroupKinds();

/// Canonical name of a kind ("cp-dp" -> "dp-cp" etc. as standardGroupKinds
/// spells it; other valid kinds keep their axes in order-string order).
/// Returns an empty string and sets `error` if the kind is invalid.
std::string canonicalKind(const MeshConfig &mesh, const std::string &kind,
                          std::string &error);

/// All groups of `kind`, each sorted ascending, ordered by first rank. For
/// dense and expert kinds they partition the world. Sets `error` on an
/// unknown axis or a kind that mixes dense and expert axes.
std::vector<std::vector<int64_t>> rankGroups(const MeshConfig &mesh,
                                             const std::string &kind,
                                             std::string &error);

/// Size of every group of `kind` (1 for a rank outside embedding groups is
/// not meaningful: embedding kinds report their instances' size), from the
/// axis sizes alone.
int64_t groupSize(const MeshConfig &mesh, const std::string &kind,
                  std::string &error);

/// The coordinate of `rank` along one axis ("tp", "cp", "dp", "pp", "etp",
/// "ep", "edp").
int64_t axisRank(const MeshConfig &mesh, const std::string &axis, int64_t rank);

/// Position of `rank` in its group of `kind`, or -1 when no group of that
/// kind holds it (embedding kinds).
int64_t indexInGroup(const MeshConfig &mesh, const std::string &kind,
                     int64_t rank, std::string &error);

} // namespace tessera::mesh

#endif // TESSERA_MESH_RANKGROUPS_H
