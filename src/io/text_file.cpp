#include "triad/io/text_file.h"

#include <fstream>
#include <sstream>

#include "triad/core/error.h"

namespace triad::io {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open " + what + " '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read " + what + " '" + path + "'");
  return ss.str();
}

}  // namespace triad::io
