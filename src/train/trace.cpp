#include "triad/train/trace.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "triad/ops/creation.h"

namespace triad::train {

void TraceRecorder::add(const std::string& name, const std::string& category,
                        Clock::time_point start, Clock::time_point end) {
  if (!enabled_) return;
  events_.push_back({name, category, start, end});
}

std::string TraceRecorder::events_json(int rank) const {
  nlohmann::json a = nlohmann::json::array();
  a.push_back({{"name", "process_name"},
               {"ph", "M"},
               {"pid", rank},
               {"args", {{"name", "rank " + std::to_string(rank)}}}});
  const auto us = [&](Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  };
  for (const Event& e : events_) {
    a.push_back({{"name", e.name},
                 {"cat", e.category},
                 {"ph", "X"},
                 {"pid", rank},
                 {"tid", 0},
                 {"ts", us(e.start - epoch_)},
                 {"dur", us(e.end - e.start)}});
  }
  return a.dump();
}

std::string TraceRecorder::merged_trace(const dist::ProcessGroupPtr& world) const {
  const int rank = world ? world->rank() : 0;
  const std::string mine = events_json(rank);
  std::vector<std::string> all{mine};
  if (world && world->size() > 1) {
    // Ship the text as i64 words (8 bytes each); ranks may differ in length.
    const int64_t n = static_cast<int64_t>((mine.size() + 8) / 8);
    Tensor local = zeros({n}, DType::I64);
    std::memcpy(local.raw_data(), mine.data(), mine.size());
    Tensor count = from_vector(std::vector<int64_t>{n}, {1});
    Tensor all_counts = empty({world->size()}, DType::I64);
    world->all_gather(count, all_counts)->wait();
    const int64_t* c = all_counts.data<int64_t>();
    const std::vector<int64_t> words(c, c + world->size());
    int64_t total = 0;
    for (int64_t w : words) total += w;
    Tensor gathered = empty({total}, DType::I64);
    world->all_gather_uneven(local, gathered, words)->wait();
    all.clear();
    const char* base = static_cast<const char*>(gathered.raw_data());
    int64_t off = 0;
    for (int r = 0; r < world->size(); ++r) {
      all.emplace_back(base + off * 8);  // zero-terminated by the padding
      off += c[r];
    }
  }
  nlohmann::json events = nlohmann::json::array();
  for (const auto& text : all) {
    for (auto& e : nlohmann::json::parse(text)) events.push_back(e);
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace triad::train
