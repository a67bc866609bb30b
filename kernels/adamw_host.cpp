// Host half of the multi-tensor AdamW: which chunks of which tensors each
// launch runs.
#include <stdexcept>

#include "adamw.h"

namespace triad::kernels {

std::vector<AdamWLaunch> plan_adamw_multi(const std::vector<int64_t>& sizes, int max_tensors,
                                          int max_blocks, int64_t chunk) {
  if (max_tensors < 1 || max_blocks < 1 || chunk < 1)
    throw std::invalid_argument("plan_adamw_multi: limits must be positive");
  std::vector<AdamWLaunch> launches;
  AdamWLaunch cur;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t chunks = (sizes[i] + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      bool new_slot = cur.tensors.empty() || cur.tensors.back() != static_cast<int>(i);
      const bool full = static_cast<int>(cur.blocks.size()) == max_blocks ||
                        (new_slot && static_cast<int>(cur.tensors.size()) == max_tensors);
      if (full) {
        launches.push_back(std::move(cur));
        cur = AdamWLaunch{};
        new_slot = true;
      }
      if (new_slot) cur.tensors.push_back(static_cast<int>(i));
      cur.blocks.push_back({static_cast<int>(cur.tensors.size()) - 1, c});
    }
  }
  if (!cur.blocks.empty()) launches.push_back(std::move(cur));
  return launches;
}

}  // namespace triad::kernels
