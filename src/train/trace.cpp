#include "triad/train/trace.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "triad/core/error.h"
#include "triad/ops/creation.h"

namespace triad::train {

void TraceRecorder::add(const std::string& name, const std::string& category,
                        Clock::time_point start, Clock::time_point end, int row) {
  if (!enabled_) return;
  events_.push_back({name, category, start, end, row});
}

std::string TraceRecorder::events_json(int rank) const {
  nlohmann::json a = nlohmann::json::array();
  a.push_back({{"name", "process_name"},
               {"ph", "M"},
               {"pid", rank},
               {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const auto& [row, name] : row_names_) {
    a.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"tid", row},
                 {"args", {{"name", name}}}});
  }
  const auto us = [&](Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  };
  for (const Event& e : events_) {
    a.push_back({{"name", e.name},
                 {"cat", e.category},
                 {"ph", "X"},
                 {"pid", rank},
                 {"tid", e.row},
                 {"ts", us(e.start - epoch_)},
                 {"dur", us(e.end - e.start)}});
  }
  return a.dump();
}

void TraceRecorder::write_merged_trace(const dist::ProcessGroupPtr& world,
                                       const std::string& path) const {
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  // The text goes as i64 words (8 bytes each), its length first; ranks
  // differ in length.
  constexpr int kTag = 0x7ace;
  if (rank != 0) {
    const std::string mine = events_json(rank);
    const int64_t n = static_cast<int64_t>((mine.size() + 7) / 8);
    Tensor words = zeros({n}, DType::I64);
    std::memcpy(words.raw_data(), mine.data(), mine.size());
    world->send(from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, {1}), 0, kTag)
        ->wait();
    world->send(words, 0, kTag)->wait();
    return;
  }
  // Rank 0 takes each rank's events in turn and writes them as they come;
  // a file that cannot be written is reported once every rank's are taken
  // (none is left waiting).
  std::ofstream out(path, std::ios::trunc);
  out << "{\"traceEvents\":[";
  for (int r = 0; r < size; ++r) {
    std::string text;
    if (r == 0) {
      text = events_json(0);
    } else {
      Tensor length = empty({1}, DType::I64);
      world->recv(length, r, kTag)->wait();
      const int64_t bytes = length.data<int64_t>()[0];
      Tensor words = empty({(bytes + 7) / 8}, DType::I64);
      world->recv(words, r, kTag)->wait();
      text.assign(static_cast<const char*>(words.raw_data()), static_cast<size_t>(bytes));
    }
    // (Each rank's array holds its row's name at least: never empty.)
    if (r > 0) out << ',';
    out.write(text.data() + 1, static_cast<std::streamsize>(text.size() - 2));
  }
  out << "],\"displayTimeUnit\":\"ms\"}";
  out.flush();
  if (!out) throw IoError("trace: cannot write '" + path + "'");
}

}  // namespace triad::train
