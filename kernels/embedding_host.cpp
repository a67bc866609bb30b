// Host half of the embedding backward: grouping positions by id.
#include <string>

#include "embedding.h"

namespace triad::kernels {

EmbeddingSegments group_by_id(const int64_t* ids, int64_t N, int64_t V) {
  std::vector<int64_t> count(static_cast<size_t>(V) + 1, 0);
  for (int64_t i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      throw std::invalid_argument("embedding: token id " + std::to_string(ids[i]) +
                                  " at position " + std::to_string(i) + " is outside [0, " +
                                  std::to_string(V) + ")");
    }
    ++count[static_cast<size_t>(ids[i]) + 1];
  }
  for (int64_t v = 0; v < V; ++v) count[v + 1] += count[v];  // count[v] = first slot of id v
  EmbeddingSegments s;
  s.order.resize(static_cast<size_t>(N));
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < N; ++i) s.order[static_cast<size_t>(next[ids[i]]++)] = i;  // stable
  for (int64_t v = 0; v < V; ++v) {
    if (count[v + 1] > count[v]) {
      s.seg_start.push_back(count[v]);
      s.seg_id.push_back(v);
    }
  }
  s.seg_start.push_back(N);
  return s;
}

}  // namespace triad::kernels
