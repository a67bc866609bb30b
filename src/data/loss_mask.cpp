#include "triad/data/loss_mask.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "data/mapped_file.h"
#include "triad/core/error.h"

namespace triad::data {
namespace {

constexpr char kMaskMagic[8] = {'T', 'R', 'I', 'A', 'D', 'L', 'M', '\0'};
constexpr uint64_t kMaskVersion = 1;
constexpr uint64_t kMaskHeaderBytes = 8 + 8 + 8;  // magic, version, N
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

LossMask::LossMask(const std::string& path, int64_t expected_tokens, bool check_bytes)
    : path_(path), file_(std::make_unique<MappedFile>(path)) {
  const std::string where = "loss mask '" + path + "'";
  const std::byte* p = file_->data();
  const uint64_t size = file_->size();
  if (size < kMaskHeaderBytes || std::memcmp(p, kMaskMagic, sizeof(kMaskMagic)) != 0) {
    throw IoError(where + ": not a loss mask (expected the magic \"TRIADLM\" in a " +
                  std::to_string(kMaskHeaderBytes) + "-byte header, the file has " +
                  std::to_string(size) + " bytes)");
  }
  if (const uint64_t version = load_u64(p + 8); version != kMaskVersion) {
    throw IoError(where + ": version " + std::to_string(version) + " (expected " +
                  std::to_string(kMaskVersion) + ")");
  }
  const uint64_t n = load_u64(p + 16);
  if (size - kMaskHeaderBytes != n) {
    throw IoError(where + ": the header counts " + std::to_string(n) + " tokens but " +
                  std::to_string(size - kMaskHeaderBytes) + " bytes follow it");
  }
  if (static_cast<int64_t>(n) != expected_tokens) {
    throw IoError(where + " covers " + std::to_string(n) + " tokens, but its dataset holds " +
                  std::to_string(expected_tokens) +
                  " (a mask written for other token data? tokenize both again)");
  }
  count_ = static_cast<int64_t>(n);
  if (count_ > 0) bytes_ = reinterpret_cast<const uint8_t*>(p + kMaskHeaderBytes);
  kept_ = -1;
  if (!check_bytes) return;
  const Scan all = scan(0, count_);
  if (all.bad >= 0) raise_bad_byte(all.bad);
  kept_ = all.kept;
}

LossMask::Scan LossMask::scan(int64_t first, int64_t last) const {
  if (first < 0 || last > count_ || first > last) {
    throw ValueError("loss mask '" + path_ + "': bytes [" + std::to_string(first) + ", " +
                     std::to_string(last) + ") are not within its " + std::to_string(count_));
  }
  // Blocks summed branch-free; only a block with a byte above 1 is searched.
  Scan out;
  constexpr int64_t kBlock = 4096;
  for (int64_t b = first; b < last; b += kBlock) {
    const int64_t e = std::min(last, b + kBlock);
    int64_t kept = 0;
    uint8_t high = 0;
    for (int64_t i = b; i < e; ++i) {
      kept += bytes_[i];
      high |= bytes_[i];
    }
    if (high > 1) {
      for (int64_t i = b; i < e; ++i) {
        if (bytes_[i] > 1) {
          out.bad = i;
          return out;
        }
        out.kept += bytes_[i];
      }
    }
    out.kept += kept;
  }
  return out;
}

void LossMask::raise_bad_byte(int64_t index) const {
  if (index < 0 || index >= count_) {
    throw ValueError("loss mask '" + path_ + "': byte " + std::to_string(index) +
                     " is not within its " + std::to_string(count_));
  }
  throw IoError("loss mask '" + path_ + "': byte " + std::to_string(bytes_[index]) + " at token " +
                std::to_string(index) + " (expected 0: no loss, or 1: loss)");
}

LossMask::~LossMask() = default;

LossMaskWriter::LossMaskWriter(std::string path) : path_(std::move(path)) {
  const std::string tmp = path_ + ".tmp";
  out_ = std::make_unique<std::ofstream>(tmp, std::ios::binary | std::ios::trunc);
  if (!*out_) throw IoError("loss mask '" + tmp + "': cannot open for writing");
  const uint64_t zero = 0;
  out_->write(kMaskMagic, sizeof(kMaskMagic));
  out_->write(reinterpret_cast<const char*>(&kMaskVersion), 8);
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
