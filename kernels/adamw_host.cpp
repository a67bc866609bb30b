// Host half of the multi-tensor AdamW: which chunks of which tensors each
// launch runs.
#include <algorithm>
#include <stdexcept>

#include "adamw.h"

namespace triad::kernels {

std::vector<AdamWLaunch> plan_adamw_multi(const std::vector<int64_t>& sizes, int max_tensors,
                                          int64_t max_blocks, int64_t chunk) {
  if (max_tensors < 1 || max_blocks < 1 || chunk < 1)
    throw std::invalid_argument("plan_adamw_multi: limits must be positive");
  std::vector<AdamWLaunch> launches;
  AdamWLaunch cur;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t chunks = (sizes[i] + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks;) {
      if (cur.blocks == max_blocks || static_cast<int>(cur.slots.size()) == max_tensors) {
        launches.push_back(std::move(cur));
        cur = AdamWLaunch{};
      }
      const int64_t take = std::min(chunks - c, max_blocks - cur.blocks);
      cur.slots.push_back({static_cast<int>(i), c, take});
      cur.blocks += take;
      c += take;
    }
  }
  if (cur.blocks > 0) launches.push_back(std::move(cur));
  return launches;
}

}  // namespace triad::kernels
