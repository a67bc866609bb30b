#include "triad/data/last_word.h"

#include <nlohmann/json.hpp>

#include "json_lines.h"
#include "triad/core/error.h"

namespace triad::data {

std::vector<LastWordText> read_last_word_texts(std::istream& in, const std::string& where,
                                               int64_t limit) {
  std::vector<LastWordText> out;
  read_json_objects(in, where, limit, [&](const nlohmann::json& j, const std::string& at) {
    if (!j.contains("text") || !j["text"].is_string()) {
      throw ValueError(at + " has no string \"text\"");
    }
    const std::string text = j["text"].get<std::string>();
    const size_t space = text.rfind(' ');
    if (space == std::string::npos || space == 0) {
      throw ValueError(at + ": the text has no word before its last (no space to cut it at)");
    }
    if (space + 1 == text.size()) {
      throw ValueError(at + ": the text ends with a space, so its last word is empty");
    }
    out.push_back({text.substr(0, space), text.substr(space)});
  });
  if (out.empty()) throw ValueError(where + " holds no texts");
  return out;
}

std::vector<LastWordText> read_last_word_texts(const std::string& path, int64_t limit) {
  return read_json_lines_file(path, "last-word texts",
                              [&](std::istream& in, const std::string& where) {
                                return read_last_word_texts(in, where, limit);
                              });
}

}  // namespace triad::data
