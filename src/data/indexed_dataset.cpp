#include "triad/data/indexed_dataset.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "data/mapped_file.h"
#include "data/token_run.h"
#include "triad/core/error.h"

namespace triad::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D

bool valid_code(uint8_t code) {
  return code == 1 || code == 2 || code == 3 || code == 4 || code == 5 || code == 8;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the index's arrays are not aligned
  return v;
}

}  // namespace

int indexed_dtype_bytes(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::U8:
    case IndexedDType::I8:
      return 1;
    case IndexedDType::I16:
    case IndexedDType::U16:
      return 2;
    case IndexedDType::I32:
      return 4;
    case IndexedDType::I64:
      return 8;
  }
  throw ValueError("indexed dataset: unknown dtype code " +
                   std::to_string(static_cast<int>(dtype)));
}

const char* indexed_dtype_name(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::U8:
      return "uint8";
    case IndexedDType::I8:
      return "int8";
    case IndexedDType::I16:
      return "int16";
    case IndexedDType::U16:
      return "uint16";
    case IndexedDType::I32:
      return "int32";
    case IndexedDType::I64:
      return "int64";
  }
  return "unknown";
}

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::U16 : IndexedDType::I32;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ip = prefix + ".idx";
  idx_ = std::make_unique<MappedFile>(ip);
  bin_ = std::make_unique<MappedFile>(prefix + ".bin");
  const std::byte* p = idx_->data();
  const uint64_t size = idx_->size();
  if (size < kHeaderBytes) {
    throw IoError("indexed dataset '" + ip + "': " + std::to_string(size) +
                  " bytes, shorter than the " + std::to_string(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    throw IoError("indexed dataset '" + ip +
                  "': not a Megatron index (the file does not start with \"MMIDIDX\")");
  }
  const auto version = load<uint64_t>(p + 9);
  if (version != kVersion) {
    throw IoError("indexed dataset '" + ip + "': index version " + std::to_string(version) +
                  ", expected " + std::to_string(kVersion));
  }
  const auto code = load<uint8_t>(p + 17);
  if (!valid_code(code)) {
    throw IoError("indexed dataset '" + ip + "': dtype code " + std::to_string(code) +
                  (code == 6 || code == 7 ? " (floating point) holds no tokens"
                                          : " is not one of Megatron's") +
                  "; expected 1 (uint8), 2 (int8), 3 (int16), 4 (int32), 5 (int64) or 8 (uint16)");
  }
  dtype_ = static_cast<IndexedDType>(code);
  const auto S = load<uint64_t>(p + 18);
  const auto D = load<uint64_t>(p + 26);
  // Each sequence needs 12 index bytes and each document index 8: counts
  // beyond the file are refused before any multiplication could overflow.
  if (S > size / 12 || D > size / 8 || D == 0) {
    throw IoError("indexed dataset '" + ip + "': " + std::to_string(S) + " sequences and " +
                  std::to_string(D) + " document indices cannot fit in " + std::to_string(size) +
                  " bytes (at least one document index is needed)");
  }
  const uint64_t expected = kHeaderBytes + 12 * S + 8 * D;
  if (size != expected) {
    throw IoError("indexed dataset '" + ip + "': " + std::to_string(size) + " bytes, but " +
                  std::to_string(S) + " sequences and " + std::to_string(D) +
                  " document indices make " + std::to_string(expected) +
                  (size == expected + S && S > 0
                       ? " (the extra byte per sequence is a multimodal index's modes, which "
                         "Triad does not read)"
                       : std::string()));
  }
  sequences_ = static_cast<int64_t>(S);
  documents_ = static_cast<int64_t>(D);
  lengths_at_ = kHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * S;
  documents_at_ = pointers_at_ + 8 * S;
  const uint64_t esize = static_cast<uint64_t>(indexed_dtype_bytes(dtype_));
  const uint64_t bin_size = bin_->size();
  for (int64_t i = 0; i < sequences_; ++i) {
    const int64_t len = sequence_length(i);
    const int64_t ptr = sequence_pointer(i);
    if (len < 0 || ptr < 0 || static_cast<uint64_t>(ptr) > bin_size ||
        static_cast<uint64_t>(len) > (bin_size - static_cast<uint64_t>(ptr)) / esize) {
      throw IoError("indexed dataset '" + ip + "': sequence " + std::to_string(i) + " (" +
                    std::to_string(len) + " " + indexed_dtype_name(dtype_) + " tokens at byte " +
                    std::to_string(ptr) + ") lies outside '" + bin_path() + "' (" +
                    std::to_string(bin_size) + " bytes)");
    }
    tokens_ += len;
  }
  int64_t previous = -1;
  for (int64_t d = 0; d < documents_; ++d) {
    const int64_t at = index_word(documents_at_ + 8 * static_cast<uint64_t>(d), 8);
    const bool ok = d == 0 ? at == 0 : at >= previous && at <= sequences_;
    if (!ok || (d == documents_ - 1 && at != sequences_)) {
      throw IoError("indexed dataset '" + ip + "': document index " + std::to_string(d) + " is " +
                    std::to_string(at) + "; document indices must rise from 0 to the " +
                    std::to_string(sequences_) + " sequences");
    }
    previous = at;
  }
}

IndexedDataset::~IndexedDataset() = default;

int64_t IndexedDataset::index_word(uint64_t offset, int bytes) const {
  const std::byte* p = idx_->data() + offset;
  return bytes == 4 ? load<int32_t>(p) : load<int64_t>(p);
}

void IndexedDataset::check_index(int64_t i, const char* what) const {
  const int64_t n = std::string(what) == "document" ? num_documents() : sequences_;
  if (i < 0 || i >= n) {
    throw ValueError("indexed dataset '" + prefix_ + "': " + what + " " + std::to_string(i) +
                     " is outside [0, " + std::to_string(n) + ")");
  }
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  check_index(i, "sequence");
  return index_word(lengths_at_ + 4 * static_cast<uint64_t>(i), 4);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  check_index(i, "sequence");
  return index_word(pointers_at_ + 8 * static_cast<uint64_t>(i), 8);
}

std::pair<int64_t, int64_t> IndexedDataset::document(int64_t d) const {
  check_index(d, "document");
  return {index_word(documents_at_ + 8 * static_cast<uint64_t>(d), 8),
          index_word(documents_at_ + 8 * static_cast<uint64_t>(d + 1), 8)};
}

std::vector<int64_t> IndexedDataset::sequence(int64_t i) const {
  const int64_t len = sequence_length(i);
  std::vector<int64_t> out(static_cast<size_t>(len));
  widen_tokens(bin() + sequence_pointer(i), dtype_, 0, len, out.data());
  return out;
}

const std::byte* IndexedDataset::bin() const {
  return bin_->data();
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, IndexedDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  const std::string bin_tmp = prefix_ + ".bin.tmp";
  bin_ = std::make_unique<std::ofstream>(bin_tmp, std::ios::binary | std::ios::trunc);
  if (!*bin_) throw IoError("indexed dataset '" + bin_tmp + "': cannot open for writing");
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_) return;
  bin_.reset();
  std::error_code ignored;
  std::filesystem::remove(prefix_ + ".bin.tmp", ignored);
  std::filesystem::remove(prefix_ + ".idx.tmp", ignored);
}

void IndexedDatasetWriter::add(const std::vector<int64_t>& doc) {
  if (finished_) throw ValueError("indexed dataset '" + prefix_ + "': add() after finish()");
  const int esize = indexed_dtype_bytes(dtype_);
  const bool is_unsigned = dtype_ == IndexedDType::U8 || dtype_ == IndexedDType::U16;
  const int64_t lo = is_unsigned  ? 0
                     : esize == 8 ? std::numeric_limits<int64_t>::min()
                                  : -(int64_t{1} << (8 * esize - 1));
  const int64_t hi = esize == 8 ? std::numeric_limits<int64_t>::max()
                                : (int64_t{1} << (8 * esize - (is_unsigned ? 0 : 1))) - 1;
  const size_t d = lengths_.size();
  if (doc.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw ValueError("indexed dataset '" + prefix_ + "': document " + std::to_string(d) + " has " +
                     std::to_string(doc.size()) +
                     " tokens, more than a sequence length (int32) holds");
  }
  std::vector<char> bytes(doc.size() * static_cast<size_t>(esize));
  for (size_t t = 0; t < doc.size(); ++t) {
    const int64_t v = doc[t];
    if (v < lo || v > hi) {
      throw ValueError("indexed dataset '" + prefix_ + "': token " + std::to_string(v) +
                       " (document " + std::to_string(d) + ", position " + std::to_string(t) +
                       ") does not fit " + indexed_dtype_name(dtype_));
    }
    // Little-endian bytes of the value, as wide as the element.
    std::memcpy(bytes.data() + t * static_cast<size_t>(esize), &v, static_cast<size_t>(esize));
  }
  bin_->write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!*bin_) throw IoError("indexed dataset '" + prefix_ + ".bin.tmp': write failed");
  lengths_.push_back(static_cast<int32_t>(doc.size()));
  pointers_.push_back(at_);
  at_ += static_cast<int64_t>(bytes.size());
  tokens_ += static_cast<int64_t>(doc.size());
}

void IndexedDatasetWriter::finish() {
  if (finished_) return;
  bin_->close();
  if (!*bin_) throw IoError("indexed dataset '" + prefix_ + ".bin.tmp': write failed");
  const std::string idx_tmp = prefix_ + ".idx.tmp";
  {
    std::ofstream idx(idx_tmp, std::ios::binary | std::ios::trunc);
    if (!idx) throw IoError("indexed dataset '" + idx_tmp + "': cannot open for writing");
    const uint64_t S = lengths_.size(), D = S + 1;
    std::vector<int64_t> doc_index(D);
    for (uint64_t i = 0; i < D; ++i) doc_index[i] = static_cast<int64_t>(i);
    const auto code = static_cast<uint8_t>(dtype_);
    idx.write(kMagic, sizeof(kMagic));
    idx.write(reinterpret_cast<const char*>(&kVersion), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&S), 8);
    idx.write(reinterpret_cast<const char*>(&D), 8);
    idx.write(reinterpret_cast<const char*>(lengths_.data()), static_cast<std::streamsize>(4 * S));
    idx.write(reinterpret_cast<const char*>(pointers_.data()), static_cast<std::streamsize>(8 * S));
    idx.write(reinterpret_cast<const char*>(doc_index.data()), static_cast<std::streamsize>(8 * D));
    if (!idx) throw IoError("indexed dataset '" + idx_tmp + "': write failed");
  }
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{prefix_ + ".bin.tmp", prefix_ + ".bin"},
        {idx_tmp, prefix_ + ".idx"}}) {
    std::error_code ec;
    std::filesystem::rename(from, to, ec);
    if (ec)
      throw IoError("indexed dataset: cannot move '" + from + "' to '" + to + "': " + ec.message());
  }
  finished_ = true;
}

void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<int64_t>>& documents, IndexedDType dtype) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& doc : documents) writer.add(doc);
  writer.finish();
}

}  // namespace triad::data
