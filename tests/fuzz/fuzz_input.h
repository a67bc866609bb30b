#pragma once

// Helpers the fuzz targets share: the input as text, or as a file for the
// readers that take a path.
#include <cstddef>
#include <cstdint>
#include <string>

namespace triad::fuzz {

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Writes the bytes to `name` in this process's scratch folder (made once,
// under $TMPDIR or /tmp, removed at exit) and returns the file's path.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);

// The scratch folder's path (no trailing slash).
const std::string& scratch_dir();

}  // namespace triad::fuzz
