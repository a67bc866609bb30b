// The simulator's own tests: kernels written for them (rewritten and run
// like kernels/*.cu), checking that what the GPU would compute comes out,
// and that what would break on a GPU (a missing barrier, a divergent one,
// too much shared memory, a misaligned WMMA operand, a read past an
// allocation) is reported here.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_sim/sim.h"

namespace {

template <class T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, nullptr);
  return static_cast<T*>(p);
}

// What launching (an error the launch itself reports) and then running the
// queued work (one its threads report) throws.
std::string launch_error(const std::function<void()>& f) {
  try {
    f();
    cudaDeviceSynchronize();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class Orders : public ::testing::TestWithParam<triad_sim::Order> {
 protected:
  void SetUp() override { triad_sim::set_order(GetParam()); }
  void TearDown() override { triad_sim::set_order(triad_sim::Order::Forward); }
};

// ---- reductions: shuffles and barriers ----------------------------------------
__global__ void block_sum_kernel(const float* in, float* out, int n) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    v += in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[blockIdx.x] = v;
  }
}

TEST_P(Orders, ShufflesAndBarriersReduceExactly) {
  std::vector<float> host(10000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 7) - 3.0f;
  float* in = device_copy(host);
  float* out = device_copy(std::vector<float>(3, -1.0f));
  block_sum_kernel<<<3, 256>>>(in, out, static_cast<int>(host.size()));
  std::vector<float> got(3);
  cudaMemcpyAsync(got.data(), out, 3 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(got[0] + got[1] + got[2], std::accumulate(host.begin(), host.end(), 0.0f));
  EXPECT_GT(triad_sim::counters().barriers, 0);
  cudaFree(in);
  cudaFree(out);
}

// ---- a missing barrier is a wrong answer ---------------------------------------
// Each thread publishes its index and reads its neighbour's; only the
// barrier makes the neighbour's write visible.
template <bool kSync>
__global__ void neighbour_kernel(int* out) {
  extern __shared__ int slots[];
  slots[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (kSync) __syncthreads();
  out[threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

std::vector<int> run_neighbours(bool sync) {
  int* out = device_copy(std::vector<int>(64, 0));
  if (sync) {
    neighbour_kernel<true><<<1, 64, 64 * sizeof(int)>>>(out);
  } else {
    neighbour_kernel<false><<<1, 64, 64 * sizeof(int)>>>(out);
  }
  std::vector<int> got(64);
  cudaMemcpyAsync(got.data(), out, 64 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  cudaFree(out);
  return got;
}

TEST(CudaSim, AMissingBarrierGivesAWrongAnswerInSomeOrder) {
  std::vector<int> want(64);
  for (int i = 0; i < 64; ++i) want[i] = (i + 1) % 64;
  bool race_seen = false;
  for (triad_sim::Order o : {triad_sim::Order::Forward, triad_sim::Order::Reverse}) {
    triad_sim::set_order(o);
    EXPECT_EQ(run_neighbours(true), want);
    race_seen |= run_neighbours(false) != want;
  }
  triad_sim::set_order(triad_sim::Order::Forward);
  EXPECT_TRUE(race_seen);
}

// ---- blocks of one launch do not see each other --------------------------------
// Each block adds one to what the block before it wrote: on a GPU the blocks
// may run in any order (or together), so the chain is a race between blocks.
__global__ void chain_kernel(int* out) {
  out[blockIdx.x + 1] = out[blockIdx.x] + 1;
}

TEST(CudaSim, ABlockReadingAnotherBlocksWriteGivesAWrongAnswerInSomeOrder) {
  std::vector<std::vector<int>> seen;
  for (triad_sim::Order o : {triad_sim::Order::Forward, triad_sim::Order::Reverse}) {
    triad_sim::set_order(o);
    int* out = device_copy(std::vector<int>(9, 0));
    chain_kernel<<<8, 1>>>(out);
    std::vector<int> got(9);
    cudaMemcpyAsync(got.data(), out, 9 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
    cudaFree(out);
    seen.push_back(got);
  }
  triad_sim::set_order(triad_sim::Order::Forward);
  EXPECT_EQ(seen[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8}));  // first to last
  EXPECT_EQ(seen[1], (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 1, 1}));  // last to first
}

// Two block sums in a row sharing one scratch array: without the barrier
// before the second write, a warp that runs ahead overwrites a partial sum
// another warp has not read yet.
template <bool kSync>
__global__ void two_sums_kernel(float* out) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float total = 0;
  for (int round = 1; round <= 2; ++round) {
    float v = static_cast<float>(round);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (kSync) __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    total += v;
  }
  out[threadIdx.x] = total;
}

TEST(CudaSim, AWarpRunningAheadExposesAReusedScratchRace) {
  auto run = [](bool sync) {
    float* out = device_copy(std::vector<float>(128, 0));
    if (sync) {
      two_sums_kernel<true><<<1, 128>>>(out);
    } else {
      two_sums_kernel<false><<<1, 128>>>(out);
    }
    std::vector<float> got(128);
    cudaMemcpyAsync(got.data(), out, 128 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
    cudaFree(out);
    return got;
  };
  const std::vector<float> want(128, 128.0f + 256.0f);
  bool race_seen = false;
  for (triad_sim::Order o : {triad_sim::Order::Forward, triad_sim::Order::Reverse}) {
    triad_sim::set_order(o);
    EXPECT_EQ(run(true), want);
    race_seen |= run(false) != want;
  }
  triad_sim::set_order(triad_sim::Order::Forward);
  EXPECT_TRUE(race_seen);
}

// ---- barriers some threads never reach ------------------------------------------
__global__ void divergent_kernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

TEST(CudaSim, ADivergentBarrierIsReportedNotHungOn) {
  float* out = device_copy(std::vector<float>(64, 0));
  const std::string e = launch_error([&] { divergent_kernel<<<2, 64>>>(out); });
  EXPECT_NE(e.find("cannot complete"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda_sim_test.cu"), std::string::npos) << e;  // the launch site
  cudaFree(out);
}

__global__ void outside_mask_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 16);
}

TEST(CudaSim, AShuffleFromALaneOutsideTheMaskIsAnError) {
  float* out = device_copy(std::vector<float>(32, 0));
  const std::string e = launch_error([&] { outside_mask_kernel<<<1, 32>>>(out); });
  EXPECT_NE(e.find("not in the mask"), std::string::npos) << e;
  cudaFree(out);
}

// Votes: lane i of warp w votes (i + w) % 3 == 0; the first 16 lanes also
// vote among themselves alone. Each lane writes what it saw.
__global__ void vote_kernel(unsigned* ballots, int* any, int* all, unsigned* half_ballots) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool p = (lane + warp) % 3 == 0;
  ballots[threadIdx.x] = __ballot_sync(0xffffffffu, p);
  any[threadIdx.x] = __any_sync(0xffffffffu, p && lane == 30);
  all[threadIdx.x] = __all_sync(0xffffffffu, lane < 32) + 2 * __all_sync(0xffffffffu, p);
  if (lane < 16) half_ballots[threadIdx.x] = __ballot_sync(0x0000ffffu, p);
}

TEST_P(Orders, VotesSeeEveryLaneOfTheMask) {
  unsigned* ballots = device_copy(std::vector<unsigned>(64, 7u));
  unsigned* half = device_copy(std::vector<unsigned>(64, 7u));
  int* any = device_copy(std::vector<int>(64, 7));
  int* all = device_copy(std::vector<int>(64, 7));
  vote_kernel<<<1, 64>>>(ballots, any, all, half);
  std::vector<unsigned> b(64), hb(64);
  std::vector<int> an(64), al(64);
  cudaMemcpyAsync(b.data(), ballots, 64 * sizeof(unsigned), cudaMemcpyDeviceToHost, nullptr);
  cudaMemcpyAsync(hb.data(), half, 64 * sizeof(unsigned), cudaMemcpyDeviceToHost, nullptr);
  cudaMemcpyAsync(an.data(), any, 64 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  cudaMemcpyAsync(al.data(), all, 64 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  cudaDeviceSynchronize();
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31, warp = t >> 5;
    unsigned want = 0;
    for (int l = 0; l < 32; ++l) want |= ((l + warp) % 3 == 0 ? 1u : 0u) << l;
    EXPECT_EQ(b[t], want) << t;
    EXPECT_EQ(an[t], (30 + warp) % 3 == 0 ? 1 : 0) << t;  // warp 0 only
    EXPECT_EQ(al[t], 1) << t;  // every lane is below 32; not every lane votes p
    if (lane < 16) {
      EXPECT_EQ(hb[t], want & 0xffffu) << t;
    }
  }
  cudaFree(ballots);
  cudaFree(half);
  cudaFree(any);
  cudaFree(all);
}

__global__ void vote_outside_mask_kernel(int* out) {
  out[threadIdx.x] = __any_sync(0xffffffffu, 1);  // only 16 lanes get here
}

TEST(CudaSim, AVoteThatNotEveryLaneOfTheMaskReachesIsAnError) {
  int* out = device_copy(std::vector<int>(32, 0));
  const std::string e = launch_error([&] { vote_outside_mask_kernel<<<1, 16>>>(out); });
  EXPECT_NE(e.find("__any_sync"), std::string::npos) << e;
  cudaFree(out);
}

// ---- launch configuration ----------------------------------------------------------
__global__ void big_shared_kernel(float* out) {
  extern __shared__ float big[];
  big[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = big[threadIdx.x];
}

TEST(CudaSim, SharedMemoryBeyond48KiBNeedsTheAttribute) {
  float* out = device_copy(std::vector<float>(32, 0));
  const size_t bytes = 64 * 1024;
  std::string e = launch_error([&] { big_shared_kernel<<<1, 32, bytes>>>(out); });
  EXPECT_NE(e.find("cudaFuncAttributeMaxDynamicSharedMemorySize"), std::string::npos) << e;
  ASSERT_EQ(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(&big_shared_kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
      cudaSuccess);
  EXPECT_EQ(launch_error([&] { big_shared_kernel<<<1, 32, bytes>>>(out); }), "");
  EXPECT_NE(launch_error([&] { big_shared_kernel<<<1, 32, bytes + 4>>>(out); }), "");
  cudaFree(out);
}

TEST(CudaSim, ImpossibleBlocksAreRejected) {
  float* out = device_copy(std::vector<float>(32, 0));
  const std::string e = launch_error([&] { big_shared_kernel<<<1, 2048>>>(out); });
  EXPECT_NE(e.find("2048 threads"), std::string::npos) << e;
  cudaFree(out);
}

__global__ void __launch_bounds__(64) bounded_kernel(float* out) {
  out[threadIdx.x] = 1.0f;
}

TEST(CudaSim, ABlockLargerThanTheLaunchBoundsIsRejected) {
  float* out = device_copy(std::vector<float>(128, 0));
  EXPECT_EQ(launch_error([&] { bounded_kernel<<<1, 64>>>(out); }), "");
  const std::string e = launch_error([&] { bounded_kernel<<<1, 128>>>(out); });
  EXPECT_NE(e.find("__launch_bounds__(64)"), std::string::npos) << e;
  cudaFree(out);
}

// Static shared memory is fresh (NaN) in every block: reading a slot no
// thread of this block wrote is garbage, as on a GPU.
__global__ void stale_shared_kernel(float* out) {
  __shared__ float slots[32];
  if (blockIdx.x == 0) slots[threadIdx.x] = 1.0f;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = slots[threadIdx.x];
}

TEST(CudaSim, StaticSharedMemoryStartsAsGarbageInEveryBlock) {
  float* out = device_copy(std::vector<float>(64, 0));
  stale_shared_kernel<<<2, 32>>>(out);
  std::vector<float> got(64);
  cudaMemcpyAsync(got.data(), out, 64 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[32]));
  cudaFree(out);
}

// A local array a thread never wrote is garbage, as a GPU's registers and
// local memory are: here it starts as the pattern (-1.7e38), not as what
// the last lane left on the fiber's reused stack (the right values, here:
// lane 0 wrote them and exited). (A scalar the compiler can see is unwritten
// on a path is folded away by either compiler; an array read at a run-time
// index stays in memory.)
__global__ void unwritten_local_kernel(float* out, int i) {
  float acc[4];
  if (threadIdx.x == 0) {
    for (int j = 0; j < 4; ++j) acc[j] = 0.0f;
  }
  out[threadIdx.x] = acc[(threadIdx.x + i) & 3] + 1.0f;
}

#if defined(TRIAD_SIM_PATTERN_INIT)
TEST(CudaSim, ALocalNoOneWroteIsGarbage) {
  float* out = device_copy(std::vector<float>(32, 0));
  unwritten_local_kernel<<<1, 32>>>(out, 1);
  std::vector<float> got(32);
  cudaMemcpyAsync(got.data(), out, 32 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(got[0], 1.0f);
  for (int i = 1; i < 32; ++i) EXPECT_LT(got[i], -1e38f) << "thread " << i;
  cudaFree(out);
}
#endif

__global__ void trap_kernel() {
  if (blockIdx.x == 1 && threadIdx.x == 5) __trap();
}

TEST(CudaSim, AFaultNamesTheBlockAndThread) {
  const std::string e = launch_error([&] { trap_kernel<<<2, 32>>>(); });
  EXPECT_NE(e.find("block (1,0,0), thread (5,0,0)"), std::string::npos) << e;
}

// ---- WMMA ----------------------------------------------------------------------------
using namespace nvcuda;

__global__ void wmma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c, int offset) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 1.0f);
  wmma::load_matrix_sync(fa, a + offset, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

TEST_P(Orders, WmmaComputesATileProduct) {
  std::vector<__nv_bfloat16> a(256 + 16), b(256);
  std::vector<float> fa(256), fb(256);
  for (int i = 0; i < 256; ++i) {
    fa[i] = static_cast<float>(i % 5) - 2, fb[i] = static_cast<float>(i % 3) * 0.5f;
    a[i] = __float2bfloat16_rn(fa[i]), b[i] = __float2bfloat16_rn(fb[i]);
  }
  __nv_bfloat16* da = device_copy(a);
  __nv_bfloat16* db = device_copy(b);
  float* dc = device_copy(std::vector<float>(256, 0));
  wmma_kernel<<<1, 32>>>(da, db, dc, 0);
  std::vector<float> c(256);
  cudaMemcpyAsync(c.data(), dc, 256 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      float want = 1;  // b is col-major: element (k, j) at b[j * 16 + k]
      for (int k = 0; k < 16; ++k) want += fa[i * 16 + k] * fb[j * 16 + k];
      ASSERT_EQ(c[i * 16 + j], want) << i << "," << j;
    }
  }
  // 8 elements in: 16 bytes, not the 32 WMMA needs.
  const std::string e = launch_error([&] { wmma_kernel<<<1, 32>>>(da, db, dc, 8); });
  EXPECT_NE(e.find("256-bit aligned"), std::string::npos) << e;
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

// Lanes reading a tile the warp just stored: each lane stored only its
// share, so the reads need a __syncwarp in between.
template <bool kSync>
__global__ void staged_read_kernel(float* stage, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 2.0f);
  wmma::store_matrix_sync(stage, fc, 16, wmma::mem_row_major);
  if (kSync) __syncwarp();
  const int first = static_cast<int>(threadIdx.x) * 8;
  for (int e = first; e < first + 8; ++e) out[e] = stage[e];
}

TEST(CudaSim, ReadingAStoredTileNeedsASyncwarp) {
  float* stage = device_copy(std::vector<float>(256, 0));
  float* out = device_copy(std::vector<float>(256, 0));
  auto run = [&](bool sync) {
    cudaMemsetAsync(stage, 0, 256 * sizeof(float), nullptr);
    if (sync) {
      staged_read_kernel<true><<<1, 32>>>(stage, out);
    } else {
      staged_read_kernel<false><<<1, 32>>>(stage, out);
    }
    std::vector<float> got(256);
    cudaMemcpyAsync(got.data(), out, 256 * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
    return got;
  };
  EXPECT_EQ(run(true), std::vector<float>(256, 2.0f));
  EXPECT_NE(run(false), std::vector<float>(256, 2.0f));
  cudaFree(stage);
  cudaFree(out);
}

// A WMMA collective half a warp skips: the GPU's behaviour is undefined.
__global__ void partial_wmma_kernel(float* c) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  if (threadIdx.x < 16) wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

TEST(CudaSim, AWmmaCollectiveNeedsTheWholeWarp) {
  float* dc = device_copy(std::vector<float>(256, 0));
  const std::string e = launch_error([&] { partial_wmma_kernel<<<1, 32>>>(dc); });
  EXPECT_NE(e.find("wmma::store_matrix_sync"), std::string::npos) << e;
  cudaFree(dc);
}

// ---- memory -------------------------------------------------------------------------
__global__ void read_kernel(const float* in, float* out, int i) {
  out[0] = in[i];
}

TEST(CudaSim, FreshDeviceMemoryIsNaNAndTheEndOfAnAllocationFaults) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000 * sizeof(float)), cudaSuccess);
  float* out = device_copy(std::vector<float>(1, 0));
  read_kernel<<<1, 1>>>(static_cast<float*>(p), out, 999);
  float got = 0;
  cudaMemcpyAsync(&got, out, sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_TRUE(std::isnan(got));
  // 1000 floats round up to 4096 bytes, which end at the guard page: 64
  // elements past the end is inside it.
  EXPECT_DEATH(
      {
        read_kernel<<<1, 1>>>(static_cast<float*>(p), out, 1000 + 64);
        cudaDeviceSynchronize();
      },
      "invalid memory access at address 0x[0-9a-f]+ in the kernel launched at "
      ".*cuda_sim_test.cu:[0-9]+, block \\(0,0,0\\), thread \\(0,0,0\\)");
  cudaFree(p);
  cudaFree(out);
}

// ---- streams ------------------------------------------------------------------------
__global__ void fill_kernel(float* out, float v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v;
}
__global__ void add_one_kernel(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}

std::vector<float> read_back(const float* p, int n) {
  std::vector<float> got(static_cast<size_t>(n));
  cudaMemcpyAsync(got.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  return got;
}

// A kernel on one stream reading what a kernel on another wrote: only an
// event wait between them orders the two.
TEST(CudaSim, WorkOnAnotherStreamIsSeenOnlyAfterAnEventWait) {
  ASSERT_EQ(triad_sim::streams(), triad_sim::Streams::Deferred);
  cudaStream_t producer, consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  float* a = device_copy(std::vector<float>(64, 0.0f));
  float* b = device_copy(std::vector<float>(64, 0.0f));
  cudaDeviceSynchronize();
  auto run = [&](bool wait) {
    fill_kernel<<<1, 64, 0, producer>>>(a, 5.0f, 64);
    if (wait) {
      cudaEvent_t ev;
      cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      cudaEventRecord(ev, producer);
      cudaStreamWaitEvent(consumer, ev, 0);
      cudaEventDestroy(ev);  // the wait stands without the event
    }
    add_one_kernel<<<1, 64, 0, consumer>>>(a, b, 64);
    EXPECT_GT(triad_sim::pending_work(), 0);
    cudaStreamSynchronize(consumer);
    const std::vector<float> got = read_back(b, 64);
    cudaDeviceSynchronize();
    // Start over from zeros.
    cudaMemsetAsync(a, 0, 64 * sizeof(float), producer);
    cudaStreamSynchronize(producer);
    return got;
  };
  EXPECT_EQ(run(true), std::vector<float>(64, 6.0f));
  EXPECT_EQ(run(false), std::vector<float>(64, 1.0f));  // read before the fill ran
  EXPECT_EQ(triad_sim::pending_work(), 0);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

// A query of unfinished work answers "not ready" and lets the stream run on
// (counted as a not-ready query, not a host wait) on the thread that
// recorded the event; another thread (a watchdog) only sees what has run.
TEST(CudaSim, OnlyTheRecordingThreadMakesAQueriedEventProgress) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* a = device_copy(std::vector<float>(64, 0.0f));
  cudaDeviceSynchronize();
  fill_kernel<<<1, 64, 0, s>>>(a, 2.0f, 64);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaEventRecord(ev, s);
  const auto before = triad_sim::counters();
  cudaError_t elsewhere = cudaSuccess;
  std::thread([&] { elsewhere = cudaEventQuery(ev); }).join();
  EXPECT_EQ(elsewhere, cudaErrorNotReady);
  EXPECT_GT(triad_sim::pending_work(), 0);  // the other thread ran nothing
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);  // it ran
  std::thread([&] { elsewhere = cudaEventQuery(ev); }).join();
  EXPECT_EQ(elsewhere, cudaSuccess);
  const auto after = triad_sim::counters();
  EXPECT_EQ(after.not_ready_queries, before.not_ready_queries + 1);
  EXPECT_EQ(after.host_waits, before.host_waits);
  EXPECT_EQ(read_back(a, 64), std::vector<float>(64, 2.0f));
  cudaEventDestroy(ev);
  cudaFree(a);
  cudaStreamDestroy(s);
}

// The legacy default stream waits for blocking streams (and they for it),
// never for non-blocking ones.
TEST(CudaSim, TheLegacyStreamOrdersOnlyBlockingStreams) {
  for (const unsigned flags : {cudaStreamDefault, cudaStreamNonBlocking}) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    float* a = device_copy(std::vector<float>(32, 0.0f));
    float* b = device_copy(std::vector<float>(32, 0.0f));
    cudaDeviceSynchronize();
    fill_kernel<<<1, 32, 0, s>>>(a, 2.0f, 32);
    add_one_kernel<<<1, 32>>>(a, b, 32);  // legacy stream
    EXPECT_EQ(read_back(b, 32), std::vector<float>(32, flags == cudaStreamDefault ? 3.0f : 1.0f));
    cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
  }
}

// Copies from pinned memory read it when the stream runs them (so the host
// must not touch it before an event says so); from pageable memory, when
// they are issued.
TEST(CudaSim, PinnedSourcesAreReadWhenTheCopyRuns) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* d = device_copy(std::vector<float>(2, 0.0f));
  cudaDeviceSynchronize();  // s does not wait for the legacy stream's copy
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, sizeof(float), cudaHostAllocPortable), cudaSuccess);
  float pageable = 1.0f;
  *static_cast<float*>(pinned) = 1.0f;
  cudaMemcpyAsync(d, pinned, sizeof(float), cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(d + 1, &pageable, sizeof(float), cudaMemcpyHostToDevice, s);
  *static_cast<float*>(pinned) = 7.0f;  // too early: the copy has not run
  pageable = 7.0f;
  cudaEvent_t done;
  cudaEventCreate(&done);
  cudaEventRecord(done, s);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);  // and it runs now
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(read_back(d, 2), (std::vector<float>{7.0f, 1.0f}));
  cudaEventDestroy(done);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

// A capture runs nothing: its work is the graph's, and each launch of the
// graph runs it again, in order, on whatever its inputs hold by then
// (pinned sources read when the copy runs).
TEST(CudaSim, AGraphRunsItsCapturedWorkAtEachLaunch) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* a = device_copy(std::vector<float>(64, 0.0f));
  float* b = device_copy(std::vector<float>(64, 0.0f));
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, sizeof(float), cudaHostAllocPortable), cudaSuccess);
  cudaDeviceSynchronize();
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  cudaMemcpyAsync(a, pinned, sizeof(float), cudaMemcpyHostToDevice, s);
  add_one_kernel<<<1, 64, 0, s>>>(a, b, 64);
  EXPECT_EQ(triad_sim::pending_work(), 0);  // nothing queued
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  EXPECT_EQ(read_back(b, 1), std::vector<float>{0.0f});
  for (float v : {2.0f, 5.0f}) {
    *static_cast<float*>(pinned) = v;
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    cudaStreamSynchronize(s);
    EXPECT_EQ(read_back(b, 2), (std::vector<float>{v + 1.0f, 1.0f}));
  }
  cudaGraphExecDestroy(exec);
  cudaFreeHost(pinned);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(s);
}

// What CUDA refuses during a capture fails the call and spoils the
// capture, whose end then fails: a synchronisation of the capturing
// stream, a copy from pageable memory, and (CUDA 13) cudaMalloc from the
// capturing thread unless its capture mode is relaxed. Another thread's
// cudaMalloc is its own business.
TEST(CudaSim, ACaptureRefusesWhatAGpuRefuses) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* a = device_copy(std::vector<float>(4, 0.0f));
  cudaDeviceSynchronize();
  float pageable = 1.0f;
  const std::vector<std::function<cudaError_t()>> refused = {
      [&] { return cudaStreamSynchronize(s); },
      [&] { return cudaMemcpyAsync(a, &pageable, sizeof(float), cudaMemcpyHostToDevice, s); },
      [&] {
        void* p = nullptr;
        return cudaMalloc(&p, 256);
      },
  };
  for (const auto& call : refused) {
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    fill_kernel<<<1, 4, 0, s>>>(a, 3.0f, 4);
    EXPECT_EQ(call(), cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &status);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
  }
  cudaGetLastError();
  // Relaxed for the call, cudaMalloc is allowed; so is another thread's.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* mine = nullptr;
  void* theirs = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&mine, 256), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
  std::thread([&] { EXPECT_EQ(cudaMalloc(&theirs, 256), cudaSuccess); }).join();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  // The legacy stream cannot be captured.
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal),
            cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  cudaFree(mine);
  cudaFree(theirs);
  cudaFree(a);
  cudaStreamDestroy(s);
}

// A second stream joins a capture by waiting on an event recorded in it (a
// fork) and leaves it when the capture ends; the stream that began the
// capture waits on an event after the second stream's work (a join). The
// graph holds both streams' work and each launch runs it in an order both
// waits allow: a fill on the first stream, one added on the second, one
// more on the first.
TEST(CudaSim, AnotherStreamForkedIntoACaptureAndJoinedBackIsTheGraphs) {
  cudaStream_t s, side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t fork, join;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  float* a = device_copy(std::vector<float>(8, 0.0f));
  float* b = device_copy(std::vector<float>(8, 0.0f));
  float* c = device_copy(std::vector<float>(8, 0.0f));
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, sizeof(float), cudaHostAllocPortable), cudaSuccess);
  cudaDeviceSynchronize();
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaMemcpyAsync(a, pinned, sizeof(float), cudaMemcpyHostToDevice, s);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  // A captured event stands for no work the host could ask about.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  add_one_kernel<<<1, 8, 0, side>>>(a, b, 8);
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
  add_one_kernel<<<1, 8, 0, s>>>(b, c, 8);
  EXPECT_EQ(triad_sim::pending_work(), 0);  // nothing queued
  // Only the stream that began the capture ends it.
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(side, &graph), cudaErrorStreamCaptureUnmatched);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  // An event of an ended capture cannot be waited on.
  EXPECT_EQ(cudaStreamWaitEvent(side, join, 0), cudaErrorStreamCaptureIsolation);
  cudaGetLastError();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  for (float v : {2.0f, 7.0f}) {
    *static_cast<float*>(pinned) = v;
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    cudaStreamSynchronize(s);
    EXPECT_EQ(read_back(c, 1), std::vector<float>{v + 2.0f});
  }
  // Re-recorded outside a capture, the event is an ordinary one again.
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(fork), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(fork), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaFreeHost(pinned);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaStreamDestroy(s);
  cudaStreamDestroy(side);
}

// What a capture across streams refuses: a forked stream never joined back
// (the end fails and both streams leave the capture), a query of a captured
// event (spoils the capture), a wait on an event recorded outside it, and a
// wait joining two captures.
TEST(CudaSim, ACaptureAcrossStreamsRefusesAForkNeverJoinedAndQueriesOfItsEvents) {
  cudaStream_t s, side, other;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e, outside;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming), cudaSuccess);
  float* a = device_copy(std::vector<float>(4, 0.0f));
  cudaDeviceSynchronize();
  cudaGraph_t graph = nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // Forked, never joined (the side stream's work is waited on by no one).
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, e, 0), cudaSuccess);
  fill_kernel<<<1, 4, 0, side>>>(a, 1.0f, 4);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  // Asking about a captured event.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // Waiting on work outside the capture.
  ASSERT_EQ(cudaEventRecord(outside, other), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // Two captures joined.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(other, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(other, e, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(other, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  cudaEventDestroy(e);
  cudaEventDestroy(outside);
  cudaFree(a);
  cudaStreamDestroy(s);
  cudaStreamDestroy(side);
  cudaStreamDestroy(other);
}

// enqueue_at_launch: work a capture keeps runs as each launch of its graph
// is issued, after the graph's earlier work; off a capture it queues
// nothing.
TEST(CudaSim, WorkEnqueuedAtLaunchRunsAsTheGraphIsLaunched) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* a = device_copy(std::vector<float>(4, 0.0f));
  cudaDeviceSynchronize();
  std::vector<float> seen;
  EXPECT_FALSE(triad_sim::enqueue_at_launch(s, [] {}));
  EXPECT_EQ(triad_sim::pending_work(), 0);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  add_one_kernel<<<1, 4, 0, s>>>(a, a, 4);
  EXPECT_TRUE(triad_sim::enqueue_at_launch(s, [&] { seen.push_back(a[0]); }));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  EXPECT_TRUE(seen.empty());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  // (No synchronisation: both launches ran as they were issued.)
  EXPECT_EQ(seen, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(triad_sim::pending_work(), 0);
  cudaGraphExecDestroy(exec);
  cudaFree(a);
  cudaStreamDestroy(s);
}

// Errors a kernel's threads raise come from the call that ran the stream;
// errors in the launch itself, from the launch.
TEST(CudaSim, ErrorsComeFromTheLaunchOrFromTheSynchronisation) {
  EXPECT_THROW(trap_kernel<<<1, 2048>>>(), std::runtime_error);  // too many threads
  EXPECT_EQ(triad_sim::pending_work(), 0);
  trap_kernel<<<2, 32>>>();
  EXPECT_EQ(triad_sim::pending_work(), 1);
  EXPECT_THROW(cudaDeviceSynchronize(), std::runtime_error);
  EXPECT_EQ(triad_sim::pending_work(), 0);
  // Eager streams run each item when it is issued.
  triad_sim::set_streams(triad_sim::Streams::Eager);
  EXPECT_THROW(trap_kernel<<<2, 32>>>(), std::runtime_error);
  triad_sim::set_streams(triad_sim::Streams::Deferred);
}

INSTANTIATE_TEST_SUITE_P(CudaSim, Orders,
                         ::testing::Values(triad_sim::Order::Forward, triad_sim::Order::Reverse),
                         [](const ::testing::TestParamInfo<triad_sim::Order>& info) {
                           return info.param == triad_sim::Order::Forward ? "forward" : "reverse";
                         });

}  // namespace
