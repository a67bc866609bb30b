#include "triad/parallel/tensor/shard.h"

#include <algorithm>

#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::tp {

int64_t padded_vocab(int64_t vocab_size, int tp) {
  const int64_t m = 128LL * tp;
  return (vocab_size + m - 1) / m * m;
}

std::vector<int64_t> ShardSpec::block_sizes(int64_t n) const {
  if (!blocks.empty()) return blocks;
  return std::vector<int64_t>(static_cast<size_t>(std::max(groups, 1)), n / std::max(groups, 1));
}

namespace {
// Block j's whole piece, 0 for any.
int64_t unit_of(const std::vector<int64_t>& units, size_t j) {
  return j < units.size() ? units[j] : 0;
}
}  // namespace

ShardSpec::Piece ShardSpec::piece(size_t block, int64_t b, int rank, int size) const {
  const int64_t u = unit_of(units, block);
  if (u > 0 && b / u < size) {  // shared: size / (b / u) ranks hold each whole piece
    const int64_t holders = size / (b / u);
    return {u, rank / holders * u};
  }
  return {b / size, rank * (b / size)};
}

bool ShardSpec::shares_blocks(int size) const {
  if (!split) return false;
  for (size_t j = 0; j < units.size(); ++j) {
    if (units[j] > 0 && j < blocks.size() && blocks[j] / units[j] < size) return true;
  }
  return false;
}

void ShardSpec::check_cut(int64_t n, int size, const Shape& full) const {
  if (blocks.empty() && groups > std::max<int64_t>(n, 1)) {
    // (More groups than rows: no cut, and no list of them to make.)
    throw ShapeError("shard: dim " + std::to_string(dim) + " of " + shape_str(full) +
                     " (padded to " + std::to_string(n) + ") cannot be cut into " +
                     std::to_string(groups) + " groups");
  }
  const std::vector<int64_t> sizes = block_sizes(n);
  int64_t total = 0;
  // (Whole pieces are given block by block, along dim 0.)
  bool fits = units.empty() || (units.size() == blocks.size() && dim == 0);
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t b = sizes[j], u = unit_of(units, j);
    fits = fits && !__builtin_add_overflow(total, b, &total);
    if (u <= 0) {
      fits = fits && b % size == 0;
    } else {
      // Whole pieces split evenly, or a few shared evenly.
      const int64_t pieces = b / u;
      fits = fits && b % u == 0 && pieces > 0 &&
             (pieces >= size ? pieces % size == 0 : size % pieces == 0);
    }
  }
  if (!fits || total != n || n < full[dim]) {
    auto list = [](const std::vector<int64_t>& v) {
      std::string out;
      for (int64_t b : v) out += (out.empty() ? "" : ", ") + std::to_string(b);
      return "[" + out + "]";
    };
    throw ShapeError("shard: dim " + std::to_string(dim) + " of " + shape_str(full) +
                     " (padded to " + std::to_string(n) + ") does not split into blocks of " +
                     list(sizes) + (units.empty() ? "" : " in whole pieces of " + list(units)) +
                     " over " + std::to_string(size) + " ranks");
  }
}

Shape ShardSpec::shard_shape(const Shape& full, int size) const {
  Shape s = full;
  if (!split) return s;
  const int64_t n = padded ? padded : full[dim];
  if (units.empty()) {
    s[dim] = n / size;
    return s;
  }
  const std::vector<int64_t> sizes = block_sizes(n);
  s[dim] = 0;
  for (size_t j = 0; j < sizes.size(); ++j) s[dim] += piece(j, sizes[j], 0, size).width;
  return s;
}

Tensor ShardSpec::cut(const Tensor& full, int rank, int size) const {
  autograd::NoGradGuard ng;
  if (!split) return full;
  Tensor t = full.detach();
  const int64_t n = padded ? padded : t.size(dim);
  check_cut(n, size, full.shape());
  if (n > t.size(dim)) {
    Shape pad = t.shape();
    pad[dim] = n - t.size(dim);
    t = concat({t, zeros(pad, t.dtype(), t.device())}, dim);
  }
  const std::vector<int64_t> sizes = block_sizes(n);
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const Piece p = piece(j, sizes[j], rank, size);
    parts.push_back(narrow(t, dim, at + p.start, p.width));
    at += sizes[j];
  }
  return contiguous(parts.size() == 1 ? parts[0] : concat(parts, dim)).detach();
}

Tensor ShardSpec::assemble(const std::vector<Tensor>& shards, const Shape& full_shape) const {
  autograd::NoGradGuard ng;
  if (!split) return shards.at(0);
  const int size = static_cast<int>(shards.size());
  // Each block's pieces within a shard; with no shared blocks the padded
  // dimension is size times the shard's.
  const std::vector<int64_t> sizes =
      block_sizes(units.empty() ? shards[0].size(dim) * size : full_shape[dim]);
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t width = piece(j, sizes[j], 0, size).width;
    // The ranks holding the block's pieces in order: every rank, or the
    // first of each piece's holders.
    const int step = static_cast<int>(size * width / sizes[j]);
    for (int r = 0; r < size; r += step) pieces.push_back(narrow(shards[r], dim, at, width));
    at += width;
  }
  Tensor all = concat(pieces, dim);
  return contiguous(narrow(all, dim, 0, full_shape[dim])).detach();
}

std::vector<ShardSpec::SharedPiece> ShardSpec::shared_pieces(int rank, int size,
                                                             int64_t* shared_rows) const {
  std::vector<SharedPiece> out;
  int64_t at = 0, shared = 0;
  if (shares_blocks(size)) {
    for (size_t j = 0; j < blocks.size(); ++j) {
      const Piece p = piece(j, blocks[j], rank, size);
      const bool is_shared = unit_of(units, j) > 0 && blocks[j] / units[j] < size;
      if (is_shared) {
        out.push_back({at, shared + p.start, p.width});
        shared += blocks[j];
      }
      at += p.width;
    }
  }
  if (shared_rows) *shared_rows = shared;
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ShardSpec::repeated_elements(const Shape& full_shape,
                                                                      int rank, int size) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t row = 1;
  for (size_t d = 1; d < full_shape.size(); ++d) row *= full_shape[d];
  if (!shares_blocks(size)) return out;
  int64_t at = 0;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const Piece p = piece(j, blocks[j], rank, size);
    // Not the first of a shared piece's holders: rank - 1 holds it too.
    if (rank > 0 && piece(j, blocks[j], rank - 1, size).start == p.start)
      out.push_back({at * row, (at + p.width) * row});
    at += p.width;
  }
  return out;
}

}  // namespace triad::tp
