// cuda_sim's host side: the thread scheduler behind kernel launches, and the
// part of the CUDA runtime API Triad calls, implemented on host memory.
// A launch is validated when it is issued and queued on its stream
// (cuda_api.cpp); its threads run when the stream's queue is run.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "sim.h"

namespace triad_sim {

constinit thread_local Builtins builtins;

// ---- fibers -------------------------------------------------------------------
// A simulated thread switches at every barrier, so switching must be cheap:
// on x86-64 a switch saves the callee-saved registers and the FP control
// words on the old stack and pops them off the new one (no system call);
// elsewhere ucontext does it.
namespace {
#if defined(__x86_64__)
extern "C" void triad_sim_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl triad_sim_switch
  .type triad_sim_switch, @function
triad_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size triad_sim_switch, .-triad_sim_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* sp = nullptr;
};
// Prepares `c` to start `entry` (which never returns) on the given stack.
void make_context(Context& c, void* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack) + bytes;
  top &= ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;  // entry's return address slot: keeps rsp + 8 16-byte aligned
  *--sp = reinterpret_cast<uint64_t>(entry);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  *--sp = (uint64_t{fpcw} << 32) | mxcsr;
  c.sp = sp;
}
void switch_context(Context& from, Context& to) {
  triad_sim_switch(&from.sp, to.sp);
}
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context& c, void* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) {
  swapcontext(&from.uc, &to.uc);
}
#endif
}  // namespace

// ---- scheduler ----------------------------------------------------------------
enum class Wait { Ready, Block, Warp, Done };

struct ThreadState {
  Context context;
  void* stack = nullptr;
  uint3 tid{};
  int linear = 0;
  Wait wait = Wait::Ready;
  unsigned mask = 0;         // lanes of the warp barrier waited at
  const char* what = "";     // the collective waited at
  unsigned char value[8]{};  // a shuffle's deposited value
};

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kMaxThreads = 1024;
constexpr size_t kMaxDynamicShared = 227 * 1024;  // sm_90's opt-in limit
constexpr size_t kDefaultDynamicShared = 48 * 1024;

// TRIAD_SIM_ORDER=reverse runs the blocks of a grid and the threads of a block
// last to first.
Order initial_order() {
  const char* e = std::getenv("TRIAD_SIM_ORDER");
  return e != nullptr && std::string(e) == "reverse" ? Order::Reverse : Order::Forward;
}
Order g_order = initial_order();
Counters g_counters;

// Launches and threads per launch site (file:line), for
// TRIAD_SIM_REPORT=sites. The simulator's time goes by threads.
struct SiteCount {
  int64_t launches = 0, threads = 0;
};
std::map<std::string, SiteCount>& g_sites = *new std::map<std::string, SiteCount>;

// TRIAD_SIM_REPORT=1 prints the counters to stderr at exit (e.g. the host
// waits of a whole training run); TRIAD_SIM_REPORT=sites also prints the
// launches and threads of each launch site, most threads first.
const int g_report_level = [] {
  const char* e = std::getenv("TRIAD_SIM_REPORT");
  if (e == nullptr) return 0;
  return std::string(e) == "1" ? 1 : std::string(e) == "sites" ? 2 : 0;
}();
const bool g_report = [] {
  if (g_report_level == 0) return false;
  std::atexit([] {
    if (g_report_level >= 2) {
      std::vector<std::tuple<int64_t, int64_t, std::string>> sites;
      for (const auto& [site, n] : g_sites) sites.emplace_back(n.threads, n.launches, site);
      std::sort(sites.rbegin(), sites.rend());
      for (const auto& [threads, launches, site] : sites)
        std::fprintf(stderr, "cuda_sim: %12lld threads in %8lld launches at %s\n",
                     static_cast<long long>(threads), static_cast<long long>(launches),
                     site.c_str());
    }
    std::fprintf(
        stderr,
        "cuda_sim: %lld launches, %lld blocks, %lld threads, %lld barriers, %lld host "
        "waits, %lld not-ready queries\n",
        static_cast<long long>(g_counters.launches), static_cast<long long>(g_counters.blocks),
        static_cast<long long>(g_counters.threads), static_cast<long long>(g_counters.barriers),
        static_cast<long long>(g_counters.host_waits),
        static_cast<long long>(g_counters.not_ready_queries));
  });
  return true;
}();
std::mutex& g_attr_mutex = *new std::mutex;  // never destroyed, as the stacks
std::map<const void*, size_t>& g_max_dynamic_shared = *new std::map<const void*, size_t>;

struct Block {
  std::vector<ThreadState> threads;
  std::vector<unsigned char> published;  // per warp: 32 lanes x 8 bytes
  Context scheduler;
  ThreadState* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  ThreadState* failed = nullptr;
  std::vector<unsigned char> shared;
  size_t shared_bytes = 0;
  std::vector<void*> fresh;  // static shared arrays already filled in this block
  // Stacks of this launch's exited threads, which threads not yet started
  // take before a new one is mapped: a kernel without barriers runs all its
  // threads on one stack, warm in the caches.
  std::vector<void*> spare;
  size_t mapped = 0;  // stacks of the pool handed out in this block
};
thread_local Block* g_block = nullptr;
// Stacks are reused across launches and never released: work queued on a
// stream may run during static destruction (a free synchronises the
// device), after this thread's thread_local objects are gone.
thread_local std::vector<void*>* g_stacks = nullptr;

void* stack_for(size_t i) {
  if (g_stacks == nullptr) g_stacks = new std::vector<void*>;
  while (g_stacks->size() <= i) {
    // A guard page below each stack turns an overflow into a fault.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda_sim: cannot map a thread stack");
    mprotect(p, page, PROT_NONE);
    g_stacks->push_back(static_cast<unsigned char*>(p) + page);
  }
  return (*g_stacks)[i];
}

// The lane the scheduler would run after `t` in its warp (the next ready
// one in the scheduling order), or null when the warp has none left this
// round. Threads hand over to it directly, which is the order the
// scheduler's loop runs them in without the switch back to it between.
ThreadState* next_ready(Block& b, const ThreadState& t) {
  const int n = static_cast<int>(b.threads.size());
  const int first = t.linear & ~31;
  const int lanes = std::min(32, n - first);
  if (g_order == Order::Forward) {
    for (int l = t.linear - first + 1; l < lanes; ++l) {
      if (b.threads[first + l].wait == Wait::Ready) return &b.threads[first + l];
    }
  } else {
    for (int l = t.linear - first - 1; l >= 0; --l) {
      if (b.threads[first + l].wait == Wait::Ready) return &b.threads[first + l];
    }
  }
  return nullptr;
}

void thread_entry();

// Gives a thread that has not started a stack: an exited thread's, else the
// pool's next.
void give_stack(Block& b, ThreadState& t) {
  if (b.spare.empty()) {
    t.stack = stack_for(b.mapped++);
  } else {
    t.stack = b.spare.back();
    b.spare.pop_back();
  }
  make_context(t.context, t.stack, kStackBytes, thread_entry);
}

void enter(Block& b, ThreadState& t) {
  builtins.threadIdx = t.tid;
  b.running = &t;
}

// Runs the body for the thread entered, then for each following lane of its
// warp that has not started (on the same stack: the finished thread's frames
// are dead), until a lane yields, throws, or the next ready lane has a stack
// of its own.
void thread_entry() {
  Block& b = *g_block;
  while (true) {
    ThreadState* t = b.running;
    bool threw = false;
    try {
      (*b.body)();
    } catch (...) {
      b.error = std::current_exception();
      b.failed = t;
      threw = true;
    }
    t->wait = Wait::Done;
    ThreadState* next = threw ? nullptr : next_ready(b, *t);
    if (next != nullptr && next->stack == nullptr) {
      next->stack = t->stack;
      enter(b, *next);
      continue;
    }
    // Never resumed: the stack is free once this switch has left it.
    b.spare.push_back(t->stack);
    if (next != nullptr) {
      enter(b, *next);
      switch_context(t->context, next->context);
    } else {
      switch_context(t->context, b.scheduler);
    }
  }
}

std::string where(const ThreadState& t) {
  std::ostringstream s;
  s << "thread (" << t.tid.x << "," << t.tid.y << "," << t.tid.z << ")";
  return s.str();
}

// Yields the running thread back to the scheduler until it is released.
void yield(Wait wait, unsigned mask, const char* what) {
  Block* b = g_block;
  if (b == nullptr || b->running == nullptr) {
    throw std::logic_error(std::string("cuda_sim: ") + what + " called outside a kernel");
  }
  ThreadState* t = b->running;
  t->wait = wait;
  t->mask = mask;
  t->what = what;
  ThreadState* next = next_ready(*b, *t);
  if (next == nullptr) {
    switch_context(t->context, b->scheduler);
  } else {
    if (next->stack == nullptr) give_stack(*b, *next);
    enter(*b, *next);
    switch_context(t->context, next->context);
  }
  // Resumed: whoever switched here restored this thread's builtins.
}

// Releases warp `first / 32` when every lane of its mask waits at the same
// warp collective. False when it cannot move.
bool release_warp(Block& b, int first) {
  const int n = static_cast<int>(b.threads.size());
  const int lanes = std::min(32, n - first);
  unsigned waiting = 0, mask = 0;
  for (int l = 0; l < lanes; ++l) {
    const ThreadState& t = b.threads[first + l];
    if (t.wait == Wait::Warp) {
      waiting |= 1u << l;
      mask = t.mask;
    }
  }
  if (waiting == 0) return false;
  const unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  if ((mask & ~present) != 0) {
    throw std::runtime_error(std::string(b.threads[first].what) +
                             ": the mask names lanes past the end of the block");
  }
  // Every lane of the mask must wait here, naming the same mask.
  if ((waiting & mask) != mask) return false;
  for (int l = 0; l < lanes; ++l) {
    if ((mask >> l & 1u) && b.threads[first + l].mask != mask) return false;
  }
  for (int l = 0; l < lanes; ++l) {
    if (!(mask >> l & 1u)) continue;
    std::memcpy(&b.published[(first + l) * 8], b.threads[first + l].value, 8);
    b.threads[first + l].wait = Wait::Ready;
  }
  ++g_counters.barriers;
  return true;
}

// Releases __syncthreads when every live thread waits there.
bool release_block(Block& b) {
  bool anyone = false;
  for (const auto& t : b.threads) {
    if (t.wait == Wait::Done) continue;
    if (t.wait != Wait::Block) return false;
    anyone = true;
  }
  if (!anyone) return false;
  for (auto& t : b.threads) {
    if (t.wait == Wait::Block) t.wait = Wait::Ready;
  }
  ++g_counters.barriers;
  return true;
}

std::string deadlock_report(const Block& b) {
  std::ostringstream s;
  s << "threads wait at barriers that cannot complete:";
  int shown = 0;
  for (const auto& t : b.threads) {
    if (t.wait == Wait::Done) continue;
    if (shown++ == 6) {
      s << " ...";
      break;
    }
    s << " " << where(t) << " at " << (t.wait == Wait::Block ? "__syncthreads" : t.what);
  }
  int done = 0;
  for (const auto& t : b.threads) done += t.wait == Wait::Done;
  s << " (" << done << " threads exited)";
  return s.str();
}

void run_block(Block& b) {
  const int n = static_cast<int>(b.threads.size());
  for (int i = 0; i < n; ++i) {
    b.threads[i].wait = Wait::Ready;
    b.threads[i].stack = nullptr;  // given one when it first runs
  }
  b.spare.clear();
  b.mapped = 0;
  // Each warp runs ahead as far as it can (through its own collectives) before
  // the next starts, which is a schedule a GPU may pick: a warp that
  // overwrites shared memory another warp has yet to read shows up.
  const int warps = (n + 31) / 32;
  while (true) {
    for (int wk = 0; wk < warps; ++wk) {
      const int first = 32 * (g_order == Order::Forward ? wk : warps - 1 - wk);
      const int lanes = std::min(32, n - first);
      do {
        for (int lk = 0; lk < lanes; ++lk) {
          ThreadState& t = b.threads[first + (g_order == Order::Forward ? lk : lanes - 1 - lk)];
          if (t.wait != Wait::Ready) continue;
          if (t.stack == nullptr) give_stack(b, t);
          enter(b, t);
          // Runs this lane and, handed over lane to lane, the ready ones
          // after it (so the loop finds none of them ready again).
          switch_context(b.scheduler, t.context);
          b.running = nullptr;
          if (b.error) return;
        }
      } while (release_warp(b, first));
    }
    bool live = false;
    for (const auto& t : b.threads) live |= t.wait != Wait::Done;
    if (!live) return;
    if (!release_block(b)) throw std::runtime_error(deadlock_report(b));
  }
}

// ---- faults ----------------------------------------------------------------------
// An invalid access inside a kernel (a guard page, a wild pointer) is reported
// like CUDA's illegal-address error, with the launch site, block and thread,
// then the process dies of the signal as it would have. The handler only
// formats into a fixed buffer and write()s (async-signal-safe); it runs on
// an alternate stack, since the fault may be a fiber's stack overflowing.
thread_local char g_fault_site[512];

void append(char*& at, const char* end, const char* text) {
  while (*text != '\0' && at < end) *at++ = *text++;
}
void append(char*& at, const char* end, unsigned long v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 24);
  while (n > 0 && at < end) *at++ = digits[--n];
}

void on_fault(int sig, siginfo_t* info, void*) {
  if (g_block != nullptr && g_block->running != nullptr) {
    char msg[1024];
    char* at = msg;
    const char* end = msg + sizeof(msg) - 1;
    append(at, end, "cuda_sim: invalid memory access at address 0x");
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (int shift = 60; shift >= 0; shift -= 4) *at++ = "0123456789abcdef"[(addr >> shift) & 15];
    append(at, end, " in the ");
    append(at, end, g_fault_site);
    append(at, end, ", block (");
    const uint3 b = builtins.blockIdx, t = g_block->running->tid;
    append(at, end, b.x), append(at, end, ","), append(at, end, b.y), append(at, end, ",");
    append(at, end, b.z), append(at, end, "), thread ("), append(at, end, t.x);
    append(at, end, ","), append(at, end, t.y), append(at, end, ","), append(at, end, t.z);
    append(at, end, ")\n");
    ssize_t unused = write(STDERR_FILENO, msg, static_cast<size_t>(at - msg));
    (void)unused;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_fault_handler() {
  thread_local bool installed = false;
  if (installed) return;
  installed = true;
  constexpr size_t kAltStack = 64 * 1024;  // never released, as the fiber stacks
  stack_t ss{};
  ss.ss_sp = new char[kAltStack];
  ss.ss_size = kAltStack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

std::string dims(dim3 d) {
  std::ostringstream s;
  s << "(" << d.x << "," << d.y << "," << d.z << ")";
  return s.str();
}

}  // namespace

ThreadState* current() {
  return g_block != nullptr ? g_block->running : nullptr;
}
unsigned char* dynamic_shared_base(size_t align) {
  if (g_block == nullptr) throw std::logic_error("cuda_sim: shared memory outside a kernel");
  if (align == 0 || (align & (align - 1)) != 0 || align > 512) {
    fail("dynamic shared memory: alignment " + std::to_string(align) +
         " is not a power of two up to 512");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(g_block->shared.data());
  const uintptr_t base = (start + 1023) / 1024 * 1024 + align;
  return reinterpret_cast<unsigned char*>(base);
}

int lane_id() {
  ThreadState* t = current();
  if (t == nullptr) throw std::logic_error("cuda_sim: lane_id outside a kernel");
  return t->linear & 31;
}

void check_launch_bounds(unsigned max_threads, unsigned, unsigned) {
  const Builtins& b = builtins;
  const uint64_t threads = uint64_t{b.blockDim.x} * b.blockDim.y * b.blockDim.z;
  if (threads > max_threads) {
    fail("a block of " + std::to_string(threads) + " threads launched for __launch_bounds__(" +
         std::to_string(max_threads) + ")");
  }
}

void fresh_shared(void* array, size_t bytes) {
  if (g_block == nullptr) throw std::logic_error("cuda_sim: shared memory outside a kernel");
  for (void* p : g_block->fresh) {
    if (p == array) return;
  }
  g_block->fresh.push_back(array);
  std::memset(array, 0xFF, bytes);
}

void block_barrier() {
  yield(Wait::Block, 0, "__syncthreads");
}
void warp_barrier(unsigned mask, const char* what) {
  ThreadState* t = current();
  if (t == nullptr) throw std::logic_error(std::string("cuda_sim: ") + what + " outside a kernel");
  if (!(mask >> (t->linear & 31) & 1u)) {
    fail(std::string(what) + ": the calling lane " + std::to_string(t->linear & 31) +
         " is not in its own mask");
  }
  yield(Wait::Warp, mask, what);
}
void warp_exchange(unsigned mask, const void* value, void* out, size_t bytes, int src_lane,
                   const char* what) {
  ThreadState* t = current();
  if (t == nullptr) throw std::logic_error(std::string("cuda_sim: ") + what + " outside a kernel");
  if (!(mask >> src_lane & 1u)) {
    fail(std::string(what) + ": lane " + std::to_string(t->linear & 31) + " reads lane " +
         std::to_string(src_lane) + ", which is not in the mask");
  }
  std::memset(t->value, 0, 8);
  std::memcpy(t->value, value, bytes);
  warp_barrier(mask, what);
  const int warp_first = t->linear & ~31;
  std::memcpy(out, &g_block->published[(warp_first + src_lane) * 8], bytes);
}

unsigned warp_ballot(unsigned mask, bool predicate, const char* what) {
  ThreadState* t = current();
  if (t == nullptr) throw std::logic_error(std::string("cuda_sim: ") + what + " outside a kernel");
  std::memset(t->value, 0, 8);
  t->value[0] = predicate ? 1 : 0;
  warp_barrier(mask, what);
  const int warp_first = t->linear & ~31;
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) {
    if ((mask >> l & 1u) && g_block->published[(warp_first + l) * 8] != 0) bits |= 1u << l;
  }
  return bits;
}

void fail(const std::string& what) {
  throw std::runtime_error(what);
}

void set_order(Order order) {
  g_order = order;
}
namespace {
std::atomic<bool> g_unloading{false};
std::atomic<size_t> g_shared_per_block{227 * 1024};
std::atomic<unsigned> g_grid_yz_limit{65535};
}  // namespace
void set_grid_yz_limit(unsigned blocks) {
  g_grid_yz_limit = blocks;
}
unsigned grid_yz_limit() {
  return g_grid_yz_limit;
}
void set_shared_per_block(size_t bytes) {
  g_shared_per_block = bytes;
}
size_t shared_per_block() {
  return g_shared_per_block;
}
void set_runtime_unloading(bool unloading) {
  g_unloading = unloading;
}
bool runtime_unloading() {
  return g_unloading;
}
Order order() {
  return g_order;
}
Counters counters() {
  return g_counters;
}
void note_host_wait() {
  ++g_counters.host_waits;
}
void note_not_ready_query() {
  ++g_counters.not_ready_queries;
}
void note_event_created() {
  ++g_counters.events_created;
}
namespace {
bool g_profiler_on = false;
}  // namespace
void note_profiler(bool started) {
  ++(started ? g_counters.profiler_starts : g_counters.profiler_stops);
  g_profiler_on = started;
}

namespace {
std::string launch_site(const LaunchConfig& c) {
  return std::string("kernel launched at ") + c.site.file + ":" + std::to_string(c.site.line);
}

// What a GPU refuses at the launch itself (the error cudaGetLastError
// returns right after it).
void validate_launch(const LaunchConfig& c, const void* kernel) {
  const std::string site = launch_site(c);
  if (g_block != nullptr) throw std::logic_error("cuda_sim: a kernel launched from a kernel");
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  auto invalid = [&](const std::string& why) {
    throw std::runtime_error(site + ": invalid launch (" + why + ")");
  };
  if (threads == 0 || threads > kMaxThreads) {
    invalid("block " + dims(c.block) + " has " + std::to_string(threads) +
            " threads; 1..1024 allowed");
  }
  if (c.block.z > 64) invalid("block.z " + std::to_string(c.block.z) + " exceeds 64");
  const unsigned yz = grid_yz_limit();
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.y > yz || c.grid.z > yz) {
    invalid("grid " + dims(c.grid) + " is empty or exceeds " + std::to_string(yz) + " in y or z");
  }
  size_t allowed = kDefaultDynamicShared;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    auto it = g_max_dynamic_shared.find(kernel);
    if (it != g_max_dynamic_shared.end()) allowed = it->second;
  }
  // (A limit played lower after a kernel's was raised: the device's holds.)
  allowed = std::min(allowed, std::max(kDefaultDynamicShared, shared_per_block()));
  if (c.smem > allowed) {
    invalid(std::to_string(c.smem) + " bytes of dynamic shared memory; the kernel allows " +
            std::to_string(allowed) +
            (allowed == kDefaultDynamicShared
                 ? " (cudaFuncAttributeMaxDynamicSharedMemorySize was not raised)"
                 : ""));
  }
}

void execute_grid(const LaunchConfig& c, const std::function<void()>& body) {
  const std::string site = launch_site(c);
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  install_fault_handler();
  std::snprintf(g_fault_site, sizeof(g_fault_site), "%s", site.c_str());
  ++g_counters.launches;
  Block b;
  b.body = &body;
  b.threads.resize(threads);
  b.published.assign(((threads + 31) / 32) * 32 * 8, 0);
  b.shared_bytes = c.smem;
  builtins.blockDim = c.block;
  builtins.gridDim = c.grid;
  g_block = &b;
  struct Reset {
    ~Reset() { g_block = nullptr; }
  } reset;
  // Blocks run one after another, first to last, or last to first in the
  // reverse order: a block that reads what another block of the same launch
  // writes (or two that write one element differently) sees the other's
  // write in one order and not in the other.
  const uint64_t blocks = uint64_t{c.grid.x} * c.grid.y * c.grid.z;
  for (uint64_t n = 0; n < blocks; ++n) {
    const uint64_t linear = g_order == Order::Forward ? n : blocks - 1 - n;
    const auto bx = static_cast<unsigned>(linear % c.grid.x);
    const auto by = static_cast<unsigned>((linear / c.grid.x) % c.grid.y);
    const auto bz = static_cast<unsigned>(linear / (uint64_t{c.grid.x} * c.grid.y));
    builtins.blockIdx = {bx, by, bz};
    // Fresh dynamic shared memory per block, filled with a pattern so
    // a read before any write shows up as garbage, as on the GPU.
    b.shared.assign(c.smem + 2048, 0xFF);
    b.fresh.clear();
    int i = 0;
    for (unsigned z = 0; z < c.block.z; ++z) {
      for (unsigned y = 0; y < c.block.y; ++y) {
        for (unsigned x = 0; x < c.block.x; ++x, ++i) {
          b.threads[i] = ThreadState{};
          b.threads[i].tid = {x, y, z};
          b.threads[i].linear = i;
        }
      }
    }
    try {
      run_block(b);
    } catch (const std::exception& e) {
      throw std::runtime_error(site + ", block " + dims(builtins.blockIdx) + ": " + e.what());
    }
    if (b.error) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(b.error);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      throw std::runtime_error(site + ", block " + dims(builtins.blockIdx) + ", " +
                               where(*b.failed) + ": " + what);
    }
    ++g_counters.blocks;
    g_counters.threads += static_cast<int64_t>(threads);
  }
}
}  // namespace

void launch_grid(const LaunchConfig& config, const void* kernel, std::function<void()> body) {
  validate_launch(config, kernel);
  if (g_profiler_on) ++g_counters.profiled_launches;  // (as issued: what a GPU profiler sees)
  if (g_report_level >= 2) {
    const char* file = config.site.file != nullptr ? config.site.file : "?";
    const char* slash = std::strrchr(file, '/');
    SiteCount& n = g_sites[std::string(slash != nullptr ? slash + 1 : file) + ":" +
                           std::to_string(config.site.line)];
    ++n.launches;
    n.threads += int64_t(config.grid.x) * config.grid.y * config.grid.z * config.block.x *
                 config.block.y * config.block.z;
  }
  enqueue(config.stream, [config, body = std::move(body)] { execute_grid(config, body); });
}

void set_max_dynamic_shared(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  g_max_dynamic_shared[kernel] = bytes;
}

}  // namespace triad_sim
