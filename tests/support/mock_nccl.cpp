// A CPU stand-in for the NCCL calls of src/dist/nccl_process_group.cpp, over
// MPI, for running the NCCL process group (and multi-rank `device: cuda`
// training) on the CUDA simulator (tests/support/cuda_sim), where device
// memory is host memory. It checks what NCCL checks about a call (ranks,
// roots, peers, types, a communicator's state) and computes each collective
// exactly: every rank's contribution is gathered and reduced in rank order
// (in double for floating types), so results do not depend on timing.
// Calls between ncclGroupStart and ncclGroupEnd run at ncclGroupEnd: point
// to point ones concurrently, collectives in issue order. On the
// simulator's streams (cuda_sim), a call first runs its stream's queue (so
// it reads what the stream's earlier work and the events it waits for
// wrote), exchanges over MPI as it is issued (so an ordering that would
// hang NCCL hangs here), and queues the writing of its output on the
// stream: a reader that does not wait for the stream sees the old memory.
// A call on a stream in capture (a CUDA graph) becomes the graph's: each
// launch of the graph exchanges as it is launched and writes the output in
// the graph's order (cuda_sim's enqueue_at_launch); an error then is the
// communicator's asynchronous error. A group's calls are captured together
// at ncclGroupEnd (its streams all in the capture, or none).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>

#include "support/cuda_sim/sim.h"
#include "support/mock_nccl.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;  // MPI_COMM_NULL for a communicator of one
  int rank = 0, size = 1;
  std::atomic<bool> aborted{false};  // set by a watchdog thread
  std::atomic<int> async_error{0};   // mock_nccl::fail_newest_communicator
};

namespace {

constexpr int kTagBase = 1 << 24;  // above every tag Triad's MPI group uses
constexpr uint32_t kMagic = 0x7e1ad5ccu;

struct Id {
  uint32_t magic;
  int root_world_rank;
  int sequence;
};
static_assert(sizeof(Id) <= sizeof(ncclUniqueId));

int g_sequence = 0;
std::atomic<ncclComm_t> g_newest{nullptr};  // mock_nccl::fail_newest_communicator
int g_group_depth = 0;
struct Collective {
  ncclComm_t comm;
  cudaStream_t stream;
  std::function<ncclResult_t()> run;
};
std::vector<Collective> g_collectives;
struct P2p {
  bool send;
  void* buffer;
  size_t bytes;
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
};
std::vector<P2p> g_p2p;
std::vector<long> g_p2p_by_size;         // mock_nccl::p2p_operations_on_communicators_of
std::atomic<long> g_reduced_bytes{0};    // mock_nccl::reduced_bytes
std::atomic<long> g_half_reductions{0};  // mock_nccl::half_reductions
void count_reduction(ncclDataType_t t, size_t bytes) {
  g_reduced_bytes += static_cast<long>(bytes);
  if (t == ncclFloat16 || t == ncclBfloat16) ++g_half_reductions;
}

void count_p2p(ncclComm_t c) {
  if (g_p2p_by_size.size() <= static_cast<size_t>(c->size)) g_p2p_by_size.resize(c->size + 1, 0);
  ++g_p2p_by_size[static_cast<size_t>(c->size)];
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

bool is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(p)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(p)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(p)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(p)[i];
    case ncclFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case ncclBfloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ncclFloat32:
      return static_cast<const float*>(p)[i];
    default:
      return static_cast<const double*>(p)[i];
  }
}

void store(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      return;
    case ncclUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      return;
    case ncclInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case ncclUint32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      return;
    case ncclFloat16:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      return;
    case ncclBfloat16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      return;
    case ncclFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    default:
      static_cast<double*>(p)[i] = v;
  }
}

// 64-bit integers reduce exactly (a double would round them).
template <class I>
I reduce_int(ncclRedOp_t op, I a, I b) {
  switch (op) {
    case ncclSum:
      return a + b;
    case ncclProd:
      return a * b;
    case ncclMax:
      return a > b ? a : b;
    default:
      return a < b ? a : b;
  }
}

// out[i] = op over ranks of parts[r * count + i].
void reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<unsigned char>& parts, int ranks,
            size_t count, void* out) {
  const size_t es = type_size(t);
  for (size_t i = 0; i < count; ++i) {
    if (t == ncclInt64 || t == ncclUint64) {
      int64_t acc;
      std::memcpy(&acc, &parts[i * es], 8);
      for (int r = 1; r < ranks; ++r) {
        int64_t v;
        std::memcpy(&v, &parts[(r * count + i) * es], 8);
        acc = t == ncclInt64 ? reduce_int<int64_t>(op, acc, v)
                             : static_cast<int64_t>(reduce_int<uint64_t>(
                                   op, static_cast<uint64_t>(acc), static_cast<uint64_t>(v)));
      }
      std::memcpy(static_cast<unsigned char*>(out) + i * es, &acc, 8);
      continue;
    }
    double acc = load(t, parts.data(), i);
    for (int r = 1; r < ranks; ++r) {
      const double v = load(t, parts.data(), r * count + i);
      switch (op) {
        case ncclSum:
        case ncclAvg:
          acc += v;
          break;
        case ncclProd:
          acc *= v;
          break;
        case ncclMax:
          acc = v > acc ? v : acc;
          break;
        default:
          acc = v < acc ? v : acc;
      }
    }
    if (op == ncclAvg) acc /= ranks;
    store(t, out, i, acc);
  }
}

bool usable(ncclComm_t c) {
  return c != nullptr && !c->aborted;
}

// Every rank's `bytes` at `send`, in rank order.
ncclResult_t gather_all(ncclComm_t c, const void* send, size_t bytes,
                        std::vector<unsigned char>& all) {
  all.resize(bytes * static_cast<size_t>(c->size));
  if (bytes > static_cast<size_t>(INT_MAX)) return ncclInvalidArgument;
  if (c->size == 1) {
    if (bytes) std::memcpy(all.data(), send, bytes);
    return ncclSuccess;
  }
  return MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes),
                       MPI_BYTE, c->comm) == MPI_SUCCESS
             ? ncclSuccess
             : ncclSystemError;
}

bool valid_reduction(ncclDataType_t t, ncclRedOp_t op) {
  if (type_size(t) == 0 || op < ncclSum || op > ncclAvg) return false;
  return op != ncclAvg || is_float(t);
}

// Set while a graph's launch runs a captured call (issue): its output is
// written in place, the graph's next work reading it.
thread_local bool g_replaying = false;

// Queues the writing of `bytes` (the call's result) to `out` on `stream`.
void deliver(cudaStream_t stream, void* out, std::vector<unsigned char> bytes) {
  if (bytes.empty()) return;
  if (g_replaying) {
    std::memcpy(out, bytes.data(), bytes.size());
    return;
  }
  auto data = std::make_shared<std::vector<unsigned char>>(std::move(bytes));
  triad_sim::enqueue(stream, [out, data] { std::memcpy(out, data->data(), data->size()); });
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
         capture != cudaStreamCaptureStatusNone;
}

// Runs `op` now, or at ncclGroupEnd inside a group; first what its stream
// has queued before it. On a stream in capture, `op` is the graph's: it
// runs at each of its launches (after the graph's earlier work), its
// output written in place, a failure left as `c`'s asynchronous error.
ncclResult_t issue(ncclComm_t c, cudaStream_t stream, std::function<ncclResult_t()> op) {
  if (capturing(stream) && g_group_depth == 0) {
    triad_sim::enqueue_at_launch(stream, [c, op = std::move(op)] {
      g_replaying = true;
      const ncclResult_t r = op();
      g_replaying = false;
      if (r != ncclSuccess) c->async_error = r;
    });
    return ncclSuccess;
  }
  if (g_group_depth > 0) {
    g_collectives.push_back({c, stream, std::move(op)});
    return ncclSuccess;
  }
  triad_sim::run_stream(stream);
  return op();
}

// A group's calls: point to point first, all posted before any waits (a
// group's sends and receives may pair up in any order); then the
// collectives in order. Receives land in buffers of their own, written to
// the destination on its stream (deliver).
ncclResult_t run_group(const std::vector<P2p>& p2p, const std::vector<Collective>& collectives) {
  std::vector<MPI_Request> requests;
  std::vector<std::pair<const P2p*, std::vector<unsigned char>>> landed;
  landed.reserve(p2p.size());
  ncclResult_t result = ncclSuccess;
  for (const P2p& p : p2p) {
    if (p.bytes > static_cast<size_t>(INT_MAX)) {
      result = ncclInvalidArgument;
      continue;
    }
    MPI_Request r;
    const int n = static_cast<int>(p.bytes);
    // Synchronous-mode sends: like NCCL's, a send completes only once the
    // peer's receive is there (MPI would buffer small ones).
    if (!p.send) landed.emplace_back(&p, std::vector<unsigned char>(p.bytes));
    const int rc =
        p.send ? MPI_Issend(p.buffer, n, MPI_BYTE, p.peer, 0, p.comm->comm, &r)
               : MPI_Irecv(landed.back().second.data(), n, MPI_BYTE, p.peer, 0, p.comm->comm, &r);
    if (rc != MPI_SUCCESS) {
      result = ncclSystemError;
      continue;
    }
    requests.push_back(r);
  }
  for (const auto& op : collectives) {
    const ncclResult_t r = op.run();
    if (r != ncclSuccess) result = r;
  }
  if (!requests.empty() && MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                                       MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    result = ncclSystemError;
  }
  for (auto& [p, bytes] : landed) deliver(p->stream, p->buffer, std::move(bytes));
  return result;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "system error (mock: an MPI call failed)";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    default:
      return "unknown result";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  int initialized = 0, me = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::memset(id, 0, sizeof(*id));
  const Id mine{kMagic, me, g_sequence++};
  std::memcpy(id->internal, &mine, sizeof(mine));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId uid, int rank) {
  Id id;
  std::memcpy(&id, uid.internal, sizeof(id));
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks || id.magic != kMagic) {
    return ncclInvalidArgument;
  }
  auto* c = new ncclComm;
  c->rank = rank;
  c->size = nranks;
  if (nranks > 1) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      delete c;
      return ncclInvalidUsage;
    }
    // Rendezvous at the rank that made the id: it learns every member's
    // world rank and tells them all; then they form an MPI communicator in
    // NCCL rank order (collective over the members only).
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const int tag = kTagBase + (id.sequence % 4096) * 2;
    std::vector<int> world_of(static_cast<size_t>(nranks));
    if (rank == 0) {
      world_of[0] = me;
      for (int i = 1; i < nranks; ++i) {
        int pair[2];
        MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (pair[0] <= 0 || pair[0] >= nranks) {
          delete c;
          return ncclInvalidArgument;
        }
        world_of[static_cast<size_t>(pair[0])] = pair[1];
      }
      for (int r = 1; r < nranks; ++r) {
        MPI_Send(world_of.data(), nranks, MPI_INT, world_of[static_cast<size_t>(r)], tag + 1,
                 MPI_COMM_WORLD);
      }
    } else {
      int pair[2] = {rank, me};
      MPI_Send(pair, 2, MPI_INT, id.root_world_rank, tag, MPI_COMM_WORLD);
      MPI_Recv(world_of.data(), nranks, MPI_INT, id.root_world_rank, tag + 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
    }
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, world_of.data(), &group);
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS) {
      delete c;
      return ncclSystemError;
    }
  }
  *out = c;
  g_newest = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == nullptr) return ncclInvalidArgument;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (c->comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&c->comm);
  ncclComm_t newest = c;
  g_newest.compare_exchange_strong(newest, nullptr);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c == nullptr) return ncclInvalidArgument;
  c->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* error) {
  if (c == nullptr || error == nullptr) return ncclInvalidArgument;
  *error = c->aborted ? ncclSuccess : static_cast<ncclResult_t>(c->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
  if (!usable(c) || !valid_reduction(t, op)) return ncclInvalidArgument;
  count_reduction(t, count * type_size(t));
  return issue(c, stream, [=] {
    std::vector<unsigned char> all;
    const ncclResult_t r = gather_all(c, send, count * type_size(t), all);
    if (r != ncclSuccess) return r;
    std::vector<unsigned char> out(count * type_size(t));
    reduce(t, op, all, c->size, count, out.data());
    deliver(stream, recv, std::move(out));
    return r;
  });
}

// NCCL's in-place rule for all-gather and reduce-scatter: the rank's piece
// (`piece` bytes) may be `whole`'s own slice, whole + rank * piece; any
// other overlap of the two buffers is undefined there, an error here.
static bool in_place_or_apart(ncclComm_t c, const void* whole, const void* piece_ptr,
                              size_t piece) {
  const auto* w = static_cast<const unsigned char*>(whole);
  const auto* p = static_cast<const unsigned char*>(piece_ptr);
  if (piece == 0 || p == w + static_cast<size_t>(c->rank) * piece) return true;
  return p >= w + static_cast<size_t>(c->size) * piece || w >= p + piece;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
  if (!usable(c) || !valid_reduction(t, op)) return ncclInvalidArgument;
  if (!in_place_or_apart(c, send, recv, count * type_size(t))) return ncclInvalidArgument;
  count_reduction(t, count * static_cast<size_t>(c->size) * type_size(t));
  return issue(c, stream, [=] {
    const size_t es = type_size(t), total = count * static_cast<size_t>(c->size);
    std::vector<unsigned char> all;
    const ncclResult_t r = gather_all(c, send, total * es, all);
    if (r != ncclSuccess) return r;
    std::vector<unsigned char> sum(total * es);
    reduce(t, op, all, c->size, total, sum.data());
    const auto mine = sum.begin() + static_cast<std::ptrdiff_t>(c->rank * count * es);
    deliver(stream, recv,
            std::vector<unsigned char>(mine, mine + static_cast<std::ptrdiff_t>(count * es)));
    return ncclSuccess;
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t stream) {
  if (!usable(c) || type_size(t) == 0) return ncclInvalidArgument;
  if (!in_place_or_apart(c, recv, send, count * type_size(t))) return ncclInvalidArgument;
  return issue(c, stream, [=] {
    std::vector<unsigned char> all;
    const ncclResult_t r = gather_all(c, send, count * type_size(t), all);
    if (r == ncclSuccess) deliver(stream, recv, std::move(all));
    return r;
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t stream) {
  if (!usable(c) || type_size(t) == 0 || root < 0 || root >= c->size) {
    return ncclInvalidArgument;
  }
  return issue(c, stream, [=] {
    const size_t bytes = count * type_size(t);
    if (bytes > static_cast<size_t>(INT_MAX)) return ncclInvalidArgument;
    std::vector<unsigned char> data(bytes);
    if (c->rank == root && bytes) std::memcpy(data.data(), send, bytes);
    if (c->size > 1 &&
        MPI_Bcast(data.data(), static_cast<int>(bytes), MPI_BYTE, root, c->comm) != MPI_SUCCESS)
      return ncclSystemError;
    deliver(stream, recv, std::move(data));
    return ncclSuccess;
  });
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t stream) {
  if (!usable(c) || !valid_reduction(t, op) || root < 0 || root >= c->size) {
    return ncclInvalidArgument;
  }
  return issue(c, stream, [=] {
    const size_t bytes = count * type_size(t);
    if (bytes > static_cast<size_t>(INT_MAX)) return ncclInvalidArgument;
    std::vector<unsigned char> all(bytes * static_cast<size_t>(c->size));
    if (c->size == 1) {
      if (bytes) std::memcpy(all.data(), send, bytes);
    } else if (MPI_Gather(send, static_cast<int>(bytes), MPI_BYTE, all.data(),
                          static_cast<int>(bytes), MPI_BYTE, root, c->comm) != MPI_SUCCESS) {
      return ncclSystemError;
    }
    if (c->rank == root) {
      std::vector<unsigned char> out(bytes);
      reduce(t, op, all, c->size, count, out.data());
      deliver(stream, recv, std::move(out));
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t stream) {
  if (!usable(c) || type_size(t) == 0 || peer < 0 || peer >= c->size || peer == c->rank) {
    return ncclInvalidArgument;
  }
  count_p2p(c);
  g_p2p.push_back({true, const_cast<void*>(send), count * type_size(t), peer, c, stream});
  return g_group_depth > 0 ? ncclSuccess : (ncclGroupStart(), ncclGroupEnd());
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t stream) {
  if (!usable(c) || type_size(t) == 0 || peer < 0 || peer >= c->size || peer == c->rank) {
    return ncclInvalidArgument;
  }
  count_p2p(c);
  g_p2p.push_back({false, recv, count * type_size(t), peer, c, stream});
  return g_group_depth > 0 ? ncclSuccess : (ncclGroupStart(), ncclGroupEnd());
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<P2p> p2p;
  p2p.swap(g_p2p);
  std::vector<Collective> collectives;
  collectives.swap(g_collectives);
  std::vector<cudaStream_t> streams;
  for (const P2p& p : p2p) streams.push_back(p.stream);
  for (const Collective& op : collectives) streams.push_back(op.stream);
  if (streams.empty()) return ncclSuccess;
  const auto captured = std::count_if(streams.begin(), streams.end(), capturing);
  if (captured > 0) {
    // The graph's, run together at each of its launches (after the work its
    // streams captured before it).
    if (captured != static_cast<std::ptrdiff_t>(streams.size())) return ncclInvalidUsage;
    const ncclComm_t comm = !p2p.empty() ? p2p.front().comm : collectives.front().comm;
    triad_sim::enqueue_at_launch(streams.front(), [p2p, collectives, comm] {
      g_replaying = true;
      const ncclResult_t r = run_group(p2p, collectives);
      g_replaying = false;
      if (r != ncclSuccess) comm->async_error = r;
    });
    return ncclSuccess;
  }
  // What the group's streams queued before it, first.
  for (cudaStream_t stream : streams) triad_sim::run_stream(stream);
  return run_group(p2p, collectives);
}

}  // extern "C"

namespace triad::testing::mock_nccl {
void fail_newest_communicator(int result) {
  if (ncclComm_t c = g_newest.load()) c->async_error = result;
}

long reduced_bytes() {
  return g_reduced_bytes.load();
}

long half_reductions() {
  return g_half_reductions.load();
}

long p2p_operations_on_communicators_of(int size) {
  return size >= 0 && static_cast<size_t>(size) < g_p2p_by_size.size()
             ? g_p2p_by_size[static_cast<size_t>(size)]
             : 0;
}
}  // namespace triad::testing::mock_nccl
