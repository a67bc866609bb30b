// The NCCL entry points on machines without a GPU (every build): they say
// why they cannot run instead of failing inside NCCL or CUDA.
#include <gtest/gtest.h>

#include "triad/backend/cuda.h"
#include "triad/dist/nccl.h"

namespace triad::dist {
namespace {

TEST(Nccl, FactoriesExplainWhyTheyCannotRunHere) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible (the gpu suite covers NCCL)";
  try {
    make_nccl_group(nullptr, 0);
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    const std::string msg = e.what();
    if (nccl_available()) {
      EXPECT_NE(msg.find("cuda:0 is not available (0 device(s) visible)"), std::string::npos)
          << msg;
    } else {
      EXPECT_NE(msg.find("no NCCL process group"), std::string::npos) << msg;
    }
  }
  if (!nccl_available()) {
    EXPECT_THROW(make_device_routed_group(nullptr, nullptr), NotSupportedError);
  }
}

}  // namespace
}  // namespace triad::dist
