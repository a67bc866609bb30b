#pragma once

#include <string>

namespace triad::io {

// The whole of a text file (a config, a model or cluster file): ConfigError
// "cannot open <what> '<path>'" when it cannot be read.
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace triad::io
