#pragma once

// The CUDA runtime as the rest of Triad sees it (available in builds with
// TRIAD_WITH_CUDA; elsewhere every function reports zero devices or throws
// NotSupportedError). Each device has one compute stream that every kernel
// of the CUDA backend runs on; the communication layer orders its own
// streams against it with the event helpers. Handles are opaque pointers so
// this header needs no CUDA headers.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "triad/core/allocator.h"
#include "triad/core/attention_heads.h"
#include "triad/core/dtype.h"
#include "triad/core/tensor.h"

namespace triad::detail {
struct CaptureChecks;
}  // namespace triad::detail

namespace triad::cuda {

// True when this build has the CUDA backend (TRIAD_WITH_CUDA).
bool compiled();
// True when it also links cuDNN (its fused attention; AttentionKernel::Cudnn).
bool cudnn_compiled();
// Visible devices; 0 without a driver or GPU (never throws).
int device_count();
// The compute stream of `device` (a cudaStream_t), created on first use.
void* compute_stream(int device);
// Waits until everything queued on `device`'s compute stream has run.
void synchronize(int device);
// Whether everything queued on `device`'s compute stream has run (never waits).
bool stream_idle(int device);
// Records an event on `device`'s compute stream and makes `other_stream`
// (a cudaStream_t of the same device) wait for it: work queued there later
// sees every result queued on the compute stream so far.
void order_after_compute(int device, void* other_stream);
// The reverse: the compute stream waits for what is queued on `other_stream`.
void order_compute_after(int device, void* other_stream);
// Events that time work on `device`'s compute stream where it runs, so the
// host need not wait for it (DeviceTimer, backend/device_timer.h):
// create_timing_event makes one (owned by the caller; destroy it with
// destroy_timing_event), record_timing_event records it on the compute
// stream behind everything queued there, and elapsed_ms waits until `end`
// has been reached and returns the milliseconds between two recorded events.
void* create_timing_event(int device);
void destroy_timing_event(void* event);
void record_timing_event(int device, void* event);
double elapsed_ms(void* start, void* end);
// Whether the device has reached `event` (never waits).
bool timing_event_reached(void* event);
// The CUDA profiler's capture range, process-wide: profiling tools attached
// with a capture range (nsys profile --capture-range=cudaProfilerApi)
// record only between a start and the stop after it.
void profiler_start();
void profiler_stop();
// The memory `device` has in all, bytes.
size_t device_memory(int device);
// Statistics of `device`'s caching allocator.
AllocatorStats memory_stats(int device);
// Returns the cached free blocks of `device` to the driver.
void empty_cache(int device);

// CUDA graphs: the work a call queues on a device's compute stream,
// captured once and queued again as one launch. A graph runs on the
// addresses its capture saw: refill its inputs in place between replays,
// and read its outputs after one. Inputs are tensors made before the
// capture: one made during it may share memory with the capture's earlier
// temporaries, which each replay writes after the refill. A tensor made
// before the capture that the graph reads (an input, or what it was
// computed from before it, such as attention's key ranges) may be freed
// while the graph lives: its memory stays the graph's until the graph is
// destroyed, as does every block live when the capture began and freed
// after it, so no other tensor takes it (keep the inputs to refill them).
// Tensors made
// during the capture keep their memory for the graph while it lives (the
// caching allocator holds it, CachingAllocator::begin_capture), whether or
// not the caller keeps them; memory freed during the capture stays held
// too. Moving a Graph is
// cheap; destroying one releases that memory behind its last replay.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Queues the captured work on the device's compute stream, behind what
  // is queued there (never waits). Throws Error on an empty Graph.
  void replay() const;
  // Waits for the last replay and throws ValueError naming the first index
  // it found out of range: token ids and targets on the device, which a
  // capture cannot bring to the host to check, are checked by its kernels
  // (a bad one reads no memory). Returns at once when the capture left
  // nothing to check. Call it before using a replay's results.
  void check() const;
  // The same in two halves, so that a caller reads the checks with its own
  // values in one wait (train.cuda_graph reads them with the gradient
  // norm): check_words() gives one i64 element per check, on the device,
  // each -1 or the position of the first index out of range; check(words)
  // takes their values, read after the replay, and throws as check() does
  // (reading the indices only then). Throws ValueError unless `words` has
  // one value per check.
  std::vector<Tensor> check_words() const;
  void check(const std::vector<int64_t>& words) const;
  bool empty() const { return exec_ == nullptr; }

 private:
  friend Graph capture(int device, const std::function<void()>& record);
  void release();
  int device_ = 0;
  void* exec_ = nullptr;  // cudaGraphExec_t
  uint64_t id_ = 0;       // its blocks in the device's caching allocator
  std::shared_ptr<detail::CaptureChecks> checks_;
};
// Calls `record` with `device`'s compute stream in capture: what it queues
// there becomes the returned Graph instead of running (nothing runs now).
// Throws Error, with nothing of it queued and the stream as before, when
// `record` throws (its error, prefixed) or makes a call that a capture does
// not allow: anything that waits for the device (reading a value back, a
// synchronisation), a copy from or to pageable host memory, a collective
// under the CUDA simulator. Refused while op profiling is on (its events
// would be captured) and while another capture is open on the device.
// Run the same work once before capturing it, as with any CUDA graph:
// what a library sets up on first use (cuDNN's attention plans) may not be
// capturable, and choices made by timing are not made inside a capture (an
// autotuned product first met there runs untimed, timed at its first call
// outside one; `auto` attention over a shape first met there fails the
// capture, naming it). (cuBLASLt's handle
// and workspace are made before the capture begins; blocks the caching
// allocator must ask the device for during it are asked for with the
// thread's capture mode relaxed, which CUDA 13 requires.)
Graph capture(int device, const std::function<void()>& record);

// Index checks left to the device outside a capture, as a capture leaves
// them. While a DeviceChecks is open on this thread for `device`, lookups
// and sums through indices already on that device (embedding's forward and
// backward, index_add_rows) check the indices in their kernels instead of
// reading them to the host, and a mixture of experts padded to its capacity
// (model.moe.pad_to_capacity), or a dropless one, keeps its routing on the
// device: its step
// queues without the host waiting for the device (the trainer opens one
// around each uncaptured step and reads its words with the gradient norm).
// A bad index reads no memory, but what is computed from it is wrong:
// check before using the results. The scope is open from construction
// until close() or destruction, and its words stay readable after it:
// words() and check(words) work as Graph's check_words() and check(words);
// check() reads the words itself (one wait). A capture opened inside the
// scope keeps its own checks. Throws Error when a capture or another
// DeviceChecks is open on this thread.
class DeviceChecks {
 public:
  explicit DeviceChecks(int device);
  ~DeviceChecks();
  DeviceChecks(const DeviceChecks&) = delete;
  DeviceChecks& operator=(const DeviceChecks&) = delete;
  void close();
  std::vector<Tensor> words() const;
  void check() const;
  void check(const std::vector<int64_t>& words) const;

 private:
  std::shared_ptr<detail::CaptureChecks> checks_;
};

// GPU time per backend op, to see where a step goes on a machine whose
// hardware counters cannot be read. While profiling is on, every backend
// call that queues work on a device's compute stream (the outermost, when a
// composed op makes others) is bracketed by two events; op_profile() waits
// for what it reads and returns, per op, the calls and the milliseconds
// between their events since profiling was turned on or last read, most
// time first. (Time between two events also counts a stream that waits for
// the host, so profile a run that keeps the device busy.)
struct OpTime {
  std::string op;
  int64_t calls = 0;
  double ms = 0;
};
void set_op_profiling(bool on);
bool op_profiling();
std::vector<OpTime> op_profile(int device);

// Which causal-attention implementation the CUDA backend runs, process-wide
// (as PyTorch's torch.backends.cuda switches): Triad's SIMT kernels (every
// type, head dims up to 256), its tensor-core kernels (bf16/f16, head dim a
// multiple of 16 whose shared memory the device has; sm_80+) or cuDNN's fused attention (bf16/f16,
// head dim a multiple of 8 up to 256, sm_80+, builds with cuDNN). Auto times Triad's kernels
// (tensor cores where they apply, else SIMT) against cuDNN once per shape (forward + backward) and
// keeps the faster, and runs Triad's where cuDNN cannot; an explicit choice that cannot run a call
// is an error naming why. triad-train sets it from model.attention_kernel. Available in every build
// (no effect without CUDA).
enum class AttentionKernel : uint8_t { Auto, Simt, TensorCore, Cudnn };
void set_attention_kernel(AttentionKernel kernel);
AttentionKernel attention_kernel();
// "auto", "simt", "tensor_core", "cudnn"; ConfigError naming the value otherwise.
AttentionKernel attention_kernel_from_string(const std::string& name);
const char* attention_kernel_name(AttentionKernel kernel);
// Why `kernel` cannot run causal attention on (B, seq_len, d_model) inputs
// of `dtype` with `heads` (query heads, or query and key/value heads) on
// `device`, or "" when it can (Auto always can where CUDA runs).
std::string attention_kernel_unavailable(AttentionKernel kernel, DType dtype, int64_t seq_len,
                                         int64_t d_model, AttentionHeads heads, int device = 0);
// Whether attention's backward must repeat bit for bit (default true).
// Triad's kernels always do; false lets cuDNN's backward accumulate dQ with
// atomics, its faster engine. triad-train sets it from
// model.attention_deterministic.
void set_attention_deterministic(bool deterministic);
bool attention_deterministic();

// Whether the fused add-norm's backward also sums the columns of its input
// gradient for the linear layer whose output was the residual it added (its
// bias gradient: the attention's and the MLP's output projections in GPT-2;
// Backend::layer_norm_backward_into_with_dx_sums), in place of that layer's
// column-sum kernel. It takes a third slice of the kernel's shared memory
// (4 blocks a multiprocessor at C 1024 instead of 6), so it is off (the
// default) until a GPU has timed it. Rows up to 1024 columns.
void set_add_norm_bias_sums(bool enabled);
bool add_norm_bias_sums();

// Whether the LayerNorm and RMSNorm backward keeps each lane's weight and
// bias column sums in registers over the rows it takes, instead of adding
// each row into its warp's slice of shared memory (rows a warp holds whole:
// up to 1024 columns in bf16/f16, 512 in f32). The same order of addition;
// more registers a thread, so fewer blocks and other partial rows (other
// bits than the default's, as deterministic). Off (the default) until a GPU
// has timed it against the shared-memory sums, which ran at about 40% of the
// H200's bandwidth.
void set_norm_backward_register_sums(bool enabled);
bool norm_backward_register_sums();

// How the CUDA backend runs its matrix products, process-wide (as PyTorch's
// torch.backends.cuda.matmul flags). The defaults are the fast ones. Each
// switch turned off takes one of cuBLASLt's liberties out of half-precision
// training, so a run that goes wrong on a GPU (and not on the CPU or the
// simulator) can be narrowed down to one of them without rebuilding. Every
// build (only the CUDA backend reads them).
struct GemmSettings {
  // A linear layer's bias and GELU, and GELU's derivative in its input
  // gradient, in cuBLASLt's epilogues; false: a plain product, then Triad's
  // bias and GELU kernels.
  bool epilogues = true;
  // With `epilogues`: GELU in the MLP's first product's epilogue (with its
  // bias; cuBLASLt's GELU_AUX_BIAS); false: that product with its bias
  // alone, into the pre-activation, then Triad's GELU kernel over it
  // (GELU's derivative stays in the backward product's epilogue). On the
  // H200 the GELU-epilogue products ran at 470-490 TFLOP/s against 620-720
  // for the bias-only ones (GPT-2 350M); whether that gap is more than the
  // GELU kernel's pass takes is for a GPU to time (bench_train_gpu
  // --gelu-apart).
  bool gelu_epilogue = true;
  // With `epilogues`: a linear layer's bias gradient from its weight
  // gradient's GEMM (cuBLASLt's BGRADB: the output gradient's column sums
  // in the epilogue); false (the default): the column-sum kernel after a
  // plain product. On the H200 the epilogue's products were slower than the
  // plain ones by more than the column sums take (GPT-2 350M, a step's 96
  // weight gradients: 17.1 ms against 13.4 + 3.1; docs/benchmarks.md).
  bool bias_grad_epilogue = false;
  // With `epilogues`: the bias gradient of the layer before a GELU (GPT-2's
  // MLP's first) from the next layer's input-gradient GEMM, whose epilogue
  // already applies GELU's derivative (cuBLASLt's DGELU_BGRAD, its sums in
  // f32, or in the gradient's own type where cuBLASLt has no f32 sums for
  // the problem, as a bf16 bias's gradient is under PyTorch's autocast);
  // false (the default until it is timed on a GPU): the column-sum
  // kernel over that gradient. Where cuBLASLt has no such algorithm, or the
  // gradient reaching the layer is not the one the epilogue summed (another
  // use of the activation added to it), the column sums run as before.
  bool dgelu_bias_grad_epilogue = false;
  // true: a bf16/f16 product may add its split-k partial sums in bf16/f16
  // (cuBLASLt's in-place and output-type schemes, as PyTorch's
  // allow_bf16_reduced_precision_reduction allows); false (the default):
  // only in f32, rounded once at the end. On the H200 the half-precision
  // reductions of the head's input gradient (k = the vocabulary) made bf16
  // training of GPT-2 124M drift from f32 within 8 steps; with f32
  // reductions it tracks f32 as the CPU's bf16 does (docs/benchmarks.md).
  bool half_reduced_precision_reduction = false;
  // bf16/f16 products run on the half-precision tensor cores; false: their
  // operands are widened to f32 and the product runs in f32 (no TF32),
  // rounded once: slower, for diagnosis.
  bool half_products = true;
  // Every product is also computed by a plain reference kernel (f32 sums in
  // order over k, the same epilogues) and compared with cuBLASLt's output:
  // a product further from it than its output type allows is recorded
  // (gemm_verification()) and logged, naming its shape, layouts, types and
  // epilogue. Results are unchanged; each product then waits for the GPU and
  // takes a slow second pass: for diagnosis. Starts on when the environment
  // sets TRIAD_VERIFY_GEMMS=1.
  bool verify = false;
  // More than 1: each product's first call asks cuBLASLt's heuristic for up
  // to this many algorithms, times them on that call's operands (the host
  // waits once per distinct problem) and keeps the fastest for the rest of
  // the process; 0 or 1 (the default): the heuristic's first choice. A
  // problem of the same class as one already chosen for (its extents within
  // an eighth of an octave of that one's, all else alike: a mixture's
  // experts' token counts from step to step) takes that algorithm where
  // cuBLASLt accepts it for the problem, neither asked for nor timed. Which
  // algorithm wins may differ between processes, and so may the last bits
  // of a product, so runs repeat bit for bit only without it. Starts at N
  // when the environment sets TRIAD_GEMM_AUTOTUNE=N. gemm_tuning() says
  // what it found.
  int autotune = 0;
  bool operator==(const GemmSettings&) const = default;
};
void set_gemm_settings(const GemmSettings& settings);
GemmSettings gemm_settings();

// How `device`'s products chose their algorithms so far. What
// GemmSettings::autotune found: the problems it timed, in how many another
// algorithm than the heuristic's first won, how many it could not time, and
// one call of each with the heuristic's first choice and with the winner,
// summed. And for every product: the problems that asked cuBLASLt's
// heuristic (queried), and those that took the algorithm of their class
// (reused; see GemmSettings::autotune). All zero without CUDA, or before
// the device's first product.
struct GemmTuning {
  int64_t problems = 0, changed = 0, untimed = 0;
  double first_ms = 0, best_ms = 0;
  int64_t queried = 0, reused = 0;
};
GemmTuning gemm_tuning(int device = 0);

// One verified product (GemmSettings::verify): what it was, and how far its
// output was from the reference, as ||out - ref|| / ||ref|| (relative_error)
// against the tolerance of its output type.
struct GemmCheck {
  std::string problem;  // m, n, k, batch, layouts, types, epilogue, alpha, beta
  double relative_error = 0;
  double tolerance = 0;
  double max_error = 0, max_reference = 0;  // largest |out - ref| and |ref|
  int64_t nonfinite = 0;                    // outputs NaN or infinite where the reference is finite
  bool failed() const { return nonfinite > 0 || !(relative_error <= tolerance); }
};
// What verification has seen since the last reset: products checked and
// failed, products it could not check (f64, or wider than its grid), the
// check nearest its tolerance or furthest past it (worst), and the first
// failure of each distinct problem (at most 32).
struct GemmVerification {
  int64_t checked = 0, failed = 0, unchecked = 0;
  GemmCheck worst;
  std::vector<GemmCheck> failures;
};
GemmVerification gemm_verification();
void reset_gemm_verification();

// Auto's decision for one attention problem: Triad's kernels or cuDNN's,
// and the times (forward + backward, ms) it rests on. Auto makes one per
// problem the first time it meets it, by timing; a decision set here first
// is taken as it is, without timing. A forward under
// autograd::InferenceGuard (evaluation, generation) is never
// differentiated: it takes the training decision for its problem if there
// is one, else a `forward_only` decision timed on the forward alone (which
// training never takes). The trainer times its training shape
// up front, lets the ranks agree on the sums of their times, and keeps the
// decisions in its checkpoints, so that every rank runs the same kernel and
// a resumed run the one it ran before. Process-wide; every build (only the
// CUDA backend reads them).
struct AttentionChoice {
  DType dtype = DType::BF16;
  bool deterministic = true;  // the backward timed is the deterministic one
  int64_t batch = 0, seq_len = 0, d_model = 0, n_head = 0;
  int64_t kv_heads = 0;       // key/value heads (grouped-query attention); 0: n_head
  int64_t window = 0;         // a sliding window of keys alone (AttentionHeads::window); 0: none
  bool forward_only = false;  // for inference: timed (and used) without a backward
  bool cudnn = false;
  double own_ms = 0, cudnn_ms = 0;
  bool same_problem(const AttentionChoice& o) const {
    auto kv = [](const AttentionChoice& c) { return c.kv_heads > 0 ? c.kv_heads : c.n_head; };
    return dtype == o.dtype && deterministic == o.deterministic && batch == o.batch &&
           seq_len == o.seq_len && d_model == o.d_model && n_head == o.n_head &&
           kv(*this) == kv(o) && window == o.window && forward_only == o.forward_only;
  }
};
void set_attention_choice(const AttentionChoice& choice);
// The decision for choice's problem (its dtype, deterministic, sizes and
// forward_only), if one was made; the other fields of the argument are ignored.
bool find_attention_choice(AttentionChoice& choice);
std::vector<AttentionChoice> attention_choices();
void clear_attention_choices();
// Makes Auto's decision for (batch, seq_len, d_model) inputs of `dtype`
// with `heads` (query and key/value heads, soft cap, and a sliding window
// shorter than seq_len as the calls' first keys) on `device` now, on
// scratch inputs, unless it has one already; returns false (and leaves `out` alone) when there is
// nothing to decide: cuDNN cannot run the problem (f32, its head-dim and sequence rules, a build
// without it) or the kernel is not Auto. NotSupportedError without CUDA.
bool tune_attention(int device, DType dtype, int64_t batch, int64_t seq_len, int64_t d_model,
                    AttentionHeads heads, AttentionChoice& out);

}  // namespace triad::cuda
