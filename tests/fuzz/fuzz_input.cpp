#include "fuzz_input.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace triad::fuzz {
namespace {

struct Scratch {
  std::string path;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/triad-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) throw std::runtime_error("fuzz: cannot make " + pattern);
    path = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static Scratch scratch;
  return scratch.path;
}

std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw std::runtime_error("fuzz: cannot write " + path);
  return path;
}

std::string write_input(const std::string& name, const std::string& bytes) {
  return write_input(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::vector<std::string> split_input(const uint8_t* data, size_t size, size_t parts) {
  const std::string text = as_text(data, size);
  const std::string separator = kPartSeparator;
  std::vector<std::string> out;
  size_t begin = 0;
  while (out.size() + 1 < parts) {
    const size_t at = text.find(separator, begin);
    if (at == std::string::npos) break;
    out.push_back(text.substr(begin, at - begin));
    begin = at + separator.size();
  }
  out.push_back(begin <= text.size() ? text.substr(begin) : std::string());
  out.resize(parts);
  return out;
}

}  // namespace triad::fuzz
