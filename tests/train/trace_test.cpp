#include "triad/train/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/error.h"

namespace triad::train {
namespace {

using std::chrono::microseconds;

// One rank's trace: its row's name, then each event in microseconds from
// the epoch — set after the events were recorded, which places them all
// (the trainer sets it to an instant every rank shares).
TEST(Trace, EventsAreMicrosecondsFromTheEpochSetBeforeOrAfterThem) {
  const TraceRecorder::Clock::time_point t0 = TraceRecorder::Clock::now();
  TraceRecorder trace(t0);
  trace.add("F0", "forward", t0 + microseconds(250), t0 + microseconds(1250));
  trace.set_enabled(false);
  trace.add("B0", "backward", t0 + microseconds(1250), t0 + microseconds(3250));  // (off: kept out)
  trace.set_enabled(true);
  trace.add("optimizer", "optimizer", t0 + microseconds(4000), t0 + microseconds(4500));
  EXPECT_EQ(trace.size(), 2u);
  trace.set_epoch(t0 + microseconds(200));
  testing::TempDir dir;
  trace.write_merged_trace(nullptr, dir.file("trace.json"));
  std::ifstream in(dir.file("trace.json"));
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  const nlohmann::json& events = doc["traceEvents"];
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["ph"], "M");
  EXPECT_EQ(events[0]["args"]["name"], "rank 0");
  EXPECT_EQ(events[1]["name"], "F0");
  EXPECT_EQ(events[1]["cat"], "forward");
  EXPECT_DOUBLE_EQ(events[1]["ts"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(events[1]["dur"].get<double>(), 1000.0);
  EXPECT_EQ(events[2]["name"], "optimizer");
  EXPECT_DOUBLE_EQ(events[2]["ts"].get<double>(), 3800.0);
  EXPECT_DOUBLE_EQ(events[2]["dur"].get<double>(), 500.0);
}

// Rows: an event's row is its thread in the format, and a named row says
// its name in a thread_name record (the trainer's device and host rows on a
// GPU); unnamed rows have none.
TEST(Trace, EventsGoToTheirRowsAndNamedRowsAreNamed) {
  const TraceRecorder::Clock::time_point t0 = TraceRecorder::Clock::now();
  TraceRecorder trace(t0);
  trace.add("F0", "forward", t0, t0 + microseconds(10));
  trace.add("F0", "forward", t0, t0 + microseconds(2), 1);
  trace.set_row_name(1, "host (queueing)");
  testing::TempDir dir;
  trace.write_merged_trace(nullptr, dir.file("trace.json"));
  std::ifstream in(dir.file("trace.json"));
  const nlohmann::json events = nlohmann::json::parse(in)["traceEvents"];
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1]["name"], "thread_name");
  EXPECT_EQ(events[1]["tid"], 1);
  EXPECT_EQ(events[1]["args"]["name"], "host (queueing)");
  EXPECT_EQ(events[2]["tid"], 0);
  EXPECT_DOUBLE_EQ(events[2]["dur"].get<double>(), 10.0);
  EXPECT_EQ(events[3]["tid"], 1);
  EXPECT_DOUBLE_EQ(events[3]["dur"].get<double>(), 2.0);
}

TEST(Trace, AFileThatCannotBeWrittenIsNamed) {
  testing::TempDir dir;
  TraceRecorder trace;
  const std::string path = dir.file("missing/trace.json");
  testing::expect_error<IoError>([&] { trace.write_merged_trace(nullptr, path); },
                                 {"trace", "cannot write", path});
}

}  // namespace
}  // namespace triad::train
