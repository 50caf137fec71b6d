//===- Opcodes.h - The rt instruction contract as a table -------*- C++ -*-===//
//
// The rows of Opcodes.def as a constexpr table indexed by the schema's
// opcode, and the queries every reader of instructions shares (the artifact
// validator, the executor, the rt dialect's verifier and tessera-serialize).
// Header-only and free of LLVM, so the runtime and the compiler include the
// same definition; it needs only the flatc-generated schema header.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_OPCODES_H
#define TESSERA_RT_OPCODES_H

#include "tessera/artifact/artifact_generated.h"
#include "tessera/rt/Runs.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::rt {

/// What an instruction does, for the checks that differ by kind.
enum class OpClass : uint8_t { Kernel, Collective, PointToPoint, Event };

/// What an instruction's `group` may hold (see Opcodes.def).
enum class GroupUse : uint8_t { None, Shard, Required, Pipeline };

/// Opcodes.def's flags.
enum OpFlags : uint8_t {
  SameDType = 1 << 0,
  Async = 1 << 1,
  HasEvent = 1 << 2,
  Transposes = 1 << 3,
  SameFloatDType = 1 << 4,
  Runs = 1 << 5,
};

/// One row of Opcodes.def.
struct OpcodeInfo {
  artifact::Opcode opcode;
  std::string_view name;
  OpClass cls;
  /// One dtype code per operand (f, h, i, l, *); its size is the count.
  std::string_view operands;
  /// "A,B,C".
  std::string_view operandNames;
  int numIAttrs;
  int numFAttrs;
  GroupUse group;
  uint8_t flags;

  constexpr int numOperands() const { return int(operands.size()); }
  constexpr bool has(OpFlags f) const { return (flags & f) != 0; }
  /// The name of operand `i` ("gamma"), or "" past the list.
  constexpr std::string_view operandName(int i) const {
    std::string_view rest = operandNames;
    for (; i > 0 && !rest.empty(); --i) {
      size_t comma = rest.find(',');
      rest = comma == std::string_view::npos ? std::string_view()
                                             : rest.substr(comma + 1);
    }
    return rest.substr(0, rest.find(','));
  }
};

inline constexpr OpcodeInfo kOpcodeTable[] = {
#define TESSERA_OPCODE(NAME, CLASS, OPERANDS, NAMES, IATTRS, FATTRS, GROUP,   \
                       FLAGS)                                                  \
  {artifact::Opcode::NAME, #NAME,   OpClass::CLASS,  OPERANDS, NAMES,          \
   IATTRS,                 FATTRS,  GroupUse::GROUP, uint8_t(FLAGS)},
#include "tessera/rt/Opcodes.def"
};

inline constexpr size_t kNumOpcodes =
    sizeof(kOpcodeTable) / sizeof(kOpcodeTable[0]);

/// The most operands an instruction has (the executor's thunks hold this
/// many pointers).
constexpr int maxOperands() {
  int most = 0;
  for (const OpcodeInfo &info : kOpcodeTable)
    most = info.numOperands() > most ? info.numOperands() : most;
  return most;
}

namespace detail {
/// The table lists the schema's opcodes densely and in order, so that an
/// opcode indexes its row.
constexpr bool tableMatchesSchema() {
  if (kNumOpcodes != size_t(artifact::Opcode::MAX) + 1 ||
      size_t(artifact::Opcode::MIN) != 0)
    return false;
  for (size_t i = 0; i < kNumOpcodes; ++i)
    if (size_t(kOpcodeTable[i].opcode) != i)
      return false;
  return true;
}
constexpr bool validDTypeCodes() {
  for (const OpcodeInfo &info : kOpcodeTable) {
    for (char c : info.operands)
      if ((c != 'f' && c != 'h' && c != 'i' && c != 'l' && c != 'r' &&
           c != '*') ||
          // A product's result takes its format from the product's
          // operands.
          (c == 'r' && !info.has(SameFloatDType)))
        return false;
    // One name per operand.
    int names = info.operandNames.empty() ? 0 : 1;
    for (char c : info.operandNames)
      names += c == ',';
    if (names != info.numOperands())
      return false;
  }
  return true;
}
} // namespace detail

static_assert(detail::tableMatchesSchema(),
              "Opcodes.def must list every opcode of artifact.fbs once, in "
              "the schema's order");
static_assert(detail::validDTypeCodes(),
              "Opcodes.def: operand dtype codes are f, h, i, l, r (with "
              "SameFloatDType) or *, with one "
              "name per operand");

/// The row of `op`, or null for a value outside the schema.
constexpr const OpcodeInfo *findOpcodeInfo(artifact::Opcode op) {
  size_t i = size_t(op);
  return i < kNumOpcodes ? &kOpcodeTable[i] : nullptr;
}
/// The row of a known opcode.
constexpr const OpcodeInfo &opcodeInfo(artifact::Opcode op) {
  return kOpcodeTable[size_t(op)];
}

/// Whether dtype code `code` (Opcodes.def) admits `dtype`.
constexpr bool dtypeAllowed(char code, artifact::DType dtype) {
  switch (code) {
  case 'f':
    return dtype == artifact::DType::F32;
  case 'h':
  case 'r':
    return dtype == artifact::DType::F32 || dtype == artifact::DType::BF16 ||
           dtype == artifact::DType::F16;
  case 'i':
    return dtype == artifact::DType::I32;
  case 'l':
    return dtype == artifact::DType::I64;
  default:
    return true;
  }
}

/// "F32", "F32, BF16 or F16", "I32", "I64" or "any dtype", for messages.
constexpr std::string_view dtypeCodeText(char code) {
  switch (code) {
  case 'f':
    return "F32";
  case 'h':
    return "F32, BF16 or F16";
  case 'r':
    return "F32, or the 16-bit format of the operands it is the product of";
  case 'i':
    return "I32";
  case 'l':
    return "I64";
  default:
    return "any dtype";
  }
}

/// The communication opcodes (AllReduce, AllGather, ReduceScatter and the
/// started forms): only their `group` needs a communicator.
constexpr bool isCollective(artifact::Opcode op) {
  const OpcodeInfo *info = findOpcodeInfo(op);
  return info && info->cls == OpClass::Collective;
}

/// The pipeline point-to-point opcodes (Send, Recv): they run over the "pp"
/// group and join the rank's open p2p batch instead of blocking.
constexpr bool isPointToPoint(artifact::Opcode op) {
  const OpcodeInfo *info = findOpcodeInfo(op);
  return info && info->cls == OpClass::PointToPoint;
}

/// The kernels whose `group` gives their shard offset (vocabulary-parallel
/// embedding and cross-entropy, sequence-sharded Copy and Dropout); they
/// communicate nothing.
constexpr bool isShardedKernel(artifact::Opcode op) {
  const OpcodeInfo *info = findOpcodeInfo(op);
  return info && info->group == GroupUse::Shard;
}

} // namespace tessera::rt

#endif // TESSERA_RT_OPCODES_H
