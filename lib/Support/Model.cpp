//===- Model.cpp - Conventions of a Tessera training module ---------------===//

#include "tessera/Support/Model.h"

#include "mlir/Interfaces/InferTypeOpInterface.h"

#include <map>

using namespace mlir;

func::FuncOp tessera::getModelFunc(ModuleOp module) {
  if (func::FuncOp mb = getPhaseFunc(module, kMicrobatchPhase))
    return mb;
  func::FuncOp found;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func->hasAttr(kPhaseAttr) || func.isExternal())
      continue;
    if (found) {
      emitError(func.getLoc())
          << "more than one model function in the module ('"
          << found.getSymName() << "' and '" << func.getSymName() << "')";
      return nullptr;
    }
    found = func;
  }
  if (!found)
    emitError(module.getLoc()) << "the module has no model function";
  else if (!found.getBody().hasOneBlock())
    return emitError(found.getLoc())
               << "the model function must have a single block",
           nullptr;
  return found;
}

func::FuncOp tessera::getPhaseFunc(ModuleOp module, StringRef phase) {
  for (auto func : module.getOps<func::FuncOp>())
    if (auto p = func->getAttrOfType<StringAttr>(kPhaseAttr))
      if (p.getValue() == phase)
        return func;
  return nullptr;
}

LogicalResult tessera::reinferResultTypes(Operation *op) {
  if (auto infer = dyn_cast<InferTypeOpInterface>(op)) {
    SmallVector<Type> types;
    if (failed(infer.inferReturnTypes(
            op->getContext(), op->getLoc(), op->getOperands(),
            op->getAttrDictionary(), op->getPropertiesStorage(),
            op->getRegions(), types)))
      return failure();
    for (auto [result, type] : llvm::zip(op->getResults(), types))
      result.setType(type);
    return success();
  }
  if (op->hasTrait<OpTrait::SameOperandsAndResultType>() &&
      op->getNumOperands() > 0) {
    for (Value result : op->getResults())
      result.setType(op->getOperand(0).getType());
    return success();
  }
  // An op without operands (nn.fill) has the type it was built with.
  if (op->getNumOperands() == 0)
    return success();
  return failure();
}

void tessera::updateFunctionType(func::FuncOp func) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  func.setType(FunctionType::get(func.getContext(),
                                 func.getBody().front().getArgumentTypes(),
                                 ret.getOperandTypes()));
}

SmallVector<ModuleOp> tessera::getPrograms(ModuleOp module) {
  SmallVector<ModuleOp> programs;
  for (auto nested : module.getOps<ModuleOp>())
    if (nested->hasAttr(kPpRankAttr))
      programs.push_back(nested);
  if (programs.empty())
    programs.push_back(module);
  return programs;
}

ModuleOp tessera::getRootModule(Operation *op) {
  ModuleOp root = isa<ModuleOp>(op) ? cast<ModuleOp>(op)
                                    : op->getParentOfType<ModuleOp>();
  while (root && root->getParentOfType<ModuleOp>())
    root = root->getParentOfType<ModuleOp>();
  return root;
}

int64_t tessera::getNumMicrobatches(ModuleOp module) {
  module = getRootModule(module);
  if (auto batch = module->getAttrOfType<DictionaryAttr>(kBatchAttr))
    if (auto m = batch.getAs<IntegerAttr>("num_microbatches"))
      return m.getInt();
  return 1;
}

FailureOr<int64_t> tessera::getNumLayers(Operation *root) {
  // The first op carrying each mark, in walk order.
  std::map<int64_t, Operation *> firstOf;
  root->walk([&](Operation *op) {
    if (auto layer = op->getAttrOfType<IntegerAttr>(kLayerAttr))
      firstOf.try_emplace(layer.getInt(), op);
  });
  int64_t expected = 0;
  for (auto &[layer, op] : firstOf) {
    if (layer != expected) {
      op->emitOpError() << "is marked " << kLayerAttr << " = " << layer
                        << ", but no op is marked layer " << expected
                        << " (layer marks must be contiguous from 0; "
                        << firstOf.size() << " distinct layers are marked)";
      return failure();
    }
    ++expected;
  }
  return expected;
}

DictionaryAttr tessera::makeSharding(MLIRContext *ctx,
                                     ArrayRef<ShardSplit> splits) {
  assert(!splits.empty() && splits.size() <= 2 && "one or two splits");
  Builder b(ctx);
  SmallVector<NamedAttribute> entries;
  for (auto [i, split] : llvm::enumerate(splits)) {
    std::string suffix = i ? "2" : "";
    entries.push_back(
        b.getNamedAttr("axis" + suffix, b.getStringAttr(split.axis)));
    entries.push_back(
        b.getNamedAttr("dim" + suffix, b.getI64IntegerAttr(split.dim)));
  }
  return b.getDictionaryAttr(entries);
}

SmallVector<tessera::ShardSplit, 2>
tessera::getShardSplits(DictionaryAttr sharding) {
  SmallVector<ShardSplit, 2> splits;
  if (!sharding)
    return splits;
  for (StringRef suffix : {"", "2"}) {
    auto axis = sharding.getAs<StringAttr>(("axis" + suffix).str());
    auto dim = sharding.getAs<IntegerAttr>(("dim" + suffix).str());
    if (axis && dim)
      splits.push_back({axis.getValue(), dim.getInt()});
  }
  return splits;
}
