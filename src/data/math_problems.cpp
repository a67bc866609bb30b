#include "triad/data/math_problems.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "json_lines.h"
#include "triad/core/error.h"
#include "triad/data/text_input.h"

namespace triad::data {

std::vector<MathProblem> read_math_problems(std::istream& in, const std::string& where,
                                            int64_t limit) {
  std::vector<MathProblem> out;
  read_json_objects(in, where, limit, [&](const nlohmann::json& j, const std::string& at) {
    for (const char* key : {"question", "answer"}) {
      if (!j.contains(key) || !j[key].is_string()) {
        throw ValueError(at + " has no string \"" + key + "\"");
      }
    }
    MathProblem p{j["question"].get<std::string>(), j["answer"].get<std::string>()};
    if (p.answer.find("#### ") == std::string::npos) {
      throw ValueError(at +
                       ": the answer has no final answer after \"#### \" (GSM8K's solutions "
                       "end \"#### <number>\")");
    }
    out.push_back(std::move(p));
  });
  if (out.empty()) throw ValueError(where + " holds no problems");
  return out;
}

std::vector<MathProblem> read_math_problems(const std::string& path, int64_t limit) {
  if (!std::ifstream(path, std::ios::binary)) {
    throw IoError("cannot open math problems '" + path + "'");
  }
  const std::unique_ptr<std::istream> in = open_text_input(path);
  return read_math_problems(*in, "'" + path + "'", limit);
}

std::string math_prompt(const MathProblem& problem, const std::vector<MathProblem>& shots) {
  std::string out;
  for (const MathProblem& s : shots)
    out += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  return out + "Question: " + problem.question + "\nAnswer:";
}

std::vector<MathProblem> first_shots(const std::vector<MathProblem>& pool, int64_t n, int64_t skip,
                                     const std::string& what) {
  if (n < 0) throw ValueError(what + ": the few-shot count " + std::to_string(n) + " must be >= 0");
  std::vector<MathProblem> out;
  for (size_t i = 0; i < pool.size() && static_cast<int64_t>(out.size()) < n; ++i) {
    if (static_cast<int64_t>(i) != skip) out.push_back(pool[i]);
  }
  if (static_cast<int64_t>(out.size()) < n) {
    throw ValueError(what + ": " + std::to_string(n) + " few-shot examples asked for, but only " +
                     std::to_string(out.size()) + " other problem(s) to take them from");
  }
  return out;
}

std::string cut_at_stops(const std::string& text, const std::vector<std::string>& stops) {
  size_t end = text.size();
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    end = std::min(end, text.find(s));
  }
  return text.substr(0, end);
}

namespace {

// A regex match's text, stripped of surrounding ASCII whitespace (Python's
// str.strip on what the patterns can match).
std::string stripped(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n\r\f\v");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\n\r\f\v") - a + 1);
}

}  // namespace

std::string strict_answer(const std::string& generated) {
  static const std::regex pattern("#### (-?[0-9.,]+)");
  std::smatch m;
  if (!std::regex_search(generated, m, pattern)) return kInvalidAnswer;
  return stripped(m[1].str());
}

std::string flexible_answer(const std::string& generated) {
  static const std::regex pattern("(-?[$0-9.,]{2,})|(-?[0-9]+)");
  std::string last;
  bool found = false;
  for (auto it = std::sregex_iterator(generated.begin(), generated.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    // (lm-evaluation-harness takes the first group that matched.)
    last = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    found = true;
  }
  return found ? stripped(last) : kInvalidAnswer;
}

std::string normalize_answer(const std::string& text) {
  std::string s;
  for (const char c : text) {
    if (c != ',' && c != '$') s += c;
  }
  if (const size_t at = s.rfind("#### "); at != std::string::npos) s.erase(0, at + 5);
  if (!s.empty() && s.back() == '.') {
    s.pop_back();
  } else if (s.size() >= 2 && s.back() == '\n' && s[s.size() - 2] == '.') {
    s.erase(s.size() - 2, 1);
  }
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

bool answer_matches(const std::string& extracted, const MathProblem& problem) {
  return normalize_answer(extracted) == normalize_answer(problem.answer);
}

}  // namespace triad::data
