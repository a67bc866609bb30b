#pragma once

// Reading a YAML document the way every Triad file (trainer configs,
// cluster and model files) is read.

#include <yaml-cpp/yaml.h>

#include <string>

namespace triad::io {

// `text` parsed as one YAML document. Text that is not valid YAML, a
// mapping that gives a key twice (YAML forbids it; yaml-cpp would keep the
// first and drop the other without a word), or a key that is no plain name
// (a list, a mapping, nothing) is a ConfigError naming `source`, and for a
// key its path (below `at`, the key the document is the value of, if any)
// and where it is.
YAML::Node load_yaml(const std::string& text, const std::string& source,
                     const std::string& at = "");

}  // namespace triad::io
