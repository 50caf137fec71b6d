//===- CudaPluginTest.cpp - Loading libTesseraBackend_cuda.so -------------===//
//
// The registry finds the plugin next to the executable (../lib), the plugin
// registers "cuda", and creating the backend either works (a GPU is
// present: /dev/nvidiactl) or fails with Unavailable naming the CUDA error
// (no driver, no device), without crashing: the CPU backend stays usable.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Backend.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <vector>

using namespace tessera::rt;

TEST(CudaPluginTest, LoadsAndReportsAvailability) {
  auto &registry = BackendRegistry::global();
  auto backend = registry.create("cuda", {});
  ASSERT_TRUE(registry.contains("cuda"))
      << "the plugin did not register 'cuda': "
      << (backend.ok() ? "" : backend.status().message());
  const bool gpu = access("/dev/nvidiactl", F_OK) == 0;
  // The cheap check tessera-run makes before it starts the ranks agrees.
  Status probe = registry.probe("cuda");
  EXPECT_EQ(probe.ok(), backend.ok()) << probe.toString();
  if (!gpu) {
    EXPECT_EQ(probe.getCode(), StatusCode::Unavailable);
    EXPECT_NE(probe.message().find("the cuda backend has no GPU to run on"),
              std::string::npos)
        << probe.message();
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().getCode(), StatusCode::Unavailable);
    EXPECT_NE(backend.status().message().find(
                  "the cuda backend has no GPU to run on: cudaGetDeviceCount "
                  "failed with cuda"),
              std::string::npos)
        << backend.status().message();
  } else {
    ASSERT_TRUE(backend.ok()) << backend.status().toString();
    EXPECT_STREQ((*backend)->name(), "cuda");
    // A round trip through device memory.
    auto mem = (*backend)->allocate(64);
    ASSERT_TRUE(mem.ok()) << mem.status().toString();
    std::vector<float> in = {1, 2, 3, 4}, out(4);
    ASSERT_TRUE((*backend)->copyToDevice(*mem, in.data(), 16).ok());
    ASSERT_TRUE((*backend)->copyToHost(out.data(), *mem, 16).ok());
    EXPECT_EQ(in, out);
    (*backend)->deallocate(*mem);
  }
  // The CPU backend is unaffected.
  auto cpu = registry.create("cpu", {});
  ASSERT_TRUE(cpu.ok());
  EXPECT_STREQ((*cpu)->name(), "cpu");
}
