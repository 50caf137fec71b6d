//===- PipelineSchedule.cpp - Megatron pipeline schedules -----------------===//

#include "tessera/Schedule/PipelineSchedule.h"

#include <algorithm>
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
  }
  return "?";
}

std::string tessera::schedule::validate(const PipelineConfig &c) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (c.pp < 1 || c.vpp < 1 || c.microbatches < 1 || c.layers < 1)
    return "pp, vpp, micro-batches and layers must be positive (pp " + s(c.pp) +
           ", vpp " + s(c.vpp) + ", micro-batches " + s(c.microbatches) +
           ", layers " + s(c.layers) + ")";
  if (c.kind != Kind::Interleaved && c.vpp != 1)
    return "vpp " + s(c.vpp) + " needs the interleaved schedule";
  if (c.kind == Kind::Interleaved) {
    if (c.microbatches % c.pp != 0)
      return "the interleaved schedule needs the number of micro-batches (" +
             s(c.microbatches) + ") to be a multiple of pp (" + s(c.pp) + ")";
    if (!c.stageLayers.empty())
      return "an uneven layer split (pp-layers) cannot be combined with "
             "virtual pipeline stages";
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
           s(c.pp) + " x " + s(c.vpp) + " (give pp-layers for an uneven split)";
  return "";
}

std::vector<LayerPlacement>
tessera::schedule::placeLayers(const PipelineConfig &c) {
  std::vector<LayerPlacement> out;
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
                                       const std::vector<double> &backwardCosts) {
  Simulation sim;
  const int64_t pp = int64_t(ranks.size()), v = c.vpp;
  // Finish time of (forward?, rank, microbatch, chunk), -1 until it ran: a
  // flat table, as the planner simulates thousands of long schedules.
  // The table's extent, from the orders themselves (a step outside
  // [0, m) x [0, v) could not be stored).
  int64_t m = 0, chunks = v;
  for (auto &rs : ranks)
    for (const Step &st : rs.order) {
      if (st.microbatch < 0 || st.chunk < 0) {
        sim.deadlock = "invalid step: microbatch " +
                       std::to_string(st.microbatch) + ", chunk " +
                       std::to_string(st.chunk);
        return sim;
      }
      m = std::max(m, st.microbatch + 1);
      chunks = std::max(chunks, st.chunk + 1);
    }
  struct Done {
    std::vector<double> time;
    int64_t pp, m, v;
    double *find(bool fwd, int64_t r, int64_t mb, int64_t ch) {
      if (r < 0 || r >= pp || mb < 0 || mb >= m || ch < 0 || ch >= v)
        return nullptr;
      double &t = time[size_t(((int64_t(fwd) * pp + r) * m + mb) * v + ch)];
      return t < 0 ? nullptr : &t;
    }
    void set(bool fwd, int64_t r, int64_t mb, int64_t ch, double end) {
      time[size_t(((int64_t(fwd) * pp + r) * m + mb) * v + ch)] = end;
    }
  } done{std::vector<double>(size_t(2 * pp * m * chunks), -1.0), pp, m, chunks};
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> freeAt(size_t(pp), 0.0);
  double busy = 0;
  auto dependency = [&](int64_t r, const Step &s)
      -> std::optional<std::tuple<bool, int64_t, int64_t, int64_t>> {
    if (s.forward) {
      if (r > 0)
        return std::make_tuple(true, r - 1, s.microbatch, s.chunk);
      if (s.chunk > 0)
        return std::make_tuple(true, pp - 1, s.microbatch, s.chunk - 1);
      return std::nullopt;
    }
    if (r < pp - 1)
      return std::make_tuple(false, r + 1, s.microbatch, s.chunk);
    if (s.chunk < v - 1)
      return std::make_tuple(false, int64_t(0), s.microbatch, s.chunk + 1);
    return std::make_tuple(true, r, s.microbatch, s.chunk);
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
        auto [fwd, dr, dm, dc] = *dep;
        double *t = done.find(fwd, dr, dm, dc);
        if (!t)
          continue;
        start = std::max(start, *t);
      }
      if (!s.forward) {
        double *own = done.find(true, r, s.microbatch, s.chunk);
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
                          (s.forward ? "forward" : "backward") +
                          " of microbatch " + std::to_string(s.microbatch) +
                          ", chunk " + std::to_string(s.chunk) + " (step " +
                          std::to_string(next[size_t(r)]) + " of its order)";
        }
      return sim;
    }
    const Step &s = ranks[size_t(best)].order[next[size_t(best)]++];
    size_t stage = size_t(s.chunk * pp + best);
    const std::vector<double> &costs = s.forward ? forwardCosts : backwardCosts;
    if (stage >= costs.size()) {
      sim.deadlock = "no cost given for virtual stage " + std::to_string(stage);
      return sim;
    }
    double cost = costs[stage];
    double end = bestStart + cost;
    busy += cost;
    freeAt[size_t(best)] = end;
    done.set(s.forward, best, s.microbatch, s.chunk, end);
    sim.steps.push_back({best, s, bestStart, end});
    sim.makespan = std::max(sim.makespan, end);
  }
  double idle = sim.makespan * double(pp) - busy;
  sim.bubbleFraction = busy > 0 ? idle / busy : 0;
  return sim;
}
