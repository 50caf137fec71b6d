//===- Table.cpp - The opcodes' dispatch table ----------------------------===//
//
// One row per opcode of the instruction contract (tessera/rt/Opcodes.def),
// in the schema's order, holding the opcode's decode and run functions.
// The decoder looks an instruction's decode function up here, and stores
// the run function in its thunk for the executor.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <iterator>

namespace tessera::rt::ops {
namespace {

struct Handlers {
  DecodeFn decode;
  RunFn run;
};

constexpr Handlers kHandlers[] = {
#define TESSERA_OPCODE(Name, Class, Operands, OperandNames, IAttrs, FAttrs,    \
                       Group, Flags)                                           \
  {&decode##Name, &run##Name},
#include "tessera/rt/Opcodes.def"
};

// Opcodes.h checks that the rows are the schema's opcodes in order.
static_assert(std::size(kHandlers) == kNumOpcodes,
              "one pair of functions per opcode");

const Handlers *find(fb::Opcode op) {
  const size_t i = size_t(op);
  return i < std::size(kHandlers) ? &kHandlers[i] : nullptr;
}

} // namespace

DecodeFn decoderOf(fb::Opcode op) {
  const Handlers *h = find(op);
  return h ? h->decode : nullptr;
}

RunFn runnerOf(fb::Opcode op) {
  const Handlers *h = find(op);
  return h ? h->run : nullptr;
}

} // namespace tessera::rt::ops
