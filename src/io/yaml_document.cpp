#include "io/yaml_document.h"

#include <map>

#include "triad/core/error.h"

namespace triad::io {
namespace {

// Throws at the first mapping below `node` (at `path`) that repeats a key.
void reject_repeated_keys(const YAML::Node& node, const std::string& path,
                          const std::string& source) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i)
      reject_repeated_keys(node[i], path + "[" + std::to_string(i) + "]", source);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, YAML::Mark> first;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Mark mark = it->first.Mark();
    if (!it->first.IsScalar()) {
      // (A list, a mapping or nothing as a key: no Triad file has one.)
      YAML::Emitter shown;
      shown << YAML::Flow << it->first;
      throw ConfigError(source + ": " + (path.empty() ? "" : path + ": ") +
                        "a key must be a plain name, got '" + shown.c_str() + "' (line " +
                        std::to_string(mark.line + 1) + ")");
    }
    const std::string key = it->first.Scalar();
    const std::string at = path.empty() ? key : path + "." + key;
    const auto [seen, fresh] = first.emplace(key, mark);
    if (!fresh) {
      const YAML::Mark& a = seen->second;
      const std::string where =
          a.line != mark.line
              ? "lines " + std::to_string(a.line + 1) + " and " + std::to_string(mark.line + 1)
              : "columns " + std::to_string(a.column + 1) + " and " +
                    std::to_string(mark.column + 1) + " of line " + std::to_string(mark.line + 1);
      throw ConfigError(source + ": key '" + at + "' is given twice (" + where + "); give it once");
    }
    reject_repeated_keys(it->second, at, source);
  }
}

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& source, const std::string& at) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": not valid YAML: " + e.what());
  }
  reject_repeated_keys(root, at, source);
  return root;
}

}  // namespace triad::io
