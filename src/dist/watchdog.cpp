#include "watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "triad/dist/process_group.h"

namespace triad::dist::detail {

Watchdog::Watchdog(std::string group, Hooks hooks, Options options)
    : group_(std::move(group)), hooks_(std::move(hooks)), options_(options) {
  if (!hooks_.terminate) {
    const auto grace = options_.grace;
    hooks_.terminate = [grace](const std::string& message) {
      std::fprintf(stderr,
                   "triad: %s\ntriad: the program did not raise this within %lld ms (it is "
                   "blocked); exiting with status 1\n",
                   message.c_str(), static_cast<long long>(grace.count()));
      std::fflush(stderr);
      std::_Exit(1);
    };
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::function<bool()> done, std::string what,
                     std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;  // the group is aborted: nothing it issues completes
    calls_.push_back(std::make_shared<Call>(
        Call{std::move(done), std::move(what), Clock::now() + timeout, timeout}));
  }
  wake_.notify_all();
}

void Watchdog::check() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) {
    taken_ = true;
    const Failure f = *failure_;
    lock.unlock();
    wake_.notify_all();
    throw_failure(f);
  }
  const std::string oldest = calls_.empty() ? "" : calls_.front()->what;
  lock.unlock();
  const std::string why = hooks_.async_error ? hooks_.async_error() : "";
  if (why.empty()) return;
  const std::string what = oldest.empty() ? "process group '" + group_ + "'" : oldest;
  record({what + " failed: " + why + "; the communicator was aborted", false, Clock::now()});
  check();  // raises what was recorded (this failure, or one found just before)
}

std::string Watchdog::fail(const std::string& what, std::chrono::milliseconds timeout) {
  const Failure f = record({what + " timed out after " + std::to_string(timeout.count()) +
                                " ms; the communicator was aborted",
                            true, Clock::now()});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken_ = true;
  }
  wake_.notify_all();
  return f.message;
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

bool Watchdog::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_ != nullptr;
}

Watchdog::Failure Watchdog::record(Failure f) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return *failure_;
    failure_ = std::make_unique<Failure>(f);
    calls_.clear();
  }
  wake_.notify_all();
  if (hooks_.abort) hooks_.abort();
  return f;
}

void Watchdog::throw_failure(const Failure& f) {
  if (f.timeout) throw TimeoutError(f.message);
  throw Error(f.message);
}

void Watchdog::run() {
  if (hooks_.thread_start) hooks_.thread_start();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (failure_) {
      if (taken_) {
        wake_.wait(lock, [&] { return stop_; });
        continue;
      }
      const auto deadline = failure_->at + options_.grace;
      if (Clock::now() < deadline) {
        wake_.wait_until(lock, deadline, [&] { return stop_ || taken_; });
        continue;
      }
      const std::string message = failure_->message;
      taken_ = true;  // reported here, once
      lock.unlock();
      hooks_.terminate(message);
      lock.lock();
      continue;
    }
    if (calls_.empty()) {
      wake_.wait(lock, [&] { return stop_ || failure_ || !calls_.empty(); });
      continue;
    }
    // Query without the lock: the program's thread keeps issuing meanwhile.
    const std::vector<std::shared_ptr<Call>> calls(calls_.begin(), calls_.end());
    lock.unlock();
    size_t finished = 0;
    while (finished < calls.size() && calls[finished]->done()) ++finished;
    const auto now = Clock::now();
    std::shared_ptr<Call> late;
    for (size_t i = finished; i < calls.size() && !late; ++i) {
      if (now > calls[i]->deadline) late = calls[i];
    }
    const std::string why = hooks_.async_error ? hooks_.async_error() : "";
    lock.lock();
    if (failure_) continue;  // the program's thread found one meanwhile
    // Only this thread removes calls, and watch() appends: the first
    // `finished` are still the ones queried.
    for (size_t i = 0; i < finished; ++i) calls_.pop_front();
    if (!why.empty() || late) {
      Failure f;
      f.at = now;
      if (!why.empty()) {
        const std::string what =
            finished < calls.size() ? calls[finished]->what : "process group '" + group_ + "'";
        f.message = what + " failed: " + why + "; the communicator was aborted";
      } else {
        f.timeout = true;
        f.message = late->what + " timed out after " + std::to_string(late->timeout.count()) +
                    " ms; the communicator was aborted";
      }
      lock.unlock();
      record(std::move(f));
      lock.lock();
      continue;
    }
    wake_.wait_for(lock, options_.poll, [&] { return stop_ || failure_ != nullptr; });
  }
}

}  // namespace triad::dist::detail
