//===- NcclApiCuda.cpp - The NcclApi table over NCCL and CUDA -------------===//
//
// Binds NcclApi's entries to NCCL 2.28 and the CUDA runtime API. Every error
// names the call and its error string; NCCL errors add ncclGetLastError's
// detail (which says, e.g., which peer or transport failed).
//
// Communicators are created blocking (the default config), so no call
// returns ncclInProgress. Streams are non-blocking so that the legacy
// default stream never serialises communication with the backend's work;
// events have timing disabled, the cheapest kind, since they only order
// streams.
//
//===----------------------------------------------------------------------===//

#include "NcclApiCuda.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>

#include <cstring>
#include <string>

namespace tessera::rt {

namespace {

static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId) &&
                  sizeof(NcclUniqueId) == NCCL_UNIQUE_ID_BYTES,
              "NcclUniqueId must hold an ncclUniqueId");

Status ncclStatus(ncclResult_t result, const char *call) {
  if (result == ncclSuccess)
    return Status();
  // Misuse is the caller's bug; system and remote errors are a failed
  // peer, network or driver, which a restart may get past.
  StatusCode code = StatusCode::Internal;
  if (result == ncclInvalidArgument || result == ncclInvalidUsage)
    code = StatusCode::InvalidArgument;
  else if (result == ncclSystemError || result == ncclRemoteError)
    code = StatusCode::Unavailable;
  std::string message = std::string(call) + ": " + ncclGetErrorString(result);
  // The comm argument is unused by NCCL: the detail is per thread.
  const char *detail = ncclGetLastError(nullptr);
  if (detail && *detail)
    message += std::string(" (") + detail + ")";
  return Status(code, message);
}

Status cudaStatus(cudaError_t error, const char *call) {
  if (error == cudaSuccess)
    return Status();
  return internalError(call, ": ", cudaGetErrorName(error), ": ",
                       cudaGetErrorString(error));
}

ncclDataType_t ncclType(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return ncclFloat32;
  case ElementType::I32:
    return ncclInt32;
  case ElementType::I64:
    return ncclInt64;
  case ElementType::BF16:
    return ncclBfloat16;
  case ElementType::F16:
    return ncclFloat16;
  case ElementType::F64:
    return ncclFloat64;
  }
  return ncclNumTypes; // rejected by NCCL as an invalid argument
}

ncclRedOp_t ncclOp(ReduceKind op) {
  return op == ReduceKind::Max ? ncclMax : ncclSum;
}

ncclComm_t asComm(void *comm) { return static_cast<ncclComm_t>(comm); }
cudaStream_t asStream(void *stream) {
  return static_cast<cudaStream_t>(stream);
}
cudaEvent_t asEvent(void *event) { return static_cast<cudaEvent_t>(event); }

NcclApi makeCudaNcclApi() {
  NcclApi api;

  //--- Communicators --------------------------------------------------------//

  api.getUniqueId = []() -> StatusOr<NcclUniqueId> {
    ncclUniqueId id;
    TESSERA_RETURN_IF_ERROR(
        ncclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    NcclUniqueId out;
    std::memcpy(out.internal, id.internal, sizeof(out.internal));
    return out;
  };
  api.commInitRank = [](int nranks, const NcclUniqueId &id,
                        int rank) -> StatusOr<void *> {
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.internal, sizeof(nid.internal));
    ncclComm_t comm = nullptr;
    TESSERA_RETURN_IF_ERROR(ncclStatus(
        ncclCommInitRank(&comm, nranks, nid, rank), "ncclCommInitRank"));
    return static_cast<void *>(comm);
  };
  api.commSplit = [](void *parent, std::optional<int> color,
                     int key) -> StatusOr<void *> {
    if (color && *color < 0)
      return invalidArgument("ncclCommSplit: negative colour ", *color);
    ncclComm_t comm = nullptr;
    TESSERA_RETURN_IF_ERROR(ncclStatus(
        ncclCommSplit(asComm(parent), color ? *color : NCCL_SPLIT_NOCOLOR, key,
                      &comm, /*config=*/nullptr),
        "ncclCommSplit"));
    return static_cast<void *>(comm);
  };
  api.commCount = [](void *comm) -> StatusOr<int> {
    int count = 0;
    TESSERA_RETURN_IF_ERROR(
        ncclStatus(ncclCommCount(asComm(comm), &count), "ncclCommCount"));
    return count;
  };
  api.commUserRank = [](void *comm) -> StatusOr<int> {
    int rank = 0;
    TESSERA_RETURN_IF_ERROR(
        ncclStatus(ncclCommUserRank(asComm(comm), &rank), "ncclCommUserRank"));
    return rank;
  };
  api.commDestroy = [](void *comm) {
    return ncclStatus(ncclCommDestroy(asComm(comm)), "ncclCommDestroy");
  };
  api.commAbort = [](void *comm) {
    return ncclStatus(ncclCommAbort(asComm(comm)), "ncclCommAbort");
  };
  api.commGetAsyncError = [](void *comm) -> Status {
    ncclResult_t async = ncclSuccess;
    TESSERA_RETURN_IF_ERROR(ncclStatus(
        ncclCommGetAsyncError(asComm(comm), &async), "ncclCommGetAsyncError"));
    if (async == ncclInProgress)
      return Status();
    return ncclStatus(async, "NCCL asynchronous error");
  };

  //--- Operations -----------------------------------------------------------//

  api.groupStart = [] {
    return ncclStatus(ncclGroupStart(), "ncclGroupStart");
  };
  api.groupEnd = [] { return ncclStatus(ncclGroupEnd(), "ncclGroupEnd"); };
  api.allReduce = [](const void *send, void *recv, size_t count,
                     ElementType type, ReduceKind op, void *comm,
                     void *stream) {
    return ncclStatus(ncclAllReduce(send, recv, count, ncclType(type),
                                    ncclOp(op), asComm(comm), asStream(stream)),
                      "ncclAllReduce");
  };
  api.allGather = [](const void *send, void *recv, size_t sendCount,
                     ElementType type, void *comm, void *stream) {
    return ncclStatus(ncclAllGather(send, recv, sendCount, ncclType(type),
                                    asComm(comm), asStream(stream)),
                      "ncclAllGather");
  };
  api.reduceScatter = [](const void *send, void *recv, size_t recvCount,
                         ElementType type, ReduceKind op, void *comm,
                         void *stream) {
    return ncclStatus(ncclReduceScatter(send, recv, recvCount, ncclType(type),
                                        ncclOp(op), asComm(comm),
                                        asStream(stream)),
                      "ncclReduceScatter");
  };
  api.send = [](const void *buffer, size_t count, ElementType type, int peer,
                void *comm, void *stream) {
    return ncclStatus(ncclSend(buffer, count, ncclType(type), peer,
                               asComm(comm), asStream(stream)),
                      "ncclSend");
  };
  api.recv = [](void *buffer, size_t count, ElementType type, int peer,
                void *comm, void *stream) {
    return ncclStatus(ncclRecv(buffer, count, ncclType(type), peer,
                               asComm(comm), asStream(stream)),
                      "ncclRecv");
  };

  //--- CUDA runtime ---------------------------------------------------------//

  api.streamCreate = []() -> StatusOr<void *> {
    cudaStream_t stream = nullptr;
    TESSERA_RETURN_IF_ERROR(
        cudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags(cudaStreamNonBlocking)"));
    return static_cast<void *>(stream);
  };
  api.streamDestroy = [](void *stream) {
    return cudaStatus(cudaStreamDestroy(asStream(stream)), "cudaStreamDestroy");
  };
  api.streamSynchronize = [](void *stream) {
    return cudaStatus(cudaStreamSynchronize(asStream(stream)),
                      "cudaStreamSynchronize");
  };
  api.eventCreate = []() -> StatusOr<void *> {
    cudaEvent_t event = nullptr;
    TESSERA_RETURN_IF_ERROR(
        cudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags(cudaEventDisableTiming)"));
    return static_cast<void *>(event);
  };
  api.eventDestroy = [](void *event) {
    return cudaStatus(cudaEventDestroy(asEvent(event)), "cudaEventDestroy");
  };
  api.eventRecord = [](void *event, void *stream) {
    return cudaStatus(cudaEventRecord(asEvent(event), asStream(stream)),
                      "cudaEventRecord");
  };
  api.streamWaitEvent = [](void *stream, void *event) {
    return cudaStatus(
        cudaStreamWaitEvent(asStream(stream), asEvent(event), /*flags=*/0),
        "cudaStreamWaitEvent");
  };
  api.eventQuery = [](void *event) -> StatusOr<bool> {
    cudaError_t error = cudaEventQuery(asEvent(event));
    if (error == cudaErrorNotReady)
      return false;
    TESSERA_RETURN_IF_ERROR(cudaStatus(error, "cudaEventQuery"));
    return true;
  };
  api.memAlloc = [](size_t bytes) -> StatusOr<void *> {
    void *ptr = nullptr;
    TESSERA_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"));
    return ptr;
  };
  api.memFree = [](void *ptr) { return cudaStatus(cudaFree(ptr), "cudaFree"); };
  return api;
}

} // namespace

const NcclApi &cudaNcclApi() {
  static const NcclApi api = makeCudaNcclApi();
  return api;
}

std::string ncclLibrary() {
  int v = 0;
  std::string s = "NCCL ";
  if (ncclGetVersion(&v) == ncclSuccess)
    s += std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
  else
    s += "?";
  Dl_info info;
  s += " (";
  s += dladdr(reinterpret_cast<const void *>(&ncclGetVersion), &info) &&
               info.dli_fname
           ? info.dli_fname
           : "?";
  return s + ")";
}

} // namespace tessera::rt
