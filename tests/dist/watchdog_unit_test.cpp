// The process-group watchdog (src/dist/watchdog.h) on stand-in calls: what
// it drops, when it fails a group, what the program's thread then raises,
// and that an untaken failure ends the process instead of hanging it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "src/dist/watchdog.h"
#include "triad/dist/process_group.h"

namespace triad::dist::detail {
namespace {

using namespace std::chrono_literals;

// A call the test completes by hand.
struct Flag {
  std::shared_ptr<std::atomic<bool>> set = std::make_shared<std::atomic<bool>>(false);
  std::function<bool()> done() const {
    return [s = set] { return s->load(); };
  }
};

// What the group's hooks saw.
struct Seen {
  std::atomic<int> aborts{0};
  std::atomic<int> terminations{0};
  std::string terminated_with;  // written before terminations is incremented
  std::atomic<std::thread::id> started{};
  std::shared_ptr<std::string> async_error = std::make_shared<std::string>();
  std::mutex async_mutex;
};

Watchdog::Hooks hooks(Seen& seen) {
  Watchdog::Hooks h;
  h.thread_start = [&seen] { seen.started = std::this_thread::get_id(); };
  h.async_error = [&seen] {
    std::lock_guard<std::mutex> lock(seen.async_mutex);
    return *seen.async_error;
  };
  h.abort = [&seen] { ++seen.aborts; };
  h.terminate = [&seen](const std::string& message) {
    seen.terminated_with = message;
    ++seen.terminations;
  };
  return h;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

const Watchdog::Options kFast{std::chrono::milliseconds(1), std::chrono::milliseconds(10000)};

TEST(Watchdog, DropsCallsAsTheyCompleteInIssueOrder) {
  Seen seen;
  Watchdog w("tp", hooks(seen), kFast);
  Flag a, b;
  w.watch(a.done(), "all_reduce a", 60s);
  w.watch(b.done(), "all_reduce b", 60s);
  b.set->store(true);
  // One stream finishes its calls in order: b done before a is not looked at.
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(w.pending(), 2u);
  a.set->store(true);
  EXPECT_TRUE(eventually([&] { return w.pending() == 0; }));
  EXPECT_NO_THROW(w.check());
  EXPECT_FALSE(w.failed());
  EXPECT_EQ(seen.aborts, 0);
  EXPECT_NE(seen.started.load(), std::this_thread::get_id());
  EXPECT_NE(seen.started.load(), std::thread::id{});
}

TEST(Watchdog, ACallPastItsTimeoutAbortsTheGroupAndTheProgramRaisesIt) {
  Seen seen;
  Watchdog w("tp", hooks(seen), kFast);
  Flag done, stuck;
  w.watch(done.done(), "process group 'tp': broadcast of f32 [4]", 60s);
  done.set->store(true);
  w.watch(stuck.done(), "process group 'tp': all_reduce of bf16 [8, 4] with world ranks [0, 1]",
          50ms);
  ASSERT_TRUE(eventually([&] { return w.failed(); }));
  EXPECT_TRUE(eventually([&] { return seen.aborts == 1; }));
  try {
    w.check();
    FAIL() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("all_reduce of bf16 [8, 4] with world ranks [0, 1]"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 50 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("aborted"), std::string::npos) << m;
  }
  // The group stays failed: later calls raise the same, nothing more is
  // watched, and nothing is aborted twice.
  EXPECT_THROW(w.check(), TimeoutError);
  w.watch(Flag{}.done(), "later", 1ms);
  EXPECT_EQ(w.pending(), 0u);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(seen.aborts, 1);
  EXPECT_EQ(seen.terminations, 0);
}

TEST(Watchdog, AnAsynchronousErrorNamesTheOldestPendingCall) {
  Seen seen;
  Watchdog w("dp", hooks(seen), kFast);
  Flag first, second;
  w.watch(first.done(), "reduce_scatter #1", 60s);
  w.watch(second.done(), "reduce_scatter #2", 60s);
  {
    std::lock_guard<std::mutex> lock(seen.async_mutex);
    *seen.async_error = "NCCL error 2 (unhandled system error)";
  }
  // The program's thread finds it as soon as it checks, watchdog or not.
  try {
    w.check();
    FAIL() << "no Error";
  } catch (const TimeoutError&) {
    FAIL() << "an asynchronous error is not a timeout";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("reduce_scatter #1 failed: NCCL error 2 (unhandled system error)"),
              std::string::npos)
        << m;
  }
  EXPECT_TRUE(eventually([&] { return seen.aborts == 1; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(seen.aborts, 1);
}

TEST(Watchdog, AHostWaitThatTimedOutFailsTheGroupLikeTheWatchdog) {
  Seen seen;
  Watchdog w("pp", hooks(seen), kFast);
  w.watch(Flag{}.done(), "batch_isend_irecv", 60s);
  const std::string m = w.fail("batch_isend_irecv", 30ms);
  EXPECT_EQ(m, "batch_isend_irecv timed out after 30 ms; the communicator was aborted");
  EXPECT_EQ(seen.aborts, 1);
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_THROW(w.check(), TimeoutError);
}

TEST(Watchdog, AFailureTheProgramNeverRaisesEndsTheProcess) {
  Seen seen;
  Watchdog w("tp", hooks(seen), {std::chrono::milliseconds(1), std::chrono::milliseconds(50)});
  w.watch(Flag{}.done(), "all_gather of f32 [3]", 20ms);
  // The program is blocked (it never checks): after the grace period the
  // watchdog reports the failure itself, once.
  ASSERT_TRUE(eventually([&] { return seen.terminations == 1; }));
  EXPECT_NE(seen.terminated_with.find("all_gather of f32 [3] timed out after 20 ms"),
            std::string::npos)
      << seen.terminated_with;
  std::this_thread::sleep_for(80ms);
  EXPECT_EQ(seen.terminations, 1);
}

TEST(Watchdog, AFailureTheProgramRaisesInTimeDoesNotEndTheProcess) {
  Seen seen;
  Watchdog w("tp", hooks(seen), {std::chrono::milliseconds(1), std::chrono::milliseconds(300)});
  w.watch(Flag{}.done(), "all_reduce", 10ms);
  ASSERT_TRUE(eventually([&] { return w.failed(); }));
  EXPECT_THROW(w.check(), TimeoutError);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(seen.terminations, 0);
}

TEST(WatchdogDeathTest, ByDefaultAnUntakenFailureExitsWithStatusOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog::Hooks h;  // the default terminate
        Watchdog w("tp", h, {std::chrono::milliseconds(1), std::chrono::milliseconds(20)});
        w.watch([] { return false; }, "process group 'tp': all_reduce of f32 [2]", 10ms);
        std::this_thread::sleep_for(60s);  // blocked for good
      },
      testing::ExitedWithCode(1), "all_reduce of f32 \\[2\\] timed out after 10 ms");
}

}  // namespace
}  // namespace triad::dist::detail
