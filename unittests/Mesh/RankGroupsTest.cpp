//===- RankGroupsTest.cpp - Megatron rank groups --------------------------===//
//
// Two worked examples of Megatron's RankGenerator on 16 ranks (dense
// TP4-PP2-DP2 with decoder_rank_generator, MoE ETP1-PP2-EP4-EDP2 with
// expert_decoder_rank_generator) and the TP2-PP4 example of the
// initialize_model_parallel docstring (megatron/core/parallel_state.py),
// group by group, then properties over many random valid meshes.
//
//===----------------------------------------------------------------------===//

#include "tessera/Mesh/RankGroups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <sstream>

using namespace tessera::mesh;
using Groups = std::vector<std::vector<int64_t>>;

static Groups groups(const MeshConfig &m, const std::string &kind) {
  std::string error;
  Groups g = rankGroups(m, kind, error);
  EXPECT_EQ(error, "") << kind;
  return g;
}

TEST(RankGroups, DenseTP4PP2DP2) {
  MeshConfig m;
  m.tp = 4;
  m.pp = 2;
  m.dp = 2;
  ASSERT_EQ(validateMesh(m), "");
  EXPECT_EQ(m.worldSize(), 16);
  EXPECT_EQ(groups(m, "dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7},
                                     {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(groups(m, "tp"),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(groups(m, "pp"), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11},
                                     {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
}

TEST(RankGroups, MoEETP1PP2EP4EDP2) {
  MeshConfig m;
  m.tp = 4; // the dense half of the same 16 ranks
  m.pp = 2;
  m.dp = 2;
  m.etp = 1;
  m.ep = 4;
  ASSERT_EQ(validateMesh(m), "");
  EXPECT_EQ(m.edp(), 2);
  EXPECT_EQ(groups(m, "ep"),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(groups(m, "edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7},
                                      {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  // etp = 1: sixteen single-rank groups.
  Groups etp = groups(m, "etp");
  ASSERT_EQ(etp.size(), 16u);
  for (int64_t r = 0; r < 16; ++r)
    EXPECT_EQ(etp[r], std::vector<int64_t>{r});
  // The expert layout's pp groups are the dense ones.
  EXPECT_EQ(groups(m, "pp"), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11},
                                     {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(groups(m, "etp-ep-pp"),
            (Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
}

TEST(RankGroups, InitializeModelParallelTP2PP4On16) {
  MeshConfig m;
  m.tp = 2;
  m.pp = 4;
  ASSERT_EQ(applyWorldSize(m, 16, /*dpGiven=*/false), "");
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(groups(m, "dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7},
                                     {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(groups(m, "tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7},
                                     {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(groups(m, "pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13},
                                     {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(groups(m, "tp-pp"), (Groups{{0, 1, 4, 5, 8, 9, 12, 13},
                                        {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(groups(m, "embedding"), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(groups(m, "position-embedding"), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(RankGroups, EmbeddingWithoutPipeline) {
  MeshConfig m;
  m.tp = 2;
  m.dp = 2;
  EXPECT_EQ(groups(m, "embedding"), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(RankGroups, KindsAreSetsOfAxes) {
  MeshConfig m;
  m.tp = 2;
  m.cp = 2;
  m.dp = 2;
  std::string error;
  EXPECT_EQ(canonicalKind(m, "cp-dp", error), "dp-cp");
  EXPECT_EQ(canonicalKind(m, "pp-tp", error), "tp-pp");
  EXPECT_EQ(canonicalKind(m, "cp-tp-dp", error), "tp-dp-cp");
  EXPECT_EQ(groups(m, "cp-dp"), groups(m, "dp-cp"));
  EXPECT_EQ(error, "");
}

TEST(RankGroups, Errors) {
  MeshConfig m;
  m.order = "tp-cp-ep-dp-xx";
  EXPECT_NE(validateMesh(m).find("unknown axis 'xx'"), std::string::npos);
  m.order = "tp-dp-ep-dp-pp";
  EXPECT_NE(validateMesh(m).find("repeats axis 'dp'"), std::string::npos);
  m = MeshConfig();
  m.tp = 2;
  m.dp = 3;
  m.ep = 4;
  EXPECT_EQ(validateMesh(m),
            "ep * etp = 4 * 1 = 4 does not divide tp * cp * dp = 2 * 1 * 3 = 6 "
            "(the expert data-parallel size edp would not be integral)");
  m = MeshConfig();
  m.tp = 4;
  EXPECT_EQ(applyWorldSize(m, 6, false),
            "world size 6 is not divisible by tp * cp * pp = 4 * 1 * 1 = 4");
  m.dp = 2;
  EXPECT_EQ(applyWorldSize(m, 16, true),
            "world size 16 does not equal tp * cp * dp * pp = 4 * 1 * 2 * 1 = 8");
  std::string error;
  rankGroups(m, "tp-ep", error);
  EXPECT_NE(error.find("mixes dense axes"), std::string::npos);
  error.clear();
  rankGroups(m, "tp-xp", error);
  EXPECT_NE(error.find("unknown rank-group axis 'xp'"), std::string::npos);
  error.clear();
  rankGroups(m, "tp-tp", error);
  EXPECT_NE(error.find("repeats axis 'tp'"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Properties over random valid meshes
//===----------------------------------------------------------------------===//

static std::vector<std::string> splitDash(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, '-');)
    out.push_back(p);
  return out;
}

static std::vector<MeshConfig> randomMeshes(int count) {
  std::mt19937 rng(20261122);
  std::vector<MeshConfig> meshes;
  std::vector<std::string> axes = {"tp", "cp", "ep", "dp", "pp"};
  const int64_t choices[] = {1, 1, 2, 2, 3, 4};
  while (int(meshes.size()) < count) {
    MeshConfig m;
    m.tp = choices[rng() % 6];
    m.cp = choices[rng() % 6];
    m.dp = choices[rng() % 6];
    m.pp = choices[rng() % 6];
    if (m.worldSize() > 96)
      continue;
    std::shuffle(axes.begin(), axes.end(), rng);
    m.order = axes[0] + "-" + axes[1] + "-" + axes[2] + "-" + axes[3] + "-" + axes[4];
    if (rng() % 4 == 0)
      m.order = "tp-cp-ep-dp-pp";
    // ep * etp must divide tp * cp * dp.
    int64_t dense = m.tp * m.cp * m.dp;
    std::vector<std::pair<int64_t, int64_t>> splits;
    for (int64_t ep = 1; ep <= dense; ++ep)
      for (int64_t etp = 1; etp * ep <= dense; ++etp)
        if (dense % (ep * etp) == 0)
          splits.push_back({ep, etp});
    auto [ep, etp] = splits[rng() % splits.size()];
    m.ep = ep;
    m.etp = etp;
    if (!validateMesh(m).empty())
      continue; // e.g. an order whose expert pp groups differ: rejected
    meshes.push_back(m);
  }
  return meshes;
}

TEST(RankGroupsProperty, KindsPartitionTheWorld) {
  for (const MeshConfig &m : randomMeshes(200)) {
    for (const std::string &kind : standardGroupKinds()) {
      Groups g = groups(m, kind);
      std::vector<int> seen(m.worldSize(), 0);
      for (auto &group : g) {
        EXPECT_TRUE(std::is_sorted(group.begin(), group.end()));
        EXPECT_EQ(group.size(), g.front().size()) << kind;
        for (int64_t r : group)
          ++seen[r];
      }
      bool partial = kind == "embedding" || kind == "position-embedding";
      for (int64_t r = 0; r < m.worldSize(); ++r) {
        if (partial)
          EXPECT_LE(seen[r], 1) << kind;
        else
          EXPECT_EQ(seen[r], 1) << kind << " rank " << r << " order " << m.order;
      }
    }
  }
}

TEST(RankGroupsProperty, OrthogonalAxesMeetInOneRank) {
  const std::vector<std::vector<std::string>> domains = {
      {"tp", "cp", "dp", "pp"}, {"etp", "ep", "edp", "pp"}};
  for (const MeshConfig &m : randomMeshes(200))
    for (auto &axes : domains)
      for (const std::string &a : axes)
        for (const std::string &b : axes) {
          if (a == b)
            continue;
          for (auto &ga : groups(m, a))
            for (auto &gb : groups(m, b)) {
              std::vector<int64_t> common;
              std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(),
                                    std::back_inserter(common));
              EXPECT_LE(common.size(), 1u) << a << " vs " << b;
            }
        }
}

TEST(RankGroupsProperty, GlobalRankFormula) {
  for (const MeshConfig &m : randomMeshes(200)) {
    // Dense and expert layouts in order-string order, fastest first.
    std::vector<std::pair<std::string, int64_t>> dense, expert;
    for (const std::string &a : splitDash(m.order)) {
      if (a != "ep")
        dense.push_back({a, a == "tp" ? m.tp : a == "cp" ? m.cp : a == "dp" ? m.dp : m.pp});
      if (a != "cp")
        expert.push_back({a == "tp" ? "etp" : a == "dp" ? "edp" : a,
                          a == "tp" ? m.etp : a == "ep" ? m.ep : a == "dp" ? m.edp() : m.pp});
    }
    for (int64_t r = 0; r < m.worldSize(); ++r) {
      for (auto *layout : {&dense, &expert}) {
        int64_t rank = 0, stride = 1;
        for (auto &[axis, size] : *layout) {
          rank += axisRank(m, axis, r) * stride;
          stride *= size;
        }
        EXPECT_EQ(rank, r) << m.order;
      }
      if (m.order == "tp-cp-ep-dp-pp") {
        EXPECT_EQ(r, axisRank(m, "tp", r) + axisRank(m, "cp", r) * m.tp +
                         axisRank(m, "dp", r) * m.tp * m.cp +
                         axisRank(m, "pp", r) * m.tp * m.cp * m.dp);
        EXPECT_EQ(r, axisRank(m, "etp", r) + axisRank(m, "ep", r) * m.etp +
                         axisRank(m, "edp", r) * m.etp * m.ep +
                         axisRank(m, "pp", r) * m.etp * m.ep * m.edp());
      }
      // A rank's index in its single-axis group is its coordinate.
      std::string error;
      for (const char *axis : {"tp", "cp", "dp", "pp", "etp", "ep", "edp"})
        EXPECT_EQ(indexInGroup(m, axis, r, error), axisRank(m, axis, r)) << axis;
    }
  }
}

TEST(RankGroupsProperty, DefaultOrderIsCovered) {
  // The random meshes must include the default order, or the closing
  // formula above was never checked.
  int defaults = 0;
  for (const MeshConfig &m : randomMeshes(200))
    defaults += m.order == "tp-cp-ep-dp-pp";
  EXPECT_GT(defaults, 0);
}

TEST(RankGroupsTest, ClosedFormsAgreeWithTheMaterialisedGroups) {
  // validateMesh compares the dense and expert pp groups by their stride and
  // groupSize multiplies axis sizes: both against the groups themselves, on
  // every small mesh and order.
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-pp-dp-cp-ep",
                                           "pp-tp-ep-cp-dp", "tp-cp-pp-ep-dp",
                                           "ep-tp-dp-pp-cp"};
  int checked = 0;
  for (const std::string &order : orders)
    for (int64_t tp : {1, 2})
      for (int64_t cp : {1, 2})
        for (int64_t dp : {1, 2, 4})
          for (int64_t pp : {1, 2, 3})
            for (int64_t ep : {1, 2, 4})
              for (int64_t etp : {1, 2}) {
                MeshConfig m;
                m.tp = tp, m.cp = cp, m.dp = dp, m.pp = pp, m.ep = ep;
                m.etp = etp;
                m.order = order;
                if (m.edp() == 0)
                  continue;
                std::string error;
                std::string verdict = validateMesh(m);
                bool layoutsAgree =
                    verdict.find("gives different pp groups") ==
                    std::string::npos;
                // Both layouts' pp groups, materialised: the ranks that
                // agree on every other axis of the layout.
                std::map<std::vector<int64_t>, std::vector<int64_t>> dense,
                    expert;
                for (int64_t r = 0; r < m.worldSize(); ++r) {
                  dense[{axisRank(m, "tp", r), axisRank(m, "cp", r),
                         axisRank(m, "dp", r)}]
                      .push_back(r);
                  expert[{axisRank(m, "etp", r), axisRank(m, "ep", r),
                          axisRank(m, "edp", r)}]
                      .push_back(r);
                }
                std::set<std::vector<int64_t>> a, b;
                for (auto &[k, g] : dense)
                  a.insert(g);
                for (auto &[k, g] : expert)
                  b.insert(g);
                EXPECT_EQ(layoutsAgree, a == b)
                    << order << " tp " << tp << " cp " << cp << " dp " << dp
                    << " pp " << pp << " ep " << ep << " etp " << etp;
                if (!layoutsAgree)
                  continue;
                for (const std::string &kind : standardGroupKinds()) {
                  auto groups = rankGroups(m, kind, error);
                  ASSERT_TRUE(error.empty()) << error;
                  EXPECT_EQ(groupSize(m, kind, error),
                            int64_t(groups.front().size()))
                      << kind << " on " << order;
                }
                ++checked;
              }
  EXPECT_GT(checked, 100);
}
