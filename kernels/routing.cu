// A mixture of experts' top-k choice, one thread a token (routing.h). Each
// thread walks its token's scores in expert order and keeps its short
// lists with the host's own insertion (routing_list.h), so the device
// chooses what the CPU chooses (src/backend/expert_choice.cpp).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "device_utils.cuh"
#include "routing.h"
#include "routing_list.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kList = static_cast<int>(kMaxRouteList);

// Neither infinite nor NaN (a NaN fails the comparison).
__device__ __forceinline__ bool finite(double x) {
  return fabs(x) <= DBL_MAX;
}

template <class S, class B>
__global__ void __launch_bounds__(kThreads)
    route_top_k_kernel(const S* scores, const B* bias, int64_t tokens, int E, int K, int G,
                       int open, int counted, int64_t* choice, S* chosen) {
  const int width = E / G;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < tokens;
       n += int64_t(gridDim.x) * blockDim.x) {
    const S* p = scores + n * E;
    int64_t* mine = choice + n * K;
    // What the token chooses by: score plus bias, in f64.
    auto by = [&](int e) {
      return static_cast<double>(p[e]) + (bias ? static_cast<double>(bias[e]) : 0.0);
    };
    bool all_finite = true;
    for (int e = 0; e < E; ++e) all_finite &= finite(by(e));
    if (!all_finite) {
      for (int j = 0; j < K; ++j) {
        mine[j] = -1;
        if (chosen) chosen[n * K + j] = S(0);
      }
      continue;
    }
    double value[kList];
    int top[kList];
    uint64_t kept = ~uint64_t{0};  // bit g: group g is within reach
    if (G > 1) {
      // Each group's score: the sum of its `counted` best, in order from 0.
      double group_score[kList];
      for (int g = 0; g < G; ++g) {
        int held = 0;
        for (int e = g * width; e < (g + 1) * width; ++e)
          insert_best(by(e), e, value, top, held, counted);
        double sum = 0.0;
        for (int j = 0; j < counted; ++j) sum += value[j];
        group_score[g] = sum;
      }
      // Every group but the best `open` is out of reach.
      int held = 0;
      for (int g = 0; g < G; ++g) insert_best(group_score[g], g, value, top, held, open);
      kept = 0;
      for (int j = 0; j < open; ++j) kept |= uint64_t{1} << top[j];
    }
    int held = 0;
    for (int e = 0; e < E; ++e) {
      const double x = (kept >> (e / width)) & 1u ? by(e) : -INFINITY;
      insert_best(x, e, value, top, held, K);
    }
    for (int j = 0; j < K; ++j) {
      mine[j] = top[j];
      if (chosen) chosen[n * K + j] = p[top[j]];
    }
  }
}

constexpr int kSlotThreads = 256;

// The block's inclusive prefix sums of v in shared memory (scan, a slot a
// thread): thread t's, and (scan[kSlotThreads - 1]) the block's total.
__device__ int64_t block_scan(int64_t v, int64_t* scan) {
  const int t = threadIdx.x;
  scan[t] = v;
  __syncthreads();
  for (int offset = 1; offset < kSlotThreads; offset <<= 1) {
    const int64_t add = t >= offset ? scan[t - offset] : 0;
    __syncthreads();
    scan[t] += add;
    __syncthreads();
  }
  return scan[t];
}

// A score as an unsigned key in the same order: f32's 32 bits (their
// order and equalities are those of the f64 values the host ranks), f64's
// 64.
template <class S>
struct OrderKey;
template <>
struct OrderKey<float> {
  using type = uint32_t;
  static constexpr int kBits = 32;
};
template <>
struct OrderKey<double> {
  using type = uint64_t;
  static constexpr int kBits = 64;
};
__device__ __forceinline__ uint32_t order_key(float score) {
  // (-0 equals +0, as the host compares them.)
  const uint32_t bits = __float_as_uint(score == 0.0f ? 0.0f : score);
  return bits >> 31 ? ~bits : bits | (uint32_t{1} << 31);
}
__device__ __forceinline__ uint64_t order_key(double score) {
  const auto bits = static_cast<uint64_t>(__double_as_longlong(score == 0.0 ? 0.0 : score));
  return bits >> 63 ? ~bits : bits | (uint64_t{1} << 63);
}

// What an expert's block reads: entry i of `count` is one of its
// assignments (that assignment's index) or -1.
struct EveryAssignment {  // all of them, each read by every expert's block
  const int64_t* choice;
  int e;
  __device__ int64_t operator()(int64_t i) const { return choice[i] == e ? i : -1; }
};
struct ListedAssignments {  // the expert's own, listed in token order
  const int64_t* list;
  __device__ int64_t operator()(int64_t i) const { return list[i]; }
};

// Block e keeps `capacity` of its `load` assignments (entries, in token
// order) in its slots. Within its capacity, or without scores to rank by,
// it keeps them in token order; over it, with scores, it keeps the
// `capacity` highest (equal ones the earlier assignments'): the
// capacity-th highest score's key found a byte at a time from the top (a
// radix select: each pass counts the keys that share the bytes found so
// far by their next byte, in shared memory), then kept in token order. A
// scan of each window's flags in shared memory places each kept one after
// those before it. Then the empty slots: token 0 under the padding's gate
// (assignment A).
template <class S, class Entries>
__device__ void keep_in_slots(const Entries& entry, int64_t count, int64_t load, const S* scores,
                              int64_t A, int K, int64_t capacity, int64_t* token,
                              int64_t* assignment, int64_t* scan, uint32_t* histogram,
                              int64_t* digit_and_need) {
  using Key = typename OrderKey<S>::type;
  const int t = threadIdx.x;
  const bool ranked = scores != nullptr && load > capacity;
  // Over capacity and ranked: the capacity-th highest key (`bar`), and how
  // many of those equal to it make the cut (`equal_kept`).
  Key bar = 0;
  int64_t equal_kept = capacity;
  if (ranked) {
    for (int shift = OrderKey<S>::kBits - 8; shift >= 0; shift -= 8) {
      histogram[t] = 0;  // (kSlotThreads == 256)
      __syncthreads();
      // (The bytes above `shift` found so far; none on the first pass.)
      const int above = shift + 8;
      for (int64_t i = t; i < count; i += kSlotThreads) {
        const int64_t a = entry(i);
        if (a < 0) continue;
        const Key key = order_key(scores[a]);
        if (above < OrderKey<S>::kBits && (key >> above) != (bar >> above)) continue;
        atomicAdd(&histogram[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (t == 0) {
        // From the top byte down, the one whose keys hold the need-th.
        int64_t before = 0;
        int digit = 0;
        for (int d = 255; d >= 0; --d) {
          if (before + histogram[d] >= equal_kept) {
            digit = d;
            break;
          }
          before += histogram[d];
        }
        digit_and_need[0] = digit;
        digit_and_need[1] = equal_kept - before;
      }
      __syncthreads();
      bar |= static_cast<Key>(digit_and_need[0]) << shift;
      equal_kept = digit_and_need[1];
      __syncthreads();  // (the next pass clears the histogram)
    }
  }
  int64_t kept_before = 0, equal_before = 0;
  for (int64_t start = 0; start < count; start += kSlotThreads) {
    const int64_t i = start + t;
    const int64_t a = i < count ? entry(i) : -1;
    const bool mine = a >= 0;
    int64_t keep = mine ? 1 : 0;
    if (ranked) {
      const Key key = mine ? order_key(scores[a]) : 0;
      const int64_t equal = mine && key == bar ? 1 : 0;
      const int64_t equal_rank = equal_before + block_scan(equal, scan) - equal;
      equal_before += scan[kSlotThreads - 1];
      __syncthreads();  // (the next scan writes scan)
      keep = mine && (key > bar || (equal && equal_rank < equal_kept)) ? 1 : 0;
    }
    const int64_t place = kept_before + block_scan(keep, scan) - keep;
    if (keep && place < capacity) {
      token[place] = a / K;
      assignment[place] = a;
    }
    kept_before += scan[kSlotThreads - 1];
    __syncthreads();
  }
  for (int64_t place = min(kept_before, capacity) + t; place < capacity; place += kSlotThreads) {
    token[place] = 0;
    assignment[place] = A;
  }
}

// A few experts: block e reads every assignment, counting its own, then
// keeps them (keep_in_slots), counts each group's, and (every block a
// share) writes the picked indices.
template <class S>
__global__ void __launch_bounds__(kSlotThreads)
    capacity_slots_kernel(const int64_t* choice, const S* scores, int64_t A, int K, int E,
                          int64_t capacity, int64_t group_assignments, int64_t* slot_token,
                          int64_t* slot_assignment, int64_t* picked, int64_t* counts) {
  __shared__ int64_t scan[kSlotThreads];
  __shared__ int64_t scratch[32];
  __shared__ uint32_t histogram[256];
  __shared__ int64_t digit_and_need[2];
  const int e = blockIdx.x, t = threadIdx.x;
  int64_t load = 0;
  for (int64_t a = t; a < A; a += kSlotThreads) load += choice[a] == e ? 1 : 0;
  load = block_sum(load, scratch);
  keep_in_slots(EveryAssignment{choice, e}, A, load, scores, A, K, capacity,
                slot_token + e * capacity, slot_assignment + e * capacity, scan, histogram,
                digit_and_need);
  for (int64_t g = 0; g * group_assignments < A; ++g) {
    int64_t count = 0;
    for (int64_t a = g * group_assignments + t; a < (g + 1) * group_assignments; a += kSlotThreads)
      count += choice[a] == e ? 1 : 0;
    count = block_sum(count, scratch);
    if (t == 0) counts[g * E + e] = count;
  }
  const int64_t N = A / K;
  for (int64_t a = int64_t(blockIdx.x) * kSlotThreads + t; a < A;
       a += int64_t(gridDim.x) * kSlotThreads) {
    const int64_t c = choice[a];
    picked[a] = c >= 0 && c < E ? (a / K) * E + c : N * E;
  }
}

// Many experts: every block reading every assignment would grow as E x A.
// Instead the assignments are first listed by expert, each expert's in
// token order (a counting sort: each chunk of `chunk` assignments, a
// thread's, counts its own per expert; a scan per expert places the
// chunks, one over the experts places the lists; each chunk's thread then
// writes its assignments in order), and each expert's block reads its own
// list: work in A, plus E x chunks for the counts.
constexpr int kChunkThreads = 128;

// Chunk c's counts per expert (at[e * chunks + c]) and its picked indices.
__global__ void __launch_bounds__(kChunkThreads)
    list_count_kernel(const int64_t* choice, int64_t A, int K, int E, int64_t chunk, int64_t chunks,
                      int64_t* at, int64_t* picked) {
  const int64_t N = A / K;
  for (int64_t c = int64_t(blockIdx.x) * kChunkThreads + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * kChunkThreads) {
    for (int e = 0; e < E; ++e) at[e * chunks + c] = 0;
    const int64_t end = min(A, (c + 1) * chunk);
    for (int64_t a = c * chunk; a < end; ++a) {
      const int64_t e = choice[a];
      const bool valid = e >= 0 && e < E;
      picked[a] = valid ? (a / K) * E + e : N * E;
      if (valid) ++at[e * chunks + c];
    }
  }
}

// v[0, n) into its exclusive prefix sums, in place, by the whole block (a
// window of kSlotThreads at a time); returns their total.
__device__ int64_t scan_in_place(int64_t* v, int64_t n, int64_t* scan) {
  const int t = threadIdx.x;
  int64_t before = 0;
  for (int64_t start = 0; start < n; start += kSlotThreads) {
    const int64_t i = start + t;
    const int64_t x = i < n ? v[i] : 0;
    const int64_t inclusive = block_scan(x, scan);
    if (i < n) v[i] = before + inclusive - x;
    before += scan[kSlotThreads - 1];
    __syncthreads();
  }
  return before;
}

// Block e: its chunks' counts into each chunk's start in its list, and its
// load (base[e]).
__global__ void __launch_bounds__(kSlotThreads)
    list_offsets_kernel(int64_t chunks, int64_t* at, int64_t* base) {
  __shared__ int64_t scan[kSlotThreads];
  const int e = blockIdx.x;
  const int64_t load = scan_in_place(at + e * chunks, chunks, scan);
  if (threadIdx.x == 0) base[e] = load;
}

// One block: the experts' loads (base[e]) into each list's start, and the
// lists' end (base[E]).
__global__ void __launch_bounds__(kSlotThreads) list_bases_kernel(int E, int64_t* base) {
  __shared__ int64_t scan[kSlotThreads];
  const int64_t end = scan_in_place(base, E, scan);
  if (threadIdx.x == 0) base[E] = end;
}

// Chunk c's assignments, in order, each into its expert's list.
__global__ void __launch_bounds__(kChunkThreads)
    list_fill_kernel(const int64_t* choice, int64_t A, int E, int64_t chunk, int64_t chunks,
                     const int64_t* base, int64_t* at, int64_t* list) {
  for (int64_t c = int64_t(blockIdx.x) * kChunkThreads + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * kChunkThreads) {
    const int64_t end = min(A, (c + 1) * chunk);
    for (int64_t a = c * chunk; a < end; ++a) {
      const int64_t e = choice[a];
      if (e >= 0 && e < E) list[base[e] + at[e * chunks + c]++] = a;
    }
  }
}

// Expert e's listed assignments (`load` of them, in token order) counted by
// group into counts (g, e), by the whole block: a group's assignments are
// a run of the list, whose first entry subtracts its place and whose last
// adds the place after it (two passes, so no count has two writers at
// once).
__device__ void count_listed(const int64_t* mine, int64_t load, int64_t A,
                             int64_t group_assignments, int e, int E, int64_t* counts) {
  const int t = threadIdx.x;
  const int64_t groups = A / group_assignments;
  for (int64_t g = t; g < groups; g += kSlotThreads) counts[g * E + e] = 0;
  __syncthreads();
  auto group_of = [&](int64_t i) { return mine[i] / group_assignments; };
  for (int64_t i = t; i < load; i += kSlotThreads)
    if (i == 0 || group_of(i - 1) != group_of(i)) counts[group_of(i) * E + e] -= i;
  __syncthreads();
  for (int64_t i = t; i < load; i += kSlotThreads)
    if (i + 1 == load || group_of(i + 1) != group_of(i)) counts[group_of(i) * E + e] += i + 1;
}

// Block e keeps its listed assignments in its slots (keep_in_slots), and
// counts each group's (count_listed).
template <class S>
__global__ void __launch_bounds__(kSlotThreads)
    listed_slots_kernel(const int64_t* list, const int64_t* base, const S* scores, int64_t A, int K,
                        int E, int64_t capacity, int64_t group_assignments, int64_t* slot_token,
                        int64_t* slot_assignment, int64_t* counts) {
  __shared__ int64_t scan[kSlotThreads];
  __shared__ uint32_t histogram[256];
  __shared__ int64_t digit_and_need[2];
  const int e = blockIdx.x;
  const int64_t* mine = list + base[e];
  const int64_t load = base[e + 1] - base[e];
  keep_in_slots(ListedAssignments{mine}, load, load, scores, A, K, capacity,
                slot_token + e * capacity, slot_assignment + e * capacity, scan, histogram,
                digit_and_need);
  count_listed(mine, load, A, group_assignments, e, E, counts);
}

// Block e: its rows' tokens, and its listed assignments (`load` of them,
// in token order) counted by group into counts (g, e).
__global__ void __launch_bounds__(kSlotThreads)
    dropless_rows_kernel(const int64_t* base, int64_t A, int K, int E, int64_t group_assignments,
                         int64_t* row_token, int64_t* row_assignment, int64_t* counts) {
  const int e = blockIdx.x, t = threadIdx.x;
  const int64_t* mine = row_assignment + base[e];
  const int64_t load = base[e + 1] - base[e];
  for (int64_t i = t; i < load; i += kSlotThreads) row_token[base[e] + i] = mine[i] / K;
  // The last block also fills the rows no expert took (tokens that could
  // not choose): token 0, the padding's assignment.
  if (e == E - 1) {
    for (int64_t r = base[E] + t; r < A; r += kSlotThreads) {
      row_token[r] = 0;
      row_assignment[r] = A;
    }
  }
  count_listed(mine, load, A, group_assignments, e, E, counts);
}

bool is_float(ScalarType t) {
  return t == ScalarType::F32 || t == ScalarType::F64;
}

}  // namespace

Status check_route_top_k(ScalarType scores, ScalarType bias, const RouteShape& s) {
  if (!is_float(scores) || !is_float(bias)) {
    return Status::fail(std::string("scores ") + scalar_name(scores) + " and bias " +
                        scalar_name(bias) + " (expected f32 or f64)");
  }
  const int64_t E = s.experts, k = s.top_k, G = s.groups;
  if (s.tokens < 0 || E < 1 || E > (int64_t{1} << 30) || k < 1 || k > E) {
    return Status::fail("top_k " + std::to_string(k) + " of " + std::to_string(E) +
                        " experts for " + std::to_string(s.tokens) +
                        " tokens (expected 1 <= top_k <= experts <= 2^30)");
  }
  const int64_t width = G > 0 ? E / G : 0;
  if (G < 1 || E % G != 0 || s.top_groups < 1 || s.top_groups > G || k > s.top_groups * width ||
      s.group_best < 1) {
    return Status::fail("top_k " + std::to_string(k) + " within the best " +
                        std::to_string(s.top_groups) + " of " + std::to_string(G) + " groups of " +
                        std::to_string(E) + " experts, each scored by its " +
                        std::to_string(s.group_best) + " best (expected a rule that can choose)");
  }
  if (k > kMaxRouteList || G > kMaxRouteList || std::min(s.group_best, width) > kMaxRouteList) {
    return Status::fail("top_k " + std::to_string(k) + ", " + std::to_string(G) +
                        " groups scored by their " + std::to_string(s.group_best) +
                        " best (the kernel keeps lists of at most " +
                        std::to_string(kMaxRouteList) + ")");
  }
  return Status::fine();
}

void route_top_k(const void* scores, ScalarType scores_type, const void* bias, ScalarType bias_type,
                 const RouteShape& s, int64_t* choice, void* chosen, cudaStream_t stream) {
  require(check_route_top_k(scores_type, bias_type, s), "route_top_k");
  if (s.tokens == 0) return;
  const int E = static_cast<int>(s.experts), K = static_cast<int>(s.top_k),
            G = static_cast<int>(s.groups), open = static_cast<int>(s.top_groups),
            counted = static_cast<int>(std::min(s.group_best, s.experts / s.groups));
  const unsigned blocks = grid_for(s.tokens, kThreads);
  auto run = [&](auto score_tag, auto bias_tag) {
    using S = decltype(score_tag);
    using B = decltype(bias_tag);
    route_top_k_kernel<S, B><<<blocks, kThreads, 0, stream>>>(
        static_cast<const S*>(scores), static_cast<const B*>(bias), s.tokens, E, K, G, open,
        counted, choice, static_cast<S*>(chosen));
  };
  const bool s64 = scores_type == ScalarType::F64, b64 = bias_type == ScalarType::F64;
  if (s64 && b64) run(double{}, double{});
  if (s64 && !b64) run(double{}, float{});
  if (!s64 && b64) run(float{}, double{});
  if (!s64 && !b64) run(float{}, float{});
  check_launch("route_top_k");
}

Status check_capacity_slots(const CapacityShape& s) {
  if (s.tokens < 0 || s.top_k < 1 || s.experts < 1 || s.experts > (int64_t{1} << 30) ||
      s.capacity < 1 || s.group < 1 || s.tokens % s.group != 0) {
    return Status::fail("capacity " + std::to_string(s.capacity) + " for " +
                        std::to_string(s.experts) + " experts, top_k " + std::to_string(s.top_k) +
                        ", " + std::to_string(s.tokens) + " tokens in groups of " +
                        std::to_string(s.group) +
                        " (expected capacity, experts (at most 2^30) and top_k >= 1, and groups "
                        "that divide the tokens)");
  }
  return Status::fine();
}

namespace {

// The counting sort's chunks for any number of experts: at least 32
// assignments each, more when E x chunks would pass 2^21 counts (16 MiB).
CapacityLists capacity_lists_of(const CapacityShape& s) {
  CapacityLists l;
  const int64_t A = s.tokens * s.top_k;
  l.chunk = std::max<int64_t>(32, (A * s.experts + (int64_t{1} << 21) - 1) >> 21);
  l.chunks = (A + l.chunk - 1) / l.chunk;
  l.bytes = static_cast<size_t>(s.experts * l.chunks + s.experts + 1 + A) * sizeof(int64_t);
  return l;
}

}  // namespace

CapacityLists capacity_lists(const CapacityShape& s) {
  if (s.experts < kListedExperts) return {};
  return capacity_lists_of(s);
}

void capacity_slots(const int64_t* choice, const void* scores, ScalarType scores_type,
                    const CapacityShape& s, int64_t* slot_token, int64_t* slot_assignment,
                    int64_t* picked, int64_t* counts, void* workspace, cudaStream_t stream) {
  require(check_capacity_slots(s), "capacity_slots");
  if (scores && !is_float(scores_type)) {
    require(
        Status::fail(std::string("scores ") + scalar_name(scores_type) + " (expected f32 or f64)"),
        "capacity_slots");
  }
  const CapacityLists lists = capacity_lists(s);
  if (lists.bytes > 0 && workspace == nullptr) {
    require(Status::fail(std::to_string(s.experts) + " experts need a workspace of " +
                         std::to_string(lists.bytes) + " bytes (capacity_lists)"),
            "capacity_slots");
  }
  const int64_t A = s.tokens * s.top_k;
  const int K = static_cast<int>(s.top_k), E = static_cast<int>(s.experts);
  const unsigned experts = static_cast<unsigned>(s.experts);
  int64_t *at = nullptr, *base = nullptr, *list = nullptr;
  if (lists.bytes > 0) {
    at = static_cast<int64_t*>(workspace);
    base = at + s.experts * lists.chunks;
    list = base + s.experts + 1;
    const unsigned chunk_blocks = grid_for(lists.chunks, kChunkThreads);
    if (lists.chunks > 0) {
      list_count_kernel<<<chunk_blocks, kChunkThreads, 0, stream>>>(choice, A, K, E, lists.chunk,
                                                                    lists.chunks, at, picked);
    }
    list_offsets_kernel<<<experts, kSlotThreads, 0, stream>>>(lists.chunks, at, base);
    list_bases_kernel<<<1, kSlotThreads, 0, stream>>>(E, base);
    if (lists.chunks > 0) {
      list_fill_kernel<<<chunk_blocks, kChunkThreads, 0, stream>>>(choice, A, E, lists.chunk,
                                                                   lists.chunks, base, at, list);
    }
  }
  auto run = [&](auto tag) {
    using S = decltype(tag);
    if (lists.bytes > 0) {
      listed_slots_kernel<S><<<experts, kSlotThreads, 0, stream>>>(
          list, base, static_cast<const S*>(scores), A, K, E, s.capacity, s.group * s.top_k,
          slot_token, slot_assignment, counts);
    } else {
      capacity_slots_kernel<S><<<experts, kSlotThreads, 0, stream>>>(
          choice, static_cast<const S*>(scores), A, K, E, s.capacity, s.group * s.top_k, slot_token,
          slot_assignment, picked, counts);
    }
  };
  if (scores && scores_type == ScalarType::F64) {
    run(double{});
  } else {
    run(float{});
  }
  check_launch("capacity_slots");
}

Status check_dropless_rows(const DroplessShape& s) {
  if (s.tokens < 0 || s.top_k < 1 || s.experts < 1 || s.experts > (int64_t{1} << 30) ||
      s.group < 1 || s.tokens % s.group != 0) {
    return Status::fail(std::to_string(s.experts) + " experts, top_k " + std::to_string(s.top_k) +
                        ", " + std::to_string(s.tokens) + " tokens in groups of " +
                        std::to_string(s.group) +
                        " (expected experts (at most 2^30) and top_k >= 1, and groups that "
                        "divide the tokens)");
  }
  return Status::fine();
}

size_t dropless_workspace(const DroplessShape& s) {
  const CapacityShape c{s.tokens, s.experts, s.top_k, 1, s.group};
  const CapacityLists lists = capacity_lists_of(c);
  return static_cast<size_t>(s.experts * lists.chunks) * sizeof(int64_t);
}

void dropless_rows(const int64_t* choice, const DroplessShape& s, int64_t* row_token,
                   int64_t* row_assignment, int64_t* offsets, int64_t* picked, int64_t* counts,
                   void* workspace, cudaStream_t stream) {
  require(check_dropless_rows(s), "dropless_rows");
  const CapacityLists lists = capacity_lists_of({s.tokens, s.experts, s.top_k, 1, s.group});
  if (lists.chunks > 0 && workspace == nullptr) {
    require(Status::fail("a workspace of " + std::to_string(dropless_workspace(s)) +
                         " bytes is needed (dropless_workspace)"),
            "dropless_rows");
  }
  const int64_t A = s.tokens * s.top_k;
  const int K = static_cast<int>(s.top_k), E = static_cast<int>(s.experts);
  // The lists of capacity_slots' many experts, written straight into the
  // rows: offsets are the lists' starts, row_assignment the lists.
  int64_t* at = static_cast<int64_t*>(workspace);
  const unsigned chunk_blocks = grid_for(lists.chunks, kChunkThreads);
  if (lists.chunks > 0) {
    list_count_kernel<<<chunk_blocks, kChunkThreads, 0, stream>>>(choice, A, K, E, lists.chunk,
                                                                  lists.chunks, at, picked);
  }
  list_offsets_kernel<<<static_cast<unsigned>(E), kSlotThreads, 0, stream>>>(lists.chunks, at,
                                                                             offsets);
  list_bases_kernel<<<1, kSlotThreads, 0, stream>>>(E, offsets);
  if (lists.chunks > 0) {
    list_fill_kernel<<<chunk_blocks, kChunkThreads, 0, stream>>>(
        choice, A, E, lists.chunk, lists.chunks, offsets, at, row_assignment);
  }
  dropless_rows_kernel<<<static_cast<unsigned>(E), kSlotThreads, 0, stream>>>(
      offsets, A, K, E, s.group * s.top_k, row_token, row_assignment, counts);
  check_launch("dropless_rows");
}

}  // namespace triad::kernels
