#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "triad/dist/process_group.h"

namespace triad::train {

// Timed events of one rank (forward, backward, weight-grad, p2p, optimizer,
// ...), merged across ranks into one Chrome trace (Perfetto,
// chrome://tracing) with every rank a process, and within it rows (threads
// in the format): the trainer's row 0 is the work as the device ran it, and
// on a GPU row 1 the same work as the host queued it.
class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TraceRecorder(Clock::time_point epoch = Clock::now()) : epoch_(epoch) {}
  // Where time 0 of this rank's row is (every event, recorded before or
  // after, is placed from it): the trainer gives every rank one instant, so
  // that the rows line up.
  void set_epoch(Clock::time_point epoch) { epoch_ = epoch; }
  Clock::time_point epoch() const { return epoch_; }
  // Events are kept while enabled (the trainer records its first steps).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void add(const std::string& name, const std::string& category, Clock::time_point start,
           Clock::time_point end, int row = 0);
  size_t size() const { return events_.size(); }
  // A row's name in the trace (rows left unnamed show as their number).
  void set_row_name(int row, const std::string& name) { row_names_[row] = name; }

  // This rank's events as Chrome trace events (one JSON array, pid = rank).
  std::string events_json(int rank) const;
  // Writes the merged trace document of every rank of `world` (null: this
  // rank alone) to `path` on rank 0; the other ranks write nothing. Rank 0
  // takes the ranks' events one rank at a time, point to point, and writes
  // each as it comes, so no rank holds more than its own events and one
  // other rank's (a trace of many ranks is large; gathering it everywhere
  // would hold all of it on every rank). Collective. Throws IoError on rank
  // 0, after taking every rank's events, if the file cannot be written.
  void write_merged_trace(const dist::ProcessGroupPtr& world, const std::string& path) const;

 private:
  struct Event {
    std::string name, category;
    Clock::time_point start, end;
    int row;
  };
  Clock::time_point epoch_;
  bool enabled_ = true;
  std::vector<Event> events_;
  std::map<int, std::string> row_names_;
};

}  // namespace triad::train
