// A Megatron indexed dataset: the input is the .idx; the .bin beside it is
// 16 * (the input's first byte) bytes long, so offsets land inside and
// outside it. Every sequence of every document is read.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/indexed_dataset.h"

#include <vector>

TRIAD_FUZZ_TARGET(indexed_dataset) {
  const std::vector<uint8_t> bin(size > 0 ? 16 * size_t{data[0]} : 0, 0x5a);
  triad::fuzz::write_input("data.bin", bin.data(), bin.size());
  triad::fuzz::write_input("data.idx", data, size);
  const triad::data::IndexedDataset dataset(triad::fuzz::scratch_dir() + "/data");
  for (int64_t d = 0; d < dataset.num_documents(); ++d) {
    const auto [first, last] = dataset.document(d);
    for (int64_t s = first; s < last; ++s) (void)dataset.sequence(s);
  }
}
