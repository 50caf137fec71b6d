//===- Launcher.cpp - tessera-run entry point -----------------------------===//
//
// runLauncher: parses the command line, answers --help and
// --print-summary, and otherwise either re-executes under mpirun (outside
// an MPI job, Mpirun.cpp) or runs this rank (inside one, TrainingLoop.cpp);
// plus the error reporting and mesh description they share.
//
//===----------------------------------------------------------------------===//

#include "LauncherInternal.h"

#include "tessera/rt/Executor.h"

#include <cstdio>

namespace tessera::rt {

namespace launcher {

int errorExit(const std::string &message) {
  std::fprintf(stderr, "tessera-run: error: %s\n", message.c_str());
  return 1;
}

std::string meshString(const fb::Artifact &a) {
  std::string s;
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      s += (s.empty() ? "" : " x ") +
           (axis->name() ? axis->name()->str() : std::string("?")) + "=" +
           std::to_string(axis->size());
  return s.empty() ? "(none)" : s;
}

} // namespace launcher

using launcher::errorExit;
using launcher::launchUnderMpirun;
using launcher::runInsideMpi;

int runLauncher(int argc, char **argv) {
  const char *argv0 = argc > 0 ? argv[0] : "tessera-run";
  auto parsed = parseLaunchOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "tessera-run: error: %s\n%s",
                 parsed.status().message().c_str(), launchUsage(argv0).c_str());
    return 1;
  }
  const LaunchOptions &o = *parsed;
  if (o.help) {
    std::printf("%s", launchUsage(argv0).c_str());
    return 0;
  }
  if (o.printSummary) {
    auto loaded = LoadedArtifact::loadFromFile(o.artifactPath);
    if (!loaded.ok())
      return errorExit(loaded.status().message());
    Status st = Executor::validate(**loaded);
    std::printf("%s", summarizeArtifact(**loaded).c_str());
    if (!st.ok())
      return errorExit(st.message());
    return 0;
  }
  if (!insideMpiJob())
    return launchUnderMpirun(o, argc, argv);
  return runInsideMpi(o, argc, argv);
}

} // namespace tessera::rt
