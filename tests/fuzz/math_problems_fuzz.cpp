// A GSM8K-style file (JSON lines with "question" and "answer" each), every
// problem asked as triad-eval --gsm8k asks it and its own solution scored
// as a reply. What reads is whole: every answer holds "#### ", the prompt
// is the question between its markers, an extraction is "[invalid]" or a
// piece of the text it came from, and normalising leaves no "#### " behind
// and is settled (normalising again changes nothing but a full stop that a
// first pass uncovered).
#include <sstream>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/math_problems.h"

TRIAD_FUZZ_TARGET(math_problems) {
  using triad::fuzz::require;
  namespace d = triad::data;
  std::istringstream in(triad::fuzz::as_text(data, size));
  const auto problems = d::read_math_problems(in, "<fuzz>");
  require(!problems.empty(), "a file that reads holds problems");
  for (const auto& p : problems) {
    require(p.answer.find("#### ") != std::string::npos, "every answer has its final answer");
    require(d::math_prompt(p, {}) == "Question: " + p.question + "\nAnswer:", "the prompt");
    const std::string shots = d::math_prompt(p, {p});
    require(shots.find("\n\nQuestion: " + p.question + "\nAnswer:") != std::string::npos,
            "the problem follows its example after a blank line");
    for (const std::string& x : {d::strict_answer(p.answer), d::flexible_answer(p.answer)}) {
      require(x == d::kInvalidAnswer || (!x.empty() && p.answer.find(x) != std::string::npos),
              "an extraction is [invalid] or a piece of the reply");
    }
    const std::string n = d::normalize_answer(p.answer);
    require(n.find("#### ") == std::string::npos, "normalising removes the last \"#### \"");
    require(n.find(',') == std::string::npos && n.find('$') == std::string::npos,
            "normalising removes commas and dollar signs");
    require(d::answer_matches(p.answer, p), "a solution matches itself");
    require(d::cut_at_stops(p.answer, {"Question:"}).find("Question:") == std::string::npos,
            "a reply cut at a stop holds none");
  }
}
