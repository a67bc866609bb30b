#pragma once

// A process group's watchdog: enforces the group's timeout on calls the host
// does not wait for. NCCL calls run on a stream, and Work::wait() only orders
// the compute stream after them, so the host runs on without knowing whether
// they finish; a thread of the watchdog's own polls them (in the order they
// were issued, as one stream completes them) together with the group's
// asynchronous error state. On a timeout or an error it records the failure,
// aborts the group (which ends the stuck calls, so a host blocked on the
// stream returns), and the program's thread raises it at its next call:
// TimeoutError or Error naming the group, the op, the peers and the sizes.
// If the program does not take the failure within a grace period (it is
// blocked for good), the watchdog reports it on stderr and ends the process
// with exit status 1: a failed collective never hangs the job.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace triad::dist::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    // Runs first on the watchdog's thread (e.g. selects the CUDA device).
    std::function<void()> thread_start;
    // Why the group failed asynchronously, or "" while it is healthy. Called
    // from both threads.
    std::function<std::string()> async_error;
    // Ends the group's pending calls; called once, on the first failure.
    std::function<void()> abort;
    // Ends the process after an untaken failure (default: the message on
    // stderr, then exit status 1).
    std::function<void(const std::string&)> terminate;
  };
  struct Options {
    // How often pending calls are looked at (the thread sleeps while there
    // are none).
    std::chrono::milliseconds poll{10};
    // How long the program's thread has to raise a failure before the
    // watchdog ends the process.
    std::chrono::milliseconds grace{10000};
  };

  Watchdog(std::string group, Hooks hooks, Options options);
  Watchdog(std::string group, Hooks hooks) : Watchdog(std::move(group), std::move(hooks), {}) {}
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches a call described by `what` (describe_call's text) until `done`
  // says it completed; `done` runs on the watchdog's thread and owns what
  // it queries. The call fails when it is not done `timeout` after now.
  void watch(std::function<bool()> done, std::string what, std::chrono::milliseconds timeout);

  // On the program's thread: throws the failure the watchdog found, or the
  // one async_error reports now (TimeoutError for a timeout, Error for a
  // failure; every later check throws it again), and returns otherwise.
  void check();

  // Records a failure the program's thread found itself (a host wait that
  // timed out) and aborts the group, as the watchdog would; returns the
  // message to throw.
  std::string fail(const std::string& what, std::chrono::milliseconds timeout);

  // Calls watched and not yet seen done.
  size_t pending() const;
  bool failed() const;

 private:
  struct Call {
    std::function<bool()> done;
    std::string what;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };
  struct Failure {
    std::string message;
    bool timeout = false;
    Clock::time_point at;
  };

  void run();
  // Records `f` unless a failure is recorded already, then aborts the group
  // (outside the lock) when it was the first. Returns the recorded failure.
  Failure record(Failure f);
  [[noreturn]] void throw_failure(const Failure& f);

  std::string group_;
  Hooks hooks_;
  Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Call>> calls_;
  std::unique_ptr<Failure> failure_;
  bool taken_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace triad::dist::detail
