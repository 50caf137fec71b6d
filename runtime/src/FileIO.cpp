//===- FileIO.cpp - Atomic file writes and small file helpers -------------===//
//
// writeFileAtomic (temporary file, fsync, rename, fsync of the directory)
// and the POSIX helpers around it; see tessera/rt/FileIO.h. Used by the
// checkpoints (runtime/src/checkpoint/) and IndexedDatasetBuilder::write.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/FileIO.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace tessera::rt {

std::string parentDirectory(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

bool pathExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return dataLoss(
        dir, ": cannot open the directory to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync directories (EINVAL); nothing to do there.
  if (rc != 0 && err != EINVAL)
    return dataLoss(dir,
                    ": fsync of the directory failed: ", std::strerror(err));
  return Status();
}

Status makeDirectories(const std::string &dir) {
  if (dir.empty())
    return invalidArgument("empty directory name");
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = dir.find('/', pos + 1);
    path = dir.substr(0, next);
    pos = next;
    if (path.empty() || path == "/" || isDirectory(path))
      continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      return dataLoss(path,
                      ": cannot create the directory: ", std::strerror(errno));
    if (!isDirectory(path))
      return dataLoss(path, ": exists and is not a directory");
  }
  return Status();
}

Status writeFileAtomic(const std::string &path, const void *data, size_t size) {
  return writeFileAtomic(path, {FilePiece{data, size}});
}

Status writeFileAtomic(const std::string &path,
                       const std::vector<FilePiece> &pieces) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return dataLoss(path, ": cannot create ", tmp, ": ", std::strerror(errno));
  auto fail = [&](const std::string &what) {
    int err = errno;
    if (fd >= 0)
      ::close(fd);
    ::unlink(tmp.c_str());
    return dataLoss(path, ": ", what, ": ", std::strerror(err));
  };
  for (const FilePiece &piece : pieces) {
    const auto *p = static_cast<const uint8_t *>(piece.data);
    size_t done = 0;
    while (done < piece.size) {
      ssize_t n = ::write(fd, p + done, piece.size - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return fail("write failed");
      done += size_t(n);
    }
  }
  if (::fsync(fd) != 0)
    return fail("fsync failed");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0)
    return fail("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail("rename of " + tmp + " failed");
  return syncDirectory(parentDirectory(path));
}

StatusOr<std::string> readWholeFile(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return notFound(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return dataLoss(path, ": cannot stat: ", std::strerror(errno));
  }
  std::string bytes(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return dataLoss(path, ": read failed: ", std::strerror(err));
    }
    if (n == 0)
      break;
    done += size_t(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

} // namespace tessera::rt
