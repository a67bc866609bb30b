#pragma once

// JSON lines read an object at a time, for the evaluation files
// (multiple_choice.cpp, last_word.cpp, math_problems.cpp).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <string>

#include "triad/core/error.h"
#include "triad/data/text_input.h"

namespace triad::data {

// Calls read(object, at) for each non-blank line of `in`, a JSON object
// each, `at` naming `where` and the line, until `limit` lines have been
// read (0: all). A negative limit, a line that does not parse or is not an
// object is a ValueError naming it; so is a file without any.
template <class Read>
void read_json_objects(std::istream& in, const std::string& where, int64_t limit, Read read) {
  if (limit < 0) throw ValueError(where + ": limit (" + std::to_string(limit) + ") must be >= 0");
  int64_t line_no = 0, count = 0;
  for (std::string line; (limit == 0 || count < limit) && std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = where + " line " + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw ValueError(at + " does not parse at byte " + std::to_string(e.byte));
    } catch (const nlohmann::json::exception& e) {
      // (A number too large for a double: out_of_range, not parse_error.)
      throw ValueError(at + " does not parse: " + e.what());
    }
    if (!j.is_object()) throw ValueError(at + " is not a JSON object");
    read(j, at);
    ++count;
  }
}

// Opens the evaluation file `path` (gzip and Zstandard too,
// text_input.h) and returns read(stream, where), `where` naming the path
// for the reader's errors; an IoError "cannot open <what> '<path>'" when it
// cannot be opened.
template <class Read>
auto read_json_lines_file(const std::string& path, const std::string& what, Read read) {
  if (!std::ifstream(path, std::ios::binary)) {
    throw IoError("cannot open " + what + " '" + path + "'");
  }
  const std::unique_ptr<std::istream> in = open_text_input(path);
  return read(*in, "'" + path + "'");
}

}  // namespace triad::data
