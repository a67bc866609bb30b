#pragma once

// NVTX ranges: named spans of host time that Nsight Systems (nsys) draws on
// each thread's timeline above the kernels they launched, so a profile shows
// which step, microbatch and phase a kernel belongs to. Process-wide and off
// by default (the trainer turns them on for log.nvtx, within
// log.profile_steps); while off a range costs one branch. Where the build
// has no NVTX headers (no CUDA toolkit) available() is false and ranges do
// nothing.
#include <string>
#include <type_traits>

namespace triad::nvtx {

// Whether this build emits NVTX ranges (compiled with the CUDA toolkit's
// header-only NVTX 3).
bool available();
void set_enabled(bool on);
bool enabled();

namespace detail {
void push(const char* name);  // nvtxRangePushA on the calling thread
void pop();                   // nvtxRangePop: its innermost range
}  // namespace detail

// A range for the scope. It closes what it opened even when ranges were
// turned off meanwhile.
class Range {
 public:
  explicit Range(const char* name) : open_(enabled()) {
    if (open_) detail::push(name);
  }
  explicit Range(const std::string& name) : Range(name.c_str()) {}
  // The name made only when ranges are on: Range([&] { return "step " + ...; }).
  template <class MakeName>
  requires std::is_invocable_r_v<std::string, MakeName&>
  explicit Range(MakeName&& make_name) : open_(enabled()) {
    if (open_) detail::push(std::string(make_name()).c_str());
  }
  ~Range() {
    if (open_) detail::pop();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool open_;
};

}  // namespace triad::nvtx
