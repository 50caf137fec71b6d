//===- RTOps.cpp - rt dialect operations ----------------------------------===//

#include "dialects/rt/IR/RTOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace tessera::rt;

#include "dialects/rt/IR/RTOpsDialect.cpp.inc"

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
  static const char *kinds[] = {"param", "grad",  "opt_state",
                                "input", "loss", "iteration"};
  if (llvm::find(kinds, getKind()) == std::end(kinds))
    return emitOpError() << "unknown buffer kind '" << getKind() << "'";
  auto type = dyn_cast<MemRefType>(getType());
  if (!type || !type.hasStaticShape())
    return emitOpError() << "needs a statically shaped memref type";
  if ((getKind() == "grad" || getKind() == "opt_state") && !getOfAttr())
    return emitOpError() << "of kind '" << getKind()
                         << "' must name its parameter with 'of'";
  return success();
}

LogicalResult GetOp::verifySymbolUses(SymbolTableCollection &st) {
  auto buffer = st.lookupNearestSymbolFrom<BufferOp>(*this, getBufferAttr());
  if (!buffer)
    return emitOpError() << "refers to unknown buffer " << getBufferAttr();
  if (buffer.getType() != getType())
    return emitOpError() << "type " << getType() << " differs from buffer type "
                         << buffer.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

LogicalResult GemmOp::verify() {
  auto a = getA().getType(), b = getB().getType(), c = getC().getType();
  if (a.getRank() != 2 || b.getRank() != 2 || c.getRank() != 2)
    return emitOpError() << "expects 2-d buffers";
  int64_t m = a.getDimSize(getTransA() ? 1 : 0);
  int64_t k = a.getDimSize(getTransA() ? 0 : 1);
  int64_t kb = b.getDimSize(getTransB() ? 1 : 0);
  int64_t n = b.getDimSize(getTransB() ? 0 : 1);
  if (k != kb || c.getDimSize(0) != m || c.getDimSize(1) != n)
    return emitOpError() << "shapes do not form a product: " << a << " x " << b
                         << " -> " << c;
  return success();
}

#define DEFINE_KERNEL_VERIFIER(OpTy)                                           \
  LogicalResult OpTy::verify() {                                               \
    if (getBuffers().size() != kNumBuffers)                                    \
      return emitOpError() << "takes " << kNumBuffers << " buffers, got "      \
                           << getBuffers().size();                             \
    return success();                                                          \
  }

DEFINE_KERNEL_VERIFIER(BiasAddOp)
DEFINE_KERNEL_VERIFIER(AddOp)
DEFINE_KERNEL_VERIFIER(GeluOp)
DEFINE_KERNEL_VERIFIER(GeluGradOp)
DEFINE_KERNEL_VERIFIER(ReluOp)
DEFINE_KERNEL_VERIFIER(ReluGradOp)
DEFINE_KERNEL_VERIFIER(ReduceRowsOp)
DEFINE_KERNEL_VERIFIER(CrossEntropyOp)
DEFINE_KERNEL_VERIFIER(CrossEntropyGradOp)
DEFINE_KERNEL_VERIFIER(MeanOp)
DEFINE_KERNEL_VERIFIER(MeanGradOp)
DEFINE_KERNEL_VERIFIER(FillOp)
DEFINE_KERNEL_VERIFIER(ScaleOp)
DEFINE_KERNEL_VERIFIER(CopyOp)
DEFINE_KERNEL_VERIFIER(AxpyOp)

#define GET_OP_CLASSES
#include "dialects/rt/IR/RTOps.cpp.inc"
