#pragma once

// Loss masks: which tokens of a token dataset are targets the loss counts.
// Supervised fine-tuning trains on prompt/response pairs and scores only the
// response: the prompt's tokens are read (the model attends to them) but
// guessing them carries no loss. The mask lives beside the tokens, in
// `<source>.loss_mask` (a Megatron dataset's prefix, or an llm.c shard's
// path, plus the suffix), so the token files stay exactly Megatron's and
// llm.c's formats. Little-endian:
//   8 bytes "TRIADLM\0", uint64 version (1), uint64 token count N,
//   N bytes, one per token in stream order (a Megatron dataset's sequences
//   in index order, a shard's tokens in file order): 1 the token is a
//   target with loss, 0 it is not.
// The trainer turns a 0 into the ignored target -100 (the losses skip it),
// the same mark data.eod_mask_loss uses.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace triad::data {

class MappedFile;

// `source` + ".loss_mask".
std::string loss_mask_path(const std::string& source);
// Whether `path` names a loss mask file (ends in ".loss_mask").
bool is_loss_mask_path(const std::string& path);

// A loss mask file, memory-mapped and checked on opening: the magic, the
// version, a size of exactly 24 + N bytes, N equal to `expected_tokens`
// (the tokens of the dataset it belongs to), and (with `check_bytes`) every
// byte 0 or 1. Each error names the file and the value. A TokenDataset
// opens its masks without the byte check and checks them (scan) in its
// TokenCheck part, as it checks its tokens.
class LossMask {
 public:
  LossMask(const std::string& path, int64_t expected_tokens, bool check_bytes = true);
  ~LossMask();
  LossMask(const LossMask&) = delete;
  LossMask& operator=(const LossMask&) = delete;

  int64_t size() const { return count_; }
  // Tokens whose byte is 1 (opened with check_bytes; else -1).
  int64_t kept() const { return kept_; }
  // The N bytes (null when N is 0).
  const uint8_t* data() const { return bytes_; }

  // Bytes [first, last): how many are 1, and the first that is neither 0
  // nor 1 (-1 for none; the count stops there).
  struct Scan {
    int64_t kept = 0;
    int64_t bad = -1;
  };
  Scan scan(int64_t first, int64_t last) const;
  // Raises the IoError for byte `index` (the file, the value, the token).
  [[noreturn]] void raise_bad_byte(int64_t index) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  const uint8_t* bytes_ = nullptr;
  int64_t count_ = 0, kept_ = 0;
};

// Writes a loss mask a document at a time to `path.tmp`; finish() fills in
// the count and renames it to `path`. Destroyed without finish(), it removes
// the temporary and leaves no file.
class LossMaskWriter {
 public:
  explicit LossMaskWriter(std::string path);
  ~LossMaskWriter();
  LossMaskWriter(const LossMaskWriter&) = delete;
  LossMaskWriter& operator=(const LossMaskWriter&) = delete;

  // One byte per token; each must be 0 or 1 (a ValueError names the
  // document and position otherwise).
  void add(const std::vector<uint8_t>& keep);
  void finish();
  int64_t tokens() const { return count_; }

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  int64_t count_ = 0, documents_ = 0;
  bool finished_ = false;
};

// All of `keep` as the loss mask file `path`.
void write_loss_mask(const std::string& path, const std::vector<uint8_t>& keep);

}  // namespace triad::data
