// triad::cuda in a build without the CUDA backend (TRIAD_WITH_CUDA=OFF):
// no devices, and every call that needs one says why it cannot work.
#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad::cuda {
namespace {
[[noreturn]] void absent(const char* what) {
  throw NotSupportedError(std::string("cuda::") + what +
                          ": this build has no CUDA backend (configure with TRIAD_WITH_CUDA=ON)");
}
}  // namespace

bool compiled() {
  return false;
}
int device_count() {
  return 0;
}
bool cudnn_compiled() {
  return false;
}
std::string attention_kernel_unavailable(AttentionKernel, DType, int64_t, int64_t, AttentionHeads,
                                         int) {
  return "this build has no CUDA backend (configure with TRIAD_WITH_CUDA=ON)";
}
bool tune_attention(int, DType, int64_t, int64_t, int64_t, AttentionHeads, AttentionChoice&) {
  absent("tune_attention");
}
void* compute_stream(int) {
  absent("compute_stream");
}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::replay() const {
  absent("Graph::replay");
}
void Graph::check() const {
  absent("Graph::check");
}
std::vector<Tensor> Graph::check_words() const {
  absent("Graph::check_words");
}
void Graph::check(const std::vector<int64_t>&) const {
  absent("Graph::check");
}
void Graph::release() {}
Graph capture(int, const std::function<void()>&) {
  absent("capture");
}
DeviceChecks::DeviceChecks(int) {
  absent("DeviceChecks");
}
DeviceChecks::~DeviceChecks() = default;
void DeviceChecks::close() {}
std::vector<Tensor> DeviceChecks::words() const {
  absent("DeviceChecks::words");
}
void DeviceChecks::check() const {
  absent("DeviceChecks::check");
}
void DeviceChecks::check(const std::vector<int64_t>&) const {
  absent("DeviceChecks::check");
}
size_t device_memory(int) {
  absent("device_memory");
}
void synchronize(int) {
  absent("synchronize");
}
bool stream_idle(int) {
  absent("stream_idle");
}
void* create_timing_event(int) {
  absent("create_timing_event");
}
void destroy_timing_event(void*) {}
void record_timing_event(int, void*) {
  absent("record_timing_event");
}
double elapsed_ms(void*, void*) {
  absent("elapsed_ms");
}
bool timing_event_reached(void*) {
  absent("timing_event_reached");
}
void profiler_start() {
  absent("profiler_start");
}
void profiler_stop() {
  absent("profiler_stop");
}
void order_after_compute(int, void*) {
  absent("order_after_compute");
}
void order_compute_after(int, void*) {
  absent("order_compute_after");
}
AllocatorStats memory_stats(int) {
  absent("memory_stats");
}
void empty_cache(int) {
  absent("empty_cache");
}
void set_op_profiling(bool on) {
  if (on) absent("set_op_profiling");
}
bool op_profiling() {
  return false;
}
std::vector<OpTime> op_profile(int) {
  absent("op_profile");
}
GemmTuning gemm_tuning(int) {
  return {};  // nothing was tuned
}

}  // namespace triad::cuda
