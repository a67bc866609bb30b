#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace triad::data {

class MappedFile;

// Token element types of a Megatron indexed dataset, by the index's dtype
// code (codes 6 and 7 are float64 and float32: not tokens, refused).
enum class IndexedDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, U16 = 8 };
int indexed_dtype_bytes(IndexedDType dtype);
const char* indexed_dtype_name(IndexedDType dtype);
// The type Megatron's preprocessing picks for a vocabulary: uint16 below
// 65500 tokens, int32 above.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);

// Megatron-LM's indexed dataset ("MMIDIDX" index, version 1): the tokens,
// raw, in `prefix.bin`; their index in `prefix.idx`, little-endian:
//   9 bytes "MMIDIDX\0\0", uint64 version (1), uint8 dtype code,
//   uint64 sequence count S, uint64 document-index count D,
//   int32 sequence lengths[S] (tokens), int64 sequence pointers[S] (byte
//   offsets into the .bin), int64 document indices[D] (0, the first sequence
//   of each later document, ..., S).
// Both files are memory-mapped. Opening checks everything before a token is
// read: magic, version, dtype, the index's size against S and D, every
// sequence inside the .bin, document indices rising from 0 to S; each error
// names the file and the value. (Multimodal indexes, which append a mode per
// sequence, are refused by name.)
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return sequences_; }
  // Documents (D - 1): each a run of consecutive sequences.
  int64_t num_documents() const { return documents_ - 1; }
  int64_t num_tokens() const { return tokens_; }
  int64_t sequence_length(int64_t i) const;
  // Byte offset of sequence i in the .bin.
  int64_t sequence_pointer(int64_t i) const;
  // Sequences [first, last) of document d.
  std::pair<int64_t, int64_t> document(int64_t d) const;
  // Sequence i's tokens.
  std::vector<int64_t> sequence(int64_t i) const;
  // The .bin's bytes (tokens of sequence i start at bin() + sequence_pointer(i)).
  const std::byte* bin() const;
  std::string bin_path() const { return prefix_ + ".bin"; }

 private:
  int64_t index_word(uint64_t offset, int bytes) const;
  void check_index(int64_t i, const char* what) const;

  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  IndexedDType dtype_ = IndexedDType::U16;
  int64_t sequences_ = 0, documents_ = 0, tokens_ = 0;
  uint64_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0;  // offsets in the .idx
};

// Writes `prefix.bin` and `prefix.idx` a document at a time, one sequence
// per document, in the format above: the tokens stream to `prefix.bin.tmp`
// as they come (only 16 bytes a document stay in memory for the index), and
// finish() writes the index and renames both. Every token must fit `dtype`;
// errors name the document, position and value. Destroyed without
// finish(), it removes its temporaries and leaves no dataset.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, IndexedDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add(const std::vector<int64_t>& document);
  void finish();
  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_;
  IndexedDType dtype_;
  std::unique_ptr<std::ofstream> bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  int64_t tokens_ = 0, at_ = 0;
  bool finished_ = false;
};

// All of `documents` through an IndexedDatasetWriter.
void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<int64_t>>& documents, IndexedDType dtype);

}  // namespace triad::data
