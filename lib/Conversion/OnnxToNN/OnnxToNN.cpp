//===- OnnxToNN.cpp - tessera-onnx-to-nn: the nn model of an ONNX graph ---===//
//
// Applies the raising patterns (Patterns.cpp) phase by phase, then builds
// the nn function: the token inputs become [seq, batch] i32 arguments with
// a dynamic batch, every parameter view an argument (its value computed
// from its initializers: transposed, fused or stacked into Megatron's
// layouts), and every type is re-inferred for the dynamic batch. What no
// pattern raised is an error naming the ONNX node.
//
//===----------------------------------------------------------------------===//

#include "Matchers.h"
#include "Patterns.h"

#include "dialects/nn/IR/NNOps.h"
#include "tessera/Conversion/Passes.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <cstring>
#include <fstream>
#include <map>

using namespace mlir;
namespace nn = tessera::nn;
namespace onnx = tessera::onnx;
using namespace tessera::onnx_to_nn;

namespace tessera {
#define GEN_PASS_DEF_ONNXTONNPASS
#include "tessera/Conversion/Passes.h.inc"
} // namespace tessera

namespace {

/// The value of a parameter view, in Megatron's layout.
FailureOr<std::vector<float>> computeParam(onnx::NodeOp view) {
  StringRef kind = view.getString("kind", "");
  SmallVector<std::vector<float>> src;
  for (Value s : view.getInputs()) {
    FailureOr<std::vector<float>> v = readInitializer(s.getDefiningOp<onnx::InitializerOp>());
    if (failed(v))
      return failure();
    src.push_back(std::move(*v));
  }
  auto type = cast<RankedTensorType>(view.getResult(0).getType());
  auto srcType = [&](unsigned i) {
    return cast<RankedTensorType>(view.getInputs()[i].getType());
  };
  bool transposed = false;
  if (auto t = dyn_cast_or_null<BoolAttr>(view.getAttrs().get("transposed")))
    transposed = t.getValue();
  // Row r of a source stored [out, in], or [in, out] when transposed.
  auto row = [&](unsigned i, int64_t r, std::vector<float> &to, int64_t at) {
    auto t = srcType(i);
    if (t.getRank() == 1) {
      to[size_t(at)] = src[i][size_t(r)];
      return;
    }
    int64_t rows = t.getDimSize(transposed ? 1 : 0), cols = t.getDimSize(transposed ? 0 : 1);
    for (int64_t c = 0; c < cols; ++c)
      to[size_t(at * cols + c)] =
          transposed ? src[i][size_t(c * rows + r)] : src[i][size_t(r * cols + c)];
  };
  std::vector<float> out(size_t(type.getNumElements()));
  if (kind == "identity") {
    return src[0];
  }
  if (kind == "transpose") {
    auto t = srcType(0);
    int64_t in = t.getDimSize(0), o = t.getDimSize(1);
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < o; ++c)
        out[size_t(c * in + r)] = src[0][size_t(r * o + c)];
    return out;
  }
  if (kind == "stack") {
    int64_t f = type.getDimSize(1);
    for (unsigned i = 0; i < 2; ++i)
      for (int64_t r = 0; r < f; ++r)
        row(i, r, out, int64_t(i) * f + r);
    return out;
  }
  if (kind == "qkv") {
    int64_t heads = view.getInt("num_heads", 0), groups = view.getInt("num_query_groups", 0),
            dim = view.getInt("head_dim", 0);
    int64_t per = heads / groups, rowsPerGroup = (per + 2) * dim;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < per * dim; ++r)
        row(0, g * per * dim + r, out, g * rowsPerGroup + r);
      for (int64_t r = 0; r < dim; ++r) {
        row(1, g * dim + r, out, g * rowsPerGroup + per * dim + r);
        row(2, g * dim + r, out, g * rowsPerGroup + (per + 1) * dim + r);
      }
    }
    return out;
  }
  if (kind == "blocks") {
    // [q][k][v] blocks of heads * head_dim rows each -> per head [q k v].
    int64_t heads = view.getInt("num_heads", 0), dim = view.getInt("head_dim", 0);
    int64_t hidden = heads * dim;
    for (int64_t from = 0; from < 3 * hidden; ++from) {
      int64_t t = from / hidden, r = from % hidden;
      row(0, from, out, (r / dim) * 3 * dim + t * dim + r % dim);
    }
    return out;
  }
  view.emitError() << "unknown parameter view '" << kind << "'";
  return failure();
}

/// The export record of the parameter views (kOnnxSourceAttr's
/// "parameters"): each view's kind, shapes and initializers, and the ONNX
/// nodes that read each initializer for it. An initializer that several
/// parameters read (the dynamo exporter merges equal initializers, such as
/// every norm's initial ones), or one view twice, is read for each by the
/// nodes of its module: the module its name came from, or for a fused view
/// (qkv, stack) its projections' modules, in graph order; tessera-export
/// splits it by them. Where that does not identify them the readers stay
/// empty, and an export that must split the initializer says so.
ArrayAttr exportRecord(OpBuilder &b, ArrayRef<onnx::NodeOp> views) {
  llvm::DenseMap<Operation *, llvm::SmallSetVector<StringRef, 2>> paramsOf;
  for (onnx::NodeOp view : views)
    for (Value in : view.getInputs())
      if (Operation *init = in.getDefiningOp<onnx::InitializerOp>())
        paramsOf[init].insert(view.getString("name", ""));
  SmallVector<Attribute> entries;
  for (onnx::NodeOp view : views) {
    StringRef name = view.getString("name", "");
    StringRef kind = view.getString("kind", "");
    StringRef scope = name.rsplit('.').first;
    bool fused = kind == "qkv" || kind == "stack";
    auto type = cast<RankedTensorType>(view.getResult(0).getType());
    SmallVector<NamedAttribute> e{
        b.getNamedAttr("param", b.getStringAttr(name)),
        b.getNamedAttr("kind", view.getAttrs().get("kind")),
        b.getNamedAttr("shape", b.getDenseI64ArrayAttr(type.getShape()))};
    for (StringRef key : {"transposed", "num_heads", "num_query_groups", "head_dim"})
      if (Attribute a = view.getAttrs().get(key))
        e.push_back(b.getNamedAttr(key, a));
    SmallVector<Attribute> sources;
    for (auto [i, in] : llvm::enumerate(view.getInputs())) {
      auto init = in.getDefiningOp<onnx::InitializerOp>();
      if (!init)
        continue;
      // This view's sources that read the same initializer, and which of
      // them this one is.
      unsigned occurrences = 0, occurrence = 0;
      for (auto [j, other] : llvm::enumerate(view.getInputs()))
        if (other == in) {
          if (j < i)
            ++occurrence;
          ++occurrences;
        }
      bool shared = paramsOf[init].size() > 1 || occurrences > 1;
      SmallVector<Attribute> readers;
      if (auto all = init->getAttrOfType<ArrayAttr>(kReadersAttr))
        for (auto reader : all.getAsRange<ArrayAttr>()) {
          StringRef nodeScope = cast<StringAttr>(reader[1]).getValue();
          if (!shared || nodeScope == scope ||
              (fused && nodeScope.rsplit('.').first == scope.rsplit('.').first))
            readers.push_back(reader[0]);
        }
      if (occurrences > 1)
        readers = readers.size() == occurrences
                      ? SmallVector<Attribute>{readers[occurrence]}
                      : SmallVector<Attribute>{};
      sources.push_back(b.getDictionaryAttr(
          {b.getNamedAttr("initializer", b.getStringAttr(init.getName())),
           b.getNamedAttr("shape", b.getDenseI64ArrayAttr(init.getType().getShape())),
           b.getNamedAttr("readers", b.getArrayAttr(readers))}));
    }
    e.push_back(b.getNamedAttr("sources", b.getArrayAttr(sources)));
    entries.push_back(b.getDictionaryAttr(e));
  }
  return b.getArrayAttr(entries);
}

/// nn.init for a parameter without loaded weights: a norm's scale ones, a
/// bias zeros, an embedding table normal(0, 0.02); "" (Tessera's default
/// for a layer's weight) otherwise.
StringRef defaultInit(onnx::NodeOp view, StringRef name, RankedTensorType type) {
  if (type.getRank() == 1)
    return name.ends_with("bias") ? "zeros" : "ones";
  for (Operation *user : view->getUsers())
    if (isa<nn::EmbeddingOp, nn::AddPositionEmbeddingOp>(user))
      return "normal:0.02";
  return "";
}

/// The graph input a token or label chain (Cast(swap(arg)) or Cast(arg),
/// made by the patterns) reads, or null.
BlockArgument inputOf(onnx::NodeOp cast) {
  if (cast.getOpType() != "Cast" || cast.getInputs().size() != 1)
    return nullptr;
  Value v = cast.getInputs()[0];
  if (Operation *def = v.getDefiningOp(); def && isBatchSeqSwap(def))
    v = def->getOperand(0);
  return dyn_cast<BlockArgument>(v);
}

struct OnnxToNNPass : tessera::impl::OnnxToNNPassBase<OnnxToNNPass> {
  using OnnxToNNPassBase::OnnxToNNPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> funcs(module.getOps<func::FuncOp>());
    if (funcs.size() != 1) {
      module.emitError() << "expected one function (the imported graph)";
      return signalPassFailure();
    }
    func::FuncOp func = funcs[0];
    // Dropout sites are numbered in graph order before any is raised (the
    // graph import numbers them; a hand-written graph may not).
    int64_t stream = 0;
    func.walk([&](onnx::NodeOp n) {
      if (n.getOpType() == "Dropout" && !n->hasAttr("onnx.dropout_stream"))
        n->setAttr("onnx.dropout_stream",
                   IntegerAttr::get(IntegerType::get(&getContext(), 64), stream++));
    });
    recordUses(func);
    for (int phase = 0; phase < kNumPhases; ++phase) {
      RewritePatternSet patterns(&getContext());
      populateOnnxToNNPatterns(phase, patterns);
      GreedyRewriteConfig config;
      config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
      if (failed(applyPatternsGreedily(func, std::move(patterns), config))) {
        func.emitError() << "raising the ONNX graph did not converge";
        return signalPassFailure();
      }
    }
    if (failed(buildModel(module, func)))
      return signalPassFailure();
  }

  LogicalResult buildModel(ModuleOp module, func::FuncOp func);
};

LogicalResult OnnxToNNPass::buildModel(ModuleOp module, func::FuncOp func) {
  Block &body = func.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  OpBuilder b(&getContext());

  // The result: the scalar loss among the graph's outputs (a (logits,
  // loss) graph trains on the loss), or logits with --loss.
  Value loss, logits;
  for (Value v : ret.getOperands()) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    if (t && t.getRank() == 0 && !loss)
      loss = v;
    else if (t && t.getRank() == 3 && !logits)
      logits = v;
  }
  if (loss && !this->loss.empty()) {
    func.emitError() << "--loss " << this->loss
                     << " given, but the model already returns a scalar (its loss)";
    return failure();
  }
  // A forward that returns the last position's logits only (generation's
  // x[:, [-1], :]) cannot be trained.
  if (!loss && logits) {
    int64_t seq = ShapedType::kDynamic;
    for (BlockArgument arg : body.getArguments())
      if (auto t = dyn_cast<RankedTensorType>(arg.getType());
          t && t.getRank() == 2 && isa<IntegerType>(t.getElementType()))
        seq = t.getDimSize(1);
    int64_t got = cast<RankedTensorType>(logits.getType()).getDimSize(1);
    if (!ShapedType::isDynamic(seq) && got != seq) {
      func.emitError() << "the model returns the logits of " << got
                       << " position(s) of the " << seq
                       << " it reads (as a generation forward's x[:, [-1], :]); "
                          "training needs every position's logits or the loss: "
                          "export the forward with the targets, or without the "
                          "last-position slice";
      return failure();
    }
  }
  if (!loss && (!logits || this->loss != "cross-entropy")) {
    func.emitError() << (logits ? "the model returns logits [batch, seq, vocab], not "
                                  "a loss: give --loss cross-entropy to train it "
                                  "with the mean token cross-entropy"
                                : "the graph returns neither a scalar loss nor "
                                  "logits [batch, seq, vocab]");
    return failure();
  }
  Value result = loss ? loss : logits;

  // Everything the result needs must be raised.
  SetVector<Operation *> needed;
  SmallVector<Value> work{result};
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *def = v.getDefiningOp();
    if (!def || !needed.insert(def))
      continue;
    for (Value in : def->getOperands())
      work.push_back(in);
  }
  // What no pattern raised: the first such node, or a Dropout among them
  // (attention dropout above 0 leaves the whole attention unraised).
  onnx::NodeOp unraised, router;
  for (Operation &op : body.without_terminator()) {
    if (!needed.count(&op) || isa<nn::NNDialect>(op.getDialect()) ||
        isa<onnx::InitializerOp, onnx::ConstantOp, onnx::NoneOp>(op))
      continue;
    auto node = dyn_cast<onnx::NodeOp>(op);
    if (node && (node.getOpType() == kParamView || isBatchSeqSwap(node) ||
                 (node.getOpType() == "Cast" && inputOf(node))))
      continue;
    if (!node) {
      op.emitError() << "unexpected op in the raised graph";
      return failure();
    }
    if (!unraised || (node.getOpType() == "Dropout" && unraised.getOpType() != "Dropout"))
      unraised = node;
    // A token router's top-k: a mixture-of-experts layer.
    if (!router && node.getOpType() == "TopK")
      router = node;
  }
  if (router) {
    StringRef scope = scopeOf(router);
    auto diag = router.emitError() << "node '" << router.getNodeName() << "' (TopK)";
    if (!scope.empty())
      diag << " in module '" << scope << "'";
    diag << " routes tokens to experts: Tessera does not raise a mixture-of-experts "
            "layer from ONNX (the dynamo exporter cannot export its data-dependent "
            "expert loop, and the TorchScript exporter unrolls it over the experts "
            "the example input reached, which fails on inputs that leave one "
            "without tokens); compile the model's Hugging Face directory instead "
            "(tessera-compile DIR: MixtralForCausalLM from config.json and "
            "safetensors)";
    return failure();
  }
  if (onnx::NodeOp node = unraised) {
    StringRef scope = scopeOf(node);
    auto diag = node.emitError() << "node '" << node.getNodeName() << "' ("
                                 << node.getOpType() << ")";
    if (!node.getDomain().empty())
      diag << " of domain '" << node.getDomain() << "'";
    if (!scope.empty())
      diag << " in module '" << scope << "'";
    diag << ": not part of any construct Tessera raises (embeddings, linear "
            "layers, LayerNorm and RMSNorm, GELU, ReLU and SwiGLU, causal "
            "self-attention, dropout, residual adds, the cross-entropy loss)";
    // Where an op type has one place in those constructs, say which.
    static const llvm::StringMap<StringRef> hints = {
        {"Softmax", "a softmax is raised inside causal self-attention only"},
        {"Sigmoid", "a sigmoid is raised inside SiLU (x * sigmoid(x)) only"},
        {"Dropout", "dropout is raised in training mode on token activations [b, s, h] "
                    "only (Megatron's hidden dropout); export attention dropout as 0"},
        {"Where", "a Where is raised as attention's causal mask only"},
        {"Gather", "a Gather is raised as an embedding lookup of the token ids only"}};
    if (auto it = hints.find(node.getOpType()); it != hints.end())
      diag << "; " << it->second;
    return failure();
  }

  // The nn function's arguments: token inputs, then the parameters in
  // order of first use.
  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  IRMapping map;
  auto inputKind = [&](Value castOut) -> StringRef {
    for (Operation *user : castOut.getUsers())
      if (isa<nn::EmbeddingOp>(user))
        return "tokens";
    return "labels";
  };
  std::map<unsigned, std::pair<StringRef, SmallVector<Value>>> inputs;
  std::map<std::string, unsigned> paramIndex;
  SmallVector<onnx::NodeOp> params;
  for (Operation *op : needed) {
    auto node = dyn_cast<onnx::NodeOp>(op);
    if (node && inputOf(node)) {
      BlockArgument arg = inputOf(node);
      auto &entry = inputs[arg.getArgNumber()];
      StringRef kind = inputKind(node.getResult(0));
      if (!entry.first.empty() && entry.first != kind) {
        func.emitError() << "graph input #" << arg.getArgNumber()
                         << " is both the tokens and the labels; Tessera's data "
                            "gives the labels separately (export with a labels input)";
        return failure();
      }
      entry.first = kind;
      entry.second.push_back(node.getResult(0));
    }
  }
  for (Operation &op : body.without_terminator())
    if (auto node = dyn_cast<onnx::NodeOp>(op);
        node && needed.count(node) && node.getOpType() == kParamView)
      params.push_back(node);

  // The batch is dim 1 of sequence-major [s, b] inputs, dim 0 of [b] labels
  // and [b, features] inputs.
  auto batchDim = [](Type t) { return cast<RankedTensorType>(t).getRank() == 2 ? 1 : 0; };
  auto batchDynamic = [&](Type t, int64_t dim) {
    auto r = cast<RankedTensorType>(t);
    SmallVector<int64_t> shape(r.getShape());
    shape[size_t(dim)] = ShapedType::kDynamic;
    return RankedTensorType::get(shape, r.getElementType());
  };
  auto inputAttrs = [&](StringRef kind, int64_t dim) {
    SmallVector<NamedAttribute> attrs{
        b.getNamedAttr(tessera::kInputAttr, b.getStringAttr(kind))};
    if (dim != 0)
      attrs.push_back(b.getNamedAttr(tessera::kBatchDimAttr, b.getI64IntegerAttr(dim)));
    return b.getDictionaryAttr(attrs);
  };
  // Float inputs read by nn ops directly: features [b, ...].
  SmallVector<BlockArgument> features;
  for (BlockArgument arg : body.getArguments())
    if (isa<FloatType>(cast<TensorType>(arg.getType()).getElementType()) &&
        llvm::any_of(arg.getUsers(), [&](Operation *u) {
          return needed.count(u) && isa<nn::NNDialect>(u->getDialect());
        }))
      features.push_back(arg);
  for (BlockArgument arg : features) {
    argTypes.push_back(batchDynamic(arg.getType(), 0));
    argAttrs.push_back(inputAttrs("features", 0));
  }
  // Tokens first, then labels, as tessera-gen orders them.
  SmallVector<std::pair<StringRef, SmallVector<Value>>> ordered;
  for (StringRef kind : {"tokens", "labels"})
    for (auto &[index, entry] : inputs)
      if (entry.first == kind)
        ordered.push_back(entry);
  for (auto &[kind, casts] : ordered) {
    int64_t dim = batchDim(casts[0].getType());
    argTypes.push_back(batchDynamic(casts[0].getType(), dim));
    argAttrs.push_back(inputAttrs(kind, dim));
  }
  bool addLabels = !loss;
  if (addLabels) {
    auto t = cast<RankedTensorType>(logits.getType());
    argTypes.push_back(
        RankedTensorType::get({t.getDimSize(1), ShapedType::kDynamic}, b.getI32Type()));
    argAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr(tessera::kInputAttr, b.getStringAttr("labels")),
         b.getNamedAttr(tessera::kBatchDimAttr, b.getI64IntegerAttr(1))}));
  }
  SmallVector<NamedAttribute> weights;
  SmallVector<onnx::NodeOp> uniqueParams;
  for (onnx::NodeOp view : params) {
    std::string name = view.getString("name", "").str();
    auto it = paramIndex.find(name);
    if (it != paramIndex.end()) {
      onnx::NodeOp first = uniqueParams[it->second];
      if (first.getInputs() != view.getInputs() ||
          first.getString("kind", "") != view.getString("kind", "") ||
          first.getResult(0).getType() != view.getResult(0).getType()) {
        view.emitError() << "two different parameters are named '" << name << "'";
        return failure();
      }
      // One parameter read twice: only a word embedding tied to the LM head.
      auto feedsEmbedding = [](onnx::NodeOp v) {
        return llvm::any_of(v->getUsers(), [](Operation *u) { return isa<nn::EmbeddingOp>(u); });
      };
      if (!feedsEmbedding(first) && !feedsEmbedding(view)) {
        Operation *user = *view->getUsers().begin();
        view.emitError() << "initializer '" << name << "' is read by two layers ("
                         << user->getName() << " here); Tessera shares a parameter "
                         << "only between the word embedding and the LM head (a tied "
                         << "embedding). Re-export with separate parameters (clone "
                         << "the tensor in the module before torch.onnx.export)";
        return failure();
      }
      continue;
    }
    paramIndex[name] = unsigned(uniqueParams.size());
    uniqueParams.push_back(view);
    auto type = cast<RankedTensorType>(view.getResult(0).getType());
    argTypes.push_back(type);
    SmallVector<NamedAttribute> attrs{
        b.getNamedAttr(tessera::kParamAttr, b.getStringAttr(name))};
    StringRef init = loadWeights ? StringRef("data") : defaultInit(view, name, type);
    if (!init.empty())
      attrs.push_back(b.getNamedAttr(tessera::kInitAttr, b.getStringAttr(init)));
    argAttrs.push_back(b.getDictionaryAttr(attrs));
    auto source = view.getInputs().empty()
                      ? onnx::InitializerOp()
                      : view.getInputs()[0].getDefiningOp<onnx::InitializerOp>();
    if (loadWeights && view.getString("kind", "") == "identity" && source &&
        source.getExternalAttr()) {
      // External data as it is stays in its file: the artifact names it and
      // each rank maps its own shard (the ONNX importer's external-data path).
      DictionaryAttr ext = source.getExternalAttr();
      int64_t bytes = type.getNumElements() * 4;
      auto length = dyn_cast_or_null<IntegerAttr>(ext.get("length"));
      if (length && length.getInt() >= 0 && length.getInt() != bytes) {
        view.emitError() << "parameter '" << name << "': external data length "
                         << length.getInt() << " != " << bytes
                         << " bytes of its shape";
        return failure();
      }
      int64_t offset = cast<IntegerAttr>(ext.get("offset")).getInt();
      if (auto size = dyn_cast_or_null<IntegerAttr>(ext.get("file_bytes"));
          size && offset > size.getInt() - bytes) {
        view.emitError() << "parameter '" << name << "': its " << bytes
                         << " bytes at offset " << offset << " run past the end of "
                         << cast<StringAttr>(ext.get("file")).getValue() << " ("
                         << size.getInt() << " bytes)";
        return failure();
      }
      weights.push_back(b.getNamedAttr(
          name, b.getDictionaryAttr(
                    {b.getNamedAttr("dir", ext.get("dir")),
                     b.getNamedAttr("file", ext.get("file")),
                     b.getNamedAttr("offset", ext.get("offset")),
                     b.getNamedAttr("shape", b.getDenseI64ArrayAttr(type.getShape()))})));
      continue;
    }
    if (loadWeights && view.getString("kind", "") == "identity" && source &&
        isa_and_nonnull<DenseResourceElementsAttr>(source.getValueAttr()) &&
        source.getValueAttr().getType() == type) {
      // The initializer's own bytes, not a copy.
      weights.push_back(b.getNamedAttr(name, source.getValueAttr()));
      continue;
    }
    if (loadWeights) {
      FailureOr<std::vector<float>> data = computeParam(view);
      if (failed(data))
        return failure();
      auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign<float>(*data);
      weights.push_back(b.getNamedAttr(
          name, DenseResourceElementsAttr::get(type, name, std::move(blob))));
    }
  }

  // The new function.
  b.setInsertionPoint(func);
  auto model = func::FuncOp::create(b, func.getLoc(), func.getName(),
                                    b.getFunctionType(argTypes, {}));
  Block *entry = model.addEntryBlock();
  unsigned argIndex = 0;
  for (BlockArgument arg : features)
    map.map(arg, entry->getArgument(argIndex++));
  for (auto &[kind, casts] : ordered) {
    for (Value c : casts)
      map.map(c, entry->getArgument(argIndex));
    ++argIndex;
  }
  Value labelsArg = addLabels ? entry->getArgument(argIndex++) : Value();
  for (onnx::NodeOp view : params)
    map.map(view.getResult(0),
            entry->getArgument(argIndex + paramIndex[view.getString("name", "").str()]));
  b.setInsertionPointToStart(entry);
  for (Operation &op : body.without_terminator()) {
    if (!needed.count(&op) || !isa<nn::NNDialect>(op.getDialect()))
      continue;
    for (Value in : op.getOperands())
      if (!map.contains(in)) {
        // A swap left between raised ops: the layout did not close.
        op.emitError() << "operand not in the sequence-major layout (a batch-major "
                          "value reached a position-dependent op)";
        return failure();
      }
    Operation *clone = b.clone(op, map);
    if (clone->getNumOperands() && failed(tessera::reinferResultTypes(clone))) {
      clone->emitOpError() << "cannot re-infer its types for a dynamic batch";
      return failure();
    }
  }
  Value out;
  if (loss) {
    out = map.lookupOrNull(loss);
  } else {
    // logits are swap(nn value): the loss over the sequence-major logits.
    Operation *def = logits.getDefiningOp();
    Value seq = def && isBatchSeqSwap(def) ? map.lookupOrNull(def->getOperand(0)) : Value();
    if (!seq) {
      func.emitError() << "the logits are not raised";
      return failure();
    }
    auto ce = nn::SoftmaxCrossEntropyOp::create(b, func.getLoc(), seq, labelsArg,
                                                b.getI64IntegerAttr(-100));
    (void)tessera::reinferResultTypes(ce);
    auto mean = nn::TokenMeanOp::create(b, func.getLoc(), ce.getResult(), labelsArg,
                                        nullptr, b.getI64IntegerAttr(-100));
    (void)tessera::reinferResultTypes(mean);
    out = mean.getResult();
  }
  if (!out) {
    func.emitError() << "the loss is not raised";
    return failure();
  }
  func::ReturnOp::create(b, func.getLoc(), out);
  model.setType(b.getFunctionType(argTypes, {out.getType()}));
  model.setAllArgAttrs(argAttrs);
  module->setAttr(tessera::kOnnxSourceAttr,
                  b.getDictionaryAttr(b.getNamedAttr("parameters", exportRecord(b, params))));
  func.erase();
  if (!weights.empty())
    module->setAttr(tessera::kWeightsAttr, b.getDictionaryAttr(weights));
  return success();
}

} // namespace
