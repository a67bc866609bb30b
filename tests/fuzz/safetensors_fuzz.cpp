// A .safetensors file: the header's length, its JSON, dtypes, shapes and
// offsets against the bytes that follow (parse_safetensors copies out every
// tensor it describes). What it reads writes back and reads again the
// same: names, shapes, dtypes, every byte, the metadata.
#include <cstring>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/safetensors.h"

TRIAD_FUZZ_TARGET(safetensors) {
  using triad::fuzz::require;
  const triad::io::Safetensors first = triad::io::parse_safetensors(data, size, "<fuzz>");
  const std::string path = triad::fuzz::scratch_dir() + "/again.safetensors";
  triad::io::save_safetensors(path, first.tensors, first.metadata);
  const triad::io::Safetensors again = triad::io::load_safetensors(path);
  require(again.metadata == first.metadata, "the metadata reads back the same");
  require(again.tensors.size() == first.tensors.size(), "every tensor reads back");
  for (const auto& [name, t] : first.tensors) {
    const auto it = again.tensors.find(name);
    require(it != again.tensors.end(), "each tensor reads back under its name");
    const triad::Tensor& u = it->second;
    require(u.shape() == t.shape() && u.dtype() == t.dtype(), "shape and dtype read back");
    require(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0, "the bytes read back");
  }
}
