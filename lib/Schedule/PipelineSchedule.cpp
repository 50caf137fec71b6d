//===- PipelineSchedule.cpp - Megatron pipeline schedules -----------------===//

#include "tessera/Schedule/PipelineSchedule.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <tuple>
#include <numeric>
#include <optional>

using namespace tessera::schedule;

bool tessera::schedule::parseKind(const std::string &text, Kind &kind) {
  if (text == "none")
    kind = Kind::None;
  else if (text == "1f1b")
    kind = Kind::OneFOneB;
  else if (text == "interleaved")
    kind = Kind::Interleaved;
  else if (text == "zb-h1")
    kind = Kind::ZbH1;
  else if (text == "zbv")
    kind = Kind::Zbv;
  else if (text == "dualpipev")
    kind = Kind::DualPipeV;
  else
    return false;
  return true;
}

const char *tessera::schedule::kindName(Kind kind) {
  switch (kind) {
  case Kind::None:
    return "none";
  case Kind::OneFOneB:
    return "1f1b";
  case Kind::Interleaved:
    return "interleaved";
  case Kind::ZbH1:
    return "zb-h1";
  case Kind::Zbv:
    return "zbv";
  case Kind::DualPipeV:
    return "dualpipev";
  }
  return "?";
}

std::string tessera::schedule::parseLayout(const std::string &text,
                                          std::vector<std::string> &stages) {
  stages.clear();
  // ',' is cosmetic.
  std::string s;
  for (char ch : text)
    if (ch != ',')
      s += ch;
  // What a layout may expand to: far more than any model's layers, far
  // less than would exhaust memory.
  constexpr int64_t kMaxCount = 100000, kMaxLength = 1000000;
  const std::string bad = "invalid --pipeline-model-parallel-layout '" + text + "': ";
  // Reads the count after a '*' at `i` of `str`: -1 if there is none, -2
  // if it is too large.
  auto count = [&](const std::string &str, size_t &i) -> int64_t {
    if (i >= str.size() || str[i] != '*')
      return -1;
    size_t j = i + 1;
    int64_t n = 0;
    while (j < str.size() && std::isdigit(static_cast<unsigned char>(str[j]))) {
      n = n * 10 + (str[j++] - '0');
      if (n > kMaxCount)
        return -2;
    }
    if (j == i + 1)
      return -1;
    i = j;
    return n;
  };
  const std::string tooLarge =
      bad + "a repeat count above " + std::to_string(kMaxCount);
  const std::string tooLong =
      bad + "it expands to more than " + std::to_string(kMaxLength) +
      " symbols";
  // "(group)*n" (groups do not nest), then "X*n".
  std::string grouped;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '(') {
      size_t close = s.find(')', i + 1);
      if (close == std::string::npos || close == i + 1 ||
          s.find('(', i + 1) < close)
        return bad + "a '(' needs a non-empty group closed by ')' and "
                     "followed by '*N' (groups do not nest)";
      size_t after = close + 1;
      int64_t n = count(s, after);
      if (n == -2)
        return tooLarge;
      if (n < 0)
        return bad + "the group '" + s.substr(i, close - i + 1) +
               "' needs '*N' after it";
      const std::string group = s.substr(i + 1, close - i - 1);
      if (int64_t(grouped.size() + group.size() * size_t(n)) > kMaxLength)
        return tooLong;
      for (int64_t k = 0; k < n; ++k)
        grouped += group;
      i = after;
    } else {
      grouped += s[i++];
    }
  }
  std::string flat;
  for (size_t i = 0; i < grouped.size();) {
    char ch = grouped[i++];
    if (ch == '*')
      return bad + "'*' needs a symbol or a group before it and a count "
                   "after";
    size_t at = i;
    int64_t n = count(grouped, at);
    if (n == -2)
      return tooLarge;
    if (n >= 0) {
      if (int64_t(flat.size()) + n > kMaxLength)
        return tooLong;
      flat.append(size_t(n), ch);
      i = at;
    } else {
      flat += ch;
    }
  }
  if (int64_t(flat.size()) > kMaxLength)
    return tooLong;
  std::string stage;
  for (size_t i = 0; i <= flat.size(); ++i) {
    if (i == flat.size() || flat[i] == '|') {
      stages.push_back(stage);
      stage.clear();
      continue;
    }
    char ch = flat[i];
    if (ch != 'E' && ch != 't' && ch != 'm' && ch != 'L')
      return std::string("Invalid layer character: ") + ch + " (stage=" +
             std::to_string(stages.size()) + ", layout_str='" + text +
             "'), known layer characters: ['E', 't', 'm', 'L']";
    stage += ch;
  }
  // pp x vpp pipeline functions per stage: more than any cluster runs.
  constexpr size_t kMaxStages = 16384;
  if (stages.size() > kMaxStages)
    return bad + std::to_string(stages.size()) + " stages, more than " +
           std::to_string(kMaxStages);
  return "";
}

int64_t tessera::schedule::layoutVpp(const std::string &layout, int64_t pp,
                                     std::string &error) {
  std::vector<std::string> stages;
  error = parseLayout(layout, stages);
  if (!error.empty())
    return 0;
  if (pp < 1 || int64_t(stages.size()) % pp != 0) {
    error = "The length of pipeline_model_parallel_layout must be divisible "
            "by pipeline_model_parallel_size (num_stages=" +
            std::to_string(stages.size()) +
            ", pipeline_model_parallel_size=" + std::to_string(pp) + ")";
    return 0;
  }
  return int64_t(stages.size()) / pp;
}

std::string tessera::schedule::resolveSplit(const SplitOptions &split,
                                            PipelineConfig &c) {
  auto s = [](int64_t v) { return std::to_string(v); };
  c.virtualStageLayers.clear();
  if (!split.any())
    return "";
  if (!c.stageLayers.empty())
    return "--pp-layers cannot be combined with Megatron's split options "
           "(--pipeline-model-parallel-layout, "
           "--decoder-first/last-pipeline-num-layers, "
           "--account-for-embedding/loss-in-pipeline-split)";
  if (c.pp < 2)
    return "an uneven pipeline split needs pp > 1 (pp is " + s(c.pp) + ")";
  const int64_t pp = c.pp, vpp = c.vpp, L = c.layers, stages = pp * vpp;
  std::vector<int64_t> &out = c.virtualStageLayers;
  if (!split.layout.empty()) {
    if (split.firstStageLayers != -1 || split.lastStageLayers != -1 ||
        split.accountForEmbedding || split.accountForLoss)
      return "pipeline_model_parallel_layout cannot be set with other "
             "pipeline layout arguments (--decoder-first-pipeline-num-layers, "
             "--decoder-last-pipeline-num-layers, "
             "--account-for-embedding-in-pipeline-split, "
             "--account-for-loss-in-pipeline-split)";
    std::vector<std::string> layout;
    if (std::string error = parseLayout(split.layout, layout); !error.empty())
      return error;
    std::string error;
    int64_t detected = layoutVpp(split.layout, pp, error);
    if (!error.empty())
      return error;
    if (detected != vpp)
      return "virtual_pipeline_model_parallel_size conflicts with "
             "pipeline_model_parallel_layout, "
             "(virtual_pipeline_model_parallel_size=" +
             s(vpp) + ", detected_vpp_size=" + s(detected) + ")";
    std::string all;
    for (const std::string &st : layout)
      all += st;
    auto name = [](char ch) -> std::string {
      switch (ch) {
      case 'E':
        return "embedding";
      case 'L':
        return "loss";
      case 'm':
        return "mtp";
      default:
        return "decoder";
      }
    };
    if (all.empty() || all.front() != 'E')
      return "The first layer must be embedding, but got " +
             (all.empty() ? std::string("nothing") : name(all.front()));
    if (all.back() != 'L')
      return "The last layer must be loss, but got " + name(all.back());
    if (std::count(all.begin(), all.end(), 'E') != 1)
      return "Embedding must be specified exactly once";
    if (std::count(all.begin(), all.end(), 'L') != 1)
      return "Loss must be specified exactly once";
    int64_t decoders = std::count(all.begin(), all.end(), 't');
    if (decoders != L)
      return "Number of decoder layers " + s(decoders) +
             " must match num_layers " + s(L);
    if (all.find('m') != std::string::npos)
      return "Number of mtp layers in layout must match mtp_num_layers (the "
             "model has no multi-token prediction layers)";
    // Tessera keeps what precedes the first layer (the embedding) on the
    // first stage and what follows the last (the final norm, the output
    // layer, the loss) on the last.
    if (layout.front().find('E') == std::string::npos)
      return "the embedding (E) must be in the layout's first stage, the "
             "first pipeline rank's first virtual stage";
    if (layout.back().find('L') == std::string::npos)
      return "the loss (L) must be in the layout's last stage, the last "
             "pipeline rank's last virtual stage (the first rank's second "
             "chunk under a V-shaped schedule)";
    for (const std::string &st : layout)
      out.push_back(std::count(st.begin(), st.end(), 't'));
    return "";
  }
  // -1: not given; any other value below 1 is refused below.
  const bool first = split.firstStageLayers != -1,
             last = split.lastStageLayers != -1;
  if (first || last) {
    if (split.accountForEmbedding || split.accountForLoss)
      return "num_layers_in_first_pipeline_stage and "
             "num_layers_in_last_pipeline_stage cannot be set at the same "
             "time with account_for_embedding_in_pipeline_split and "
             "account_for_loss_in_pipeline_split";
    int64_t middle = L, middleStages = pp;
    // The first or the last rank's count (`which`), taken from the middle.
    auto edge = [&](const char *which, int64_t n) -> std::string {
      if (n <= 0)
        return std::string("num_layers_in_") + which +
               "_pipeline_stage must be larger than 0";
      if (n > L)
        return std::string("--decoder-") + which + "-pipeline-num-layers " +
               s(n) + " is more than the model's " + s(L) + " layers";
      if (vpp > 1 && n % vpp != 0)
        return std::string("number of layers at ") + which + " stage: " +
               s(n) + " must be divisible by virtual pipeline parallel degree " +
               s(vpp);
      middle -= n;
      --middleStages;
      return "";
    };
    if (first)
      if (std::string error = edge("first", split.firstStageLayers);
          !error.empty())
        return error;
    if (last)
      if (std::string error = edge("last", split.lastStageLayers);
          !error.empty())
        return error;
    if (middle < 0)
      return "--decoder-first-pipeline-num-layers and "
             "--decoder-last-pipeline-num-layers place more layers than the "
             "model's " +
             s(L);
    if ((middle != 0) != (middleStages != 0))
      return "Mismatch: " + s(middle) + " middle layers remaining but " +
             s(middleStages) + " middle PP stages available.";
    int64_t perMiddle = 0;
    if (middleStages > 0) {
      if (middle % middleStages != 0)
        return "number of layers at middle stage: " + s(middle) +
               " must be divisible by the middle pipeline model parallel "
               "size " +
               s(middleStages);
      perMiddle = middle / middleStages;
      if (vpp > 1 && perMiddle % vpp != 0)
        return "number of layers on each middle pipeline rank: " +
               s(perMiddle) +
               " must be divisible by virtual pipeline parallel degree " +
               s(vpp);
    }
    std::vector<int64_t> perRank(size_t(pp), perMiddle);
    if (first)
      perRank.front() = split.firstStageLayers;
    if (last)
      perRank.back() = split.lastStageLayers;
    // Each rank's layers over its chunks' stages (a V's second chunk is
    // stage 2 pp - 1 - r).
    out.assign(size_t(pp * vpp), 0);
    for (int64_t chunk = 0; chunk < vpp; ++chunk)
      for (int64_t r = 0; r < pp; ++r)
        out[size_t(stageOf(c, r, chunk))] = perRank[size_t(r)] / vpp;
    return "";
  }
  // Megatron's account_for_*_in_pipeline_split: the embedding and the
  // loss count as a layer each, taken from the first and the last virtual
  // stage.
  const int64_t n = L + (split.accountForEmbedding ? 1 : 0) +
                    (split.accountForLoss ? 1 : 0);
  if (vpp == 1 && n % pp != 0)
    return "number of middle layers: " + s(n) +
           " must be divisible by middle pipeline_model_parallel_size " + s(pp);
  if (vpp > 1 && n % pp != 0)
    return "num_layers: " + s(n) +
           " after enable account_for_embedding_in_pipeline_split or "
           "account_for_loss_in_pipeline_split must be divisible by "
           "pipeline_model_parallel_size " +
           s(pp);
  if (vpp > 1 && (n / pp) % vpp != 0)
    return "number of layers on each pipeline rank: " + s(n / pp) +
           " (after enable account_for_embedding_in_pipeline_split or "
           "account_for_loss_in_pipeline_split) must be divisible by "
           "virtual_pipeline_model_parallel_size " +
           s(vpp);
  out.assign(size_t(stages), n / stages);
  if (split.accountForEmbedding && --out.front() < 0)
    return "Not enough layers in the first virtual pipeline stage";
  if (split.accountForLoss && --out.back() < 0)
    return "Not enough layers in the last virtual pipeline stage";
  return "";
}

std::string tessera::schedule::validate(const PipelineConfig &c) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (c.pp < 1 || c.vpp < 1 || c.microbatches < 1 || c.layers < 1)
    return "pp, vpp, micro-batches and layers must be positive (pp " + s(c.pp) +
           ", vpp " + s(c.vpp) + ", micro-batches " + s(c.microbatches) +
           ", layers " + s(c.layers) + ")";
  if (vShaped(c.kind)) {
    // PyTorch's checks (ScheduleZBVZeroBubble, ScheduleDualPipeV).
    if (c.vpp != 2)
      return std::string("the ") + kindName(c.kind) +
             " schedule runs exactly two chunks per rank (vpp 2), got vpp " +
             s(c.vpp);
    if (c.kind == Kind::DualPipeV && c.microbatches < 2 * c.pp)
      return "the dualpipev schedule needs at least as many micro-batches "
             "as virtual stages (2 x pp = " +
             s(2 * c.pp) + "), got " + s(c.microbatches);
    if (!c.stageLayers.empty())
      return "an uneven layer split (pp-layers) cannot be combined with "
             "two chunks per rank (Megatron's split options can: "
             "--pipeline-model-parallel-layout, "
             "--decoder-first/last-pipeline-num-layers)";
  } else if (c.kind != Kind::Interleaved && c.vpp != 1) {
    return "vpp " + s(c.vpp) + " needs the interleaved schedule";
  }
  if (c.kind == Kind::Interleaved) {
    if (c.microbatches % c.pp != 0)
      return "the interleaved schedule needs the number of micro-batches (" +
             s(c.microbatches) + ") to be a multiple of pp (" + s(c.pp) + ")";
    if (!c.stageLayers.empty())
      return "an uneven layer split (pp-layers) cannot be combined with "
             "virtual pipeline stages (Megatron's split options can: "
             "--pipeline-model-parallel-layout, "
             "--decoder-first/last-pipeline-num-layers)";
  }
  if (!c.virtualStageLayers.empty()) {
    if (int64_t(c.virtualStageLayers.size()) != c.pp * c.vpp)
      return "the split lists " + s(int64_t(c.virtualStageLayers.size())) +
             " virtual stages, but pp x vpp is " + s(c.pp * c.vpp);
    if (std::any_of(c.virtualStageLayers.begin(), c.virtualStageLayers.end(),
                    [](int64_t n) { return n < 0; }))
      return "a virtual stage of the split has a negative layer count";
    int64_t total = std::accumulate(c.virtualStageLayers.begin(),
                                    c.virtualStageLayers.end(), int64_t(0));
    if (total != c.layers)
      return "the split places " + s(total) + " layers, the model has " +
             s(c.layers);
    return "";
  }
  if (!c.stageLayers.empty()) {
    if (int64_t(c.stageLayers.size()) != c.pp)
      return "pp-layers lists " + s(int64_t(c.stageLayers.size())) +
             " stages, but pp is " + s(c.pp);
    if (std::any_of(c.stageLayers.begin(), c.stageLayers.end(),
                    [](int64_t n) { return n < 1; }))
      return "every stage in pp-layers needs at least one layer";
    int64_t total =
        std::accumulate(c.stageLayers.begin(), c.stageLayers.end(), int64_t(0));
    if (total != c.layers)
      return "pp-layers adds up to " + s(total) + " layers, the model has " +
             s(c.layers);
    return "";
  }
  if (c.layers % (c.pp * c.vpp) != 0)
    return s(c.layers) + " layers do not split evenly over pp x vpp = " +
           s(c.pp) + " x " + s(c.vpp) +
           (c.vpp > 1 ? " (give --pipeline-model-parallel-layout for an "
                        "uneven split)"
                      : " (give pp-layers for an uneven split)");
  return "";
}

int64_t tessera::schedule::stageRank(const PipelineConfig &c, int64_t stage) {
  if (vShaped(c.kind) && stage >= c.pp)
    return 2 * c.pp - 1 - stage;
  return stage % c.pp;
}

int64_t tessera::schedule::stageChunk(const PipelineConfig &c,
                                      int64_t stage) {
  return stage / c.pp;
}

int64_t tessera::schedule::stageOf(const PipelineConfig &c, int64_t rank,
                                   int64_t chunk) {
  if (vShaped(c.kind) && chunk == 1)
    return 2 * c.pp - 1 - rank;
  return chunk * c.pp + rank;
}

std::vector<LayerPlacement>
tessera::schedule::placeLayers(const PipelineConfig &c) {
  std::vector<LayerPlacement> out;
  if (!c.virtualStageLayers.empty()) {
    // Layers in virtual stage order (Megatron numbers them so).
    int64_t layer = 0;
    for (int64_t st = 0; st < c.pp * c.vpp; ++st)
      for (int64_t i = 0; i < c.virtualStageLayers[size_t(st)]; ++i)
        out.push_back({layer++, stageRank(c, st), stageChunk(c, st)});
    return out;
  }
  if (vShaped(c.kind)) {
    // Contiguous blocks per virtual stage, the stages placed as a V.
    int64_t perStage = c.layers / (c.pp * c.vpp);
    for (int64_t l = 0; l < c.layers; ++l)
      out.push_back({l, stageRank(c, l / perStage), stageChunk(c, l / perStage)});
    return out;
  }
  if (!c.stageLayers.empty()) {
    int64_t layer = 0;
    for (int64_t r = 0; r < c.pp; ++r)
      for (int64_t i = 0; i < c.stageLayers[size_t(r)]; ++i)
        out.push_back({layer++, r, 0});
    return out;
  }
  int64_t perChunk = c.layers / (c.pp * c.vpp);
  out.resize(size_t(c.layers));
  for (int64_t r = 0; r < c.pp; ++r)
    for (int64_t chunk = 0; chunk < c.vpp; ++chunk) {
      int64_t offset = chunk * (c.layers / c.vpp) + r * perChunk;
      for (int64_t i = 0; i < perChunk; ++i)
        out[size_t(offset + i)] = {offset + i, r, chunk};
    }
  return out;
}

namespace {

int64_t leadingForwards(const std::vector<Step> &order) {
  int64_t n = 0;
  while (n < int64_t(order.size()) && order[size_t(n)].forward)
    ++n;
  return n;
}

/// ZB-V on rank r of p (PyTorch's ScheduleZBVZeroBubble, after Qi et al.'s
/// generator): chunk 0 is virtual stage r, chunk 1 stage 2p - 1 - r. The
/// order is built for max(2p - 1, m) microbatches and the steps of
/// microbatches past m dropped, as PyTorch does.
std::vector<Step> zbvOrder(int64_t p, int64_t m, int64_t r) {
  const int64_t count = std::max(2 * p - 1, m);
  std::vector<Step> order;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto F = [&](int64_t chunk, int64_t &mb) {
    order.push_back({true, mb++, chunk});
  };
  auto B = [&](int64_t chunk, int64_t mb) {
    order.push_back({false, mb, chunk});
  };
  auto W = [&](int64_t chunk, int64_t mb) {
    order.push_back({false, mb, chunk, /*weight=*/true});
  };
  // Warmup: 2 (p - r) - 1 forwards of chunk 0, then r pairs of chunk 1
  // and chunk 0, then p - r chunk-1 forwards each followed by its B and W.
  for (int64_t i = 0; i < 2 * (p - r) - 1; ++i)
    F(0, f0);
  for (int64_t i = 0; i < r; ++i) {
    F(1, f1);
    F(0, f0);
  }
  for (int64_t i = 0; i < p - r; ++i) {
    F(1, f1);
    B(1, b1);
    W(1, b1++);
  }
  // Steady state: F B W of chunk 0, then of chunk 1.
  while (f1 < f0 || f0 < count) {
    if (f0 < count)
      F(0, f0);
    B(0, b0);
    W(0, b0++);
    F(1, f1);
    B(1, b1);
    W(1, b1++);
  }
  // Cool-down: B's first, the W's they leave behind after.
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < r; ++i) {
    B(0, b0++);
    B(1, b1++);
  }
  for (int64_t i = 0; i < p - r; ++i) {
    B(0, b0++);
    W(0, w0++);
  }
  while (w1 < b1)
    W(1, w1++);
  while (w0 < b0)
    W(0, w0++);
  std::vector<Step> kept;
  for (const Step &s : order)
    if (s.microbatch < m)
      kept.push_back(s);
  return kept;
}

/// DualPipeV on rank r of p (PyTorch's ScheduleDualPipeV, DeepSeek-V3's
/// DualPipe folded onto p ranks; m >= 2p). Its "overlapped" F and B pairs
/// (two microbatches' forward and backward whose communication DualPipe
/// hides under each other's compute) run here one after the other, and a
/// full backward is its B followed at once by its W; B's alone leave
/// their W in a queue, run oldest first where the order makes room.
std::vector<Step> dualPipeVOrder(int64_t p, int64_t m, int64_t r) {
  std::vector<Step> order;
  int64_t fwd[2] = {0, 0}, bwd[2] = {0, 0};
  std::vector<std::pair<int64_t, int64_t>> weights; // (chunk, mb), FIFO
  size_t nextWeight = 0;
  auto F = [&](int64_t chunk) { order.push_back({true, fwd[chunk]++, chunk}); };
  auto fullB = [&](int64_t chunk) {
    int64_t mb = bwd[chunk]++;
    order.push_back({false, mb, chunk});
    order.push_back({false, mb, chunk, /*weight=*/true});
  };
  auto inputB = [&](int64_t chunk) {
    int64_t mb = bwd[chunk]++;
    order.push_back({false, mb, chunk});
    weights.push_back({chunk, mb});
  };
  auto pendingW = [&] {
    if (nextWeight < weights.size()) {
      auto [chunk, mb] = weights[nextWeight++];
      order.push_back({false, mb, chunk, /*weight=*/true});
    }
  };
  for (int64_t i = 0; i < (p - r - 1) * 2; ++i)
    F(0);
  for (int64_t i = 0; i < r + 1; ++i) {
    F(0);
    F(1);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    inputB(1);
    pendingW();
    F(1);
  }
  for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) {
    // (On the last rank the first pair is not overlapped; the order is
    // the same.)
    F(0);
    fullB(1);
    F(1);
    fullB(0);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    fullB(1);
    F(1);
    fullB(0);
  }
  bool zb = false;
  const int64_t tail = r + 1;
  for (int64_t i = 0; i < tail; ++i) {
    if (i == tail / 2 && r % 2 == 1)
      zb = true;
    zb ? inputB(1) : fullB(1);
    if (i == tail / 2 && r % 2 == 0)
      zb = true;
    zb ? inputB(0) : fullB(0);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    pendingW();
    zb ? inputB(0) : fullB(0);
  }
  for (int64_t i = 0; i < r + 1; ++i)
    pendingW();
  return order;
}

} // namespace

std::vector<RankSchedule>
tessera::schedule::buildSchedule(const PipelineConfig &c) {
  std::vector<RankSchedule> ranks;
  const int64_t m = c.microbatches, pp = c.pp, v = c.vpp;
  for (int64_t r = 0; r < pp; ++r) {
    RankSchedule rs{r, 0, {}};
    if (c.kind == Kind::None) {
      for (int64_t i = 0; i < m; ++i) {
        rs.order.push_back({true, i, 0});
        rs.order.push_back({false, i, 0});
      }
    } else if (c.kind == Kind::OneFOneB) {
      int64_t warmup = std::min(pp - r - 1, m);
      rs.warmup = warmup;
      for (int64_t i = 0; i < warmup; ++i)
        rs.order.push_back({true, i, 0});
      for (int64_t i = 0; i < m - warmup; ++i) {
        rs.order.push_back({true, warmup + i, 0});
        rs.order.push_back({false, i, 0});
      }
      for (int64_t i = m - warmup; i < m; ++i)
        rs.order.push_back({false, i, 0});
    } else if (c.kind == Kind::ZbH1) {
      // ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B's
      // warmup and its F B pairs, each B the input gradient alone; rank r
      // runs W(i - r) after B(i), oldest first, so r weight-gradient
      // phases wait and fill what was 1F1B's cool-down bubble; the last r
      // run at the end. Bubble (p - 1)(F + B - W), a third of 1F1B's when
      // F = B = W; every rank holds up to p microbatches (1F1B's peak, on
      // its first rank).
      int64_t warmup = std::min(pp - r - 1, m);
      rs.warmup = warmup;
      for (int64_t i = 0; i < warmup; ++i)
        rs.order.push_back({true, i, 0});
      int64_t weights = 0;
      for (int64_t i = 0; i < m; ++i) {
        if (warmup + i < m)
          rs.order.push_back({true, warmup + i, 0});
        rs.order.push_back({false, i, 0});
        if (i >= r)
          rs.order.push_back({false, weights++, 0, /*weight=*/true});
      }
      while (weights < m)
        rs.order.push_back({false, weights++, 0, /*weight=*/true});
    } else if (c.kind == Kind::Zbv) {
      rs.order = zbvOrder(pp, m, r);
      rs.warmup = leadingForwards(rs.order);
    } else if (c.kind == Kind::DualPipeV) {
      rs.order = dualPipeVOrder(pp, m, r);
      rs.warmup = leadingForwards(rs.order);
    } else {
      // Virtual microbatch k: chunk and microbatch per Megatron's helpers.
      auto step = [&](int64_t k, bool forward) {
        int64_t inGroup = k % (pp * v);
        int64_t chunk = inGroup / pp;
        if (!forward)
          chunk = v - chunk - 1;
        int64_t microbatch = (k / (pp * v)) * pp + k % pp;
        return Step{forward, microbatch, chunk};
      };
      int64_t total = m * v;
      int64_t warmup = std::min((pp - r - 1) * 2 + (v - 1) * pp, total);
      rs.warmup = warmup;
      for (int64_t k = 0; k < warmup; ++k)
        rs.order.push_back(step(k, true));
      for (int64_t k = 0; k < total - warmup; ++k) {
        rs.order.push_back(step(warmup + k, true));
        rs.order.push_back(step(k, false));
      }
      for (int64_t k = total - warmup; k < total; ++k)
        rs.order.push_back(step(k, false));
    }
    ranks.push_back(rs);
  }
  return ranks;
}

Simulation tessera::schedule::simulate(const PipelineConfig &c,
                                       const std::vector<RankSchedule> &ranks,
                                       double forwardCost, double backwardCost) {
  size_t stages = size_t(std::max<int64_t>(1, int64_t(ranks.size()) *
                                                  std::max<int64_t>(1, c.vpp)));
  return simulate(c, ranks, std::vector<double>(stages, forwardCost),
                  std::vector<double>(stages, backwardCost));
}

Simulation tessera::schedule::simulate(const PipelineConfig &c,
                                       const std::vector<RankSchedule> &ranks,
                                       const std::vector<double> &forwardCosts,
                                       const std::vector<double> &backwardCosts,
                                       const std::vector<double> &weightCosts) {
  Simulation sim;
  const int64_t pp = int64_t(ranks.size()), v = c.vpp;
  // Finish time of (kind, rank, microbatch, chunk), kind 0 F, 1 B, 2 W; -1
  // until it ran: a flat table, as the planner simulates thousands of long
  // schedules. The table's extent, from the orders themselves (a step
  // outside [0, m) x [0, v) could not be stored).
  int64_t m = 0, chunks = v;
  bool split = false;
  for (auto &rs : ranks)
    for (const Step &st : rs.order) {
      if (st.microbatch < 0 || st.chunk < 0 || (st.forward && st.weight)) {
        sim.deadlock = "invalid step: microbatch " +
                       std::to_string(st.microbatch) + ", chunk " +
                       std::to_string(st.chunk);
        return sim;
      }
      m = std::max(m, st.microbatch + 1);
      chunks = std::max(chunks, st.chunk + 1);
      split |= st.weight;
    }
  auto kindOf = [](const Step &s) { return s.forward ? 0 : s.weight ? 2 : 1; };
  struct Done {
    std::vector<double> time;
    int64_t pp, m, v;
    double *find(int kind, int64_t r, int64_t mb, int64_t ch) {
      if (r < 0 || r >= pp || mb < 0 || mb >= m || ch < 0 || ch >= v)
        return nullptr;
      double &t = time[size_t(((int64_t(kind) * pp + r) * m + mb) * v + ch)];
      return t < 0 ? nullptr : &t;
    }
    void set(int kind, int64_t r, int64_t mb, int64_t ch, double end) {
      time[size_t(((int64_t(kind) * pp + r) * m + mb) * v + ch)] = end;
    }
  } done{std::vector<double>(size_t(3 * pp * m * chunks), -1.0), pp, m, chunks};
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> freeAt(size_t(pp), 0.0);
  double busy = 0;
  // Stages by the rank count of the orders given.
  PipelineConfig shape = c;
  shape.pp = pp;
  const int64_t numStages = pp * v;
  auto dependency = [&](int64_t r, const Step &s)
      -> std::optional<std::tuple<int, int64_t, int64_t, int64_t>> {
    if (s.weight) // W reads what its own B computed
      return std::make_tuple(1, r, s.microbatch, s.chunk);
    int64_t stage = stageOf(shape, r, s.chunk);
    if (s.forward) {
      if (stage == 0)
        return std::nullopt;
      return std::make_tuple(0, stageRank(shape, stage - 1), s.microbatch,
                             stageChunk(shape, stage - 1));
    }
    if (stage + 1 < numStages)
      return std::make_tuple(1, stageRank(shape, stage + 1), s.microbatch,
                             stageChunk(shape, stage + 1));
    return std::make_tuple(0, r, s.microbatch, s.chunk);
  };
  size_t total = 0;
  for (auto &rs : ranks)
    total += rs.order.size();
  while (sim.steps.size() < total) {
    // Among the ranks whose next step is ready, run the earliest start.
    int64_t best = -1;
    double bestStart = 0;
    for (int64_t r = 0; r < pp; ++r) {
      if (next[size_t(r)] >= ranks[size_t(r)].order.size())
        continue;
      const Step &s = ranks[size_t(r)].order[next[size_t(r)]];
      double start = freeAt[size_t(r)];
      if (auto dep = dependency(r, s)) {
        auto [kind, dr, dm, dc] = *dep;
        double *t = done.find(kind, dr, dm, dc);
        if (!t)
          continue;
        start = std::max(start, *t);
      }
      if (!s.forward) {
        double *own = done.find(0, r, s.microbatch, s.chunk);
        if (!own)
          continue;
        start = std::max(start, *own);
      }
      if (best < 0 || start < bestStart) {
        best = r;
        bestStart = start;
      }
    }
    if (best < 0) {
      // Nothing can run: every rank with work left waits forever.
      sim.deadlock = "deadlock:";
      for (int64_t r = 0; r < pp; ++r)
        if (next[size_t(r)] < ranks[size_t(r)].order.size()) {
          const Step &s = ranks[size_t(r)].order[next[size_t(r)]];
          sim.deadlock += std::string(sim.deadlock.size() > 9 ? ";" : "") +
                          " pipeline rank " + std::to_string(r) + " waits at " +
                          (s.forward  ? "forward"
                           : s.weight ? "weight gradients"
                                      : "backward") +
                          " of microbatch " + std::to_string(s.microbatch) +
                          ", chunk " + std::to_string(s.chunk) + " (step " +
                          std::to_string(next[size_t(r)]) + " of its order)";
        }
      return sim;
    }
    const Step &s = ranks[size_t(best)].order[next[size_t(best)]++];
    size_t stage = size_t(stageOf(shape, best, s.chunk));
    const std::vector<double> &costs =
        s.forward ? forwardCosts
        : s.weight && !weightCosts.empty() ? weightCosts
                                           : backwardCosts;
    if (stage >= costs.size()) {
      sim.deadlock = "no cost given for virtual stage " + std::to_string(stage);
      return sim;
    }
    double cost = costs[stage];
    // A split backward without W's own costs: half of the backward each.
    if (split && !s.forward && weightCosts.empty())
      cost /= 2;
    double end = bestStart + cost;
    busy += cost;
    freeAt[size_t(best)] = end;
    done.set(kindOf(s), best, s.microbatch, s.chunk, end);
    sim.steps.push_back({best, s, bestStart, end});
    sim.makespan = std::max(sim.makespan, end);
  }
  double idle = sim.makespan * double(pp) - busy;
  sim.bubbleFraction = busy > 0 ? idle / busy : 0;
  return sim;
}
