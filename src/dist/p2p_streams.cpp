// TRIAD_NCCL_P2P_STREAMS: how the pipeline group's NCCL communicator carries
// point-to-point calls (dist/nccl.h). Read in every build: the simulator's
// model of the executor follows it too.
#include <cstdlib>
#include <string>

#include "triad/core/error.h"
#include "triad/dist/nccl.h"

namespace triad::dist {

bool nccl_p2p_streams_per_peer() {
  const char* value = std::getenv("TRIAD_NCCL_P2P_STREAMS");
  const std::string choice = value ? value : "per-peer";
  if (choice == "per-peer") return true;
  if (choice == "one") return false;
  throw ConfigError("TRIAD_NCCL_P2P_STREAMS='" + choice + "': expected per-peer or one");
}

}  // namespace triad::dist
