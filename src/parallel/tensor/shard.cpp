#include "triad/parallel/tensor/shard.h"

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

Tensor ShardSpec::cut(const Tensor& full, int rank, int size) const {
  autograd::NoGradGuard ng;
  if (!split) return full;
  Tensor t = full.detach();
  const int64_t n = padded ? padded : t.size(dim);
  if (n % (static_cast<int64_t>(groups) * size) != 0 || n < t.size(dim)) {
    throw ShapeError("shard: dim " + std::to_string(dim) + " of " + shape_str(full.shape()) +
                     " (padded to " + std::to_string(n) + ") does not split into " +
                     std::to_string(groups) + " blocks over " + std::to_string(size) + " ranks");
  }
  if (n > t.size(dim)) {
    Shape pad = t.shape();
    pad[dim] = n - t.size(dim);
    t = concat({t, zeros(pad, t.dtype(), t.device())}, dim);
  }
  const int64_t block = n / groups, piece = block / size;
  std::vector<Tensor> parts;
  for (int g = 0; g < groups; ++g) parts.push_back(narrow(t, dim, g * block + rank * piece, piece));
  return contiguous(parts.size() == 1 ? parts[0] : concat(parts, dim)).detach();
}

Tensor ShardSpec::assemble(const std::vector<Tensor>& shards, const Shape& full_shape) const {
  autograd::NoGradGuard ng;
  if (!split) return shards.at(0);
  const int size = static_cast<int>(shards.size());
  const int64_t piece = shards[0].size(dim) / groups;
  std::vector<Tensor> blocks;
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < size; ++r) blocks.push_back(narrow(shards[r], dim, g * piece, piece));
  }
  Tensor all = concat(blocks, dim);
  return contiguous(narrow(all, dim, 0, full_shape[dim])).detach();
}

}  // namespace triad::tp
