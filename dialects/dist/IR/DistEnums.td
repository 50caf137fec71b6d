//===- DistEnums.td - dist dialect: enums of its attributes *- tablegen -*-===//
//
// The closed sets of strings that dist ops carry. The ops keep the strings
// in the IR (Tessera_StrEnumAttr); C++ reads and writes the enums.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_DIALECTS_DIST_IR_DISTENUMS_TD
#define TESSERA_DIALECTS_DIST_IR_DISTENUMS_TD

include "dialects/tessera/IR/TesseraEnumBase.td"

/// `reduction` of dist.all_reduce and dist.all_reduce_start.
def Dist_Reduction : Tessera_Enum<"Reduction", "reduction: sum or max",
    ["sum", "max"], ["Sum", "Max"], "::tessera::dist">;

/// `peer` of dist.send and dist.recv: a neighbour in the pp group, or the
/// rank itself (the turn of a V-shaped placement, one chunk handing its
/// output to the rank's other chunk).
def Dist_Peer : Tessera_Enum<"Peer", "pipeline peer: next, prev or self",
    ["next", "prev", "self"], ["Next", "Prev", "Self"], "::tessera::dist">;

/// `kind` of dist.schedule (Megatron's schedules).
def Dist_ScheduleKind : Tessera_Enum<"ScheduleKind",
    "pipeline schedule: none, 1f1b, interleaved, zb-h1, zbv or dualpipev",
    ["none", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"],
    ["None", "OneFOneB", "Interleaved", "ZbH1", "Zbv", "DualPipeV"],
    "::tessera::dist">;

/// `part` of dist.run: which part of a phase runs.
def Dist_RunPart : Tessera_Enum<"RunPart", "phase part: recv, compute or send",
    ["recv", "compute", "send"], ["Recv", "Compute", "Send"],
    "::tessera::dist">;

/// `data` of dist.pack and dist.unpack: what a bucket view holds.
def Dist_BucketData : Tessera_Enum<"BucketData", "bucket data: grad or param",
    ["grad", "param"], ["Grad", "Param"], "::tessera::dist">;

/// `kind` of dist.bucket_reduce_start.
def Dist_BucketReduceKind : Tessera_Enum<"BucketReduceKind",
    "bucket reduction: all_reduce or reduce_scatter",
    ["all_reduce", "reduce_scatter"], ["AllReduce", "ReduceScatter"],
    "::tessera::dist">;

#endif // TESSERA_DIALECTS_DIST_IR_DISTENUMS_TD
