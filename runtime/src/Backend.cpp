//===- Backend.cpp - Backend registry -------------------------------------===//

#include "tessera/rt/Backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace tessera::rt {

Backend::~Backend() = default;

StatusOr<void *> Backend::allocateHost(int64_t bytes) {
  size_t size = size_t(std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
  void *ptr = std::aligned_alloc(64, size);
  if (!ptr)
    return unavailable("cannot allocate ", bytes, " bytes of host memory");
  return ptr;
}

void Backend::deallocateHost(void *ptr) { std::free(ptr); }

Status Backend::checkRingAttentionDims(const RingAttentionDims &d) {
  if (d.seq % 2 != 0)
    return invalidArgument("ring attention needs an even local sequence, got ",
                           d.seq);
  if (d.headDim < 1)
    return invalidArgument("ring attention needs a head dimension >= 1, got ",
                           d.headDim);
  return Status();
}

StatusOr<std::vector<int64_t>>
Backend::expertGroupOffsets(const int32_t *counts, int64_t experts,
                            int64_t rows) {
  std::vector<int64_t> offsets(static_cast<size_t>(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    if (counts[e] < 0)
      return outOfRange("expert ", e, " has a negative row count ", counts[e]);
    offsets[size_t(e) + 1] = offsets[size_t(e)] + counts[e];
  }
  if (offsets.back() > rows)
    return outOfRange("the experts' row counts add up to ", offsets.back(),
                      ", more than the ", rows, " rows");
  return offsets;
}

BackendRegistry &BackendRegistry::global() {
  static BackendRegistry *registry = [] {
    auto *r = new BackendRegistry();
    registerCpuBackend(*r);
    return r;
  }();
  return *registry;
}

void BackendRegistry::registerBackend(const std::string &name,
                                      BackendFactory factory,
                                      BackendProbe probe) {
  std::lock_guard<std::mutex> lock(mutex);
  factories[name] = std::move(factory);
  if (probe)
    probes[name] = std::move(probe);
  else
    probes.erase(name);
}

bool BackendRegistry::contains(const std::string &name) const {
  std::lock_guard<std::mutex> lock(mutex);
  return factories.count(name) != 0;
}

std::vector<std::string> BackendRegistry::names() const {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::string> result;
  for (auto &entry : factories)
    result.push_back(entry.first);
  return result;
}

Status BackendRegistry::loadPlugin(const std::string &path) {
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle)
    return notFound("cannot load backend plugin ", path, ": ", dlerror());
  auto fn = reinterpret_cast<TesseraRegisterBackendsFn>(
      dlsym(handle, "tesseraRegisterBackends"));
  if (!fn)
    return notFound("backend plugin ", path,
                    " does not export tesseraRegisterBackends");
  fn(this);
  return Status();
}

static std::string executableDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return ".";
  std::string path(buf, size_t(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

Status BackendRegistry::ensureRegistered(const std::string &name) {
  if (contains(name))
    return Status();
  std::string lib = "libTesseraBackend_" + name + ".so";
  std::string dir = executableDir();
  std::string errors;
  for (const std::string &candidate :
       {lib, dir + "/" + lib, dir + "/../lib/" + lib}) {
    Status st = loadPlugin(candidate);
    if (st.ok() && contains(name))
      return Status();
    errors += "\n  " + st.message();
  }
  std::string known;
  for (auto &n : names())
    known += (known.empty() ? "" : ", ") + n;
  return notFound("unknown backend '", name, "' (available: ", known,
                  "); plugin search:", errors);
}

StatusOr<std::unique_ptr<Backend>>
BackendRegistry::create(const std::string &name,
                        const BackendOptions &options) {
  TESSERA_RETURN_IF_ERROR(ensureRegistered(name));
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(mutex);
    factory = factories[name];
  }
  return factory(options);
}

Status BackendRegistry::probe(const std::string &name) {
  TESSERA_RETURN_IF_ERROR(ensureRegistered(name));
  BackendProbe check;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = probes.find(name);
    if (it != probes.end())
      check = it->second;
  }
  if (check)
    return check();
  return create(name, {}).status();
}

} // namespace tessera::rt
