#pragma once

// Helpers the fuzz targets share: the input as text, or as a file for the
// readers that take a path.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace triad::fuzz {

// A target that reads several files takes its input as parts separated by
// this line (make_seeds.py joins a seed's files with it).
inline constexpr const char* kPartSeparator = "\n--8<--\n";

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The input cut at its first `parts - 1` separators into `parts` pieces
// (those past the last separator there is are empty).
std::vector<std::string> split_input(const uint8_t* data, size_t size, size_t parts);

// Writes the bytes to `name` in this process's scratch folder (made once,
// under $TMPDIR or /tmp, removed at exit) and returns the file's path.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);
std::string write_input(const std::string& name, const std::string& bytes);

// The scratch folder's path (no trailing slash).
const std::string& scratch_dir();

}  // namespace triad::fuzz
