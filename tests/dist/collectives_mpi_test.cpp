// Every collective x dtype x sync/async, sub-groups, uneven sizes, empty
// tensors, timeouts and mismatch detection, checked against values computed
// locally. Run by CTest under mpirun with 2, 3, 4 and 8 ranks (label mpi).
// Built with TRIAD_COLLECTIVES_ON_NCCL, the same tests run on the NCCL group
// with every tensor on the rank's GPU: against the CUDA simulator at 1 to 4
// ranks (labels sim and mpi), and on a real GPU at world size 1 (label
// gpu; exits 77 without one).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/mpi_main.h"
#ifdef TRIAD_NCCL_ON_SIM
#include "support/cuda_sim/sim.h"
#include "support/mock_nccl.h"
#endif
#include "triad/backend/cuda.h"
#include "triad/dist/mesh.h"
#include "triad/dist/nccl.h"
#include "triad/dist/world.h"
#include "triad/ops.h"

namespace triad::dist {
namespace {

ProcessGroupPtr g_world;
ProcessGroupPtr g_host_world;  // the MPI world (g_world itself without NCCL)
Device g_device = Device::cpu();
#ifdef TRIAD_COLLECTIVES_ON_NCCL
constexpr bool kNccl = true;
#else
constexpr bool kNccl = false;
#endif

double value(int rank, int64_t i) {
  return static_cast<double>((rank + 1) * 3 + (i % 7) - 2);
}

Tensor filled(int rank, int64_t n, DType d) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return to_device(from_vector(v, {n}, d), g_device);
}

const std::vector<DType> kDtypes{DType::F32, DType::F64, DType::BF16,
                                 DType::F16, DType::I32, DType::I64};

TEST(Collectives, AllReduceEveryOpAndDtypeSyncAndAsync) {
  const int P = g_world->size(), me = g_world->rank();
  for (DType d : kDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(d)) continue;
      for (bool async : {false, true}) {
        const int64_t n = 37;
        Tensor t = filled(me, n, d);
        WorkPtr w = g_world->all_reduce(t, op);
        if (async) {
          Tensor other = filled(me, 5, DType::F32);  // unrelated local work meanwhile
          (void)other;
        }
        w->wait();
        EXPECT_TRUE(w->is_completed());
        auto got = to_double_vector(t);
        for (int64_t i = 0; i < n; ++i) {
          double expect = op == ReduceOp::Max ? -1e300 : op == ReduceOp::Min ? 1e300 : 0;
          for (int r = 0; r < P; ++r) {
            const double x = value(r, i);
            if (op == ReduceOp::Max)
              expect = std::max(expect, x);
            else if (op == ReduceOp::Min)
              expect = std::min(expect, x);
            else
              expect += x;
          }
          if (op == ReduceOp::Avg) expect /= P;
          // Values are small integers: exact in every dtype but the average
          // in half precision, which rounds once.
          const double tol = (op == ReduceOp::Avg && (d == DType::BF16 || d == DType::F16))
                                 ? 0.05 * std::abs(expect)
                                 : 1e-6;
          ASSERT_NEAR(got[i], expect, tol)
              << dtype_name(d) << " " << reduce_op_name(op) << " async=" << async;
        }
      }
    }
  }
}

TEST(Collectives, AllGatherEqualPiecesSyncAndAsync) {
  const int P = g_world->size(), me = g_world->rank();
  for (DType d : kDtypes) {
    for (bool async : {false, true}) {
      Tensor in = reshape(filled(me, 3 * 5, d), {5, 3});
      Tensor out = empty({5 * P, 3}, d, g_device);
      WorkPtr w = g_world->all_gather(in, out);
      if (async) {
        // Issuing the call exchanges nothing: a second one goes out before
        // the first is waited for, and both complete.
        Tensor in2 = filled(me, 2, d), out2 = empty({2 * P}, d, g_device);
        WorkPtr w2 = g_world->all_gather(in2, out2);
        w2->wait();
        auto got2 = to_double_vector(out2);
        for (int r = 0; r < P; ++r)
          for (int64_t j = 0; j < 2; ++j) ASSERT_EQ(got2[r * 2 + j], value(r, j));
      }
      w->wait();
      auto got = to_double_vector(out);
      for (int r = 0; r < P; ++r)
        for (int64_t j = 0; j < 15; ++j)
          ASSERT_EQ(got[r * 15 + j], value(r, j)) << dtype_name(d) << " async=" << async;
    }
  }
  // The output must hold size() equal pieces; the error says where uneven
  // pieces go.
  Tensor in = filled(me, 4, DType::F32);
  Tensor wrong = empty({static_cast<int64_t>(4 * P + 1)}, DType::F32, g_device);
  try {
    g_world->all_gather(in, wrong);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("expected " + std::to_string(P) + " ranks x input [4]"), std::string::npos)
        << m;
    EXPECT_NE(m.find("all_gather_uneven"), std::string::npos) << m;
  }
  Tensor other = empty({4 * P}, DType::F64, g_device);
  EXPECT_THROW(g_world->all_gather(in, other), ValueError);
}

// In place: this rank's piece already sits in the output, as ZeRO-1 keeps
// its parameter buckets; the other ranks' pieces arrive around it (MPI with
// MPI_IN_PLACE, NCCL by its in-place rule).
TEST(Collectives, AllGatherInPlaceFromTheOutputsOwnPiece) {
  const int P = g_world->size(), me = g_world->rank();
  for (DType d : kDtypes) {
    Tensor out = empty({6 * P}, d, g_device);
    Tensor mine = narrow(out, 0, 6 * me, 6);
    copy_(mine, filled(me, 6, d));
    g_world->all_gather(mine, out)->wait();
    const auto got = to_double_vector(out);
    for (int r = 0; r < P; ++r)
      for (int64_t j = 0; j < 6; ++j) ASSERT_EQ(got[r * 6 + j], value(r, j)) << dtype_name(d);
  }
  // Any other piece of the output's memory as the input is an error that
  // names the piece expected.
  if (P > 1) {
    Tensor out = empty({6 * P}, DType::F32, g_device);
    Tensor other = narrow(out, 0, 6 * ((me + 1) % P), 6);
    try {
      g_world->all_gather(other, out);
      FAIL() << "expected ValueError";
    } catch (const ValueError& e) {
      const std::string want =
          "output elements [" + std::to_string(6 * me) + ", " + std::to_string(6 * me + 6) + ")";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Collectives, AllGatherUnevenPieces) {
  const int P = g_world->size(), me = g_world->rank();
  // Rank r contributes r + 1 rows of 3 (rank 1 none when P > 2: an empty
  // piece in the middle).
  auto rows_of = [&](int r) { return (P > 2 && r == 1) ? 0 : r + 1; };
  std::vector<int64_t> counts(P);
  int64_t rows = 0;
  for (int r = 0; r < P; ++r) {
    counts[r] = 3 * rows_of(r);
    rows += rows_of(r);
  }
  for (DType d : kDtypes) {
    Tensor in = reshape(filled(me, 3 * rows_of(me), d), {rows_of(me), 3});
    Tensor out = empty({rows, 3}, d, g_device);
    g_world->all_gather_uneven(in, out, counts)->wait();
    auto got = to_double_vector(out);
    int64_t row = 0;
    for (int r = 0; r < P; ++r) {
      for (int64_t j = 0; j < 3 * rows_of(r); ++j)
        ASSERT_EQ(got[row * 3 + j], value(r, j)) << dtype_name(d);
      row += rows_of(r);
    }
  }
  // Equal counts take the same path as all_gather.
  Tensor in = filled(me, 4, DType::F32), out = empty({4 * P}, DType::F32, g_device);
  g_world->all_gather_uneven(in, out, std::vector<int64_t>(P, 4))->wait();
  EXPECT_EQ(to_double_vector(out).back(), value(P - 1, 3));
  // Counts that do not fit are refused locally, naming the numbers.
  EXPECT_THROW(g_world->all_gather_uneven(in, out, std::vector<int64_t>(P + 1, 4)), ValueError);
  std::vector<int64_t> off(P, 4);
  off[me] = 5;
  try {
    g_world->all_gather_uneven(in, out, off);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank " + std::to_string(me) + "'s count is 5"), std::string::npos) << m;
  }
  std::vector<int64_t> more(P, 4);
  more[(me + 1) % P] += 1;  // another rank's count (or its own when alone)
  EXPECT_THROW(g_world->all_gather_uneven(in, out, more), ShapeError);
}

// An uneven all-to-all: rank a sends rank b (a + 2 b) % 3 rows of 2 (some
// pieces empty, its own kept locally), each row saying who sent it to whom
// (10 a + b) and its place;
// every rank finds the rows it was sent, in rank order.
TEST(Collectives, AllToAllUnevenPieces) {
  const int P = g_world->size(), me = g_world->rank();
  auto rows = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };
  for (DType d : {DType::F32, DType::BF16, DType::I64}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<int64_t> send(P), recv(P);
    std::vector<double> data;
    for (int to = 0; to < P; ++to) {
      send[to] = rows(me, to);
      recv[to] = rows(to, me);
      for (int64_t k = 0; k < send[to]; ++k) {
        data.push_back(10 * me + to);  // (exact in bf16 up to 8 ranks)
        data.push_back(static_cast<double>(k));
      }
    }
    int64_t sent = 0, received = 0;
    for (int r = 0; r < P; ++r) sent += send[r], received += recv[r];
    Tensor in = to_device(from_vector(data, {sent, 2}, d), g_device);
    Tensor out = zeros({received, 2}, d, g_device);
    g_world->all_to_all(in, send, out, recv)->wait();
    const std::vector<double> got = to_double_vector(out);
    int64_t at = 0;
    for (int from = 0; from < P; ++from) {
      for (int64_t k = 0; k < recv[from]; ++k, ++at) {
        ASSERT_EQ(got[static_cast<size_t>(2 * at)], 10 * from + me) << "row " << at;
        ASSERT_EQ(got[static_cast<size_t>(2 * at + 1)], static_cast<double>(k)) << "row " << at;
      }
    }
  }
  // Counts that do not fit are refused locally, naming the numbers.
  Tensor in = zeros({2, 3}, DType::F32, g_device), out = zeros({2, 3}, DType::F32, g_device);
  std::vector<int64_t> two(P, 0);
  two[me] = 2;
  EXPECT_NO_THROW(g_world->all_to_all(in, two, out, two)->wait());
  try {
    g_world->all_to_all(in, std::vector<int64_t>(P + 1, 0), out, two);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("expected a count per rank"), std::string::npos)
        << e.what();
  }
  std::vector<int64_t> one(P, 0);
  one[me] = 1;
  EXPECT_THROW(g_world->all_to_all(zeros({1, 3}, DType::F32, g_device), one, out, two), ValueError);
}

TEST(Collectives, ReduceScatterSplitsRowsUnevenly) {
  const int P = g_world->size(), me = g_world->rank();
  const int64_t rows = 2 * P + 1, cols = 2;  // not divisible by P
  const auto share = split_sizes(rows, P);
  int64_t first = 0;
  for (int r = 0; r < me; ++r) first += share[r];
  for (DType d : kDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      Tensor in = reshape(filled(me, rows * cols, d), {rows, cols});
      Tensor out = empty({share[me], cols}, d, g_device);
      g_world->reduce_scatter(in, out, op)->wait();
      auto got = to_double_vector(out);
      for (int64_t k = 0; k < share[me] * cols; ++k) {
        const int64_t i = first * cols + k;
        double expect = op == ReduceOp::Max ? -1e300 : 0;
        for (int r = 0; r < P; ++r)
          expect = op == ReduceOp::Max ? std::max(expect, value(r, i)) : expect + value(r, i);
        ASSERT_EQ(got[k], expect) << dtype_name(d) << " " << reduce_op_name(op);
      }
    }
  }
}

// In place: the output is the input's own rows (as ZeRO-1 reduces its
// gradient buckets), with equal and uneven pieces; an output elsewhere in
// the input's memory is an error naming the rows expected.
TEST(Collectives, ReduceScatterInPlaceIntoTheInputsOwnRows) {
  const int P = g_world->size(), me = g_world->rank();
  for (int64_t rows : {int64_t{3} * P, int64_t{2} * P + 1}) {
    const int64_t cols = 2;
    const auto share = split_sizes(rows, P);
    int64_t first = 0;
    for (int r = 0; r < me; ++r) first += share[r];
    for (DType d : kDtypes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        if (op == ReduceOp::Avg && !is_floating(d)) continue;
        Tensor in = reshape(filled(me, rows * cols, d), {rows, cols});
        Tensor mine = narrow(in, 0, first, share[me]);
        g_world->reduce_scatter(in, mine, op)->wait();
        const auto got = to_double_vector(mine);
        for (int64_t k = 0; k < share[me] * cols; ++k) {
          double expect = 0;
          for (int r = 0; r < P; ++r) expect += value(r, first * cols + k);
          if (op == ReduceOp::Avg) expect /= P;
          ASSERT_NEAR(got[k], expect, is_half(d) ? 0.02 * std::fabs(expect) : 1e-6)
              << dtype_name(d) << " " << reduce_op_name(op) << " rows " << rows;
        }
      }
    }
  }
  if (P > 1) {
    Tensor in = filled(me, 4 * P, DType::F32);
    Tensor other = narrow(in, 0, 4 * ((me + 1) % P), 4);
    try {
      g_world->reduce_scatter(in, other, ReduceOp::Sum);
      FAIL() << "expected ValueError";
    } catch (const ValueError& e) {
      const std::string want =
          "input elements [" + std::to_string(4 * me) + ", " + std::to_string(4 * me + 4) + ")";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const int P = g_world->size(), me = g_world->rank();
  for (int root = 0; root < P; ++root) {
    for (DType d : {DType::BF16, DType::I64, DType::F32}) {
      Tensor t = filled(me, 11, d);
      g_world->broadcast(t, root)->wait();
      auto got = to_double_vector(t);
      for (int64_t i = 0; i < 11; ++i) ASSERT_EQ(got[i], value(root, i));
    }
  }
  Tensor t = filled(me, 2, DType::F32);
  EXPECT_THROW(g_world->broadcast(t, P), ValueError);
}

TEST(Collectives, PointToPointRingAndBatchedExchange) {
  const int P = g_world->size(), me = g_world->rank();
  if (P < 2) GTEST_SKIP() << "needs a peer";
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  for (DType d : kDtypes) {
    Tensor mine = filled(me, 9, d), from_prev = empty({9}, d, g_device),
           from_next = empty({9}, d, g_device);
    // Both neighbours at once: send to both, receive from both.
    std::vector<P2POp> ops{{true, mine, next, 1},
                           {true, mine, prev, 2},
                           {false, from_prev, prev, 1},
                           {false, from_next, next, 2}};
    if (P == 2) ops = {{true, mine, next, 1}, {false, from_prev, prev, 1}};
    g_world->batch_isend_irecv(ops)->wait();
    auto a = to_double_vector(from_prev);
    for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(a[i], value(prev, i)) << dtype_name(d);
    if (P > 2) {
      auto b = to_double_vector(from_next);
      for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(b[i], value(next, i)) << dtype_name(d);
    }
  }
  // Plain send/recv, odd ranks first receiving (no deadlock: nonblocking).
  // Not on NCCL, whose sends complete only when received and run in order
  // on the group's stream: a ring of sends before receives deadlocks there
  // (dist/nccl.h; exchanges use one batch, as above).
  Tensor x = filled(me, 4, DType::F64), y = empty({4}, DType::F64, g_device);
  if (kNccl) {
    EXPECT_THROW(g_world->send(x, me, 0), ValueError);
    return;
  }
  WorkPtr s = g_world->send(x, next, 7);
  WorkPtr r = g_world->recv(y, prev, 7);
  r->wait();
  s->wait();
  EXPECT_EQ(to_double_vector(y)[3], value(prev, 3));
  EXPECT_THROW(g_world->send(x, me, 0), ValueError);
}

TEST(Collectives, EmptyTensorsAndBarrier) {
  Tensor e = empty({0}, DType::F32, g_device);
  g_world->all_reduce(e, ReduceOp::Sum)->wait();
  Tensor out = empty({0}, DType::F32, g_device);
  g_world->all_gather(e, out)->wait();
  g_world->barrier()->wait();
  SUCCEED();
}

TEST(Collectives, SubGroupsOfASplitWorld) {
  if (kNccl)
    GTEST_SKIP()
        << "sub-groups are split from the MPI world; the mesh gives each its own NCCL group";
  const int me = g_world->rank();
  auto half = split_group(g_world, me % 2, "parity");
  EXPECT_EQ(half->members().front(), me % 2);
  Tensor t = from_vector(std::vector<double>{static_cast<double>(me)}, {1}, DType::I64);
  half->all_reduce(t, ReduceOp::Sum)->wait();
  int64_t expect = 0;
  for (int r : half->members()) expect += r;
  EXPECT_EQ(item(t), static_cast<double>(expect));
}

TEST(Collectives, TimeoutNamesTheGroupOpAndPeersAndRecovers) {
  if (kNccl)
    GTEST_SKIP() << "timeouts are tested on the MPI group; the NCCL stand-in blocks in MPI";
  if (g_world->size() < 2) GTEST_SKIP();
  const int me = g_world->rank();
  auto g = split_group(g_world, 0, "late");
  Tensor t = from_vector(std::vector<double>{1.0}, {1});
  if (me == 0) {
    g->set_timeout(std::chrono::milliseconds(150));
    WorkPtr w = g->all_reduce(t, ReduceOp::Sum);
    try {
      w->wait();
      FAIL() << "expected a timeout";
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("process group 'late'"), std::string::npos) << m;
      EXPECT_NE(m.find("all_reduce(sum)"), std::string::npos) << m;
      EXPECT_NE(m.find("f32 [1]"), std::string::npos) << m;
      EXPECT_NE(m.find("world ranks [0, 1"), std::string::npos) << m;
      EXPECT_NE(m.find("timed out after 150 ms"), std::string::npos) << m;
    }
    w->wait_for(std::chrono::seconds(60));  // the others arrive later; the same Work completes
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    g->all_reduce(t, ReduceOp::Sum)->wait();
  }
  EXPECT_EQ(item(t), static_cast<double>(g_world->size()));
}

TEST(Collectives, ValidateModeReportsSizeMismatchOnEveryRank) {
  if (kNccl) GTEST_SKIP() << "validate mode is tested on the MPI group it shares its checks with";
  if (g_world->size() < 2) GTEST_SKIP();
  auto g = split_group(g_world, 0, "checked");
  g->set_validate(true);
  const int me = g_world->rank();
  Tensor t = empty({me == 1 ? 5 : 4}, DType::F32);
  fill_(t, 1.0);
  try {
    g->all_reduce(t, ReduceOp::Sum);
    FAIL() << "expected MismatchError";
  } catch (const MismatchError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks disagree on all_reduce"), std::string::npos) << m;
    EXPECT_NE(m.find("numel 5"), std::string::npos) << m;
  }
  // Uneven all_gather pieces are allowed when every rank passes the same
  // counts; counts or outputs that disagree are not (caught on every rank,
  // before rank 1's own check could leave the others waiting).
  const int P = g->size();
  std::vector<int64_t> counts(P);
  for (int r = 0; r < P; ++r) counts[r] = r + 1;
  Tensor piece = full({me + 1}, static_cast<double>(me), DType::F32);
  Tensor whole = empty({P * (P + 1) / 2}, DType::F32);
  EXPECT_NO_THROW(g->all_gather_uneven(piece, whole, counts)->wait());
  EXPECT_EQ(to_double_vector(whole).back(), static_cast<double>(P - 1));
  std::vector<int64_t> swapped = counts;
  if (me == 1) std::swap(swapped[0], swapped[1]);
  try {
    g->all_gather_uneven(piece, whole, swapped);
    FAIL() << "expected MismatchError";
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on all_gather_uneven"), std::string::npos)
        << e.what();
  }
  Tensor wrong = empty({me == 1 ? 2 * P : P}, DType::F32);
  Tensor one = full({1}, 1.0, DType::F32);
  try {
    g->all_gather(one, wrong);
    FAIL() << "expected MismatchError";
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on all_gather"), std::string::npos)
        << e.what();
  }
  // p2p: rank 1 sends 3 elements where rank 0 expects 4.
  if (me <= 1) {
    Tensor s = empty({3}, DType::F32), r = empty({4}, DType::F32);
    fill_(s, 0.0);
    if (me == 1) {
      g->send(s, 0, 3)->wait();
    } else {
      EXPECT_THROW(g->recv(r, 1, 3), MismatchError);
      Tensor drain = empty({3}, DType::F32);  // take the message so nothing is left in flight
      g->set_validate(false);
      g->recv(drain, 1, 3)->wait();
    }
  }
}

TEST(Mesh, CommunicatorsMatchTheShape) {
  if (kNccl) GTEST_SKIP() << "the mesh is built from the MPI world";
  const int P = g_world->size();
  MeshShape shape;
  if (P == 8)
    shape = {2, 2, 2};
  else if (P == 4)
    shape = {2, 2, 1};
  else
    shape = {1, 1, P};
  DeviceMesh mesh(g_world, shape);
  const int me = g_world->rank();
  auto find = [&](const std::vector<std::vector<int>>& gs) {
    for (const auto& g : gs) {
      if (std::find(g.begin(), g.end(), me) != g.end()) return g;
    }
    return std::vector<int>{};
  };
  EXPECT_EQ(mesh.tp()->members(), find(shape.groups(MeshDim::TP)));
  EXPECT_EQ(mesh.dp()->members(), find(shape.groups(MeshDim::DP)));
  EXPECT_EQ(mesh.pp()->members(), find(shape.groups(MeshDim::PP)));
  EXPECT_EQ(mesh.model_parallel()->members(), find(shape.model_parallel_groups()));
  const auto emb = find(shape.embedding_groups());
  if (emb.empty()) {
    EXPECT_EQ(mesh.embedding(), nullptr);
  } else {
    ASSERT_NE(mesh.embedding(), nullptr);
    EXPECT_EQ(mesh.embedding()->members(), emb);
  }
  // groups(): every group of more than one rank, each once (a replay of a
  // captured step is watched on each).
  std::vector<const ProcessGroup*> want;
  for (const ProcessGroupPtr& g :
       {mesh.tp(), mesh.dp(), mesh.pp(), mesh.model_parallel(), mesh.embedding(), mesh.ep(),
        mesh.expert_dp(), mesh.cp(), mesh.cp_a2a(), mesh.cp_ring()}) {
    if (g && g->size() > 1 && std::find(want.begin(), want.end(), g.get()) == want.end())
      want.push_back(g.get());
  }
  std::vector<const ProcessGroup*> got;
  for (const ProcessGroupPtr& g : mesh.groups()) {
    EXPECT_GT(g->size(), 1) << g->name();
    got.push_back(g.get());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.empty(), P == 1);  // (a world of one has no group of two)
  EXPECT_EQ(mesh.node().num_nodes, 1);
  EXPECT_EQ(mesh.local_device(), me);
  // A wrong world size is refused before any communicator is made.
  MeshShape bad{P + 1, 1, 1};
  EXPECT_THROW(DeviceMesh(g_world, bad), ConfigError);
}

// ---- NCCL: stream-ordered waits and the watchdog -------------------------------
// wait() orders the compute stream after the call; the host does not wait.
// Computing on a result, reducing it again and reading it at the end gives
// the exact values (small integers, also in bf16, whose result is copied
// back from an f32 buffer after the wait).
TEST(NcclGroup, WorkQueuedAfterAWaitSeesTheResult) {
  if (!kNccl) GTEST_SKIP() << "NCCL only";
  const int P = g_world->size(), me = g_world->rank();
  for (DType d : {DType::F32, DType::BF16}) {
    const int64_t n = 45;
    Tensor a = filled(me, n, d);
    cuda::synchronize(g_device.index);
#ifdef TRIAD_NCCL_ON_SIM
    const auto before = triad_sim::counters();
#endif
    Tensor t = add(a, a);
    g_world->all_reduce(t, ReduceOp::Sum)->wait();
    Tensor u = add(t, full({n}, 1.0, d, g_device));
    g_world->all_reduce(u, ReduceOp::Sum)->wait();
#ifdef TRIAD_NCCL_ON_SIM
    // Nothing made the host wait, and the work is still queued.
    const auto after = triad_sim::counters();
    EXPECT_EQ(after.host_waits, before.host_waits) << dtype_name(d);
    EXPECT_EQ(after.not_ready_queries, before.not_ready_queries) << dtype_name(d);
    EXPECT_GT(triad_sim::pending_work(), 0) << dtype_name(d);
#endif
    const std::vector<double> got = to_double_vector(to_device(u, Device::cpu()));
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < P; ++r) s += value(r, i);
      ASSERT_EQ(got[i], P * (2 * s + 1)) << dtype_name(d) << " element " << i;
    }
  }
}

// A collective issued while the compute stream is in capture is the
// graph's (train.cuda_graph's data-parallel reductions): the capture runs
// nothing, and each replay reduces what the graph's earlier work wrote from
// the input refilled before it, then the work after the wait reads the
// result. Asking whether the captured call has completed is refused by
// name. In bf16 the sum goes through an f32 copy made in the graph too.
TEST(NcclGroup, ACollectiveCapturedInAGraphReducesAtEachReplay) {
  if (!kNccl) GTEST_SKIP() << "NCCL only";
  const int P = g_world->size(), me = g_world->rank();
  const int64_t n = 29;
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor in = filled(me, n, d), out;
    cuda::synchronize(g_device.index);
    std::string refused;
    cuda::Graph graph = cuda::capture(g_device.index, [&] {
      Tensor t = add(in, in);
      WorkPtr w = g_world->all_reduce(t, ReduceOp::Sum);
      try {
        w->is_completed();
      } catch (const Error& e) {
        refused = e.what();
      }
      w->wait();
      out = add(t, full({n}, 1.0, d, g_device));
    });
    EXPECT_NE(refused.find("inside a CUDA graph's capture"), std::string::npos) << refused;
    for (int k : {2, 5}) {
      copy_(in, filled(me + k, n, d));
      graph.replay();
      const std::vector<double> got = to_double_vector(to_device(out, Device::cpu()));
      for (int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (int r = 0; r < P; ++r) s += value(r + k, i);
        const double want = 2 * s + 1;
        ASSERT_NEAR(got[i], want, d == DType::BF16 ? want / 128 : 0)
            << "replay " << k << " element " << i;
      }
    }
  }
}

// Grouped NCCL calls captured together: uneven all-gather pieces (a grouped
// launch of per-rank broadcasts) and a ring's sends and receives (one
// batch), each replay moving what was refilled before it.
TEST(NcclGroup, GroupedCallsCapturedInAGraphRunAtEachReplay) {
  if (!kNccl) GTEST_SKIP() << "NCCL only";
  const int P = g_world->size(), me = g_world->rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  std::vector<int64_t> counts;
  for (int r = 0; r < P; ++r) counts.push_back(r + 1);
  const int64_t total = int64_t(P) * (P + 1) / 2;
  Tensor mine = filled(me, me + 1, DType::F32), all = empty({total}, DType::F32, g_device);
  Tensor out = filled(me, 7, DType::F32), in = empty({7}, DType::F32, g_device);
  cuda::synchronize(g_device.index);
  cuda::Graph g = cuda::capture(g_device.index, [&] {
    g_world->all_gather_uneven(mine, all, counts)->wait();
    if (P > 1) g_world->batch_isend_irecv({{true, out, next, 0}, {false, in, prev, 0}})->wait();
  });
  for (int k : {3, 8}) {
    SCOPED_TRACE("replay " + std::to_string(k));
    copy_(mine, filled(me + k, me + 1, DType::F32));
    copy_(out, filled(me + k, 7, DType::F32));
    g.replay();
    const std::vector<double> gathered = to_double_vector(to_device(all, Device::cpu()));
    int64_t at = 0;
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i <= r; ++i) ASSERT_EQ(gathered[at++], value(r + k, i)) << "rank " << r;
    if (P == 1) continue;
    const std::vector<double> received = to_double_vector(to_device(in, Device::cpu()));
    for (int64_t i = 0; i < 7; ++i) ASSERT_EQ(received[i], value(prev + k, i)) << i;
  }
}

#ifdef TRIAD_NCCL_ON_SIM
// TRIAD_NCCL_BLOCKING_WAIT=1 (read when a group is made): wait() also makes
// the host wait for the call.
TEST(NcclGroup, BlockingWaitMakesTheHostWaitToo) {
  auto bootstrap = split_group(g_host_world, 0, "blocking");
  ::setenv("TRIAD_NCCL_BLOCKING_WAIT", "1", 1);
  auto g = make_nccl_group(bootstrap, g_world->rank());
  ::unsetenv("TRIAD_NCCL_BLOCKING_WAIT");
  Tensor t = filled(g->rank(), 8, DType::F32);
  cuda::synchronize(g_device.index);
  const auto before = triad_sim::counters();
  WorkPtr w = g->all_reduce(t, ReduceOp::Sum);
  w->wait();
  EXPECT_TRUE(w->is_completed());
  const auto after = triad_sim::counters();
  EXPECT_GT(after.not_ready_queries + after.host_waits,
            before.not_ready_queries + before.host_waits);
  const std::vector<double> got = to_double_vector(to_device(t, Device::cpu()));
  for (int64_t i = 0; i < 8; ++i) {
    double s = 0;
    for (int r = 0; r < g->size(); ++r) s += value(r, i);
    EXPECT_EQ(got[i], s) << i;
  }
}

// A fresh NCCL group over the MPI world, on this rank's simulated GPU.
ProcessGroupPtr fresh_nccl_group(std::chrono::milliseconds timeout) {
  auto bootstrap = split_group(g_host_world, 0, "watched");
  bootstrap->set_timeout(timeout);
  return make_nccl_group(bootstrap, g_world->rank());
}

// The next call on `g`, a group watched with a timeout of 100 ms, raises
// the TimeoutError of the late call described by `late`.
void expect_timed_out(const ProcessGroupPtr& g, const std::string& late) {
  try {
    Tensor more = filled(g->rank(), 6, DType::F32);
    g->all_reduce(more, ReduceOp::Sum);
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("process group 'watched/nccl'"), std::string::npos) << m;
    EXPECT_NE(m.find(late), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 100 ms; the communicator was aborted"), std::string::npos)
        << m;
  }
}

// On the simulator, the GPU runs a stream's work only when the program's
// thread needs it: a call whose result the program does not ask for is, to
// the watchdog's thread, a call that has not finished.
TEST(NcclGroup, TheWatchdogFailsACallPastTheTimeoutAndTheNextCallRaisesIt) {
  auto g = fresh_nccl_group(std::chrono::milliseconds(100));
  Tensor t = filled(g->rank(), 6, DType::F32);
  cuda::synchronize(g_device.index);
  WorkPtr w = g->all_reduce(t, ReduceOp::Sum);
  w->wait();  // stream-ordered: returns at once
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  expect_timed_out(g, "all_reduce(sum) of f32 [6]");
  EXPECT_THROW(w->wait(), TimeoutError);  // the group stays failed
  cuda::synchronize(g_device.index);
}

// A CUDA graph's captured calls are not watched; its replay is, as one call
// of each group (watch_device_work, which train.cuda_graph calls after each
// replay): a replay that has not finished past the group's timeout fails
// the group, the next call raising it with the replay named. One that
// finishes in time leaves the group as it was, and inside a capture the
// watch is refused.
TEST(NcclGroup, AReplayPastTheTimeoutFailsTheGroupWatchingIt) {
  const int64_t n = 6;
  for (const auto timeout : {std::chrono::milliseconds(100), std::chrono::milliseconds(300000)}) {
    const bool late = timeout.count() < 1000;
    SCOPED_TRACE(late ? "late" : "in time");
    auto g = fresh_nccl_group(timeout);
    Tensor t = filled(g->rank(), n, DType::F32);
    cuda::synchronize(g_device.index);
    std::string refused;
    cuda::Graph graph = cuda::capture(g_device.index, [&] {
      g->all_reduce(t, ReduceOp::Sum)->wait();
      try {
        g->watch_device_work("a replay");
      } catch (const Error& e) {
        refused = e.what();
      }
    });
    EXPECT_NE(refused.find("inside a CUDA graph's capture"), std::string::npos) << refused;
    graph.replay();
    g->watch_device_work("a replay of the test's graph");
    if (!late) {
      cuda::synchronize(g_device.index);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Tensor more = filled(g->rank(), n, DType::F32);
      EXPECT_NO_THROW(g->all_reduce(more, ReduceOp::Sum)->wait());
      cuda::synchronize(g_device.index);
      continue;
    }
    // (The simulator runs the work queued after the replay only when the
    // program's thread needs it: to the watchdog the replay has not ended.)
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    expect_timed_out(g, "a replay of the test's graph");
    cuda::synchronize(g_device.index);
  }
}

// Waiting for `w` raises an Error, not a timeout, whose message holds each
// of `pieces`.
void expect_failure(const WorkPtr& w, const std::vector<std::string>& pieces) {
  try {
    w->wait();
    ADD_FAILURE() << "expected an Error";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "not a timeout: " << e.what();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& piece : pieces) EXPECT_NE(m.find(piece), std::string::npos) << m;
  }
}

TEST(NcclGroup, AnAsynchronousNcclErrorAbortsTheGroupAndNamesTheCall) {
  auto g = fresh_nccl_group(std::chrono::minutes(5));
  Tensor t = filled(g->rank(), 3, DType::BF16);
  WorkPtr w = g->all_reduce(t, ReduceOp::Max);
  testing::mock_nccl::fail_newest_communicator(2);  // ncclSystemError
  expect_failure(
      w, {"process group 'watched/nccl'", "all_reduce(max) of bf16 [3]", "failed: NCCL error 2"});
  Tensor other = filled(g->rank(), 3, DType::F32);
  EXPECT_THROW(g->broadcast(other, 0), Error);
  // The world's group is untouched.
  Tensor x = filled(g_world->rank(), 4, DType::F32);
  EXPECT_NO_THROW(g_world->all_reduce(x, ReduceOp::Sum)->wait());
  cuda::synchronize(g_device.index);
}

// NcclOptions::reduce_half_natively (the data-parallel groups under
// train.grad_precision bf16): bf16 all-reduces and reduce-scatters go to
// NCCL as bf16, half the bytes of the default's f32 copies, with the same
// sums where bf16 holds them (small integers); f32 tensors are unaffected.
TEST(NcclGroup, HalfTensorsReduceNativelyWhenAsked) {
  const int P = g_host_world->size(), me = g_host_world->rank();
  auto through_f32 = make_nccl_group(split_group(g_host_world, 0, "through_f32"), me);
  NcclOptions options;
  options.reduce_half_natively = true;
  auto native = make_nccl_group(split_group(g_host_world, 0, "native"), me, options);
  const int64_t n = 8 * P;
  double sum = 0;
  for (int r = 0; r < P; ++r) sum += value(r, 3);
  for (const auto& g : {through_f32, native}) {
    const bool half = g == native;
    SCOPED_TRACE(g->name());
    Tensor t = filled(me, n, DType::BF16);
    long bytes = testing::mock_nccl::reduced_bytes();
    long halves = testing::mock_nccl::half_reductions();
    g->all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_EQ(testing::mock_nccl::reduced_bytes() - bytes, n * (half ? 2 : 4));
    EXPECT_EQ(testing::mock_nccl::half_reductions() - halves, half ? 1 : 0);
    EXPECT_EQ(to_double_vector(to_device(t, Device::cpu()))[3], sum);
    Tensor in = filled(me, n, DType::BF16), out = empty({8}, DType::BF16, g_device);
    bytes = testing::mock_nccl::reduced_bytes();
    g->reduce_scatter(in, out, ReduceOp::Sum)->wait();
    EXPECT_EQ(testing::mock_nccl::reduced_bytes() - bytes, n * (half ? 2 : 4));
    EXPECT_EQ(to_double_vector(to_device(out, Device::cpu()))[3], [&] {
      double s = 0;
      for (int r = 0; r < P; ++r) s += value(r, me * 8 + 3);
      return s;
    }());
    // f32 as ever.
    Tensor f = filled(me, n, DType::F32);
    bytes = testing::mock_nccl::reduced_bytes();
    g->all_reduce(f, ReduceOp::Sum)->wait();
    EXPECT_EQ(testing::mock_nccl::reduced_bytes() - bytes, n * 4);
  }
  cuda::synchronize(g_device.index);
}

// DeviceMesh::use_cuda(device, true) (train.grad_precision bf16): the
// data-parallel group reduces bf16 natively, the tensor-parallel one
// through f32 still.
TEST(NcclGroup, TheMeshReducesHalfGradientsNativelyOverDataParallelRanksAlone) {
  const int P = g_host_world->size();
  if (P % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  DeviceMesh mesh(g_host_world, MeshShape{2, 1, P / 2});
  mesh.use_cuda(g_device.index, true);
  for (const auto& [group, native] : {std::pair{mesh.tp(), false}, {mesh.dp(), true}}) {
    if (group->size() == 1) continue;
    SCOPED_TRACE(group->name());
    Tensor t = filled(g_host_world->rank(), 16, DType::BF16);
    const long halves = testing::mock_nccl::half_reductions();
    group->all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_EQ(testing::mock_nccl::half_reductions() - halves, native ? 1 : 0);
  }
  cuda::synchronize(g_device.index);
}

// NcclOptions::p2p_streams_per_peer: exchanges with the previous and the
// next rank go over links of their own (communicators of two), carrying the
// same payloads as the group's own communicator; an asynchronous error on a
// link fails the group and names the link.
TEST(NcclGroup, NeighbourLinksCarryTheExchangesAndNameTheirErrors) {
  const int P = g_host_world->size(), me = g_host_world->rank();
  if (P < 3) GTEST_SKIP() << "links are made for groups of more than two ranks";
  // (Made first: the linked group's second link is this process's newest
  // communicator, failed below.)
  auto unlinked = make_nccl_group(split_group(g_host_world, 0, "unlinked"), me);
  auto bootstrap = split_group(g_host_world, 0, "linked");
  bootstrap->set_timeout(std::chrono::minutes(5));
  NcclOptions options;
  options.p2p_streams_per_peer = true;
  auto g = make_nccl_group(bootstrap, me, options);
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  for (DType d : {DType::F32, DType::BF16, DType::I64}) {
    Tensor mine = filled(me, 11, d), from_prev = empty({11}, d, g_device),
           from_next = empty({11}, d, g_device);
    const std::vector<P2POp> ops{{true, mine, next, 0},
                                 {true, mine, prev, 0},
                                 {false, from_prev, prev, 0},
                                 {false, from_next, next, 0}};
    // The four operations go over communicators of two; without links,
    // over the group's own.
    const long before = testing::mock_nccl::p2p_operations_on_communicators_of(2);
    g->batch_isend_irecv(ops)->wait();
    EXPECT_EQ(testing::mock_nccl::p2p_operations_on_communicators_of(2), before + 4);
    unlinked->batch_isend_irecv(ops)->wait();
    EXPECT_EQ(testing::mock_nccl::p2p_operations_on_communicators_of(2), before + 4);
    const auto a = to_double_vector(to_device(from_prev, Device::cpu()));
    const auto b = to_double_vector(to_device(from_next, Device::cpu()));
    for (int64_t i = 0; i < 11; ++i) {
      ASSERT_EQ(a[i], value(prev, i)) << dtype_name(d);
      ASSERT_EQ(b[i], value(next, i)) << dtype_name(d);
    }
  }
  // Collectives still run on the group's own communicator.
  Tensor t = filled(me, 5, DType::F32);
  g->all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_EQ(to_double_vector(to_device(t, Device::cpu()))[2], [&] {
    double s = 0;
    for (int r = 0; r < P; ++r) s += value(r, 2);
    return s;
  }());
  // The newest communicator is this rank's second link: to the next rank,
  // or for rank 0 (whose links are made with ranks 1 and then P - 1) the
  // previous one.
  const int newest = me == 0 ? prev : next;
  Tensor x = filled(me, 4, DType::F32), y = empty({4}, DType::F32, g_device);
  WorkPtr w = g->batch_isend_irecv({{true, x, next, 0}, {false, y, prev, 0}});
  testing::mock_nccl::fail_newest_communicator(2);
  expect_failure(w, {"process group 'linked/nccl'", "NCCL error 2",
                     "on the link to rank " + std::to_string(newest)});
  cuda::synchronize(g_device.index);
}
#endif

}  // namespace
}  // namespace triad::dist

int main(int argc, char** argv) {
#ifdef TRIAD_COLLECTIVES_ON_NCCL
  // A rank without a GPU of its own: skipped (CTest's code 77), not failed.
  if (triad::cuda::device_count() < 1) {
    std::printf("no CUDA device visible: skipping the NCCL collectives\n");
    return 77;
  }
#endif
  return triad::testing::run_mpi_tests(
      argc, argv,
      [](const triad::dist::ProcessGroupPtr& w) {
#ifdef TRIAD_COLLECTIVES_ON_NCCL
        // One GPU per rank (on the simulator, TRIAD_SIM_DEVICES), an NCCL group over
        // the world.
        triad::dist::g_device = triad::Device::cuda(w->rank());
        triad::dist::g_world = triad::dist::make_nccl_group(w, w->rank());
        triad::dist::g_host_world = w;
#else
        triad::dist::g_world = w;
#endif
      },
      [] {
        triad::dist::g_world.reset();
        triad::dist::g_host_world.reset();
      });
}
