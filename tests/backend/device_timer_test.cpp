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

}  // namespace
}  // namespace triad
