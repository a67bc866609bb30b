#include "triad/parallel/tensor/shard.h"

#include <algorithm>

#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::tp {

int64_t padded_vocab(int64_t vocab_size, int tp) {
  const int64_t m = 128LL * tp;
  return (vocab_size + m - 1) / m * m;
}

Shape ShardSpec::shard_shape(const Shape& full, int size) const {
  Shape s = full;
  if (!split) return s;
  const int64_t n = padded ? padded : full[dim];
  s[dim] = n / size;
  return s;
}

std::vector<int64_t> ShardSpec::block_sizes(int64_t n) const {
  if (!blocks.empty()) return blocks;
  return std::vector<int64_t>(static_cast<size_t>(std::max(groups, 1)), n / std::max(groups, 1));
}

Tensor ShardSpec::cut(const Tensor& full, int rank, int size) const {
  autograd::NoGradGuard ng;
  if (!split) return full;
  Tensor t = full.detach();
  const int64_t n = padded ? padded : t.size(dim);
  const std::vector<int64_t> sizes = block_sizes(n);
  int64_t total = 0;
  bool even = true;
  for (int64_t b : sizes) {
    total += b;
    even = even && b % size == 0;
  }
  if (!even || total != n || n < t.size(dim)) {
    std::string list;
    for (int64_t b : sizes) list += (list.empty() ? "" : ", ") + std::to_string(b);
    throw ShapeError("shard: dim " + std::to_string(dim) + " of " + shape_str(full.shape()) +
                     " (padded to " + std::to_string(n) + ") does not split into blocks of [" +
                     list + "] over " + std::to_string(size) + " ranks");
  }
  if (n > t.size(dim)) {
    Shape pad = t.shape();
    pad[dim] = n - t.size(dim);
    t = concat({t, zeros(pad, t.dtype(), t.device())}, dim);
  }
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t b : sizes) {
    const int64_t piece = b / size;
    parts.push_back(narrow(t, dim, at + rank * piece, piece));
    at += b;
  }
  return contiguous(parts.size() == 1 ? parts[0] : concat(parts, dim)).detach();
}

Tensor ShardSpec::assemble(const std::vector<Tensor>& shards, const Shape& full_shape) const {
  autograd::NoGradGuard ng;
  if (!split) return shards.at(0);
  const int size = static_cast<int>(shards.size());
  // Each block's piece within a shard: the padded dimension is size times
  // the shard's.
  const std::vector<int64_t> sizes = block_sizes(shards[0].size(dim) * size);
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (int64_t b : sizes) {
    const int64_t piece = b / size;
    for (int r = 0; r < size; ++r) pieces.push_back(narrow(shards[r], dim, at, piece));
    at += piece;
  }
  Tensor all = concat(pieces, dim);
  return contiguous(narrow(all, dim, 0, full_shape[dim])).detach();
}

}  // namespace triad::tp
