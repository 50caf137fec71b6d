//===- Mpirun.cpp - Pre-launch checks and re-exec under mpirun ------------===//
//
// tessera-run outside an MPI job: everything that can be checked without
// starting the ranks is (the artifact and its programs, --data, the --save
// directory, the --load checkpoint against the artifact with every shard
// header it will read, -n against the world size, the backend), then the
// process replaces itself with `mpirun -n N` of the same command line, with
// the BLAS and OpenMP thread settings and the OpenBLAS kernel choice
// (--blas-core) exported to every rank.
//
// Open MPI keeps a job's session directory under ompi.<host>.<uid> in one
// base directory ($TMPDIR or /tmp) that every job of the user on the host
// shares; two mpiruns creating and removing it at the same moment can fail
// at start ("A call to mkdir was unable to create the desired directory
// ... File exists", orte_init). So each launch gets a base of its own,
// <tmp>/tessera-run.<uid>/<host>.<pid>, unless the user chose one
// (OMPI_MCA_orte_tmpdir_base); mpirun removes its session directory inside
// it, and each launch removes this host's bases whose launch has ended (the
// flock each launch holds on its base's lock file until its job ends can be
// taken).
//
//===----------------------------------------------------------------------===//

#include "LauncherInternal.h"
#include "backends/cpu/BlasCore.h"

#include "tessera/rt/Backend.h"
#include "tessera/rt/Executor.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tessera::rt {

bool insideMpiJob() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

namespace launcher {

/// --blas-core for the cpu backend's ranks: OpenBLAS picks its kernels when
/// it loads, from OPENBLAS_CORETYPE, so the choice is exported before they
/// start (the flag wins over the environment).
StatusOr<std::vector<std::string>> exportRankEnvironment(const LaunchOptions &o) {
  std::vector<std::string> set;
  if (o.backend == "cpu" && !o.blasCore.empty()) {
    TESSERA_RETURN_IF_ERROR(
        cpu::checkBlasCore(o.blasCore, cpu::hostCpuFeatures()));
    const char *env = std::getenv("OPENBLAS_CORETYPE");
    if (!env || !cpu::sameBlasCore(env, o.blasCore)) {
      setenv("OPENBLAS_CORETYPE", o.blasCore.c_str(), 1);
      set.push_back("OPENBLAS_CORETYPE");
    }
  }
  // Idle OpenMP workers must not spin on the cores the BLAS threads use,
  // nor idle OpenBLAS workers (by default they spin 2^28 cycles after each
  // GEMM) on the cores of the OpenMP team that runs the attention heads
  // and elementwise kernels: 2^4 cycles, then they sleep until the next
  // GEMM.
  for (auto [name, value] : {std::pair{"OMP_WAIT_POLICY", "passive"},
                             std::pair{"OPENBLAS_THREAD_TIMEOUT", "4"}})
    if (!std::getenv(name)) {
      setenv(name, value, 1);
      set.push_back(name);
    }
  return set;
}

/// The name of this host, as this launch's session bases start with it
/// ($TMPDIR may be shared between hosts).
static std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || !*name)
    return "host";
  return name;
}

/// Removes `path` and what is under it (not following links).
static void removeTree(const std::string &path) {
  nftw(
      path.c_str(),
      [](const char *p, const struct stat *, int, FTW *) {
        remove(p);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

/// A launch holds an exclusive flock on <base>/lock for as long as mpirun
/// and its ranks run (the descriptor survives the exec and is inherited),
/// so a base whose lock can be taken belongs to a launch that has ended.
static constexpr const char *kSessionLock = "lock";

/// Removes this host's session bases under `parent` whose launch has ended,
/// with what a killed mpirun left in them.
static void removeEndedSessionBases(const std::string &parent,
                                    const std::string &prefix) {
  DIR *dir = opendir(parent.c_str());
  if (!dir)
    return;
  std::vector<std::string> bases;
  while (dirent *e = readdir(dir)) {
    const char *pid = e->d_name + prefix.size();
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0 && *pid &&
        std::strspn(pid, "0123456789") == std::strlen(pid))
      bases.push_back(parent + "/" + e->d_name);
  }
  closedir(dir);
  for (const std::string &base : bases) {
    int fd = open((base + "/" + kSessionLock).c_str(),
                  O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    // No lock file: a launch between its mkdir and its lock; left alone.
    if (fd < 0)
      continue;
    bool ended = flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (ended)
      removeTree(base);
    close(fd);
  }
}

/// This launch's own base for Open MPI's session directory,
/// <tmp>/tessera-run.<uid>/<host>.<pid>, locked for the job's lifetime; or
/// "" (the user chose one, or it cannot be made safely: Open MPI's default
/// then).
static std::string privateSessionBase() {
  if (std::getenv("OMPI_MCA_orte_tmpdir_base"))
    return "";
  const char *tmp = std::getenv("TMPDIR");
  std::string parent = std::string(tmp && *tmp ? tmp : "/tmp") +
                       "/tessera-run." + std::to_string(geteuid());
  if (mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST)
    return "";
  // Ours alone: not a link, owned by this user, closed to others.
  struct stat st;
  if (lstat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      st.st_uid != geteuid() || (st.st_mode & 077) != 0)
    return "";
  const std::string prefix = hostName() + ".";
  removeEndedSessionBases(parent, prefix);
  std::string base = parent + "/" + prefix + std::to_string(getpid());
  // PMIx's Unix sockets (paths of at most 107 bytes) go under the base, in
  // ompi.<host>.<uid>/pid.<pid>/: a longer base keeps Open MPI's default.
  if (base.size() > 64)
    return "";
  // A base of this pid on this host is a dead launch's.
  removeTree(base);
  if (mkdir(base.c_str(), 0700) != 0)
    return "";
  // Not O_CLOEXEC: mpirun keeps the lock after the exec.
  int fd = open((base + "/" + kSessionLock).c_str(),
                O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (fd >= 0)
      close(fd);
    removeTree(base);
    return "";
  }
  return base;
}

std::string selfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return "";
  return std::string(buf, size_t(n));
}

int launchUnderMpirun(const LaunchOptions &o, int argc, char **argv) {
  auto loaded = LoadedArtifact::loadFromFile(o.artifactPath);
  if (!loaded.ok())
    return errorExit(loaded.status().message());
  const LoadedArtifact &artifact = **loaded;
  Status st = Executor::validate(artifact);
  if (!st.ok())
    return errorExit(st.message());
  st = checkDataOption(o, artifact);
  if (!st.ok()) {
    if (st.getCode() == StatusCode::FailedPrecondition) {
      // A missing --data is a usage error.
      std::fprintf(stderr, "tessera-run: error: %s\n%s", st.message().c_str(),
                   launchUsage(argc > 0 ? argv[0] : "tessera-run").c_str());
      return 1;
    }
    return errorExit(st.message());
  }
  if (!o.saveDir.empty()) {
    st = makeDirectories(o.saveDir);
    if (!st.ok())
      return errorExit("--save: " + st.message());
  }
  if (!o.loadDir.empty()) {
    auto dataset = openDataset(o, artifact);
    st = checkCheckpointForLaunch(
        artifact, o.loadDir,
        loadOptionsOf(o, dataset.ok() ? dataset->get() : nullptr));
    if (!st.ok() && !startsFromScratch(o, st))
      return errorExit(st.message());
  }
  int world = artifact.root()->world_size();
  int n = o.numRanks ? o.numRanks : world;
  if (n != world)
    return errorExit("-n " + std::to_string(n) +
                     " does not match the world "
                     "size " +
                     std::to_string(world) + " of " + o.artifactPath +
                     " (mesh " + meshString(*artifact.root()) + ")");
  // The backend can run here (its plugin loads, a GPU exists): checked
  // cheaply before any rank starts.
  st = BackendRegistry::global().probe(o.backend);
  if (!st.ok())
    return errorExit(st.message());
  auto exported = exportRankEnvironment(o);
  if (!exported.ok())
    return errorExit(exported.status().message());
  int threads = o.threads ? o.threads : defaultThreads(n);
  if (o.threads || !std::getenv("OPENBLAS_NUM_THREADS"))
    setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);

  std::string self = selfExecutable();
  if (self.empty())
    return errorExit("cannot determine the path of tessera-run");
  std::vector<std::string> args = {"mpirun",          "-n",
                                   std::to_string(n), "--oversubscribe",
                                   "--bind-to",       "none"};
  if (geteuid() == 0)
    args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"-x", "OPENBLAS_NUM_THREADS", "-x",
                           "OMP_WAIT_POLICY", "-x", "OPENBLAS_THREAD_TIMEOUT"});
  if (std::getenv("OPENBLAS_CORETYPE"))
    args.insert(args.end(), {"-x", "OPENBLAS_CORETYPE"});
  std::string sessionBase = privateSessionBase();
  if (!sessionBase.empty())
    args.insert(args.end(), {"--mca", "orte_tmpdir_base", sessionBase});
  args.push_back(self);
  for (int i = 1; i < argc; ++i)
    args.push_back(argv[i]);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp("mpirun", cargs.data());
  const int error = errno;
  if (!sessionBase.empty())
    removeTree(sessionBase);
  return errorExit(std::string("cannot execute mpirun: ") +
                   std::strerror(error));
}

} // namespace launcher
} // namespace tessera::rt
