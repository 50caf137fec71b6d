//===- RankGroups.cpp - Rank groups derived from a mesh -------------------===//

#include "dialects/dist/IR/RankGroups.h"

#include <algorithm>
#include <map>
#include <sstream>

using namespace tessera::dist;

static std::vector<std::string> splitDash(const std::string &s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-'))
    parts.push_back(part);
  return parts;
}

int64_t AxisLayout::worldSize() const {
  int64_t w = 1;
  for (int64_t s : sizes)
    w *= s;
  return w;
}

std::string tessera::dist::validateMesh(const MeshShape &mesh) {
  const std::pair<const char *, int64_t> sizes[] = {
      {"tp", mesh.tp}, {"cp", mesh.cp}, {"ep", mesh.ep},
      {"etp", mesh.etp}, {"dp", mesh.dp}, {"pp", mesh.pp}};
  for (auto &[name, size] : sizes)
    if (size < 1)
      return std::string(name) + " must be at least 1, got " +
             std::to_string(size);
  std::vector<std::string> axes = splitDash(mesh.order);
  const std::vector<std::string> known = {"tp", "cp", "ep", "dp", "pp"};
  for (const std::string &a : axes) {
    if (std::find(known.begin(), known.end(), a) == known.end())
      return "order '" + mesh.order + "' names unknown axis '" + a +
             "' (expected a permutation of tp, cp, ep, dp, pp)";
    if (std::count(axes.begin(), axes.end(), a) > 1)
      return "order '" + mesh.order + "' repeats axis '" + a + "'";
  }
  if (axes.size() != known.size())
    return "order '" + mesh.order +
           "' must name each of tp, cp, ep, dp and pp exactly once";
  return "";
}

AxisLayout tessera::dist::denseLayout(const MeshShape &mesh) {
  AxisLayout layout;
  for (const std::string &a : splitDash(mesh.order)) {
    if (a == "ep")
      continue;
    layout.names.push_back(a);
    layout.sizes.push_back(a == "tp"   ? mesh.tp
                           : a == "cp" ? mesh.cp
                           : a == "dp" ? mesh.dp
                                       : mesh.pp);
  }
  return layout;
}

std::vector<std::vector<int64_t>>
tessera::dist::rankGroups(const MeshShape &mesh, const std::string &kind,
                          std::string &error) {
  AxisLayout layout = denseLayout(mesh);
  std::vector<bool> inGroup(layout.names.size(), false);
  for (const std::string &a : splitDash(kind)) {
    auto it = std::find(layout.names.begin(), layout.names.end(), a);
    if (it == layout.names.end()) {
      error = "unknown rank-group axis '" + a + "' in group kind '" + kind + "'";
      return {};
    }
    inGroup[it - layout.names.begin()] = true;
  }
  // Ranks that agree on every axis outside the group share a group.
  std::map<std::vector<int64_t>, std::vector<int64_t>> byKey;
  int64_t world = layout.worldSize();
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> key;
    int64_t stride = 1;
    for (size_t i = 0; i < layout.names.size(); ++i) {
      if (!inGroup[i])
        key.push_back((r / stride) % layout.sizes[i]);
      stride *= layout.sizes[i];
    }
    byKey[key].push_back(r);
  }
  std::vector<std::vector<int64_t>> groups;
  for (auto &entry : byKey)
    groups.push_back(entry.second);
  std::sort(groups.begin(), groups.end());
  return groups;
}
