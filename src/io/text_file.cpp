#include "triad/io/text_file.h"

#include <filesystem>
#include <fstream>

#include "triad/core/error.h"

namespace triad::io {

std::optional<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string out;
  char buffer[1 << 16];
  // (istream::read catches what the file buffer throws and sets badbit.)
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    out.append(buffer, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return std::nullopt;
  return out;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::optional<std::string> text = read_file(path);
  if (!text) {
    std::error_code ec;
    throw ConfigError("cannot open " + what + " '" + path + "'" +
                      (std::filesystem::is_directory(path, ec) ? " (a directory)" : ""));
  }
  return std::move(*text);
}

bool is_directory(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

bool path_exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace triad::io
