#include "triad/data/token_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "data/mapped_file.h"
#include "data/sequence_batch.h"
#include "data/token_run.h"
#include "triad/core/rng.h"
#include "triad/data/loss_mask.h"
#include "triad/data/token_shard.h"
#include "triad/ops/elementwise.h"

namespace triad::data {

Batch mask_loss_after_eod(const Batch& batch, int64_t eod_token) {
  if (!batch.inputs.device().is_cpu() || batch.inputs.dtype() != DType::I64 ||
      batch.targets.dtype() != DType::I64 || !batch.targets.device().is_cpu() ||
      !batch.inputs.is_contiguous() || batch.targets.shape() != batch.inputs.shape()) {
    throw ValueError(
        "mask_loss_after_eod: expected contiguous i64 host inputs and targets of one "
        "shape, got inputs " +
        shape_str(batch.inputs.shape()) + " and targets " + shape_str(batch.targets.shape()));
  }
  Batch out{batch.inputs, clone(batch.targets)};
  const int64_t* in = batch.inputs.data<int64_t>();
  int64_t* t = out.targets.data<int64_t>();
  for (int64_t i = 0; i < batch.inputs.numel(); ++i) {
    if (in[i] == eod_token) t[i] = -100;
  }
  return out;
}
namespace {

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// The Megatron prefix a matched file belongs to, or "" for an llm.c shard.
std::string megatron_prefix(const std::string& path) {
  if (path.ends_with(".idx")) return path.substr(0, path.size() - 4);
  if (path.ends_with(".bin")) {
    const std::string stem = path.substr(0, path.size() - 4);
    if (is_file(stem + ".idx")) return stem;
  }
  return "";
}

// Whole documents into rows of `capacity` tokens (data.packing: documents
// or best_fit), fed each document's length in stream order. A row is a list
// of pieces, each a run of the stream.
struct RowPacker {
  int64_t capacity;  // seq_len + 1
  LongDocuments long_policy;
  bool best_fit;
  std::vector<int64_t>& piece_start;
  std::vector<int32_t>& piece_length;
  std::vector<int64_t>& row_first;                     // each row's first piece
  int64_t pos = 0;                                     // stream position of the next document
  int64_t row_start = 0, row_length = 0;               // in order: the row being filled
  std::vector<std::pair<int64_t, int64_t>> pending{};  // best fit: (start, length) to place
  int64_t long_documents = 0;

  void row(int64_t start, int64_t length) {
    row_first.push_back(static_cast<int64_t>(piece_start.size()));
    piece_start.push_back(start);
    piece_length.push_back(static_cast<int32_t>(length));
  }
  void close() {
    if (row_length == 0) return;
    row(row_start, row_length);
    row_length = 0;
  }
  // A document (or a long one's tail) no longer than a row.
  void place(int64_t at, int64_t length) {
    if (best_fit) {
      pending.emplace_back(at, length);
      return;
    }
    if (row_length + length > capacity) close();
    if (row_length == 0) row_start = at;
    row_length += length;
  }
  void add(int64_t length) {
    int64_t at = pos;
    pos += length;
    if (length == 0) return;
    if (length > capacity) {
      ++long_documents;
      // In order, a row holds one run of the stream, so the row being
      // filled ends here whatever becomes of this document.
      close();
      if (long_policy == LongDocuments::Drop) return;
      if (long_policy == LongDocuments::Truncate) {
        row(at, capacity);  // its first row; the rest is never read
        return;
      }
      // Rows of its own, each starting at the last token of the one before
      // (an input there, after being the target of that row's last input).
      const int64_t stride = capacity - 1;
      while (length > capacity) {
        row(at, capacity);
        at += stride;
        length -= stride;
      }
    }
    place(at, length);
  }
  void finish() {
    close();
    if (best_fit) {
      // Best fit decreasing: longest first, each into the fullest row it
      // still fits (a new row when none has room); ties go to the earlier
      // document and the earlier row, so the packing is a function of the
      // data alone.
      std::stable_sort(pending.begin(), pending.end(),
                       [](const auto& a, const auto& b) { return a.second > b.second; });
      std::vector<std::vector<std::pair<int64_t, int64_t>>> rows;
      std::multimap<int64_t, size_t> room;  // room left -> row
      for (const auto& [at, length] : pending) {
        auto it = room.lower_bound(length);
        size_t r = 0;
        int64_t left = capacity;
        if (it == room.end()) {
          r = rows.size();
          rows.emplace_back();
        } else {
          r = it->second;
          left = it->first;
          room.erase(it);
        }
        rows[r].emplace_back(at, length);
        if (left - length > 0) room.emplace(left - length, r);
      }
      for (const auto& pieces : rows) {
        row_first.push_back(static_cast<int64_t>(piece_start.size()));
        for (const auto& [at, length] : pieces) {
          piece_start.push_back(at);
          piece_length.push_back(static_cast<int32_t>(length));
        }
      }
    }
    row_first.push_back(static_cast<int64_t>(piece_start.size()));  // the end
  }
};

}  // namespace

LongDocuments long_documents_from_string(const std::string& name) {
  if (name == "split") return LongDocuments::Split;
  if (name == "truncate") return LongDocuments::Truncate;
  if (name == "drop") return LongDocuments::Drop;
  throw ValueError("long documents '" + name + "': expected split, truncate or drop");
}

std::vector<std::string> expand_data_paths(const std::string& pattern, const std::string& key) {
  if (is_file(pattern + ".idx") && is_file(pattern + ".bin")) return {pattern};
  std::vector<std::string> matches;
  try {
    matches = expand_shard_paths(pattern);
  } catch (const IoError&) {
    throw IoError(key + " '" + pattern +
                  "' matches no file (expected an llm.c shard, a glob of them, or a Megatron "
                  "dataset: its prefix, or its .bin/.idx files)");
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& m : matches) {
    // A loss mask belongs to the dataset beside it; it is never token data.
    if (is_loss_mask_path(m)) continue;
    const std::string prefix = megatron_prefix(m);
    const std::string source = prefix.empty() ? m : prefix;
    if (seen.insert(source).second) out.push_back(source);
  }
  if (out.empty()) {
    const std::string& m = matches.front();
    throw IoError(key + " '" + pattern + "' matches only loss masks, not token data (name the " +
                  "dataset a mask belongs to: '" +
                  m.substr(0, m.size() - loss_mask_path("").size()) + "' for '" + m + "')");
  }
  return out;
}

int64_t shuffled_index(int64_t i, int64_t n, uint64_t seed, int64_t epoch) {
  if (n <= 0 || i < 0 || i >= n) {
    throw ValueError("shuffled_index: position " + std::to_string(i) + " is outside [0, " +
                     std::to_string(n) + ")");
  }
  // Halves of h bits: the domain 4^h is the smallest power of 4 >= n, so
  // cycle-walking takes fewer than 4 rounds of the network on average.
  int h = 0;
  while ((int64_t{1} << (2 * h)) < n) ++h;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  constexpr int kRounds = 6;
  auto permute = [&](uint64_t x) {
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      const auto f = philox4x32(seed, static_cast<uint64_t>(epoch) * kRounds + r, right);
      const uint64_t next = left ^ ((static_cast<uint64_t>(f[0]) << 32 | f[1]) & mask);
      left = right;
      right = next;
    }
    return left << h | right;
  };
  uint64_t x = permute(static_cast<uint64_t>(i));
  while (x >= static_cast<uint64_t>(n)) x = permute(x);
  return static_cast<int64_t>(x);
}

TokenDataset::TokenDataset(const std::vector<std::string>& sources, int64_t seq_len,
                           int64_t vocab_size, DocumentPacking packing, TokenCheck check,
                           StreamSlice slice)
    : vocab_size_(vocab_size), seq_len_(seq_len), packing_(packing) {
  if (seq_len <= 0)
    throw ValueError("TokenDataset: seq_len (" + std::to_string(seq_len) + ") must be positive");
  if (check.count < 1 || check.index < 0 || check.index >= check.count) {
    throw ValueError("TokenDataset: token check part " + std::to_string(check.index) + " of " +
                     std::to_string(check.count) + " is not a part (expected 0 <= index < count)");
  }
  if (!(slice.begin >= 0 && slice.begin < slice.end && slice.end <= 1)) {
    throw ValueError("TokenDataset: the stream slice [" + std::to_string(slice.begin) + ", " +
                     std::to_string(slice.end) +
                     ") is not a part of it (expected 0 <= begin < end <= 1)");
  }
  if (packing.whole_documents &&
      (packing.pad_token < 0 || (vocab_size > 0 && packing.pad_token >= vocab_size))) {
    throw ValueError("TokenDataset: whole-document rows need a pad token in [0, vocab_size " +
                     std::to_string(vocab_size) + "), got " + std::to_string(packing.pad_token));
  }
  // With whole documents: each document's length, in stream order (packed
  // into rows once the slice is known).
  std::vector<int64_t> documents;
  auto found_bad = [&](int64_t position) {
    if (first_bad_ < 0 || position < first_bad_) first_bad_ = position;
  };
  // Runs whose every token was read (and checked against the vocabulary)
  // already.
  std::vector<bool> checked;
  // The source's loss mask, when one lies beside it (its bytes checked
  // below, in this process's part).
  auto mask_of = [&](const std::string& source, int64_t tokens) -> const uint8_t* {
    const std::string path = loss_mask_path(source);
    if (!is_file(path)) return nullptr;
    masks_.push_back(std::make_unique<LossMask>(path, tokens, /*check_bytes=*/false));
    return masks_.back()->data();
  };
  for (const auto& source : sources) {
    if (is_file(source + ".idx")) {
      auto ds = std::make_unique<IndexedDataset>(source);
      const int64_t esize = indexed_dtype_bytes(ds->dtype());
      const uint8_t* mask = mask_of(source, ds->num_tokens());
      files_.push_back(ds->bin_path());
      // Sequences that follow each other in the .bin (the usual layout) form
      // one run; the token check walks each run once. The mask holds the
      // sequences in index order, so a run's mask bytes follow each other too.
      const size_t first_run = runs_.size();
      int64_t in_mask = 0;
      for (int64_t i = 0; i < ds->num_sequences(); ++i) {
        const int64_t len = ds->sequence_length(i);
        if (len == 0) continue;
        const std::byte* at = ds->bin() + ds->sequence_pointer(i);
        const uint8_t* keep = mask ? mask + in_mask : nullptr;
        in_mask += len;
        if (runs_.size() > first_run && runs_.back().data + runs_.back().count * esize == at &&
            (!mask || runs_.back().keep + runs_.back().count == keep)) {
          runs_.back().count += len;
        } else {
          runs_.push_back({at, len, ds->dtype(), num_tokens_, keep, files_.size() - 1,
                           (at - ds->bin()) / esize, masks_.size() - 1});
        }
        num_tokens_ += len;
      }
      checked.resize(runs_.size(), false);
      if (packing.whole_documents) {
        for (int64_t d = 0; d < ds->num_documents(); ++d) {
          const auto [first, last] = ds->document(d);
          int64_t length = 0;
          for (int64_t i = first; i < last; ++i) length += ds->sequence_length(i);
          documents.push_back(length);
        }
      }
      indexed_.push_back(std::move(ds));
    } else {
      auto file = std::make_unique<MappedFile>(source);
      const auto count =
          static_cast<int64_t>(check_token_shard(source, file->data(), file->size()));
      const std::byte* tokens = file->data() + kShardHeaderBytes;
      const uint8_t* mask = mask_of(source, count);
      files_.push_back(source);
      if (count > 0) {
        runs_.push_back({tokens, count, IndexedDType::U16, num_tokens_, mask, files_.size() - 1, 0,
                         masks_.size() - 1});
        checked.push_back(packing.whole_documents);
      }
      if (packing.whole_documents) {
        // Documents end with the pad (end-of-document) token; the shard's
        // last one may run to its end without it. This pass reads every
        // token, so it checks them too.
        int64_t start = 0;
        std::vector<int64_t> block;
        for (int64_t i = 0; i < count; i += 1 << 16) {
          const int64_t n = std::min<int64_t>(1 << 16, count - i);
          block.resize(static_cast<size_t>(n));
          widen_tokens(tokens, IndexedDType::U16, i, n, block.data());
          bool outside = false;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t v = block[static_cast<size_t>(j)];
            outside |= vocab_size > 0 && v >= vocab_size;  // (u16: never negative)
            if (v != packing.pad_token) continue;
            documents.push_back(i + j + 1 - start);
            start = i + j + 1;
          }
          if (outside)
            found_bad(num_tokens_ + i +
                      find_token_outside(tokens + i * 2, IndexedDType::U16, n, vocab_size));
        }
        documents.push_back(count - start);
      }
      num_tokens_ += count;
      shards_.push_back(std::move(file));
    }
  }
  if (slice.begin > 0 || slice.end < 1) {
    take_slice(slice, documents);
    checked.assign(runs_.size(), false);
  }
  if (packing.whole_documents) {
    RowPacker packer{seq_len + 1,  packing.long_documents, packing.best_fit,
                     piece_start_, piece_length_,          row_first_};
    for (const int64_t length : documents) packer.add(length);
    packer.finish();
    long_documents_ = packer.long_documents;
  }
  // This process's part of the stream, checked run by run (branch-free
  // passes over the mapped bytes), its targets with loss counted.
  const int64_t lo = num_tokens_ * check.index / check.count;
  const int64_t hi = num_tokens_ * (check.index + 1) / check.count;
  for (size_t r = 0; r < runs_.size() && first_bad_ < 0; ++r) {
    const Run& run = runs_[r];
    const int64_t a = std::max(lo, run.start), b = std::min(hi, run.start + run.count);
    if (a >= b) continue;
    if (vocab_size > 0 && !checked[r]) {
      const int64_t bad =
          find_token_outside(run.data + (a - run.start) * indexed_dtype_bytes(run.dtype), run.dtype,
                             b - a, vocab_size);
      if (bad >= 0) found_bad(a + bad);
    }
    if (!run.keep) {
      loss_tokens_ += b - a;
      continue;
    }
    const LossMask& mask = *masks_[run.mask];
    const int64_t at = run.keep - mask.data() + (a - run.start);
    const LossMask::Scan scan = mask.scan(at, at + (b - a));
    loss_tokens_ += scan.kept;
    if (scan.bad >= 0) found_bad(a + (scan.bad - at));
  }
  if (check.count == 1 && first_bad_ >= 0) raise_bad(first_bad_);
  const int64_t n = num_tokens_;
  num_sequences_ = n > seq_len ? (n - 1) / seq_len : 0;
  if (packing.whole_documents) {
    // A last row of one token has no target.
    const size_t rows = row_first_.size() - 1;
    if (rows > 0 && row_first_[rows] - row_first_[rows - 1] == 1 && piece_length_.back() < 2) {
      piece_start_.pop_back();
      piece_length_.pop_back();
      row_first_.pop_back();
    }
    num_sequences_ = static_cast<int64_t>(row_first_.size()) - 1;
    padding_tokens_ = num_sequences_ * (seq_len + 1);
    for (const int32_t l : piece_length_) padding_tokens_ -= l;
    if (num_sequences_ == 0) {
      throw IoError("token data has " + std::to_string(n) +
                    " tokens, too few for one row of whole documents");
    }
  }
  if (num_sequences_ == 0) {
    throw IoError(
        "token data has " + std::to_string(n) +
        " tokens, fewer than one sequence of seq_len + 1 = " + std::to_string(seq_len + 1));
  }
}

TokenDataset::~TokenDataset() = default;

void TokenDataset::take_slice(StreamSlice slice, std::vector<int64_t>& documents) {
  const int64_t n = num_tokens_;
  auto at = [n](double f) {
    return f >= 1 ? n : std::min(n, static_cast<int64_t>(std::floor(f * static_cast<double>(n))));
  };
  int64_t first = at(slice.begin), last = at(slice.end);
  if (packing_.whole_documents) {
    // A document belongs to the slice that holds its first token.
    size_t d0 = documents.size(), d1 = documents.size();
    int64_t start = 0, start0 = n, start1 = n;
    for (size_t d = 0; d < documents.size(); ++d) {
      if (d0 == documents.size() && start >= first) d0 = d, start0 = start;
      if (start >= last) {
        d1 = d, start1 = start;
        break;
      }
      start += documents[d];
    }
    documents = std::vector<int64_t>(documents.begin() + static_cast<std::ptrdiff_t>(d0),
                                     documents.begin() + static_cast<std::ptrdiff_t>(d1));
    first = start0, last = start1;
  }
  // The runs' tokens within [first, last), counted from `first`.
  std::vector<Run> kept;
  for (const Run& r : runs_) {
    const int64_t a = std::max(first, r.start), b = std::min(last, r.start + r.count);
    if (a >= b) continue;
    const int64_t skip = a - r.start;
    kept.push_back({r.data + skip * indexed_dtype_bytes(r.dtype), b - a, r.dtype, a - first,
                    r.keep ? r.keep + skip : nullptr, r.file, r.file_first + skip, r.mask});
  }
  runs_ = std::move(kept);
  num_tokens_ = last - first;
  // What a whole-document pass found (stream positions of the whole) is
  // found again by the check of this slice's tokens.
  first_bad_ = -1;
}

void TokenDataset::accept_check(const PartCheck& job) {
  if (job.first_bad >= 0) raise_bad(job.first_bad);
  loss_tokens_ = job.loss_tokens;
}

void TokenDataset::raise_bad(int64_t position) const {
  if (position < 0 || position >= num_tokens_) {
    throw ValueError("TokenDataset: stream position " + std::to_string(position) +
                     " is outside its " + std::to_string(num_tokens_) + " tokens");
  }
  const Run& run = *(std::upper_bound(runs_.begin(), runs_.end(), position,
                                      [](int64_t pos, const Run& r) { return pos < r.start; }) -
                     1);
  int64_t v = 0;
  widen_tokens(run.data, run.dtype, position - run.start, 1, &v);
  if (vocab_size_ > 0 && (v < 0 || v >= vocab_size_)) {
    throw IoError("token data '" + files_.at(run.file) + "': token " + std::to_string(v) +
                  " at position " + std::to_string(run.file_first + position - run.start) +
                  " is not in [0, vocab_size " + std::to_string(vocab_size_) + ")");
  }
  if (run.keep && run.keep[position - run.start] > 1) {
    const LossMask& mask = *masks_[run.mask];
    mask.raise_bad_byte(run.keep - mask.data() + (position - run.start));
  }
  throw ValueError("TokenDataset: nothing is wrong at stream position " + std::to_string(position));
}

void TokenDataset::read(int64_t start, int64_t count, int64_t* out, uint8_t* keep) const {
  // The run holding `start`: the last one starting at or before it.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), start,
                             [](int64_t pos, const Run& r) { return pos < r.start; });
  size_t r = static_cast<size_t>(it - runs_.begin()) - 1;
  while (count > 0) {
    const Run& run = runs_.at(r);
    const int64_t first = start - run.start;
    const int64_t n = std::min(count, run.count - first);
    widen_tokens(run.data, run.dtype, first, n, out);
    if (keep) {
      if (run.keep) {
        std::copy(run.keep + first, run.keep + first + n, keep);
      } else {
        std::fill(keep, keep + n, uint8_t{1});
      }
      keep += n;
    }
    out += n;
    start += n;
    count -= n;
    ++r;
  }
}

int64_t TokenDataset::sequence_of(int64_t g) const {
  if (g < 0) throw ValueError("TokenDataset: global sequence " + std::to_string(g) + " < 0");
  const int64_t n = num_sequences_;
  return shuffle_seed_ ? shuffled_index(g % n, n, *shuffle_seed_, g / n) : g % n;
}

void TokenDataset::read_sequence(int64_t g, int64_t* out, uint8_t* keep) const {
  const int64_t q = sequence_of(g);
  if (!packing_.whole_documents) {
    read(q * seq_len_, seq_len_ + 1, out, keep);
    return;
  }
  const auto r = static_cast<size_t>(q);
  int64_t length = 0;
  for (auto p = static_cast<size_t>(row_first_[r]); p < static_cast<size_t>(row_first_[r + 1]);
       ++p) {
    read(piece_start_[p], piece_length_[p], out + length, keep ? keep + length : nullptr);
    length += piece_length_[p];
  }
  std::fill(out + length, out + seq_len_ + 1, packing_.pad_token);
  if (keep) std::fill(keep + length, keep + seq_len_ + 1, uint8_t{0});
}

int64_t batch_start(int64_t step, int64_t global_batch, int64_t first, int64_t count,
                    const char* who) {
  if (first < 0 || count <= 0 || first + count > global_batch) {
    throw ValueError(std::string(who) + "::batch: sequences [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") are outside the global batch of " +
                     std::to_string(global_batch));
  }
  return step * global_batch + first;
}

Batch read_sequences(int64_t first, int64_t count, int64_t seq_len,
                     const std::function<void(int64_t, int64_t*, uint8_t*)>& read,
                     const char* who) {
  if (first < 0 || count <= 0) {
    throw ValueError(std::string(who) + "::sequences: [" + std::to_string(first) + ", +" +
                     std::to_string(count) + ") is not a range of global sequences");
  }
  const int64_t T = seq_len;
  Tensor inputs = empty({count, T}, DType::I64), targets = empty({count, T}, DType::I64);
  int64_t* in = inputs.data<int64_t>();
  int64_t* tg = targets.data<int64_t>();
  std::vector<int64_t> tokens(static_cast<size_t>(T + 1));
  std::vector<uint8_t> keep(static_cast<size_t>(T + 1));
  for (int64_t j = 0; j < count; ++j) {
    read(first + j, tokens.data(), keep.data());
    std::copy(tokens.begin(), tokens.end() - 1, in + j * T);
    // Target t is token t + 1; its mask byte says whether it has loss.
    for (int64_t t = 0; t < T; ++t) tg[j * T + t] = keep[t + 1] ? tokens[t + 1] : -100;
  }
  return {inputs, targets};
}

Batch TokenDataset::sequences(int64_t first, int64_t count) const {
  return read_sequences(
      first, count, seq_len_,
      [this](int64_t g, int64_t* out, uint8_t* keep) { read_sequence(g, out, keep); },
      "TokenDataset");
}

Batch TokenDataset::batch(int64_t step, int64_t global_batch, int64_t first, int64_t count) const {
  return sequences(batch_start(step, global_batch, first, count, "TokenDataset"), count);
}

}  // namespace triad::data
