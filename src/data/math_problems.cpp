#include "triad/data/math_problems.h"

#include <nlohmann/json.hpp>

#include "json_lines.h"
#include "triad/core/error.h"
#include "triad/data/fewshot_sampler.h"

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
  return read_json_lines_file(path, "math problems",
                              [&](std::istream& in, const std::string& where) {
                                return read_math_problems(in, where, limit);
                              });
}

std::string math_prompt(const MathProblem& problem, const std::vector<MathProblem>& shots) {
  std::string out;
  for (const MathProblem& s : shots)
    out += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  return out + "Question: " + problem.question + "\nAnswer:";
}

std::vector<ChatMessage> math_chat(const MathProblem& problem,
                                   const std::vector<MathProblem>& shots, bool multiturn,
                                   const std::string& system) {
  std::vector<ChatMessage> out;
  if (!system.empty()) out.push_back({"system", system});
  if (!multiturn) {
    out.push_back({"user", math_prompt(problem, shots)});
    return out;
  }
  for (const MathProblem& s : shots) {
    out.push_back({"user", "Question: " + s.question + "\nAnswer:"});
    out.push_back({"assistant", s.answer});
  }
  out.push_back({"user", "Question: " + problem.question + "\nAnswer:"});
  return out;
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

std::vector<std::vector<MathProblem>> drawn_shots(const std::vector<MathProblem>& problems,
                                                  const std::vector<MathProblem>& pool, int64_t n,
                                                  bool same_file, uint64_t seed,
                                                  const std::string& what) {
  if (n < 0) throw ValueError(what + ": the few-shot count " + std::to_string(n) + " must be >= 0");
  FewshotDraw draw(seed, pool.size(), what);
  std::vector<std::vector<MathProblem>> out;
  for (size_t i = 0; i < problems.size(); ++i) {
    const MathProblem& p = problems[i];
    auto& shots = out.emplace_back();
    // (A problem's JSON holds its question and answer alone: equal problems
    // are equal documents to the harness.)
    for (const size_t k : draw.next(n, same_file, [&](size_t k) {
           return pool[k].question == p.question && pool[k].answer == p.answer;
         })) {
      shots.push_back(pool[k]);
    }
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

// The patterns below are matched by hand, as Python's `re` matches them
// (leftmost, greedy, the first alternative first): std::regex recurses per
// character and can overflow the stack on a long run of digits.
bool in_number(char c) {
  return (c >= '0' && c <= '9') || c == '.' || c == ',';
}
bool in_money(char c) {
  return in_number(c) || c == '$';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
// How many characters from `at` satisfy `pred`.
template <class Pred>
size_t run(const std::string& s, size_t at, Pred pred) {
  size_t n = 0;
  while (at + n < s.size() && pred(s[at + n])) ++n;
  return n;
}
// `-?[...]+` (at least `least` of the class) at `at`: the match's length,
// 0 for none (an optional minus taken when what follows it matches).
template <class Pred>
size_t signed_run(const std::string& s, size_t at, Pred pred, size_t least) {
  if (at < s.size() && s[at] == '-') {
    if (const size_t n = run(s, at + 1, pred); n >= least) return n + 1;
  }
  const size_t n = run(s, at, pred);
  return n >= least ? n : 0;
}

}  // namespace

std::string strict_answer(const std::string& generated) {
  // #### (-?[0-9.,]+): the first match's group.
  for (size_t at = generated.find("#### "); at != std::string::npos;
       at = generated.find("#### ", at + 1)) {
    if (const size_t n = signed_run(generated, at + 5, in_number, 1); n > 0) {
      return generated.substr(at + 5, n);
    }
  }
  return kInvalidAnswer;
}

std::string flexible_answer(const std::string& generated) {
  // (-?[$0-9.,]{2,})|(-?[0-9]+): every match left to right, the last kept.
  std::string last = kInvalidAnswer;
  for (size_t at = 0; at < generated.size();) {
    size_t n = signed_run(generated, at, in_money, 2);
    if (n == 0) n = signed_run(generated, at, is_digit, 1);
    if (n == 0) {
      ++at;
      continue;
    }
    last = generated.substr(at, n);
    at += n;
  }
  return last;
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
