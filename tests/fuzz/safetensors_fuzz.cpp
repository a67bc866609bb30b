// A .safetensors file: the header's length, its JSON, dtypes, shapes and
// offsets against the bytes that follow (parse_safetensors copies out every
// tensor it describes).
#include "fuzz_target.h"
#include "triad/io/safetensors.h"

TRIAD_FUZZ_TARGET(safetensors) {
  (void)triad::io::parse_safetensors(data, size, "<fuzz>");
}
