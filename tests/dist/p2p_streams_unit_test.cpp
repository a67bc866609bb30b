#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/scoped_env.h"
#include "triad/core/error.h"
#include "triad/dist/nccl.h"

namespace triad::dist {
namespace {

// TRIAD_NCCL_P2P_STREAMS: per-peer links unless it says one; any other
// value is named in the error.
TEST(NcclP2pStreams, TheEnvironmentPicksLinksOrOneStream) {
  const testing::ScopedEnv streams("TRIAD_NCCL_P2P_STREAMS", nullptr);
  EXPECT_TRUE(nccl_p2p_streams_per_peer());
  streams.set("per-peer");
  EXPECT_TRUE(nccl_p2p_streams_per_peer());
  streams.set("one");
  EXPECT_FALSE(nccl_p2p_streams_per_peer());
  streams.set("two");
  try {
    nccl_p2p_streams_per_peer();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TRIAD_NCCL_P2P_STREAMS='two': expected per-peer or one"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::dist
