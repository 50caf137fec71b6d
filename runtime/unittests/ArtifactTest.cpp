//===- ArtifactTest.cpp - .tsr loader checks ------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/Artifact.h"
#include "tessera/rt/Data.h"
#include "tessera/rt/Executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <unistd.h>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

class ArtifactTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-artifact-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir + "'";
    (void)std::system(cmd.c_str());
  }
  std::string write(const std::string &name, const std::string &bytes) {
    std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  /// Loads `bytes` from a file and expects an error containing `needle` and
  /// the file name.
  void expectError(const std::string &bytes, const std::string &needle) {
    std::string path = write("bad.tsr", bytes);
    auto loaded = LoadedArtifact::loadFromFile(path);
    ASSERT_FALSE(loaded.ok()) << "expected error containing: " << needle;
    const std::string &msg = loaded.status().message();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  std::string dir;
};

} // namespace

TEST_F(ArtifactTest, LoadsValidArtifact) {
  std::string path =
      write("ok.tsr", buildFile(buildPayload(softmaxRegression())));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  const auto &a = *(*loaded)->root();
  EXPECT_EQ(a.world_size(), 1);
  EXPECT_EQ(a.programs()->size(), 1u);
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  std::string summary = summarizeArtifact(**loaded);
  EXPECT_NE(summary.find("fc.weight"), std::string::npos) << summary;
  EXPECT_NE(summary.find("arena"), std::string::npos);
  EXPECT_NE(summary.find("dp: [0]"), std::string::npos) << summary;
}

TEST_F(ArtifactTest, MissingFile) {
  auto loaded = LoadedArtifact::loadFromFile(dir + "/nope.tsr");
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("nope.tsr: cannot open"),
            std::string::npos);
}

TEST_F(ArtifactTest, TooSmallForHeader) {
  expectError("TSRA", "smaller than the 24-byte .tsr header");
}

TEST_F(ArtifactTest, BadMagic) {
  std::string file = buildFile(buildPayload(softmaxRegression()));
  file[0] = 'X';
  expectError(file, "bad magic");
}

TEST_F(ArtifactTest, WrongVersion) {
  std::string file = buildFile(buildPayload(softmaxRegression()));
  file[4] = char(tessera::artifact::kFormatVersion + 1);
  expectError(file, "unsupported format version " +
                        std::to_string(tessera::artifact::kFormatVersion + 1) +
                        " (this runtime supports version " +
                        std::to_string(tessera::artifact::kFormatVersion) +
                        ")");
}

TEST_F(ArtifactTest, Truncated) {
  std::string file = buildFile(buildPayload(softmaxRegression()));
  size_t full = file.size();
  file.resize(full - 10);
  expectError(file, "truncated: expected " + std::to_string(full) +
                        " bytes, got " + std::to_string(full - 10));
}

TEST_F(ArtifactTest, TrailingBytes) {
  std::string file = buildFile(buildPayload(softmaxRegression()));
  expectError(file + "xx", "trailing bytes");
}

TEST_F(ArtifactTest, BadCrc) {
  std::string file = buildFile(buildPayload(softmaxRegression()));
  file[file.size() / 2] ^= 0x5a;
  expectError(file, "corrupted (CRC-32 mismatch");
}

TEST_F(ArtifactTest, FlatBufferVerifierRejectsGarbage) {
  std::string payload(64, '\xff');
  expectError(buildFile(payload), "FlatBuffer verification failed");
}

TEST_F(ArtifactTest, OutOfRangeTensorRef) {
  ArtifactDesc desc = softmaxRegression();
  auto &instr = desc.programs[0].function("microbatch")[0];
  instr.operands[2].offset = desc.programs[0].arenaBytes - 8;
  expectError(buildFile(buildPayload(desc)), "lies outside the arena of");
}

TEST_F(ArtifactTest, OutOfRangeBuffer) {
  ArtifactDesc desc = softmaxRegression();
  desc.programs[0].buffers[0].offset = desc.programs[0].arenaBytes;
  expectError(buildFile(buildPayload(desc)), "'fc.weight' (offset");
}

TEST_F(ArtifactTest, WrongOperandCount) {
  ArtifactDesc desc = softmaxRegression();
  desc.programs[0].function("microbatch")[0].operands.pop_back();
  expectError(buildFile(buildPayload(desc)), "Gemm expects 3 operands, got 2");
}

TEST_F(ArtifactTest, GemmOperandsShareAFloatFormat) {
  // A and B are both F32 or both BF16 (SameFloatDType); C is F32, or
  // their 16-bit format without accumulating (beta 0).
  ArtifactDesc desc = softmaxRegression();
  desc.programs[0].function("microbatch")[0].operands[0].dtype = fb::DType::BF16;
  expectError(buildFile(buildPayload(desc)),
              "Gemm operands A BF16");
  expectError(buildFile(buildPayload(desc)),
              "must be both F32 or both BF16 (mix formats with a Cast)");
  desc.programs[0].function("microbatch")[0].operands[1].dtype = fb::DType::BF16;
  desc.programs[0].function("microbatch")[0].operands[2].dtype = fb::DType::F16;
  expectError(buildFile(buildPayload(desc)),
              "Gemm result C F16");
  expectError(buildFile(buildPayload(desc)),
              "must be F32 or the format of its operands (A BF16");
  desc.programs[0].function("microbatch")[0].operands[2].dtype = fb::DType::BF16;
  desc.programs[0].function("microbatch")[0].beta = 1.0f;
  expectError(buildFile(buildPayload(desc)),
              "Gemm accumulates (beta 1) into the 16-bit C BF16");
}

TEST_F(ArtifactTest, BufferIndexOutOfRange) {
  ArtifactDesc desc = softmaxRegression();
  desc.programs[0].lossBuffer = 99;
  expectError(buildFile(buildPayload(desc)), "loss_buffer 99 out of range");
  desc = softmaxRegression();
  desc.programs[0].inputs[0].buffer = 42;
  expectError(buildFile(buildPayload(desc)), "buffer index 42 out of range");
}

TEST_F(ArtifactTest, WorldSizeMustMatchMesh) {
  ArtifactDesc desc = softmaxRegression();
  desc.mesh = {{"tp", 2}, {"dp", 1}};
  expectError(buildFile(buildPayload(desc)),
              "world_size 1 != product of mesh sizes 2");
}

TEST_F(ArtifactTest, InstructionsFollowTheirContractRow) {
  // Each check of the instruction contract (Opcodes.def) the loader makes,
  // one bad instruction at a time.
  using O = fb::Opcode;
  ArtifactDesc base = softmaxRegression(8, 4, 16, 2, 2);
  ProgramDesc &q = base.programs[0];
  // The base (with the scratch its instructions took) plus one instruction.
  auto withStep = [&](InstrDesc in) {
    ArtifactDesc desc = base;
    desc.programs[0].function("step").push_back(std::move(in));
    return buildFile(buildPayload(desc));
  };
  // A group on a kernel that takes none.
  InstrDesc relu = instr(O::Relu, {q.scratch({8, 4}), q.scratch({8, 4})}, "r");
  relu.group = "tp";
  expectError(withStep(relu), "(r): Relu takes no group, got 'tp'");
  // Gelu's form (erf or tanh) is its one integer attribute.
  expectError(withStep(instr(O::Gelu, {q.scratch({8, 4}), q.scratch({8, 4})},
                             "g")),
              "(g): Gelu expects 1 iattrs, got 0");
  // A collective without its group.
  expectError(withStep(instr(O::AllReduce, {q.scratch({4})}, "ar")),
              "(ar): collective AllReduce without a group");
  // A started collective without an event.
  InstrDesc start = instr(O::AllReduceStart, {q.scratch({4})}, "ars");
  start.group = "dp";
  expectError(withStep(start), "(ars): AllReduceStart needs an event id >= 0");
  // Operands that must share a dtype.
  expectError(withStep(instr(O::Copy,
                             {q.scratch({4}), q.scratch({4}, fb::DType::I32)},
                             "c")),
              "(c): Copy operands F32[4] and I32[4] must have the same dtype");
  // An attribute count and a value rule.
  InstrDesc fill = instr(O::Fill, {q.scratch({4})}, "f");
  expectError(withStep(fill), "(f): Fill expects 1 fattrs, got 0");
  InstrDesc dropout =
      instr(O::Dropout, {q.scratch({2, 2, 4}), q.scratch({2, 2, 4})}, "d");
  dropout.fattrs = {1.0f};
  dropout.iattrs = {0};
  expectError(withStep(dropout),
              "(d): Dropout needs fattrs = [rate] with rate in [0, 1), got 1");
}

TEST_F(ArtifactTest, MeshAndBatchProductsDoNotOverflow) {
  // Sizes whose products wrap around in 64 bits (2^32 * 2^32 = 2^64 = 0)
  // must not pass for a small world or batch.
  ArtifactDesc desc = softmaxRegression();
  desc.mesh = {{"tp", 2147483647}, {"pp", 2147483647}, {"dp", 4}};
  expectError(buildFile(buildPayload(desc)),
              "the product of the mesh sizes exceeds 2147483647");
  // (2^62 + 1) * 4 wraps to 4: it must not match a global batch of 4.
  desc = softmaxRegression();
  desc.microBatch = (int64_t(1) << 62) + 1;
  desc.numMicrobatches = 4;
  desc.globalBatch = 4;
  expectError(buildFile(buildPayload(desc)),
              "global_batch_size 4 != micro_batch_size 4611686018427387905");
}

TEST_F(ArtifactTest, GroupsMustPartitionTheWorld) {
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 2);
  desc.groups = {{"tp", {0}}, {"tp", {0}}, {"dp", {0, 1}}};
  expectError(buildFile(buildPayload(desc)),
              "rank 0 appears twice in groups of kind 'tp'");
  desc.groups = {{"tp", {0}}, {"tp", {1}}, {"dp", {0}}};
  expectError(buildFile(buildPayload(desc)),
              "rank 1 is in no group of kind 'dp'");
  desc.groups = {{"tp", {0}}, {"tp", {1}}, {"dp", {0, 1}}, {"ep", {1}}};
  expectError(buildFile(buildPayload(desc)),
              "rank 0 is in no group of kind 'ep'");
  desc.groups = {{"tp", {0}}, {"tp", {1}}, {"dp", {0, 1}}, {"dp", {2, 3}}};
  expectError(buildFile(buildPayload(desc)),
              "rank 2 in a group of kind 'dp' is outside world_size 2");
}

TEST_F(ArtifactTest, EmbeddingGroupsMayLeaveRanksOut) {
  // world 4 = dp 2 x pp 2 (pp slowest): embedding = first and last rank of
  // each pp group, position-embedding = the first.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 2);
  desc.worldSize = 4;
  desc.mesh = {{"tp", 1}, {"dp", 2}, {"pp", 2}};
  desc.groups = {{"tp", {0}},
                 {"tp", {1}},
                 {"tp", {2}},
                 {"tp", {3}},
                 {"dp", {0, 1}},
                 {"dp", {2, 3}},
                 {"pp", {0, 2}},
                 {"pp", {1, 3}},
                 {"embedding", {0, 2}},
                 {"embedding", {1, 3}},
                 {"position-embedding", {0}},
                 {"position-embedding", {1}}};
  std::string path = write("embedding.tsr", buildFile(buildPayload(desc)));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  GroupPosition pos =
      findGroupPosition(*(*loaded)->root(), "position-embedding", 2);
  EXPECT_EQ(pos.group, nullptr);
  EXPECT_TRUE(hasGroupKind(*(*loaded)->root(), "position-embedding"));
  EXPECT_TRUE(mayLeaveRanksOut("embedding"));
  EXPECT_FALSE(mayLeaveRanksOut("dp"));

  // They must still be disjoint, inside the world and equally sized.
  ArtifactDesc twice = desc;
  twice.groups.back() = {"position-embedding", {0}};
  expectError(buildFile(buildPayload(twice)),
              "rank 0 appears twice in groups of kind 'position-embedding'");
  ArtifactDesc uneven = desc;
  uneven.groups[9] = {"embedding", {1}};
  expectError(buildFile(buildPayload(uneven)),
              "rank groups of kind 'embedding' have different sizes (2 and 1)");
  ArtifactDesc outside = desc;
  outside.groups.back() = {"position-embedding", {4}};
  expectError(buildFile(buildPayload(outside)),
              "rank 4 in a group of kind 'position-embedding' is outside "
              "world_size 4");
}

TEST_F(ArtifactTest, ExecutorValidateNamesRankOutsideEmbeddingGroup) {
  // world 2 = pp 2: the embedding kind holds rank 0 only, yet the one program
  // (run by both stages) has a collective over it.
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 1);
  desc.worldSize = 2;
  desc.mesh = {{"tp", 1}, {"dp", 1}, {"pp", 2}};
  desc.groups = {{"tp", {0}}, {"tp", {1}},    {"dp", {0}},
                 {"dp", {1}}, {"pp", {0, 1}}, {"position-embedding", {0}}};
  ProgramDesc second = desc.programs[0];
  second.ppRank = 1;
  InstrDesc ar = instr(fb::Opcode::AllReduce, {second.ref(1)}, "emb.sync");
  ar.group = "position-embedding";
  second.function("step").push_back(ar);
  desc.programs.push_back(second);
  std::string path = write("emb.tsr", buildFile(buildPayload(desc)));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  Status st = Executor::validate(**loaded);
  ASSERT_FALSE(st.ok());
  for (const char *needle :
       {"rank 1 is in no rank group of kind 'position-embedding'",
        "AllReduce at emb.sync", "program 1 function 'step'"})
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST_F(ArtifactTest, BatchMustBeConsistent) {
  ArtifactDesc desc = softmaxRegression();
  desc.globalBatch = 7;
  expectError(buildFile(buildPayload(desc)), "global_batch_size 7 !=");
}

TEST_F(ArtifactTest, CollectiveGroupMustExist) {
  ArtifactDesc desc = softmaxRegression(8, 4, 16, 2, 2);
  for (auto &in : desc.programs[0].function("step"))
    if (in.op == fb::Opcode::AllReduce)
      in.group = "cp";
  expectError(buildFile(buildPayload(desc)), "group kind 'cp'");
}

TEST_F(ArtifactTest, ExecutorValidateCatchesShapeMismatch) {
  ArtifactDesc desc = softmaxRegression();
  auto &gemm = desc.programs[0].function("microbatch")[0];
  gemm.transB = true; // [16,8] @ [4,8]^T... k mismatch with [8,4]
  std::string path = write("shape.tsr", buildFile(buildPayload(desc)));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  Status st = Executor::validate(**loaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("instruction 0 (Gemm at fc)"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(path), std::string::npos);
}

TEST_F(ArtifactTest, WriteArtifactFileRoundTrips) {
  std::string payload = buildPayload(softmaxRegression());
  std::string path = dir + "/written.tsr";
  ASSERT_TRUE(
      writeArtifactFile(path, reinterpret_cast<const uint8_t *>(payload.data()),
                        payload.size())
          .ok());
  EXPECT_TRUE(LoadedArtifact::loadFromFile(path).ok());
}

//===----------------------------------------------------------------------===//
// Pipelines: schedules, slots, Send/Recv
//===----------------------------------------------------------------------===//

TEST_F(ArtifactTest, PipelineArtifactsLoadAndValidate) {
  for (const ArtifactDesc &desc : {slottedSchedule(), twoStagePipeline(4)}) {
    std::string path = write("pp.tsr", buildFile(buildPayload(desc)));
    auto loaded = LoadedArtifact::loadFromFile(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
    Status st = Executor::validate(**loaded);
    EXPECT_TRUE(st.ok()) << st.toString();
    std::string summary = summarizeArtifact(**loaded);
    EXPECT_NE(summary.find("schedule 1f1b"), std::string::npos) << summary;
    EXPECT_NE(summary.find("2 slots of"), std::string::npos) << summary;
  }
  // Send/Recv make "pp" a communicator kind.
  ArtifactDesc desc = twoStagePipeline();
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "pp.tsr");
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(collectiveGroupKinds(*(*loaded)->root()),
            (std::vector<std::string>{"dp", "pp"}));
}

TEST_F(ArtifactTest, BadScheduleSteps) {
  auto withStep = [](int index, ScheduleStepDesc step) {
    ArtifactDesc desc = slottedSchedule();
    desc.programs[0].schedule[size_t(index)] = step;
    return buildFile(buildPayload(desc));
  };
  ScheduleStepDesc badFunction{"", 0, 0, 7};
  expectError(withStep(0, badFunction),
              "program 0: schedule step 0: function index 7 out of range "
              "(3 functions)");
  expectError(withStep(1, {"forward_c0", 1, 2}),
              "schedule step 1 ('forward_c0' microbatch 1): slot 2 out of "
              "range (the function has 2 slots)");
  expectError(withStep(1, {"forward_c0", 5, 1}),
              "schedule step 1 ('forward_c0' microbatch 5): microbatch out of "
              "range (num_microbatches 2)");
  expectError(withStep(1, {"forward_c0", 0, 1}),
              "runs 'forward_c0' for microbatch 0 a second time (first at "
              "step 0)");
  expectError(withStep(0, {"step", 0, 0}), "'step' cannot be a schedule step");
  // Backward of microbatch 0 before its forward.
  {
    ArtifactDesc desc = slottedSchedule();
    std::swap(desc.programs[0].schedule[0], desc.programs[0].schedule[2]);
    expectError(buildFile(buildPayload(desc)),
                "schedule step 0 runs 'backward_c0' for microbatch 0 before "
                "its forward (step 2)");
  }
  // A microbatch never run.
  {
    ArtifactDesc desc = slottedSchedule();
    desc.programs[0].schedule.pop_back();
    expectError(buildFile(buildPayload(desc)),
                "the schedule never runs 'backward_c0' for microbatch 1");
  }
  // Backward on another slot than its forward.
  expectError(withStep(3, {"backward_c0", 1, 0}),
              "runs 'backward_c0' for microbatch 1 on slot 0 but its forward "
              "(step 1) ran on slot 1");
  // Two microbatches in flight on one slot.
  {
    ArtifactDesc desc = slottedSchedule(2, 2);
    auto &s = desc.programs[0].schedule;
    s[1].slot = 0;
    s[3].slot = 0;
    expectError(buildFile(buildPayload(desc)),
                "schedule step 1 runs 'forward_c0' for microbatch 1 on slot 0, "
                "which still holds microbatch 0 (its backward runs at step "
                "2)");
  }
}

// A split backward (ZB-H1's B and W): the weight-gradient phase
// backward_w_c<k> runs after its backward on the same slot, and the slot
// stays held until it has run.
TEST_F(ArtifactTest, SplitBackwardHoldsTheSlotUntilW) {
  auto split = [](std::vector<ScheduleStepDesc> order) {
    ArtifactDesc desc = slottedSchedule(2, 2);
    ProgramDesc &p = desc.programs[0];
    p.function("backward_w_c0");
    p.functionAttrs["backward_w_c0"] = p.functionAttrs["backward_c0"];
    p.schedule = std::move(order);
    p.scheduleKind = "zb-h1";
    return buildFile(buildPayload(desc));
  };
  {
    auto loaded = LoadedArtifact::loadFromMemory(
        split({{"forward_c0", 0, 0},
               {"forward_c0", 1, 1},
               {"backward_c0", 0, 0},
               {"backward_w_c0", 0, 0},
               {"backward_c0", 1, 1},
               {"backward_w_c0", 1, 1}}),
        "zb.tsr");
    ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
    Status st = Executor::validate(**loaded);
    EXPECT_TRUE(st.ok()) << st.toString();
  }
  expectError(split({{"forward_c0", 0, 0},
                     {"backward_w_c0", 0, 0},
                     {"backward_c0", 0, 0},
                     {"forward_c0", 1, 1},
                     {"backward_c0", 1, 1},
                     {"backward_w_c0", 1, 1}}),
              "schedule step 1 runs 'backward_w_c0' for microbatch 0 before "
              "its backward (step 2)");
  expectError(split({{"forward_c0", 0, 0},
                     {"forward_c0", 1, 1},
                     {"backward_c0", 0, 0},
                     {"backward_w_c0", 0, 1},
                     {"backward_c0", 1, 1},
                     {"backward_w_c0", 1, 1}}),
              "runs 'backward_w_c0' for microbatch 0 on slot 1 but its "
              "backward (step 2) ran on slot 0");
  // A weight-gradient phase has no Send/Recv.
  {
    ArtifactDesc desc = slottedSchedule(2, 2);
    ProgramDesc &p = desc.programs[0];
    p.function("backward_w_c0").push_back(
        [&] {
          InstrDesc in = instr(fb::Opcode::Send,
                               {p.function("backward_c0").front().operands[0]},
                               "send.w");
          in.iattrs = {1, 0};
          in.group = "pp";
          return in;
        }());
    p.functionAttrs["backward_w_c0"] = p.functionAttrs["backward_c0"];
    p.schedule = {{"forward_c0", 0, 0}, {"forward_c0", 1, 1},
                  {"backward_c0", 0, 0}, {"backward_w_c0", 0, 0},
                  {"backward_c0", 1, 1}, {"backward_w_c0", 1, 1}};
    expectError(buildFile(buildPayload(desc)),
                "Send in a weight-gradient phase (backward_w*)");
  }
  // The backward ran, W not yet: the slot is not free.
  expectError(split({{"forward_c0", 0, 0},
                     {"backward_c0", 0, 0},
                     {"forward_c0", 1, 0},
                     {"backward_w_c0", 0, 0},
                     {"backward_c0", 1, 0},
                     {"backward_w_c0", 1, 0}}),
              "schedule step 2 runs 'forward_c0' for microbatch 1 on slot 0, "
              "which still holds microbatch 0 (its weight gradients run at "
              "step 3)");
}

// The chunk whose forwards fill a slotted input: under an interleaved
// schedule another chunk may hold the slot, so the input names its own.
TEST_F(ArtifactTest, SlottedInputNamesItsChunk) {
  ArtifactDesc desc = slottedSchedule(2);
  desc.programs[0].inputs[0].chunk = -1;
  expectError(buildFile(buildPayload(desc)),
              "input 'features' lies in the slot region of chunk 0 but names "
              "chunk -1 (InputSpec.chunk: the chunk whose forwards fill it)");
}

TEST_F(ArtifactTest, SlotRegionMustFitTheArena) {
  ArtifactDesc desc = slottedSchedule(2);
  FunctionAttrs &attrs = desc.programs[0].functionAttrs["forward_c0"];
  attrs.numSlots = 3;
  expectError(buildFile(buildPayload(desc)),
              "function 'forward_c0': 3 slots of " +
                  std::to_string(attrs.slotBytes) + " bytes at slot_base " +
                  std::to_string(attrs.slotBase) + " exceed the arena of");
  desc = slottedSchedule(2);
  desc.programs[0].functionAttrs["backward_c0"].slotBytes = -8;
  expectError(buildFile(buildPayload(desc)),
              "function 'backward_c0': slot region needs slot_base >= 0 and "
              "slot_bytes >= 0");
  desc = slottedSchedule(2);
  desc.programs[0].functionAttrs["forward_c0"].chunk = 1;
  expectError(buildFile(buildPayload(desc)),
              "function 'forward_c0': chunk 1 out of range (num_chunks 1)");
  desc = slottedSchedule(2);
  desc.programs[0].functionAttrs["forward_c0"].slotBase += 16;
  desc.programs[0].arenaBytes += 64;
  expectError(buildFile(buildPayload(desc)), "input 'features' (bytes");
}

TEST_F(ArtifactTest, BadSendRecv) {
  auto edit = [](auto &&change) {
    ArtifactDesc desc = twoStagePipeline();
    // Stage 0's forward: [Copy, Send].
    change(desc.programs[0].function("forward_c0")[1]);
    return buildFile(buildPayload(desc));
  };
  expectError(edit([](InstrDesc &in) {
                in.iattrs = {2, 0};
              }),
              "program 0 function 'forward_c0' instruction 1 (send.act): Send "
              "needs iattrs = [peer, tag] with peer +1 (next pp rank), -1 "
              "(previous) or 0 (itself), got peer 2");
  expectError(edit([](InstrDesc &in) { in.iattrs = {1}; }),
              "Send expects 2 iattrs, got 1");
  expectError(
      edit([](InstrDesc &in) { in.operands.push_back(in.operands[0]); }),
      "Send expects 1 operands, got 2");
  expectError(edit([](InstrDesc &in) { in.group = "tp"; }),
              "Send runs over the pipeline group 'pp', not 'tp'");
  expectError(edit([](InstrDesc &in) {
                in.iattrs = {-1, -4};
              }),
              "Send tag -4 outside [0, 32767]");
}

TEST_F(ArtifactTest, MixedPrecisionArtifactLoads) {
  ArtifactDesc desc = mixedPrecisionRegression(8, 4, 16, 2, 1, true);
  std::string path = write("mp.tsr", buildFile(buildPayload(desc)));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  std::string summary = summarizeArtifact(**loaded);
  EXPECT_NE(summary.find("main:fc.weight MainParam F32[8, 4]"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("fc.weight Param BF16[8, 4]"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("function init: 2 instructions"), std::string::npos)
      << summary;
}

TEST_F(ArtifactTest, MainParamAndCastChecks) {
  using K = fb::BufferKind;
  auto with = [](auto edit) {
    ArtifactDesc desc = mixedPrecisionRegression();
    edit(desc.programs[0]);
    return buildFile(buildPayload(desc));
  };
  // Buffers 0 fc.weight, 1 fc.bias, 2 main:fc.weight, 3 main:fc.bias,
  // 4 grad:fc.weight.
  expectError(with([](ProgramDesc &p) { p.buffers[2].of = 40; }),
              "buffer 2 'main:fc.weight' refers to param buffer 40 but there "
              "are only");
  expectError(with([](ProgramDesc &p) { p.buffers[2].of = 4; }),
              "buffer 2 'main:fc.weight' refers to buffer 4 'grad:fc.weight' "
              "of kind Grad, not a parameter");
  expectError(with([](ProgramDesc &p) { p.buffers[2].of = 1; }),
              "buffer 2 'main:fc.weight' has shape [8, 4], but its parameter "
              "'fc.bias' has shape [4]");
  expectError(
      with([](ProgramDesc &p) { p.buffers[3].dtype = fb::DType::BF16; }),
      "buffer 3 'main:fc.bias' is a main param of dtype BF16 (main "
      "params are F32)");
  expectError(with([](ProgramDesc &p) { p.buffers[1].dtype = fb::DType::I32; }),
              "buffer 1 'fc.bias' is a parameter of dtype I32 (parameters "
              "are F32, BF16 or F16)");
  expectError(with([](ProgramDesc &p) {
                p.function("init")[0].operands.push_back(p.ref(0));
              }),
              "function 'init' instruction 0 (main.w): Cast expects 2 "
              "operands, got 3");
  // A bucket shard's main params have no parameter (of = -1).
  std::string path =
      write("shard.tsr", with([](ProgramDesc &p) {
              p.add("main:pbuf:gb:0", K::MainParam, {18}, fb::DType::F32);
            }));
  EXPECT_TRUE(LoadedArtifact::loadFromFile(path).ok());
}

TEST_F(ArtifactTest, InitIsNoScheduleStep) {
  ArtifactDesc desc = slottedSchedule();
  desc.programs[0].function("init");
  desc.programs[0].schedule[0] = {"init", 0, 0};
  expectError(buildFile(buildPayload(desc)),
              "schedule step 0 ('init' microbatch 0): 'init' cannot be a "
              "schedule step (it runs once, before the first iteration)");
}

//===----------------------------------------------------------------------===//
// Rank-relative refs (format version 5)
//===----------------------------------------------------------------------===//

namespace {

/// shardedBuckets(1, 2, 8) with an extra Fill of `bad` in "mark".
ArtifactDesc withRankRelativeRef(RefDesc bad) {
  ArtifactDesc desc = shardedBuckets(1, 2, 8);
  InstrDesc fill = instr(fb::Opcode::Fill, {std::move(bad)}, "bad.shard");
  fill.fattrs = {0.0f};
  desc.programs[0].function("mark").push_back(fill);
  return desc;
}

} // namespace

TEST_F(ArtifactTest, RankRelativeRefsLoad) {
  std::string path =
      write("ok.tsr", buildFile(buildPayload(shardedBuckets(2, 2, 8))));
  auto loaded = LoadedArtifact::loadFromFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_TRUE(Executor::validate(**loaded).ok());
}

TEST_F(ArtifactTest, RankRelativeRefOverUnknownGroup) {
  ArtifactDesc base = shardedBuckets(1, 2, 8);
  RefDesc r = rankBlock(base.programs[0].ref(0), {8}, "cp");
  expectError(buildFile(buildPayload(withRankRelativeRef(r))),
              "function 'mark' instruction 2 (bad.shard): operand 0 is relative to rank "
              "group kind 'cp' but the artifact has no rank groups of that "
              "kind");
}

TEST_F(ArtifactTest, RankRelativeRefOutsideTheArenaForTheLastRank) {
  ArtifactDesc base = shardedBuckets(1, 2, 8);
  int64_t arena = base.programs[0].arenaBytes;
  // Index 0 fits exactly at the end of the arena, index 1 does not.
  RefDesc r{arena - 32, {8}, fb::DType::F32, "dp", 32};
  expectError(buildFile(buildPayload(withRankRelativeRef(r))),
              "instruction 2 (bad.shard): operand 0 (offset " + std::to_string(arena - 32) +
                  " + i * 32 for dp index i < 2, 32 bytes, shape [8]) lies "
                  "outside the arena of " +
                  std::to_string(arena) + " bytes for dp index 1");
  // The whole bucket inside: loads.
  r.offset = arena - 64;
  std::string path =
      write("edge.tsr", buildFile(buildPayload(withRankRelativeRef(r))));
  EXPECT_TRUE(LoadedArtifact::loadFromFile(path).ok());
}

TEST_F(ArtifactTest, RankRelativeRefMisaligned) {
  ArtifactDesc base = shardedBuckets(1, 2, 8);
  RefDesc stride{0, {8}, fb::DType::F32, "dp", 30};
  expectError(buildFile(buildPayload(withRankRelativeRef(stride))),
              "operand 0 (offset 0 + i * 30 for dp index i < 2, 32 bytes, "
              "shape [8]) is not aligned to its F32 elements (4 bytes)");
  RefDesc offset{2, {8}, fb::DType::F32, "dp", 32};
  expectError(buildFile(buildPayload(withRankRelativeRef(offset))),
              "is not aligned to its F32 elements");
  // bf16: 2-byte steps are aligned.
  RefDesc half{2, {8}, fb::DType::BF16, "dp", 18};
  std::string path =
      write("half.tsr", buildFile(buildPayload(withRankRelativeRef(half))));
  EXPECT_TRUE(LoadedArtifact::loadFromFile(path).ok());
}

TEST_F(ArtifactTest, RankRelativeRefStride) {
  RefDesc negative{64, {8}, fb::DType::F32, "dp", -32};
  expectError(buildFile(buildPayload(withRankRelativeRef(negative))),
              "operand 0 has negative rank_stride -32");
  RefDesc noGroup{0, {8}, fb::DType::F32, "", 32};
  expectError(buildFile(buildPayload(withRankRelativeRef(noGroup))),
              "operand 0 has rank_stride 32 but no rank_group");
}

// Found by the artifact_loader fuzzer (fuzz/): products of dimensions and
// sums of offsets overflowed int64 (undefined behaviour) instead of failing
// the arena check.
TEST_F(ArtifactTest, StagedBuffersAndParameterShardsAreChecked) {
  ArtifactDesc desc = zero3Bucket();
  auto ok = LoadedArtifact::loadFromFile(
      write("zero3.tsr", buildFile(buildPayload(desc))));
  ASSERT_TRUE(ok.ok()) << ok.status().toString();
  // A staged parameter past the staging space.
  desc.programs[0].buffers[1].offset = 512;
  expectError(buildFile(buildPayload(desc)),
              "buffer 1 'v' (offset 512, 16 bytes) lies outside the staging "
              "space of 512 bytes");
  // A shard of a bucket view that is not staged, of one of another size,
  // of no view, over a group kind the mesh lacks; a staged gradient.
  desc = zero3Bucket();
  desc.programs[0].buffers[2].staged = false;
  expectError(buildFile(buildPayload(desc)),
              "'pshard:b:0' is the shard of buffer 2 'pbuf:b:0', which is not "
              "a staged bucket view of its dtype");
  desc = zero3Bucket();
  desc.programs[0].buffers[2].shape = {256};
  desc.programs[0].stagingBytes = 1024;
  expectError(buildFile(buildPayload(desc)),
              "'pshard:b:0' holds 128 elements, not 1/1 of its bucket view's "
              "256");
  desc = zero3Bucket();
  desc.programs[0].buffers[3].of = -1;
  expectError(buildFile(buildPayload(desc)),
              "is a parameter shard without its bucket view (of -1)");
  desc = zero3Bucket();
  desc.programs[0].buffers[3].rankGroup = "edp";
  expectError(buildFile(buildPayload(desc)),
              "is split over group 'edp', which has no rank groups");
  // A staged parameter that no shard's view covers: its value would never
  // reach the device.
  desc = zero3Bucket();
  desc.programs[0].buffers[1].offset = 448;
  desc.programs[0].buffers[2].shape = {112};
  desc.programs[0].buffers[3].shape = {112};
  expectError(buildFile(buildPayload(desc)),
              "buffer 1 'v' is a staged parameter outside every bucket view of "
              "its dtype that a parameter shard holds");
  desc = zero3Bucket();
  desc.programs[0].buffers[4].staged = true;
  expectError(buildFile(buildPayload(desc)),
              "buffer 4 'loss' of kind Loss is staged (only parameters and "
              "their bucket views are)");
  // A negative staging space.
  desc = zero3Bucket();
  desc.programs[0].stagingBytes = -8;
  expectError(buildFile(buildPayload(desc)),
              "program 0: negative staging_bytes -8");
}

TEST_F(ArtifactTest, HugeShapesAndOffsetsAreRejectedWithoutOverflow) {
  const int64_t big = int64_t(1) << 40, top = INT64_MAX - 3; // 4-aligned
  ArtifactDesc desc = softmaxRegression();
  desc.programs[0].buffers[0].shape = {big, big};
  expectError(buildFile(buildPayload(desc)),
              "buffer 0 'fc.weight' of shape [1099511627776, 1099511627776] "
              "has more than 2^63 bytes");

  desc = softmaxRegression();
  desc.programs[0].buffers[0].offset = top;
  expectError(buildFile(buildPayload(desc)), "'fc.weight' (offset " +
                                                 std::to_string(top));

  desc = softmaxRegression();
  desc.programs[0].function("microbatch")[0].operands[2].shape = {big, big};
  expectError(buildFile(buildPayload(desc)), "has more than 2^63 bytes");

  desc = softmaxRegression();
  desc.programs[0].function("microbatch")[0].operands[2].offset = top;
  expectError(buildFile(buildPayload(desc)), "lies outside the arena of");

  // Rank-relative: offset + (size - 1) * stride + bytes past INT64_MAX.
  RefDesc r{top - 28, {8}, fb::DType::F32, "dp", 32};
  expectError(buildFile(buildPayload(withRankRelativeRef(r))),
              "lies outside the arena of");
}

// Found by the artifact_loader fuzzer: FlatBuffers' verifier (2.0) checks
// the alignment of a vector's length field but not of its elements, so a
// payload could hold a shape whose int64 elements are misaligned.
TEST_F(ArtifactTest, MisalignedInt64VectorIsRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  // A one-element [long] vector built from 4-byte words (the builder would
  // align real int64 elements), its data at 4 mod 8 from the buffer's end
  // (the finished buffer's size is a multiple of 8: `offset` below is an
  // int64 field).
  fbb.StartVector(3, sizeof(int32_t));
  fbb.PushElement<int32_t>(0);
  fbb.PushElement<int32_t>(4);
  if (fbb.GetSize() % 8 == 0)
    fbb.PushElement<int32_t>(0);
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> shape(fbb.EndVector(1));
  auto buffer = fb::CreateBuffer(fbb, fbb.CreateString("w"),
                                 fb::BufferKind::Param, fb::DType::F32,
                                 /*offset=*/64, shape);
  auto buffers = fbb.CreateVector(std::vector{buffer});
  fb::ProgramBuilder program(fbb);
  program.add_buffers(buffers);
  auto programs = fbb.CreateVector(std::vector{program.Finish()});
  fb::ArtifactBuilder artifact(fbb);
  artifact.add_programs(programs);
  fb::FinishArtifactBuffer(fbb, artifact.Finish());
  std::string payload(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
                      fbb.GetSize());
  const auto *root = fb::GetArtifact(payload.data());
  const auto *data = root->programs()->Get(0)->buffers()->Get(0)->shape()->data();
  ASSERT_EQ((reinterpret_cast<const char *>(data) - payload.data()) % 8, 4);
  expectError(buildFile(payload), "program 0 buffer 0: int64 vector not "
                                  "8-byte aligned (malformed payload)");
}

// Found by the artifact_loader fuzzer under clang's UBSan: Executor::validate
// decodes without an arena, and the decoder added operand offsets to its
// null base (undefined behaviour).
TEST_F(ArtifactTest, ExecutorValidateDecodesWithoutAnArena) {
  for (const ArtifactDesc &desc :
       {softmaxRegression(), twoStagePipeline(), slottedSchedule(),
        shardedBuckets(2, 2, 4), mixedPrecisionRegression()}) {
    auto loaded =
        LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "m.tsr");
    ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
    Status st = Executor::validate(**loaded);
    EXPECT_TRUE(st.ok()) << st.toString();
  }
}

// Found by the artifact_loader fuzzer: Executor::validate's decoder
// multiplied dimensions of empty tensors and attribute values past int64
// (numElements of [2^40, 2^40, 0], 3 * num_heads). The loader admits these
// artifacts (an empty tensor has 0 bytes); the decoder must stay defined
// and name what is wrong.
TEST_F(ArtifactTest, DecoderArithmeticDoesNotOverflow) {
  using O = fb::Opcode;
  const int64_t big = int64_t(1) << 40;
  auto validate = [](const ArtifactDesc &desc) {
    auto loaded =
        LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "m.tsr");
    EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
    return loaded.ok() ? Executor::validate(**loaded)
                       : Status(loaded.status());
  };
  ArtifactDesc desc = softmaxRegression();
  ProgramDesc &p = desc.programs[0];
  InstrDesc fill = instr(O::Fill, {p.scratch({4})}, "empty");
  fill.operands[0].shape = {big, big, 0};
  fill.fattrs = {0.0f};
  p.function("step").push_back(fill);
  InstrDesc copy = instr(O::Copy, {p.scratch({4}), p.scratch({4})}, "copy");
  copy.operands[0].shape = {0, big, big};
  copy.operands[1].shape = {big, 0, big};
  p.function("step").push_back(copy);
  Status st = validate(desc);
  EXPECT_TRUE(st.ok()) << st.toString();

  desc = softmaxRegression();
  InstrDesc attention = instr(
      O::Attention,
      {desc.programs[0].scratch({2, 1, 12}), desc.programs[0].scratch({2, 1, 4})},
      "attn");
  attention.iattrs = {int64_t(1) << 62, 0};
  desc.programs[0].function("step").push_back(attention);
  st = validate(desc);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is not divisible by 3 * num_heads "
                              "(4611686018427387904)"),
            std::string::npos)
      << st.message();
}

// Found by the artifact_loader fuzzer: a program without a buffers vector
// loaded and validated, and describeCheckpoint (like the executor and the
// checkpoint loader) dereferenced the missing vector.
TEST_F(ArtifactTest, ProgramWithoutBuffersIsRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  fb::ProgramBuilder program(fbb);
  program.add_arena_bytes(0);
  auto programs = fbb.CreateVector(std::vector{program.Finish()});
  auto batch = fb::CreateBatch(fbb, 1, 1, 1);
  fb::ArtifactBuilder artifact(fbb);
  artifact.add_world_size(1);
  artifact.add_programs(programs);
  artifact.add_batch(batch);
  fb::FinishArtifactBuffer(fbb, artifact.Finish());
  std::string payload(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
                      fbb.GetSize());
  expectError(buildFile(payload), "program 0: missing buffers");
}

// Found by the artifact_loader fuzzer (a timeout): Executor::validate
// decoded every function once per microbatch slot, and num_slots is an
// int32 bounded only by the arena, which validation does not allocate.
TEST_F(ArtifactTest, ExecutorValidateDoesNotDecodeEverySlot) {
  ArtifactDesc desc = slottedSchedule(2);
  desc.programs[0].arenaBytes = int64_t(1) << 60;
  for (auto &[name, attrs] : desc.programs[0].functionAttrs)
    if (attrs.numSlots > 1)
      attrs.numSlots = INT32_MAX;
  auto loaded =
      LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), "m.tsr");
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  auto start = std::chrono::steady_clock::now();
  Status st = Executor::validate(**loaded);
  EXPECT_TRUE(st.ok()) << st.toString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// An artifact's initial-value data file (data_file, relative to data_dir):
// read only inside its directory, with symbolic links resolved; an artifact
// moved with its data finds it beside itself; nothing else is opened.
TEST(DataFileTest, StaysInsideItsDirectory) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() /
                  ("tessera-data-file-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "model");
  fs::create_directories(root / "run");
  std::ofstream(root / "model/w.data") << "weights";
  std::ofstream(root / "secret.data") << "secret";
  const std::string model = (root / "model").string();
  const std::string artifact = (root / "run/a.tsr").string();

  auto ok = resolveDataFile("w.data", model, artifact);
  ASSERT_TRUE(ok.ok()) << ok.status().toString();
  EXPECT_EQ(*ok, fs::canonical(root / "model/w.data").string());

  auto expectError = [&](const std::string &file, const std::string &part) {
    auto r = resolveDataFile(file, model, artifact);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_NE(r.status().message().find(part), std::string::npos)
        << r.status().message();
  };
  expectError((root / "secret.data").string(), "is not a path relative");
  expectError("../secret.data", "leaves its data directory ('..')");
  fs::create_symlink(root / "secret.data", root / "model/link.data");
  expectError("link.data", "outside its directory");
  expectError("none.data", "cannot find the data file 'none.data'");

  // Moved: the recorded directory no longer holds it, the artifact's does.
  fs::rename(root / "model/w.data", root / "run/w.data");
  ok = resolveDataFile("w.data", model, artifact);
  ASSERT_TRUE(ok.ok()) << ok.status().toString();
  EXPECT_EQ(*ok, fs::canonical(root / "run/w.data").string());
  fs::remove_all(root);
}
