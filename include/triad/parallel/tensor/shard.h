#pragma once

#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::tp {

// How a parameter of a tensor-parallel model is cut from the full one. A
// split parameter holds, along `dim`, its rank's 1/tp of each of `groups`
// equal blocks (the fused QKV weight has three: q, k, v), after the full
// dimension has been padded with zeros to `padded` (vocabulary padding).
// Blocks of different sizes (grouped-query attention's q, k, v: C, then
// n_kv_head * head_dim twice) are listed in `blocks` instead.
struct ShardSpec {
  bool split = false;
  int64_t dim = 0;
  int groups = 1;
  int64_t padded = 0;  // 0: no padding
  // Replicated parameter whose gradient is a partial sum over the TP ranks:
  // under sequence parallelism LayerNorms and row-parallel biases (each
  // rank sees its share of the tokens), always the query/key norms of
  // model.qk_norm (each rank sees its share of the heads). All-reduced over
  // TP after backward.
  bool partial_grad = false;
  // The blocks' sizes along `dim` when they differ (then groups ==
  // blocks.size()); empty: `groups` equal blocks.
  std::vector<int64_t> blocks = {};
  // Each block's smallest whole piece along `dim` (a key/value head's
  // width), 0 or empty: any. A block is split only at whole pieces; one of
  // fewer whole pieces than ranks is not split but shared: each piece is
  // held by size / pieces consecutive ranks (grouped-query attention with
  // fewer key/value heads than tp ranks, each rank holding the head its
  // query heads use). Only along dim 0.
  std::vector<int64_t> units = {};

  static ShardSpec replicated(bool sp_grad = false) { return {false, 0, 1, 0, sp_grad}; }
  static ShardSpec along(int64_t dim, int groups = 1, int64_t padded = 0) {
    return {true, dim, groups, padded, false};
  }
  static ShardSpec along_blocks(int64_t dim, std::vector<int64_t> sizes,
                                std::vector<int64_t> units = {}) {
    const int n = static_cast<int>(sizes.size());
    return {true, dim, n, 0, false, std::move(sizes), std::move(units)};
  }
  // The sizes of the blocks of a (padded) dimension of n.
  std::vector<int64_t> block_sizes(int64_t n) const;
  // Throws a ShapeError unless a dimension of n (padded) cuts into shards
  // for `size` ranks under this spec (`full` names the tensor's shape).
  void check_cut(int64_t n, int size, const Shape& full) const;

  // Rank `rank`'s piece of block `block` (of size b): its width and where
  // it starts within the block.
  struct Piece {
    int64_t width, start;
  };
  Piece piece(size_t block, int64_t b, int rank, int size) const;
  // Whether some block is shared by several of `size` ranks rather than
  // split (see units).
  bool shares_blocks(int size) const;
  // The shared blocks' pieces in rank `rank`'s shard, along dim 0: where
  // each lies in the shard and where in the shared blocks laid end to end
  // (`shared_rows` rows in all). The gradients of a shared piece are partial
  // sums over the ranks sharing it.
  struct SharedPiece {
    int64_t shard_at, shared_at, width;
  };
  std::vector<SharedPiece> shared_pieces(int rank, int size, int64_t* shared_rows = nullptr) const;
  // The elements of rank `rank`'s shard that repeat an earlier rank's (its
  // shared pieces when it is not the first rank holding them), as
  // [begin, end) ranges: what a norm over the group counts once.
  std::vector<std::pair<int64_t, int64_t>> repeated_elements(const Shape& full_shape, int rank,
                                                             int size) const;

  // The shard of `full` that rank `rank` of `size` holds.
  Tensor cut(const Tensor& full, int rank, int size) const;
  // The full tensor (of shape full_shape) from every rank's shard, in order.
  Tensor assemble(const std::vector<Tensor>& shards, const Shape& full_shape) const;
  // The shard's shape.
  Shape shard_shape(const Shape& full_shape, int size) const;
};

// Vocabulary size padded to a multiple of 128 * tp (rows past vocab_size
// are zero and never affect the loss).
int64_t padded_vocab(int64_t vocab_size, int tp);

}  // namespace triad::tp
