//===- FileIO.h - Atomic file writes and small file helpers -----*- C++ -*-===//
//
// The runtime's one implementation of durable file writing, shared by the
// checkpoints of tessera-run (shard files, manifest.json, `latest`) and the
// Megatron indexed-dataset writer of tessera-preprocess: the bytes go to a
// temporary file PATH.tmp.PID in the target's directory, which is fsynced
// and renamed over PATH, then the directory is fsynced, so a crash at any
// point leaves either the old file or the complete new one. Also the few
// POSIX file helpers both need (mkdir -p, reading a whole file, stat
// tests). Part of TesseraData (no MPI, no LLVM).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_FILEIO_H
#define TESSERA_RT_FILEIO_H

#include "tessera/rt/Status.h"

#include <cstddef>
#include <string>
#include <vector>

namespace tessera::rt {

/// Writes `size` bytes to `path` atomically and durably: a temporary file in
/// the same directory, fsync, rename over `path`, fsync of the directory.
/// On error the temporary file is removed and `path` is untouched.
Status writeFileAtomic(const std::string &path, const void *data, size_t size);
inline Status writeFileAtomic(const std::string &path,
                              const std::string &bytes) {
  return writeFileAtomic(path, bytes.data(), bytes.size());
}
/// Bytes of a file written in pieces.
struct FilePiece {
  const void *data;
  size_t size;
};
/// The pieces one after another, written as above (no copy into one
/// buffer: a large file costs no second copy in memory).
Status writeFileAtomic(const std::string &path,
                       const std::vector<FilePiece> &pieces);
/// fsync of a directory (makes renames and creations in it durable).
Status syncDirectory(const std::string &dir);
/// mkdir -p (existing directories are fine).
Status makeDirectories(const std::string &dir);
/// The whole file.
StatusOr<std::string> readWholeFile(const std::string &path);

/// The directory part of `path`: "." without a slash, "/" for "/name".
std::string parentDirectory(const std::string &path);
/// stat(path) succeeds.
bool pathExists(const std::string &path);
/// `path` is a directory (or a link to one).
bool isDirectory(const std::string &path);

} // namespace tessera::rt

#endif // TESSERA_RT_FILEIO_H
