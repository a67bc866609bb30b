#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "triad/core/error.h"
#include "triad/dist/nccl.h"

namespace triad::dist {
namespace {

// TRIAD_NCCL_P2P_STREAMS: per-peer links unless it says one; any other
// value is named in the error.
TEST(NcclP2pStreams, TheEnvironmentPicksLinksOrOneStream) {
  const char* before = std::getenv("TRIAD_NCCL_P2P_STREAMS");
  const std::string saved = before ? before : "";
  ::unsetenv("TRIAD_NCCL_P2P_STREAMS");
  EXPECT_TRUE(nccl_p2p_streams_per_peer());
  ::setenv("TRIAD_NCCL_P2P_STREAMS", "per-peer", 1);
  EXPECT_TRUE(nccl_p2p_streams_per_peer());
  ::setenv("TRIAD_NCCL_P2P_STREAMS", "one", 1);
  EXPECT_FALSE(nccl_p2p_streams_per_peer());
  ::setenv("TRIAD_NCCL_P2P_STREAMS", "two", 1);
  try {
    nccl_p2p_streams_per_peer();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TRIAD_NCCL_P2P_STREAMS='two': expected per-peer or one"),
              std::string::npos)
        << e.what();
  }
  if (before) {
    ::setenv("TRIAD_NCCL_P2P_STREAMS", saved.c_str(), 1);
  } else {
    ::unsetenv("TRIAD_NCCL_P2P_STREAMS");
  }
}

}  // namespace
}  // namespace triad::dist
