#include "triad/parallel/pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <utility>

#include "triad/core/error.h"

namespace triad::pipeline {
namespace {

double compute_cost(const Schedule& s, const Costs& c, int rank, const Action& a) {
  return c.of(a.compute, s.stage_of(rank, a.chunk), s.p, s.v);
}

bool counterpart(const P2POp& mine, int me, const P2POp& theirs) {
  return theirs.is_send != mine.is_send && theirs.payload == mine.payload &&
         theirs.stage == mine.stage && theirs.microbatch == mine.microbatch && theirs.peer == me;
}

using ConsumerKey = std::tuple<int, int, int>;  // (chunk, microbatch, payload)

// What consumes a received payload on the receiving rank: the forward of the
// next stage (an activation) or the backward of the previous one (a gradient).
ConsumerKey consumer_of(const Schedule& s, const P2POp& o) {
  const int consumer = o.payload == Payload::Activation ? o.stage + 1 : o.stage - 1;
  return ConsumerKey{s.chunk_of(consumer), o.microbatch, static_cast<int>(o.payload)};
}

// The key under which a compute action finds the payload it consumes (W
// consumes none).
bool consumes(const Action& a, ConsumerKey& key) {
  if (a.compute == ComputeKind::BackwardWeight) return false;
  const Payload needs = a.compute == ComputeKind::Forward ? Payload::Activation : Payload::Gradient;
  key = ConsumerKey{a.chunk, a.microbatch, static_cast<int>(needs)};
  return true;
}

// What both event loops record of the compute actions: the timeline, the
// compute time and the peaks of activations held.
class ComputeLedger {
 public:
  ComputeLedger(SimulationResult& res, int p) : res_(res), alive_(p, 0), pending_w_(p, 0) {
    res.timeline.resize(p);
    res.peak_alive.assign(p, 0);
    res.peak_weight_pending.assign(p, 0);
    res.peak_held.assign(p, 0);
    res.compute_time.assign(p, 0.0);
  }
  // Rank r idles until `until` (a box of waiting on its timeline).
  void wait(int r, double& clock, double until) {
    if (until <= clock) return;
    res_.timeline[r].push_back({clock, until, false, ComputeKind::Forward, 0, 0});
    clock = until;
  }
  // Rank r runs `a` for d from `clock`.
  void run(int r, const Action& a, double d, double& clock) {
    auto& peak = res_.peak_alive[r];
    if (a.compute == ComputeKind::Forward) peak = std::max(peak, ++alive_[r]);
    if (a.compute == ComputeKind::Backward || a.compute == ComputeKind::BackwardInput) --alive_[r];
    if (a.compute == ComputeKind::BackwardInput) {
      res_.peak_weight_pending[r] = std::max(res_.peak_weight_pending[r], ++pending_w_[r]);
    }
    if (a.compute == ComputeKind::BackwardWeight) --pending_w_[r];
    res_.peak_held[r] = std::max(res_.peak_held[r], alive_[r] + pending_w_[r]);
    res_.timeline[r].push_back({clock, clock + d, true, a.compute, a.chunk, a.microbatch});
    clock += d;
    res_.compute_time[r] += d;
  }
  // The makespan (the last of `ends`) and the bubble over the busiest rank.
  void finish(const std::vector<double>& ends) {
    res_.makespan = *std::max_element(ends.begin(), ends.end());
    const double ideal = *std::max_element(res_.compute_time.begin(), res_.compute_time.end());
    res_.bubble_fraction = ideal > 0 ? (res_.makespan - ideal) / ideal : 0.0;
  }

 private:
  SimulationResult& res_;
  std::vector<int> alive_, pending_w_;
};

std::string deadlock_error(const Schedule& s, const std::vector<size_t>& pc,
                           const std::string& extra = "") {
  std::string where;
  for (int r = 0; r < s.p; ++r) {
    where +=
        "\n  rank " + std::to_string(r) + ": " +
        (pc[r] < s.ranks[r].size() ? "blocked at " + s.ranks[r][pc[r]].str() : std::string("done"));
  }
  return std::string(schedule_name(s.kind)) + " schedule (p=" + std::to_string(s.p) +
         ", v=" + std::to_string(s.v) + ", m=" + std::to_string(s.m) + ") deadlocks:" + where +
         extra;
}

std::string unconsumed_error(const Schedule& s, int r) {
  return std::string(schedule_name(s.kind)) + " schedule: rank " + std::to_string(r) +
         " receives a payload no action of it consumes";
}

// P2PSemantics::StreamOrdered (per_peer false) and StreamPerPeer: compute
// never waits in a batch; a batch's operations run on the rank's
// communication stream, or each on the stream it keeps for its peer, in
// posting order, and rendezvous there.
SimulationResult simulate_streams(const Schedule& s, const Costs& costs, bool per_peer) {
  const int p = s.p;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  SimulationResult res;
  ComputeLedger ledger(res, p);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  // What of a batch runs on one stream.
  struct Part {
    std::vector<P2POp> ops;
    double post, start;        // start: NaN until it runs on the stream
    std::vector<double> done;  // per op: when it met its counterpart (NaN: not yet)
  };
  struct Stream {
    std::deque<Part> queue;
    double free = 0;  // when the last part to run on it finished
  };
  // Per rank, its streams by peer (-1: the one stream of StreamOrdered).
  std::vector<std::map<int, Stream>> streams(p);
  auto lane = [&](const P2POp& o) { return per_peer ? o.peer : -1; };
  // Payloads received or on their way, by what consumes them -> when their
  // part finished (NaN: not yet).
  std::vector<std::map<ConsumerKey, double>> arriving(p);
  auto busy = [&] {
    for (int r = 0; r < p; ++r) {
      if (pc[r] < s.ranks[r].size()) return true;
      for (const auto& [peer, st] : streams[r]) {
        if (!st.queue.empty()) return true;
      }
    }
    return false;
  };
  auto running = [&](int r, int l) -> Part* {
    auto it = streams[r].find(l);
    return it == streams[r].end() || it->second.queue.empty() ? nullptr : &it->second.queue.front();
  };
  while (busy()) {
    bool progress = false;
    // Compute runs until a payload it consumes has not arrived; batches are
    // queued on the streams as the host reaches them.
    for (int r = 0; r < p; ++r) {
      while (pc[r] < s.ranks[r].size()) {
        const Action& a = s.ranks[r][pc[r]];
        if (!a.is_compute()) {
          std::map<int, std::vector<P2POp>> parts;
          for (const P2POp& o : a.ops) {
            parts[lane(o)].push_back(o);
            if (!o.is_send) arriving[r][consumer_of(s, o)] = nan;
          }
          for (auto& [l, ops] : parts) {
            const size_t n = ops.size();
            streams[r][l].queue.push_back(
                {std::move(ops), clock[r], nan, std::vector<double>(n, nan)});
          }
        } else {
          ConsumerKey key;
          if (consumes(a, key)) {
            auto it = arriving[r].find(key);
            if (it != arriving[r].end()) {
              if (std::isnan(it->second)) break;  // still on its way
              ledger.wait(r, clock[r], it->second);
              arriving[r].erase(it);
            }
          }
          ledger.run(r, a, compute_cost(s, costs, r, a), clock[r]);
        }
        ++pc[r];
        progress = true;
      }
    }
    // The part at the head of each stream starts once posted and once the
    // one before it has finished.
    for (int r = 0; r < p; ++r) {
      for (auto& [l, st] : streams[r]) {
        if (!st.queue.empty() && std::isnan(st.queue.front().start))
          st.queue.front().start = std::max(st.queue.front().post, st.free);
      }
    }
    // Operations meet their counterparts in the peers' running parts.
    for (int r = 0; r < p; ++r) {
      for (auto& [l, st] : streams[r]) {
        if (st.queue.empty()) continue;
        Part& mine = st.queue.front();
        for (size_t i = 0; i < mine.ops.size(); ++i) {
          const int q = mine.ops[i].peer;
          if (!std::isnan(mine.done[i]) || q < 0 || q >= p) continue;
          Part* theirs = running(q, per_peer ? r : -1);
          if (!theirs) continue;
          for (size_t j = 0; j < theirs->ops.size(); ++j) {
            if (std::isnan(theirs->done[j]) && counterpart(mine.ops[i], r, theirs->ops[j])) {
              const double t = std::max(mine.start, theirs->start) + costs.transfer();
              mine.done[i] = theirs->done[j] = t;
              progress = true;
              break;
            }
          }
        }
      }
    }
    // Parts whose operations have all met finish; their payloads arrive.
    for (int r = 0; r < p; ++r) {
      for (auto& [l, st] : streams[r]) {
        if (st.queue.empty()) continue;
        const Part& part = st.queue.front();
        if (std::any_of(part.done.begin(), part.done.end(), [](double t) { return std::isnan(t); }))
          continue;
        double end = part.start;
        for (double t : part.done) end = std::max(end, t);
        for (const P2POp& o : part.ops) {
          if (!o.is_send) arriving[r][consumer_of(s, o)] = end;
        }
        st.free = end;
        st.queue.pop_front();
        progress = true;
      }
    }
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < p; ++r) {
        for (const auto& [l, st] : streams[r]) {
          if (st.queue.empty()) continue;
          Action shown;
          shown.type = Action::Type::P2P;
          shown.ops = st.queue.front().ops;
          stuck += "\n  rank " + std::to_string(r) + "'s stream" +
                   (l < 0 ? std::string() : " to rank " + std::to_string(l)) + " runs " +
                   shown.str();
        }
      }
      throw ValueError(deadlock_error(s, pc, stuck));
    }
  }
  for (int r = 0; r < p; ++r) {
    if (!arriving[r].empty()) throw ValueError(unconsumed_error(s, r));
  }
  std::vector<double> ends(clock);
  for (int r = 0; r < p; ++r) {
    for (const auto& [l, st] : streams[r]) ends[r] = std::max(ends[r], st.free);
  }
  ledger.finish(ends);
  return res;
}

}  // namespace

double Costs::of(ComputeKind kind, int stage, int p, int v) const {
  const char* name = kind == ComputeKind::Forward         ? "forward"
                     : kind == ComputeKind::Backward      ? "backward"
                     : kind == ComputeKind::BackwardInput ? "backward_input"
                                                          : "backward_weight";
  const std::vector<double>& c = kind == ComputeKind::Forward         ? forward
                                 : kind == ComputeKind::Backward      ? backward
                                 : kind == ComputeKind::BackwardInput ? backward_input
                                                                      : backward_weight;
  const size_t n = c.size();
  if (n == 1) return c[0];
  if (n == static_cast<size_t>(p) * static_cast<size_t>(v)) return c.at(static_cast<size_t>(stage));
  if (n == static_cast<size_t>(v)) return c.at(static_cast<size_t>(stage / p));
  throw ValueError(std::string("pipeline costs: ") + name + " has " + std::to_string(n) +
                   " entries; expected 1 (every stage), v = " + std::to_string(v) +
                   " (one per chunk) or p*v = " + std::to_string(p * v) + " (one per stage)");
}

void Costs::check() const {
  auto finite_at_least_zero = [](double value, const std::string& what) {
    if (!(value >= 0) || !std::isfinite(value)) {
      throw ValueError("pipeline costs: " + what + " (" + std::to_string(value) +
                       ") must be a finite number >= 0");
    }
  };
  for (const auto& [name, values] :
       {std::pair<const char*, const std::vector<double>*>{"forward", &forward},
        {"backward", &backward},
        {"backward_input", &backward_input},
        {"backward_weight", &backward_weight}}) {
    for (size_t i = 0; i < values->size(); ++i)
      finite_at_least_zero((*values)[i], std::string(name) + "[" + std::to_string(i) + "]");
  }
  finite_at_least_zero(p2p_latency, "p2p_latency");
  finite_at_least_zero(p2p_bandwidth, "p2p_bandwidth");
  finite_at_least_zero(message_bytes, "message_bytes");
}

SimulationResult simulate(const Schedule& s, const Costs& costs, P2PSemantics semantics) {
  costs.check();
  if (semantics == P2PSemantics::StreamOrdered) return simulate_streams(s, costs, false);
  if (semantics == P2PSemantics::StreamPerPeer) return simulate_streams(s, costs, true);
  const int p = s.p;
  const bool blocking = semantics == P2PSemantics::Blocking;
  const bool at_consumer = semantics == P2PSemantics::WaitAtConsumer;
  SimulationResult res;
  ComputeLedger ledger(res, p);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0), post_time(p, 0.0);
  std::vector<bool> posted(p, false);
  // Per op of each rank's posted batch: time the op completes (NaN: not yet).
  // In AsyncSends mode sends complete at posting.
  std::vector<std::vector<double>> done(p);
  // AsyncSends: sends already posted by ranks that moved on, by (to, op as
  // the receiver sees it) -> post time.
  struct Key {
    int to, from, payload, stage, mb;
    bool operator<(const Key& o) const {
      return std::tie(to, from, payload, stage, mb) <
             std::tie(o.to, o.from, o.payload, o.stage, o.mb);
    }
  };
  std::map<Key, double> outstanding;
  // WaitAtConsumer: receives posted in a batch that was not waited for, per
  // rank, by what consumes them: (chunk, microbatch, payload) -> the receive,
  // its post time and its completion time (NaN: not yet).
  struct Deferred {
    P2POp op;
    double post = 0, done = 0;
  };
  std::vector<std::map<ConsumerKey, Deferred>> deferred(p);
  const double nan = std::numeric_limits<double>::quiet_NaN();

  auto finished = [&] {
    for (int r = 0; r < p; ++r) {
      if (pc[r] < s.ranks[r].size()) return false;
    }
    return true;
  };
  while (!finished()) {
    bool progress = false;
    // Run compute actions up to the next batch that is waited for; post
    // that batch.
    for (int r = 0; r < p; ++r) {
      for (bool more = true; more;) {
        more = false;
        while (pc[r] < s.ranks[r].size() && s.ranks[r][pc[r]].is_compute()) {
          const Action& a = s.ranks[r][pc[r]];
          ConsumerKey key;
          if (consumes(a, key)) {
            auto it = deferred[r].find(key);
            if (it != deferred[r].end()) {
              const double arrives = it->second.done;
              if (std::isnan(arrives)) break;  // its payload is still on the way
              ledger.wait(r, clock[r], arrives);
              deferred[r].erase(it);
            }
          }
          ledger.run(r, a, compute_cost(s, costs, r, a), clock[r]);
          ++pc[r];
          progress = true;
        }
        if (pc[r] < s.ranks[r].size() && !posted[r] && !s.ranks[r][pc[r]].is_compute()) {
          const auto& ops = s.ranks[r][pc[r]].ops;
          const bool receives_only =
              std::none_of(ops.begin(), ops.end(), [](const P2POp& o) { return o.is_send; });
          if (at_consumer && receives_only) {
            for (const P2POp& o : ops) deferred[r][consumer_of(s, o)] = {o, clock[r], nan};
            ++pc[r];
            progress = true;
            more = true;
            continue;
          }
          posted[r] = true;
          post_time[r] = clock[r];
          done[r].assign(ops.size(), nan);
          if (!blocking) {
            for (size_t i = 0; i < ops.size(); ++i) {
              if (!ops[i].is_send) continue;
              outstanding[{ops[i].peer, r, static_cast<int>(ops[i].payload), ops[i].stage,
                           ops[i].microbatch}] = clock[r];
              done[r][i] = clock[r];
            }
          }
          progress = true;
        }
      }
    }
    // Match operations whose counterparts are posted.
    for (int r = 0; r < p; ++r) {
      for (auto& [consumer, d] : deferred[r]) {
        if (!std::isnan(d.done)) continue;
        auto it = outstanding.find(
            {r, d.op.peer, static_cast<int>(d.op.payload), d.op.stage, d.op.microbatch});
        if (it == outstanding.end()) continue;
        d.done = std::max(d.post, it->second) + costs.transfer();
        outstanding.erase(it);
        progress = true;
      }
      if (!posted[r]) continue;
      const auto& ops = s.ranks[r][pc[r]].ops;
      for (size_t i = 0; i < ops.size(); ++i) {
        if (!std::isnan(done[r][i])) continue;
        if (!blocking) {  // a receive against the pool of posted sends
          auto it = outstanding.find(
              {r, ops[i].peer, static_cast<int>(ops[i].payload), ops[i].stage, ops[i].microbatch});
          if (it != outstanding.end()) {
            done[r][i] = std::max(post_time[r], it->second) + costs.transfer();
            outstanding.erase(it);
          }
          continue;
        }
        const int q = ops[i].peer;
        if (q < 0 || q >= p || !posted[q]) continue;
        const auto& theirs = s.ranks[q][pc[q]].ops;
        for (size_t j = 0; j < theirs.size(); ++j) {
          if (std::isnan(done[q][j]) && counterpart(ops[i], r, theirs[j])) {
            const double t = std::max(post_time[r], post_time[q]) + costs.transfer();
            done[r][i] = t;
            done[q][j] = t;
            break;
          }
        }
      }
    }
    // Complete batches whose operations have all completed.
    for (int r = 0; r < p; ++r) {
      if (!posted[r]) continue;
      double end = post_time[r];
      bool all = true;
      for (double t : done[r]) {
        if (std::isnan(t)) {
          all = false;
          break;
        }
        end = std::max(end, t);
      }
      if (!all) continue;
      ledger.wait(r, clock[r], end);
      posted[r] = false;
      ++pc[r];
      progress = true;
    }
    if (!progress) throw ValueError(deadlock_error(s, pc));
  }
  if (!outstanding.empty())
    throw ValueError(std::string(schedule_name(s.kind)) + " schedule: a send was never received");
  for (int r = 0; r < p; ++r) {
    if (!deferred[r].empty()) throw ValueError(unconsumed_error(s, r));
  }
  ledger.finish(clock);
  return res;
}

namespace {

const char* short_name(ComputeKind k) {
  switch (k) {
    case ComputeKind::Forward:
      return "F";
    case ComputeKind::Backward:
      return "B";
    case ComputeKind::BackwardInput:
      return "B";
    case ComputeKind::BackwardWeight:
      return "W";
  }
  return "?";
}

}  // namespace

std::string timeline_chrome_trace(const Schedule& s, const SimulationResult& res) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < s.p; ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", "pipeline rank " + std::to_string(r)}}}});
    for (const auto& e : res.timeline[r]) {
      nlohmann::json ev{{"ph", "X"},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", e.start * 1e6},
                        {"dur", (e.end - e.start) * 1e6}};
      if (e.compute) {
        ev["name"] = std::string(short_name(e.kind)) + std::to_string(e.microbatch);
        ev["cat"] = e.kind == ComputeKind::Forward          ? "forward"
                    : e.kind == ComputeKind::BackwardWeight ? "weight-grad"
                                                            : "backward";
        ev["args"] = {
            {"chunk", e.chunk}, {"stage", s.stage_of(r, e.chunk)}, {"microbatch", e.microbatch}};
      } else {
        ev["name"] = "p2p wait";
        ev["cat"] = "p2p";
      }
      events.push_back(ev);
    }
  }
  nlohmann::json doc{{"traceEvents", events},
                     {"displayTimeUnit", "ms"},
                     {"otherData",
                      {{"schedule", schedule_name(s.kind)},
                       {"p", s.p},
                       {"v", s.v},
                       {"m", s.m},
                       {"makespan", res.makespan},
                       {"bubble_fraction", res.bubble_fraction}}}};
  return doc.dump(1);
}

std::string timeline_svg(const Schedule& s, const SimulationResult& res) {
  const double left = 90, top = 40, row_h = 30, gap = 6, width = 1200;
  const double scale = res.makespan > 0 ? width / res.makespan : 1.0;
  const double height = top + s.p * (row_h + gap) + 70;
  std::ostringstream o;
  char buf[512];
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 20 << "\" height=\""
    << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%g\" y=\"20\" font-size=\"14\">%s schedule: p=%d, v=%d, m=%d &#8212; "
                "bubble %.1f%%, "
                "makespan %.3g</text>\n",
                left, schedule_name(s.kind), s.p, s.v, s.m, 100.0 * res.bubble_fraction,
                res.makespan);
  o << buf;
  for (int r = 0; r < s.p; ++r) {
    const double y = top + r * (row_h + gap);
    std::snprintf(buf, sizeof(buf), "<text x=\"8\" y=\"%g\">device %d</text>\n", y + row_h * 0.65,
                  r);
    o << buf;
    // Idle time shows as the grey background of the row.
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#e6e6e6\"/>\n", left,
                  y, width, row_h);
    o << buf;
    for (const auto& e : res.timeline[r]) {
      if (!e.compute) continue;
      const double x = left + e.start * scale, w = std::max(0.5, (e.end - e.start) * scale);
      const double hue = std::fmod(e.microbatch * 360.0 / std::max(1, std::min(s.m, 12)), 360.0);
      // Forward light, B dark, W mid; later chunks slightly more saturated.
      const double light = e.kind == ComputeKind::Forward          ? 78
                           : e.kind == ComputeKind::BackwardWeight ? 58
                                                                   : 40;
      const double sat = 45 + 40.0 * e.chunk / std::max(1, s.v - 1);
      std::snprintf(
          buf, sizeof(buf),
          "<rect x=\"%.2f\" y=\"%g\" width=\"%.2f\" height=\"%g\" fill=\"hsl(%.0f,%.0f%%,%.0f%%)\" "
          "stroke=\"#333\" stroke-width=\"0.6\"%s><title>%s%d chunk %d (stage %d)</title></rect>\n",
          x, y, w, row_h, hue, sat, light,
          e.kind == ComputeKind::BackwardWeight ? " stroke-dasharray=\"3,2\"" : "",
          short_name(e.kind), e.microbatch, e.chunk, s.stage_of(r, e.chunk));
      o << buf;
      if (w >= 14) {
        std::snprintf(buf, sizeof(buf),
                      "<text x=\"%.2f\" y=\"%g\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n",
                      x + w / 2, y + row_h * 0.65, light < 50 ? "white" : "black", e.microbatch);
        o << buf;
      }
    }
  }
  const double ly = top + s.p * (row_h + gap) + 20;
  std::snprintf(buf, sizeof(buf),
                "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" fill=\"hsl(0,45%%,78%%)\" "
                "stroke=\"#333\"/>"
                "<text x=\"%g\" y=\"%g\">forward</text>"
                "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" fill=\"hsl(0,45%%,40%%)\" "
                "stroke=\"#333\"/>"
                "<text x=\"%g\" y=\"%g\">backward%s</text>"
                "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" fill=\"#e6e6e6\"/>"
                "<text x=\"%g\" y=\"%g\">idle (bubble)</text>\n",
                left, ly, left + 20, ly + 11, left + 100, ly, left + 120, ly + 11,
                s.split_backward ? " (B: input grad; dashed W: weight grad)" : "", left + 420, ly,
                left + 440, ly + 11);
  o << buf;
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%g\" y=\"%g\">numbers are microbatches; colour = microbatch%s</text>\n",
                left, ly + 36, s.v > 1 ? ", saturation = model chunk" : "");
  o << buf << "</svg>\n";
  return o.str();
}

}  // namespace triad::pipeline
