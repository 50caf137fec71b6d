//===- Trace.cpp - Chrome/Perfetto trace of all ranks ---------------------===//
//
// tessera-run --trace FILE: every rank's timeline of instructions (tracks
// phase, compute, communication and pipeline p2p, recorded by the executor
// from the barrier that starts the trace) is gathered to rank 0, which
// writes one Chrome trace-event JSON file that chrome://tracing and
// Perfetto open (a process per rank, a thread per track). Also the JSON
// string and number formatting the --metrics lines share.
//
//===----------------------------------------------------------------------===//

#include "LauncherInternal.h"

#include "tessera/rt/Executor.h"
#include "tessera/rt/MpiCommunicator.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tessera::rt::launcher {

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

/// Gathers every rank's timeline to rank 0, which writes one Chrome/Perfetto
/// trace (a process per rank, a thread per track) atomically.
Status writeTrace(const std::string &path, const Executor &executor,
                  int rank) {
  static const char *tracks[] = {"phase", "compute", "communication", "p2p"};
  constexpr int numTracks = 4;
  std::string mine;
  for (const TraceEvent &e : executor.traceEvents()) {
    int tid = 0;
    for (int i = 0; i < numTracks; ++i)
      if (e.track == tracks[i])
        tid = i;
    mine += "{\"name\": " + jsonString(e.name) + ", \"cat\": " +
            jsonString(e.track) + ", \"ph\": \"X\", \"pid\": " +
            std::to_string(rank) + ", \"tid\": " + std::to_string(tid) +
            ", \"ts\": " + jsonNumber(e.startUs) +
            ", \"dur\": " + jsonNumber(e.durationUs) +
            (e.group.empty()
                 ? std::string()
                 : ", \"args\": {\"group\": " + jsonString(e.group) + "}") +
            "},\n";
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int length = int(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size));
  std::vector<int> offsets(static_cast<size_t>(size));
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Gather(&length, 1, MPI_INT, lengths.data(),
                                         1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[size_t(r)] = total;
      total += lengths[size_t(r)];
    }
    all.resize(size_t(total));
  }
  TESSERA_RETURN_IF_MPI_ERROR(MPI_Gatherv(mine.data(), length, MPI_CHAR,
                                          all.data(), lengths.data(),
                                          offsets.data(), MPI_CHAR, 0,
                                          MPI_COMM_WORLD));
  if (rank != 0)
    return Status();
  std::string json = "{\"traceEvents\": [\n";
  for (int r = 0; r < size; ++r) {
    json += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " +
            std::to_string(r) + ", \"args\": {\"name\": \"rank " +
            std::to_string(r) + "\"}},\n";
    for (int t = 0; t < numTracks; ++t)
      json += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " +
              std::to_string(r) + ", \"tid\": " + std::to_string(t) +
              ", \"args\": {\"name\": \"" + tracks[t] + "\"}},\n";
  }
  json += all;
  json.resize(json.size() - 2); // the last ",\n"
  json += "\n]}\n";
  std::string tmp = path + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "w");
  if (!f)
    return notFound(path, ": cannot write the trace: ", std::strerror(errno));
  bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    return dataLoss(path, ": writing the trace failed");
  return Status();
}

} // namespace tessera::rt::launcher
