//===- LowerToRT.h - The stages of tessera-lower-to-rt ----------*- C++ -*-===//
//
// tessera-lower-to-rt turns a program's tensor-level phase functions into rt
// entry functions over one per-rank arena, in four stages, each in its own
// file of this directory:
//   1. PersistentBuffers.cpp: the persistent buffers (params, grads, main
//      params, optimizer state, inputs, loss, iteration, saved activations,
//      grad-buffer bucket views and shards) and their layout: the grad
//      buffers first, then the other shared buffers, then the microbatch
//      slot regions of pipeline chunks;
//   2. StoragePlan.cpp: a storage decision per tensor value in a forward
//      walk of each phase (in place into a bound buffer, sharing an
//      operand's storage, or a transient);
//   3. the transients' static memory plan (the plain C++ planner of
//      tessera/Memory/MemoryPlan.h, called from StoragePlan.cpp);
//   4. EmitRT.cpp: conversion patterns nn/dist -> rt over the storage plan,
//      applied with a ConversionTarget that leaves no nn or dist op.
// LowerToRT.cpp is the pass: it runs the stages per program.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_LIB_CONVERSION_LOWERTORT_LOWERTORT_H
#define TESSERA_LIB_CONVERSION_LOWERTORT_LOWERTORT_H

#include "tessera/Conversion/Passes.h"
#include "tessera/Memory/MemoryPlan.h"
#include "tessera/Support/Model.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::lowering {

/// Arena alignment of every buffer, persistent or transient (bytes).
constexpr int64_t kAlignment = 64;

int64_t alignUp(int64_t bytes);
/// The pipeline chunk of a phase function (`dist.chunk`), or -1.
int64_t chunkOf(mlir::func::FuncOp phase);
mlir::MemRefType toMemRef(mlir::Type tensorType);
/// Bytes of a statically shaped tensor or memref type.
int64_t byteSize(mlir::Type shapedType);

//===----------------------------------------------------------------------===//
// Stage 1: persistent buffers
//===----------------------------------------------------------------------===//

/// A persistent buffer and its manifest attributes (an rt.buffer).
struct Persistent {
  std::string name;
  rt::BufferKind kind;
  mlir::MemRefType type;
  int64_t offset = 0;
  llvm::SmallVector<mlir::NamedAttribute> attrs;
};

using memory::SlotRegion;

/// The persistent part of a program's arena.
class PersistentBuffers {
public:
  /// The buffer `name`, created with `kind`, the memref of `tensorType` and
  /// `attrs` unless it exists.
  Persistent *add(llvm::StringRef name, rt::BufferKind kind,
                  mlir::Type tensorType,
                  llvm::SmallVector<mlir::NamedAttribute> attrs = {});
  Persistent *lookup(llvm::StringRef name) const { return byName.lookup(name); }

  /// Collects the buffers the phases bind (and the distributed optimizer's
  /// shard views). `phases` are the microbatch or forward/backward phases.
  mlir::LogicalResult collect(mlir::ModuleOp module,
                              llvm::ArrayRef<mlir::func::FuncOp> phases,
                              mlir::func::FuncOp step, bool pipeline);

  /// Lays the buffers out (grad buffers, shared buffers, slot regions) from
  /// the schedule's slot counts; sets `bytes`. Non-pooled slot layouts
  /// rewrite the schedule's dist.run slots.
  mlir::LogicalResult layout(mlir::ModuleOp module,
                             const std::map<int64_t, int64_t> &numSlots,
                             const std::map<int64_t, int64_t> &chunkSlots,
                             llvm::ArrayRef<mlir::Operation *> scheduleRuns);

  std::vector<std::unique_ptr<Persistent>> buffers;
  llvm::StringMap<Persistent *> byName;
  /// Buffers in a chunk's slot region, by chunk.
  std::map<Persistent *, int64_t> slotChunk;
  /// Each chunk's slot region (after layout).
  std::map<int64_t, SlotRegion> regions;
  /// The persistent part's size (after layout).
  int64_t bytes = 0;
  /// ZeRO-3: the size of the staging space, where the parameters of
  /// `shard_params` buffers and their bucket views are laid out (`staged`;
  /// the runtime's host copy for initialisation and checkpoints: their
  /// device copy is only this rank's shard of each bucket).
  int64_t stagingBytes = 0;
};

//===----------------------------------------------------------------------===//
// Stages 2 and 3: storage decisions and the memory plan of one phase
//===----------------------------------------------------------------------===//

/// Where a tensor value lives: a persistent buffer or a transient.
struct Storage {
  std::string persistent; // empty for transients
  mlir::Type type;
  llvm::SmallVector<mlir::Value> values; // values that share this storage
  int64_t start = INT64_MAX, end = -1;
  int64_t offset = -1;
  /// Scratch for a multi-kernel expansion: live only during one op.
  bool scratch = false;
  /// A part of another transient storage (ZeRO-2: a gradient written
  /// straight into its transient bucket), `parentOffset` bytes into it.
  int parent = -1;
  int64_t parentOffset = 0;
};

/// The buffer a phase argument or result is bound to ("" if none).
std::string bindingOf(mlir::DictionaryAttr attrs, int64_t chunk);
/// The persistent buffer holding flat bucket `bucket` of grad buffer
/// `buffer` ("gbuf:B:k" for the gradients, "pbuf:B:k" for the parameters).
std::string bucketView(dist::BucketData data, llvm::StringRef buffer,
                       int64_t bucket);
/// The distributed optimizer's shard of a bucket view ("gshard:B:k",
/// "pshard:B:k"), or "" if `view` is not one.
std::string shardView(llvm::StringRef view);
/// The buffers of a bucket's parameters ("grad:<p>" for the gradients).
llvm::SmallVector<std::string> bucketParts(mlir::Operation *op,
                                           mlir::FlatSymbolRefAttr buffer,
                                           int64_t bucket,
                                           dist::BucketData data);
/// The element type of a grad buffer's gradients or parameters.
mlir::Type bucketElementType(dist::GradBufferOp buffer, dist::BucketData data);
/// Whether `unpack` hands out the parameters of a ZeRO-3 bucket (of a
/// `shard_params` grad buffer).
bool shardsParams(dist::UnpackOp unpack);
/// The program-wide id of bucket `bucket` of grad buffer `buffer` (its
/// position among all buckets of the program's grad buffers, in order): the
/// sync id of its overlapped parameter all-gather (rt.param_sync_start and
/// rt.param_sync_wait, in different functions).
int64_t paramSyncId(mlir::Operation *from, llvm::StringRef buffer,
                    int64_t bucket);

/// The storage plan of one phase function: what stage 2 decides and
/// stage 4 reads.
class PhasePlan {
public:
  /// Creates a persistent buffer (a p2p staging buffer, kind activation).
  using MakeBuffer = std::function<void(llvm::StringRef name, mlir::Type type)>;

  PhasePlan(mlir::func::FuncOp func, bool isStep, PersistentBuffers &buffers,
            MakeBuffer makeBuffer, bool foldCasts);

  /// Stage 2: a storage per value.
  mlir::LogicalResult plan();
  /// Stage 3: transient offsets from `base` (memory::planTransients);
  /// returns the transient bytes this phase needs.
  int64_t planMemory(int64_t base);

  /// The persistent buffer that `v` is returned into ("" if none).
  llvm::StringRef resultBinding(mlir::Value v) const;
  /// A bound result that accumulates (a gradient outside the step) and is
  /// written in place: its kernel runs with beta = 1.
  bool accumulates(mlir::Value result) const;
  /// The storage id of `v`.
  int storageId(mlir::Value v) const { return storageOf.lookup(v); }
  /// The bytes `op` reads and writes as stored: CostOpInterface's count
  /// of its operands and results, each at its storage's element type (a
  /// value the fold keeps in bf16 is 2 bytes an element whatever its nn
  /// type); a folded cast moves nothing.
  int64_t storedBytes(mlir::Operation *op) const;

  mlir::func::FuncOp func;
  bool isStep;
  /// Under the V-shaped schedules (zbv, dualpipev) sends stay in flight
  /// while later phases run (section 4 of ARCHITECTURE.md).
  bool sendsInFlight = false;
  PersistentBuffers &buffers;
  llvm::SmallVector<mlir::Operation *> ops;
  llvm::DenseMap<mlir::Operation *, int64_t> position;
  llvm::DenseMap<mlir::Value, int> storageOf;
  llvm::SmallVector<Storage> storages;
  /// Results written directly into their bound buffer (with beta = 1 when
  /// accumulating).
  llvm::DenseSet<mlir::Value> direct;
  /// Ops whose operand 0 must be copied first (in-place op on a live value).
  llvm::DenseSet<mlir::Operation *> copyFirst;
  /// Scratch storages of ops that lower to several kernels.
  llvm::DenseMap<mlir::Operation *, llvm::SmallVector<int>> scratchOf;
  /// Sends whose operand is first copied into a send buffer (storage id).
  llvm::DenseMap<mlir::Operation *, int> sendCopy;
  /// Copies into place before a pack (operand index, storage id) or an
  /// unpack (-1, storage id of the bucket view).
  llvm::DenseMap<mlir::Operation *, llvm::SmallVector<std::pair<int, int>>>
      placeCopies;
  /// The bucket view of a bucket_reduce_start (storage id), and for a
  /// reduce-scatter its shard buffer.
  llvm::DenseMap<mlir::Operation *, int> bucketStorage, shardStorage;
  /// An accumulating bucket_reduce_start (ZeRO-2): the persistent shard its
  /// wait adds the transient shard into.
  llvm::DenseMap<mlir::Operation *, int> accumulateStorage;
  /// ZeRO-2: the gradients written straight into their transient bucket
  /// (the bucket's storage id and the byte offset in it).
  llvm::DenseMap<mlir::Value, std::pair<int, int64_t>> bucketPart;
  /// scatter_to_region ops whose result is the rank's shard view of their
  /// input bucket: nothing to copy.
  llvm::DenseSet<mlir::Operation *> aliasedScatter;
  /// Casts folded into the kernel beside them, which loads or stores the
  /// 16-bit value itself (foldCasts): they lower to nothing, their input
  /// and result sharing one storage of the 16-bit type.
  llvm::DenseSet<mlir::Operation *> foldedCasts;

private:
  /// The storages of each persistent buffer, in creation order (so that
  /// finding a buffer's other values is not a scan of every storage).
  llvm::StringMap<llvm::SmallVector<int, 1>> storagesOfBuffer;

  /// Finds the casts to fold (foldedCasts).
  void foldCasts();
  /// The folded narrowing cast that is `v`'s only reader (whose storage
  /// the kernel writes), or null.
  mlir::Operation *narrowingFoldOf(mlir::Value v) const;
  bool foldCastsEnabled = true;

  int newStorage(mlir::Type type, llvm::StringRef persistentName = "");
  /// A scratch storage of `op` (scratchOf), live during the op only.
  void addScratch(mlir::Operation *op, mlir::Type type);
  void assign(mlir::Value v, int id);
  /// True if no op after `op` reads the storage of `v`.
  bool clobberable(mlir::Value v, mlir::Operation *op);
  /// A use after `op` of a value stored in one of the persistent buffers
  /// `names` before it (null if none): what writing them at `op` clobbers.
  mlir::OpOperand *readAfter(llvm::ArrayRef<std::string> names,
                             mlir::Operation *op);
  /// A p2p staging buffer of this phase.
  int newP2PStorage(mlir::Type type, llvm::StringRef what);
  /// A storage on this rank's shard `name` of a bucket for a value of type
  /// `t`, or -1 if there is no such shard or it does not fit.
  int shardStorageFor(llvm::StringRef name, mlir::Type t);
  /// ZeRO-3: the storage of the gathered bucket `unpack` hands out (a
  /// transient), or -1 if it unpacks no gathered ZeRO-3 bucket.
  int gatheredBucket(dist::UnpackOp unpack);
  /// Decides where `op`'s results live.
  mlir::LogicalResult planOp(mlir::Operation *op);

  MakeBuffer makeBuffer;
  int64_t chunk = -1;
  int numP2P = 0;
  /// resultBinding of every op result and argument, computed once before
  /// emission rewrites the uses.
  llvm::DenseMap<mlir::Value, std::string> bindings;
};

//===----------------------------------------------------------------------===//
// Stage 4: emission
//===----------------------------------------------------------------------===//

/// Lowers `plan.func`'s body to rt ops in place (conversion patterns over
/// the plan) and moves it into `entry`, an rt entry function without
/// arguments.
mlir::LogicalResult emitPhase(PhasePlan &plan, mlir::func::FuncOp entry);

/// Moves a phase's leading receives into `recv:<name>` and its trailing
/// sends into `send:<name>`, so a schedule can run them on their own
/// (`dist.run ... part`).
mlir::LogicalResult splitP2PParts(mlir::func::FuncOp entry);

} // namespace tessera::lowering

#endif // TESSERA_LIB_CONVERSION_LOWERTORT_LOWERTORT_H
