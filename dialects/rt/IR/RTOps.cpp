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
  static const char *kinds[] = {"param",     "grad",       "main_param",
                                "opt_state", "input",      "loss",
                                "iteration", "activation", "view"};
  if (llvm::find(kinds, getKind()) == std::end(kinds))
    return emitOpError() << "unknown buffer kind '" << getKind() << "'";
  auto type = dyn_cast<MemRefType>(getType());
  if (!type || !type.hasStaticShape())
    return emitOpError() << "needs a statically shaped memref type";
  if (getRankGroupAttr() && (getKind() != "view" || !getRankStrideAttr() ||
                             *getRankStride() <= 0))
    return emitOpError() << "is rank-relative, which needs kind 'view' and a "
                            "positive rank_stride";
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

LogicalResult CastOp::verify() {
  if (getBuffers().size() != kNumBuffers)
    return emitOpError() << "takes " << kNumBuffers << " buffers, got "
                         << getBuffers().size();
  auto x = cast<MemRefType>(getBuffers()[0].getType());
  auto y = cast<MemRefType>(getBuffers()[1].getType());
  if (!isa<FloatType>(x.getElementType()) || !isa<FloatType>(y.getElementType()) ||
      x.getNumElements() != y.getNumElements())
    return emitOpError() << "converts between float buffers of the same size, got "
                         << x << " and " << y;
  return success();
}
DEFINE_KERNEL_VERIFIER(LayerNormOp)
DEFINE_KERNEL_VERIFIER(LayerNormGradOp)
DEFINE_KERNEL_VERIFIER(EmbeddingOp)
DEFINE_KERNEL_VERIFIER(EmbeddingGradOp)
DEFINE_KERNEL_VERIFIER(AddPositionEmbeddingOp)
DEFINE_KERNEL_VERIFIER(PositionEmbeddingGradOp)
DEFINE_KERNEL_VERIFIER(AttentionOp)
DEFINE_KERNEL_VERIFIER(AttentionGradOp)
DEFINE_KERNEL_VERIFIER(LogitsMaxOp)
DEFINE_KERNEL_VERIFIER(CrossEntropyStatsOp)
DEFINE_KERNEL_VERIFIER(CrossEntropyFromStatsOp)
DEFINE_KERNEL_VERIFIER(CrossEntropyStatsGradOp)
DEFINE_KERNEL_VERIFIER(TokenMeanOp)
DEFINE_KERNEL_VERIFIER(TokenMeanGradOp)
DEFINE_KERNEL_VERIFIER(DropoutOp)
DEFINE_KERNEL_VERIFIER(SendOp)
DEFINE_KERNEL_VERIFIER(RecvOp)

#define GET_OP_CLASSES
#include "dialects/rt/IR/RTOps.cpp.inc"
