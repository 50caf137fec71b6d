//===- SaveLoad.cpp - Collective checkpoint save and per-rank load --------===//
//
// tessera-run --save / --load (tessera/rt/Checkpoint.h): resolving --load
// DIR through DIR/latest; the collective save (every rank writes its shard
// file, an all-gather of the shards' sizes and CRCs, then rank 0 writes
// manifest.json and `latest`, each atomically); and the per-rank load, which
// plans (LoadPlan.h), reads its own or, when resharding, every needed shard
// file one at a time, assembles its buffers and writes them into the
// executor. Every step that waits on peers or the file system is marked on
// the WaitMonitor of tessera-run's watchdog.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Checkpoint.h"

#include "Layout.h"
#include "Strings.h"
#include "tessera/rt/BF16.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/Executor.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

namespace tessera::rt {

using artifact::loadLE32;
using artifact::storeLE64;
using ckpt::hex32;
using ckpt::isSavedKind;
using ckpt::nameOf;
using ckpt::shapeString;
using ckpt::toVector;

//===----------------------------------------------------------------------===//
// Locating
//===----------------------------------------------------------------------===//

namespace {
/// "<name>.tmp.<digits>": writeFileAtomic's temporary name.
bool isTempFile(const std::string &name) {
  size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at + 5 >= name.size())
    return false;
  return std::all_of(name.begin() + long(at) + 5, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}
/// "iter_" and digits.
bool isIterDir(const std::string &name) {
  return name.size() > 5 && name.rfind("iter_", 0) == 0 &&
         std::all_of(name.begin() + 5, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}
} // namespace

StatusOr<CleanedSaves> cleanInterruptedSaves(const std::string &dir) {
  namespace fs = std::filesystem;
  CleanedSaves cleaned;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return cleaned;
  // The iteration `latest` names is kept, complete or not.
  std::string latest;
  if (auto text = readWholeFile(dir + "/latest"); text.ok())
    latest = iterationDirName(std::atoll(text->c_str()));
  auto removeTemps = [&](const fs::path &in) -> Status {
    for (const fs::directory_entry &e : fs::directory_iterator(in, ec)) {
      if (!e.is_regular_file(ec) || !isTempFile(e.path().filename().string()))
        continue;
      if (!fs::remove(e.path(), ec) && ec)
        return dataLoss("cannot remove ", e.path().string(), ": ",
                        ec.message());
      ++cleaned.tempFiles;
    }
    return Status();
  };
  TESSERA_RETURN_IF_ERROR(removeTemps(dir));
  for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || !isIterDir(name))
      continue;
    if (!fs::exists(e.path() / "manifest.json", ec) && name != latest) {
      fs::remove_all(e.path(), ec);
      if (ec)
        return dataLoss("cannot remove ", e.path().string(), ": ",
                        ec.message());
      cleaned.iterDirs.push_back(e.path().string());
      continue;
    }
    TESSERA_RETURN_IF_ERROR(removeTemps(e.path()));
  }
  if (ec)
    return dataLoss("cannot list ", dir, ": ", ec.message());
  std::sort(cleaned.iterDirs.begin(), cleaned.iterDirs.end());
  return cleaned;
}

StatusOr<CheckpointLocation> locateCheckpoint(const std::string &dirIn) {
  std::string dir = dirIn;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (!isDirectory(dir))
    return notFound(dir, ": no checkpoint directory (", std::strerror(ENOENT),
                    ")");
  CheckpointLocation loc;
  if (pathExists(dir + "/manifest.json")) {
    loc.dir = dir;
    return loc;
  }
  std::string latest = dir + "/latest";
  if (pathExists(latest)) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, readWholeFile(latest));
    while (!text.empty() &&
           std::isspace(static_cast<unsigned char>(text.back())))
      text.pop_back();
    char *end = nullptr;
    errno = 0;
    long long it = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || it < 0)
      return dataLoss(latest, ": expected an iteration number, got '", text,
                      "'");
    loc.iteration = it;
    loc.dir = dir + "/" + iterationDirName(it);
    if (!isDirectory(loc.dir))
      return dataLoss(latest, " names iteration ", it, ", but ", loc.dir,
                      " does not exist");
    return loc;
  }
  std::string base = dir.substr(dir.find_last_of('/') + 1);
  if (base.rfind("iter_", 0) == 0)
    return dataLoss(dir, "/manifest.json: missing: the checkpoint is "
                         "incomplete (its save was interrupted?)");
  return notFound(dir, ": no checkpoint (neither ", latest, " nor ", dir,
                  "/manifest.json exists)");
}

StatusOr<CheckpointManifest> readManifest(const CheckpointLocation &loc) {
  std::string path = loc.dir + "/manifest.json";
  if (!pathExists(path))
    return dataLoss(path, ": missing: the checkpoint is incomplete (its save "
                          "was interrupted?)");
  TESSERA_ASSIGN_OR_RETURN(std::string text, readWholeFile(path));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, parseManifest(text, path));
  if (loc.iteration >= 0 && m.iteration != loc.iteration)
    return dataLoss(path, ": records iteration ", m.iteration, ", but ",
                    parentDirectory(loc.dir), "/latest names ", loc.iteration);
  return m;
}

//===----------------------------------------------------------------------===//
// Saving and loading
//===----------------------------------------------------------------------===//

StatusOr<CheckpointSaveResult> saveCheckpoint(const Executor &executor,
                                              const CheckpointSaveOptions &o,
                                              Communicator *world) {
  const LoadedArtifact &artifact = executor.artifact();
  const int rank = executor.worldRank();
  const int worldSize = artifact.root()->world_size();
  const int64_t iteration = o.info.iteration;
  std::string dir = o.dir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  const std::string iterDir = dir + "/" + iterationDirName(iteration);
  CheckpointSaveResult result;
  result.dir = iterDir;
  // Each step that waits for other ranks or the file system, for the
  // watchdog.
  using On = WaitMonitor::On;
  const std::string saving = "saving checkpoint iteration " +
                             std::to_string(iteration) + " to " + iterDir +
                             ": ";
  if (rank == 0) {
    WaitMonitor::Step step(o.monitor, saving + "preparing the directory",
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(makeDirectories(iterDir));
    // Re-saving an iteration: the old manifest goes first, so the
    // directory never looks complete with a mix of old and new shards.
    // Temporary files of a save that crashed.
    for (const std::string &d : {dir, iterDir})
      if (DIR *handle = ::opendir(d.c_str())) {
        while (dirent *e = ::readdir(handle))
          if (std::strstr(e->d_name, ".tmp."))
            ::unlink((d + "/" + e->d_name).c_str());
        ::closedir(handle);
      }
    std::string manifest = iterDir + "/manifest.json";
    if (pathExists(manifest)) {
      if (::unlink(manifest.c_str()) != 0)
        return dataLoss(manifest, ": cannot remove the previous manifest: ",
                        std::strerror(errno));
      TESSERA_RETURN_IF_ERROR(syncDirectory(iterDir));
    }
    TESSERA_RETURN_IF_ERROR(syncDirectory(dir));
  }
  if (world) {
    WaitMonitor::Step step(
        o.monitor,
        saving + (rank == 0
                      ? "waiting for every rank to begin the save (barrier)"
                      : "waiting for rank 0 to prepare the directory "
                        "(barrier)"),
        On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
  }

  ShardFile shard;
  shard.rank = rank;
  shard.worldSize = worldSize;
  shard.iteration = iteration;
  shard.consumedSamples =
      iteration * artifact.root()->batch()->global_batch_size();
  shard.seed = o.info.seed;
  for (const fb::Buffer *b : *executor.program().buffers()) {
    if (!isSavedKind(b->kind()))
      continue;
    ShardTensor t;
    t.name = nameOf(*b);
    t.kind = b->kind();
    t.dtype = b->dtype();
    t.shape = toVector(b->shape());
    if (b->kind() == fb::BufferKind::Iteration) {
      t.data.resize(8);
      storeLE64(t.data.data(), uint64_t(iteration));
    } else {
      TESSERA_ASSIGN_OR_RETURN(t.data, executor.readBuffer(t.name));
    }
    shard.tensors.push_back(std::move(t));
  }
  std::string bytes = encodeShard(shard);
  {
    WaitMonitor::Step step(o.monitor,
                           saving + "writing its shard " + shardFileName(rank),
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(
        writeFileAtomic(iterDir + "/" + shardFileName(rank), bytes));
  }
  if (o.debugExitAfterShard == iteration) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(9);
  }
  if (o.debugStallRank == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  int64_t mine[2] = {
      int64_t(bytes.size()),
      int64_t(loadLE32(reinterpret_cast<const uint8_t *>(bytes.data()) + 16))};
  std::vector<int64_t> all(size_t(2 * worldSize));
  if (world && world->size() > 1) {
    WaitMonitor::Step step(
        o.monitor,
        saving + "waiting for the shard sizes and CRCs of every rank "
                 "(all-gather)",
        On::Peers);
    TESSERA_RETURN_IF_ERROR(
        world->allGather(mine, all.data(), 2, ElementType::I64));
  } else {
    std::copy(mine, mine + 2, all.begin());
  }
  result.bytes = uint64_t(mine[0]);
  if (rank == 0) {
    TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m,
                             describeCheckpoint(artifact, o.info));
    result.bytes = 0;
    for (int r = 0; r < worldSize; ++r) {
      ManifestShardFile f;
      f.rank = r;
      f.file = shardFileName(r);
      f.bytes = uint64_t(all[size_t(2 * r)]);
      f.crc = uint32_t(all[size_t(2 * r + 1)]);
      result.bytes += f.bytes;
      m.files.push_back(f);
    }
    {
      WaitMonitor::Step step(o.monitor, saving + "writing manifest.json",
                             On::FileSystem);
      TESSERA_RETURN_IF_ERROR(
          writeFileAtomic(iterDir + "/manifest.json", manifestToJson(m)));
    }
    WaitMonitor::Step step(o.monitor, saving + "writing latest",
                           On::FileSystem);
    TESSERA_RETURN_IF_ERROR(
        writeFileAtomic(dir + "/latest", std::to_string(iteration) + "\n"));
  }
  if (world) {
    WaitMonitor::Step step(
        o.monitor,
        saving + (rank == 0 ? "waiting for every rank to finish the save "
                              "(barrier)"
                            : "waiting for rank 0 to write manifest.json and "
                              "latest (barrier)"),
        On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
  }
  return result;
}

/// `data` (elements of `from`) as elements of `to`, both float dtypes:
/// widening exact, narrowing to a 16-bit format rounded to nearest even
/// (BF16 <-> F16 through f32).
static StatusOr<std::vector<uint8_t>>
convertFloats(const std::vector<uint8_t> &data, fb::DType from, fb::DType to) {
  if (isFloatDType(from) && isFloatDType(to)) {
    const FloatFormat f = floatFormatOf(from), t = floatFormatOf(to);
    const size_t n = data.size() / size_t(formatBytes(f));
    std::vector<float> wide(n);
    if (f == FloatFormat::F32) {
      std::memcpy(wide.data(), data.data(), n * 4);
    } else {
      std::vector<uint16_t> h(n);
      std::memcpy(h.data(), data.data(), n * 2);
      halfToFloats(f, h.data(), wide.data(), int64_t(n));
    }
    std::vector<uint8_t> out(n * size_t(formatBytes(t)));
    if (t == FloatFormat::F32) {
      std::memcpy(out.data(), wide.data(), n * 4);
    } else {
      std::vector<uint16_t> h(n);
      floatsToHalf(t, wide.data(), h.data(), int64_t(n));
      std::memcpy(out.data(), h.data(), n * 2);
    }
    return out;
  }
  return invalidArgument("cannot convert ", fb::EnumNameDType(from), " to ",
                         fb::EnumNameDType(to));
}

StatusOr<CheckpointLoadResult> loadCheckpoint(Executor &executor,
                                              const std::string &dir,
                                              const CheckpointLoadOptions &o,
                                              Communicator *world) {
  const LoadedArtifact &artifact = executor.artifact();
  const int rank = executor.worldRank();
  // Each step that waits for other ranks or the file system, for the
  // watchdog.
  using On = WaitMonitor::On;
  std::optional<WaitMonitor::Step> step;
  step.emplace(o.monitor,
               "loading checkpoint " + dir +
                   ": reading latest and manifest.json",
               On::FileSystem);
  TESSERA_ASSIGN_OR_RETURN(CheckpointLocation loc, locateCheckpoint(dir));
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, readManifest(loc));
  step.reset();
  const std::string loading = "loading checkpoint iteration " +
                              std::to_string(m.iteration) + " from " + loc.dir +
                              ": ";
  if (o.debugStallRank == rank)
    std::this_thread::sleep_for(std::chrono::hours(1));
  if (world && world->size() > 1) {
    // Every rank must load the same iteration (DIR/latest may move).
    std::vector<int64_t> all(size_t(world->size()));
    int64_t mine = m.iteration;
    step.emplace(o.monitor,
                 loading + "waiting for the iteration every rank found "
                           "(all-gather)",
                 On::Peers);
    TESSERA_RETURN_IF_ERROR(
        world->allGather(&mine, all.data(), 1, ElementType::I64));
    step.reset();
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] != mine)
        return failedPrecondition(dir, ": rank ", r, " found iteration ",
                                  all[r], " and rank ", rank, " iteration ",
                                  mine, " (was the checkpoint being written?)");
  }
  TESSERA_ASSIGN_OR_RETURN(CheckpointLoadPlan plan,
                           planCheckpointLoad(m, artifact, rank, o, loc.dir));
  // Destinations: each buffer, and each segment of a bucket shard (its
  // parameter's local box, copied into the buffer at the end).
  struct Target {
    const std::vector<RestorePiece> *pieces;
    const TensorBox *box;
    std::vector<uint8_t> *data;
    fb::DType dtype;
  };
  std::vector<std::vector<uint8_t>> host(plan.buffers.size());
  std::vector<std::vector<std::vector<uint8_t>>> segmentData(
      plan.buffers.size());
  std::vector<Target> targets;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    if (br.isIteration)
      continue;
    const int64_t es = dtypeSize(br.dtype);
    host[i].assign(size_t(br.box.volume() * es), 0);
    targets.push_back({&br.pieces, &br.box, &host[i], br.dtype});
    segmentData[i].resize(br.segments.size());
    for (size_t k = 0; k < br.segments.size(); ++k) {
      segmentData[i][k].assign(size_t(br.segments[k].box.volume() * es), 0);
      targets.push_back({&br.segments[k].pieces, &br.segments[k].box,
                         &segmentData[i][k], br.dtype});
    }
  }
  // Pieces assembled from runs of bucket shards (several files), in the
  // saved dtype, copied once every file has been read.
  std::map<const RestorePiece *, std::vector<uint8_t>> assembled;
  for (const Target &target : targets)
    for (const RestorePiece &piece : *target.pieces)
      if (!piece.runs.empty())
        assembled[&piece].assign(
            size_t(piece.sourceBox.volume() * dtypeSize(piece.dtype)), 0);
  auto place = [&](const RestorePiece &piece, const std::vector<uint8_t> &data,
                   const Target &target) -> Status {
    const fb::DType dtype = target.dtype;
    const uint8_t *src = data.data();
    std::vector<uint8_t> converted;
    if (piece.dtype != dtype) {
      TESSERA_ASSIGN_OR_RETURN(converted,
                               convertFloats(data, piece.dtype, dtype));
      src = converted.data();
    }
    copyTensorBox(src, piece.sourceBox, target.data->data(), *target.box,
                  piece.region, dtypeSize(dtype));
    return Status();
  };
  for (int q : plan.sourceRanks) {
    std::string path = loc.dir + "/" + shardFileName(q);
    if (q >= int(m.files.size()))
      return dataLoss(path, ": the manifest lists only ", m.files.size(),
                      " ranks");
    step.emplace(o.monitor, loading + "reading " + shardFileName(q),
                 On::FileSystem);
    TESSERA_ASSIGN_OR_RETURN(ShardFile f, readShardFile(path));
    step.reset();
    if (f.worldSize != m.worldSize || f.rank != q)
      return dataLoss(path, ": holds rank ", f.rank, " of world size ",
                      f.worldSize, ", but the manifest expects rank ", q,
                      " of ", m.worldSize);
    const ManifestShardFile &mf = m.files[size_t(q)];
    if (f.crc != mf.crc || f.iteration != m.iteration)
      return dataLoss(path, ": does not belong to this checkpoint (iteration ",
                      f.iteration, ", CRC-32 ", hex32(f.crc),
                      "; the manifest records iteration ", m.iteration,
                      ", CRC-32 ", hex32(mf.crc), ")");
    for (const Target &target : targets) {
      for (const RestorePiece &piece : *target.pieces) {
        if (!piece.runs.empty()) {
          std::vector<uint8_t> &dst = assembled[&piece];
          const int64_t es = dtypeSize(piece.dtype);
          for (const FlatRun &run : piece.runs) {
            if (run.sourceRank != q)
              continue;
            const ShardTensor *t = f.find(run.sourceName);
            if (!t)
              return dataLoss(path, ": has no tensor '", run.sourceName,
                              "', which the manifest says it holds");
            if (t->dtype != piece.dtype || t->shape.size() != 1 ||
                run.sourceOffset < 0 || run.count < 0 ||
                run.sourceOffset + run.count > t->shape[0] ||
                (run.offset + run.count) * es > int64_t(dst.size()))
              return dataLoss(path, ": tensor '", run.sourceName, "' is ",
                              fb::EnumNameDType(t->dtype),
                              shapeString(t->shape), ", the manifest says ",
                              fb::EnumNameDType(piece.dtype), " with [",
                              run.sourceOffset, ", ",
                              run.sourceOffset + run.count, ") of '",
                              piece.sourceName, "'");
            std::memcpy(dst.data() + run.offset * es,
                        t->data.data() + run.sourceOffset * es,
                        size_t(run.count * es));
          }
          continue;
        }
        if (piece.sourceRank != q)
          continue;
        const ShardTensor *t = f.find(piece.sourceName);
        std::vector<int64_t> extent;
        for (size_t d = 0; d < piece.sourceBox.lo.size(); ++d)
          extent.push_back(piece.sourceBox.hi[d] - piece.sourceBox.lo[d]);
        if (!t)
          return dataLoss(path, ": has no tensor '", piece.sourceName,
                          "', which the manifest says it holds");
        if (t->dtype != piece.dtype || t->shape != extent)
          return dataLoss(path, ": tensor '", piece.sourceName, "' is ",
                          fb::EnumNameDType(t->dtype), shapeString(t->shape),
                          ", the manifest says ",
                          fb::EnumNameDType(piece.dtype), shapeString(extent));
        TESSERA_RETURN_IF_ERROR(place(piece, t->data, target));
      }
    }
  }
  for (const Target &target : targets)
    for (const RestorePiece &piece : *target.pieces)
      if (!piece.runs.empty())
        TESSERA_RETURN_IF_ERROR(place(piece, assembled[&piece], target));
  // Bucket shards: each segment's part of its parameter's box.
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    const int64_t es = dtypeSize(br.dtype);
    for (size_t k = 0; k < br.segments.size(); ++k) {
      const RestoreSegment &seg = br.segments[k];
      if (seg.begin < 0 || seg.end > seg.box.volume() ||
          (seg.offset + seg.end - seg.begin) * es > int64_t(host[i].size()))
        return invalidArgument("checkpoint load plan of '", br.name,
                               "': segment of '", seg.param,
                               "' outside the buffer");
      std::memcpy(host[i].data() + seg.offset * es,
                  segmentData[i][k].data() + seg.begin * es,
                  size_t((seg.end - seg.begin) * es));
    }
  }
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const BufferRestore &br = plan.buffers[i];
    if (br.isIteration) {
      int64_t it = m.iteration;
      TESSERA_RETURN_IF_ERROR(executor.writeBuffer(br.name, &it, 8));
    } else {
      TESSERA_RETURN_IF_ERROR(executor.writeBuffer(br.name, host[i].data(),
                                                   int64_t(host[i].size())));
    }
  }
  // Every rank has its state: a rank that failed has aborted the job before
  // this barrier, so nobody reports a load that did not complete.
  if (world) {
    step.emplace(o.monitor,
                 loading + "waiting for every rank to restore its state "
                           "(barrier)",
                 On::Peers);
    TESSERA_RETURN_IF_ERROR(world->barrier());
    step.reset();
  }
  CheckpointLoadResult result;
  result.dir = loc.dir;
  result.iteration = m.iteration;
  result.gradScaler = m.gradScaler;
  result.skippedIterations = m.skippedIterations;
  result.resharded = plan.resharded;
  result.savedConfig = m.configString();
  result.targetConfig = plan.targetConfig;
  result.notes = plan.notes;
  return result;
}


} // namespace tessera::rt
