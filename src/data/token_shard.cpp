#include "triad/data/token_shard.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "triad/core/error.h"

namespace triad::data {

uint64_t check_token_shard(const std::string& path, const void* bytes, uint64_t size) {
  if (size < kShardHeaderBytes) {
    throw IoError("token shard '" + path + "': " + std::to_string(size) +
                  " bytes, shorter than the 1024-byte header");
  }
  int32_t header[3];
  std::memcpy(header, bytes, sizeof(header));
  if (header[0] != kShardMagic) {
    throw IoError("token shard '" + path + "': magic " + std::to_string(header[0]) + ", expected " +
                  std::to_string(kShardMagic));
  }
  if (header[1] != kShardVersion) {
    throw IoError("token shard '" + path + "': version " + std::to_string(header[1]) +
                  ", expected " + std::to_string(kShardVersion));
  }
  if (header[2] < 0)
    throw IoError("token shard '" + path + "': negative token count " + std::to_string(header[2]));
  const uint64_t count = static_cast<uint64_t>(header[2]);
  if (size != kShardHeaderBytes + 2 * count) {
    throw IoError("token shard '" + path + "': header says " + std::to_string(count) + " tokens (" +
                  std::to_string(kShardHeaderBytes + 2 * count) + " bytes) but the file has " +
                  std::to_string(size) + " bytes");
  }
  return count;
}

std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw IoError("token shard '" + path + "': a directory, not a shard");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("token shard '" + path + "': cannot open");
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  std::vector<char> bytes(size);
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!in) throw IoError("token shard '" + path + "': read failed");
  const uint64_t count = check_token_shard(path, bytes.data(), size);
  std::vector<uint16_t> tokens(count);
  if (count > 0) std::memcpy(tokens.data(), bytes.data() + kShardHeaderBytes, 2 * count);
  if (vocab_size > 0) {
    for (uint64_t i = 0; i < count; ++i) {
      if (tokens[i] >= vocab_size) {
        throw IoError("token shard '" + path + "': token " + std::to_string(tokens[i]) +
                      " at position " + std::to_string(i) + " is not below vocab_size " +
                      std::to_string(vocab_size));
      }
    }
  }
  return tokens;
}

TokenShardWriter::TokenShardWriter(std::string path) : path_(std::move(path)) {
  const std::string tmp = path_ + ".tmp";
  out_ = std::make_unique<std::ofstream>(tmp, std::ios::binary | std::ios::trunc);
  if (!*out_) throw IoError("token shard '" + tmp + "': cannot open for writing");
  const std::vector<char> header(kShardHeaderBytes, 0);  // the count comes at finish()
  out_->write(header.data(), static_cast<std::streamsize>(header.size()));
}

TokenShardWriter::~TokenShardWriter() {
  if (finished_) return;
  out_.reset();
  std::error_code ignored;
  std::filesystem::remove(path_ + ".tmp", ignored);
}

void TokenShardWriter::add(const std::vector<int64_t>& tokens) {
  if (finished_) throw ValueError("token shard '" + path_ + "': add() after finish()");
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 65535)
      throw ValueError("token id " + std::to_string(tokens[i]) + " does not fit in uint16");
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  if (count_ + narrow.size() > static_cast<uint64_t>(INT32_MAX)) {
    throw IoError("token shard '" + path_ + "': " + std::to_string(count_ + narrow.size()) +
                  " tokens exceed the format's int32 count");
  }
  out_->write(reinterpret_cast<const char*>(narrow.data()),
              static_cast<std::streamsize>(2 * narrow.size()));
  if (!*out_) throw IoError("token shard '" + path_ + ".tmp': write failed");
  count_ += narrow.size();
}

void TokenShardWriter::finish() {
  if (finished_) return;
  int32_t header[256];
  std::memset(header, 0, sizeof(header));
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(count_);
  out_->seekp(0);
  out_->write(reinterpret_cast<const char*>(header), sizeof(header));
  out_->close();
  if (!*out_) throw IoError("token shard '" + path_ + ".tmp': write failed");
  std::error_code ec;
  std::filesystem::rename(path_ + ".tmp", path_, ec);
  if (ec)
    throw IoError("token shard '" + path_ +
                  "': cannot move the finished .tmp there: " + ec.message());
  finished_ = true;
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TokenShardWriter writer(path);
  writer.add(std::vector<int64_t>(tokens.begin(), tokens.end()));
  writer.finish();
}

std::vector<std::string> expand_shard_paths(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (out.empty()) throw IoError("'" + pattern + "' matches no file");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace triad::data
