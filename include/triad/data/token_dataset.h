#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "triad/core/tensor.h"
#include "triad/data/indexed_dataset.h"

namespace triad::data {

class MappedFile;
class LossMask;

// Inputs and next-token targets of some sequences, each (n, T) i64.
struct Batch {
  Tensor inputs;
  Tensor targets;
  // The batch's mean loss's weight in a step's loss (train.loss_average:
  // tokens gives each its share of the step's unmasked targets); negative:
  // an equal share, 1 / (the step's microbatches).
  double loss_weight = -1.0;
};

// The batch with the targets that follow an end-of-document token in the
// inputs set to -100 (ignored by the losses): Megatron-LM's eod_mask_loss,
// no loss on guessing a document's first token from the one before. Host
// tensors; the batch's own targets are not modified.
Batch mask_loss_after_eod(const Batch& batch, int64_t eod_token);

// What data.train / data.val name, as TokenDataset sources: a Megatron
// dataset prefix (`prefix.idx` and `prefix.bin` exist), or a path or glob
// matching llm.c shards and Megatron `.bin`/`.idx` files. Sorted; a Megatron
// dataset appears once, as its prefix, however many of its files match (a
// `.bin` is a Megatron one when the `.idx` beside it exists). `key` names
// the setting in the error when nothing matches.
std::vector<std::string> expand_data_paths(const std::string& pattern,
                                           const std::string& key = "data.train");

// Position `i` of pass `epoch` over `n` items in a seeded pseudo-random order:
// a bijection of [0, n) for every (seed, epoch), computed in O(1) memory (a
// Philox-keyed Feistel network over the next power of 4, cycle-walking back
// into range), a different order every pass.
int64_t shuffled_index(int64_t i, int64_t n, uint64_t seed, int64_t epoch);

// The token stream of one or more sources read in order: llm.c shards (all
// their tokens) and Megatron indexed datasets (given by prefix: their
// sequences in index order, any integer token type), cut into training
// sequences by a rule that no parallel layout changes: with global batch G
// and sequence length T, sequence j of step k is the T+1 tokens starting at
// (k*G + j)*T (inputs the first T, targets the last T). Global sequence q
// wraps around to q mod num_sequences() when the stream is exhausted.
// Files are memory-mapped (ranks on a node share the page cache; nothing is
// copied in), every header is validated, and every token is checked to be in
// [0, vocab_size): errors name the file, the token and its position there.
// One process checks every token here (the default TokenCheck); the
// processes of a job each check their part instead (TokenCheck below).
// A source with a loss mask beside it (`<source>.loss_mask`, loss_mask.h)
// has the targets its mask clears set to -100 (no loss); a source without
// one has every target counted.
//
// With `packing.whole_documents` (data.packing: documents) sequences are
// rows of whole documents instead of cuts of the stream: documents, in
// stream order, fill a row of seq_len + 1 tokens while they fit, the next
// starts a new row, and a row's remainder is `packing.pad_token`s that are
// never targets (-100). No document is cut across rows, so each keeps its
// start (supervised fine-tuning's prompt stays with its response). A
// document longer than a row is, by `long_documents`, cut into rows of its
// own (each starting at the last token of the one before, so every token
// but its first is a target once) with its tail packing on; truncated to
// its first row; or dropped. Documents are a Megatron dataset's (its
// document index) and, in an llm.c shard, the runs each ended by pad_token
// (the end-of-document token). Row j of the packing is sequence j.
// With `best_fit` (data.packing: best_fit) the documents that fit a row
// are placed out of order instead, longest first, each into the fullest
// row with room for it (best fit decreasing): far less padding, rows no
// longer in stream order (shuffle them: data.shuffle).
enum class LongDocuments { Split, Truncate, Drop };
// split | truncate | drop; anything else is a ValueError naming it.
LongDocuments long_documents_from_string(const std::string& name);
struct DocumentPacking {
  bool whole_documents = false;
  int64_t pad_token = -1;
  LongDocuments long_documents = LongDocuments::Split;
  bool best_fit = false;
};

// Which of a dataset's tokens this process checks, against the vocabulary
// and (where a loss mask lies beside them) for mask bytes of 0 or 1: part
// `index` of `count` equal parts of its stream. With one part (the default)
// the constructor checks every token and raises on the first bad one. With
// more, it checks its part and raises nothing: the processes of a job each
// read 1/count of the data at start-up, so a terabyte of tokens is read
// once by the job rather than once by each of its thousand ranks, and they
// combine what they found (part_check: the least first bad position, the
// sum of the targets with loss) before any raises (accept_check), so that
// all stop with the same error. (Whole-document rows of llm.c shards still
// read every token, for the document ends; their token check rides along in
// that pass.)
struct TokenCheck {
  int64_t index = 0;
  int64_t count = 1;
};

// The part of a dataset's token stream it reads: its tokens
// [floor(begin · N), floor(end · N)) of N, or with whole documents the
// documents whose first token lies there. [0, 1 − f) and [1 − f, 1) split a
// stream into a training set and a held-out tail (data.val_split) that
// share no token and no document.
struct StreamSlice {
  double begin = 0;
  double end = 1;
};

class TokenDataset {
 public:
  // Errors: a source that cannot be read or fails its checks, too few
  // tokens, a bad packing, or (TokenCheck of one part) a token outside
  // [0, vocab_size); vocab_size 0 checks no tokens.
  TokenDataset(const std::vector<std::string>& sources, int64_t seq_len, int64_t vocab_size,
               DocumentPacking packing = {}, TokenCheck check = {}, StreamSlice slice = {});
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  // Number of distinct sequences (start positions q*T with q*T + T + 1 <=
  // tokens; with whole documents, the rows).
  int64_t num_sequences() const { return num_sequences_; }
  // With whole documents: the rows' pad tokens, and the documents longer
  // than a row (split, truncated or dropped, as packing.long_documents says).
  int64_t padding_tokens() const { return padding_tokens_; }
  int64_t long_documents() const { return long_documents_; }
  int64_t seq_len() const { return seq_len_; }
  // The sources with a loss mask, and the tokens that are targets with loss
  // (every token of a source without a mask, the mask's ones otherwise; of
  // this process's part until accept_check gives the job's sum).
  int64_t masked_sources() const { return static_cast<int64_t>(masks_.size()); }
  int64_t loss_tokens() const { return loss_tokens_; }

  // Sequences [first, first + count) of step `step` with global batch G.
  Batch batch(int64_t step, int64_t global_batch, int64_t first, int64_t count) const;
  // Global sequences [first, first + count) (the trainer's data position
  // survives a change of global batch size across a resume).
  Batch sequences(int64_t first, int64_t count) const;
  // From now on global sequence g is sequence shuffled_index(g mod N, N,
  // seed, g / N) (N = num_sequences()): every pass visits every sequence
  // once, in an order that depends on the seed and the pass only, never on
  // the parallel layout.
  void shuffle(uint64_t seed) { shuffle_seed_ = seed; }
  // The sequence global sequence g reads.
  int64_t sequence_of(int64_t g) const;
  // The seq_len + 1 tokens of global sequence g and, when `keep` is not
  // null, their loss mask bytes (1 for tokens of a source without a mask).
  void read_sequence(int64_t g, int64_t* out, uint8_t* keep = nullptr) const;

  // What this process found: the first stream position whose token is
  // outside [0, vocab_size) or whose mask byte is neither 0 nor 1 (in its
  // TokenCheck part, or anywhere it read every token; -1 for none), and the
  // targets with loss among its part's tokens. The job's answer is the
  // least first_bad (ignoring -1) and the sum of loss_tokens.
  struct PartCheck {
    int64_t first_bad = -1;
    int64_t loss_tokens = 0;
  };
  PartCheck part_check() const { return {first_bad_, loss_tokens_}; }
  // Takes the job's answer: raises the IoError for its first_bad (the
  // token's file, value and position there, or the mask's byte), or keeps
  // its loss_tokens as the dataset's.
  void accept_check(const PartCheck& job);

 private:
  // A contiguous run of tokens in a mapped file, at stream position `start`,
  // with their loss mask bytes (null: every token has loss).
  struct Run {
    const std::byte* data;
    int64_t count;
    IndexedDType dtype;
    int64_t start;
    const uint8_t* keep;
    size_t file;         // files_' index
    int64_t file_first;  // the position of its first token in that file
    size_t mask;         // masks_' index, when keep is not null
  };
  // Raises the error for stream `position` (part_check's first_bad).
  [[noreturn]] void raise_bad(int64_t position) const;
  // Keeps the runs' tokens in `slice` (and, with whole documents, the
  // lengths of the documents it holds), renumbered from its first.
  void take_slice(StreamSlice slice, std::vector<int64_t>& documents);
  // Tokens [start, start + count) of the stream, and their mask bytes when
  // `keep` is not null.
  void read(int64_t start, int64_t count, int64_t* out, uint8_t* keep) const;

  std::vector<std::unique_ptr<MappedFile>> shards_;
  std::vector<std::unique_ptr<IndexedDataset>> indexed_;
  std::vector<std::unique_ptr<LossMask>> masks_;
  std::vector<Run> runs_;
  std::vector<std::string> files_;  // the token files, for messages
  int64_t vocab_size_;
  int64_t first_bad_ = -1;
  int64_t num_tokens_ = 0, loss_tokens_ = 0;
  int64_t seq_len_;
  int64_t num_sequences_;
  std::optional<uint64_t> shuffle_seed_;
  DocumentPacking packing_;
  // Whole-document rows: row r is pieces [row_first_[r], row_first_[r + 1]),
  // each the stream's tokens [start, start + length), then padding.
  std::vector<int64_t> piece_start_;
  std::vector<int32_t> piece_length_;
  std::vector<int64_t> row_first_;
  int64_t padding_tokens_ = 0, long_documents_ = 0;
};

}  // namespace triad::data
