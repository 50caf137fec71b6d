//===- CudaBackend.cpp - The "cuda" compute backend -----------------------===//

#include "CudaBackend.h"

#include "Kernels.h"
#include "NcclApiCuda.h"

#include "tessera/rt/Rng.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tessera::rt::cuda {

/// cuBLASLt workspace (the size cuBLAS recommends for Hopper).
constexpr int64_t kLtWorkspaceBytes = 32ll << 20;
/// Bound on the attention probabilities scratch; heads are processed in
/// chunks that fit.
constexpr int64_t kAttentionScratchBytes = 256ll << 20;

Status cudaStatus(cudaError_t error, const char *what) {
  if (error == cudaSuccess)
    return Status();
  return unavailable(what, ": ", cudaGetErrorName(error), " (",
                     cudaGetErrorString(error), ")");
}

#define TESSERA_RETURN_IF_CUDA_ERROR(expr)                                     \
  TESSERA_RETURN_IF_ERROR(::tessera::rt::cuda::cudaStatus((expr), #expr))

StatusOr<int> selectDevice(int localRank) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    const char *hint =
        error == cudaErrorInsufficientDriver
            ? "; is an NVIDIA driver (libcuda.so.1) installed?"
        : error == cudaErrorNoDevice
            ? "; check CUDA_VISIBLE_DEVICES"
            : "";
    return unavailable("the cuda backend has no GPU to run on: "
                       "cudaGetDeviceCount failed with ",
                       cudaGetErrorName(error), " (", cudaGetErrorString(error),
                       ")", hint);
  }
  if (count == 0)
    return unavailable("the cuda backend has no GPU to run on: "
                       "cudaGetDeviceCount found no device");
  if (localRank < 0)
    for (const char *var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                            "SLURM_LOCALID"})
      if (const char *value = std::getenv(var)) {
        localRank = std::atoi(value);
        break;
      }
  return std::max(localRank, 0) % count;
}

StatusOr<std::unique_ptr<Backend>>
createCudaBackend(const BackendOptions &options) {
  TESSERA_ASSIGN_OR_RETURN(int device, selectDevice(options.localRank));
  TESSERA_ASSIGN_OR_RETURN(auto backend, CudaBackend::create(device, options));
  return std::unique_ptr<Backend>(std::move(backend));
}

StatusOr<std::unique_ptr<CudaBackend>>
CudaBackend::create(int device, const BackendOptions &options) {
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->deviceIndex = device;
  be->allowTf32 = options.allowTf32;
  TESSERA_RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  TESSERA_RETURN_IF_CUDA_ERROR(
      cudaStreamCreateWithFlags(&be->computeStream, cudaStreamNonBlocking));
  TESSERA_RETURN_IF_ERROR(cublasStatus(cublasLtCreate(&be->lt), "cublasLtCreate"));
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMalloc(&be->workspace, kLtWorkspaceBytes));
  be->workspaceBytes = kLtWorkspaceBytes;
  TESSERA_RETURN_IF_CUDA_ERROR(
      cudaMalloc(reinterpret_cast<void **>(&be->deviceError),
                 sizeof(DeviceError)));
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
      be->deviceError, 0, sizeof(DeviceError), be->computeStream));
  return be;
}

namespace {

/// The file of the shared library that defines `symbol` ("?" if unknown).
std::string libraryFile(const void *symbol) {
  Dl_info info;
  if (dladdr(symbol, &info) && info.dli_fname)
    return info.dli_fname;
  return "?";
}

/// CUDA's version numbers (1000 * major + 10 * minor) as "major.minor".
std::string cudaVersion(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

} // namespace

std::string CudaBackend::kernelLibraries() const {
  std::string s;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, deviceIndex) == cudaSuccess)
    s += "GPU " + std::to_string(deviceIndex) + " " + prop.name + " (sm_" +
         std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  s += " | driver CUDA " + cudaVersion(driver) + " | cudart " +
       cudaVersion(runtime) + " (" +
       libraryFile(reinterpret_cast<const void *>(&cudaRuntimeGetVersion)) +
       ")";
  size_t lt = cublasLtGetVersion();
  s += " | cuBLASLt " + std::to_string(lt / 10000) + "." +
       std::to_string(lt / 100 % 100) + "." + std::to_string(lt % 100) + " (" +
       libraryFile(reinterpret_cast<const void *>(&cublasLtGetVersion)) + ")";
  s += " | " + ncclLibrary();
  return s;
}

CudaBackend::~CudaBackend() {
  if (computeStream)
    cudaStreamSynchronize(computeStream);
  ncclGroups.clear();
  ncclWorld.reset();
  for (void *p : scratchPtr)
    if (p)
      cudaFree(p);
  gemms.clear();
  if (deviceError)
    cudaFree(deviceError);
  if (workspace)
    cudaFree(workspace);
  if (lt)
    cublasLtDestroy(lt);
  if (computeStream)
    cudaStreamDestroy(computeStream);
}

Status CudaBackend::launched(cudaError_t error, const char *what) {
  if (error == cudaSuccess)
    return Status();
  return internalError("launching the ", what, " kernel: ",
                       cudaGetErrorName(error), " (", cudaGetErrorString(error),
                       ")");
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

StatusOr<void *> CudaBackend::allocate(int64_t bytes) {
  void *ptr = nullptr;
  size_t size = size_t(std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
  cudaError_t error = cudaMalloc(&ptr, size);
  if (error != cudaSuccess)
    return unavailable("cannot allocate ", bytes, " bytes on GPU ",
                       deviceIndex, ": ", cudaGetErrorName(error), " (",
                       cudaGetErrorString(error), ")");
  // Zeroed in stream order: the compute stream does not synchronise with
  // the legacy default stream (cudaStreamNonBlocking), so a plain cudaMemset
  // could land after the first copy into the buffer.
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(ptr, 0, size, computeStream));
  return ptr;
}

void CudaBackend::deallocate(void *ptr) {
  if (ptr) {
    cudaStreamSynchronize(computeStream);
    cudaFree(ptr);
  }
}

StatusOr<void *> CudaBackend::allocateHost(int64_t bytes) {
  void *ptr = nullptr;
  cudaError_t error =
      cudaMallocHost(&ptr, size_t(std::max<int64_t>(bytes, 1)));
  if (error != cudaSuccess)
    return unavailable("cannot allocate ", bytes, " bytes of pinned memory: ",
                       cudaGetErrorName(error), " (", cudaGetErrorString(error),
                       ")");
  return ptr;
}

void CudaBackend::deallocateHost(void *ptr) {
  if (ptr) {
    cudaStreamSynchronize(computeStream);
    cudaFreeHost(ptr);
  }
}

Status CudaBackend::copyToDevice(void *dst, const void *src, int64_t bytes) {
  if (bytes <= 0)
    return Status();
  // From pinned memory (allocateHost) the copy is asynchronous: the source
  // must stay unchanged until the next synchronize. From pageable memory
  // CUDA stages it before returning (and may wait for the stream to do so),
  // which is why the executor's per-iteration inputs come from pinned
  // staging.
  return cudaStatus(cudaMemcpyAsync(dst, src, size_t(bytes),
                                    cudaMemcpyHostToDevice, computeStream),
                    "cudaMemcpyAsync (host to device)");
}

Status CudaBackend::copyToHost(void *dst, const void *src, int64_t bytes) {
  if (bytes <= 0)
    return Status();
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
      dst, src, size_t(bytes), cudaMemcpyDeviceToHost, computeStream));
  return cudaStatus(cudaStreamSynchronize(computeStream),
                    "cudaStreamSynchronize after a device-to-host copy");
}

Status CudaBackend::synchronize() {
  DeviceError error;
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(&error, deviceError,
                                               sizeof(error),
                                               cudaMemcpyDeviceToHost,
                                               computeStream));
  TESSERA_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(computeStream));
  if (error.kind == kNoError)
    return Status();
  TESSERA_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(deviceError, 0,
                                               sizeof(DeviceError),
                                               computeStream));
  switch (error.kind) {
  case kVocabularyId:
    return outOfRange("Embedding: vocabulary id ", error.value, " at row ",
                      error.row, " is out of range for vocabulary size ",
                      error.limit);
  case kLabel:
    return outOfRange("CrossEntropy: label ", error.value, " of row ",
                      error.row, " is outside [0, ", error.limit, ")");
  case kLabelWithIgnore:
    return outOfRange("CrossEntropyStats: label ", error.value, " at row ",
                      error.row, " is out of range for ", error.limit,
                      " classes (ignore_index ", error.extra, ")");
  case kAdamIteration:
    return invalidArgument("Adam: iteration must be >= 1, got ", error.value);
  case kExpertIndex:
    return outOfRange("expert index ", error.value, " of routing choice ",
                      error.row, " is out of range for ", error.limit,
                      " experts");
  case kExpertIndexOfToken:
    return outOfRange("MoERouterGrad: expert index ", error.value,
                      " of token ", error.row, " is out of range for ",
                      error.limit, " experts");
  default:
    return internalError("unknown device error kind ", error.kind);
  }
}

StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
CudaBackend::createCommunicators(const artifact::Artifact &artifact,
                                 const std::vector<std::string> &kinds) {
  TESSERA_RETURN_IF_CUDA_ERROR(cudaSetDevice(deviceIndex));
  // A one-rank run makes no NCCL communicator (its groups run on self
  // communicators) unless TESSERA_NCCL_ONE_RANK=1 asks for them, to check
  // that NCCL starts on this machine.
  const char *oneRank = std::getenv("TESSERA_NCCL_ONE_RANK");
  TESSERA_ASSIGN_OR_RETURN(
      NcclCommunicators nccl,
      createNcclCommunicators(cudaNcclApi(), computeStream, artifact, kinds,
                              oneRank && std::string(oneRank) == "1"));
  ncclWorld = std::move(nccl.world);
  std::map<std::string, std::unique_ptr<Communicator>> groups;
  for (auto &[kind, comm] : nccl.groups) {
    ncclGroups.push_back(comm.get());
    groups[kind] = std::move(comm);
  }
  return groups;
}

void CudaBackend::abortCommunicators() {
  for (NcclCommunicator *comm : ncclGroups)
    comm->abort().ignoreError();
  if (ncclWorld)
    ncclWorld->abort().ignoreError();
}

StatusOr<float *> CudaBackend::scratch(int slot, int64_t bytes) {
  if (scratchBytes[slot] < bytes) {
    if (scratchPtr[slot])
      TESSERA_RETURN_IF_CUDA_ERROR(cudaFreeAsync(scratchPtr[slot], computeStream));
    scratchPtr[slot] = nullptr;
    scratchBytes[slot] = 0;
    TESSERA_RETURN_IF_CUDA_ERROR(
        cudaMallocAsync(&scratchPtr[slot], size_t(bytes), computeStream));
    scratchBytes[slot] = bytes;
  }
  return static_cast<float *>(scratchPtr[slot]);
}

//===----------------------------------------------------------------------===//
// GEMMs
//===----------------------------------------------------------------------===//

StatusOr<CudaBackend::CachedGemm *>
CudaBackend::cachedGemm(const GemmPlan &plan, const uint32_t align[3]) {
  PlanKey key{plan.transA,  plan.transB,  plan.m,       plan.n,
              plan.k,       plan.lda,     plan.ldb,     plan.ldc,
              plan.batch,   plan.strideA, plan.strideB, plan.strideC,
              align[0],     align[1],     align[2],     plan.inputs,
              plan.output};
  auto it = gemms.find(key);
  if (it != gemms.end())
    return it->second.get();
  auto entry = std::make_unique<CachedGemm>();
  TESSERA_ASSIGN_OR_RETURN(entry->descriptors,
                           LtGemmDescriptors::create(plan, allowTf32));
  cublasLtMatmulPreference_t pref = nullptr;
  TESSERA_RETURN_IF_ERROR(cublasStatus(cublasLtMatmulPreferenceCreate(&pref),
                                       "cublasLtMatmulPreferenceCreate"));
  uint64_t limit = uint64_t(workspaceBytes);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  Status st = cublasStatus(
      cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof(limit)),
      "setting CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
  // Only kernels that work at the operands' alignments (C is also D).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] =
      {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}};
  for (const auto &[attribute, bytes] : alignments)
    if (st.ok())
      st = cublasStatus(cublasLtMatmulPreferenceSetAttribute(
                            pref, attribute, &bytes, sizeof(bytes)),
                        "setting CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES");
  const LtGemmDescriptors &d = entry->descriptors;
  if (st.ok())
    st = cublasStatus(cublasLtMatmulAlgoGetHeuristic(lt, d.matmul, d.a, d.b,
                                                     d.c, d.c, pref, 1,
                                                     &result, &found),
                      "cublasLtMatmulAlgoGetHeuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  TESSERA_RETURN_IF_ERROR(st);
  if (found == 0)
    return unimplemented("cuBLASLt has no algorithm for the GEMM m=", plan.m,
                         " n=", plan.n, " k=", plan.k, " batch=", plan.batch,
                         " (", formatName(plan.inputs), " A and B, ",
                         formatName(plan.output), " C)",
                         " with operands aligned to ", align[0], ", ",
                         align[1], " and ", align[2], " bytes");
  entry->algo = result.algo;
  CachedGemm *raw = entry.get();
  gemms.emplace(key, std::move(entry));
  return raw;
}

Status CudaBackend::runRowMajor(const RowMajorGemm &g, const void *a,
                                const void *b, FloatOut c, float alpha,
                                float beta, FloatFormat inputs) {
  GemmPlan plan = columnMajorPlan(g);
  plan.inputs = inputs;
  plan.output = c.format;
  // The plan's A is the row-major B (swapOperands).
  const void *colA = plan.swapOperands ? b : a;
  const void *colB = plan.swapOperands ? a : b;
  // Base, leading dimension and batch stride, in bytes.
  const int64_t in = formatBytes(inputs), out = formatBytes(c.format);
  const bool batched = plan.batch > 1;
  const uint32_t align[3] = {
      operandAlignment(reinterpret_cast<uintptr_t>(colA), plan.lda * in,
                       batched ? plan.strideA * in : 0),
      operandAlignment(reinterpret_cast<uintptr_t>(colB), plan.ldb * in,
                       batched ? plan.strideB * in : 0),
      operandAlignment(reinterpret_cast<uintptr_t>(c.data), plan.ldc * out,
                       batched ? plan.strideC * out : 0)};
  TESSERA_ASSIGN_OR_RETURN(CachedGemm * cached, cachedGemm(plan, align));
  const LtGemmDescriptors &d = cached->descriptors;
  return cublasStatus(cublasLtMatmul(lt, d.matmul, &alpha, colA, d.a, colB,
                                     d.b, &beta, c.data, d.c, c.data, d.c,
                                     &cached->algo,
                                     workspace, size_t(workspaceBytes),
                                     computeStream),
                      "cublasLtMatmul");
}

Status CudaBackend::denseGemm(bool transA, bool transB, int64_t m, int64_t n,
                              int64_t k, float alpha, const void *a,
                              const void *b, float beta, FloatOut c,
                              FloatFormat inputs) {
  if (!c.isF32() && (c.format != inputs || beta != 0.0f))
    return invalidArgument(
        "gemm: a 16-bit C must have A and B's format and beta 0, got ",
        formatName(c.format), " C with ", formatName(inputs),
        " A and B and beta ", beta);
  if (m == 0 || n == 0)
    return Status();
  if (k == 0) {
    // C = beta * C, as on the CPU (a 16-bit C has beta 0: zeros).
    if (beta == 0.0f)
      return cudaStatus(cudaMemsetAsync(c.data, 0,
                                        size_t(m * n * formatBytes(c.format)),
                                        computeStream),
                        "cudaMemsetAsync");
    return launched(launchScale(computeStream, c.f32(), c.f32(), beta, m * n),
                    "Scale");
  }
  return runRowMajor(denseRowMajorGemm(transA, transB, m, n, k), a, b, c,
                     alpha, beta, inputs);
}

Status CudaBackend::gemm(bool transA, bool transB, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, const float *b,
                         float beta, float *c) {
  return denseGemm(transA, transB, m, n, k, alpha, a, b, beta, c,
                   FloatFormat::F32);
}

Status CudaBackend::gemmHalf(FloatFormat half, bool transA, bool transB,
                             int64_t m, int64_t n, int64_t k, float alpha,
                             const uint16_t *a, const uint16_t *b, float beta,
                             FloatOut c) {
  if (half == FloatFormat::F32)
    return invalidArgument("gemmHalf takes a 16-bit format");
  return denseGemm(transA, transB, m, n, k, alpha, a, b, beta, c, half);
}

//===----------------------------------------------------------------------===//
// Attention: per chunk of heads, strided-batched GEMMs around row kernels.
//===----------------------------------------------------------------------===//

Status CudaBackend::attentionProbs(const AttentionPlans &p, const float *qkv,
                                   float *probs, int64_t heads, int64_t seq,
                                   float scale, bool causal) {
  TESSERA_RETURN_IF_ERROR(runRowMajor(p.scores, qkv + p.qOffset,
                                      qkv + p.kOffset, probs, scale, 0.0f));
  return launched(
      launchSoftmaxRows(computeStream, probs, heads * seq, seq, causal),
      "attention softmax");
}

Status CudaBackend::attention(const float *qkv, float *out, int64_t seq,
                              int64_t batch, int64_t heads, int64_t headDim,
                              bool causal) {
  if (seq == 0 || batch == 0 || heads == 0 || headDim == 0)
    return Status();
  const int64_t total = batch * heads;
  const int64_t chunk =
      attentionChunk(seq, total, 1, kAttentionScratchBytes);
  TESSERA_ASSIGN_OR_RETURN(float *probs, scratch(0, chunk * seq * seq * 4));
  const float scale = float(1.0 / std::sqrt(double(headDim)));
  for (int64_t z0 = 0; z0 < total; z0 += chunk) {
    const int64_t count = std::min(chunk, total - z0);
    AttentionPlans p = attentionPlans(seq, batch, heads, headDim, count);
    const float *base = qkv + z0 * p.qkvHeadStride;
    TESSERA_RETURN_IF_ERROR(attentionProbs(p, base, probs, count, seq, scale,
                                           causal));
    TESSERA_RETURN_IF_ERROR(runRowMajor(p.context, probs, base + p.vOffset,
                                        out + z0 * p.outHeadStride, 1.0f,
                                        0.0f));
  }
  return Status();
}

Status CudaBackend::attentionGrad(const float *qkv, const float *dout,
                                  float *dqkv, int64_t seq, int64_t batch,
                                  int64_t heads, int64_t headDim,
                                  bool causal) {
  if (seq == 0 || batch == 0 || heads == 0 || headDim == 0)
    return Status();
  const int64_t total = batch * heads;
  const int64_t chunk =
      attentionChunk(seq, total, 2, kAttentionScratchBytes);
  TESSERA_ASSIGN_OR_RETURN(float *probs, scratch(0, chunk * seq * seq * 4));
  TESSERA_ASSIGN_OR_RETURN(float *dprobs, scratch(1, chunk * seq * seq * 4));
  const float scale = float(1.0 / std::sqrt(double(headDim)));
  for (int64_t z0 = 0; z0 < total; z0 += chunk) {
    const int64_t count = std::min(chunk, total - z0);
    AttentionPlans p = attentionPlans(seq, batch, heads, headDim, count);
    const float *base = qkv + z0 * p.qkvHeadStride;
    float *dbase = dqkv + z0 * p.qkvHeadStride;
    const float *dO = dout + z0 * p.outHeadStride;
    TESSERA_RETURN_IF_ERROR(attentionProbs(p, base, probs, count, seq, scale,
                                           causal));
    // dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(P dP)).
    TESSERA_RETURN_IF_ERROR(
        runRowMajor(p.gradV, probs, dO, dbase + p.vOffset, 1.0f, 0.0f));
    TESSERA_RETURN_IF_ERROR(
        runRowMajor(p.gradProbs, dO, base + p.vOffset, dprobs, 1.0f, 0.0f));
    TESSERA_RETURN_IF_ERROR(launched(
        launchSoftmaxGradRows(computeStream, probs, dprobs, count * seq, seq),
        "attention softmax gradient"));
    // dQ = dS K / sqrt(D); dK = dS^T Q / sqrt(D).
    TESSERA_RETURN_IF_ERROR(runRowMajor(p.gradQ, dprobs, base + p.kOffset,
                                        dbase + p.qOffset, scale, 0.0f));
    TESSERA_RETURN_IF_ERROR(runRowMajor(p.gradK, dprobs, base + p.qOffset,
                                        dbase + p.kOffset, scale, 0.0f));
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Everything else: one launcher each (Kernels.cu).
//===----------------------------------------------------------------------===//

/// The launchers' view of a FloatIn or FloatOut.
static DeviceFloats dev(FloatIn x) {
  return {const_cast<void *>(x.data), x.format};
}
static DeviceFloats dev(FloatOut y) { return {y.data, y.format}; }

Status CudaBackend::biasAdd(FloatIn x, const float *bias, FloatOut y,
                            int64_t rows, int64_t cols) {
  return launched(launchBiasAdd(computeStream, dev(x), bias, dev(y), rows, cols),
                  "BiasAdd");
}
Status CudaBackend::add(FloatIn a, FloatIn b, FloatOut c, int64_t n) {
  return launched(launchAdd(computeStream, dev(a), dev(b), dev(c), n), "Add");
}
Status CudaBackend::gelu(const float *x, float *y, int64_t n, bool tanh) {
  return launched(launchGelu(computeStream, x, y, n, tanh), "Gelu");
}
Status CudaBackend::geluGrad(const float *x, const float *dy, float *dx,
                             int64_t n, bool tanh) {
  return launched(launchGeluGrad(computeStream, x, dy, dx, n, tanh),
                  "GeluGrad");
}
Status CudaBackend::biasGelu(FloatIn x, const float *bias, FloatOut y,
                             int64_t rows, int64_t cols, bool tanh) {
  return launched(
      launchBiasGelu(computeStream, dev(x), bias, dev(y), rows, cols, tanh),
      "BiasGelu");
}
Status CudaBackend::biasGeluGrad(FloatIn x, const float *bias,
                                 const float *dy, float *dx, float *dbias,
                                 int64_t rows, int64_t cols, bool tanh,
                                 float beta) {
  return launched(launchBiasGeluGrad(computeStream, dev(x), bias, dy, dx,
                                     dbias, rows, cols, tanh, beta),
                  "BiasGeluGrad");
}
Status CudaBackend::swiglu(FloatIn x, FloatOut y, int64_t rows, int64_t n) {
  return launched(launchSwiGLU(computeStream, dev(x), dev(y), rows, n),
                  "SwiGLU");
}
Status CudaBackend::swigluGrad(FloatIn x, const float *dy, FloatOut dx,
                               int64_t rows, int64_t n) {
  return launched(
      launchSwiGLUGrad(computeStream, dev(x), dy, dev(dx), rows, n),
      "SwiGLUGrad");
}
Status CudaBackend::repeatKV(FloatIn x, FloatOut y, int64_t rows,
                             int64_t heads, int64_t groups, int64_t headDim) {
  return launched(launchRepeatKV(computeStream, dev(x), dev(y), rows, heads,
                                 groups, headDim),
                  "RepeatKV");
}
Status CudaBackend::repeatKVGrad(FloatIn dy, FloatOut dx, int64_t rows,
                                 int64_t heads, int64_t groups,
                                 int64_t headDim) {
  return launched(launchRepeatKVGrad(computeStream, dev(dy), dev(dx), rows,
                                     heads, groups, headDim),
                  "RepeatKVGrad");
}
Status CudaBackend::qkNorm(const float *x, const float *wq, const float *wk,
                           float *y, int64_t rows, int64_t heads,
                           int64_t groups, int64_t headDim, float eps) {
  return launched(launchQKNorm(computeStream, x, wq, wk, y, rows, heads,
                               groups, headDim, eps),
                  "QKNorm");
}
Status CudaBackend::qkNormGrad(const float *x, const float *wq,
                               const float *wk, const float *dy, float *dx,
                               float *dwq, float *dwk, int64_t rows,
                               int64_t heads, int64_t groups, int64_t headDim,
                               float eps, float beta) {
  return launched(launchQKNormGrad(computeStream, x, wq, wk, dy, dx, dwq, dwk,
                                   rows, heads, groups, headDim, eps, beta),
                  "QKNormGrad");
}
Status CudaBackend::relu(const float *x, float *y, int64_t n) {
  return launched(launchRelu(computeStream, x, y, n), "Relu");
}
Status CudaBackend::reluGrad(const float *x, const float *dy, float *dx,
                             int64_t n) {
  return launched(launchReluGrad(computeStream, x, dy, dx, n), "ReluGrad");
}
Status CudaBackend::reduceRows(const float *x, float *y, int64_t rows,
                               int64_t cols, float alpha, float beta) {
  return launched(launchReduceRows(computeStream, x, y, rows, cols, alpha, beta),
                  "ReduceRows");
}
Status CudaBackend::crossEntropy(const float *z, const int32_t *t, float *loss,
                                 int64_t rows, int64_t cols) {
  return launched(
      launchCrossEntropy(computeStream, z, t, loss, rows, cols, deviceError),
      "CrossEntropy");
}
Status CudaBackend::crossEntropyGrad(const float *z, const int32_t *t,
                                     const float *dl, float *dz, int64_t rows,
                                     int64_t cols) {
  return launched(launchCrossEntropyGrad(computeStream, z, t, dl, dz, rows,
                                         cols, deviceError),
                  "CrossEntropyGrad");
}
Status CudaBackend::mean(const float *x, float *y, int64_t n) {
  return launched(launchMean(computeStream, x, y, n), "Mean");
}
Status CudaBackend::meanGrad(const float *dy, float *dx, int64_t n) {
  return launched(launchMeanGrad(computeStream, dy, dx, n), "MeanGrad");
}
Status CudaBackend::fill(float *y, float value, int64_t n) {
  return launched(launchFill(computeStream, y, value, n), "Fill");
}
Status CudaBackend::scale(const float *x, float *y, float alpha, int64_t n) {
  return launched(launchScale(computeStream, x, y, alpha, n), "Scale");
}

Status CudaBackend::copy(const void *x, void *y, int64_t bytes) {
  if (x == y || bytes <= 0)
    return Status();
  const char *xs = static_cast<const char *>(x);
  char *ys = static_cast<char *>(y);
  if (xs < ys + bytes && ys < xs + bytes) {
    // Overlapping (memmove semantics): through scratch, as cudaMemcpy's
    // overlap behaviour is undefined.
    TESSERA_ASSIGN_OR_RETURN(float *tmp, scratch(1, bytes));
    TESSERA_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
        tmp, x, size_t(bytes), cudaMemcpyDeviceToDevice, computeStream));
    x = tmp;
  }
  return cudaStatus(cudaMemcpyAsync(y, x, size_t(bytes),
                                    cudaMemcpyDeviceToDevice, computeStream),
                    "cudaMemcpyAsync (device to device)");
}

Status CudaBackend::axpy(float alpha, const float *x, float *y, int64_t n) {
  return launched(launchAxpy(computeStream, alpha, x, y, n), "Axpy");
}

Status CudaBackend::cast(const void *x, FloatFormat xFormat, void *y,
                         FloatFormat yFormat, int64_t n, float beta) {
  // A same-format cast without accumulation is an exact copy.
  if (xFormat == yFormat && beta == 0.0f)
    return copy(x, y, n * formatBytes(xFormat));
  return launched(launchCast(computeStream, x, xFormat, y, yFormat, n, beta),
                  "Cast");
}

Status CudaBackend::maskColumns(const float *x, float *y, int64_t rows,
                                int64_t cols, int64_t colOffset, int64_t valid,
                                float fill) {
  const int64_t keep = std::clamp<int64_t>(valid - colOffset, 0, cols);
  return launched(launchMaskColumns(computeStream, x, y, rows, cols, keep, fill),
                  "MaskColumns");
}
Status CudaBackend::fillHalf(FloatFormat half, uint16_t *y, float value,
                             int64_t n) {
  return launched(launchFillHalf(computeStream, half, y, value, n),
                  half == FloatFormat::F16 ? "Fill (f16)" : "Fill (bf16)");
}
Status CudaBackend::scaleHalf(FloatFormat half, const uint16_t *x, uint16_t *y,
                              float alpha, int64_t n) {
  return launched(launchScaleHalf(computeStream, half, x, y, alpha, n),
                  half == FloatFormat::F16 ? "Scale (f16)" : "Scale (bf16)");
}
Status CudaBackend::axpyHalf(FloatFormat half, float alpha, const uint16_t *x,
                             uint16_t *y, int64_t n) {
  return launched(launchAxpyHalf(computeStream, half, alpha, x, y, n),
                  half == FloatFormat::F16 ? "Axpy (f16)" : "Axpy (bf16)");
}

Status CudaBackend::adam(float *p, const float *g, float *m, float *v,
                         int64_t n, const int64_t *iteration,
                         const AdamParams &hp) {
  return launched(launchAdam(computeStream, p, g, m, v, n, iteration, hp.lr,
                             hp.beta1, hp.beta2, hp.eps, hp.weightDecay,
                             deviceError),
                  "Adam");
}
Status CudaBackend::sgd(float *p, const float *g, int64_t n, float lr,
                        float weightDecay) {
  return launched(launchSgd(computeStream, p, g, n, lr, weightDecay), "Sgd");
}
Status CudaBackend::sgdMomentum(float *p, const float *g, float *b, int64_t n,
                                float lr, float weightDecay, float momentum) {
  return launched(launchSgdMomentum(computeStream, p, g, b, n, lr, weightDecay,
                                    momentum),
                  "SgdMomentum");
}

Status CudaBackend::sumSquares(const void *x, FloatFormat format, int64_t n,
                               float *y, bool accumulate) {
  TESSERA_ASSIGN_OR_RETURN(
      float *partial,
      scratch(kSumSquaresScratch, int64_t(kSumSquaresBlocks) * 8));
  return launched(launchSumSquares(computeStream, x, format, n, y, accumulate,
                                   reinterpret_cast<double *>(partial)),
                  "SumSquares");
}

Status CudaBackend::clipGradNorm(const float *sumsq, float *norm, float *coeff,
                                 float maxNorm, float invScale) {
  return launched(launchClipGradNorm(computeStream, sumsq, norm, coeff, maxNorm,
                                     invScale),
                  "ClipGradNorm");
}

Status CudaBackend::scaleBy(const float *x, const float *s, float *y,
                            int64_t n) {
  return launched(launchScaleBy(computeStream, x, s, y, n), "ScaleBy");
}

Status CudaBackend::layerNorm(FloatIn x, const float *gamma,
                              const float *bias, FloatOut y, int64_t rows,
                              int64_t cols, float eps) {
  return launched(launchLayerNorm(computeStream, dev(x), gamma, bias, dev(y),
                                  rows, cols, eps),
                  "LayerNorm");
}

Status CudaBackend::layerNormGrad(FloatIn x, const float *gamma,
                                  const float *dy, float *dx, float *dgamma,
                                  float *dbias, int64_t rows, int64_t cols,
                                  float eps, float beta) {
  return normGrad(x, gamma, dy, nullptr, dx, dgamma, dbias, rows, cols, eps,
                  beta, "LayerNormGrad");
}

Status CudaBackend::normGrad(FloatIn x, const float *gamma,
                             const float *dy, const float *dr, float *dx,
                             float *dgamma, float *dbias, int64_t rows,
                             int64_t cols, float eps, float beta,
                             const char *opcode) {
  if (cols == 0)
    return Status();
  TESSERA_ASSIGN_OR_RETURN(float *stats,
                           scratch(2, std::max<int64_t>(1, 2 * rows) * 4));
  return launched(launchLayerNormGrad(computeStream, dev(x), gamma, dy, dr, dx,
                                      dgamma, dbias, rows, cols, eps, beta,
                                      stats),
                  opcode);
}

Status CudaBackend::addLayerNorm(const float *a, const float *b,
                                 const float *gamma, const float *bias,
                                 float *s, FloatOut y, int64_t rows,
                                 int64_t cols, float eps) {
  return launched(launchAddLayerNorm(computeStream, a, b, gamma, bias, s,
                                     dev(y), rows, cols, eps),
                  "AddLayerNorm");
}

Status CudaBackend::addLayerNormGrad(const float *x, const float *gamma,
                                     const float *dy, const float *dr,
                                     float *dx, float *dgamma, float *dbias,
                                     int64_t rows, int64_t cols, float eps,
                                     float beta) {
  return normGrad(x, gamma, dy, dr, dx, dgamma, dbias, rows, cols, eps, beta,
                  "AddLayerNormGrad");
}

Status CudaBackend::rmsNorm(FloatIn x, const float *gamma, FloatOut y,
                            int64_t rows, int64_t cols, float eps) {
  return launched(launchLayerNorm(computeStream, dev(x), gamma,
                                  /*bias=*/nullptr, dev(y), rows, cols, eps),
                  "RMSNorm");
}

Status CudaBackend::addRmsNorm(const float *a, const float *b,
                               const float *gamma, float *s, FloatOut y,
                               int64_t rows, int64_t cols, float eps) {
  return launched(launchAddLayerNorm(computeStream, a, b, gamma,
                                     /*bias=*/nullptr, s, dev(y), rows, cols,
                                     eps),
                  "AddRMSNorm");
}

Status CudaBackend::rmsNormGrad(FloatIn x, const float *gamma,
                                const float *dy, const float *dr, float *dx,
                                float *dgamma, int64_t rows, int64_t cols,
                                float eps, float beta) {
  return normGrad(x, gamma, dy, dr, dx, dgamma, /*dbias=*/nullptr, rows, cols,
                  eps, beta, dr ? "AddRMSNormGrad" : "RMSNormGrad");
}

Status CudaBackend::embedding(const int32_t *ids, FloatIn table, FloatOut y,
                              int64_t rows, int64_t localVocab, int64_t dim,
                              int64_t vocabOffset, int64_t vocabSize) {
  return launched(launchEmbedding(computeStream, ids, dev(table), dev(y), rows,
                                  localVocab, dim, vocabOffset, vocabSize,
                                  deviceError),
                  "Embedding");
}
Status CudaBackend::embeddingGrad(const int32_t *ids, const float *dy,
                                  float *dtable, int64_t rows,
                                  int64_t localVocab, int64_t dim,
                                  int64_t vocabOffset, float beta) {
  return launched(launchEmbeddingGrad(computeStream, ids, dy, dtable, rows,
                                      localVocab, dim, vocabOffset, beta),
                  "EmbeddingGrad");
}
Status CudaBackend::addPositionEmbedding(FloatIn x, FloatIn pos, FloatOut y,
                                         int64_t seq, int64_t batch,
                                         int64_t dim) {
  return launched(launchAddPositionEmbedding(computeStream, dev(x), dev(pos),
                                             dev(y), seq, batch, dim),
      "AddPositionEmbedding");
}
Status CudaBackend::positionEmbeddingGrad(const float *dy, float *dpos,
                                          int64_t seq, int64_t batch,
                                          int64_t dim, int64_t posRows,
                                          float beta) {
  return launched(launchPositionEmbeddingGrad(computeStream, dy, dpos, seq,
                                              batch, dim, posRows, beta),
                  "PositionEmbeddingGrad");
}
Status CudaBackend::logitsMax(FloatIn z, float *m, int64_t rows,
                              int64_t cols) {
  return launched(launchLogitsMax(computeStream, dev(z), m, rows, cols),
                  "LogitsMax");
}
Status CudaBackend::crossEntropyStats(FloatIn z, const int32_t *t,
                                      const float *m, float *se, float *pl,
                                      int64_t rows, int64_t cols,
                                      int64_t vocabOffset, int64_t numClasses,
                                      int64_t ignoreIndex) {
  return launched(launchCrossEntropyStats(computeStream, dev(z), t, m, se, pl, rows,
                                          cols, vocabOffset, numClasses,
                                          ignoreIndex, deviceError),
                  "CrossEntropyStats");
}
Status CudaBackend::logitsStats(FloatIn z, const int32_t *t, float *m,
                                float *se, float *pl, int64_t rows,
                                int64_t cols, int64_t ignoreIndex) {
  return launched(launchLogitsStats(computeStream, dev(z), t, m, se, pl, rows, cols,
                                    ignoreIndex, deviceError),
                  "LogitsStats");
}
Status CudaBackend::crossEntropyFromStats(const float *se, const float *pl,
                                          const float *m, const int32_t *t,
                                          float *loss, int64_t rows,
                                          int64_t ignoreIndex) {
  return launched(launchCrossEntropyFromStats(computeStream, se, pl, m, t, loss,
                                              rows, ignoreIndex),
                  "CrossEntropyFromStats");
}
Status CudaBackend::crossEntropyStatsGrad(
    FloatIn z, const int32_t *t, const float *m, const float *se,
    const float *dl, FloatOut dz, int64_t rows, int64_t cols,
    int64_t vocabOffset, int64_t numClasses, int64_t ignoreIndex) {
  return launched(launchCrossEntropyStatsGrad(
                      computeStream, dev(z), t, m, se, dl, dev(dz), rows, cols,
                      vocabOffset, numClasses, ignoreIndex, deviceError),
                  "CrossEntropyStatsGrad");
}
Status CudaBackend::tokenMean(const float *loss, const int32_t *t, float *y,
                              int64_t rows, int64_t ignoreIndex,
                              const float *count) {
  return launched(
      launchTokenMean(computeStream, loss, t, y, rows, ignoreIndex, count),
      "TokenMean");
}
Status CudaBackend::tokenCount(const int32_t *t, float *n, int64_t rows,
                               int64_t ignoreIndex) {
  return launched(launchTokenCount(computeStream, t, n, rows, ignoreIndex),
                  "TokenCount");
}
Status CudaBackend::tokenMeanGrad(const float *dy, const int32_t *t, float *dl,
                                  int64_t rows, int64_t ignoreIndex,
                                  const float *count) {
  return launched(
      launchTokenMeanGrad(computeStream, dy, t, dl, rows, ignoreIndex, count),
      "TokenMeanGrad");
}

//===----------------------------------------------------------------------===//
// Ring attention (context parallelism): per pair of a query chunk and a key
// chunk (math::ringChunkPairs) and per group of heads that fits the
// scratch, strided-batched GEMMs (RingAttentionPlans) around the row
// kernels of RingAttentionKernels.cu, the CPU backend's steps. The
// executor passes the K/V blocks around the ring on the NCCL communicator.
//===----------------------------------------------------------------------===//

Status CudaBackend::ringPackKeysValues(const float *qkv, float *kv,
                                       const RingAttentionDims &d) {
  return launched(launchRingPack(computeStream, qkv, kv,
                                 d.seq * d.batch * d.heads, d.headDim),
                  "RingAttention");
}
Status CudaBackend::ringUnpackKeyValueGrads(const float *dkv, float *dqkv,
                                            const RingAttentionDims &d) {
  return launched(launchRingUnpack(computeStream, dkv, dqkv,
                                   d.seq * d.batch * d.heads, d.headDim),
                  "RingAttentionGrad");
}

Status CudaBackend::ringAttentionStep(const float *qkv, const float *kv,
                                      float *o, float *stats, float *lse,
                                      const RingAttentionDims &d,
                                      int64_t source, bool first) {
  TESSERA_RETURN_IF_ERROR(checkRingAttentionDims(d));
  const int64_t S = d.seq, total = d.batch * d.heads, D = d.headDim;
  const int64_t chunk = S / 2;
  float *m = stats, *l = stats + total * S;
  if (first) {
    TESSERA_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
        o, 0, size_t(S * total * D) * 4, computeStream));
    TESSERA_RETURN_IF_ERROR(
        launched(launchRingInit(computeStream, m, l, total * S),
                 "RingAttention"));
  }
  if (chunk > 0) {
    const int64_t group =
        attentionChunk(chunk, total, 1, kAttentionScratchBytes);
    TESSERA_ASSIGN_OR_RETURN(float *probs,
                             scratch(0, group * chunk * chunk * 4));
    const float scale = float(1.0 / std::sqrt(double(D)));
    const math::RingChunkPairs pairs = math::ringChunkPairs(d, source);
    for (int64_t z0 = 0; z0 < total; z0 += group) {
      const int64_t count = std::min(group, total - z0);
      const RingAttentionPlans p =
          ringAttentionPlans(chunk, d.batch, d.heads, D, count);
      for (int i = 0; i < pairs.count; ++i) {
        const math::RingChunkPair &c = pairs.pair[i];
        const float *q = qkv + c.q0 * p.ld + z0 * p.qkvHeadStride;
        const float *k = kv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
        TESSERA_RETURN_IF_ERROR(runRowMajor(p.scores, q, k, probs, scale, 0.0f));
        TESSERA_RETURN_IF_ERROR(launched(
            launchRingForwardRows(computeStream, probs, m + z0 * S, l + z0 * S,
                                  o + z0 * p.outHeadStride, count, chunk, S,
                                  c.q0, p.ldo, D, c.diagonal),
            "RingAttention"));
        TESSERA_RETURN_IF_ERROR(
            runRowMajor(p.context, probs, k + D,
                        o + c.q0 * p.ldo + z0 * p.outHeadStride, 1.0f, 1.0f));
      }
    }
  }
  if (!lse)
    return Status();
  return launched(launchRingNormalize(computeStream, o, m, l, lse, S, total, D,
                                      total * D),
                  "RingAttention");
}

Status CudaBackend::ringAttentionGradStep(const float *qkv, const float *o,
                                          const float *lse, const float *dout,
                                          const float *kv, float *dkv,
                                          float *delta, float *dqkv,
                                          const RingAttentionDims &d,
                                          int64_t source, bool first) {
  TESSERA_RETURN_IF_ERROR(checkRingAttentionDims(d));
  const int64_t S = d.seq, total = d.batch * d.heads, D = d.headDim;
  const int64_t chunk = S / 2;
  if (first) {
    TESSERA_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
        dqkv, 0, size_t(S * total * 3 * D) * 4, computeStream));
    TESSERA_RETURN_IF_ERROR(launched(
        launchRingDelta(computeStream, o, dout, delta, S, total, D, total * D),
        "RingAttentionGrad"));
  }
  if (chunk == 0)
    return Status();
  const int64_t group = attentionChunk(chunk, total, 2, kAttentionScratchBytes);
  TESSERA_ASSIGN_OR_RETURN(float *probs, scratch(0, group * chunk * chunk * 4));
  TESSERA_ASSIGN_OR_RETURN(float *dprobs,
                           scratch(1, group * chunk * chunk * 4));
  const float scale = float(1.0 / std::sqrt(double(D)));
  const math::RingChunkPairs pairs = math::ringChunkPairs(d, source);
  for (int64_t z0 = 0; z0 < total; z0 += group) {
    const int64_t count = std::min(group, total - z0);
    const RingAttentionPlans p =
        ringAttentionPlans(chunk, d.batch, d.heads, D, count);
    for (int i = 0; i < pairs.count; ++i) {
      const math::RingChunkPair &c = pairs.pair[i];
      const float *q = qkv + c.q0 * p.ld + z0 * p.qkvHeadStride;
      const float *k = kv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
      float *dk = dkv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
      const float *dO = dout + c.q0 * p.ldo + z0 * p.outHeadStride;
      // P = exp(scale Q K^T - LSE); dV += P^T dO; dP = dO V^T;
      // dS = P (dP - delta); dQ += scale dS K; dK += scale dS^T Q.
      TESSERA_RETURN_IF_ERROR(runRowMajor(p.scores, q, k, probs, scale, 0.0f));
      TESSERA_RETURN_IF_ERROR(launched(
          launchRingGradProbs(computeStream, probs, lse + z0, count, chunk,
                              c.q0, total, c.diagonal),
          "RingAttentionGrad"));
      TESSERA_RETURN_IF_ERROR(
          runRowMajor(p.gradV, probs, dO, dk + D, 1.0f, 1.0f));
      TESSERA_RETURN_IF_ERROR(
          runRowMajor(p.gradProbs, dO, k + D, dprobs, 1.0f, 0.0f));
      TESSERA_RETURN_IF_ERROR(launched(
          launchRingGradScores(computeStream, probs, dprobs, delta + z0 * S,
                               count, chunk, S, c.q0),
          "RingAttentionGrad"));
      TESSERA_RETURN_IF_ERROR(runRowMajor(
          p.gradQ, dprobs, k, dqkv + c.q0 * p.ld + z0 * p.qkvHeadStride, scale,
          1.0f));
      TESSERA_RETURN_IF_ERROR(runRowMajor(p.gradK, dprobs, q, dk, scale, 1.0f));
    }
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Mixture of experts (MoEKernels.cu). The row map (each routing choice's
// row in expert order) is rebuilt by every kernel that needs it, from the
// indices, as the CPU backend does (counts, sort keys, one radix sort and
// the rows), with no state between instructions.
//===----------------------------------------------------------------------===//

StatusOr<CudaBackend::MoeRowMap>
CudaBackend::moeRowMap(const int32_t *indices, int64_t n, int64_t experts,
                       int32_t *counts, const char *opcode) {
  if (n > INT_MAX || experts > INT_MAX)
    return unimplemented(opcode, ": ", n, " routing choices over ", experts,
                         " experts exceed the 32-bit row map");
  if (!counts) {
    TESSERA_ASSIGN_OR_RETURN(
        float *c, scratch(kMoeCountsScratch, std::max<int64_t>(1, experts) * 4));
    counts = reinterpret_cast<int32_t *>(c);
  }
  TESSERA_ASSIGN_OR_RETURN(float *rows,
                           scratch(kMoeRowsScratch, std::max<int64_t>(1, n) * 4));
  int32_t *rowOf = reinterpret_cast<int32_t *>(rows);
  TESSERA_ASSIGN_OR_RETURN(void *sort, moeSortScratch(n, experts, opcode));
  TESSERA_RETURN_IF_ERROR(launched(launchMoeRows(computeStream, indices, n,
                                                 experts, counts, rowOf, sort,
                                                 deviceError),
                                   opcode));
  return MoeRowMap{rowOf, counts};
}

StatusOr<void *> CudaBackend::moeSortScratch(int64_t n, int64_t experts,
                                             const char *opcode) {
  cudaError_t status = cudaSuccess;
  const size_t bytes = moeChoiceSortBytes(n, experts, status);
  if (status != cudaSuccess)
    return cudaStatus(status, opcode);
  TESSERA_ASSIGN_OR_RETURN(float *p,
                           scratch(kMoeSortScratch,
                                   std::max<int64_t>(1, int64_t(bytes))));
  return static_cast<void *>(p);
}

Status CudaBackend::moeRouter(const float *logits, float *probs,
                              int32_t *indices, int64_t tokens,
                              int64_t experts, int64_t k) {
  if (k < 1 || k > experts)
    return invalidArgument("router topk ", k, " is not in [1, ", experts, "]");
  return launched(launchMoeRouter(computeStream, logits, probs, indices,
                                  tokens, experts, k),
                  "MoERouter");
}
Status CudaBackend::moeRouterGrad(const float *probs, const int32_t *indices,
                                  const float *dprobs, float *dlogits,
                                  int64_t tokens, int64_t experts, int64_t k) {
  return launched(launchMoeRouterGrad(computeStream, probs, indices, dprobs,
                                      dlogits, tokens, experts, k,
                                      deviceError),
                  "MoERouterGrad");
}

Status CudaBackend::moeAuxCounts(const int32_t *indices, int64_t tokens,
                                 int64_t experts, int64_t k,
                                 const int32_t **counts, const char *opcode) {
  TESSERA_ASSIGN_OR_RETURN(
      float *c, scratch(kMoeCountsScratch, std::max<int64_t>(1, experts) * 4));
  int32_t *ic = reinterpret_cast<int32_t *>(c);
  *counts = ic;
  // The counts are checked (and, without all ranks' counts, used) as on
  // the CPU.
  return launched(launchMoeAuxCounts(computeStream, indices, tokens * k,
                                     experts, ic, deviceError),
                  opcode);
}

Status CudaBackend::moeAuxLoss(const float *logits, const int32_t *indices,
                               const float *allCounts, float *y,
                               int64_t tokens, int64_t experts, int64_t k,
                               float coeff) {
  const int32_t *counts = nullptr;
  TESSERA_RETURN_IF_ERROR(moeAuxCounts(indices, tokens, experts, k,
                                       &counts, "MoEAuxLoss"));
  TESSERA_ASSIGN_OR_RETURN(
      float *partial, scratch(kMoeRowsScratch, std::max<int64_t>(1, tokens) * 8));
  return launched(launchMoeAuxLoss(computeStream, logits, allCounts, counts,
                                   reinterpret_cast<double *>(partial), y,
                                   tokens, experts, k, coeff),
                  "MoEAuxLoss");
}
Status CudaBackend::moeAuxLossGrad(const float *logits, const int32_t *indices,
                                   const float *allCounts, const float *dy,
                                   float *dlogits, int64_t tokens,
                                   int64_t experts, int64_t k, float coeff) {
  const int32_t *counts = nullptr;
  TESSERA_RETURN_IF_ERROR(moeAuxCounts(indices, tokens, experts, k,
                                       &counts, "MoEAuxLossGrad"));
  return launched(launchMoeAuxLossGrad(computeStream, logits, allCounts,
                                       counts, dy, dlogits, tokens, experts, k,
                                       coeff),
                  "MoEAuxLossGrad");
}
Status CudaBackend::moeTokenCounts(const int32_t *indices, float *counts,
                                   int64_t choices, int64_t experts) {
  return launched(launchMoeTokenCounts(computeStream, indices, counts, choices,
                                       experts, deviceError),
                  "MoETokenCounts");
}
Status CudaBackend::moeDispatch(const float *x, const int32_t *indices,
                                float *rows, int32_t *counts, int64_t tokens,
                                int64_t k, int64_t experts, int64_t features) {
  TESSERA_ASSIGN_OR_RETURN(MoeRowMap map,
                           moeRowMap(indices, tokens * k, experts, counts,
                                     "MoEDispatch"));
  return launched(launchMoeDispatch(computeStream, x, map.rowOf, map.counts, rows,
                                    tokens, k, experts, features),
                  "MoEDispatch");
}
Status CudaBackend::moeDispatchGrad(const float *drows, const int32_t *indices,
                                    float *dx, int64_t tokens, int64_t k,
                                    int64_t experts, int64_t features) {
  TESSERA_ASSIGN_OR_RETURN(MoeRowMap map,
                           moeRowMap(indices, tokens * k, experts, nullptr,
                                     "MoEDispatchGrad"));
  return launched(launchMoeDispatchGrad(computeStream, drows, map.rowOf, dx,
                                        tokens, k, features),
                  "MoEDispatchGrad");
}

/// The offsets of the experts' groups from their row counts copied to the
/// host. The grouped GEMMs' shapes are these counts, so this is the one
/// place an MoE layer waits for the device (Megatron's GroupedMLP likewise
/// copies tokens_per_expert to the host).
StatusOr<std::vector<int64_t>>
CudaBackend::groupOffsets(const int32_t *counts, int64_t experts,
                          int64_t rows) {
  std::vector<int32_t> host(static_cast<size_t>(experts));
  TESSERA_RETURN_IF_ERROR(copyToHost(host.data(), counts, experts * 4));
  return expertGroupOffsets(host.data(), experts, rows);
}

/// Element `i` of a GEMM input array in `format`.
static const void *inputAt(const void *base, FloatFormat format, int64_t i) {
  return static_cast<const char *>(base) +
         i * formatBytes(format);
}

Status CudaBackend::groupedLinear(FloatFormat inputs, const void *x,
                                  const int32_t *counts, const void *w,
                                  float *y, int64_t rows, int64_t in,
                                  int64_t out, int64_t experts) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> off,
                           groupOffsets(counts, experts, rows));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
    if (n > 0)
      TESSERA_RETURN_IF_ERROR(denseGemm(
          false, true, n, out, in, 1.0f, inputAt(x, inputs, r0 * in),
          inputAt(w, inputs, e * out * in), 0.0f, y + r0 * out, inputs));
  }
  const int64_t tail = (rows - off.back()) * out;
  return tail > 0 ? cudaStatus(cudaMemsetAsync(y + off.back() * out, 0,
                                               size_t(tail) * 4, computeStream),
                               "cudaMemsetAsync")
                  : Status();
}
Status CudaBackend::groupedLinearGrad(FloatFormat inputs, const void *x,
                                      const int32_t *counts, const void *w,
                                      const void *dy, float *dx, float *dw,
                                      int64_t rows, int64_t in, int64_t out,
                                      int64_t experts, float beta) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> off,
                           groupOffsets(counts, experts, rows));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
    float *dwe = dw + e * out * in;
    const void *dye = inputAt(dy, inputs, r0 * out);
    // An expert without rows: dW = beta dW (zeros for beta 0), as on the
    // CPU; a GEMM with k = 0 does exactly that.
    TESSERA_RETURN_IF_ERROR(denseGemm(true, false, out, in, n, 1.0f, dye,
                                      inputAt(x, inputs, r0 * in), beta, dwe,
                                      inputs));
    if (n > 0)
      TESSERA_RETURN_IF_ERROR(denseGemm(false, false, n, in, out, 1.0f, dye,
                                        inputAt(w, inputs, e * out * in), 0.0f,
                                        dx + r0 * in, inputs));
  }
  const int64_t tail = (rows - off.back()) * in;
  return tail > 0 ? cudaStatus(cudaMemsetAsync(dx + off.back() * in, 0,
                                               size_t(tail) * 4, computeStream),
                               "cudaMemsetAsync")
                  : Status();
}
Status CudaBackend::moeCapacityDrop(const float *probs, const int32_t *indices,
                                    float *keptProbs, int32_t *keptIndices,
                                    int64_t tokens, int64_t k, int64_t experts,
                                    int64_t capacity, bool byPosition) {
  const int64_t n = tokens * k;
  if (n > INT_MAX || experts > INT_MAX)
    return unimplemented("MoECapacityDrop: ", n, " routing choices over ",
                         experts, " experts exceed the 32-bit sort");
  TESSERA_ASSIGN_OR_RETURN(void *sort,
                           moeSortScratch(n, experts, "MoECapacityDrop"));
  return launched(launchMoeCapacityDrop(computeStream, probs, indices,
                                        keptProbs, keptIndices, n, experts,
                                        capacity, byPosition, sort,
                                        deviceError),
                  "MoECapacityDrop");
}
Status CudaBackend::moeCapacityDropGrad(const float *dkept,
                                        const int32_t *keptIndices,
                                        float *dprobs, int64_t n) {
  return launched(
      launchMoeCapacityDropGrad(computeStream, dkept, keptIndices, dprobs, n),
      "MoECapacityDropGrad");
}
Status CudaBackend::moeCombine(const float *rows, const float *probs,
                               const int32_t *indices, float *y,
                               int64_t tokens, int64_t k, int64_t experts,
                               int64_t features) {
  TESSERA_ASSIGN_OR_RETURN(MoeRowMap map,
                           moeRowMap(indices, tokens * k, experts, nullptr,
                                     "MoECombine"));
  return launched(launchMoeCombine(computeStream, rows, probs, map.rowOf, y,
                                   tokens, k, features),
                  "MoECombine");
}
Status CudaBackend::moeCombineGrad(const float *rows, const float *probs,
                                   const int32_t *indices, const float *dy,
                                   float *drows, float *dprobs, int64_t tokens,
                                   int64_t k, int64_t experts,
                                   int64_t features) {
  TESSERA_ASSIGN_OR_RETURN(MoeRowMap map,
                           moeRowMap(indices, tokens * k, experts, nullptr,
                                     "MoECombineGrad"));
  return launched(launchMoeCombineGrad(computeStream, rows, probs, map.rowOf,
                                       map.counts, dy, drows, dprobs, tokens, k,
                                       experts, features),
                  "MoECombineGrad");
}

Status CudaBackend::rotaryEmbedding(FloatIn x, FloatOut y, int64_t seq,
                                    int64_t batch, int64_t features,
                                    int64_t heads, int64_t rotDim, float base,
                                    float scalingFactor, int64_t posBegin,
                                    bool inverse) {
  return launched(launchRotaryEmbedding(computeStream, dev(x), dev(y), seq,
                                        batch,
                                        features, heads, rotDim, base,
                                        scalingFactor, posBegin, inverse),
                  "RotaryEmbedding");
}

Status CudaBackend::dropout(FloatIn x, FloatOut y, int64_t seq,
                            int64_t batch, int64_t hidden, int64_t seqOffset,
                            int64_t seqTotal, int64_t firstSample,
                            uint64_t seed, int64_t stream, float rate) {
  if (rate < 0.0f || rate >= 1.0f)
    return invalidArgument("dropout rate must be in [0, 1), got ", rate);
  // The stream's Philox key is the CPU's: the FNV hash of its name.
  const uint64_t hash = fnv1a64("dropout." + std::to_string(stream));
  return launched(launchDropout(computeStream, dev(x), dev(y), seq, batch,
                                hidden,
                                seqOffset, seqTotal, firstSample, seed, hash,
                                rate),
                  "Dropout");
}

} // namespace tessera::rt::cuda

//===----------------------------------------------------------------------===//
// Plugin entry point (BackendRegistry::create loads this library for
// "cuda").
//===----------------------------------------------------------------------===//

extern "C" __attribute__((visibility("default"))) void
tesseraRegisterBackends(tessera::rt::BackendRegistry *registry) {
  // The probe (tessera-run's check before it starts the ranks) asks only
  // for a device: no context, cuBLASLt handle or workspace.
  registry->registerBackend("cuda", tessera::rt::cuda::createCudaBackend, [] {
    return tessera::rt::cuda::selectDevice(-1).status();
  });
}
