#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace triad::data {

// A whole file mapped read-only into memory: the page cache backs it, so
// every rank of a node reading the same dataset shares one copy and nothing
// is read until it is touched. Errors name the file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;  // null for an empty file
  uint64_t size_ = 0;
};

}  // namespace triad::data
