#pragma once

// The main() of a test binary launched under mpirun: every rank runs the
// tests, only rank 0 prints, and the exit code is non-zero when any rank
// failed. `on_world` receives the world before the tests run and must drop
// every reference to it in `on_exit` (MPI is finalised at exit).
#include <gtest/gtest.h>

#include <functional>

#include "triad/dist/world.h"
#include "triad/ops.h"

namespace triad::testing {

inline int run_mpi_tests(int argc, char** argv,
                         const std::function<void(const dist::ProcessGroupPtr&)>& on_world,
                         const std::function<void()>& on_exit) {
  ::testing::InitGoogleTest(&argc, argv);
  dist::ProcessGroupPtr world = dist::init_world();
  on_world(world);
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  Tensor flag = from_vector(std::vector<double>{static_cast<double>(rc != 0)}, {1}, DType::I32);
  world->all_reduce(flag, dist::ReduceOp::Max)->wait();
  const bool failed = item(flag) != 0;
  on_exit();
  return failed ? 1 : 0;
}

}  // namespace triad::testing
