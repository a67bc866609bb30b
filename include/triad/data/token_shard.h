#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace triad::data {

// The llm.c token shard format: a 1024-byte header of 256 little-endian
// int32 (magic 20240520, version 1, token count, rest zero), then the tokens
// as uint16.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 1024;

// Reads and validates a shard: magic, version, size matching the count, and
// every token < vocab_size (when vocab_size > 0). Errors name the file.
std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size = 0);

// Checks a shard's header (magic, version, count) and its size against the
// count; returns the count. `bytes` is the whole file. Errors name the file.
uint64_t check_token_shard(const std::string& path, const void* bytes, uint64_t size);

// Writes tokens (each must fit in uint16) as a shard, atomically.
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Writes a shard a piece at a time: the tokens stream to `<path>.tmp` as
// they come, finish() writes the count into the header and renames the file.
// Destroyed without finish(), it removes the temporary and leaves no shard.
class TokenShardWriter {
 public:
  explicit TokenShardWriter(std::string path);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Each id must be in [0, 65535]: a ValueError naming it otherwise.
  void add(const std::vector<int64_t>& tokens);
  void finish();
  uint64_t tokens() const { return count_; }

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  uint64_t count_ = 0;
  bool finished_ = false;
};

// Expands a path or glob ("data/train_*.bin") into a sorted list of files;
// an error when nothing matches.
std::vector<std::string> expand_shard_paths(const std::string& pattern);

}  // namespace triad::data
