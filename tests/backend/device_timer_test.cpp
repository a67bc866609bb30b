#include "triad/backend/device_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/expect_error.h"
#include "triad/core/error.h"

namespace triad {
namespace {

using std::chrono::milliseconds;

TEST(DeviceTimer, SumsSpansByCategoryAndForgetsThemOnceRead) {
  DeviceTimer timer(Device::cpu());
  const DeviceTimer::Mark a = timer.mark();
  std::this_thread::sleep_for(milliseconds(30));
  const DeviceTimer::Mark b = timer.mark();
  std::this_thread::sleep_for(milliseconds(10));
  const DeviceTimer::Mark c = timer.mark();
  timer.add("slow", a, b);
  timer.add("fast", b, c);
  timer.add("both", a, b);
  timer.add("both", b, c);
  EXPECT_EQ(timer.marks(), 3u);
  const std::map<std::string, double> read = timer.read();
  ASSERT_EQ(read.size(), 3u);
  EXPECT_GE(read.at("slow"), 0.030);
  EXPECT_GE(read.at("fast"), 0.010);
  EXPECT_GT(read.at("slow"), read.at("fast"));
  EXPECT_DOUBLE_EQ(read.at("both"), read.at("slow") + read.at("fast"));
  // Read once: the next reading starts empty, its marks numbered afresh.
  EXPECT_EQ(timer.marks(), 0u);
  EXPECT_TRUE(timer.read().empty());
  EXPECT_EQ(timer.mark(), 0u);
}

TEST(DeviceTimer, AnEmptySpanTakesNoTime) {
  DeviceTimer timer(Device::cpu());
  const DeviceTimer::Mark a = timer.mark();
  timer.add("nothing", a, a);
  EXPECT_EQ(timer.read().at("nothing"), 0.0);
}

TEST(DeviceTimer, MarksOutsideTheReadingOrBackwardsAreNamed) {
  DeviceTimer timer(Device::cpu());
  const DeviceTimer::Mark a = timer.mark();
  const DeviceTimer::Mark b = timer.mark();
  testing::expect_error<ValueError>([&] { timer.add("late", b, a); },
                                    {"'late'", "marks 1 to 0", "2 marks"});
  testing::expect_error<ValueError>([&] { timer.add("unmade", a, 5); }, {"marks 0 to 5"});
  timer.read();
  // (Marks of an earlier reading are gone.)
  testing::expect_error<ValueError>([&] { timer.add("old", a, b); }, {"0 marks"});
}

// On the CPU a traced span is its marks' host times, placed by the reading
// itself; it counts in no category (add() does that), and untraced,
// trace() keeps nothing.
TEST(DeviceTimer, TracedSpansAreTheirMarksTimesAndCountInNoCategory) {
  DeviceTimer timer(Device::cpu());
  EXPECT_FALSE(timer.tracing());
  const DeviceTimer::Mark a = timer.mark();
  const DeviceTimer::Mark b = timer.mark();
  timer.trace("untraced", "pass", a, b);
  timer.read();
  EXPECT_TRUE(timer.take_traced(true).empty());

  timer.set_tracing(true);
  const auto before = DeviceTimer::Clock::now();
  const DeviceTimer::Mark f = timer.mark();
  std::this_thread::sleep_for(milliseconds(20));
  const DeviceTimer::Mark g = timer.mark();
  timer.add("counted", f, g);
  timer.trace("F0", "forward", f, g);
  timer.trace("whole", "step", f, g);
  EXPECT_TRUE(timer.take_traced().empty());  // (placed by the reading)
  const auto after = DeviceTimer::Clock::now();
  const std::map<std::string, double> read = timer.read();
  ASSERT_EQ(read.size(), 1u);
  const std::vector<DeviceTimer::Traced> placed = timer.take_traced();
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].name, "F0");
  EXPECT_EQ(placed[0].category, "forward");
  EXPECT_EQ(placed[1].name, "whole");
  EXPECT_GE(placed[0].start, before);
  EXPECT_LE(placed[0].end, after);
  EXPECT_DOUBLE_EQ(std::chrono::duration<double>(placed[0].end - placed[0].start).count(),
                   read.at("counted"));
  EXPECT_TRUE(timer.take_traced().empty());  // taken once
  testing::expect_error<ValueError>([&] { timer.trace("stale", "pass", f, g); },
                                    {"trace('stale')", "0 marks"});
}

}  // namespace
}  // namespace triad
