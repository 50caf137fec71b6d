//===- RankGroups.cpp - Megatron rank groups from a mesh ------------------===//

#include "tessera/Mesh/RankGroups.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>

using namespace tessera::mesh;

namespace {

std::vector<std::string> splitDash(const std::string &s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-'))
    parts.push_back(part);
  return parts;
}

std::string joinDash(const std::vector<std::string> &parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i)
    out += (i ? "-" : "") + parts[i];
  return out;
}

/// Axes of one layout in order (fastest first) with their sizes.
struct Layout {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;

  int indexOf(const std::string &axis) const {
    auto it = std::find(names.begin(), names.end(), axis);
    return it == names.end() ? -1 : int(it - names.begin());
  }
  int64_t world() const {
    int64_t w = 1;
    for (int64_t s : sizes)
      w *= s;
    return w;
  }
  int64_t coordinate(int64_t rank, int axis) const {
    int64_t stride = 1;
    for (int i = 0; i < axis; ++i)
      stride *= sizes[i];
    return (rank / stride) % sizes[axis];
  }
};

Layout denseLayout(const MeshConfig &m) {
  Layout l;
  for (const std::string &a : splitDash(m.order)) {
    if (a == "ep")
      continue;
    l.names.push_back(a);
    l.sizes.push_back(a == "tp" ? m.tp : a == "cp" ? m.cp : a == "dp" ? m.dp : m.pp);
  }
  return l;
}

Layout expertLayout(const MeshConfig &m) {
  Layout l;
  for (const std::string &a : splitDash(m.order)) {
    if (a == "cp")
      continue;
    if (a == "tp") {
      l.names.push_back("etp");
      l.sizes.push_back(m.etp);
    } else if (a == "ep") {
      l.names.push_back("ep");
      l.sizes.push_back(m.ep);
    } else if (a == "dp") {
      l.names.push_back("edp");
      l.sizes.push_back(m.edp());
    } else {
      l.names.push_back("pp");
      l.sizes.push_back(m.pp);
    }
  }
  return l;
}

const std::set<std::string> kDenseAxes = {"tp", "cp", "dp"};
const std::set<std::string> kExpertAxes = {"etp", "ep", "edp"};

/// Parses a kind into its axes and picks the layout they belong to.
bool parseKind(const MeshConfig &m, const std::string &kind, Layout &layout,
               std::vector<std::string> &axes, std::string &error) {
  axes = splitDash(kind);
  bool dense = false, expert = false;
  std::set<std::string> seen;
  for (const std::string &a : axes) {
    if (!seen.insert(a).second) {
      error = "group kind '" + kind + "' repeats axis '" + a + "'";
      return false;
    }
    if (kDenseAxes.count(a))
      dense = true;
    else if (kExpertAxes.count(a))
      expert = true;
    else if (a != "pp") {
      error = "unknown rank-group axis '" + a + "' in group kind '" + kind +
              "' (axes: tp, cp, dp, pp, etp, ep, edp)";
      return false;
    }
  }
  if (dense && expert) {
    error = "group kind '" + kind +
            "' mixes dense axes (tp, cp, dp) with expert axes (etp, ep, edp)";
    return false;
  }
  layout = expert ? expertLayout(m) : denseLayout(m);
  return true;
}

std::vector<std::vector<int64_t>> orthogonalGroups(const Layout &layout,
                                                   const std::vector<std::string> &axes) {
  std::vector<bool> masked(layout.names.size(), false);
  for (const std::string &a : axes)
    masked[layout.indexOf(a)] = true;
  // Ranks that agree on every unmasked axis share a group.
  std::map<std::vector<int64_t>, std::vector<int64_t>> byKey;
  for (int64_t r = 0, w = layout.world(); r < w; ++r) {
    std::vector<int64_t> key;
    for (size_t i = 0; i < layout.names.size(); ++i)
      if (!masked[i])
        key.push_back(layout.coordinate(r, int(i)));
    byKey[key].push_back(r);
  }
  std::vector<std::vector<int64_t>> groups;
  for (auto &entry : byKey)
    groups.push_back(entry.second);
  std::sort(groups.begin(), groups.end());
  return groups;
}

} // namespace

int64_t tessera::mesh::boundedProduct(int64_t a, int64_t b, int64_t limit) {
  if (a < 0 || b < 0)
    return -1;
  if (a != 0 && b > limit / a)
    return -1;
  return a * b;
}

/// The ranks between two consecutive members of a pp group: the product of
/// the sizes of the axes before pp in `layout`.
static int64_t ppStride(const Layout &layout) {
  int64_t stride = 1;
  for (size_t i = 0; i < layout.names.size() && layout.names[i] != "pp"; ++i)
    stride *= layout.sizes[i];
  return stride;
}

int64_t MeshConfig::edp() const {
  int64_t denom = etp * ep, dense = tp * cp * dp;
  if (denom <= 0 || dense % denom != 0)
    return 0;
  return dense / denom;
}

std::string tessera::mesh::validateMesh(const MeshConfig &m) {
  const std::pair<const char *, int64_t> sizes[] = {
      {"tp", m.tp}, {"cp", m.cp},  {"ep", m.ep}, {"etp", m.etp},
      {"dp", m.dp}, {"pp", m.pp}, {"vpp", m.vpp}};
  for (auto &[name, size] : sizes) {
    if (size < 1)
      return std::string(name) + " must be at least 1, got " +
             std::to_string(size);
    if (size > kMaxWorldSize)
      return std::string(name) + " = " + std::to_string(size) +
             " exceeds the largest supported world of " +
             std::to_string(kMaxWorldSize) + " ranks";
  }
  int64_t world = boundedProduct(
      boundedProduct(boundedProduct(m.tp, m.cp), m.dp), m.pp);
  if (world < 0)
    return "world size tp * cp * dp * pp = " + std::to_string(m.tp) + " * " +
           std::to_string(m.cp) + " * " + std::to_string(m.dp) + " * " +
           std::to_string(m.pp) + " exceeds the largest supported world of " +
           std::to_string(kMaxWorldSize) + " ranks";
  if (boundedProduct(m.ep, m.etp) < 0)
    return "ep * etp = " + std::to_string(m.ep) + " * " +
           std::to_string(m.etp) + " exceeds the largest supported world of " +
           std::to_string(kMaxWorldSize) + " ranks";
  std::vector<std::string> axes = splitDash(m.order);
  const std::vector<std::string> known = {"tp", "cp", "ep", "dp", "pp"};
  for (const std::string &a : axes) {
    if (std::find(known.begin(), known.end(), a) == known.end())
      return "order '" + m.order + "' names unknown axis '" + a +
             "' (expected a permutation of tp, cp, ep, dp, pp)";
    if (std::count(axes.begin(), axes.end(), a) > 1)
      return "order '" + m.order + "' repeats axis '" + a + "'";
  }
  if (axes.size() != known.size())
    return "order '" + m.order +
           "' must name each of tp, cp, ep, dp and pp exactly once";
  if (m.edp() == 0)
    return "ep * etp = " + std::to_string(m.ep) + " * " +
           std::to_string(m.etp) + " = " + std::to_string(m.ep * m.etp) +
           " does not divide tp * cp * dp = " + std::to_string(m.tp) + " * " +
           std::to_string(m.cp) + " * " + std::to_string(m.dp) + " = " +
           std::to_string(m.tp * m.cp * m.dp) +
           " (the expert data-parallel size edp would not be integral)";
  // Megatron requires the two layouts to agree on the pipeline groups. Both
  // cover the same world with pp groups of the same size; such groups are
  // {base + k * stride}, so they agree exactly when the strides do (or when
  // they are single ranks).
  if (m.pp > 1 && ppStride(denseLayout(m)) != ppStride(expertLayout(m)))
    return "order '" + m.order +
           "' gives different pp groups to the dense (tp-cp-dp-pp) and expert "
           "(etp-ep-edp-pp) layouts";
  return "";
}

std::string tessera::mesh::completeOrder(MeshConfig &m) {
  std::vector<std::string> axes = splitDash(m.order);
  // An unknown or repeated axis is validateMesh's to report, on the order
  // as given.
  const std::vector<std::string> known = {"tp", "cp", "ep", "dp", "pp"};
  for (const std::string &a : axes)
    if (std::find(known.begin(), known.end(), a) == known.end() ||
        std::count(axes.begin(), axes.end(), a) > 1)
      return "";
  for (auto [name, size] : std::initializer_list<std::pair<const char *, int64_t>>{
           {"tp", m.tp}, {"cp", m.cp}, {"ep", m.ep}, {"dp", m.dp}, {"pp", m.pp}}) {
    if (std::find(axes.begin(), axes.end(), name) != axes.end())
      continue;
    if (size != 1)
      return "order '" + m.order + "' leaves out " + name + ", whose size is " +
             std::to_string(size) +
             " (only axes of size 1 may be left out; they are appended)";
    axes.push_back(name);
  }
  m.order = joinDash(axes);
  return "";
}

std::string tessera::mesh::applyWorldSize(MeshConfig &m, int64_t worldSize,
                                          bool dpGiven) {
  if (worldSize < 1)
    return "world size must be at least 1, got " + std::to_string(worldSize);
  if (worldSize > kMaxWorldSize)
    return "world size " + std::to_string(worldSize) +
           " exceeds the largest supported world of " +
           std::to_string(kMaxWorldSize) + " ranks";
  for (int64_t size : {m.tp, m.cp, m.dp, m.pp})
    if (size < 1 || size > kMaxWorldSize)
      return validateMesh(m);
  int64_t model = boundedProduct(boundedProduct(m.tp, m.cp), m.pp);
  if (model < 0)
    return validateMesh(m);
  if (dpGiven) {
    int64_t world = boundedProduct(model, m.dp);
    if (world < 0)
      return validateMesh(m);
    if (worldSize != world)
      return "world size " + std::to_string(worldSize) +
             " does not equal tp * cp * dp * pp = " + std::to_string(m.tp) +
             " * " + std::to_string(m.cp) + " * " + std::to_string(m.dp) +
             " * " + std::to_string(m.pp) + " = " +
             std::to_string(m.worldSize());
    return "";
  }
  if (model < 1 || worldSize % model != 0)
    return "world size " + std::to_string(worldSize) +
           " is not divisible by tp * cp * pp = " + std::to_string(m.tp) +
           " * " + std::to_string(m.cp) + " * " + std::to_string(m.pp) +
           " = " + std::to_string(model);
  m.dp = worldSize / model;
  return "";
}

const std::vector<std::string> &tessera::mesh::standardGroupKinds() {
  static const std::vector<std::string> kinds = {
      "tp",     "cp",        "dp",     "dp-cp", "pp",
      "tp-pp",  "tp-cp",     "tp-dp",  "tp-dp-cp",
      "ep",     "etp",       "edp",    "etp-ep", "etp-ep-pp",
      "embedding", "position-embedding"};
  return kinds;
}

std::string tessera::mesh::canonicalKind(const MeshConfig &m,
                                         const std::string &kind,
                                         std::string &error) {
  if (kind == "embedding" || kind == "position-embedding")
    return kind;
  Layout layout;
  std::vector<std::string> axes;
  if (!parseKind(m, kind, layout, axes, error))
    return "";
  std::set<std::string> set(axes.begin(), axes.end());
  for (const std::string &std : standardGroupKinds()) {
    std::vector<std::string> parts = splitDash(std);
    if (std::set<std::string>(parts.begin(), parts.end()) == set &&
        std != "embedding" && std != "position-embedding")
      return std;
  }
  std::vector<std::string> ordered;
  for (const std::string &a : layout.names)
    if (set.count(a))
      ordered.push_back(a);
  return joinDash(ordered);
}

std::vector<std::vector<int64_t>>
tessera::mesh::rankGroups(const MeshConfig &m, const std::string &kind,
                          std::string &error) {
  if (kind == "embedding" || kind == "position-embedding") {
    std::vector<std::vector<int64_t>> groups;
    for (auto &pp : orthogonalGroups(denseLayout(m), {"pp"})) {
      if (kind == "position-embedding" || pp.size() == 1)
        groups.push_back({pp.front()});
      else
        groups.push_back({pp.front(), pp.back()});
    }
    std::sort(groups.begin(), groups.end());
    return groups;
  }
  Layout layout;
  std::vector<std::string> axes;
  if (!parseKind(m, kind, layout, axes, error))
    return {};
  return orthogonalGroups(layout, axes);
}

int64_t tessera::mesh::groupSize(const MeshConfig &m, const std::string &kind,
                                 std::string &error) {
  if (kind == "position-embedding")
    return 1;
  if (kind == "embedding")
    return m.pp > 1 ? 2 : 1;
  Layout layout;
  std::vector<std::string> axes;
  if (!parseKind(m, kind, layout, axes, error))
    return 0;
  int64_t size = 1;
  for (const std::string &a : axes)
    size *= layout.sizes[size_t(layout.indexOf(a))];
  return size;
}

int64_t tessera::mesh::axisRank(const MeshConfig &m, const std::string &axis,
                                int64_t rank) {
  Layout layout = kExpertAxes.count(axis) ? expertLayout(m) : denseLayout(m);
  int i = layout.indexOf(axis);
  return i < 0 ? -1 : layout.coordinate(rank, i);
}

int64_t tessera::mesh::indexInGroup(const MeshConfig &m, const std::string &kind,
                                    int64_t rank, std::string &error) {
  for (auto &group : rankGroups(m, kind, error)) {
    auto it = std::find(group.begin(), group.end(), rank);
    if (it != group.end())
      return int64_t(it - group.begin());
  }
  return -1;
}
