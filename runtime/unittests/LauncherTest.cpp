//===- LauncherTest.cpp - tessera-run command line and end to end ---------===//

#include "TestArtifacts.h"
#include "backends/cpu/BlasCore.h"
#include "launcher/LauncherInternal.h"

#include "tessera/rt/Launcher.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

using namespace tessera::rt;
using namespace tessera::rt::test;

#ifndef TESSERA_RUN_PATH
#error "TESSERA_RUN_PATH must point at the tessera-run binary"
#endif

namespace {

StatusOr<LaunchOptions> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tessera-run");
  std::vector<char *> argv;
  for (auto &a : args)
    argv.push_back(a.data());
  return parseLaunchOptions(int(argv.size()), argv.data());
}

struct RunResult {
  int exitCode = -1;
  std::string output;
};

/// Runs the shell command `cmd` (stderr with stdout).
RunResult runCommand(const std::string &command) {
  std::string cmd = command + " 2>&1";
  RunResult result;
  FILE *pipe = popen(cmd.c_str(), "r");
  if (!pipe)
    return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0)
    result.output.append(buf, n);
  int status = pclose(pipe);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

RunResult runTool(const std::string &args) {
  return runCommand(std::string(TESSERA_RUN_PATH) + " " + args);
}

class LauncherTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-launcher-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    (void)std::system(("rm -rf '" + dir + "'").c_str());
  }
  std::string write(const std::string &name, const ArtifactDesc &desc) {
    std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << buildFile(buildPayload(desc));
    return path;
  }
  std::vector<double> readLosses(const std::string &metrics) {
    std::ifstream in(metrics);
    std::vector<double> losses;
    std::string line;
    while (std::getline(in, line)) {
      size_t pos = line.find("\"loss\": ");
      EXPECT_NE(pos, std::string::npos) << line;
      if (pos != std::string::npos)
        losses.push_back(std::stod(line.substr(pos + 8)));
    }
    return losses;
  }
  std::string dir;
};

} // namespace

TEST(LaunchOptionsTest, ParsesFlags) {
  auto o = parse({"-n", "4", "m.tsr", "--steps", "20", "--seed=7", "--metrics",
                  "out.jsonl", "--backend", "cpu", "--threads", "2"});
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_EQ(o->numRanks, 4);
  EXPECT_EQ(o->artifactPath, "m.tsr");
  EXPECT_EQ(o->steps, 20);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->metricsPath, "out.jsonl");
  EXPECT_EQ(o->threads, 2);
  auto d = parse({"m.tsr", "--steps", "1"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->seed, 1234u);
  EXPECT_EQ(d->backend, "cpu");
}

TEST(LaunchOptionsTest, CheckpointFlags) {
  auto o = parse({"m.tsr", "--steps", "10", "--save", "ck", "--save-interval",
                  "5", "--load=old", "--no-load-optim"});
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_EQ(o->saveDir, "ck");
  EXPECT_EQ(o->saveInterval, 5);
  EXPECT_EQ(o->loadDir, "old");
  EXPECT_TRUE(o->noLoadOptim);
  auto d = parse({"m.tsr", "--steps", "1"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->saveInterval, 0);
  EXPECT_FALSE(d->noLoadOptim);
  EXPECT_FALSE(parse({"m.tsr", "--steps", "1", "--save-interval", "2"}).ok());
  EXPECT_FALSE(
      parse({"m.tsr", "--steps", "1", "--save", "d", "--save-interval", "0"})
          .ok());
  EXPECT_FALSE(parse({"m.tsr", "--steps", "1", "--no-load-optim"}).ok());
  EXPECT_FALSE(parse({"m.tsr", "--steps", "1", "--save", ""}).ok());
  EXPECT_NE(launchUsage("tessera-run").find("total iteration count"),
            std::string::npos);
}

TEST(LaunchOptionsTest, UsageErrors) {
  EXPECT_FALSE(parse({"m.tsr", "--steps", "1", "--bogus"}).ok());
  EXPECT_FALSE(parse({"--steps", "1"}).ok());
  EXPECT_FALSE(parse({"m.tsr"}).ok());
  EXPECT_FALSE(parse({"m.tsr", "--steps", "x"}).ok());
  EXPECT_FALSE(parse({"-n", "0", "m.tsr", "--steps", "1"}).ok());
  EXPECT_FALSE(parse({"a.tsr", "b.tsr", "--steps", "1"}).ok());
  EXPECT_TRUE(parse({"m.tsr", "--print-summary"}).ok());
}

TEST_F(LauncherTest, UsageErrorExitsOne) {
  RunResult r = runTool("--steps 1 --bogus x.tsr");
  EXPECT_EQ(r.exitCode, 1) << r.output;
  EXPECT_NE(r.output.find("tessera-run: error: unknown option '--bogus'"),
            std::string::npos)
      << r.output;
  r = runTool(dir + "/missing.tsr --steps 1");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("missing.tsr: cannot open"), std::string::npos)
      << r.output;
}

TEST_F(LauncherTest, CorruptFileFailsFastWithoutMpi) {
  std::string path = write("bad.tsr", softmaxRegression());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x13');
  }
  RunResult r = runTool("-n 1 " + path + " --steps 1");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("tessera-run: error: " + path), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("corrupted"), std::string::npos) << r.output;
}

TEST_F(LauncherTest, WrongRankCountFailsFast) {
  std::string path = write("dp2.tsr", softmaxRegression(8, 4, 8, 1, 2));
  RunResult r = runTool("-n 3 " + path + " --steps 1");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("-n 3 does not match the world size 2"),
            std::string::npos)
      << r.output;
}

TEST_F(LauncherTest, PrintSummary) {
  std::string path = write("s.tsr", softmaxRegression());
  RunResult r = runTool(path + " --print-summary");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("fc.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("world size: 1"), std::string::npos) << r.output;
}

TEST_F(LauncherTest, DataParallelRunMatchesSingleRank) {
  std::string one = write("one.tsr", softmaxRegression(8, 4, 16, 2, 1));
  std::string two = write("two.tsr", softmaxRegression(8, 4, 8, 2, 2));
  RunResult a = runTool("-n 1 " + one + " --steps 4 --threads 1 --metrics " +
                        dir + "/one.jsonl");
  ASSERT_EQ(a.exitCode, 0) << a.output;
  RunResult b =
      runTool("-n 2 " + two + " --steps 4 --metrics " + dir + "/two.jsonl");
  ASSERT_EQ(b.exitCode, 0) << b.output;
  EXPECT_NE(b.output.find("iteration        4/       4 | consumed samples:"
                          "          128 |"),
            std::string::npos)
      << b.output;
  EXPECT_NE(b.output.find("world size 2"), std::string::npos) << b.output;
  auto la = readLosses(dir + "/one.jsonl");
  auto lb = readLosses(dir + "/two.jsonl");
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lb.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(la[i], lb[i], 1e-5 * la[i]);
  std::ifstream in(dir + "/two.jsonl");
  std::string first;
  std::getline(in, first);
  // gW: 32 floats, gb: 4 floats, all-reduced over dp=2 (ring: 1x bytes).
  EXPECT_NE(first.find("\"all_reduce\": {\"dp\": 144"), std::string::npos)
      << first;
  EXPECT_NE(first.find("\"step\": 1"), std::string::npos);
}

TEST(BlasCoreTest, SuggestsAvx512KernelsOnlyOverOlderOnes) {
  cpu::CpuFeatures avx2{/*avx=*/true, /*avx2=*/true, /*fma=*/true,
                        /*fma4=*/false, /*avx512=*/false,
                        /*avx512bf16=*/false};
  cpu::CpuFeatures avx512 = avx2;
  avx512.avx512 = true;
  cpu::CpuFeatures bf16 = avx512;
  bf16.avx512bf16 = true;
  EXPECT_EQ(cpu::suggestedBlasCore(avx2, "Haswell"), "");
  EXPECT_EQ(cpu::suggestedBlasCore(avx512, "Haswell"), "SkylakeX");
  EXPECT_EQ(cpu::suggestedBlasCore(avx512, "Zen"), "SkylakeX");
  EXPECT_EQ(cpu::suggestedBlasCore(bf16, "Zen"), "Cooperlake");
  EXPECT_EQ(cpu::suggestedBlasCore(bf16, "sandybridge"), "Cooperlake");
  // Already AVX-512, or a core this table does not know (newer than it).
  EXPECT_EQ(cpu::suggestedBlasCore(bf16, "SkylakeX"), "");
  EXPECT_EQ(cpu::suggestedBlasCore(bf16, "Cooperlake"), "");
  EXPECT_EQ(cpu::suggestedBlasCore(bf16, "Zen5"), "");
}

TEST(BlasCoreTest, ChecksNamesAndWhatTheCpuLacks) {
  cpu::CpuFeatures avx2{true, true, true, false, false, false};
  EXPECT_TRUE(cpu::checkBlasCore("Haswell", avx2).ok());
  EXPECT_TRUE(cpu::checkBlasCore("haswell", avx2).ok());
  EXPECT_TRUE(cpu::checkBlasCore("Prescott", cpu::CpuFeatures()).ok());
  Status s = cpu::checkBlasCore("Skylake", avx2);
  EXPECT_NE(s.message().find("--blas-core: 'Skylake' is not an OpenBLAS "
                             "x86-64 core (one of Prescott"),
            std::string::npos)
      << s.message();
  s = cpu::checkBlasCore("skylakex", avx2);
  EXPECT_NE(s.message().find("--blas-core SkylakeX: this CPU lacks AVX-512"),
            std::string::npos)
      << s.message();
  s = cpu::checkBlasCore("Cooperlake", cpu::CpuFeatures{true, true, true,
                                                        false, true, false});
  EXPECT_NE(s.message().find("lacks AVX-512 with AVX512_BF16"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(cpu::checkBlasCore("Zen", cpu::CpuFeatures()).ok());
  EXPECT_FALSE(cpu::checkBlasCore("Bulldozer", avx2).ok());
  EXPECT_TRUE(cpu::sameBlasCore("SkylakeX", "SKYLAKEX"));
  EXPECT_FALSE(cpu::sameBlasCore("Zen", "Zen4"));
}

// --blas-core names the kernels the ranks run: the one OpenBLAS runs here
// already (the test keeps this machine's OPENBLAS_CORETYPE), which the
// banner reports; names that are no core, or a core the CPU cannot run,
// stop before the ranks start.
TEST_F(LauncherTest, BlasCoreFlag) {
  std::string path = write("s.tsr", softmaxRegression());
  std::string running = cpu::runningBlasCore();
  RunResult r = runTool("-n 1 " + path + " --steps 1 --threads 1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("| OpenBLAS "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(" + running + " kernels)"), std::string::npos)
      << r.output;
  // Asking for the running core by name (an OpenBLAS newer than the table
  // may name one it does not know).
  if (cpu::checkBlasCore(running, cpu::hostCpuFeatures()).ok()) {
    r = runTool("-n 1 " + path + " --steps 1 --threads 1 --blas-core " +
                running);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    EXPECT_NE(r.output.find("(" + running + " kernels)"), std::string::npos)
        << r.output;
  }
  r = runTool("-n 1 " + path + " --steps 1 --blas-core Skylake");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("tessera-run: error: --blas-core: 'Skylake' is not "
                          "an OpenBLAS x86-64 core"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("iteration"), std::string::npos) << r.output;
  if (!cpu::hostCpuFeatures().fma4) {
    r = runTool("-n 1 " + path + " --steps 1 --blas-core Bulldozer");
    EXPECT_EQ(r.exitCode, 1);
    EXPECT_NE(r.output.find("--blas-core Bulldozer: this CPU lacks FMA4"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(parse({"m.tsr", "--steps", "1", "--blas-core", ""}).ok());
}

// Inside an MPI job started without tessera-run (the user's mpirun) the
// rank sets what the launcher would have exported and restarts itself
// before MPI_Init: --blas-core takes effect there too.
TEST_F(LauncherTest, BlasCoreInsideAJobOfTheUsersOwn) {
  std::string path = write("s.tsr", softmaxRegression());
  const std::string running = cpu::runningBlasCore();
  const std::string other = cpu::sameBlasCore(running, "Core2") ? "Prescott"
                                                                 : "Core2";
  RunResult r = runCommand("env -u OPENBLAS_CORETYPE mpirun --allow-run-as-root "
                           "--oversubscribe -n 1 " +
                           std::string(TESSERA_RUN_PATH) + " " + path +
                           " --steps 1 --threads 1 --blas-core " + other);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("(" + other + " kernels)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("iteration "), std::string::npos) << r.output;
}

// A rank's place on its node from the node names: its index among the
// ranks of its name, in world order, and their count.
TEST(NodePlaceTest, IndexAndCountAmongTheSameName) {
  const std::vector<std::string> names = {"a", "b", "a", "a", "b"};
  auto place = [&](int r) { return launcher::nodePlaceAmong(names, r); };
  EXPECT_EQ(place(0).index, 0);
  EXPECT_EQ(place(0).count, 3);
  EXPECT_EQ(place(2).index, 1);
  EXPECT_EQ(place(3).index, 2);
  EXPECT_EQ(place(1).index, 0);
  EXPECT_EQ(place(4).index, 1);
  EXPECT_EQ(place(4).count, 2);
  EXPECT_EQ(launcher::nodePlaceAmong({"only"}, 0).count, 1);
}

TEST_F(LauncherTest, RuntimeErrorOnRankAbortsWithExitOne) {
  ArtifactDesc desc = softmaxRegression(8, 4, 8, 1, 2);
  InstrDesc wait = instr(fb::Opcode::Wait, {}, "dangling.wait");
  wait.event = 9;
  desc.programs[0].function("step").push_back(wait);
  std::string path = write("err.tsr", desc);
  RunResult r = runTool("-n 2 " + path + " --steps 2");
  EXPECT_EQ(r.exitCode, 1) << r.output;
  EXPECT_NE(r.output.find("tessera-run: error: rank "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dangling.wait"), std::string::npos) << r.output;
}

TEST_F(LauncherTest, PipelineRunReportsLossP2pBytesAndTrace) {
  // 2 stages, 2 microbatches of [2, 4] f32: each stage sends 2 x 32 bytes
  // per step; both ranks report stage 1's loss.
  std::string path = write("pp2.tsr", twoStagePipeline(2, 2, 4));
  std::string metrics = dir + "/pp2.jsonl", trace = dir + "/pp2.json";
  RunResult r = runTool("-n 2 " + path + " --steps 2 --timeout 60 --metrics " +
                        metrics + " --trace " + trace);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  auto losses = readLosses(metrics);
  ASSERT_EQ(losses.size(), 2u);
  for (double l : losses)
    EXPECT_TRUE(std::isfinite(l) && l != 0.0) << l;
  std::ifstream in(metrics);
  std::string first;
  std::getline(in, first);
  EXPECT_NE(first.find("\"p2p\": {\"dp\": 0, \"pp\": 64}"), std::string::npos)
      << first;
  std::ifstream tin(trace);
  std::stringstream json;
  json << tin.rdbuf();
  for (const char *needle :
       {"\"name\": \"p2p\"", "\"F c0 mb1\"", "\"B c0 mb0\"",
        "\"send\u2192pp1\"", "\"recv\u2190pp0\"", "\"p2p wait\""})
    EXPECT_NE(json.str().find(needle), std::string::npos) << needle;
}

TEST_F(LauncherTest, PipelineStallIsNamedByTheWatchdog) {
  // Stage 1 stalls before its first step; stage 0 waits for its gradient.
  std::string path = write("stall.tsr", twoStagePipeline(2, 2, 4));
  RunResult r;
  std::string cmd = "env TESSERA_DEBUG_STALL_RANK=1 " +
                    std::string(TESSERA_RUN_PATH) + " -n 2 " + path +
                    " --steps 2 --timeout 2 2>&1";
  FILE *pipe = popen(cmd.c_str(), "r");
  ASSERT_TRUE(pipe);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0)
    r.output.append(buf, n);
  int status = pclose(pipe);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << r.output;
  for (const char *needle :
       {"tessera-run: error: rank 0: ",
        "stall.tsr: pipeline stage 0 (pp rank 0 of 2): waiting for the p2p "
        "batch opened by function 'forward_c0' microbatch ",
        " pp rank 1 tag ", "made no progress for ",
        "a peer rank may have died or stalled"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

TEST_F(LauncherTest, MixedPrecisionRunResumesBitIdentically) {
  // bf16 parameters and gradients over dp = 2: the gradient all-reduce
  // moves 2 bytes per element; a run resumed from a checkpoint (main params
  // restored, "init" skipped) continues exactly; with --no-load-optim the
  // main params are recomputed by "init" (noted).
  std::string path =
      write("mp.tsr", mixedPrecisionRegression(8, 4, 8, 2, 2, true));
  std::string full = dir + "/full.jsonl", resumed = dir + "/resumed.jsonl";
  std::string trace = dir + "/mp.json";
  RunResult a = runTool("-n 2 " + path + " --steps 4 --metrics " + full +
                        " --trace " + trace);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  RunResult b = runTool("-n 2 " + path + " --steps 2 --save " + dir + "/ckpt");
  ASSERT_EQ(b.exitCode, 0) << b.output;
  RunResult c = runTool("-n 2 " + path + " --steps 4 --load " + dir +
                        "/ckpt --metrics " + resumed);
  ASSERT_EQ(c.exitCode, 0) << c.output;
  EXPECT_EQ(c.output.find("note:"), std::string::npos) << c.output;
  auto la = readLosses(full), lc = readLosses(resumed);
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lc.size(), 2u);
  EXPECT_EQ(lc[0], la[2]);
  EXPECT_EQ(lc[1], la[3]);
  std::ifstream in(full);
  std::string first;
  std::getline(in, first);
  // gW: 32 bf16, gb: 4 bf16, all-reduced over dp=2 (ring: 1x bytes).
  EXPECT_NE(first.find("\"all_reduce\": {\"dp\": 72"), std::string::npos)
      << first;
  std::ifstream tin(trace);
  std::stringstream json;
  json << tin.rdbuf();
  EXPECT_NE(json.str().find("\"name\": \"init\""), std::string::npos);
  RunResult d = runTool("-n 2 " + path + " --steps 3 --load " + dir +
                        "/ckpt --no-load-optim");
  ASSERT_EQ(d.exitCode, 0) << d.output;
  EXPECT_NE(d.output.find("tessera-run: note: fp32 main params 2 "
                          "('main:fc.weight', ...) are optimizer state, not "
                          "loaded: 'init' computes them from the loaded "
                          "parameters"),
            std::string::npos)
      << d.output;
}
