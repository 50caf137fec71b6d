//===- Collectives.cpp - Collective, event and point-to-point opcodes -----===//
//
// Decode and run functions (Ops.h) of the collectives over a rank group
// (all-reduce, all-gather and reduce-scatter, in place for the distributed
// optimizer's buckets, synchronous or started and completed by a Wait), the
// equal-split all-to-all, and the pipeline's Send/Recv, which join the
// executor's open point-to-point batch.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <cctype>

namespace tessera::rt::ops {

Status requireMember(Decoder &d, const std::string &kind,
                     const GroupPosition &pos) {
  if (!pos.group && d.rank() >= 0 && hasGroupKind(d.root(), kind))
    return invalidArgument("rank ", d.rank(), " is in no rank group of kind '",
                           kind, "', but its program has a collective over it");
  return Status();
}

//===----------------------------------------------------------------------===//
// All-reduce, all-gather, reduce-scatter
//===----------------------------------------------------------------------===//

/// AllReduce(Start) [X], AllGather [X, Y], ReduceScatter(Start) [X, Y];
/// n elements (of the shard for gather and scatter), i[0] = 1 in place.
static Status decodeCollective(Decoder &d, const fb::Instr &in, Thunk &t) {
  using O = fb::Opcode;
  std::string kind = in.group() ? in.group()->str() : "";
  TESSERA_ASSIGN_OR_RETURN(t.type, Decoder::elementType(d.ref(in, 0).dtype()));
  // bf16 and f16 buffers (gradients under --bf16) are summed in f32
  // pairwise and rounded (MpiCommunicator's 16-bit sums); there is no
  // 16-bit max.
  if ((t.type == ElementType::BF16 || t.type == ElementType::F16) &&
      in.op() != O::AllGather && in.op() != O::ParamSyncStart &&
      in.op() != O::AllGatherStart && t.reduce != ReduceKind::Sum)
    return invalidArgument(fb::EnumNameOpcode(in.op()), " with reduce Max on ",
                           d.desc(in, 0),
                           " is not supported (16-bit reductions are sums)");
  GroupPosition pos = d.position(kind);
  TESSERA_RETURN_IF_ERROR(requireMember(d, kind, pos));
  if (in.op() == O::AllGather || in.op() == O::ParamSyncStart ||
      in.op() == O::AllGatherStart || in.op() == O::ReduceScatter ||
      in.op() == O::ReduceScatterStart) {
    bool gather = in.op() == O::AllGather || in.op() == O::ParamSyncStart ||
                  in.op() == O::AllGatherStart;
    int64_t small = d.numel(in, gather ? 0 : 1);
    int64_t big = d.numel(in, gather ? 1 : 0);
    if (big != small * pos.size)
      return invalidArgument(gather ? "output " : "input ",
                             d.desc(in, gather ? 1 : 0), " must hold ",
                             pos.size, " (size of group '", kind, "') times ",
                             d.desc(in, gather ? 0 : 1));
    t.n = small;
    // In place (the distributed optimizer's buckets): the shard is exactly
    // this rank's block of the full buffer, which MPI_IN_PLACE (and NCCL)
    // handle. Any other overlap would have the collective overwrite what it
    // still has to read.
    const int shardIdx = gather ? 0 : 1, fullIdx = gather ? 1 : 0;
    const int64_t es = dtypeSize(d.ref(in, 0).dtype());
    const int64_t shardAt = d.finalOffset(shardIdx);
    const int64_t fullAt = d.finalOffset(fullIdx);
    const int64_t shardBytes = small * es, fullBytes = big * es;
    const int64_t blockAt = fullAt + int64_t(pos.index) * shardBytes;
    if (shardBytes > 0 && shardAt < fullAt + fullBytes &&
        fullAt < shardAt + shardBytes) {
      if (shardAt != blockAt)
        return invalidArgument(
            gather ? "input " : "output ", d.desc(in, shardIdx),
            " (arena bytes ", shardAt, " to ", shardAt + shardBytes,
            ") overlaps ", gather ? "output " : "input ", d.desc(in, fullIdx),
            " (bytes ", fullAt, " to ", fullAt + fullBytes,
            ") but is not this rank's block of it (", kind, " index ",
            pos.index, ": bytes ", blockAt, " to ", blockAt + shardBytes,
            "); an in-place collective needs exactly that block");
      t.i[0] = 1;
    }
  }
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator(kind));
  return Status();
}

Status decodeAllReduce(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runAllReduce(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  return t.comm->allReduce(t.ptr[0], t.n, t.type, t.reduce);
}

Status decodeAllGather(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runAllGather(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  if (t.i[0])
    return t.comm->allGatherInPlace(t.ptr[1], t.n, t.type);
  return t.comm->allGather(t.ptr[0], t.ptr[1], t.n, t.type);
}

Status decodeReduceScatter(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runReduceScatter(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  if (t.i[0])
    return t.comm->reduceScatterInPlace(t.ptr[0], t.n, t.type, t.reduce);
  return t.comm->reduceScatter(t.ptr[0], t.ptr[1], t.n, t.type, t.reduce);
}

//===----------------------------------------------------------------------===//
// Started collectives and their Wait
//===----------------------------------------------------------------------===//

Status decodeAllReduceStart(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runAllReduceStart(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.checkEventFree(t.event));
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest req, t.comm->allReduceStart(t.ptr[0], t.n, t.type, t.reduce));
  x.recordEvent(t.event, t.comm, req);
  return Status();
}

Status decodeReduceScatterStart(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runReduceScatterStart(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.checkEventFree(t.event));
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  // In place, the communicator moves the result into this rank's block when
  // the Wait completes it.
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest req,
      t.i[0]
          ? t.comm->reduceScatterInPlaceStart(t.ptr[0], t.n, t.type, t.reduce)
          : t.comm->reduceScatterStart(t.ptr[0], t.ptr[1], t.n, t.type,
                                       t.reduce));
  x.recordEvent(t.event, t.comm, req);
  return Status();
}

Status decodeAllGatherStart(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCollective(d, in, t);
}

Status runAllGatherStart(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.checkEventFree(t.event));
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  if (x.gatherAtStart()) {
    TESSERA_RETURN_IF_ERROR(t.i[0] ? t.comm->allGatherInPlace(t.ptr[1], t.n, t.type)
                                   : t.comm->allGather(t.ptr[0], t.ptr[1], t.n,
                                                       t.type));
    x.recordEvent(t.event, nullptr, CommRequest{});
    return Status();
  }
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest req,
      t.i[0] ? t.comm->allGatherInPlaceStart(t.ptr[1], t.n, t.type)
             : t.comm->allGatherStart(t.ptr[0], t.ptr[1], t.n, t.type));
  x.recordEvent(t.event, t.comm, req);
  return Status();
}

Status decodeWait(Decoder &d, const fb::Instr &in, Thunk &t) {
  return Status();
}

Status runWait(RunContext &x, const Thunk &t) {
  TESSERA_ASSIGN_OR_RETURN(auto started, x.takeEvent(t.event));
  // (A gather completed at its start, TESSERA_DEBUG_GATHER_AT_START.)
  if (!started.first)
    return Status();
  return started.first->wait(started.second);
}

//===----------------------------------------------------------------------===//
// Parameter syncs (overlap_param_gather): started in the step, finished in a
// later function
//===----------------------------------------------------------------------===//

Status decodeParamSyncStart(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(decodeCollective(d, in, t));
  // Its input outlives the function only as part of its output: an input
  // elsewhere (a transient the next function reuses) could be overwritten
  // while the gather still reads it.
  if (!t.i[0] && d.numel(in, 0) > 0)
    return invalidArgument(
        "ParamSyncStart must gather in place: its input ", d.desc(in, 0),
        " is not this rank's block of its output ", d.desc(in, 1));
  return Status();
}

StatusOr<CommRequest> startParamSyncGather(const Thunk &t) {
  return t.comm->allGatherInPlaceStart(t.ptr[1], t.n, t.type);
}

Status runParamSyncStart(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  return x.startParamSync(t);
}

Status decodeParamSyncWait(Decoder &d, const fb::Instr &in, Thunk &t) {
  return Status();
}

Status runParamSyncWait(RunContext &x, const Thunk &t) {
  return x.finishParamSync(t.event);
}

//===----------------------------------------------------------------------===//
// All-to-all
//===----------------------------------------------------------------------===//

// [X, Y]: n elements per rank's block.
Status decodeAllToAll(Decoder &d, const fb::Instr &in, Thunk &t) {
  std::string kind = in.group() ? in.group()->str() : "";
  TESSERA_ASSIGN_OR_RETURN(t.type, Decoder::elementType(d.ref(in, 0).dtype()));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1}));
  GroupPosition pos = d.position(kind);
  TESSERA_RETURN_IF_ERROR(requireMember(d, kind, pos));
  if (pos.size < 1 || d.numel(in, 0) % pos.size != 0)
    return invalidArgument(d.desc(in, 0),
                           " does not split into one block "
                           "per rank of group '",
                           kind, "' (", pos.size, " ranks)");
  const int64_t es = dtypeSize(d.ref(in, 0).dtype());
  const int64_t x = d.finalOffset(0), y = d.finalOffset(1),
                bytes = d.numel(in, 0) * es;
  if (bytes > 0 && x < y + bytes && y < x + bytes)
    return invalidArgument("all-to-all input ", d.desc(in, 0),
                           " and output overlap in the arena");
  t.n = d.numel(in, 0) / pos.size;
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator(kind));
  return Status();
}

Status runAllToAll(RunContext &x, const Thunk &t) {
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  return t.comm->allToAll(t.ptr[0], t.ptr[1], t.n, t.type);
}

//===----------------------------------------------------------------------===//
// Pipeline Send/Recv
//===----------------------------------------------------------------------===//

/// Send [X] and Recv [Y]; iattrs [peer, tag]: i = [the peer's pp index,
/// tag, this rank's pp index], with the watchdog's and the trace's labels.
static Status decodeP2p(Decoder &d, const fb::Instr &in, Thunk &t, bool send) {
  TESSERA_ASSIGN_OR_RETURN(t.type, Decoder::elementType(d.ref(in, 0).dtype()));
  int64_t peer = d.iattr(in, 0), tag = d.iattr(in, 1);
  GroupPosition pos = d.position("pp");
  if ((!pos.group && d.rank() >= 0) || pos.size < 2)
    return invalidArgument(
        "pipeline point-to-point needs a 'pp' rank group of more than one "
        "rank",
        d.rank() >= 0 ? " holding rank " + std::to_string(d.rank()) : "",
        pos.group || d.rank() < 0 ? " (it has " + std::to_string(pos.size) + ")"
                                  : "");
  // (peer 0: the rank itself, a V's turn.)
  int64_t other = (pos.index + peer + pos.size) % pos.size;
  t.i[0] = other;
  t.i[1] = tag;
  t.i[2] = pos.index;
  std::string dtype = fb::EnumNameDType(d.ref(in, 0).dtype());
  for (char &c : dtype)
    c = char(std::tolower(static_cast<unsigned char>(c)));
  t.p2pDetail = std::string(send ? "send to" : "recv from") + " pp rank " +
                std::to_string(other) + " tag " + std::to_string(tag) + ", " +
                shapeToString(d.ref(in, 0).shape()) + " " + dtype;
  if (in.loc() && in.loc()->size())
    t.p2pDetail += " at " + in.loc()->str();
  t.p2pLabel = std::string(send ? "send\u2192pp" : "recv\u2190pp") +
               std::to_string(other);
  t.bytes = t.n * elementSize(t.type);
  TESSERA_ASSIGN_OR_RETURN(t.comm, d.communicator("pp"));
  return Status();
}

Status decodeSend(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeP2p(d, in, t, true);
}

/// Posted now, completed with the rest of the open batch; to the rank
/// itself, a copy through the executor's queue, complete at once.
static Status postP2p(RunContext &x, const Thunk &t, bool send) {
  const int peer = int(t.i[0]), tag = int(t.i[1]);
  if (peer == t.i[2])
    return send ? x.selfSend(t) : x.selfRecv(t);
  TESSERA_RETURN_IF_ERROR(x.syncForHostComm(t));
  TESSERA_ASSIGN_OR_RETURN(
      CommRequest req, send ? t.comm->isend(t.ptr[0], t.n, t.type, peer, tag)
                            : t.comm->irecv(t.ptr[0], t.n, t.type, peer, tag));
  x.joinP2pBatch(t, req);
  return Status();
}

Status runSend(RunContext &x, const Thunk &t) { return postP2p(x, t, true); }

Status decodeRecv(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeP2p(d, in, t, false);
}

Status runRecv(RunContext &x, const Thunk &t) { return postP2p(x, t, false); }

} // namespace tessera::rt::ops
