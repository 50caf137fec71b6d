//===- RTOps.cpp - rt dialect operations ----------------------------------===//
//
// Buffers, the instruction ops' verifier against the instruction contract
// (tessera/rt/Opcodes.def) and the attributes of the ops whose artifact
// attributes are named ODS attributes (Gemm, the optimizers, collectives).
//
//===----------------------------------------------------------------------===//

#include "dialects/rt/IR/RTOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace tessera::rt;

#include "dialects/rt/IR/RTOpsDialect.cpp.inc"
#include "dialects/rt/IR/RTEnums.cpp.inc"
#include "dialects/rt/IR/RTOpsInterfaces.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/rt/IR/RTOpsTypes.cpp.inc"

void RTDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/rt/IR/RTOps.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialects/rt/IR/RTOpsTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// BufferOp, GetOp
//===----------------------------------------------------------------------===//

LogicalResult BufferOp::verify() {
  auto type = dyn_cast<MemRefType>(getType());
  if (!type || !type.hasStaticShape())
    return emitOpError() << "needs a statically shaped memref type";
  if (getRankGroupAttr() && getKind() != BufferKind::ParamShard &&
      (getKind() != BufferKind::View || !getRankStrideAttr() ||
       *getRankStride() <= 0))
    return emitOpError() << "is rank-relative, which needs kind 'view' and a "
                            "positive rank_stride";
  if (getKind() == BufferKind::ParamShard &&
      (!getRankGroupAttr() || !getOfAttr() || getRankStrideAttr()))
    return emitOpError() << "of kind 'param_shard' must name its bucket view "
                            "with 'of' and the group that splits it with "
                            "'rank_group' (and no rank_stride)";
  if (getStaged() && getKind() != BufferKind::Param &&
      getKind() != BufferKind::View)
    return emitOpError() << "is staged, which only parameters and their "
                            "bucket views are";
  if ((getKind() == BufferKind::Grad || getKind() == BufferKind::OptState) &&
      !getOfAttr())
    return emitOpError() << "of kind '" << stringifyEnum(getKind())
                         << "' must name its parameter with 'of'";
  if (getForWeightGrad() && getKind() != BufferKind::Activation)
    return emitOpError() << "is saved for the weight gradients "
                            "(for_weight_grad), which needs kind 'activation'";
  return success();
}

LogicalResult GetOp::verifySymbolUses(SymbolTableCollection &st) {
  auto buffer = st.lookupNearestSymbolFrom<BufferOp>(*this, getBufferAttr());
  if (!buffer)
    return emitOpError() << "refers to unknown buffer " << getBufferAttr();
  if (buffer.getType() != getType())
    return emitOpError() << "type " << getType() << " differs from buffer type "
                         << buffer.getType();
  if (buffer.getStaged())
    return emitOpError() << "reads " << getBufferAttr()
                         << ", which is staged (ZeRO-3: its value lives in its "
                            "bucket's param_shard, not in the arena)";
  return success();
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

/// Rows and columns of a buffer viewed as a matrix (leading dims flattened).
static std::pair<int64_t, int64_t> asMatrix(MemRefType t) {
  int64_t rows = 1;
  for (int64_t d : t.getShape().drop_back())
    rows *= d;
  return {rows, t.getShape().back()};
}

LogicalResult GemmOp::verify() {
  auto a = getA().getType(), b = getB().getType(), c = getC().getType();
  if (a.getRank() < 2 || b.getRank() < 2 || c.getRank() < 2)
    return emitOpError() << "expects buffers of rank >= 2";
  auto [ar, ac] = asMatrix(a);
  auto [br, bc] = asMatrix(b);
  auto [cr, cc] = asMatrix(c);
  int64_t m = getTransA() ? ac : ar, k = getTransA() ? ar : ac;
  int64_t kb = getTransB() ? bc : br, n = getTransB() ? br : bc;
  if (k != kb || cr != m || cc != n)
    return emitOpError() << "shapes do not form a product: " << a << " x " << b
                         << " -> " << c;
  return success();
}

LogicalResult CastOp::verify() {
  auto x = cast<MemRefType>(getBuffers()[0].getType());
  auto y = cast<MemRefType>(getBuffers()[1].getType());
  if (x.getNumElements() != y.getNumElements())
    return emitOpError() << "converts between float buffers of the same size, got "
                         << x << " and " << y;
  return success();
}

//===----------------------------------------------------------------------===//
// The instruction contract
//===----------------------------------------------------------------------===//

/// The artifact dtype of a buffer element type, if it has one.
static std::optional<::tessera::artifact::DType> artifactDType(Type element) {
  if (element.isF32())
    return ::tessera::artifact::DType::F32;
  if (element.isBF16())
    return ::tessera::artifact::DType::BF16;
  if (element.isF16())
    return ::tessera::artifact::DType::F16;
  if (element.isInteger(32))
    return ::tessera::artifact::DType::I32;
  if (element.isInteger(64))
    return ::tessera::artifact::DType::I64;
  return std::nullopt;
}

LogicalResult tessera::rt::verifyInstruction(Operation *op) {
  auto instr = cast<InstructionOpInterface>(op);
  const OpcodeInfo &info = opcodeInfo(instr.getOpcode());
  SmallVector<MemRefType> buffers;
  for (Type t : op->getOperandTypes())
    if (auto memref = dyn_cast<MemRefType>(t))
      buffers.push_back(memref);
  if (int(buffers.size()) != info.numOperands())
    return op->emitOpError() << "takes " << info.numOperands()
                             << " buffers, got " << buffers.size();
  for (auto [i, type] : llvm::enumerate(buffers)) {
    const char code = info.operands[i];
    std::optional<::tessera::artifact::DType> dtype =
        artifactDType(type.getElementType());
    if (!dtype || !dtypeAllowed(code, *dtype))
      return op->emitOpError()
             << "buffer " << i << " (" << info.operandName(int(i))
             << ") must be " << dtypeCodeText(code) << ", got " << type;
    if (info.has(SameDType) &&
        type.getElementType() != buffers.front().getElementType())
      return op->emitOpError() << "buffers " << buffers.front() << " and "
                               << type << " must have the same element type";
  }
  if (info.has(SameFloatDType)) {
    std::optional<size_t> first;
    for (auto [i, type] : llvm::enumerate(buffers)) {
      if (info.operands[i] != 'h')
        continue;
      if (!first)
        first = i;
      else if (type.getElementType() != buffers[*first].getElementType())
        return op->emitOpError()
               << "buffers " << *first << " (" << info.operandName(int(*first))
               << ") and " << i << " (" << info.operandName(int(i))
               << ") must be the same float type (f32, bf16 or f16), got " << buffers[*first]
               << " and " << type;
    }
  }
  InstrAttrs attrs = instr.getInstrAttrs();
  // A product's result: f32, or its operands' 16-bit format (rounded once,
  // so nothing to accumulate into).
  for (auto [i, type] : llvm::enumerate(buffers)) {
    if (info.operands[i] != 'r' || type.getElementType().isF32())
      continue;
    std::optional<size_t> first;
    for (size_t j = 0; j < buffers.size() && !first; ++j)
      if (info.operands[j] == 'h')
        first = j;
    if (!first || type.getElementType() != buffers[*first].getElementType())
      return op->emitOpError()
             << "result buffer " << i << " (" << info.operandName(int(i))
             << ") must be f32 or the float type of its operands, got "
             << type;
    if (attrs.beta != 0.0f) {
      std::string beta;
      llvm::raw_string_ostream(beta) << llvm::format("%g", double(attrs.beta));
      return op->emitOpError()
             << "accumulates (beta " << beta << ") into the 16-bit "
             << info.operandName(int(i)) << " " << type
             << "; an accumulated result must be f32";
    }
  }
  if (info.has(Runs)) {
    if (std::string_view why =
            runsError(attrs.iattrs.data(), attrs.iattrs.size());
        !why.empty())
      return op->emitOpError() << why;
  } else if (int(attrs.iattrs.size()) != info.numIAttrs)
    return op->emitOpError() << "takes " << info.numIAttrs
                             << " integer attributes (iattrs), got "
                             << attrs.iattrs.size();
  if (int(attrs.fattrs.size()) != info.numFAttrs)
    return op->emitOpError() << "takes " << info.numFAttrs
                             << " float attributes, got "
                             << attrs.fattrs.size();
  switch (info.group) {
  case GroupUse::None:
    if (!attrs.group.empty())
      return op->emitOpError() << "takes no group, got '" << attrs.group
                               << "'";
    break;
  case GroupUse::Required:
    if (attrs.group.empty())
      return op->emitOpError() << "needs a rank group";
    break;
  case GroupUse::Pipeline:
    if (!attrs.group.empty() && attrs.group != "pp")
      return op->emitOpError() << "runs over the pipeline group 'pp', not '"
                               << attrs.group << "'";
    break;
  case GroupUse::Shard:
    break;
  }
  return success();
}

InstrAttrs GemmOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.transA = getTransA();
  attrs.transB = getTransB();
  attrs.alpha = getAlpha().convertToFloat();
  attrs.beta = getBeta().convertToFloat();
  return attrs;
}

InstrAttrs AdamOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.fattrs = {getLr().convertToFloat(), getBeta1().convertToFloat(),
                  getBeta2().convertToFloat(), getEps().convertToFloat(),
                  getWeightDecay().convertToFloat()};
  if (auto runs = getRunsAttr())
    attrs.iattrs.assign(runs.asArrayRef().begin(), runs.asArrayRef().end());
  if (auto group = getGroupAttr())
    attrs.group = group.getValue();
  return attrs;
}

InstrAttrs SgdMomentumOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.fattrs = {getLr().convertToFloat(), getWeightDecay().convertToFloat(),
                  getMomentum().convertToFloat()};
  if (auto runs = getRunsAttr())
    attrs.iattrs.assign(runs.asArrayRef().begin(), runs.asArrayRef().end());
  if (auto group = getGroupAttr())
    attrs.group = group.getValue();
  return attrs;
}

InstrAttrs RotaryEmbeddingOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.iattrs = {int64_t(getNumHeads()), int64_t(getRotaryDim()),
                  getInverse() ? 1 : 0};
  attrs.fattrs = {getBase().convertToFloat(),
                  getScalingFactor().convertToFloat()};
  if (auto group = getGroupAttr())
    attrs.group = group.getValue();
  return attrs;
}

InstrAttrs SgdOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.fattrs = {getLr().convertToFloat(),
                  getWeightDecay().convertToFloat()};
  if (auto runs = getRunsAttr())
    attrs.iattrs.assign(runs.asArrayRef().begin(), runs.asArrayRef().end());
  if (auto group = getGroupAttr())
    attrs.group = group.getValue();
  return attrs;
}

/// A collective's group and reduction.
static InstrAttrs collectiveAttrs(StringRef group,
                                  Reduction reduction = Reduction::Sum) {
  InstrAttrs attrs;
  attrs.group = group;
  attrs.reduce = reduction == Reduction::Max
                     ? ::tessera::artifact::ReduceOp::Max
                     : ::tessera::artifact::ReduceOp::Sum;
  return attrs;
}

InstrAttrs AllReduceOp::getInstrAttrs() {
  return collectiveAttrs(getGroup(), getReduction());
}
InstrAttrs AllReduceStartOp::getInstrAttrs() {
  return collectiveAttrs(getGroup(), getReduction());
}
InstrAttrs ReduceScatterStartOp::getInstrAttrs() {
  return collectiveAttrs(getGroup());
}
InstrAttrs AllGatherStartOp::getInstrAttrs() {
  return collectiveAttrs(getGroup());
}
InstrAttrs AllGatherOp::getInstrAttrs() {
  return collectiveAttrs(getGroup());
}
InstrAttrs ReduceScatterOp::getInstrAttrs() {
  return collectiveAttrs(getGroup());
}
InstrAttrs WaitOp::getInstrAttrs() { return {}; }
InstrAttrs ParamSyncStartOp::getInstrAttrs() {
  InstrAttrs attrs = collectiveAttrs(getGroup());
  attrs.event = getSync();
  return attrs;
}
InstrAttrs ParamSyncWaitOp::getInstrAttrs() {
  InstrAttrs attrs;
  attrs.event = getSync();
  return attrs;
}

InstrAttrs AllGatherGemmOp::getInstrAttrs() {
  InstrAttrs attrs = collectiveAttrs(getGroup());
  attrs.transB = getTransB();
  return attrs;
}
InstrAttrs GemmReduceScatterOp::getInstrAttrs() {
  InstrAttrs attrs = collectiveAttrs(getGroup());
  attrs.transB = getTransB();
  return attrs;
}

/// rows(c) x cols(c) = rows(a) x op(b): the GEMM of the fused collectives.
static LogicalResult verifyFusedGemm(Operation *op, MemRefType a, MemRefType b,
                                     MemRefType c, bool transB) {
  if (a.getRank() < 2 || b.getRank() < 2 || c.getRank() < 2)
    return op->emitOpError() << "expects buffers of rank >= 2";
  auto [ar, ac] = asMatrix(a);
  auto [br, bc] = asMatrix(b);
  auto [cr, cc] = asMatrix(c);
  int64_t kb = transB ? bc : br, n = transB ? br : bc;
  if (ac != kb || cr != ar || cc != n)
    return op->emitOpError() << "shapes do not form a product: " << a << " x "
                             << b << " -> " << c;
  return success();
}

// (The contract's SameFloatDType checks the operands' float types.)
LogicalResult AllGatherGemmOp::verify() {
  return verifyFusedGemm(*this, getGathered().getType(), getB().getType(),
                         getC().getType(), getTransB());
}

LogicalResult GemmReduceScatterOp::verify() {
  auto a = getA().getType();
  if (a.getRank() < 2 || getB().getType().getRank() < 2 ||
      getOutput().getType().getRank() < 2)
    return emitOpError() << "expects buffers of rank >= 2";
  auto [ar, ac] = asMatrix(a);
  auto [br, bc] = asMatrix(getB().getType());
  int64_t kb = getTransB() ? bc : br, n = getTransB() ? br : bc;
  auto [yr, yc] = asMatrix(getOutput().getType());
  if (ac != kb)
    return emitOpError() << "shapes do not form a product: " << a << " x "
                         << getB().getType();
  if (yc != n || yr <= 0 || ar % yr != 0)
    return emitOpError() << "output " << getOutput().getType()
                         << " is not a block of rows of the product of " << a
                         << " and " << getB().getType();
  if (getWorkspace().getType().getNumElements() < 3 * yr * yc)
    return emitOpError() << "workspace " << getWorkspace().getType()
                         << " holds fewer than three output blocks";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/rt/IR/RTOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Every opcode has its op
//===----------------------------------------------------------------------===//

namespace {
/// The opcode of an rt op class, or -1 for ops that are no instruction.
template <typename Op, typename = void> struct OpcodeOf {
  static constexpr int value = -1;
};
template <typename Op>
struct OpcodeOf<Op, std::void_t<decltype(Op::kOpcode)>> {
  static constexpr int value = int(Op::kOpcode);
};
template <typename... Ops> constexpr bool eachOpcodeHasOneOp() {
  for (size_t i = 0; i < kNumOpcodes; ++i)
    if (((OpcodeOf<Ops>::value == int(i) ? 1 : 0) + ... + 0) != 1)
      return false;
  return true;
}
} // namespace

static_assert(eachOpcodeHasOneOp<
#define GET_OP_LIST
#include "dialects/rt/IR/RTOps.cpp.inc"
                  >(),
              "every opcode of tessera/rt/Opcodes.def needs exactly one rt op "
              "in RTOps.td naming it");
