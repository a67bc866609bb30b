// The embedding backward's fixed order: positions grouped by id, cut into
// pieces (embedding_order.h).
#include "backend/embedding_order.h"

#include <string>

#include "triad/core/error.h"

namespace triad::detail {

EmbeddingSegments group_by_id(const int64_t* ids, int64_t N, int64_t V) {
  std::vector<int64_t> count(static_cast<size_t>(V) + 1, 0);
  for (int64_t i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      throw ValueError("embedding: token id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
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

EmbeddingPieces cut_into_pieces(const EmbeddingSegments& s, int64_t piece) {
  if (piece <= 0) {
    throw ValueError("cut_into_pieces: piece length " + std::to_string(piece) + " must be > 0");
  }
  EmbeddingPieces p;
  p.long_first.push_back(0);
  for (size_t u = 0; u < s.seg_id.size(); ++u) {
    const int64_t begin = s.seg_start[u], end = s.seg_start[u + 1];
    if (end - begin <= piece) {
      p.piece_start.push_back(begin);
      p.piece_dest.push_back(s.seg_id[u]);
      continue;
    }
    int64_t slot = p.long_first.back();
    for (int64_t k = begin; k < end; k += piece) {
      p.piece_start.push_back(k);
      p.piece_dest.push_back(-1 - slot++);
    }
    p.long_first.push_back(slot);
    p.long_id.push_back(s.seg_id[u]);
  }
  p.piece_start.push_back(s.seg_start.empty() ? 0 : s.seg_start.back());
  return p;
}

}  // namespace triad::detail
