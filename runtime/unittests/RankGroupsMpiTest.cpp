//===- RankGroupsMpiTest.cpp - Megatron rank groups over MPI (8 ranks) ----===//
//
// Builds an artifact whose rank groups are exactly tessera::mesh::rankGroups
// for every standard kind of the mesh tp=2 dp=2 pp=2 (ep=2 etp=1, so edp=2),
// creates the communicators the way tessera-run does and checks, on every
// rank and for every kind, that the communicator exists iff a group holds
// the rank, that its rank and size match the table, and that an all-gather
// and an all-reduce over it see exactly the table's members. Also checks
// that the membership check catches ranks that disagree about the groups.
//
// Every rank runs the whole suite; the exit code is the maximum over ranks.
// Tests avoid ASSERT_* before collectives so that a failing rank never
// leaves the others hanging.
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/Mesh/RankGroups.h"
#include "tessera/rt/MpiCommunicator.h"

#include "MpiTestMain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

using namespace tessera::rt;
using namespace tessera::rt::test;
namespace mesh = tessera::mesh;

namespace {


mesh::MeshConfig testMesh() {
  mesh::MeshConfig m;
  m.tp = 2;
  m.dp = 2;
  m.pp = 2;
  m.ep = 2;
  m.etp = 1;
  return m;
}

/// The table: every instance of `kind`, from the shared generator.
std::vector<std::vector<int64_t>> table(const std::string &kind) {
  std::string error;
  auto groups = mesh::rankGroups(testMesh(), kind, error);
  EXPECT_TRUE(error.empty()) << kind << ": " << error;
  return groups;
}

/// The instance of `kind` holding `rank` and the rank's position, or
/// {nullptr, -1}.
std::pair<const std::vector<int64_t> *, int>
lookup(const std::vector<std::vector<int64_t>> &groups, int rank) {
  for (const auto &g : groups)
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] == rank)
        return {&g, int(i)};
  return {nullptr, -1};
}

/// An artifact with the groups of every standard kind (in table order) and a
/// small dp program that also all-reduces over "position-embedding".
ArtifactDesc meshArtifact() {
  mesh::MeshConfig m = testMesh();
  ArtifactDesc a = softmaxRegression(8, 4, 4, 1, int(m.dp));
  a.worldSize = int(m.worldSize());
  a.mesh = {{"tp", int(m.tp)}, {"dp", int(m.dp)}, {"pp", int(m.pp)}};
  a.groups.clear();
  for (const std::string &kind : mesh::standardGroupKinds())
    for (const auto &g : table(kind))
      a.groups.push_back({kind, std::vector<int>(g.begin(), g.end())});
  ProgramDesc &p = a.programs[0];
  InstrDesc ar = instr(fb::Opcode::AllReduce, {p.ref(1)}, "pos-emb.sync");
  ar.group = "position-embedding";
  p.function("step").push_back(ar);
  return a;
}

StatusOr<std::shared_ptr<const LoadedArtifact>> load(const ArtifactDesc &a) {
  return LoadedArtifact::loadFromMemory(buildFile(buildPayload(a)),
                                        "rank-groups.tsr");
}

} // namespace

TEST(RankGroupsMpiTest, MeshIsValid) {
  EXPECT_EQ(mesh::validateMesh(testMesh()), "");
  EXPECT_EQ(testMesh().edp(), 2);
  EXPECT_EQ(worldSize(), testMesh().worldSize())
      << "run with mpirun -n " << testMesh().worldSize();
}

TEST(RankGroupsMpiTest, CommunicatorsMatchTheTable) {
  int r = worldRank();
  if (worldSize() != testMesh().worldSize())
    return; // same on every rank; MeshIsValid reports it
  auto loaded = load(meshArtifact());
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return; // same on every rank
  const std::vector<std::string> &kinds = mesh::standardGroupKinds();
  auto comms = createMpiGroupCommunicators(*(*loaded)->root(), kinds);
  EXPECT_TRUE(comms.ok()) << comms.status().toString();
  if (!comms.ok())
    return;
  for (const std::string &kind : kinds) {
    SCOPED_TRACE("kind " + kind + ", rank " + std::to_string(r));
    auto groups = table(kind);
    auto [instance, index] = lookup(groups, r);
    auto it = comms->find(kind);
    Communicator *comm = it == comms->end() ? nullptr : it->second.get();
    // (a) a communicator iff an instance holds the rank.
    EXPECT_EQ(comm != nullptr, instance != nullptr);
    if (!comm || !instance)
      continue; // consistent within each instance, so no one waits
    // (b) size and position.
    EXPECT_EQ(comm->size(), int(instance->size()));
    EXPECT_EQ(comm->rank(), index);
    // (c) all-gather of world ranks.
    int64_t me = r;
    std::vector<int64_t> members(instance->size(), -1);
    EXPECT_TRUE(comm->allGather(&me, members.data(), 1, ElementType::I64).ok());
    EXPECT_EQ(members, *instance);
    // (d) all-reduce of the world rank.
    int64_t sum = r;
    EXPECT_TRUE(
        comm->allReduce(&sum, 1, ElementType::I64, ReduceKind::Sum).ok());
    EXPECT_EQ(sum,
              std::accumulate(instance->begin(), instance->end(), int64_t(0)));
  }
  // Embedding kinds leave ranks out: position-embedding holds pp stage 0.
  EXPECT_EQ(comms->count("position-embedding") == 1,
            mesh::axisRank(testMesh(), "pp", r) == 0);
  EXPECT_EQ(comms->size(),
            kinds.size() - (comms->count("position-embedding") ? 0 : 1));
}

TEST(RankGroupsMpiTest, TesseraRunPathSkipsRanksOutsideEmbeddingGroups) {
  int r = worldRank();
  if (worldSize() != testMesh().worldSize())
    return;
  auto loaded = load(meshArtifact());
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return;
  const fb::Artifact &a = *(*loaded)->root();
  EXPECT_EQ(collectiveGroupKinds(a),
            (std::vector<std::string>{"dp", "position-embedding"}));
  auto set = createMpiCommunicators(a);
  EXPECT_TRUE(set.ok()) << set.status().toString();
  if (!set.ok())
    return;
  bool first = mesh::axisRank(testMesh(), "pp", r) == 0;
  EXPECT_EQ(set->groups.count("position-embedding"), first ? 1u : 0u);
  EXPECT_EQ(set->groups.count("dp"), 1u);
  EXPECT_TRUE(set->lossReduce && set->world);
  if (first) {
    // position-embedding instances: tp x dp ranks of stage 0, one each.
    Communicator &pe = *set->groups.at("position-embedding");
    EXPECT_EQ(pe.size(), 1);
    EXPECT_EQ(pe.rank(), 0);
  }
}

TEST(RankGroupsMpiTest, MembershipCheckCatchesDisagreeingRanks) {
  int r = worldRank();
  if (worldSize() != testMesh().worldSize())
    return;
  ArtifactDesc good = meshArtifact();
  auto tpInstance = [](ArtifactDesc &a, int i) -> std::vector<int> & {
    int seen = 0;
    for (auto &[kind, ranks] : a.groups)
      if (kind == "tp" && seen++ == i)
        return ranks;
    return a.groups.front().second;
  };
  ASSERT_EQ(tpInstance(good, 0), (std::vector<int>{0, 1}));
  ASSERT_EQ(tpInstance(good, 1), (std::vector<int>{2, 3}));

  // Case 1: ranks 1 and 2 load tp = [0,2],[1,3],... (a valid table, so the
  // loader accepts it), the others the real one. The split follows each
  // rank's own view: communicators {0,2} and {1,3}. Ranks 1 and 2 agree with
  // what they get; ranks 0 and 3 expected [0,1] and [2,3].
  ArtifactDesc swapped = good;
  std::swap(tpInstance(swapped, 0)[1], tpInstance(swapped, 1)[0]);
  // Case 2: rank 1 alone lists its tp instance as [1,0]: the members are
  // right but the order (and so rank 1's position) is not.
  ArtifactDesc reordered = good;
  std::swap(tpInstance(reordered, 0)[0], tpInstance(reordered, 0)[1]);

  struct Case {
    const char *name;
    const ArtifactDesc *mine;
    bool expectError;
    std::string got, expected;
  };
  std::vector<Case> cases;
  bool swaps = r == 1 || r == 2;
  cases.push_back({"swapped", swaps ? &swapped : &good, r == 0 || r == 3,
                   r == 0 ? "[0, 2]" : "[1, 3]", r == 0 ? "[0, 1]" : "[2, 3]"});
  cases.push_back(
      {"reordered", r == 1 ? &reordered : &good, r == 1, "[0, 1]", "[1, 0]"});
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(c.name) + ", rank " + std::to_string(r));
    auto loaded = load(*c.mine);
    EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
    if (!loaded.ok())
      return;
    auto comms = createMpiGroupCommunicators(*(*loaded)->root(),
                                             mesh::standardGroupKinds());
    EXPECT_EQ(!comms.ok(), c.expectError)
        << (comms.ok() ? "no error" : comms.status().toString());
    if (!c.expectError || comms.ok())
      continue;
    const std::string &msg = comms.status().message();
    for (const std::string &needle :
         {std::string("membership check failed for kind 'tp'"),
          "on rank " + std::to_string(r), "holds world ranks " + c.got,
          "the artifact's instance is " + c.expected})
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

