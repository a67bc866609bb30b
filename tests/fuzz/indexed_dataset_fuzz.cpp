// A Megatron indexed dataset: the input is the .idx; the .bin beside it is
// 16 * (the input's first byte) bytes long, so offsets land inside and
// outside it. Every sequence of every document is read, each as long as the
// index says, and the documents cover the sequences, the tokens adding up.
#include <vector>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/indexed_dataset.h"

TRIAD_FUZZ_TARGET(indexed_dataset) {
  using triad::fuzz::require;
  const std::vector<uint8_t> bin(size > 0 ? 16 * size_t{data[0]} : 0, 0x5a);
  triad::fuzz::write_input("data.bin", bin.data(), bin.size());
  triad::fuzz::write_input("data.idx", data, size);
  const triad::data::IndexedDataset dataset(triad::fuzz::scratch_dir() + "/data");
  int64_t next = 0, tokens = 0;
  for (int64_t d = 0; d < dataset.num_documents(); ++d) {
    const auto [first, last] = dataset.document(d);
    require(first == next && last >= first, "documents are consecutive runs of sequences");
    for (int64_t s = first; s < last; ++s) {
      const auto sequence = dataset.sequence(s);
      require(static_cast<int64_t>(sequence.size()) == dataset.sequence_length(s),
              "a sequence is as long as the index says");
      tokens += dataset.sequence_length(s);
    }
    next = last;
  }
  require(next == dataset.num_sequences(), "the documents cover every sequence");
  require(tokens == dataset.num_tokens(), "the sequences' tokens add up to the count");
}
