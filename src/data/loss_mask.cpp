#include "triad/data/loss_mask.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "data/mapped_file.h"
#include "triad/core/error.h"

namespace triad::data {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'A', 'D', 'L', 'M', '\0'};
constexpr uint64_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 8 + 8 + 8;  // magic, version, N
constexpr const char* kSuffix = ".loss_mask";

uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

std::string loss_mask_path(const std::string& source) {
  return source + kSuffix;
}

bool is_loss_mask_path(const std::string& path) {
  const size_t n = std::strlen(kSuffix);
  return path.size() > n && path.compare(path.size() - n, n, kSuffix) == 0;
}

LossMask::LossMask(const std::string& path, int64_t expected_tokens)
    : file_(std::make_unique<MappedFile>(path)) {
  const std::string where = "loss mask '" + path + "'";
  const std::byte* p = file_->data();
  const uint64_t size = file_->size();
  if (size < kHeaderBytes || std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    throw IoError(where + ": not a loss mask (expected the magic \"TRIADLM\" in a " +
                  std::to_string(kHeaderBytes) + "-byte header, the file has " +
                  std::to_string(size) + " bytes)");
  }
  if (const uint64_t version = load_u64(p + 8); version != kVersion) {
    throw IoError(where + ": version " + std::to_string(version) + " (expected " +
                  std::to_string(kVersion) + ")");
  }
  const uint64_t n = load_u64(p + 16);
  if (size - kHeaderBytes != n) {
    throw IoError(where + ": the header counts " + std::to_string(n) + " tokens but " +
                  std::to_string(size - kHeaderBytes) + " bytes follow it");
  }
  if (static_cast<int64_t>(n) != expected_tokens) {
    throw IoError(where + " covers " + std::to_string(n) + " tokens, but its dataset holds " +
                  std::to_string(expected_tokens) +
                  " (a mask written for other token data? tokenize both again)");
  }
  count_ = static_cast<int64_t>(n);
  if (count_ == 0) return;
  bytes_ = reinterpret_cast<const uint8_t*>(p + kHeaderBytes);
  int64_t kept = 0, bad = -1;
  for (int64_t i = 0; i < count_; ++i) {
    const uint8_t b = bytes_[i];
    kept += b;
    if (b > 1 && bad < 0) bad = i;
  }
  if (bad >= 0) {
    throw IoError(where + ": byte " + std::to_string(bytes_[bad]) + " at token " +
                  std::to_string(bad) + " (expected 0: no loss, or 1: loss)");
  }
  kept_ = kept;
}

LossMask::~LossMask() = default;

LossMaskWriter::LossMaskWriter(std::string path) : path_(std::move(path)) {
  const std::string tmp = path_ + ".tmp";
  out_ = std::make_unique<std::ofstream>(tmp, std::ios::binary | std::ios::trunc);
  if (!*out_) throw IoError("loss mask '" + tmp + "': cannot open for writing");
  const uint64_t zero = 0;
  out_->write(kMagic, sizeof(kMagic));
  out_->write(reinterpret_cast<const char*>(&kVersion), 8);
  out_->write(reinterpret_cast<const char*>(&zero), 8);  // N, filled in by finish()
}

LossMaskWriter::~LossMaskWriter() {
  if (finished_) return;
  out_.reset();
  std::error_code ignored;
  std::filesystem::remove(path_ + ".tmp", ignored);
}

void LossMaskWriter::add(const std::vector<uint8_t>& keep) {
  if (finished_) throw ValueError("loss mask '" + path_ + "': add() after finish()");
  for (size_t t = 0; t < keep.size(); ++t) {
    if (keep[t] > 1) {
      throw ValueError("loss mask '" + path_ + "': value " + std::to_string(keep[t]) +
                       " (document " + std::to_string(documents_) + ", position " +
                       std::to_string(t) + ") is not 0 or 1");
    }
  }
  out_->write(reinterpret_cast<const char*>(keep.data()),
              static_cast<std::streamsize>(keep.size()));
  count_ += static_cast<int64_t>(keep.size());
  ++documents_;
}

void LossMaskWriter::finish() {
  if (finished_) return;
  const auto n = static_cast<uint64_t>(count_);
  out_->seekp(16);
  out_->write(reinterpret_cast<const char*>(&n), 8);
  out_->close();
  const std::string tmp = path_ + ".tmp";
  if (!*out_) throw IoError("loss mask '" + tmp + "': write failed");
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) throw IoError("loss mask: cannot move '" + tmp + "' to '" + path_ + "': " + ec.message());
  finished_ = true;
}

void write_loss_mask(const std::string& path, const std::vector<uint8_t>& keep) {
  LossMaskWriter writer(path);
  writer.add(keep);
  writer.finish();
}

}  // namespace triad::data
